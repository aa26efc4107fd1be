"""Tests of the plug-in registries: paradigms and published datasets by name, third-party
registration through entry points, and a new paradigm written as one class that runs end to end."""
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest
import torch

from stimsim import plugins
from stimsim.config import load_toml
from stimsim.datasets import DATASETS, get_dataset
from stimsim.errors import ConfigError
from stimsim.paradigms import PARADIGMS, Paradigm, get_paradigm, parse_experiment, register_paradigm
from stimsim.paradigms.categorization import Categorization, analyse as categorization_analyse
from stimsim.models.architectures import build_network
from stimsim.models.positions import retinotopic_positions
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.topographic import TopographicModel
from stimsim.paradigms.runner import load_results, run_experiment
from stimsim.sheet import CorticalSheet

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"

TOY = """
name = "toy"
paradigm = "toy_flip"
seed = 1
[stimuli]
sets = [{ source = "lfw_subset", heldout_only = true }]
[sites]
method = "explicit"
sites_mm = [[2.0, 2.0], [6.0, 6.0]]
recording_radius_mm = 1.5
[sites.localizer]
label = "category"
positive = "face"
[stimulation]
kind = "ablation"
radius_mm = 2.0
[analysis]
n_boot = 10
n_perm = 10
"""


def test_built_in_paradigms_and_datasets_are_registered_and_name_their_paradigm():
    assert {"categorization", "same_different"} <= set(PARADIGMS.names())
    assert get_dataset("afraz2006").paradigm == "categorization"
    assert get_dataset("moeller2017").paradigm == "same_different"
    assert "afraz2006" in get_paradigm("categorization").comparisons()
    assert "moeller2017" in get_paradigm("same_different").comparisons()
    with pytest.raises(ConfigError, match=r"unknown paradigm 'dance'; registered: \[.*'categorization'"):
        get_paradigm("dance")


def test_experiment_files_name_registered_paradigms_and_datasets():
    def afraz_raw():
        return load_toml(EXPERIMENTS / "afraz2006.toml")

    raw = afraz_raw()
    raw["paradigm"] = "dance"
    with pytest.raises(ConfigError, match=r"afraz2006.toml: 'paradigm' must be one of \[.*'same_different'"):
        parse_experiment(raw, where="afraz2006.toml")
    raw = afraz_raw()
    raw["comparison"]["dataset"] = "moeller2017"
    with pytest.raises(ConfigError, match="'moeller2017' is a same_different experiment"):
        parse_experiment(raw, where="afraz2006.toml")


def test_entry_points_register_third_party_plug_ins(monkeypatch):
    registry = plugins.Registry("paradigm", entry_point_group="stimsim.test_paradigms", instance_of=Paradigm)
    point = EntryPoint(name="lab_task", value="stimsim.paradigms.categorization:Categorization",
                       group="stimsim.test_paradigms")
    monkeypatch.setattr(plugins, "entry_points", lambda group: [point] if group == point.group else [])
    assert registry.names() == ["lab_task"] and isinstance(registry.get("lab_task"), Categorization)
    assert registry.get("lab_task").name == "lab_task"
    with pytest.raises(ConfigError, match="registered already"):
        registry.register("lab_task", Paradigm)
    with pytest.raises(TypeError, match="must be a Paradigm subclass"):
        registry.register("not_a_task", object)


def test_a_new_paradigm_is_one_class(tmp_path):
    """A task whose truth is the opposite label (a toy): options, labels, preparation and analysis come
    from the categorisation module, the runner needs no change."""

    @register_paradigm("toy_flip")
    class ToyFlip(Paradigm):
        def parse(self, stimuli, tables, where):
            from stimsim.paradigms.categorization import CategorizationOptions

            return CategorizationOptions(label="category", positive="face", negative="nonface")

        def labels(self, spec):
            return {"category"}

        def prepare(self, spec, model, stimuli, selection, progress=False):
            from stimsim.paradigms.categorization import prepare

            return prepare(spec, model, stimuli)

        def analyse(self, spec, trials, probabilities, selection):
            return categorization_analyse(spec, trials, probabilities, selection)

    try:
        spec = parse_experiment(tomllib.loads(TOY), where="toy.toml")
        assert spec.task.name == "toy_flip"
        summary = run_experiment(spec, tmp_path, model=_tiny_model(), progress=False, figures=False)
        dataset, stored, config = load_results(tmp_path)
        assert stored["paradigm"] == "toy_flip" and summary["n_sites"] == 2
        assert dataset["kind"].values.tolist() == ["control", "ablation", "ablation"]
        assert np.allclose(dataset["choice_probability"].sum("choice"), 1.0)
    finally:
        PARADIGMS.unregister("toy_flip")
    assert "toy_flip" not in PARADIGMS.names()


def _tiny_model() -> TopographicModel:
    """An untrained stimsim_topo network with a 64-unit IT sheet of 8 mm; the first 10 LFW faces and
    non-faces count as held out."""
    torch.manual_seed(0)
    kwargs = {"n_classes": 2, "it_units": 64}
    sheet = CorticalSheet("it", (64, 1, 1), retinotopic_positions((64, 1, 1), 8.0, seed=0))
    held = [f"lfw_{kind}_{i:03d}" for kind in ("face", "nonface") for i in range(10)]
    return TopographicModel(build_network("stimsim_topo", **kwargs), {"it": sheet},
                            Preprocessing(size_px=32, channels=1, mean=(0.45,), std=(0.25,)),
                            {"family": "stimsim_topo", "kwargs": kwargs}, readout_layer="it", areas={"it": "IT"},
                            name="tiny", metadata={"holdout_stimulus_ids": held})
