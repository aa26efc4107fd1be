"""The published experiments, end to end on the shipped default model, beside the monkey data.

Every run takes about two minutes on the 50,176-unit default, so the suite runs them on stimsim-mnv2-s0 only
(the documentation's "Default models", docs/models.md, gives all three ImageNet-based models)."""
import json
import os
from pathlib import Path

import pytest

from stimsim.cli import main

SHARED_DATA = Path(os.environ.get("STIMSIM_MIRROR_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"needs the published data: no mirror at "
                                                                  f"{SHARED_DATA}; set STIMSIM_MIRROR_DIR")]


SHIPPED = ["stimsim-mnv2-s0"]
MODELS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "models.md"


def _docs_cell(row_label: str, model: str) -> list[float]:
    """The numbers in ``model``'s column of the "Default models" table row ``row_label`` (docs/models.md)."""
    import re

    lines = [line for line in MODELS_PAGE.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    header = next(line for line in lines if "| stimsim-mnv2-s0 | stimsim-mnv2-s1 |" in line)
    column = [cell.strip() for cell in header.split("|")].index(model)
    row = next(line for line in lines if line.startswith(f"| {row_label} |"))
    return [float(x.replace("−", "-")) for x in re.findall(r"[−\d.e-]+", row.split("|")[column])
            if re.search(r"\d", x)]


def _run(experiment, model, out_dir, capsys):
    assert main(["run", f"experiments/{experiment}.toml", "--model", model, "--out", str(out_dir), "--no-progress"]) == 0
    capsys.readouterr()
    summary = json.loads((out_dir / "summary.json").read_text())
    # every experiment runs at the model's own cortex scale
    assert summary["scale_overridden"] is False
    assert summary["cortex_mm_per_model_mm"] == summary["model_cortex_mm_per_model_mm"]
    return summary


@pytest.mark.parametrize("model", SHIPPED)
def test_afraz2006_face_selective_sites_shift_choices_towards_face(model, tmp_path, capsys):
    summary = _run("afraz2006", model, tmp_path, capsys)
    assert summary["model_n_sites"] == 86 and summary["model_n_selective"] == 31
    # the targets that the model meets: a shift that grows with d' at p < 0.01, other sites below 2.5 % signal,
    # and the shift reported in log-odds too
    assert summary["model_r"] > 0 and summary["model_p"] < 0.01
    assert summary["model_mean_shift_other"] < 2.5
    assert summary["model_mean_shift_selective_logodds"] > summary["model_mean_shift_other_logodds"]
    # not met (docs/models.md, "Default models"): r >= 0.4 (0.398 measured), the 2.3-9.1 % shift at d' > 1 sites
    # (0.63 %) and a control curve as steep as a trained animal's (P(face) 0.33 at -50 %, 0.75 at +50 %); held: the
    # direction, and a curve that rises from non-faces to faces
    assert summary["model_mean_shift_selective"] > max(0.0, summary["model_mean_shift_other"])
    assert summary["control_p_face_at_minus50"] < 0.5 < summary["control_p_face_at_50"]
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
    # the targets met on this model: inside drop >= 0.5, objects less than faces; not met: outside <= 0.1 (0.109
    # measured, docs/models.md); held: the outside drop far below the inside drop
    assert inside >= 0.5 and outside < inside / 4
    assert summary["model_object_same_hit_drop_inside"] < inside
    # the figures docs/models.md gives are this run's
    assert [inside, outside] == pytest.approx(
        _docs_cell('Moeller "same"-hit drop inside / outside the face patch', model), abs=0.005)
    assert summary["model_object_same_hit_drop_inside"] == pytest.approx(
        _docs_cell("Moeller object drop inside", model)[0], abs=0.005)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "override" in json.dumps(config)
