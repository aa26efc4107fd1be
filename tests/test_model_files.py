"""Model directories: verified whole, saved byte for byte the same, damaged weights refused clearly."""
import json
import pickle
import re
import warnings

import numpy as np
import pytest
import torch

from stimsim.cortex.positions import retinotopic_positions
from stimsim.cortex.sheet import CorticalSheet
from stimsim.models.architectures import build_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.topographic import TopographicModel
from stimsim.models.torchvision_builder import build_torchvision_model
from stimsim.utilities.errors import ConfigError, DataError, FileFormatError
from stimsim.utilities.hashing import sha256_of


def tiny_model(it_units=64, seed=0):
    torch.manual_seed(seed)
    kwargs = {"n_classes": 2, "it_units": it_units}
    sheet = CorticalSheet("it", (it_units, 1, 1), retinotopic_positions((it_units, 1, 1), 8.0, seed=1))
    return TopographicModel(build_network("stimsim_topo", **kwargs), {"it": sheet},
                            Preprocessing(size_px=16, channels=1, mean=(0.5,), std=(0.25,)),
                            {"family": "stimsim_topo", "kwargs": kwargs}, areas={"it": "IT"}, name="tiny")


#: A valid ``metadata.cortex_scale`` record, as training writes it.
SCALE = {"layer": "it", "cortex_mm_per_model_mm": 2.0, "sheet_size_cortex_mm": 16.0, "rule": "planted rule"}


def test_a_recorded_cortex_scale_is_read_back(tmp_path):
    model = tiny_model()
    model.metadata["cortex_scale"] = SCALE
    loaded = TopographicModel.load(model.save(tmp_path / "model"))
    assert loaded.cortex_scale("IT")["cortex_mm_per_model_mm"] == 2.0
    assert loaded.metadata == {"cortex_scale": SCALE}


def test_a_cortex_scale_given_by_area_label_is_used_and_saved_under_its_layer(tmp_path):
    """The area label ("IT", as experiment files name layers) means the layer "it": in memory and in the file a later
    load reads. A record naming no layer of the model, or a scale that is not positive, is refused before any file
    is written."""
    model = tiny_model()
    model.metadata["cortex_scale"] = {**SCALE, "layer": "IT"}
    assert model.cortex_scale("it")["cortex_mm_per_model_mm"] == 2.0
    loaded = TopographicModel.load(model.save(tmp_path / "model"))
    assert loaded.metadata["cortex_scale"] == SCALE and loaded.cortex_scale("IT")["cortex_mm_per_model_mm"] == 2.0
    for record, message in (({**SCALE, "layer": "V4"}, r"'layer': unknown layer 'V4'"),
                            ({**SCALE, "cortex_mm_per_model_mm": -1.0}, r"cortex_mm_per_model_mm")):
        model.metadata["cortex_scale"] = record
        with pytest.raises(FileFormatError, match=rf"bad/model.json: \[metadata.cortex_scale\].*{message}"):
            model.save(tmp_path / "bad")
        assert not (tmp_path / "bad").exists()


@pytest.fixture
def saved(tmp_path):
    return tiny_model().save(tmp_path / "model")


def _edit_spec(directory, change):
    spec = json.loads((directory / "model.json").read_text())
    change(spec)
    (directory / "model.json").write_text(json.dumps(spec))


def _replace_weights(directory, data: bytes):
    """Put other bytes in weights.pt and record their sha256, as a careless or malicious edit would."""
    (directory / "weights.pt").write_bytes(data)
    _edit_spec(directory, lambda spec: spec["files_sha256"].update({"weights.pt": sha256_of(directory / "weights.pt")}))


def test_saving_the_same_model_twice_gives_the_same_bytes(tmp_path):
    model = tiny_model()
    first, second = model.save(tmp_path / "a"), model.save(tmp_path / "b")
    names = sorted(p.relative_to(first).as_posix() for p in first.rglob("*") if p.is_file())
    assert "weights.pt" in names and "positions/it.npz" in names
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert b".weights.pt" not in (first / "weights.pt").read_bytes()


@pytest.mark.parametrize("change, message", [
    (lambda spec: spec.pop("files_sha256"), "model.json: missing required key 'files_sha256'"),
    (lambda spec: spec["files_sha256"].pop("weights.pt"), r"files_sha256 does not cover \['weights.pt'\]"),
    (lambda spec: spec["files_sha256"].pop("positions/it.npz"), "does not cover.*positions/it.npz"),
    (lambda spec: spec["files_sha256"].update({"../outside.txt": "0" * 64}), "not a relative path inside"),
    (lambda spec: spec["files_sha256"].update({"/etc/hostname": "0" * 64}), "not a relative path inside"),
])
def test_model_json_must_cover_every_file_inside_the_directory(saved, change, message):
    _edit_spec(saved, change)
    with pytest.raises(FileFormatError, match=message):
        TopographicModel.load(saved)


@pytest.mark.parametrize("change, message", [
    (lambda spec: spec.update(format="stimsim-model/0"), r"model.json: 'format' must be one of 'stimsim-model/1'"),
    (lambda spec: spec.update(colour="red"), r"model.json: unknown key 'colour'; allowed: \['architecture'"),
    (lambda spec: spec["layers"]["it"].update(positions_file=3), r"model.json: \[layers.it\]: 'positions_file' must be text"),
    (lambda spec: spec["preprocessing"].update(size_px="16"), r"\[preprocessing\]: 'size_px' must be an integer, got '16'"),
    (lambda spec: spec["preprocessing"].update(std=[0.0]), r"\[preprocessing\]: 'std' must be > 0"),
    (lambda spec: spec["preprocessing"].update(mean=[0.5, 0.5]), r"\[preprocessing\]: .*mean must be 1 finite number"),
    (lambda spec: spec["files_sha256"].update({"weights.pt": "ABC"}), r"\[files_sha256\]: 'weights.pt' must match"),
    (lambda spec: spec["architecture"]["kwargs"].update(colour="red"), r"\[architecture\]: kwargs do not fit family"),
    (lambda spec: spec["metadata"].update(cortex_scale=dict(SCALE, cortex_mm_per_model_mm=-3)),
     r"\[metadata.cortex_scale\]: 'cortex_mm_per_model_mm' must be >= 0.001, got -3"),
    (lambda spec: spec["metadata"].update(cortex_scale=dict(SCALE, cortex_mm_per_model_mm="two")),
     r"\[metadata.cortex_scale\]: 'cortex_mm_per_model_mm' must be a number"),
    (lambda spec: spec["metadata"].update(cortex_scale={"layer": "it", "cortex_mm_per_model_mm": 2.0}),
     r"\[metadata.cortex_scale\]: missing required key 'rule'"),
    (lambda spec: spec["metadata"].update(cortex_scale=dict(SCALE, layer="v9")),
     r"\[metadata.cortex_scale\]: 'layer' must be one of the model's layers \['it'\], got 'v9'"),
    (lambda spec: spec.update(readout_layer="v9"), r"model.json: unknown layer 'v9'"),
])
def test_model_json_is_checked_field_by_field(saved, change, message):
    _edit_spec(saved, change)
    with pytest.raises(FileFormatError, match=message) as info:
        TopographicModel.load(saved)
    assert str(info.value).startswith(str(saved / "model.json"))


def test_a_positions_link_out_of_the_directory_is_refused(saved, tmp_path):
    outside = tmp_path / "elsewhere.npz"
    (saved / "positions" / "it.npz").rename(outside)
    (saved / "positions" / "it.npz").symlink_to(outside)
    with pytest.raises(FileFormatError, match="leads outside the model directory"):
        TopographicModel.load(saved)


class _Payload:
    def __reduce__(self):
        return print, ("unpickled",)


@pytest.mark.parametrize("make, error, message", [
    (lambda good: good[: len(good) // 3], FileFormatError,
     r"weights.pt: not a readable torch checkpoint: damaged, cut short or not written by torch.save \(\d+ bytes; "),
    (lambda good: np.random.default_rng(0).bytes(4096), FileFormatError,
     r"weights.pt: not a readable torch checkpoint: damaged, cut short or not written by torch.save \(4096 bytes\)$"),
    (lambda good: b"", FileFormatError, r"weights.pt: not a readable torch checkpoint: the file is empty \(0 bytes\)$"),
    (lambda good: pickle.dumps({"conv.weight": 1}, protocol=4), FileFormatError,  # a pickle, not torch.save's
     r"weights.pt: not a readable torch checkpoint: damaged, cut short or not written by torch.save \(\d+ bytes\)$"),
    (lambda good: pickle.dumps({"conv": _Payload()}, protocol=2), FileFormatError, "never unpickles"),
    (lambda good: _saved({"conv.weight": torch.zeros(3)}), FileFormatError, "weights.pt: does not match"),
    (lambda good: _saved(tiny_model(it_units=32).network.state_dict()), FileFormatError, "wrong shape"),
    (lambda good: _saved({k: v * float("nan") if v.is_floating_point() else v
                          for k, v in tiny_model().network.state_dict().items()}), DataError, "not finite"),
])
def test_damaged_or_foreign_weights_are_stimsim_errors(saved, make, error, message):
    _replace_weights(saved, make((saved / "weights.pt").read_bytes()))
    with pytest.raises(error, match=message) as info, warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's own advice on a file that is no checkpoint is not passed on
        TopographicModel.load(saved)
    assert "weights_only=False" not in str(info.value)


def test_a_positions_file_holding_python_objects_is_named_without_numpys_advice(saved):
    np.save(saved / "positions" / "it.npz", np.array([{"not": "positions"}], dtype=object), allow_pickle=True)
    (saved / "positions" / "it.npz.npy").rename(saved / "positions" / "it.npz")
    _edit_spec(saved, lambda spec: spec["files_sha256"].update(
        {"positions/it.npz": sha256_of(saved / "positions" / "it.npz")}))
    with pytest.raises(FileFormatError, match=r"it.npz: not a readable .npz archive \(it holds Python objects "
                                              r"\(pickled data\), which stimsim never loads from a file\)$"):
        TopographicModel.load(saved)


def _saved(state) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def test_non_finite_weights_are_not_saved(tmp_path):
    model = tiny_model()
    with torch.no_grad():
        next(model.network.parameters()).fill_(float("inf"))
    with pytest.raises(DataError, match="not finite"):
        model.save(tmp_path / "model")
    assert not (tmp_path / "model").exists()  # no empty folder left that reads as a model directory without model.json
    (tmp_path / "model.txt").write_text("notes")
    with pytest.raises(ConfigError, match=r"model directory .*model.txt: a file is there; give a folder"):
        tiny_model().save(tmp_path / "model.txt")
    assert (tmp_path / "model.txt").read_text() == "notes"


@pytest.mark.parametrize("architecture, message", [
    ({"family": "stimsim_tpoo", "kwargs": {"n_classes": 2, "it_units": 64}},
     r"\[architecture\]: unknown architecture family 'stimsim_tpoo'; registered: \["),
    ({"family": "stimsim_topo", "kwargs": {"n_classes": 2, "it_units": 64, "width": 3}},
     r"\[architecture\]: kwargs do not fit family 'stimsim_topo' \(.*'width'"),
    ({"family": "stimsim_topo", "kwargs": {"n_classes": 2, "it_units": 32}},
     r"\[architecture\]: family 'stimsim_topo' with kwargs \{'n_classes': 2, 'it_units': 32\} builds another network "
     r"than this model's \(.*key\(s\) with the wrong shape: .*\); give the family and kwargs it was built with"),
])
def test_an_architecture_that_does_not_rebuild_the_network_is_not_saved(tmp_path, architecture, message):
    """model.json's family and kwargs are what loading rebuilds the network from: a mistyped family, kwargs the
    builder does not take, or ones that build other shapes are refused when saving, before any file is written (they
    used to be saved and fail only when loaded)."""
    model = tiny_model()
    model.architecture = architecture
    with pytest.raises((ConfigError, FileFormatError), match=message):
        model.save(tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_a_layer_that_a_skip_connection_passes_around_is_a_config_error():
    # MobileNetV2's block features.3 returns x + conv(x): the output of conv.0 is not all that later layers need
    with pytest.raises(ConfigError, match="skip connection"):
        build_torchvision_model("mobilenet_v2", None, {"features.3.conv.0": {"sheet_size_mm": 10.0,
                                                                              "neighborhood_width_mm": 2.0}},
                                Preprocessing(size_px=64))


def test_a_torchvision_model_records_the_scale_given_at_build_time(tmp_path, capsys):
    """The scale is fixed when the model is built (here by area label) and travels with its files: in memory, after
    a save and load, and in `models list`'s description. A scale without a rule, or of a layer the model lacks,
    is refused."""
    from stimsim.models.registry import describe_model

    layers = {"layer4.1": {"sheet_size_mm": 4.0, "neighborhood_width_mm": 1.0, "area": "IT"}}
    scale = {"layer": "IT", "cortex_mm_per_model_mm": 2.5, "rule": "IT's extent: 10 mm of cortex"}
    model = build_torchvision_model("resnet18", None, layers, Preprocessing(size_px=32), cortex_scale=scale)
    assert model.cortex_scale("IT")["cortex_mm_per_model_mm"] == 2.5 and model.cortex_scale("IT")["rule"] == scale["rule"]
    saved = model.save(tmp_path / "rn18")
    assert TopographicModel.load(saved).metadata["cortex_scale"] == {
        "layer": "layer4.1", "cortex_mm_per_model_mm": 2.5, "sheet_size_cortex_mm": 10.0, "rule": scale["rule"]}
    assert describe_model(saved)["cortex_mm_per_model_mm"] == 2.5
    from stimsim.cli import main

    assert main(["models", "list", str(saved), "--json"]) == 0  # a lab's own model, described as the shipped ones
    listed, = json.loads(capsys.readouterr().out)["models"]
    assert (listed["name"], listed["family"], listed["cortex_mm_per_model_mm"]) == ("resnet18", "torchvision", 2.5)
    for bad, message in (({**scale, "layer": "V4"}, "layer must be one of the topographic layers"),
                         ({**scale, "cortex_mm_per_model_mm": 0}, "cortex_mm_per_model_mm must be a number > 0"),
                         ({"layer": "IT", "cortex_mm_per_model_mm": 2.5}, "exactly the keys")):
        with pytest.raises(ConfigError, match=message):
            build_torchvision_model("resnet18", None, layers, Preprocessing(size_px=32), cortex_scale=bad)


def test_saving_and_loading_a_model_leave_torchs_random_state_alone(tmp_path):
    """A user's own seeded draws after loading (or saving) a model are those they would be without it: the network
    built to receive the weights draws its initial values on a forked random state."""
    model = tiny_model()
    torch.manual_seed(7)
    expected = torch.randn(5)
    torch.manual_seed(7)
    TopographicModel.load(model.save(tmp_path / "model"))
    assert torch.equal(torch.randn(5), expected)


def test_models_list_names_a_model_folder_it_cannot_describe(tmp_path, capsys):
    """A lab's model folder whose model.json is not JSON, or that lacks a file model.json lists: one error line naming
    it, not a traceback or a description with the file's bytes left out."""
    from stimsim.cli import main

    saved = tiny_model().save(tmp_path / "model")
    (saved / "weights.pt").unlink()
    assert main(["models", "list", str(saved), "--json"]) == 2
    assert f"stimsim: error: model {saved}: file(s) ['weights.pt'] listed in model.json are missing" in \
        capsys.readouterr().err
    (saved / "model.json").write_text("{not json")
    assert main(["models", "list", str(saved)]) == 2
    assert capsys.readouterr().err.startswith(f"stimsim: error: {saved / 'model.json'}: not valid JSON")


def test_models_list_lists_the_healthy_models_beside_the_damaged_folders(tmp_path, capsys, monkeypatch):
    """Damaged model folders, among the shipped ones or named, do not hide the others: every model that can be
    described is listed, each damaged folder gets one error line saying what is wrong, and the command exits 2."""
    from stimsim.cli import main
    from stimsim.models import registry

    shipped = tmp_path / "shipped"
    good = tiny_model().save(shipped / "good")
    no_weights = tiny_model().save(shipped / "no_weights")
    (no_weights / "weights.pt").unlink()
    bad_json = tiny_model().save(shipped / "bad_json")
    (bad_json / "model.json").write_text("{not json")
    no_spec = tiny_model().save(shipped / "no_spec")  # its model.json lost: a model folder all the same
    (no_spec / "model.json").unlink()
    (shipped / "__pycache__").mkdir()  # not a model folder
    monkeypatch.setattr(registry, "SHIPPED_DIR", shipped)
    assert main(["models", "list"]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("tiny ") and len(captured.out.splitlines()) == 1
    first, second, third = captured.err.splitlines()
    assert first.startswith(f"stimsim: error: {bad_json / 'model.json'}: not valid JSON")
    assert second == (f"stimsim: error: model {no_spec}: no model.json there (a damaged shipped model folder; "
                      "install stimsim again to restore it)")
    assert third == f"stimsim: error: model {no_weights}: file(s) ['weights.pt'] listed in model.json are missing"
    assert main(["models", "list", str(no_weights), str(good), "--json"]) == 2
    captured = capsys.readouterr()
    assert [model["path"] for model in json.loads(captured.out)["models"]] == [str(good)]
    assert captured.err.count("stimsim: error: ") == 1 and str(no_weights) in captured.err


def test_data_manifests_are_package_data():
    """A wheel carries the manifests inside the package (the repository keeps them at the top level)."""
    from importlib.resources import files
    from pathlib import Path

    from stimsim.data.manifest import manifest_dir

    repo = Path(__file__).resolve().parents[1]
    packaged = files("stimsim") / "data_manifests"
    assert Path(str(manifest_dir())) == Path(str(packaged))
    assert sorted(p.name for p in Path(str(packaged)).glob("*.json")) == \
        sorted(p.name for p in (repo / "data_manifests").glob("*.json"))


def test_every_data_file_is_package_data_of_a_declared_package():
    """Each file the package needs besides its modules (templates, manifests, shipped models, schema) lies in a
    package setup.cfg declares and matches that package's package_data; a data folder missing from the packages
    is what makes setuptools warn "Package ... is absent from the `packages` configuration"."""
    import os
    from fnmatch import fnmatch
    from pathlib import Path

    from setuptools.config.setupcfg import read_configuration

    repo = Path(__file__).resolve().parents[1]
    options = read_configuration(repo / "setup.cfg")["options"]
    packages, package_data = set(options["packages"]), options["package_data"]
    data_files = [Path(folder) / name for folder, _, names in os.walk(repo / "stimsim", followlinks=True)
                  for name in names if Path(name).suffix not in (".py", ".pyc") and "__pycache__" not in folder]
    folders = {path.parent.relative_to(repo) for path in data_files}
    assert {Path("stimsim/report/templates"), Path("stimsim/data_manifests")} <= folders
    for path in data_files:
        parts = path.relative_to(repo).parts
        owners = [".".join(parts[:n]) for n in range(len(parts) - 1, 0, -1) if ".".join(parts[:n]) in packages]
        assert owners, f"{path} lies in no declared package"
        inside = "/".join(parts[len(owners[0].split(".")):])
        assert any(fnmatch(inside, pattern) and inside.count("/") == pattern.count("/")
                   for pattern in package_data.get(owners[0], [])), f"{path} is not package data of {owners[0]}"
        identifier_folders = [".".join(parts[:n]) for n in range(1, len(parts)) if parts[n - 1].isidentifier()
                              and all(part.isidentifier() for part in parts[:n])]
        assert set(identifier_folders) <= packages, f"{path}: folders {identifier_folders} are not all packages"


def _bright_and_dark_images(folder):
    """8 bright and 9 dark images of several sizes, gray and colour, in class subfolders of ``folder``."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(8):
        for label, level in (("bright", 0.8), ("dark", 0.2)):
            size = (24 + 4 * (i % 3), 16 + 8 * (i % 2))
            pixels = np.clip(level + rng.normal(0, 0.05, size + ((3,) if i % 2 else ())), 0, 1)
            (folder / label).mkdir(parents=True, exist_ok=True)
            Image.fromarray((pixels * 255).astype(np.uint8)).save(folder / label / f"{i}.png")
    (folder / "dark" / "extra.png").write_bytes((folder / "dark" / "0.png").read_bytes())


def test_models_check_takes_any_labelled_stimulus_set(saved, tmp_path, capsys):
    """Bright and dark images of several sizes, gray and colour, in class subfolders: the untrained
    network separates brightness, so the balanced decoding of "bright" beats its chance of 0.5."""
    import json as json_module

    from stimsim.cli import main

    _bright_and_dark_images(tmp_path / "images")
    args = ["models", "check", str(saved), "--stimuli", str(tmp_path / "images"), "--shuffles", "100", "--json"]
    assert main(args + ["--positive", "bright", "--out", str(tmp_path / "out")]) == 0
    report = json_module.loads(capsys.readouterr().out)
    assert report["positive_class"] == "bright" and report["n_classes"] == 2
    assert report["n_images"] == {"face": 8, "other": 9, "face_balanced_set": {"face": 8, "other": 8}}
    assert report["face_chance"] == 0.5 and report["face_balanced_accuracy"] > 0.75
    assert (tmp_path / "out" / "tiny_bright_dprime.png").stat().st_size > 0
    assert main(args + ["--positive", "face"]) == 2
    assert "no image of 'images' has category = 'face'" in capsys.readouterr().err
    # more images of the positive class than of the others: every other image, as many drawn positives
    assert main(args + ["--positive", "dark"]) == 0
    report = json_module.loads(capsys.readouterr().out)
    assert report["n_images"] == {"face": 9, "other": 8, "face_balanced_set": {"face": 8, "other": 8}}
    assert report["face_balanced_accuracy"] > 0.75


def test_models_check_prints_readable_lines_with_units(saved, tmp_path, capsys):
    """Without --json the report is one line per entry, numbers with their units, and each class's map and figure
    on a line of its own: no Python dict or list shown as it is."""
    from stimsim.cli import main

    _bright_and_dark_images(tmp_path / "images")
    assert main(["models", "check", str(saved), "--stimuli", str(tmp_path / "images"), "--shuffles", "100",
                 "--positive", "bright", "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not any(mark in line for line in lines for mark in "{}[]")
    shown = dict(line.split(maxsplit=1) for line in lines if not line.startswith(" ") and " " in line)
    assert re.fullmatch(r"[\d.]+ model mm", shown["sheet_model_mm"])
    assert re.fullmatch(r"1 cortex mm per model mm on it \(sheet [\d.]+ cortex mm\); rule: none recorded: .*",
                        shown["cortex_scale"])
    assert shown["n_images"] == "8 bright, 9 other; balanced set 8 bright, 8 other"
    classes = lines[lines.index("class_maps") + 1:lines.index("class_maps") + 3]
    assert [line.split()[0] for line in classes] == ["bright", "dark"]
    assert all(re.search(r"Moran's I \S+ \(null mean \S+\), p \S+, \S+ of the units with d′ > 1, "
                         r"(no cluster|\d+ cluster\(s\) of [\d., ]+ cortex mm)$", line) for line in classes)
    assert lines[lines.index("figures") + 1].split() == ["bright", str(tmp_path / "out" / "tiny_bright_dprime.png")]


def test_models_check_refuses_too_few_images_and_bad_options_in_one_line(saved, tmp_path, capsys):
    from PIL import Image

    from stimsim.cli import main

    for label, count in (("a", 6), ("b", 6), ("c", 3)):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(np.full((20, 20), 40 * i, np.uint8)).save(tmp_path / "images" / label / f"{i}.png")
    base = ["models", "check", str(saved), "--positive", "a", "--no-progress"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "training_run.json").write_text("{}")  # a finished training run's folder
    for extra, message in ((["--stimuli", str(tmp_path / "images")], "needs >= 5 images .* too few in {'c': 3}"),
                           (["--stimuli", str(tmp_path / "nowhere")], "--stimuli .*nowhere: no such folder or table"),
                           (["--shuffles", "0"], "--shuffles must be an integer from 100 to 100,000, got 0"),
                           # the smallest p, 1 / (1 + shuffles), would not be below the 0.01 of a clustered map
                           (["--shuffles", "99"], r"--shuffles must be an integer from 100 to 100,000, got 99: p "
                                                  r"resolves to 1 / \(1 \+ shuffles\), and a map counts as clustered "
                                                  "at p < 0.01, which fewer than 100 shuffles cannot reach"),
                           (["--shuffles", "99999999999"], "--shuffles must be an integer from 100 to 100,000"),
                           (["--stimuli", str(tmp_path / "images"), "--out", str(tmp_path / "run")],
                            r"--out .*run holds a training run \(`stimsim train`\); give the figures a folder of their "
                            "own")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert re.search(f"^stimsim: error: .*{message}", err), err


def test_resting_activity_is_saved_verified_and_carried_into_cortex_mm(tmp_path):
    """A layer's resting activity (stimsim.models.resting) is a file of the model: saved, listed with its sha256,
    read back onto the sheet (float32), kept by the sheet in cortex mm; damaged or of the wrong size, refused."""
    import dataclasses

    model = tiny_model()
    resting = np.linspace(0.0, 2.0, 64)
    model.sheets["it"] = dataclasses.replace(model.sheets["it"], resting_activity=resting, resting_reference="planted")
    model.metadata["cortex_scale"] = SCALE
    directory = model.save(tmp_path / "model")
    spec = json.loads((directory / "model.json").read_text())
    assert spec["layers"]["it"]["resting_activity_file"] == "resting/it.npz"
    assert "resting/it.npz" in spec["files_sha256"]
    loaded, _ = TopographicModel.load(directory).in_cortex_mm("IT")
    sheet = loaded.sheet("IT")
    assert sheet.cortex_mm_per_model_mm == 2.0 and sheet.resting_reference == "planted"
    np.testing.assert_allclose(sheet.resting_activity, resting, rtol=1e-7)
    short = CorticalSheet("it", (10, 1, 1), np.zeros((10, 2)), resting_activity=resting[:10])
    short.save_resting(directory / "resting" / "it.npz")
    with pytest.raises(DataError, match="checksum mismatch for resting/it.npz"):
        TopographicModel.load(directory)
    _edit_spec(directory, lambda spec: spec["files_sha256"].update(
        {"resting/it.npz": sha256_of(directory / "resting" / "it.npz")}))
    with pytest.raises(FileFormatError, match="'activity' must hold 64 finite values"):
        TopographicModel.load(directory)
    _edit_spec(directory, lambda spec: spec["files_sha256"].pop("resting/it.npz"))
    with pytest.raises(FileFormatError, match=r"does not cover \['resting/it.npz'\]"):
        TopographicModel.load(directory)


def test_resting_activity_is_measured_on_the_reference_set_and_listed_in_model_json(tmp_path, shared_data, capsys):
    """``stimsim models resting DIR`` adds the file to a saved model and leaves its other files as they were; each
    unit's value is its mean response over the 160 reference images, here computed one image at a time."""
    from stimsim.cli import main
    from stimsim.models.registry import SHIPPED_DIR
    from stimsim.models.resting import reference_images

    shared_data("natural/floc")
    directory = tiny_model().save(tmp_path / "model")
    before = {name: sha256_of(directory / name) for name in ("weights.pt", "positions/it.npz")}
    assert main(["models", "resting", str(directory), "--layer", "IT"]) == 0
    out, err = capsys.readouterr()
    assert f"wrote {directory / 'resting' / 'it.npz'}" in out
    assert "stimsim: models resting: the response of the 64 units of it to 160 images on cpu" in err  # what takes time
    loaded = TopographicModel.load(directory)
    assert {name: sha256_of(directory / name) for name in before} == before
    images, reference = reference_images()
    assert len(images) == 160 and "fLoc" in reference
    assert loaded.sheet("IT").resting_reference == reference
    one_by_one = np.mean([loaded.activations([image], "it")[0].double().numpy() for image in images], axis=0)
    np.testing.assert_allclose(loaded.sheet("IT").resting_activity, one_by_one, rtol=1e-5, atol=1e-7)
    (directory / "resting" / "it.npz").write_bytes(b"truncated")  # damaged: measured again, not a dead end
    assert main(["models", "resting", str(directory), "--layer", "IT", "--no-progress"]) == 0
    assert "resting-activity file(s) ['resting/it.npz'] missing or not matching" in capsys.readouterr().err
    np.testing.assert_allclose(TopographicModel.load(directory).sheet("IT").resting_activity, one_by_one, rtol=1e-5,
                               atol=1e-7)
    shipped = str(SHIPPED_DIR / "stimsim-mnv2-s0")  # the package's files stay as its manifest lists them
    assert main(["models", "resting", shipped]) == 2 and "is a shipped model" in capsys.readouterr().err
    assert main(["models", "resting", str(tmp_path)]) == 2 and "not a model directory" in capsys.readouterr().err
    assert main(["models", "resting", "stimsim-topo-s0"]) == 2 and "is a shipped model" in capsys.readouterr().err
    assert main(["models", "resting", str(tmp_path / "none")]) == 2
    assert "is not a model directory (no such folder)" in capsys.readouterr().err
