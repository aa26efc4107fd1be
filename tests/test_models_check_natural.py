"""`stimsim models check` on natural images (fLoc by domain, ImageNet top-1) and `models list --json`."""
import json
import math
import re
import warnings

import numpy as np
import pytest
import torch

from docs_figures import REPO, table_cell
from stimsim.cli import main
from stimsim.cortex.sheet import CorticalSheet
from stimsim.data import manifest
from stimsim.engine.activation_cache import SAMPLED_ROWS
from stimsim.models.architectures import build_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.registry import describe_model
from stimsim.models.topographic import TopographicModel
from stimsim.training import evaluation

MODELS_PAGE = REPO / "docs" / "models.md"
BASE_TOP1_COLUMN = {"mobilenet_v2": 0, "efficientnet_lite0": 1}  # the order docs/models.md names the base networks


@pytest.fixture
def small_mobilenet(base_network):
    """MobileNetV2 with its ImageNet weights at 64 px, IT = features.18 (1280 × 2 × 2 units on 8 model mm)."""
    from stimsim.models.base_networks import base_weights_path
    from stimsim.models.torchvision_builder import build_torchvision_model

    base_network("mobilenet_v2")  # skips (fails under CI) when the weights cannot be fetched
    model = build_torchvision_model("mobilenet_v2", base_weights_path("mobilenet_v2"),
                                    {"features.18": {"sheet_size_mm": 8.0, "neighborhood_width_mm": 2.0, "area": "IT"}},
                                    Preprocessing(size_px=64), name="mnv2-64")
    model.metadata["base_network"] = "mobilenet_v2"
    return model


def test_the_default_images_are_floc_by_domain_with_maps_clusters_figures_and_imagenet(
        small_mobilenet, shared_data, monkeypatch, tmp_path, one_torch_thread):
    monkeypatch.setenv(manifest.MIRROR_DIR_ENV, str(shared_data("natural/floc").parents[1]))
    monkeypatch.setattr(evaluation, "FLOC_IMAGES_PER_CATEGORY", 6)
    calls = []
    activations = small_mobilenet.activations
    monkeypatch.setattr(small_mobilenet, "activations", lambda images, *a, **k: calls.append(len(images))
                        or activations(images, *a, **k))
    report = evaluation.check_model(small_mobilenet, n_shuffles=100, figure_dir=tmp_path / "maps", imagenet_limit=20)
    assert report["stimuli"] == "floc" and report["label"] == "domain" and report["positive_class"] == "face"
    assert "images_note" not in report
    # two fLoc categories of six images per domain; the scrambled images are left out
    assert report["n_images"]["face"] == 12 and report["n_images"]["other"] == 48
    maps = report["domain_maps"]
    assert sorted(maps) == ["body", "character", "face", "object", "place"] and "class_maps" not in report
    for entry in maps.values():
        assert {"morans_i", "p", "selective_fraction", "clusters_mm", "n_clusters"} <= set(entry)
        assert entry["n_clusters"] == len(entry["clusters_mm"]) and entry["clusters_mm"] == sorted(entry["clusters_mm"],
                                                                                                   reverse=True)
        # a cluster can be no wider than the sheet's diagonal (8 model mm at 1 cortex mm per model mm)
        assert all(0 < size <= 8 * math.sqrt(2) for size in entry["clusters_mm"])
    assert report["cluster_p"] == maps["face"]["p"] and report["n_classes"] == 5
    assert sorted(report["figures"]) == sorted(maps)
    assert all((tmp_path / "maps" / f"mnv2-64_{d}_dprime.png").stat().st_size > 1000 for d in maps)
    assert report["figure"] == str(tmp_path / "maps" / "mnv2-64_face_dprime.png")
    # the model's own output is MobileNetV2's ImageNet classifier; the base network runs at 224 px
    assert report["base_network"] == "mobilenet_v2" and report["imagenet_n"] == 20
    assert 0 <= report["imagenet_top1"] <= 1 and report["imagenet_top1_base"] >= 0.7
    assert report["imagenet_images"] == "all" and "imagenet_top1_trained_images" not in report
    assert calls == [60]
    again = evaluation.check_model(small_mobilenet, n_shuffles=100, imagenet=False)
    # the responses come from the activation cache: only its first, last and SAMPLED_ROWS random rows are
    # computed again
    assert calls == [60, 2 + SAMPLED_ROWS] and again["domain_maps"] == maps and "imagenet_top1" not in again


def test_a_model_trained_on_the_imagenet_samples_is_scored_on_those_it_held_out(
        small_mobilenet, shared_data, monkeypatch, one_torch_thread):
    from stimsim.training.imagenet import imagenet_files

    folder = shared_data("natural/imagenet_samples")
    monkeypatch.setenv(manifest.MIRROR_DIR_ENV, str(folder.parents[1]))
    files, _ = imagenet_files(folder)
    held = [files[i].name for i in (3, 7, 11, 15)]
    everything = evaluation.imagenet_scores(small_mobilenet, limit=20)
    small_mobilenet.metadata.update(training={"data": {"sets": [{"source": "imagenet_samples"}]}},
                                    holdout_stimulus_ids=held + ["adult/adult-1.jpg"])
    with warnings.catch_warnings():
        # the logits come from the activation cache: its check recomputes rows in a batch of another size,
        # whose last bits differ, and must not take that for changed content
        warnings.simplefilter("error", UserWarning)
        report = evaluation.imagenet_scores(small_mobilenet, limit=20)
    assert report["imagenet_images"] == "held out from the build" and report["imagenet_n"] == 4
    assert report["imagenet_n_trained_images"] == 16
    # the held-out and trained-on scores are the all-image score's two parts
    parts = 4 * report["imagenet_top1"] + 16 * report["imagenet_top1_trained_images"]
    assert parts == pytest.approx(20 * everything["imagenet_top1"])
    # a build that held none of the samples out has no unseen top-1
    small_mobilenet.metadata["holdout_stimulus_ids"] = ["adult/adult-1.jpg"]
    none_left = evaluation.imagenet_scores(small_mobilenet, limit=20)
    assert none_left["imagenet_top1"] is None and "no top-1 on unseen images" in none_left["imagenet_note"]


def test_a_damaged_floc_copy_is_an_error_not_a_reason_to_check_on_other_images(tmp_path, monkeypatch, capsys,
                                                                               shared_data):
    """Only fLoc that is nowhere to be found sends the check to the held-out LFW images: a cached copy that fails its
    checksum stops it, naming the file and the command that mends it."""
    from test_model_files import tiny_model

    shared_data("natural/floc")
    monkeypatch.setenv("STIMSIM_CACHE_DIR", str(tmp_path / "cache"))
    first = next(spec.path for spec in manifest.get_entry("floc").files if spec.path.startswith("adult/"))
    damaged = tmp_path / "cache" / "floc" / first
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"not the photograph")
    saved = tiny_model().save(tmp_path / "model")
    assert main(["models", "check", str(saved), "--shuffles", "100", "--json", "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"stimsim: error: checksum mismatch for '{first}' of data entry 'floc' at {damaged}")
    assert "`stimsim data fetch floc` sets the damaged copy aside" in error
    assert "not available" not in error


def test_without_floc_the_check_says_so_and_uses_the_heldout_images(tmp_path, monkeypatch, capsys):
    from test_model_files import tiny_model

    (tmp_path / "empty-mirror").mkdir()
    monkeypatch.setenv(manifest.MIRROR_DIR_ENV, str(tmp_path / "empty-mirror"))
    saved = tiny_model().save(tmp_path / "model")
    assert main(["models", "check", str(saved), "--shuffles", "100", "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["stimuli"] == "lfw_subset+fashion_mnist_test" and "class_maps" in report
    assert report["images_note"].startswith("the fLoc images are not available")
    assert report["images_note"].endswith("model 'tiny' lists no held-out images: all 200 LFW images are used, and its "
                                          "training may have seen some of them")
    assert captured.err.strip() == f"stimsim: warning: {report['images_note']}"
    assert report["imagenet_top1"] is None and report["imagenet_top1_base"] is None
    assert main(["models", "check", str(saved), "--heldout", "--positive", "face"]) == 2
    assert "--label and --positive apply to --stimuli" in capsys.readouterr().err


def _lattice_model(n_side: int, spacing_model_mm: float, scale: float) -> TopographicModel:
    n = n_side * n_side
    xs, ys = np.meshgrid(np.arange(n_side) * spacing_model_mm, np.arange(n_side) * spacing_model_mm)
    sheet = CorticalSheet("it", (n, 1, 1), np.stack([xs.ravel(), ys.ravel()], 1))
    kwargs = {"n_classes": 2, "it_units": n}
    torch.manual_seed(0)
    return TopographicModel(build_network("stimsim_topo", **kwargs), {"it": sheet},
                            Preprocessing(size_px=16, channels=1, mean=(0.5,), std=(0.25,)),
                            {"family": "stimsim_topo", "kwargs": kwargs}, areas={"it": "IT"}, name="lattice",
                            metadata={"cortex_scale": {"layer": "it", "cortex_mm_per_model_mm": scale,
                                                       "rule": "test lattice"}})


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_units_within_lambda50_is_the_density_times_the_disc(scale, tmp_path):
    """100 × 100 units 0.05 model mm apart: (0.05·scale)⁻² units per cortex mm², so π·λ²·density units within
    λ(50 µA) = 0.226 mm of a site (64.2 at 1 cortex mm per model mm, 16.0 at 2), less a few % at the edges."""
    directory = _lattice_model(100, 0.05, scale).save(tmp_path / "lattice")
    described = describe_model(directory)
    expected = math.pi * 0.226 ** 2 / (0.05 * scale) ** 2
    assert described["units_within_lambda50"] == pytest.approx(expected, rel=0.08)
    assert described["cortex_mm_per_model_mm"] == scale and described["it_units"] == 10_000
    assert described["sheet_size_cortex_mm"] == pytest.approx(99 * 0.05 * scale)
    assert described["base_network"] is None and described["family"] == "stimsim_topo"
    assert described["files_bytes"] == sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_models_list_json_describes_every_shipped_model(capsys):
    assert main(["models", "list", "--json"]) == 0
    models = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    assert sorted(models) == ["stimsim-effl0-s0", "stimsim-mnv2-s0", "stimsim-mnv2-s1",
                              "stimsim-topo-s0", "stimsim-topo-s1", "stimsim-topo-s2"]
    for name in ("stimsim-topo-s0", "stimsim-topo-s1", "stimsim-topo-s2"):
        model = models[name]
        assert model["family"] == "stimsim_topo" and model["base_network"] is None
        assert model["base_weights_sha256"] is None and model["it_units"] == 4096
        # 4,096 units on a 20 cortex mm sheet: 10.2 per mm², about 1.6 within 0.226 mm
        assert 1.2 < model["units_within_lambda50"] < 2.0 and model["cortex_mm_per_model_mm"] == 2.0
        assert model["it_resting_activity"] is False
    bases = {"stimsim-mnv2-s0": "mobilenet_v2", "stimsim-mnv2-s1": "mobilenet_v2",
             "stimsim-effl0-s0": "efficientnet_lite0"}
    for name, base in bases.items():
        model = models[name]
        assert model["family"] == "topo_head" and model["base_network"] == base
        assert len(model["base_weights_sha256"]) == 64 and model["it_units"] == 224 * 224
        assert model["files_bytes"] <= 40e6 and model["it_resting_activity"] is True
        # 50,176 units on a sheet of side S cortex mm: π·0.226²·50,176 / S² units within λ(50 µA), less the edges
        expected = math.pi * 0.226 ** 2 * 224 ** 2 / model["sheet_size_cortex_mm"] ** 2
        assert model["units_within_lambda50"] == pytest.approx(expected, rel=0.05)
        assert model["units_within_lambda50"] >= 20
        # the figures docs/models.md gives, to the one decimal it quotes
        sheet_mm, units = table_cell(MODELS_PAGE, "IT sheet (cortex mm) / units within λ(50 µA)", name)
        assert model["sheet_size_cortex_mm"] == pytest.approx(sheet_mm, abs=0.05 + 1e-9)
        assert model["units_within_lambda50"] == pytest.approx(units, abs=0.05 + 1e-9)
    # the file sizes docs/models.md and the README give, in MB of 10⁶ bytes
    models_page, readme = MODELS_PAGE.read_text(encoding="utf-8"), (REPO / "README.md").read_text(encoding="utf-8")
    low, high = map(float, re.search(r"Files\s+(\d+)–(\d+) MB in float16", models_page).groups())
    assert all(low <= round(models[name]["files_bytes"] / 1e6) <= high for name in bases)
    for text in (models_page, readme):
        low, high = map(float, re.search(r"(\d\.\d)–(\d\.\d) MB each", text).groups())
        for small in ("stimsim-topo-s0", "stimsim-topo-s1", "stimsim-topo-s2"):
            assert low <= round(models[small]["files_bytes"] / 1e6, 1) <= high, small


@pytest.mark.slow
@pytest.mark.every_model
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", ["stimsim-mnv2-s0", "stimsim-mnv2-s1", "stimsim-effl0-s0"])
def test_the_default_models_check_gives_the_figures_of_the_docs(name, shared_data, capsys):
    """`stimsim models check NAME` as docs/models.md ran it (fLoc, 1,000 shuffles, ImageNet top-1 on the samples
    the build held out): every figure of its "Default models" table. About 12 minutes a model on one core."""
    shared_data("natural/floc")
    shared_data("natural/imagenet_samples")
    assert main(["models", "check", name, "--json", "--shuffles", "1000", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stimuli"] == "floc" and report["imagenet_images"] == "held out from the build"

    def cell(row):
        return table_cell(MODELS_PAGE, row, name)

    assert report["face_balanced_accuracy"] == pytest.approx(cell("face balanced accuracy (chance 0.5)")[0], abs=5e-4)
    morans_i, p, *clusters = cell("face Moran's I (p) / largest face clusters (cortex mm)")
    assert report["morans_i"] == pytest.approx(morans_i, abs=0.005)
    assert report["cluster_p"] == pytest.approx(p, rel=0.01)
    assert report["domain_maps"]["face"]["clusters_mm"][:3] == pytest.approx(clusters, abs=0.05)
    assert [report["n_classes_clustered"], report["n_classes"]] == cell("domains clustered (p < 0.01)")
    assert report["morans_i_null_mean"] == pytest.approx(
        cell("face Moran's I with shuffled positions (mean of the 1,000 shuffles)")[0], abs=5e-6)
    top1_rows = "ImageNet top-1 on the 300 samples the build held out (on the 700 it trained on)"
    held_out, trained_on = cell(top1_rows)
    assert report["imagenet_n"] == 300 and report["imagenet_n_trained_images"] == 700
    assert report["imagenet_top1"] == pytest.approx(held_out, abs=5e-4)
    assert report["imagenet_top1_trained_images"] == pytest.approx(trained_on, abs=5e-4)
    base = table_cell(MODELS_PAGE, top1_rows, "monkeys / base network")[BASE_TOP1_COLUMN[report["base_network"]]]
    assert report["imagenet_top1_base"] == pytest.approx(base, abs=5e-4)


def test_the_heldout_images_are_those_the_training_did_not_use():
    """A model trained on LFW keeps the LFW faces it held out; one trained on other images keeps every LFW face,
    without a note; one that records nothing keeps them all with a note saying its training may have seen them."""
    from types import SimpleNamespace

    from stimsim.data.stimuli import lfw_subset

    lfw = lfw_subset()
    faces_of = {}
    for name, metadata in (("lfw", {"holdout_stimulus_ids": list(lfw.stimulus_id[:3]),
                                    "training": {"data": {"sets": [{"source": "lfw_subset"}]}}}),
                           ("folder", {"holdout_stimulus_ids": ["faces/001.png"],
                                       "training": {"data": {"sets": [{"source": "folder", "path": "images"}]}}}),
                           ("unrecorded", {})):
        stimuli, note = evaluation.heldout_images(SimpleNamespace(name=name, metadata=metadata), objects_per_class=2)
        faces_of[name] = int((np.asarray(stimuli.labels["category"]) == "face").sum())
        assert (note is not None) == (name == "unrecorded")
    assert faces_of == {"lfw": int((np.asarray(lfw.labels["category"][:3]) == "face").sum()),
                        "folder": int((np.asarray(lfw.labels["category"]) == "face").sum()),
                        "unrecorded": int((np.asarray(lfw.labels["category"]) == "face").sum())}
