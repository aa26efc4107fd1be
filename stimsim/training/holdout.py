"""The images a training run holds out for evaluation: a seeded fraction of each class of a set."""
from __future__ import annotations

import numpy as np

from stimsim.data.stimuli import SHOWN_REPEATS
from stimsim.utilities.errors import ConfigError


def kept_after_holdout(strata, fraction: float, rng: np.random.Generator, where: str) -> np.ndarray:
    """Boolean mask of the images left to train on once ``round(fraction × n)`` of each stratum's ``n`` images are
    held out, drawn by ``rng`` stratum by stratum in sorted order (``strata``: one class per image; all equal for an
    unstratified set, ``""`` then). A fraction that holds out a whole stratum is refused; ``where`` names the set,
    e.g. ``"FILE [data] sets[0] (floc)"``."""
    strata = np.asarray(strata)
    keep = np.ones(len(strata), bool)
    for value in np.unique(strata):
        members = np.flatnonzero(strata == value)
        held = rng.choice(members, size=int(round(fraction * len(members))), replace=False)
        if len(held) == len(members):
            of_class = f" of class {str(value)!r}" if str(value) else ""
            raise ConfigError(f"{where}: holdout_fraction = {fraction:g} holds out all {len(members)} image(s)"
                              f"{of_class}, leaving none to train on; give a fraction that keeps at least one image of "
                              "every class")
        keep[held] = False
    return keep


def check_sets_disjoint(stimulus_ids: list, where: str) -> None:
    """Refuse image sets that share a stimulus id (``stimulus_ids``: one sequence per set of ``[data] sets``): such an
    image could be held out by one set and trained on by the other, while the model's ``holdout_stimulus_ids`` would
    still list it. ``where`` names the table, e.g. ``"FILE [data]"``."""
    first = {}
    for index, ids in enumerate(stimulus_ids):
        ids = [str(stimulus_id) for stimulus_id in ids]
        shared = [stimulus_id for stimulus_id in ids if stimulus_id in first]
        if shared:
            raise ConfigError(f"{where} sets[{first[shared[0]]}] and sets[{index}] share {len(shared)} image(s) "
                              f"(stimulus ids e.g. {shared[:SHOWN_REPEATS]}); each image must be in one set, so that "
                              "an image held out by one set is not trained on by another: give each image once")
        first.update(dict.fromkeys(ids, index))
