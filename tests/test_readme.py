"""The Python snippets of the README and of the documentation pages run as written, and their comments state
what they print and write; the figures the documentation quotes for the main command are what it gives."""
import re
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def _docs_page(name: str) -> str:
    """The text of the documentation page ``docs/NAME.md``."""
    return (REPO / "docs" / f"{name}.md").read_text(encoding="utf-8")


def _python_snippet(text: str, heading: str) -> str:
    """The first Python code block after ``heading`` in ``text``."""
    section = text.split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def _python_api_snippet() -> str:
    return _python_snippet(README.read_text(encoding="utf-8"), "## Python API in five minutes")


def test_the_python_api_snippet_runs_in_cortex_millimetres(capsys):
    namespace = {}
    exec(compile(_python_api_snippet(), "README.md", "exec"), namespace)
    printed = capsys.readouterr().out.split("\n")
    model_mm, cortex_mm = (np.array(printed[line].split(), dtype=float) for line in (0, 2))
    assert model_mm == pytest.approx([5.97, 1406], abs=0.5)  # the comment: 5.97 mm, 1406 units/mm²
    # 2.76 cortex mm per model mm (the model's recorded scale): that many times the size, 1/2.76² the density
    scale = float(printed[1])
    assert scale == pytest.approx(2.755, abs=0.005) and namespace["scale"]["scale_overridden"] is False
    assert cortex_mm == pytest.approx([scale * model_mm[0], model_mm[1] / scale ** 2])
    assert cortex_mm == pytest.approx([16.5, 185], abs=0.5)
    # the stimulation acts on the sheet in cortex mm, as experiment files do
    assert namespace["p"].sizes == {"condition": 2, "stimulus_id": 200, "choice": 2}
    assert namespace["it"].shape == (200, 224 * 224)
    control, stimulated = np.array(printed[3].strip("[]").split(), dtype=float)
    assert [control, stimulated] == pytest.approx([0.50002, 0.50951], abs=2e-5)
    assert stimulated > control + 0.005  # 50 µA at the face-selective peak makes "face" more likely
    assert namespace["report"].shannon_k == pytest.approx(np.log10(10e-3 / 2000e-8) + np.log10(10e-3), abs=1e-9)


def test_the_reports_snippet_runs_and_writes_html_and_pdf(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_python_snippet(_docs_page("reports"), "# Reports"), "docs/reports.md", "exec"), {})
    written = tmp_path / "results" / "my_result"
    assert sorted(path.name for path in written.iterdir()) == ["report.html", "report.pdf"]  # the comment
    assert (written / "report.pdf").read_bytes().startswith(b"%PDF")
    assert "ΔAUC" in (written / "report.html").read_text(encoding="utf-8")


def _quoted_number(text: str) -> float:
    return float(text.replace("−", "-"))


@pytest.mark.slow
def test_the_default_plan_figures_the_docs_quote_are_what_the_main_command_gives(tmp_path):
    """The quick start's main command (``stimsim plan experiments/plan_default.toml``), run as written: its
    predicted-vs-true r (all, per candidate) and power figures are the ones docs/planning.md states."""
    import json

    from stimsim.cli import main

    out = tmp_path / "plan"
    assert main(["plan", str(REPO / "experiments" / "plan_default.toml"), "--out", str(out),
                 "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    quoted = re.search(r"measured on the quick start's main command:\s+r = ([−\d.]+); per candidate stimsim-topo-s0 "
                       r"([−\d.]+), stimsim-topo-s1 ([−\d.]+); power across sites ([\d.]+) at (\d+) trials",
                       _docs_page("planning"))
    assert quoted, "docs/planning.md no longer quotes the default plan's figures in the form this test reads"
    r, r_s0, r_s1, power, trials = quoted.groups()
    assert summary["predicted_vs_true_r"] == pytest.approx(_quoted_number(r), abs=5e-4)
    per_model = summary["predicted_vs_true_r_per_model"]
    assert per_model["stimsim-topo-s0"] == pytest.approx(_quoted_number(r_s0), abs=5e-3)
    assert per_model["stimsim-topo-s1"] == pytest.approx(_quoted_number(r_s1), abs=5e-3)
    assert summary["power_at_planned_trials"]["trials_per_site"] == int(trials)
    assert summary["power_at_planned_trials"]["across_sites"] == pytest.approx(float(power), abs=5e-3)
    assert summary["trials_per_site_needed"]["across_sites"] is None  # "no site count up to 6,400"
