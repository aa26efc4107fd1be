"""JSON Schemas of every file kind stimsim reads, generated from the file models that read them and shipped beside
those modules, so that an editor can check and complete a file as it is written. ``python -m stimsim.schemas``
rewrites them after a file model changes (a test checks that the shipped ones are current)."""
from __future__ import annotations

import json
from pathlib import Path

from stimsim.paradigms import schema as experiment_file_model
from stimsim.paradigms.experiment_file import experiment_schema
from stimsim.percepts import visualize_file
from stimsim.planning import plan_file
from stimsim.subject import subject_file
from stimsim.training import train_file

#: File kind → (the schema, where it ships).
SCHEMAS = {
    "experiment": (experiment_schema, experiment_file_model.SCHEMA_PATH),
    "plan": (plan_file.plan_schema, plan_file.SCHEMA_PATH),
    "subject": (subject_file.subject_schema, subject_file.SCHEMA_PATH),
    "train": (train_file.train_schema, train_file.SCHEMA_PATH),
    "visualize": (visualize_file.visualize_schema, visualize_file.SCHEMA_PATH),
}


def schema_text(kind: str) -> str:
    """The JSON Schema of ``kind`` files as shipped (sorted keys, 2-space indent)."""
    return json.dumps(SCHEMAS[kind][0](), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_schemas() -> list[Path]:
    """Write every file kind's schema where it ships; returns the paths."""
    paths = []
    for kind, (_, path) in SCHEMAS.items():
        path.write_text(schema_text(kind), encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    import sys

    from stimsim.utilities.errors import ConfigError

    try:
        written_paths = write_schemas()
    except ConfigError as exc:  # e.g. an installed plug-in that cannot be imported
        sys.exit(f"stimsim.schemas: error: {exc}")
    for written in written_paths:
        print(written)
