"""The face-task plans on the ImageNet-based models (experiments/plan_face_imagenet.toml and its additive twin) on
the hidden pose of subject seed 2, and the README's tour (session, analysis, power) on the additive one: the figures
of docs/planning.md's tables, and both plans validated on five further poses. About 10 minutes a plan on one
core (a validation up to an hour), so only with ``pytest -m every_model``; the tour runs on the additive plan's
directory in the same test."""
import json

import pytest

from docs_figures import REPO, table_cell
from readme_tour import run_tour
from stimsim.cli import main

PLANNING_PAGE = REPO / "docs" / "planning.md"
PLAN_FILES = {"multiplicative (`plan_face_imagenet.toml`)": "plan_face_imagenet.toml",
              "additive (`plan_face_imagenet_additive.toml`)": "plan_face_imagenet_additive.toml"}
ADDITIVE = "additive (`plan_face_imagenet_additive.toml`)"

pytestmark = [pytest.mark.slow, pytest.mark.every_model, pytest.mark.timeout(2400)]


def _cell(row: str, column: str) -> list[float]:
    return table_cell(PLANNING_PAGE, row, column)


@pytest.mark.parametrize("column", list(PLAN_FILES))
def test_the_face_plans_give_the_figures_of_the_docs(column, tmp_path, shared_data):
    shared_data("natural/floc")
    shared_data("natural/imagenet_samples")
    out = tmp_path / "plan"
    assert main(["plan", str(REPO / "experiments" / PLAN_FILES[column]), "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "face_categorization" and summary["subject_base_network"] == "efficientnet_lite0"
    assert _cell("working electrodes", column) == [summary["n_rehearsed"] - len(summary["dead_electrodes_rehearsed"])]
    per_model = summary["predicted_vs_true_r_per_model"]
    assert _cell("predicted vs true ΔP(face) r: both candidates / stimsim-mnv2-s0 / -s1", column) == pytest.approx(
        [summary["predicted_vs_true_r"], per_model["stimsim-mnv2-s0"], per_model["stimsim-mnv2-s1"]], abs=5e-3)
    assert _cell("true ΔP(face) SD across the working electrodes / predicted", column) == pytest.approx(
        [summary["true_effect_sd"], summary["predicted_effect_sd"]], abs=5e-5)
    if column == ADDITIVE:
        scales = summary["additive_scale"]
        assert _cell("IT SD of the additive scale: stimsim-mnv2-s0 / -s1 / the subject's stimsim-effl0-s0",
                     column) == pytest.approx([scales[name]["layer_sd"] for name in
                                               ("stimsim-mnv2-s0", "stimsim-mnv2-s1", "virtual_subject")], abs=5e-4)
        _the_tour_gives_the_figures_of_the_docs(out, tmp_path)


def _the_tour_gives_the_figures_of_the_docs(out, tmp_path):
    """The README's tour (session with its defaults, ``analyze --plan``, ``power``) on the plan in ``out``: the
    figures of docs/planning.md's table of the tour on the additive face plan."""
    analysed, power, curve = run_tour(out, tmp_path)

    def cell(row):
        return table_cell(PLANNING_PAGE, row, "figure")

    def chance(row):
        return table_cell(PLANNING_PAGE, row, "chance")

    assert cell("chosen sites / trials in the session (400 per site)") == [analysed["n_sites"], analysed["n_trials"]]
    assert cell("true ΔAUC SD across the chosen sites (`power`: `true_delta_auc_sd`)") == pytest.approx(
        [power["true_delta_auc_sd"]], abs=5e-4)
    assert cell("split-half noise ceiling of the per-site ΔAUC") == pytest.approx([analysed["noise_ceiling"]],
                                                                                   abs=5e-3)
    assert cell("predicted vs observed r (permutation p)") == pytest.approx(
        [analysed["predicted_vs_observed_r"], analysed["predicted_vs_observed_permutation_p"]], abs=5e-3)
    assert cell("plan's predicted vs true r on these sites") == pytest.approx(
        [analysed["plan_predicted_vs_true_r_these_sites"]], abs=5e-3)
    assert cell("predicted vs observed r that the plan's r and the ceiling imply [95 % interval]") == pytest.approx(
        [analysed["expected_predicted_vs_observed_r"], *analysed["expected_predicted_vs_observed_r_95"]], abs=5e-3)
    assert cell("sites with p < 0.05") == [analysed["n_sites_significant"]]
    assert chance("sites with p < 0.05") == pytest.approx([analysed["n_sites_significant_chance"]])
    assert cell("`power`: observed vs true r at 400 / 1,600 trials per site") == pytest.approx(
        [float(curve[400]["observed_vs_true_r"]), float(curve[1600]["observed_vs_true_r"])], abs=5e-3)
    assert cell("`power`: across-site Wilcoxon power at 400 trials per site") == pytest.approx(
        [float(curve[400]["wilcoxon_power"])], abs=5e-3)
    # "no trial count up to the 1,600 per site it simulates ... (0.70 at 1,600; the plan's own forecast: 800 per site)"
    assert power["wilcoxon_trials_needed"] is None and max(curve) == 1600
    assert float(curve[1600]["wilcoxon_power"]) == pytest.approx(0.70, abs=5e-3)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials_per_site_needed"]["across_sites"] == 800


@pytest.mark.timeout(5400)
@pytest.mark.parametrize("column", list(PLAN_FILES))
def test_the_face_plans_validated_on_five_poses_give_the_figures_of_the_docs(column, tmp_path, shared_data):
    """``stimsim plan experiments/plan_face_imagenet*.toml --validate 5`` (up to an hour each on one core): the
    per-pose, median and pooled figures of docs/planning.md's validation table."""
    shared_data("natural/floc")
    shared_data("natural/imagenet_samples")
    out = tmp_path / "plan"
    assert main(["plan", str(REPO / "experiments" / PLAN_FILES[column]), "--out", str(out),
                 "--validate", "5", "--no-progress"]) == 0
    validation = json.loads((out / "validation.json").read_text())

    def cell(row):
        return table_cell(PLANNING_PAGE, row, column)

    per_pose = validation["predicted_vs_true_r_per_pose"]
    assert [pose["subject_seed"] for pose in validation["poses"]] == [103, 204, 305, 406, 507]
    assert cell("predicted vs true ΔP(face) r per pose (subject seeds 103, 204, 305, 406, 507)") == pytest.approx(
        per_pose, abs=5e-3)
    assert cell("random-pose null, 95th percentile, per pose") == pytest.approx(validation["random_pose_r_p95"],
                                                                               abs=5e-3)
    assert cell("median r / poses above their null") == pytest.approx(
        [validation["predicted_vs_true_r"], validation["poses_above_random_p95"]], abs=5e-3)
    assert validation["pooled_n_electrodes"] == 455
    assert cell("pooled r over the five poses' 455 electrodes (permutation p, shuffled within each pose)") == (
        pytest.approx([validation["pooled_r"], validation["pooled_permutation_p"]], abs=5e-3))
    true_sd = [json.loads((out / "validation" / f"pose_{k}" / "summary.json").read_text())["true_effect_sd"]
               for k in range(5)]
    digits = 3 if column == ADDITIVE else 4  # as the table gives them
    assert cell("true ΔP(face) SD across the working electrodes, per pose") == pytest.approx(true_sd,
                                                                                             abs=0.5 * 10 ** -digits)
    assert validation["targets_met"] is False
