"""Reports: self-contained HTML from templates, the same content as PDF, rendered by real viewers."""
import base64
import io
import re

import numpy as np
import pytest
from PIL import Image as PILImage

from stimsim.report import Image, Listing, Paragraph, Report, Section, Table, figure_png, format_value, image_png
from stimsim.utilities.figures import pyplot


def _example_report():
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1])
    rng = np.random.default_rng(0)
    thumbs = tuple(Image(image_png(rng.random((8, 8)), scale=3), alt=f"step {k}") for k in range(3))
    table = Table(("rank", "electrode id", "ΔAUC", "images", "delta_auc <low>"),  # a narrow page wraps after "_"
                  [(1, "12", 0.01234, thumbs, 0.0), (2, "40", float("nan"), thumbs, 0.0)], caption="Ranked sites")
    section = Section("Sites", [Paragraph("Tags <b>stay</b> text & are escaped."),
                                Image(figure_png(fig), caption="identity line"), table,
                                Listing({"pose": {"x_mm": 1.5, "rotation_deg": -20.0}}, caption="pose")])
    return Report("Site plan", [section], subtitle="virtual subject",
                  parameters={"current_uA": 50.0, "task": {"name": "sequence_2afc"}},
                  software={"stimsim": "0.1.0"})


def test_format_value_by_hand():
    assert format_value(0.01234) == "0.0123"
    assert format_value(12.345, digits=3) == "12.3"
    assert format_value(-0.5) == "−0.500"
    assert format_value(float("nan")) == "–"
    assert format_value(None) == "–"
    assert format_value(np.int64(7)) == "7"
    assert format_value(True) == "yes"
    assert format_value(2.5e-6) == "2.50e−06"
    assert format_value((1.0, 2.0)) == "1.00, 2.00"
    assert format_value([]) == format_value({}) == "none"


def test_the_parameters_are_listed_with_every_digit_as_given():
    """A parameter is shown as it was given (0.123456, not 0.1235), whatever digits the report's other numbers get."""
    html = Report("Plan", parameters={"sequences": {"noise_sd": 0.123456}, "current_uA": 12.345, "C": 1e-05,
                                      "offsets_mm": [-0.0625, 2.5]}, software={}).to_html()
    for name, text in (("sequences.noise_sd", "0.123456"), ("current_uA", "12.345"), ("C", "1e−05"),
                       ("offsets_mm", "−0.0625, 2.5")):
        assert f"<tr><th>{name}</th><td>{text}</td></tr>" in html
    assert format_value(0.123456, digits=None) == "0.123456"


def test_image_png_round_trip_and_validation():
    pixels = np.array([[0.0, 1.0], [0.5, 0.25]])
    decoded = np.asarray(PILImage.open(io.BytesIO(image_png(pixels, scale=2))))
    assert decoded.shape == (4, 4)
    assert decoded[0, 0] == 0 and decoded[0, 3] == 255 and decoded[3, 0] == 128 and decoded[3, 3] == 64
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        image_png(pixels * 2)
    with pytest.raises(ValueError, match="PNG"):
        Image(b"GIF89a")
    with pytest.raises(ValueError, match="header has 2"):
        Table(("a", "b"), [(1, 2, 3)])


def test_html_is_self_contained_and_escaped():
    html = _example_report().to_html()
    sources = re.findall(r'<img src="([^"]+)"', html)
    assert len(sources) == 1 + 2 * 3  # the figure and three thumbnails in each of two rows
    for source in sources:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1]).startswith(b"\x89PNG")
    assert not re.search(r'(src|href)="(?!data:)', html)  # nothing fetched from elsewhere
    assert "Tags &lt;b&gt;stay&lt;/b&gt; text &amp; are escaped." in html
    for text in ("<th>electrode id</th>", "<th>delta_<wbr>auc &lt;low&gt;</th>", "<td>0.0123</td>", "<td>–</td>", "pose.rotation_deg", "−20.00",
                 "current_uA", "task.name", "sequence_2afc", "Software"):
        assert text in html


def test_write_is_atomic_pair(tmp_path):
    html_path, pdf_path = _example_report().write(tmp_path / "out")
    assert html_path.read_text().startswith("<!DOCTYPE html>")
    assert pdf_path.read_bytes().startswith(b"%PDF")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "report.pdf"]  # no temp files


def test_a_report_stopped_while_writing_keeps_the_earlier_pair(tmp_path, monkeypatch):
    """A report written again and stopped while its PDF is saved leaves the earlier HTML and PDF, as a pair."""
    from stimsim.report import document

    html_path, pdf_path = Report("First", [Section("Sites", [Paragraph("Two sites.")])]).write(tmp_path)
    earlier = html_path.read_bytes(), pdf_path.read_bytes()

    def stop(path, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(document, "atomic_write_bytes", stop)
    with pytest.raises(KeyboardInterrupt):
        Report("Second", [Section("Sites", [Paragraph("Three sites.")])]).write(tmp_path)
    assert (html_path.read_bytes(), pdf_path.read_bytes()) == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.pdf"]  # no temp files


def test_report_renders_in_chromium(tmp_path, chromium_render):
    html_path, _ = _example_report().write(tmp_path)
    dom, images_ok, images_total, console = chromium_render(html_path, screenshot=tmp_path / "page.png")
    assert images_total == 7 and images_ok == 7
    assert console == []
    assert re.search(r"<th>rank</th>\s*<th>electrode id</th>", dom)
    shot = np.asarray(PILImage.open(tmp_path / "page.png").convert("L"))
    assert (shot < 128).mean() > 0.005  # text, table rules and the figure drew dark pixels


def test_report_pdf_pages_have_the_table(tmp_path, pdf_pages):
    _, pdf_path = _example_report().write(tmp_path)
    texts, pngs = pdf_pages(pdf_path)
    assert len(pngs) >= 1
    assert re.search(r"rank\s+electrode id\s+ΔAUC", texts[0])
    assert "0.0123" in texts[0]
    first = np.asarray(PILImage.open(pngs[0]).convert("L"))
    assert (first < 128).mean() > 0.002


def test_a_warning_paragraph_is_boxed_and_a_first_page_figure_prints_smaller(tmp_path, pdf_pages):
    """css_class "warning" draws a paragraph in a box; "first-page" prints a figure 170 mm wide so that the title
    and a few paragraphs fit above it on PDF page 1."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(12, 4))
    ax.plot([0, 1], [0, 1])
    blocks = [Paragraph("Plain text."), Paragraph("Warning: too few trials.", css_class="warning"),
              Image(figure_png(fig), caption="the wide figure", css_class="first-page")]
    report = Report("Plan", [Section("Plan", blocks)])
    html = report.to_html()
    assert '<p class="warning">Warning: too few trials.</p>' in html and "<p>Plain text.</p>" in html
    assert '<figure class="first-page">' in html
    assert re.search(r"p\.warning \{[^}]*border", html) and "figure.first-page img" in html
    _, pdf = report.write(tmp_path / "out")
    texts, _ = pdf_pages(pdf)
    assert "the wide figure" in texts[0]


def test_a_plan_map_of_a_cmp_layout_prints_on_page_1_below_a_two_line_description(tmp_path, pdf_pages):
    """The first page of a plan on a .cmp layout: title, a description of two lines, the plan's paragraph and power
    warning (about 680 characters each) and the map (1394 × 491 px, its bank legend under the pedestal) with its
    caption of about 750 characters. At 190 mm wide the map went to page 2; it and its caption print on page 1."""
    buffer = io.BytesIO()
    PILImage.new("RGB", (1394, 491), "white").save(buffer, format="PNG")
    blocks = [Paragraph("plan " * 135), Paragraph("warn " * 137, css_class="warning"),
              Image(buffer.getvalue(), caption="caption " * 93 + "end of the map caption", css_class="first-page")]
    report = Report("Stimulation plan: plan_default", [Section("Plan", blocks)], subtitle="description " * 18)
    _, pdf = report.write(tmp_path / "out")
    texts, _ = pdf_pages(pdf)
    assert "end of the map caption" in texts[0]


def test_a_table_caption_is_never_left_alone_at_the_foot_of_a_pdf_page(tmp_path):
    """Text before a table grows line by line, moving the table across a page break: at every position its caption
    prints on the page of its first row."""
    import shutil
    import subprocess

    if shutil.which("pdftotext") is None:
        pytest.skip("pdftotext is not installed (Debian package 'poppler-utils'; .ci/install installs it)")
    table = Table(("site", "n", "ΔAUC"), tuple((f"row{i}", i, i / 100) for i in range(30)), caption="Sessions")
    pages_of_table = set()
    for n_lines in range(14, 30):
        text = [Paragraph("word " * 120)] * (n_lines // 3) + [Paragraph("line")] * (n_lines % 3)
        (tmp_path / "report.pdf").write_bytes(Report("Breaks", [Section("Before", [*text, table])]).to_pdf())
        pages = subprocess.run(["pdftotext", "-layout", str(tmp_path / "report.pdf"), "-"], check=True,
                               capture_output=True, text=True, timeout=120).stdout.split("\f")
        caption_page = next(i for i, page in enumerate(pages) if "Sessions" in page)
        first_row_page = next(i for i, page in enumerate(pages) if re.search(r"\brow0\b", page))
        assert caption_page == first_row_page, n_lines
        pages_of_table.add(first_row_page)
    assert pages_of_table == {0, 1}  # the table started on page 1 at some positions and on page 2 at others


def test_a_sentence_in_a_table_cell_reads_from_the_left_and_numbers_from_the_right():
    table = Table(("statistic", "meaning", "value"), [("wilcoxon_p", "Wilcoxon signed-rank p across sites", 0.42)])
    html = Report("Scores", [Section("Scores", [table])]).to_html()
    assert '<td class="text">Wilcoxon signed-rank p across sites</td>' in html
    assert "<td>wilcoxon_p</td>" in html and "<td>0.420</td>" in html
    assert re.search(r"table\.data td\.text \{ text-align: left; \}", html)


def test_every_text_cell_of_a_column_with_a_sentence_reads_from_the_left():
    """A column of names or sentences lines up on the left, its short entries too; a column of short labels (electrode
    ids) and a column of numbers keep to the right, short text among the numbers too (only a sentence there reads
    from the left)."""
    table = Table(("statistic", "meaning", "electrode", "value"),
                  [("n_trials", "trials", "7", 9600), ("shift_in_predicted_direction", "mean ΔAUC in the direction the "
                                                      "plan predicted", "12", 0.00647),
                   ("split_half_r_95", "its 95 % interval", "3", "[−0.217, 0.183]"),
                   ("noise_ceiling", "noise ceiling", "4", "undefined (see the notes)")])
    html = Report("Scores", [Section("Scores", [table])]).to_html()
    for text in ("n_trials", "trials", "shift_in_predicted_direction", "mean ΔAUC in the direction the plan predicted",
                 "undefined (see the notes)"):
        assert f'<td class="text">{text}</td>' in html
    for cell in ("7", "12", "9600", "0.00647", "[−0.217, 0.183]"):
        assert f"<td>{cell}</td>" in html


def test_a_long_name_without_spaces_wraps_inside_the_page(tmp_path, chromium_render, pdf_pages):
    """A plan named in one 120-character word, a long file path in a table and a long electrode id in a caption break
    onto new lines instead of running off the 1,200 px window or the PDF page."""
    name = "plan_" + "_".join(f"monkey{i}" for i in range(16))
    path = "/data/" + "/".join(f"session{i}" for i in range(14)) + "/trials.nwb"
    table = Table(("session", "file"), [("s1", path)], caption=f"Sessions of {name}")
    report = Report(f"Stimulation plan: {name}", [Section(name, [Paragraph(f"Plan {name}."), table])],
                    subtitle=path, software={})
    html_path, pdf_path = report.write(tmp_path / "out")
    dom, _, _, _ = chromium_render(html_path)
    scroll_px, visible_px = map(int, re.search(r'<div id="width-probe">(\d+)/(\d+)</div>', dom).groups())
    assert scroll_px <= visible_px
    texts, _ = pdf_pages(pdf_path)
    joined = re.sub(r"\s+", "", "".join(texts))
    assert joined.count(name) == 4 and joined.count(path) == 2  # title, section, paragraph, caption; subtitle, cell
