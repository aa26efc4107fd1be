"""The JSON Schema of experiment files shipped with the package: up to date with the typed models,
and it accepts the shipped experiments and refuses what the models refuse."""
import json
from pathlib import Path

import pytest

from stimsim.config import load_toml
from stimsim.paradigms.experiment_file import experiment_schema
from stimsim.paradigms.schema import SCHEMA_PATH

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
RUNNABLE = ("afraz2006", "moeller2017", "muscimol_categorization", "sequence2afc")


def test_shipped_schema_is_generated_from_the_models():
    shipped = json.loads(SCHEMA_PATH.read_text())
    assert shipped == json.loads(json.dumps(experiment_schema())), (
        "regenerate: python -c 'from stimsim.paradigms.experiment_file import write_schema; write_schema()'")
    assert {alternative["$ref"].rsplit("/", 1)[-1] for alternative in shipped["oneOf"]} >= {
        "categorization_experiment", "same_different_experiment"}


def test_schema_accepts_the_shipped_experiments_and_refuses_typos():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    for name in RUNNABLE:
        assert not list(validator.iter_errors(load_toml(EXPERIMENTS / f"{name}.toml"))), name
    raw = load_toml(EXPERIMENTS / "afraz2006.toml")
    raw["sites"]["n_selectiv"] = 3
    assert list(validator.iter_errors(raw))
    raw = load_toml(EXPERIMENTS / "moeller2017.toml")
    raw["decoder"]["fit_fraction"] = 1.5
    assert list(validator.iter_errors(raw))
    del raw["pairs"]
    raw["decoder"]["fit_fraction"] = 0.5
    assert list(validator.iter_errors(raw))
