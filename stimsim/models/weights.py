"""Reading network weights safely: checkpoints with ``torch.load(weights_only=True)`` (no arbitrary
unpickling) and state dicts loaded with every key and shape checked."""
from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from stimsim.utilities.errors import ConfigError, FileFormatError, unreadable_reason

#: How many offending keys an error message lists.
_KEYS_SHOWN = 5


def read_checkpoint_file(path):
    """Read a torch checkpoint with ``weights_only=True`` (tensors and plain containers only).

    A file that needs other Python objects is refused with a ``FileFormatError`` instead of being
    unpickled, since unpickling a downloaded file can run arbitrary code.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    size = path.stat().st_size
    if size == 0:
        raise FileFormatError(path, "not a readable torch checkpoint: the file is empty (0 bytes)")
    try:
        with warnings.catch_warnings():  # torch's advice about pickle protocols of a file that is no checkpoint
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if not found:  # not an object the unpickler declined: bytes it cannot read
            raise FileFormatError(path, f"not a readable torch checkpoint: damaged, cut short or not written by "
                                        f"torch.save ({size} bytes)") from None
        raise FileFormatError(
            path,
            f"holds Python objects other than tensors and plain containers (it references {found.group(1)}), and "
            "stimsim never unpickles "
            "arbitrary objects from a file since that can run code; in an environment you trust, load it and "
            "torch.save only the nested dicts of tensors you need",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise FileFormatError(path, f"not a readable torch checkpoint: damaged, cut short or not written by torch.save "
                                    f"({size} bytes; {unreadable_reason(exc)})") from None


def read_run_checkpoint(path, keys: tuple[str, ...]) -> dict:
    """A training run's checkpoint ``path`` (read as :func:`read_checkpoint_file` does) holding ``keys``; a damaged
    or foreign file is a FileFormatError that says how the run can go on."""
    go_on = "delete it to train this stage again from its start, or give another --out directory"
    try:
        state = read_checkpoint_file(path)
    except FileFormatError as exc:
        raise FileFormatError(path, f"{exc.problem}; {go_on}") from None
    if not isinstance(state, dict) or any(key not in state for key in keys):
        raise FileFormatError(path, f"not a stimsim training checkpoint (needs {list(keys)}); {go_on}")
    return state


def load_weights(network: nn.Module, state_dict, source=None) -> None:
    """Load ``state_dict`` (parameter name → tensor) into ``network``, all keys and shapes checked.

    ``source`` is the file the state dict came from (errors are then ``FileFormatError`` naming it),
    or None for a state dict given in memory (errors are ``ConfigError``). Missing BatchNorm
    ``num_batches_tracked`` counters are tolerated (old checkpoints lack them).
    """
    def fail(problem):
        if source is None:
            raise ConfigError(f"state dict: {problem}")
        raise FileFormatError(source, problem)

    if not isinstance(state_dict, Mapping):
        fail(f"expected a state dict (parameter name -> tensor), got {type(state_dict).__name__}")
    not_tensors = [key for key, value in state_dict.items() if not isinstance(value, torch.Tensor)]
    if not_tensors:
        fail(f"expected a state dict (parameter name -> tensor); not tensors: {_some(not_tensors)}")
    expected = network.state_dict()
    missing = [key for key in expected if key not in state_dict and not key.endswith("num_batches_tracked")]
    unexpected = [key for key in state_dict if key not in expected]
    wrong_shape = [f"{key} {tuple(state_dict[key].shape)} (network: {tuple(expected[key].shape)})"
                   for key in expected if key in state_dict and state_dict[key].shape != expected[key].shape]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s): {_some(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s): {_some(unexpected)}")
    if wrong_shape:
        problems.append(f"{len(wrong_shape)} key(s) with the wrong shape: {_some(wrong_shape)}")
    if problems:
        fail(f"does not match {type(network).__name__}: " + "; ".join(problems))
    network.load_state_dict(dict(state_dict), strict=False)


def _some(keys) -> str:
    keys = list(keys)
    shown = ", ".join(str(k) for k in keys[:_KEYS_SHOWN])
    return shown + (f", ... ({len(keys) - _KEYS_SHOWN} more)" if len(keys) > _KEYS_SHOWN else "")
