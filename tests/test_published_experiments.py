"""The published experiments, end to end on the shipped ImageNet-based models, beside the monkey data; every
figure the documentation's "Default models" table (docs/models.md) gives for them is checked against these runs.

Every run takes about two minutes on a 50,176-unit model, so the suite runs them on the default stimsim-mnv2-s0;
the other two models carry the marker ``every_model`` (``pytest -m every_model``)."""
import json
import os
from pathlib import Path

import pytest

from docs_figures import REPO, row_label, table_cell
from stimsim.cli import main
from stimsim.models.registry import DEFAULT_MODEL

SHARED_DATA = Path(os.environ.get("STIMSIM_MIRROR_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"needs the published data: no mirror at "
                                                                  f"{SHARED_DATA}; set STIMSIM_MIRROR_DIR")]


SHIPPED = ["stimsim-mnv2-s0", *(pytest.param(name, marks=pytest.mark.every_model)
                                for name in ("stimsim-mnv2-s1", "stimsim-effl0-s0"))]
MODELS_PAGE = REPO / "docs" / "models.md"


def _docs_cell(label: str, model: str) -> list[float]:
    """The numbers in ``model``'s column of the "Default models" table row ``label`` (docs/models.md)."""
    return table_cell(MODELS_PAGE, label, model)


EXPERIMENTS_PAGE = REPO / "docs" / "experiments.md"
AFRAZ_COLUMNS = ["r (shift vs d′)", "p", "mean shift, d′ > 1 sites (% signal)", "mean shift, other sites"]


def _experiments_cell(label: str, column: str) -> list[float]:
    """The numbers of a cell of docs/experiments.md's tables."""
    return table_cell(EXPERIMENTS_PAGE, label, column)


def _run(experiment, model, out_dir, capsys):
    assert main(["run", f"experiments/{experiment}.toml", "--model", model, "--out", str(out_dir), "--no-progress"]) == 0
    capsys.readouterr()
    summary = json.loads((out_dir / "summary.json").read_text())
    # every experiment runs at the model's own cortex scale
    assert summary["scale_overridden"] is False
    assert summary["cortex_mm_per_model_mm"] == summary["model_cortex_mm_per_model_mm"]
    # Moeller's 300 µA runs outside a Utah tip's limits, under its file's override; Afraz's 50 µA within them
    assert summary["safety_overridden"] is ("moeller2017" in experiment)
    return summary


@pytest.mark.parametrize("model", SHIPPED)
def test_afraz2006_face_selective_sites_shift_choices_towards_face(model, tmp_path, capsys):
    summary = _run("afraz2006", model, tmp_path, capsys)
    assert summary["model_n_sites"] == 86 and summary["model_n_selective"] == 31
    # held on every model, as in the monkeys: the shift grows with d', selective sites shift towards "face" more
    # than the others, in % signal and in log-odds, and the control curve rises from non-faces to faces
    assert summary["model_r"] > 0
    assert summary["model_mean_shift_selective"] > max(0.0, summary["model_mean_shift_other"])
    assert summary["model_mean_shift_selective_logodds"] > summary["model_mean_shift_other_logodds"]
    assert summary["control_p_face_at_minus50"] < 0.5 < summary["control_p_face_at_50"]
    if model == DEFAULT_MODEL:
        # the targets the default meets: r >= 0.4 at p < 0.01, other sites below 2.5 % signal, a control curve as
        # steep as a trained animal's; not met (docs/models.md, "Default models"): the 2.3-9.1 % shift at d' > 1
        # sites (1.06 %)
        assert summary["model_r"] >= 0.4 and summary["model_p"] < 0.01 and summary["model_mean_shift_other"] < 2.5
        assert summary["control_p_face_at_minus50"] <= 0.2 and summary["control_p_face_at_50"] >= 0.8
    # the figures docs/models.md gives are this run's
    r, p = _docs_cell("Afraz r (p)", model)
    assert summary["model_r"] == pytest.approx(r, abs=0.005) and summary["model_p"] == pytest.approx(p, rel=0.5)
    shift, logodds = _docs_cell("Afraz shift at d′ > 1 sites (% signal / log-odds)", model)
    assert summary["model_mean_shift_selective"] == pytest.approx(shift, abs=0.005)
    assert summary["model_mean_shift_selective_logodds"] == pytest.approx(logodds, abs=5e-4)
    assert summary["model_mean_shift_other"] == pytest.approx(_docs_cell("Afraz shift at other sites (%)", model)[0],
                                                              abs=0.005)
    assert [summary["control_p_face_at_minus50"], summary["control_p_face_at_50"]] == pytest.approx(
        _docs_cell("Afraz control P(face) at −50 % / +50 % signal", model), abs=0.005)
    # the monkeys (Afraz et al. 2006): r ≈ 0.55, selective sites shift more
    assert summary["data_r"] == pytest.approx(0.552, abs=0.005)
    assert summary["data_mean_shift_selective"] > summary["data_mean_shift_other"]
    # docs/experiments.md's Afraz table: the monkeys' row and this model's are these runs' figures
    data_r, data_p, data_selective, data_other = (_experiments_cell("monkeys (Afraz et al. 2006)", column)
                                                  for column in AFRAZ_COLUMNS)
    assert data_r + data_p == pytest.approx([summary["data_r"], summary["data_p"]], rel=0.01)
    assert data_selective + data_other == pytest.approx(
        [summary["data_mean_shift_selective"], summary["data_n_selective"], summary["data_mean_shift_other"],
         summary["data_n_other"]], abs=0.005)
    row = row_label(EXPERIMENTS_PAGE, lambda label: label.startswith(model))
    r_cell, p_cell, selective_cell, other_cell = (_experiments_cell(row, column) for column in AFRAZ_COLUMNS)
    assert r_cell + p_cell == _docs_cell("Afraz r (p)", model)
    assert selective_cell == _docs_cell("Afraz shift at d′ > 1 sites (% signal / log-odds)", model)[:1]
    assert other_cell == _docs_cell("Afraz shift at other sites (%)", model)
    for name in ("results.nc", "config.json", "afraz2006_comparison.png"):
        assert (tmp_path / name).is_file()


@pytest.mark.parametrize("model", SHIPPED)
def test_moeller2017_runs_beside_the_published_counts(model, tmp_path, capsys):
    summary = _run("moeller2017", model, tmp_path, capsys)
    # pooled published counts: same-hit 87.2 % → 14.4 % inside the face patches, 90.5 % → 85.7 % outside
    assert summary["data_same_hit_drop_inside"] == pytest.approx(0.728, abs=0.001)
    assert summary["data_same_hit_drop_outside"] == pytest.approx(0.048, abs=0.001)
    assert summary["model_same_hit_rate_control"] > 0.6
    # as in the monkeys, stimulating inside the face patch turns "same" faces into "different" far
    # more than stimulating outside it, and affects faces more than objects
    inside, outside = summary["model_same_hit_drop_inside"], summary["model_same_hit_drop_outside"]
    assert inside > outside and summary["model_object_same_hit_drop_inside"] < inside
    if model == DEFAULT_MODEL:
        # the targets the default meets: inside drop >= 0.5, objects less than faces; not met: outside <= 0.1 (0.35,
        # docs/models.md)
        assert inside >= 0.5
    # the figures docs/models.md gives are this run's
    assert [inside, outside] == pytest.approx(
        _docs_cell('Moeller "same"-hit drop inside / outside the face patch', model), abs=0.005)
    assert summary["model_object_same_hit_drop_inside"] == pytest.approx(
        _docs_cell("Moeller object drop inside", model)[0], abs=0.005)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "override" in json.dumps(config)


#: The rows of docs/models.md's table of the gain on each unit's resting activity (resting_fraction = 0.5).
RESTING = "K = 0.5: "


@pytest.mark.parametrize("model", SHIPPED)
def test_afraz2006_with_the_gain_on_resting_activity_gives_the_docs_figures(model, tmp_path, capsys):
    """experiments/variants/afraz2006_resting.toml: the gain acts on half of each unit's resting activity too. On
    every model the face-selective sites shift more than under the plain gain (docs/models.md's main table) and the
    control curve, which has no stimulation, is the same; docs/models.md's resting table gives this run's figures."""
    summary = _run("variants/afraz2006_resting", model, tmp_path, capsys)
    plain_shift_logodds = _docs_cell("Afraz shift at d′ > 1 sites (% signal / log-odds)", model)[1]
    assert summary["model_mean_shift_selective_logodds"] > plain_shift_logodds
    assert [summary["control_p_face_at_minus50"], summary["control_p_face_at_50"]] == pytest.approx(
        _docs_cell("Afraz control P(face) at −50 % / +50 % signal", model), abs=0.005)
    if model == DEFAULT_MODEL:
        # met here: every Afraz target, r >= 0.4 at p < 0.01, the 2.3-9.1 % shift at d' > 1 sites, other sites below
        # 2.5 % signal (docs/models.md)
        assert summary["model_r"] >= 0.4 and summary["model_p"] < 0.01 and summary["model_mean_shift_other"] < 2.5
        assert 2.3 <= summary["model_mean_shift_selective"] <= 9.1
    r, p = _docs_cell(f"{RESTING}Afraz r (p)", model)
    assert summary["model_r"] == pytest.approx(r, abs=0.005) and summary["model_p"] == pytest.approx(p, rel=0.5)
    shift, logodds = _docs_cell(f"{RESTING}Afraz shift at d′ > 1 sites (% signal / log-odds)", model)
    assert summary["model_mean_shift_selective"] == pytest.approx(shift, abs=0.005)
    assert summary["model_mean_shift_selective_logodds"] == pytest.approx(logodds, abs=5e-4)
    assert summary["model_mean_shift_other"] == pytest.approx(
        _docs_cell(f"{RESTING}Afraz shift at other sites (%)", model)[0], abs=0.005)
    stimulation = json.loads((tmp_path / "config.json").read_text())["conditions"]
    assert {c["perturbations"][0]["resting_fraction"] for c in stimulation if c["perturbations"]} == {0.5}


@pytest.mark.every_model
@pytest.mark.parametrize("model", ["stimsim-mnv2-s0", "stimsim-mnv2-s1", "stimsim-effl0-s0"])
def test_moeller2017_with_the_gain_on_resting_activity_gives_the_docs_figures(model, tmp_path, capsys):
    """experiments/variants/moeller2017_resting.toml: what the resting activity does to Moeller's locality, the
    figures of docs/models.md's resting table."""
    summary = _run("variants/moeller2017_resting", model, tmp_path, capsys)
    assert [summary["model_same_hit_drop_inside"], summary["model_same_hit_drop_outside"]] == pytest.approx(
        _docs_cell(f'{RESTING}Moeller "same"-hit drop inside / outside the face patch', model), abs=0.005)
    assert summary["model_object_same_hit_drop_inside"] == pytest.approx(
        _docs_cell(f"{RESTING}Moeller object drop inside", model)[0], abs=0.005)


MOELLER_COLUMNS = ["no stimulation", "inside face patch", "outside", "objects: drop inside / outside"]


@pytest.mark.parametrize("model", ["stimsim-topo-s0", "stimsim-topo-s1", "stimsim-topo-s2"])
def test_moeller2017_on_the_32px_family_gives_the_table_of_the_docs(model, tmp_path, capsys):
    """docs/experiments.md's Moeller table: the monkeys' row and the small models' rows are these runs' figures."""
    summary = _run("moeller2017", model, tmp_path, capsys)
    control, inside, outside, objects = (_experiments_cell(f"{model}, own scale (2:1)", column)
                                         for column in MOELLER_COLUMNS)
    assert control == pytest.approx([summary["model_same_hit_rate_control"]], abs=0.005)
    assert inside == pytest.approx([summary["model_same_hit_rate_inside"], summary["model_same_hit_drop_inside"]],
                                   abs=0.005)
    assert outside == pytest.approx([summary["model_same_hit_rate_outside"], summary["model_same_hit_drop_outside"]],
                                    abs=0.005)
    assert objects == pytest.approx([summary["model_object_same_hit_drop_inside"],
                                     summary["model_object_same_hit_drop_outside"]], abs=0.005)
    control, inside, outside, objects = (_experiments_cell("monkeys", column) for column in MOELLER_COLUMNS)
    assert control == pytest.approx(
        [summary["data_same_hit_rate_inside_off"], summary["data_same_hit_rate_outside_off"]], abs=0.005)
    assert inside == pytest.approx([summary["data_same_hit_rate_inside_on"], summary["data_same_hit_drop_inside"]],
                                   abs=0.005)
    assert outside == pytest.approx([summary["data_same_hit_rate_outside_on"], summary["data_same_hit_drop_outside"]],
                                    abs=0.005)
    assert objects == pytest.approx([summary["data_object_same_hit_drop_inside"]], abs=0.005)
