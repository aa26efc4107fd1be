"""The Python snippets of the README and of the documentation pages run as written, and their comments state
what they print and write; the figures the documentation quotes for the main command and the tour after it are
what they give."""
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from docs_figures import numbers, table_cell, table_rows
from readme_tour import run_tour

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
    # 2.32 cortex mm per model mm (the model's recorded scale): that many times the size, 1/2.32² the density
    scale = float(printed[1])
    assert scale == pytest.approx(2.322, abs=0.005) and namespace["scale"]["scale_overridden"] is False
    readme = " ".join(README.read_text(encoding="utf-8").split())
    quoted = re.search(r"50 µA would act on ([\d.]+)² ≈ ([\d.]+) times", readme)
    assert quoted and [float(x) for x in quoted.groups()] == pytest.approx([scale, scale ** 2], abs=0.05)
    experiments_page = " ".join(_docs_page("experiments").split())
    assert f"{scale:.2f} for stimsim-mnv2-s0, 2 for the 32-px models" in experiments_page
    assert cortex_mm == pytest.approx([scale * model_mm[0], model_mm[1] / scale ** 2])
    assert cortex_mm == pytest.approx([13.9, 261], abs=0.5)
    # the stimulation acts on the sheet in cortex mm, as experiment files do
    assert namespace["p"].sizes == {"condition": 2, "stimulus_id": 200, "choice": 2}
    assert namespace["it"].shape == (200, 224 * 224)
    control, stimulated = np.array(printed[3].strip("[]").split(), dtype=float)
    assert [control, stimulated] == pytest.approx([0.49999, 0.50158], abs=2e-5)
    assert stimulated > control + 0.001  # 50 µA at the face-selective peak makes "face" more likely
    assert namespace["report"].shannon_k == pytest.approx(np.log10(10e-3 / 2000e-8) + np.log10(10e-3), abs=1e-9)


def test_the_reports_snippet_runs_and_writes_html_and_pdf(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_python_snippet(_docs_page("reports"), "# Reports"), "docs/reports.md", "exec"), {})
    written = tmp_path / "results" / "my_result"
    assert sorted(path.name for path in written.iterdir()) == ["report.html", "report.pdf"]  # the comment
    assert (written / "report.pdf").read_bytes().startswith(b"%PDF")
    assert "ΔAUC" in (written / "report.html").read_text(encoding="utf-8")


def test_the_default_models_figures_of_the_readme_are_those_of_the_models_page():
    """The README's headline table repeats figures of docs/models.md's "Default models" table, which the runs of
    tests/test_published_experiments.py and tests/test_models_check_natural.py check."""
    models_page = REPO / "docs" / "models.md"
    rows = [row for row in table_rows(README) if row[0].strip("*").startswith("stimsim-") and len(row) == 7]
    assert [row[0].strip("*") for row in rows] == ["stimsim-mnv2-s0", "stimsim-mnv2-s1", "stimsim-effl0-s0"]
    top1_row = "ImageNet top-1 on the 300 samples the build held out (on the 700 it trained on)"
    for name, trunk, top1, sheet_mm, units, afraz_r, moeller in rows:
        name = name.strip("*")
        base_top1 = table_cell(models_page, top1_row, "monkeys / base network")[0 if "MobileNet" in trunk else 1]
        assert numbers(top1) == [table_cell(models_page, top1_row, name)[0], base_top1]
        assert numbers(sheet_mm) + numbers(units) == table_cell(
            models_page, "IT sheet (cortex mm) / units within λ(50 µA)", name)
        assert numbers(afraz_r) == table_cell(models_page, "Afraz r (p)", name)[:1]
        assert numbers(moeller) == table_cell(models_page, 'Moeller "same"-hit drop inside / outside the face patch',
                                              name)


def _quoted_number(text: str) -> float:
    return float(text.replace("−", "-"))


@pytest.mark.slow
def test_the_quick_start_main_command_and_the_tour_run_on_any_processor(tmp_path):
    """The quick start's main command and the README tour after it, as written, with what holds whatever the
    processor's float rounding (the figures themselves: the every_model test below, as some processors' kernels
    can still change the plan): the tour analyses the plan's
    chosen sites at 400 trials per site, reads the plan's r back, and power simulates up to 1,600 trials."""
    import json

    from stimsim.cli import main

    out = tmp_path / "plan"
    assert main(["plan", str(REPO / "experiments" / "plan_default.toml"), "--out", str(out),
                 "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert -1 <= summary["predicted_vs_true_r"] <= 1 and summary["chosen_model"] in summary["candidate_models"]
    analysed, power, curve = run_tour(out, tmp_path)
    chosen = len(summary["chosen_electrodes"])
    assert analysed["n_sites"] == power["n_sites"] == chosen > 0
    assert analysed["plan_predicted_vs_true_r"] == pytest.approx(summary["predicted_vs_true_r"], abs=1e-9)
    assert {400, 1600} <= set(curve) and max(curve) == 1600


@pytest.mark.slow
@pytest.mark.every_model
def test_the_default_plan_figures_the_docs_quote_are_what_the_main_command_gives(tmp_path):
    """Only with ``pytest -m every_model``: the sequences are computed in float64, so these figures hold on AVX2 and
    AVX-512 processors, but a processor whose float64 kernels sum in another order can still give another plan
    (docs/planning.md). The quick start's main command (``stimsim plan experiments/plan_default.toml``), run as
    written: its predicted-vs-true r (all, per candidate) and power figures are the ones docs/planning.md states;
    then the README tour's session, analysis and power: the figures docs/analysis.md states."""
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
    needed = re.search(r"80 % only at ([\d,]+) trials per site, the largest count it simulates", _docs_page("planning"))
    assert needed and summary["trials_per_site_needed"]["across_sites"] == int(needed.group(1).replace(",", ""))
    assert summary["trials_per_site_needed"]["largest_simulated"] == int(needed.group(1).replace(",", ""))
    # the sequences' excursions the planning page quotes: the target site's median change end to end, and the
    # other mapped sites' median change at the ends, in natural SDs
    quoted = re.search(r"the target site moves by a median ([\d.]+) SDs end to end while the\s+other sites move "
                       r"([\d.]+) SDs", _docs_page("planning"))
    assert [summary["sequence_response_change_sd"], summary["sequence_others_change_sd"]] == pytest.approx(
        [float(x) for x in quoted.groups()], abs=0.005)
    # the tour's next three commands as the README gives them (the session with its defaults: the chosen sites,
    # 400 trials per site, seed 0): docs/analysis.md's table of their figures
    analysed, power, curve = run_tour(out, tmp_path)

    def cell(row):
        return table_cell(REPO / "docs" / "analysis.md", row, "figure")

    assert analysed["n_sites"] == 24
    assert cell("true ΔAUC SD across the chosen sites (`power`: `true_delta_auc_sd`)") == pytest.approx(
        [power["true_delta_auc_sd"]], abs=5e-5)
    assert cell("plan's predicted vs true r, the chosen sites / every working electrode") == pytest.approx(
        [analysed["plan_predicted_vs_true_r_these_sites"], summary["predicted_vs_true_r"]], abs=5e-3)
    assert cell("split-half r of the per-site ΔAUC (the noise ceiling is undefined below 0)") == pytest.approx(
        [analysed["split_half_r"]], abs=5e-3)
    assert analysed["noise_ceiling"] is None
    assert cell("predicted vs observed r (permutation p)") == pytest.approx(
        [analysed["predicted_vs_observed_r"], analysed["predicted_vs_observed_permutation_p"]], abs=5e-3)
    assert cell("sites with p < 0.05") == pytest.approx(
        [analysed["n_sites_significant"]]) and analysed["n_sites_significant_chance"] == pytest.approx(1.2)
    assert cell("`power`: observed vs true r at 400 / 1,600 trials per site") == pytest.approx(
        [float(curve[400]["observed_vs_true_r"]), float(curve[1600]["observed_vs_true_r"])], abs=5e-3)
    assert cell("`power`: across-site Wilcoxon power at 400 trials per site") == pytest.approx(
        [float(curve[400]["wilcoxon_power"])], abs=5e-3)
    assert power["wilcoxon_trials_needed"] is None and max(curve) == 1600  # "no trial count up to 1,600"
    # docs/planning.md's reading of the same plan: the subject's median true ΔAUC, and how far pooling candidates
    # could go (each candidate's prediction at its fitted pose; ρ = the mean of the three correlations)
    planning = " ".join(_docs_page("planning").split())
    median = re.search(r"subject's median ΔAUC is ([\d.]+) at 50 µA", planning)
    assert median and summary["true_delta_auc_median"] == pytest.approx(float(median.group(1)), abs=5e-5)
    quoted = re.search(r"agree with each other at r = ([−\d.]+) and with the subject at ([−\d.]+) and ([−\d.]+), "
                       r"so .*?ρ ≈ ([\d.]+) .*?: ([\d.]+) for K = 2 \(the plan's pooled prediction: ([\d.]+)\) and "
                       r"at most √ρ ≈ ([\d.]+)", planning)
    assert quoted, "docs/planning.md no longer states the pooling figures in the form this test reads"
    with xr.open_dataset(out / "plan.nc") as plan_nc, xr.open_dataset(out / "truth" / "subject_p_high.nc") as truth:
        per_model = plan_nc["delta_auc"].sel(pose="fitted").mean("sequence").values
        alive = ~truth["dead"].values
        true = truth["true_delta_auc"].mean("sequence").values[alive]
    between = np.corrcoef(per_model[0, alive], per_model[1, alive])[0, 1]
    with_subject = [np.corrcoef(prediction[alive], true)[0, 1] for prediction in per_model]
    shared = (between + sum(with_subject)) / 3
    derived = [between, *with_subject, shared, shared / np.sqrt(shared + (1 - shared) / 2),
               summary["predicted_vs_true_r"], np.sqrt(shared)]
    assert [_quoted_number(x) for x in quoted.groups()] == pytest.approx(derived, abs=5e-3)
    electrodes = re.search(r"on its (\d+) working electrodes, .*? at (\d+) electrodes\.", planning)
    assert electrodes and [int(x) for x in electrodes.groups()] == [int(alive.sum())] * 2
    # docs/analysis.md's statistics on the same plan: the chance counts for its 24 sites, and a session of 40 trials
    # per site (seed 0), which leaves 5 sites without a ΔAUC and a split-half r below 0 (no noise ceiling)
    analysis_page = " ".join(_docs_page("analysis").split())
    fdr, uncorrected = re.search(r"Roters 2002\): ([\d.]+) for 24 sites, against ([\d.]+) uncorrected",
                                 analysis_page).groups()
    assert [analysed["n_sites_significant_fdr_chance"], analysed["n_sites_significant_chance"]] == pytest.approx(
        [float(fdr), float(uncorrected)], abs=5e-4)
    short, short_analysis = tmp_path / "short.nwb", tmp_path / "short_analysis"
    assert main(["subject", "session", str(out), "--trials-per-site", "40", "--out", str(short)]) == 0
    assert main(["analyze", str(short), "--plan", str(out), "--out", str(short_analysis), "--no-progress"]) == 0
    short_summary = json.loads((short_analysis / "summary.json").read_text())
    without = re.search(r"at 40 trials per site, seed 0: (\d+) of its (\d+) sites\)", analysis_page)
    assert [short_summary["n_sites_without_effect"], short_summary["n_sites_recorded"]] == [
        int(x) for x in without.groups()]
    split_half, sites = re.search(r"The default plan at 40 trials per site \(seed 0\) gives split-half r ([−\d.]+) "
                                  r"over (\d+) sites: undefined", analysis_page).groups()
    assert short_summary["split_half_r"] == pytest.approx(_quoted_number(split_half), abs=5e-3)
    assert short_summary["split_half_mean_sites"] == int(sites) and short_summary["noise_ceiling"] is None


@pytest.mark.slow
@pytest.mark.every_model
@pytest.mark.timeout(3600)
def test_the_default_plan_validated_on_five_poses_gives_the_figures_of_the_docs(tmp_path):
    """``stimsim plan experiments/plan_default.toml --validate 5`` (about 35 minutes on one core): the median r, the
    per-pose r and random-pose nulls, and the poses above their null that docs/planning.md states."""
    import json

    from stimsim.cli import main

    out = tmp_path / "plan"
    assert main(["plan", str(REPO / "experiments" / "plan_default.toml"), "--out", str(out), "--validate", "5",
                 "--no-progress"]) == 0
    validation = json.loads((out / "validation.json").read_text())
    planning = " ".join(_docs_page("planning").split())
    quoted = re.search(r"with `--validate 5` the median r over the hidden poses is ([−\d.]+) \(target ≥ 0\.5; the paper "
                       r"reports 0\.53–0\.58 against monkeys\), above its random-pose null in (\d) of 5 poses \(target "
                       r"4\)\. Per pose, r \(null 95th percentile\): (.*?)\. ", planning)
    assert quoted, "docs/planning.md no longer states the default plan's validation in the form this test reads"
    median, above, per_pose = quoted.groups()
    assert validation["predicted_vs_true_r"] == pytest.approx(_quoted_number(median), abs=5e-3)
    assert validation["poses_above_random_p95"] == int(above) and validation["targets_met"] is False
    pairs = re.findall(r"([−\d.]+) \(null ([−\d.]+)\)", per_pose)
    assert [_quoted_number(r) for r, _ in pairs] == pytest.approx(validation["predicted_vs_true_r_per_pose"], abs=5e-3)
    assert [_quoted_number(p) for _, p in pairs] == pytest.approx(validation["random_pose_r_p95"], abs=5e-3)
    pooled = re.search(r"Pooled over the five poses' electrodes, r = ([−\d.]+) \(permutation p ([\d.]+)\)", planning)
    assert pooled, "docs/planning.md no longer states the pooled r in the form this test reads"
    assert validation["pooled_r"] == pytest.approx(_quoted_number(pooled.group(1)), abs=5e-3)
    assert validation["pooled_permutation_p"] == pytest.approx(float(pooled.group(2)), abs=5e-4)


@pytest.mark.slow
@pytest.mark.every_model
def test_the_default_plan_on_the_subjects_own_model_gives_the_figures_of_the_docs(tmp_path):
    """The default plan with the subject's own model (stimsim-topo-s2) as its only candidate: the registration's
    mean electrode r and the predicted-vs-true r that docs/planning.md states."""
    import json

    from stimsim.cli import main

    text = (REPO / "experiments" / "plan_default.toml").read_text(encoding="utf-8")
    assert 'candidates = ["stimsim-topo-s0", "stimsim-topo-s1"]' in text
    text = text.replace('candidates = ["stimsim-topo-s0", "stimsim-topo-s1"]', 'candidates = ["stimsim-topo-s2"]')
    text = text.replace('config = "subject_default.toml"', f'config = "{REPO / "experiments" / "subject_default.toml"}"')
    config = tmp_path / "plan_own_model.toml"
    config.write_text(text, encoding="utf-8")
    out = tmp_path / "plan"
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    planning = " ".join(_docs_page("planning").split())
    quoted = re.search(r"\(stimsim-topo-s2 planning for itself, same hidden pose, registration mean r ([\d.]+)\) the "
                       r"same plan gives r = ([\d.]+)", planning)
    assert quoted, "docs/planning.md no longer states the own-model plan in the form this test reads"
    registration_r, r = (float(x) for x in quoted.groups())
    assert summary["registration"]["stimsim-topo-s2"]["mean_correlation"] == pytest.approx(registration_r, abs=5e-3)
    assert summary["predicted_vs_true_r"] == pytest.approx(r, abs=5e-3)


def test_every_link_between_pages_reaches_a_file_and_heading():
    """Each ``[text](page.md#anchor)`` of the README and the documentation names a page that exists and a heading on
    it (levels 1-3, slugged as the docs build slugs them: ``myst_heading_anchors = 3``); a renamed heading or page
    would otherwise leave a link that goes nowhere."""
    from mdit_py_plugins.anchors.index import slugify

    def anchors(page: Path) -> set:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        return {slugify(title) for title in re.findall(r"^#{1,3} (.+?)\s*$", text, flags=re.M)}

    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target, anchor in re.findall(r"\]\(([^)\s#]*\.md)?#([^)\s]+)\)", text):
            linked = page if not target else (page.parent / target).resolve()
            if not linked.is_file() or anchor not in anchors(linked):
                broken.append(f"{page.relative_to(REPO)}: {target}#{anchor}")
    assert not broken, broken
