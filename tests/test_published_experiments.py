"""The published experiments, end to end on the shipped default model, beside the monkey data."""
import json
import os
from pathlib import Path

import pytest

from stimsim.cli import main

SHARED_DATA = Path(os.environ.get("STIMSIM_MIRROR_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"needs the published data: no mirror at "
                                                                  f"{SHARED_DATA}; set STIMSIM_MIRROR_DIR")]


def _run(experiment, out_dir, capsys):
    assert main(["run", f"experiments/{experiment}.toml", "--out", str(out_dir), "--no-progress"]) == 0
    capsys.readouterr()
    summary = json.loads((out_dir / "summary.json").read_text())
    # every experiment runs at the model's own cortex scale
    assert summary["scale_overridden"] is False
    assert summary["cortex_mm_per_model_mm"] == summary["model_cortex_mm_per_model_mm"] == 2.0
    return summary


def test_afraz2006_face_selective_sites_shift_choices_towards_face(tmp_path, capsys):
    summary = _run("afraz2006", tmp_path, capsys)
    assert summary["model_n_sites"] == 86 and summary["model_n_selective"] == 31
    assert summary["model_r"] > 0 and summary["model_p"] < 0.05
    assert summary["model_mean_shift_selective"] > summary["model_mean_shift_other"]
    # the monkeys (Afraz et al. 2006): r ≈ 0.55, selective sites shift more
    assert summary["data_r"] == pytest.approx(0.552, abs=0.005)
    assert summary["data_mean_shift_selective"] > summary["data_mean_shift_other"]
    for name in ("results.nc", "config.json", "afraz2006_comparison.png"):
        assert (tmp_path / name).is_file()


def test_moeller2017_runs_beside_the_published_counts(tmp_path, capsys):
    summary = _run("moeller2017", tmp_path, capsys)
    # pooled published counts: same-hit 87.2 % → 14.4 % inside the face patches, 90.5 % → 85.7 % outside
    assert summary["data_same_hit_drop_inside"] == pytest.approx(0.728, abs=0.001)
    assert summary["data_same_hit_drop_outside"] == pytest.approx(0.048, abs=0.001)
    assert summary["model_same_hit_rate_control"] > 0.6
    # as in the monkeys, stimulating inside the face patch turns "same" faces into "different" far
    # more than stimulating outside it, and affects faces more than objects
    inside, outside = summary["model_same_hit_drop_inside"], summary["model_same_hit_drop_outside"]
    assert inside > 0.25 and inside - outside > 0.1 and inside > 1.5 * outside
    assert summary["model_object_same_hit_drop_inside"] < inside
    config = json.loads((tmp_path / "config.json").read_text())
    assert "override" in json.dumps(config)
