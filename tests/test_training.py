"""Training: the task and spatial losses fall, runs resume exactly, configs are strict."""
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from stimsim.cli import main
from stimsim.models.topographic import TopographicModel
from stimsim.training.loop import load_training_config, load_training_data, train
from stimsim.utilities.errors import ConfigError


def small_config(**training):
    """A fast configuration: a small stimsim_topo net on the LFW crops (face vs non-face)."""
    return {
        "name": "tiny",
        "model": {
            "family": "stimsim_topo",
            "kwargs": {"n_classes": 2, "it_units": 256},
            "preprocessing": {"size_px": 32, "channels": 1, "mean": [0.45], "std": [0.25]},
            "layers": {
                "pit": {"sheet_size_mm": 4.0, "neighborhood_width_mm": 2.0, "area": "pIT"},
                "it": {"sheet_size_mm": 4.0, "neighborhood_width_mm": 1.5, "area": "IT"},
            },
        },
        "data": {"label": "category", "sets": [{"source": "lfw_subset", "holdout_fraction": 0.2}]},
        "training": {"seed": 3, "steps": 60, "batch_size": 32, "learning_rate": 0.05, "warmup_steps": 5,
                     "checkpoint_every_steps": 20, **training},
        "spatial_loss": {"alpha": 1.0, "layers": ["pit", "it"], "neighborhoods_per_step": 4},
    }


@pytest.fixture(scope="module")
def tiny_data():
    return load_training_data(load_training_config(small_config()))


def _history(run_dir):
    import csv

    with open(run_dir / "loss_history.csv") as handle:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def test_task_and_spatial_losses_fall(tmp_path, tiny_data):
    config = load_training_config(small_config(steps=120))
    model_dir = train(config, tmp_path, progress=False, data=tiny_data)
    history = _history(tmp_path)
    first, last = history[:20], history[-20:]
    for key in ("task_loss", "spatial_loss_pit", "spatial_loss_it"):
        assert np.mean([h[key] for h in last]) < np.mean([h[key] for h in first]) - 0.02, key
    assert (tmp_path / "loss_curves.png").stat().st_size > 1000
    model = TopographicModel.load(model_dir)
    assert model.metadata["holdout_stimulus_ids"] and model.metadata["classes"] == ["face", "nonface"]
    held = set(model.metadata["holdout_stimulus_ids"])
    assert len(held) == 40 and len(tiny_data.images) == 160


def test_resumed_run_equals_uninterrupted_run(tmp_path, tiny_data):
    config = load_training_config(small_config(steps=40))
    straight = TopographicModel.load(train(config, tmp_path / "straight", progress=False, data=tiny_data))
    assert train(config, tmp_path / "killed", progress=False, data=tiny_data, stop_after_step=20) == tmp_path / "killed"
    assert not (tmp_path / "killed" / "model").exists()
    resumed = TopographicModel.load(train(config, tmp_path / "killed", progress=False, data=tiny_data))
    for (name, a), (_, b) in zip(straight.network.state_dict().items(), resumed.network.state_dict().items()):
        assert torch.equal(a, b), name
    assert _history(tmp_path / "straight") == _history(tmp_path / "killed")


def test_checkpoint_of_another_config_is_refused(tmp_path, tiny_data):
    train(load_training_config(small_config(steps=20)), tmp_path, progress=False, data=tiny_data, stop_after_step=20)
    other = load_training_config(small_config(steps=20, learning_rate=0.01))
    with pytest.raises(ConfigError, match=r"different configuration \(changed: training.learning_rate \(0.05 → "
                                          r"0.01\)\); a run resumes only with the configuration it started with"):
        train(other, tmp_path, progress=False, data=tiny_data)


def test_a_checkpoint_of_other_training_images_is_refused(tmp_path, tiny_data):
    """An image added to a training folder after a checkpoint moves the held-out split: the run must not resume
    on images it partly held out before."""
    from dataclasses import replace

    config = load_training_config(small_config(steps=20))
    train(config, tmp_path, progress=False, data=tiny_data, stop_after_step=10)
    moved = replace(tiny_data, holdout_ids=tiny_data.holdout_ids[1:] + ["an_image_trained_on_before"])
    with pytest.raises(ConfigError, match=r"checkpoint.pt was trained on other images than the configuration's "
                                          r"sources give now"):
        train(config, tmp_path, progress=False, data=moved)
    train(config, tmp_path, progress=False, data=tiny_data)  # the same images resume


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["training"].update(stepz=3), "unknown key"),
    (lambda c: c["model"]["layers"]["it"].pop("sheet_size_mm"), "sheet_size_mm"),
    (lambda c: c["training"].update(batch_size=1), "batch_size"),
    (lambda c: c["training"].update(batch_size=100_000), "batch_size"),
    (lambda c: c["spatial_loss"].update(layers=["v9"]), "v9"),
    (lambda c: c["training"].update(task="dreaming"), "task"),
    (lambda c: c.update(activity_penalty={"l1": -1.0, "layers": ["it"]}), "l1"),
    (lambda c: c.update(activity_penalty={"l1": 1.0, "layers": ["v9"]}), "v9"),
    (lambda c: c.update(cortex_scale={"layer": "it", "cortex_mm_per_model_mm": 2.0}), "rule"),
    (lambda c: c.update(cortex_scale={"layer": "v9", "cortex_mm_per_model_mm": 2.0, "rule": "r"}), "v9"),
    (lambda c: c.update(cortex_scale={"layer": "it", "cortex_mm_per_model_mm": 0.0, "rule": "r"}), "cortex_mm"),
    (lambda c: c["training"].update(warmup_steps=61), r"warmup_steps \(61\) must be at most steps \(60\)"),
    (lambda c: c["training"].update(learning_rate=0.0), r"'learning_rate' must be > 0"),  # it would train nothing
    (lambda c: c["training"].update(steps=10**20), r"'steps' must be <= 1000000"),
])
def test_bad_configs_are_refused(mutate, message):
    config = small_config()
    mutate(config)
    with pytest.raises(ConfigError, match=message):
        load_training_config(config)


def test_a_readout_layer_the_network_lacks_is_refused_naming_the_file_key(tmp_path, tiny_data):
    config = small_config()
    config["model"]["readout_layer"] = "mt"
    with pytest.raises(ConfigError, match=r"training config \[model\] readout_layer 'mt' is neither a stage of "
                                          r"stimsim_topo nor an area of \[model.layers\]; stages: \["):
        train(load_training_config(config), tmp_path, progress=False, data=tiny_data)


class _ContainerIT(torch.nn.Module):
    """A lab's network whose IT is a container module (Linear + ReLU), as ``print(model)`` shows it: ``it``."""

    def __init__(self, outputs: int = 2, fail: bool = False):
        super().__init__()
        if fail:
            raise ValueError("outputs must be a power of two")
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, stride=2), torch.nn.ReLU())
        self.it = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU())
        self.head = torch.nn.Linear(64, outputs)

    def forward(self, x):
        return self.head(self.it(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(self.stem(x), 1), 1)))


@pytest.fixture
def container_family():
    from stimsim.models.architectures import MODEL_FAMILIES, register_family

    register_family("test_container_it", _ContainerIT)
    yield "test_container_it"
    MODEL_FAMILIES.unregister("test_container_it")


def _container_config(**kwargs):
    config = small_config(steps=1, warmup_steps=0, checkpoint_every_steps=1)
    config["model"].update(family="test_container_it", kwargs=kwargs,
                           layers={"it": {"sheet_size_mm": 4.0, "neighborhood_width_mm": 1.5, "area": "IT"}})
    config["spatial_loss"]["layers"] = ["it"]
    return config


def test_a_lab_network_trains_with_a_container_module_as_its_layer(tmp_path, tiny_data, container_family):
    # the layer name a model file accepts ('it', a Sequential) is a stage of the training run as well
    model = TopographicModel.load(train(load_training_config(_container_config()), tmp_path, progress=False,
                                        data=tiny_data))
    assert model.layers == ["it"] and model.sheet("IT").n_units == 64


@pytest.mark.parametrize("kwargs, message", [
    ({"outputs": 3}, r"family 'test_container_it' outputs 3 scores per image .* but the data have 2 classes"),
    ({"fail": True}, r"\[model\]: architecture family 'test_container_it' failed to build with kwargs \{'fail': True\} "
                     r"\(ValueError: outputs must be a power of two\)"),
])
def test_a_lab_network_that_cannot_train_on_the_data_is_refused_naming_the_file(tmp_path, tiny_data, container_family,
                                                                               kwargs, message):
    with pytest.raises(ConfigError, match=r"training config \[model\]: " + message.removeprefix(r"\[model\]: ")):
        train(load_training_config(_container_config(**kwargs)), tmp_path, progress=False, data=tiny_data)
    assert not (tmp_path / "checkpoint.pt").exists()


def test_train_refuses_an_out_directory_that_holds_other_files(tmp_path, capsys):
    from stimsim.training.run_directory import check_run_directory

    ours = tmp_path / "notes.txt"
    ours.write_text("a colleague's notes")
    assert main(["train", str(SHIPPED_CONFIG), "--out", str(tmp_path), "--no-progress"]) == 2
    assert "holds files no training run of stimsim wrote (notes.txt)" in capsys.readouterr().err
    assert ours.read_text() == "a colleague's notes"
    # names a run writes, but no checkpoint and no record of a run: a model folder copied there, not a run
    copied = tmp_path / "copied"
    (copied / "model").mkdir(parents=True)
    (copied / "loss_history.csv").write_text("step\n")
    with pytest.raises(ConfigError, match=r"holds files no training run of stimsim wrote \(loss_history.csv, model\)"):
        check_run_directory(copied)
    (copied / "checkpoint.pt").write_bytes(b"")  # a run's own directory, to resume
    assert check_run_directory(copied) == copied
    assert check_run_directory(tmp_path, force=True) == tmp_path


def test_train_command_reports_bad_toml(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x'\n[training\n")
    assert main(["train", str(bad), "--out", str(tmp_path / "run")]) == 2
    assert "bad.toml" in capsys.readouterr().err


def test_simclr_task_trains_without_labels_in_the_loss(tmp_path, tiny_data):
    config = load_training_config(small_config(steps=30, task="simclr", simclr_temperature=0.1))
    train(config, tmp_path, progress=False, data=tiny_data)
    history = _history(tmp_path)
    assert all(np.isfinite(h["task_loss"]) for h in history)
    assert np.mean([h["task_loss"] for h in history[-10:]]) < np.mean([h["task_loss"] for h in history[:5]])


def test_a_diverging_run_stops_at_the_first_non_finite_loss_and_keeps_its_last_good_checkpoint(
        tmp_path, tiny_data, monkeypatch):
    from stimsim.training import loop as training
    from stimsim.utilities.errors import TrainingDiverged

    config = load_training_config(small_config(steps=20, checkpoint_every_steps=5))
    real = training.layer_spatial_loss
    calls = []

    def nan_from_step_8(*args):  # two spatial layers: calls 14 and 15 belong to step 8
        calls.append(1)
        loss = real(*args)
        return loss * float("nan") if len(calls) > 14 else loss

    monkeypatch.setattr(training, "layer_spatial_loss", nan_from_step_8)
    with pytest.raises(TrainingDiverged, match=r"diverged at step 8: the loss is not finite.*last good checkpoint"):
        train(config, tmp_path, progress=False, data=tiny_data)
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == 5
    assert all(torch.isfinite(v).all() for v in checkpoint["network"].values() if v.is_floating_point())
    assert not (tmp_path / "model").exists()
    assert len(_history(tmp_path)) == 7  # the finite steps, for the loss curves


def test_a_huge_learning_rate_is_stopped_not_saved(tmp_path, tiny_data):
    from stimsim.utilities.errors import TrainingDiverged

    config = load_training_config(small_config(steps=10, learning_rate=1e8, warmup_steps=0))
    with pytest.raises(TrainingDiverged, match=r"diverged at step \d+: .*not finite.*Lower learning_rate \(now 1e\+08\)"):
        train(config, tmp_path, progress=False, data=tiny_data)
    assert not (tmp_path / "model").exists()


def test_a_damaged_checkpoint_is_a_clear_error(tmp_path, tiny_data):
    from stimsim.utilities.errors import FileFormatError

    config = load_training_config(small_config(steps=10, checkpoint_every_steps=5))
    train(config, tmp_path, progress=False, data=tiny_data, stop_after_step=5)
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:3000])
    with pytest.raises(FileFormatError, match=r"checkpoint.pt: not a readable torch checkpoint: .*; delete it to train "
                                              r"this stage again from its start, or give another --out directory$"):
        train(config, tmp_path, progress=False, data=tiny_data)
    torch.save({"step": 5}, checkpoint)
    with pytest.raises(FileFormatError, match=r"not a stimsim training checkpoint \(needs \['fingerprint', "):
        train(config, tmp_path, progress=False, data=tiny_data)


def test_activity_penalty_makes_it_sparser_and_the_scale_is_recorded(tmp_path, tiny_data):
    """Without batch normalisation in IT, an L1 penalty on its activity lowers the mean IT response
    against the same run without it; the configured cortex scale lands in the model's metadata."""
    def run(name, **extra):
        config = small_config(steps=60)
        config["model"]["kwargs"] = {**config["model"]["kwargs"], "it_batchnorm": False}
        config.update(extra)
        return train(load_training_config(config), tmp_path / name, progress=False, data=tiny_data)

    plain = TopographicModel.load(run("plain"))
    rule = "a planted rule: 4 model mm stand for 8 mm of cortex"
    sparse = TopographicModel.load(run("sparse", activity_penalty={"l1": 5.0, "layers": ["it"]},
                                       cortex_scale={"layer": "it", "cortex_mm_per_model_mm": 2.0, "rule": rule}))
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in sparse.network.it)
    images = tiny_data.images[:64]
    with torch.no_grad():
        mean_plain = plain.run_stages(images, stop="it").mean().item()
        mean_sparse = sparse.run_stages(images, stop="it").mean().item()
    assert mean_sparse < 0.5 * mean_plain
    assert "mean_activity_it" in _history(tmp_path / "sparse")[-1]
    assert plain.cortex_scale("IT")["cortex_mm_per_model_mm"] == 1.0
    assert sparse.cortex_scale("IT") == {"layer": "it", "cortex_mm_per_model_mm": 2.0, "rule": rule,
                                         "sheet_size_cortex_mm": pytest.approx(2 * sparse.sheet("it").size_mm, abs=1e-3)}


def _accelerator(name: str):
    available = torch.cuda.is_available() if name == "cuda" else (
        hasattr(torch.backends, "mps") and torch.backends.mps.is_available())
    return pytest.param(name, marks=pytest.mark.skipif(not available, reason=f"no {name} device on this machine"))


@pytest.mark.parametrize("device", [_accelerator("cuda"), _accelerator("mps")])
@pytest.mark.parametrize("task", ["supervised", "simclr"])
def test_training_on_a_gpu(device, task, tmp_path, tiny_data):
    from stimsim.training.loop import simclr_loss

    # The SimCLR loss there equals the CPU's on the same embeddings.
    z1, z2 = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)).chunk(2)
    np.testing.assert_allclose(simclr_loss(z1.to(device), z2.to(device), 0.1).item(), simclr_loss(z1, z2, 0.1).item(),
                               rtol=1e-5)
    config = load_training_config(small_config(steps=30, task=task))
    model = TopographicModel.load(train(config, tmp_path, progress=False, data=tiny_data, device=device))
    history = _history(tmp_path)
    assert all(np.isfinite(h["task_loss"]) for h in history)
    assert np.mean([h["task_loss"] for h in history[-10:]]) < np.mean([h["task_loss"] for h in history[:5]])
    assert model.device.type == "cpu"  # saved weights load anywhere


SHIPPED_CONFIG = Path(__file__).resolve().parent.parent / "experiments" / "train_stimsim_topo_seed0.toml"


@pytest.mark.parametrize("old, new, message", [
    ("learning_rate = 0.05", "learning_rate = nan", r"\[training\]: 'learning_rate' must be a finite number, got nan"),
    ("learning_rate = 0.05", "learning_rate = 1e300",  # beyond float32: SGD could not apply it to the weights
     r"\[training\]: 'learning_rate' must be <= 3.40\d*e\+38, got 1e\+300"),
    ("alpha = 4.0\nlayers", "alpha = inf\nlayers", r"\[spatial_loss\]: 'alpha' must be a finite number, got inf"),
    ("neighborhoods_per_step = 8", "neighborhoods_per_step = 100000",
     r"\[spatial_loss\]: 'neighborhoods_per_step' must be <= \d+, the number of neighbourhoods on the sheet of layer"),
    ("it_units = 4096,", "it_unitz = 4096,", r"\[model\]: kwargs do not fit family 'stimsim_topo' .*it_unitz"),
    ("it_units = 4096,", "it_units = 4096.5,", r"\[model\]: stimsim_topo needs integers .* it_units = 4096.5"),
    ("std = [0.25]", 'std = ["a"]', r"\[model.preprocessing\]: 'std' must be a number"),
    ("mean = [0.45]", "mean = [0.45, 0.2]", r"\[model.preprocessing\]: preprocessing.mean must be 1 finite"),
    ("holdout_fraction = 0.3", "holdout_fraction = 1.0", r"\[data.sets\[0\]\]: 'holdout_fraction' must be < 1"),
    ("holdout_fraction = 0.3", 'holdout_fraction = "a"', r"\[data.sets\[0\]\]: 'holdout_fraction' must be a number"),
    ("n_per_class = 600", "n_per_class = -1", r"\[data\] sets\[1\]: n_per_class must be a positive integer"),
    ('{ source = "lfw_subset", holdout_fraction = 0.3 }', '{ source = "folder", path = "/no/such/folder" }',
     r"\[data\] sets\[0\] path: stimulus folder not found"),
    ('name = "stimsim-topo-s0"', 'name = "../elsewhere"', r"'name' must be a plain name without '/'"),
    ('name = "stimsim-topo-s0"', 'name = ""', r"'name' must not be empty"),
    ('layers = ["v1", "v2", "v4", "pit", "it"]', 'layers = ["v1", "v2", "v4", "it", "it"]',
     r"\[spatial_loss\] layers lists \['it'\] more than once"),
    ('l1 = 2.0\nlayers = ["it"]', 'l1 = 2.0\nlayers = ["it", "it"]',
     r"\[activity_penalty\] layers lists \['it'\] more than once"),
    ('area = "V2"', 'area = "V1"', r"\[model.layers\] area label\(s\) \['V1'\] given to more than one layer "
                                   r"\(\['v1', 'v2'\]\)"),
])
def test_bad_values_in_a_training_file_are_one_line_errors_naming_file_and_field(tmp_path, capsys, old, new, message):
    text = SHIPPED_CONFIG.read_text()
    assert text.count(old) == 1, old
    bad = tmp_path / "train.toml"
    bad.write_text(text.replace(old, new))
    assert main(["train", str(bad), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert re.match(rf"stimsim: error: {re.escape(str(bad))}.*{message}", err), err
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_a_relative_image_folder_is_read_from_the_training_files_own_folder(tmp_path, monkeypatch):
    from PIL import Image

    for label, level in (("bright", 200), ("dark", 40)):
        (tmp_path / "lab" / "images" / label).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((20, 24), level + i, np.uint8)).save(tmp_path / "lab" / "images" / label / f"{i}.png")
    text = SHIPPED_CONFIG.read_text()
    start, end = text.index("sets = ["), text.index("]\n\n[training]")
    config_path = tmp_path / "lab" / "train.toml"
    config_path.write_text(text[:start] + 'sets = [{ source = "folder", path = "images", holdout_fraction = 0.25 }' + text[end:])
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    config = load_training_config(config_path)
    data = load_training_data(config)
    assert data.classes == ["bright", "dark"] and len(data.images) == 6 and len(data.holdout_ids) == 2
    assert config.raw["data"]["sets"][0]["path"] == "images"  # recorded as written


def test_the_learning_rate_warms_up_linearly_then_follows_a_half_cosine_to_zero():
    """0.1 over 10 warm-up steps then 100 of cosine decay: step 0 → 0.1/10, step 9 → 0.1, step 10 (progress 0)
    → 0.1, step 60 (progress ½: ½(1 + cos π/2)) → 0.05, step 110 (progress 1) → 0."""
    from types import SimpleNamespace

    from stimsim.training.schedule import warmup_cosine_rate

    training = SimpleNamespace(learning_rate=0.1, warmup_steps=10, steps=110)
    expected = {0: 0.01, 9: 0.1, 10: 0.1, 60: 0.05, 110: 0.0}
    assert {step: warmup_cosine_rate(training, step) for step in expected} == pytest.approx(expected, abs=1e-15)
    no_warmup = SimpleNamespace(learning_rate=0.1, warmup_steps=0, steps=4)  # ½(1 + cos(π/4)) at step 1
    assert warmup_cosine_rate(no_warmup, 1) == pytest.approx(0.05 * (1 + 2 ** -0.5))


def test_a_run_directory_keeps_the_configuration_its_run_started_with(tmp_path):
    """A checkpoint of one configuration is never resumed, nor a finished model replaced, by a run of another one
    (a finished run whose checkpoint was deleted included); --force starts again, without the old checkpoints, model
    and records."""
    import json

    from stimsim.training.run_directory import CONFIG_RECORD, check_run_configuration

    raw = {"name": "run", "training": {"learning_rate": 0.05, "steps": 10}}
    changed = {"name": "run", "training": {"learning_rate": 0.01, "steps": 10}}
    check_run_configuration(tmp_path, raw)
    assert json.loads((tmp_path / CONFIG_RECORD).read_text()) == raw
    check_run_configuration(tmp_path, json.loads(json.dumps(raw)))  # the same configuration resumes
    (tmp_path / "checkpoint.pt").write_bytes(b"a checkpoint")
    with pytest.raises(ConfigError, match=r"holds a training run of another configuration \(changed: "
                                          r"training.learning_rate \(0.05 → 0.01\)\)"):
        check_run_configuration(tmp_path, changed)
    assert (tmp_path / "checkpoint.pt").exists()
    check_run_configuration(tmp_path, changed, force=True)
    assert not (tmp_path / "checkpoint.pt").exists() and json.loads((tmp_path / CONFIG_RECORD).read_text()) == changed
    finished = tmp_path / "finished"  # recorded before the record existed: only training_run.json, no checkpoint
    finished.mkdir()
    (finished / "training_run.json").write_text(json.dumps({"config": raw, "steps": 10}))
    (finished / "loss_history.csv").write_text("step,loss\n")
    (finished / "model").mkdir()
    (finished / "model" / "model.json").write_text("{}")
    with pytest.raises(ConfigError, match="another configuration"):
        check_run_configuration(finished, changed)
    check_run_configuration(finished, changed, force=True)  # no model of the other configuration stays beside it
    assert sorted(entry.name for entry in finished.iterdir()) == [CONFIG_RECORD]


def test_a_second_training_run_into_a_directory_in_use_is_refused(tmp_path, capsys):
    import json
    import os
    import socket

    held = tmp_path / "run"
    held.mkdir()
    (held / ".stimsim.lock").write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(),
                                                    "command": "train", "started_utc": "2026-12-06T04:00:00+00:00"}))
    (held / "training_config.json").write_text("{}")  # the running run's record stays as it is
    assert main(["train", str(SHIPPED_CONFIG), "--out", str(held), "--no-progress"]) == 2
    assert f"output directory {held} is in use by another run: stimsim train" in capsys.readouterr().err
    assert (held / "training_config.json").read_text() == "{}"


def test_running_a_finished_training_again_keeps_its_model(tmp_path, capsys):
    """A finished run's model is what plans and runs recorded by checksum: the same command again leaves it as it
    is, and says so, once its files match their checksums."""
    config = tmp_path / "short.toml"
    text = SHIPPED_CONFIG.read_text().replace("n_per_class = 600", "n_per_class = 10")
    config.write_text(re.sub(r"\nsteps = \d+", "\nsteps = 4", re.sub(r"warmup_steps = \d+", "warmup_steps = 1", text)))
    out = tmp_path / "run"
    assert main(["train", str(config), "--out", str(out), "--no-progress"]) == 0
    saved = (out / "model" / "model.json").read_bytes()
    capsys.readouterr()
    assert main(["train", str(config), "--out", str(out), "--no-progress"]) == 0
    assert f"{out} holds the finished run of this configuration" in capsys.readouterr().out
    assert (out / "model" / "model.json").read_bytes() == saved
    # a damaged model is not said to be kept: the error says how to export it again, and doing so gives it back
    weights = (out / "model" / "weights.pt").read_bytes()
    (out / "model" / "weights.pt").write_bytes(weights[:100])
    assert main(["train", str(config), "--out", str(out), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert f"stimsim: error: the finished run's model is damaged (model {out / 'model'}: checksum mismatch for " \
           f"weights.pt" in error and "delete it and run the same command again to export it again from the run's " \
           "checkpoint" in error
    shutil.rmtree(out / "model")
    assert main(["train", str(config), "--out", str(out), "--no-progress"]) == 0
    assert (out / "model" / "weights.pt").read_bytes() == weights


def test_force_trains_a_finished_run_again_from_its_first_step(tmp_path, capsys, monkeypatch):
    """--force on a finished run of the same configuration trains it again (it said so), not export its last
    checkpoint again: every step of the file is run."""
    from stimsim.training.loop import TrainingData

    config = tmp_path / "short.toml"
    text = SHIPPED_CONFIG.read_text().replace("n_per_class = 600", "n_per_class = 10")
    config.write_text(re.sub(r"\nsteps = \d+", "\nsteps = 4", re.sub(r"warmup_steps = \d+", "warmup_steps = 1", text)))
    out = tmp_path / "run"
    assert main(["train", str(config), "--out", str(out), "--no-progress"]) == 0
    assert main(["train", str(config), "--out", str(out), "--no-progress"]) == 0
    assert "(--force trains it again)" in capsys.readouterr().out
    batches = []
    sample = TrainingData.sample
    monkeypatch.setattr(TrainingData, "sample", lambda data, *args: batches.append(1) or sample(data, *args))
    assert main(["train", str(config), "--out", str(out), "--no-progress", "--force"]) == 0
    assert len(batches) == 4  # one batch per step: steps = 4 in the file
    assert (out / "model" / "model.json").is_file() and len(_history(out)) == 4


def test_a_holdout_that_leaves_a_class_no_training_image_is_refused_naming_the_set():
    config = small_config()
    config["data"]["sets"][0]["holdout_fraction"] = 0.999  # rounds to every image of each class
    with pytest.raises(ConfigError, match=r"training config \[data\] sets\[0\] \(lfw_subset\): holdout_fraction = "
                                          r"0.999 holds out all 100 image\(s\) of class '\w+', leaving none to train "
                                          r"on"):
        load_training_data(load_training_config(config))


def test_image_sets_that_share_images_are_refused_naming_both_sets():
    config = small_config()  # the LFW crops twice: set 0 would train on images set 1 holds out
    config["data"]["sets"] = [{"source": "lfw_subset", "holdout_fraction": 0.2},
                              {"source": "lfw_subset", "holdout_fraction": 0.5}]
    with pytest.raises(ConfigError, match=r"training config \[data\] sets\[0\] and sets\[1\] share 200 image\(s\) "
                                          r"\(stimulus ids e.g. \['lfw_"):
        load_training_data(load_training_config(config))


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_run_stopped_before_its_first_checkpoint_leaves_nothing_that_refuses_another_configuration(
        tmp_path, monkeypatch, capsys, stop):
    """Ctrl-C, kill or a failure before the first checkpoint: nothing was trained, so the directory the command
    made is removed, and a directory given keeps no record that would refuse an edited configuration."""
    import stimsim.training.loop

    def stopped(*args, **kwargs):
        raise stop("stopped")

    monkeypatch.setattr(stimsim.training.loop, "train", stopped)
    made, given = tmp_path / "made", tmp_path / "given"
    given.mkdir()
    for out in (made, given):
        if stop is KeyboardInterrupt:
            assert main(["train", str(SHIPPED_CONFIG), "--out", str(out), "--no-progress"]) == 130
        else:
            with pytest.raises(RuntimeError, match="stopped"):
                main(["train", str(SHIPPED_CONFIG), "--out", str(out), "--no-progress"])
    assert not made.exists() and list(given.iterdir()) == []


def test_a_run_killed_before_its_first_checkpoint_takes_an_edited_configuration(tmp_path):
    """kill -9 (or the system out of memory) leaves the record of a run that trained nothing: another configuration
    starts there, and is recorded, without --force."""
    import json

    from stimsim.training.run_directory import CONFIG_RECORD, check_run_configuration

    check_run_configuration(tmp_path, {"name": "run", "model": {"kwargs": {"it_units": 10**7}}})
    edited = {"name": "run", "model": {"kwargs": {"it_units": 4096}}}
    check_run_configuration(tmp_path, edited)
    assert json.loads((tmp_path / CONFIG_RECORD).read_text()) == edited


def test_a_network_whose_training_needs_more_memory_than_available_is_refused_before_any_step(
        tmp_path, monkeypatch, tiny_data):
    import stimsim.utilities.limits

    monkeypatch.setattr(stimsim.utilities.limits, "available_memory_bytes", lambda: 1000)
    with pytest.raises(ConfigError, match=r"training config: training 'tiny' \([\d.]+ MiB of weights\) needs about "
                                          r"[\d.]+ (KiB|MiB) of memory, more than the 1000 B this machine has "
                                          r"available; lower the layer sizes in \[model\] kwargs \(n_classes = 2, "
                                          r"it_units = 256\)"):
        train(load_training_config(small_config()), tmp_path, progress=False, data=tiny_data)
    assert not (tmp_path / "checkpoint.pt").exists()


def test_a_layer_too_large_to_build_is_refused_with_the_memory_it_needs(tmp_path, tiny_data):
    """10**12 IT units: building the network would itself allocate its weights (it ended in torch's allocator
    message). Per IT unit 256 input weights, BatchNorm's 2 and the head's 2: 260 · 10**12 float32 = 945.9 TiB, the rest
    a few MiB; with four copies for the training step, 5 × that = 4.62 PiB."""
    config = small_config()
    config["model"]["kwargs"]["it_units"] = 10**12
    with pytest.raises(ConfigError, match=r"training config: training 'tiny' \(945.9 TiB of weights\) needs about "
                                          r"4.62 PiB of memory, more than the .* this machine has available; lower "
                                          r"the layer sizes in \[model\] kwargs \(n_classes = 2, "
                                          r"it_units = 1000000000000\)"):
        train(load_training_config(config), tmp_path, progress=False, data=tiny_data)


def test_activations_kept_for_the_backward_pass_are_counted_on_the_meta_device():
    """5 images of 8 × 8 px through conv(1 → 4 channels, same size), ReLU, flatten and a 256 → 2 linear layer: 1,280
    values out of each of the first three modules and 10 out of the last, float32: 3,850 · 4 = 15,400 bytes."""
    from stimsim.models.preprocessing import Preprocessing
    from stimsim.training.memory import activation_bytes

    with torch.device("meta"):
        network = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                      torch.nn.Linear(4 * 8 * 8, 2))
    assert activation_bytes(network, 5, Preprocessing(size_px=8, channels=1, mean=(0.5,), std=(0.5,))) == 15_400


def test_batches_whose_activations_exceed_the_memory_are_refused_before_any_step(tmp_path, monkeypatch, tiny_data):
    """The weights of the small network fit in 1 GiB; 32 images at 512 px through its convolutions do not."""
    import stimsim.utilities.limits

    monkeypatch.setattr(stimsim.utilities.limits, "available_memory_bytes", lambda: 2**30)
    config = small_config()
    config["model"]["preprocessing"]["size_px"] = 512
    with pytest.raises(ConfigError, match=r"training 'tiny' on batches of 32 images at 512 px \([\d.]+ GiB of "
                                          r"activations kept for the backward pass\) needs about [\d.]+ GiB of memory, "
                                          r"more than the 1.0 GiB .* lower \[training\] batch_size or "
                                          r"\[model.preprocessing\] size_px"):
        train(load_training_config(config), tmp_path, progress=False, data=tiny_data)
    assert not (tmp_path / "checkpoint.pt").exists()


def test_training_images_that_exceed_the_memory_at_their_size_are_refused_before_they_are_made(monkeypatch):
    """160 LFW crops kept of 200 at 2048 px, one float32 channel: 2.5 GiB, twice that with the joined copy."""
    import stimsim.utilities.limits

    monkeypatch.setattr(stimsim.utilities.limits, "available_memory_bytes", lambda: 2**30)
    config = small_config()
    config["model"]["preprocessing"]["size_px"] = 2048
    with pytest.raises(ConfigError, match=r"\[data\] sets\[0\] \(lfw_subset\): 160 training images at 2048 px "
                                          r"needs about 5.0 GiB of memory, more than the 1.0 GiB .* lower "
                                          r"\[model.preprocessing\] size_px or the number of training images"):
        load_training_data(load_training_config(config))


def test_images_of_one_class_are_refused_for_the_supervised_task_naming_the_label(tmp_path, tiny_data):
    from stimsim.training.loop import TrainingData

    faces = tiny_data.labels == 0
    one_class = TrainingData(tiny_data.images[faces], tiny_data.labels[faces] * 0, tiny_data.classes[:1], [])
    with pytest.raises(ConfigError, match=r"training config \[data\]: every training image has the same 'category', "
                                          r"'\w+'; the supervised task needs images of at least 2 classes"):
        train(load_training_config(small_config()), tmp_path, progress=False, data=one_class)


@pytest.mark.parametrize("key, value", [("it_batchnorm", "false"), ("it_units", "big"), ("it_units", 2.5),
                                        ("n_classes", True)])
def test_network_kwargs_of_the_wrong_type_are_refused_not_taken_for_another_setting(tmp_path, tiny_data, key, value):
    """A quoted "false" would otherwise turn IT's BatchNorm on (any text is true)."""
    config = small_config()
    config["model"]["kwargs"][key] = value
    with pytest.raises(ConfigError, match=r"training config \[model\]: stimsim_topo needs integers n_classes >= 2, "
                                          r"it_units >= 1 and in_channels 1 or 3, and it_batchnorm true or false; "
                                          rf"got .*{key} = {re.escape(repr(value))}"):
        train(load_training_config(config), tmp_path, progress=False, data=tiny_data)
