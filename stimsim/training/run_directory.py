"""The run directory of ``stimsim train``: new, empty, or one that a training run wrote (which it resumes).

A training run writes only the names in :data:`TRAINING_RUN_FILES`, and a directory it has worked in holds at least
one of :data:`RUN_MARKERS` (a checkpoint, or the finished run's record). A directory that holds any other file, or
training-run names without a marker (e.g. a model folder copied from elsewhere), is refused unless forced, so that
a mistyped ``--out`` never overwrites a colleague's files.
"""
from __future__ import annotations

from pathlib import Path

from stimsim.training import head_training, loop, trunk_tuning
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.io import check_output_dir, is_temporary_file
from stimsim.utilities.locking import LOCK_FILE

#: The checkpoints a training run resumes from.
CHECKPOINTS = frozenset({loop.CHECKPOINT_NAME, head_training.CHECKPOINT_NAME, trunk_tuning.CHECKPOINT_NAME})
#: Files that show a training run has worked in the directory: its checkpoints and the finished run's record.
RUN_MARKERS = CHECKPOINTS | {"training_run.json"}
#: Every name a training run writes into its directory.
TRAINING_RUN_FILES = RUN_MARKERS | {"loss_history.csv", "loss_curves.png", "model", LOCK_FILE}


def check_run_directory(directory, force: bool = False) -> Path:
    """Check that ``directory`` may receive a training run (see the module docstring); creates nothing."""
    directory = check_output_dir(directory)
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
