"""Tests of the plug-in registries: paradigms and published datasets by name, third-party
registration through entry points, and a new paradigm written as one class that runs end to end."""
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest
import torch

from stimsim.cortex.positions import retinotopic_positions
from stimsim.cortex.sheet import CorticalSheet
from stimsim.datasets import get_dataset
from stimsim.models.architectures import build_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.topographic import TopographicModel
from stimsim.paradigms import PARADIGMS, Paradigm, get_paradigm, parse_experiment, register_paradigm
from stimsim.paradigms.categorization import Categorization
from stimsim.paradigms.categorization import analyse as categorization_analyse
from stimsim.paradigms.runner import load_results, run_experiment
from stimsim.utilities import plugins
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.io import software_versions

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


def test_a_plug_in_module_that_registers_what_its_entry_point_declares_loads(tmp_path, monkeypatch):
    import sys
    import types

    registry = plugins.Registry("architecture family", entry_point_group="stimsim.test_self_registering")
    holder = types.ModuleType("selfreg_registry_holder")
    holder.REGISTRY = registry
    monkeypatch.setitem(sys.modules, "selfreg_registry_holder", holder)
    (tmp_path / "selfreg_nets.py").write_text(
        "from selfreg_registry_holder import REGISTRY\n\n\n@REGISTRY.register('lab_self')\ndef build():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    point = EntryPoint(name="lab_self", value="selfreg_nets:build", group="stimsim.test_self_registering")
    monkeypatch.setattr(plugins, "entry_points", lambda group: [point] if group == point.group else [])
    assert registry.get("lab_self")() == 1  # the decorator and the entry point name one object
    with pytest.raises(ConfigError, match="registered already"):
        registry.register("lab_self", lambda: 2)


def test_a_new_paradigm_is_one_class(tmp_path):
    """A task whose truth is the opposite label (a toy): options, labels, preparation and analysis come
    from the categorisation module, the runner needs no change."""

    @register_paradigm("toy_flip")
    class ToyFlip(Paradigm):
        def parse(self, stimuli, tables, where):
            from stimsim.paradigms.categorization import CategorizationOptions

            return CategorizationOptions(label="category", positive="face", negative="nonface")

        def labels(self, task):
            return {"category"}

        def prepare(self, task, model, stimuli, selection, progress=False):
            from stimsim.paradigms.categorization import categorization_trials

            return categorization_trials(task.options, task.decoder, model, stimuli, task.seed, task.source)

        def analyse(self, task, trials, probabilities, selection):
            return categorization_analyse(task, trials, probabilities, selection)

    try:
        spec = parse_experiment(tomllib.loads(TOY), where="toy.toml")
        assert get_paradigm(spec.paradigm).name == "toy_flip"
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


def _install_fake_package(root: Path, group: str, entry_points: dict[str, str]) -> None:
    """A package ``labplug_t`` on ``root`` (to be put on sys.path) with installed metadata declaring
    ``entry_points`` (name → ``module:attr``) in ``group``: a good perturbation class, a module that
    raises on import and a class that is no perturbation."""
    package = root / "labplug_t"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "cool.py").write_text(
        "from dataclasses import dataclass\n"
        "from typing import ClassVar\n"
        "from stimsim.stimulation import Ablation, Perturbation\n"
        "@dataclass(frozen=True)\n"
        "class Cooling(Ablation):\n"
        "    kind: ClassVar[str] = 'cooling'\n"
        "class NotAPerturbation:\n"
        "    pass\n"
        "class Plain(Perturbation):\n"
        "    kind = 'plain'\n")
    (package / "boom.py").write_text("raise RuntimeError('labplug_t needs a licence file')\n")
    dist = root / "labplug_t-0.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: labplug-t\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entry_points.items()))


def test_broken_plug_ins_are_named_with_their_entry_point_and_package(tmp_path, monkeypatch):
    from stimsim.stimulation import ElectricalStimulation
    from stimsim.stimulation.base import _check_perturbation_class

    group = "stimsim.test_broken_perturbations"
    _install_fake_package(tmp_path, group, {
        "cooling": "labplug_t.cool:Cooling", "frost": "labplug_t.boom:Frost",
        "weird": "labplug_t.cool:NotAPerturbation", "chill": "labplug_t.cool:Cooling",
        "electrical": "labplug_t.cool:Cooling", "gone": "labplug_t.cool:Missing", "plain": "labplug_t.cool:Plain"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_LOADED_PACKAGES", {})
    registry = plugins.Registry("perturbation kind", entry_point_group=group, check=_check_perturbation_class)
    registry.register("electrical", ElectricalStimulation)  # a built-in one

    # every declared name is listed, but nothing is imported until it is looked up
    assert registry.names() == ["chill", "cooling", "electrical", "frost", "gone", "plain", "weird"]
    assert "labplug_t.boom" not in __import__("sys").modules
    assert "plugins" not in software_versions()
    assert registry.get("cooling").__name__ == "Cooling"
    assert "labplug_t.boom" not in __import__("sys").modules
    assert software_versions()["plugins"] == {"labplug-t": "0.3"}  # recorded with every result from now on
    declared = r"entry point '{}' \(group stimsim.test_broken_perturbations, package labplug-t 0.3\)"
    with pytest.raises(ConfigError, match=declared.format("frost = labplug_t.boom:Frost") + r" cannot be imported: "
                       r"RuntimeError: labplug_t needs a licence file \(raised at .*boom.py, line 1\)"):
        registry.get("frost")
    with pytest.raises(ConfigError, match=declared.format("gone = labplug_t.cool:Missing") + " cannot be imported: "
                       "AttributeError: .* has no attribute 'Missing'$"):
        registry.get("gone")
    with pytest.raises(ConfigError, match=declared.format("weird = labplug_t.cool:NotAPerturbation") +
                       " is not a usable plug-in: perturbation kind 'weird' must be a Perturbation subclass"):
        registry.get("weird")
    with pytest.raises(ConfigError, match="class Plain must be a frozen dataclass with the fields sites_mm and layer"):
        registry.get("plain")
    with pytest.raises(ConfigError, match="perturbation kind 'chill' is registered as class Cooling, whose kind is "
                                          "'cooling'"):
        registry.get("chill")
    with pytest.raises(ConfigError, match=r"perturbation kind 'electrical' is registered more than once: "
                       r"stimsim.stimulation.electrical:ElectricalStimulation; "
                       + declared.format("electrical = labplug_t.cool:Cooling")):
        registry.get("electrical")
    with pytest.raises(ConfigError, match="Frost' .* cannot be imported"):  # the same error on every lookup
        registry.get("frost")


def test_two_packages_that_declare_one_name_are_refused(tmp_path, monkeypatch):
    group = "stimsim.test_clashing_families"
    (tmp_path / "a").mkdir()
    _install_fake_package(tmp_path / "a", group, {"lab_net": "labplug_t.cool:Cooling"})
    other = tmp_path / "b" / "other-1.0.dist-info"
    other.mkdir(parents=True)
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: other\nVersion: 1.0\n")
    (other / "entry_points.txt").write_text(f"[{group}]\nlab_net = other_nets:build\n")
    for root in ("a", "b"):
        monkeypatch.syspath_prepend(str(tmp_path / root))
    registry = plugins.Registry("architecture family", entry_point_group=group)
    with pytest.raises(ConfigError, match=r"architecture family 'lab_net' is registered more than once: "
                                          r"entry point 'lab_net = .*package (labplug-t 0.3|other 1.0)\); "
                                          r"entry point 'lab_net = .*package (labplug-t 0.3|other 1.0)\)"):
        registry.get("lab_net")


def test_the_command_line_names_a_broken_plug_in_and_runs_without_it(tmp_path):
    """In a fresh process with an installed package whose paradigm raises on import: an experiment that
    names it ends with one ``stimsim: error:`` line naming the file and the entry point (exit 2, no --out
    left behind); a file that does not use it is read as before."""
    import os
    import subprocess
    import sys

    _install_fake_package(tmp_path, "stimsim.paradigms", {"lab_task": "labplug_t.boom:LabTask"})
    experiment = tmp_path / "lab.toml"
    experiment.write_text(TOY.replace('paradigm = "toy_flip"', 'paradigm = "lab_task"'))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[1])])}
    run = subprocess.run([sys.executable, "-c", "import sys; from stimsim.cli import main; sys.exit(main())", "run",
                          str(experiment), "--out", str(tmp_path / "out"), "--no-progress"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and run.stderr.startswith(f"stimsim: error: {experiment}: 'paradigm': ")
    assert ("entry point 'lab_task = labplug_t.boom:LabTask' (group stimsim.paradigms, package labplug-t 0.3) cannot "
            "be imported: RuntimeError: labplug_t needs a licence file") in run.stderr
    assert not (tmp_path / "out").exists()
    check = subprocess.run([sys.executable, "-c", "from stimsim.paradigms import load_experiment; import sys; "
                            "print(load_experiment(sys.argv[1]).paradigm)", str(EXPERIMENTS / "afraz2006.toml")],
                           capture_output=True, text=True, env=env, timeout=300)
    assert check.returncode == 0 and check.stdout.strip() == "categorization", check.stderr


def test_a_model_family_must_build_a_network():
    from stimsim.models.architectures import MODEL_FAMILIES, register_family

    with pytest.raises(TypeError, match="'not_callable' must be a builder"):
        register_family("not_callable", "lab_nets:LabNet")
    register_family("builds_nothing", lambda **kwargs: None)
    try:
        with pytest.raises(ConfigError, match="family 'builds_nothing' built NoneType, not a torch nn.Module"):
            build_network("builds_nothing")
    finally:
        MODEL_FAMILIES.unregister("builds_nothing")
