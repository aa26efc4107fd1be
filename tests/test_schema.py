"""The JSON Schemas shipped with the package, one per file kind: up to date with the file models that read the
files, they accept every shipped file of their kind and refuse what the models refuse."""
import json
from pathlib import Path

import jsonschema
import pytest

from stimsim.schemas import SCHEMAS, schema_text
from stimsim.utilities.config import load_toml

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
#: The shipped files of each kind.
SHIPPED = {
    "experiment": ("afraz2006", "variants/afraz2006_resting", "moeller2017", "variants/moeller2017_resting",
                   "muscimol_categorization", "sequence2afc"),
    "plan": ("plan_default", "plan_face", "plan_face_imagenet", "plan_face_imagenet_additive", "plan_imagenet",
             "plan_same_family"),
    "subject": ("subject_default", "subject_effl0", "subject_mnv2_s1"),
    "train": ("train_stimsim_topo_seed0", "train_stimsim_topo_seed1", "train_stimsim_topo_seed2",
              "train_stimsim_topo_alpha0_control", "build_stimsim_mnv2_s0", "build_stimsim_mnv2_s1",
              "build_stimsim_effl0_s0", "build_mnv2_rank256_grid", "build_mnv2_rank256_pca",
              "build_mnv2_pca256_trained256"),
    "visualize": ("visualize_default",),
}


def _validator(kind: str):
    return jsonschema.Draft202012Validator(json.loads(SCHEMAS[kind][1].read_text(encoding="utf-8")))


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_shipped_schema_is_generated_from_the_file_models(kind):
    assert SCHEMAS[kind][1].read_text(encoding="utf-8") == schema_text(kind), "regenerate: python -m stimsim.schemas"


def test_every_shipped_file_has_a_kind():
    named = {f"{name}.toml" for names in SHIPPED.values() for name in names}
    assert named == {path.relative_to(EXPERIMENTS).as_posix() for path in EXPERIMENTS.rglob("*.toml")}


@pytest.mark.parametrize("kind", sorted(SHIPPED))
def test_schema_accepts_the_shipped_files_and_refuses_an_unknown_key(kind):
    validator = _validator(kind)
    for name in SHIPPED[kind]:
        raw = load_toml(EXPERIMENTS / f"{name}.toml")
        assert not list(validator.iter_errors(raw)), name
        raw["colour"] = "red"
        assert list(validator.iter_errors(raw)), name


def test_experiment_schema_has_one_alternative_per_paradigm_and_refuses_what_the_models_refuse():
    shipped = json.loads(SCHEMAS["experiment"][1].read_text(encoding="utf-8"))
    assert {alternative["$ref"].rsplit("/", 1)[-1] for alternative in shipped["oneOf"]} >= {
        "categorization_experiment", "same_different_experiment", "sequence_2afc_experiment"}
    validator = _validator("experiment")
    raw = load_toml(EXPERIMENTS / "afraz2006.toml")
    raw["sites"]["n_selectiv"] = 3
    assert list(validator.iter_errors(raw))
    raw = load_toml(EXPERIMENTS / "moeller2017.toml")
    raw["decoder"]["fit_fraction"] = 1.5
    assert list(validator.iter_errors(raw))
    del raw["pairs"]
    raw["decoder"]["fit_fraction"] = 0.5
    assert list(validator.iter_errors(raw))


def test_plan_subject_and_train_schemas_refuse_bad_values():
    plan = load_toml(EXPERIMENTS / "plan_default.toml")
    plan["selection"] = {"n_sites": 0}
    assert list(_validator("plan").iter_errors(plan))
    subject = load_toml(EXPERIMENTS / "subject_default.toml")
    subject["recording"]["noise"] = "gaussian"
    assert list(_validator("subject").iter_errors(subject))
    train = load_toml(EXPERIMENTS / "train_stimsim_topo_seed0.toml")
    train["training"]["steps"] = 0
    assert list(_validator("train").iter_errors(train))


@pytest.mark.parametrize("kind, name", [("experiment", "afraz2006"), ("experiment", "muscimol_categorization"),
                                        ("plan", "plan_default")])
def test_stimulation_schema_states_the_kinds_own_parameters(kind, name):
    """[stimulation] in the schemas is the perturbation kind's declared parameters: a current outside the
    electrical kind's (0, 5000] µA, a dose above the muscimol kind's 10 µL, a misspelt key and a waveform the kind
    does not allow are refused, as the kinds refuse them when a file is read."""
    from stimsim.stimulation import ElectricalStimulation, MuscimolInactivation
    from stimsim.utilities.errors import ConfigError

    validator = _validator(kind)
    raw = load_toml(EXPERIMENTS / f"{name}.toml")
    electrical = raw["stimulation"].get("kind", "electrical") == "electrical"
    bad_values = ({"current_uA": 6000.0}, {"waveform": "monophasic_cathodic"}, {"curent_uA": 50.0}) if electrical \
        else ({"volume_uL": 11.0}, {"volume_ul": 1.0})
    for bad in bad_values:
        changed = {**raw, "stimulation": {**raw["stimulation"], **bad}}
        assert list(validator.iter_errors(changed)), bad
        kind_class = ElectricalStimulation if electrical else MuscimolInactivation
        params = {key: value for key, value in changed["stimulation"].items()
                  if key not in ("kind", "additive_scale")}
        with pytest.raises((ConfigError, TypeError)):
            kind_class(((0.0, 0.0),), **params)
