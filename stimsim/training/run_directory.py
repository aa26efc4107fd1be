"""The run directory of ``stimsim train``: new, empty, or one that a training run wrote (which it resumes).

A training run writes only the names in :data:`TRAINING_RUN_FILES`, and a directory it has worked in holds at least
one of :data:`RUN_MARKERS` (a checkpoint, or the finished run's record). A directory that holds any other file, or
training-run names without a marker (e.g. a model folder copied from elsewhere), is refused unless forced, so that
a mistyped ``--out`` never overwrites a colleague's files. The configuration a run started with is recorded
(:data:`CONFIG_RECORD`) before its first step: a run with another configuration is refused in that directory, so
that no checkpoint of one configuration is resumed, and no finished model replaced, by another.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from stimsim.training import head_training, loop, trunk_tuning
from stimsim.utilities.errors import ConfigError, FileFormatError
from stimsim.utilities.hashing import canonical_json, changed_keys
from stimsim.utilities.io import atomic_write_json, check_not_another_commands, check_output_dir, is_temporary_file
from stimsim.utilities.locking import LOCK_FILE

#: The checkpoints a training run resumes from.
CHECKPOINTS = frozenset({loop.CHECKPOINT_NAME, head_training.CHECKPOINT_NAME, trunk_tuning.CHECKPOINT_NAME})
#: The configuration a run started with, as its file gave it.
CONFIG_RECORD = "training_config.json"
#: Files that show a training run has worked in the directory: its checkpoints, its configuration and the finished
#: run's record.
RUN_MARKERS = CHECKPOINTS | {CONFIG_RECORD, "training_run.json"}
#: The files a finished run writes beside its ``model`` folder.
FINISHED_RUN_FILES = frozenset({"training_run.json", "loss_history.csv", "loss_curves.png"})
#: Every name a training run writes into its directory.
TRAINING_RUN_FILES = RUN_MARKERS | FINISHED_RUN_FILES | {"model", LOCK_FILE}


def check_run_directory(directory, force: bool = False) -> Path:
    """Check that ``directory`` may receive a training run (see the module docstring); creates nothing."""
    directory = check_output_dir(directory)
    check_not_another_commands(directory, tuple(RUN_MARKERS))
    if force or not directory.is_dir():
        return directory
    names = {entry.name for entry in directory.iterdir() if not is_temporary_file(entry.name)}
    foreign = sorted(names - TRAINING_RUN_FILES)
    if not foreign and names and not names & RUN_MARKERS:
        foreign = sorted(names)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ConfigError(f"output directory {directory} holds files no training run of stimsim wrote ({shown}); "
                          "give a new or empty directory, the directory of the run to resume, or force "
                          "overwriting (--force)")
    return directory


def has_checkpoint(directory: Path) -> bool:
    """Whether a training run left a checkpoint in ``directory`` to resume from."""
    return any((directory / name).exists() for name in CHECKPOINTS)


def check_run_configuration(directory: Path, raw: dict, force: bool = False) -> None:
    """Refuse to train the configuration ``raw`` (as its file gave it) into ``directory`` when the run there started
    with another one (its :data:`CONFIG_RECORD`, or a finished run's training_run.json) and left a checkpoint or a
    model, naming what changed (a run stopped before its first checkpoint trained nothing: its record is replaced);
    ``force`` starts again there instead, removing the other run's checkpoints and what it finished (its model,
    record and loss history), so that no model of the other configuration stays beside this one; a finished run of
    this configuration is removed the same way by ``force``, so that it trains again from its first step rather than
    export its last checkpoint again. Then record ``raw``."""
    recorded = _recorded_configuration(directory)
    finished = (directory / "training_run.json").exists() or (directory / "model").exists()
    other = recorded is not None and (has_checkpoint(directory) or finished) \
        and canonical_json(recorded) != canonical_json(raw)
    if other and not force:
        changed = changed_keys(recorded, json.loads(canonical_json(raw)))
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise ConfigError(f"{directory} holds a training run of another configuration (changed: {shown}); a run "
                          "resumes only with the configuration it started with: use another --out directory, or "
                          "--force to start this configuration again there")
    if force and (other or finished):
        for name in CHECKPOINTS | FINISHED_RUN_FILES:
            (directory / name).unlink(missing_ok=True)
        if (directory / "model").is_dir():
            shutil.rmtree(directory / "model")
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_json(directory / CONFIG_RECORD, raw)


def _recorded_configuration(directory: Path) -> dict | None:
    for name, key in ((CONFIG_RECORD, None), ("training_run.json", "config")):
        path = directory / name
        if not path.is_file():
            continue
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            return record if key is None else record[key]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise FileFormatError(path, f"not a training run's record ({exc!r}); give another --out directory, or "
                                        "--force to start again there") from None
    return None
