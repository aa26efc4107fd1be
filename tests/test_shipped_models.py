"""The shipped default models: verified by checksum, and good enough for the science to show."""
import json

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


def test_model_is_macaque_scale_and_dense_enough_for_electrodes():
    model = load_model("stimsim-topo-s0")
    sheet = model.sheet("IT")
    assert sheet.n_units == 4096
    assert 9.5 <= sheet.size_mm <= 10.0
    assert sheet.density_per_mm2 >= 40
    # the 0.25 mm around any electrode holds several units
    assert len(sheet.units_within((5.0, 5.0), 0.25)) >= 5
    assert model.readout_layer == "it" and model.layers == ["v1", "v2", "v4", "pit", "it"]


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
    assert main(["models", "check", name, "--json", "--figure", str(figure)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["face_accuracy"] >= 0.95
    assert report["cluster_p"] < 0.01
    assert report["morans_i"] > 0.05
    assert 0 < report["face_selective_fraction"] < 0.6
    assert report["sheet_mm"] == pytest.approx(10.0, abs=0.5)
    assert figure.stat().st_size > 10_000


def test_load_and_activation_timing_is_reported():
    from stimsim.bench import time_load_and_activations

    timing = time_load_and_activations("stimsim-topo-s0", n_images=10)
    assert timing["n_images"] == 10
    assert 0 < timing["load_s"] < timing["total_s"]
