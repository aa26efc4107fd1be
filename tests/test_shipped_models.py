"""The shipped default models: verified by checksum, and good enough for the science to show."""
import json

import numpy as np
import pytest

from stimsim.cli import main
from stimsim.data.manifest import get_entry, verify
from stimsim.errors import DataError
from stimsim.models.registry import SHIPPED_DIR, available_models, load_model

SHIPPED = ["stimsim-topo-s0", "stimsim-topo-s1", "stimsim-topo-s2"]


def test_three_seeds_ship_and_verify_against_the_manifest():
    assert available_models() == SHIPPED
    entry = get_entry("stimsim_default_models")
    listed = {f.path for f in entry.files}
    for name in SHIPPED:
        assert f"shipped_models/{name}/weights.pt" in listed
    assert all(status == "ok" for _, status in verify("stimsim_default_models"))


@pytest.mark.parametrize("name", SHIPPED)
def test_model_records_its_cortex_scale_and_the_rule_that_set_it(name):
    model = load_model(name)
    sheet = model.sheet("IT")
    scale = model.cortex_scale("IT")
    assert scale["layer"] == "it" and "macaque IT" in scale["rule"]
    # the rule: the sheet stands for macaque IT along its long axis, 15-20 mm
    assert 15.0 <= scale["sheet_size_cortex_mm"] <= 20.5
    assert scale["sheet_size_cortex_mm"] == pytest.approx(scale["cortex_mm_per_model_mm"] * sheet.size_mm, abs=1e-3)
    assert model.readout_layer == "it" and model.layers == ["v1", "v2", "v4", "pit", "it"]
    # in cortex mm: 4,096 units on (2 × 9.86 mm)² ≈ 10.5 units/mm², so the 0.5 mm recording radius
    # of the experiments holds about π · 0.5² · 10.5 ≈ 8 units
    cortex = model.with_sheet_scale("IT", scale["cortex_mm_per_model_mm"]).sheet("IT")
    assert cortex.density_per_mm2 == pytest.approx(sheet.density_per_mm2 / 4, rel=1e-6)
    middle = tuple(np.mean(cortex.coordinates_mm, axis=0))
    assert len(cortex.units_within(middle, 0.5)) >= 5


def test_shipped_files_stay_small():
    for name in SHIPPED:
        size = sum(f.stat().st_size for f in (SHIPPED_DIR / name).rglob("*") if f.is_file())
        assert size < 25e6, f"{name}: {size / 1e6:.1f} MB"


def test_corrupted_shipped_model_is_refused(tmp_path):
    import shutil

    copy = tmp_path / "s0"
    shutil.copytree(SHIPPED_DIR / "stimsim-topo-s0", copy)
    with open(copy / "weights.pt", "r+b") as handle:
        handle.seek(200)
        handle.write(b"\x00\x01\x02\x03")
    with pytest.raises(DataError, match="checksum mismatch"):
        load_model(copy)


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_models_check_meets_the_targets(name, tmp_path, capsys):
    figure = tmp_path / "dprime.png"
    assert main(["models", "check", name, "--heldout", "--json", "--figure", str(figure), "--shuffles", "200"]) == 0
    report = json.loads(capsys.readouterr().out)
    # face vs non-face on a class-balanced held-out set: chance is 0.5 for both scores
    assert report["face_chance"] == 0.5
    assert report["face_balanced_accuracy"] >= 0.9 and report["face_roc_auc"] >= 0.9
    assert report["object_balanced_accuracy"] > 5 * report["object_chance"]
    # the face map and at least 8 of the 12 classes' maps cluster on the sheet (p floor 1/201)
    assert report["cluster_p"] < 0.01 and report["morans_i"] > 0.05
    assert report["n_classes"] == 12 and report["n_classes_clustered"] >= 8
    assert 0 < report["face_selective_fraction"] < 0.6
    assert figure.stat().st_size > 10_000


def test_load_and_activation_timing_is_reported():
    from stimsim.bench import time_load_and_activations

    timing = time_load_and_activations("stimsim-topo-s0", n_images=10)
    assert timing["n_images"] == 10
    assert 0 < timing["load_s"] < timing["total_s"]
