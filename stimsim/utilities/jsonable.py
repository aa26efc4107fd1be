"""Values for JSON: numpy numbers and arrays, paths, and non-finite numbers.

:func:`json_value` is the ``default=`` hook of :func:`json.dumps` for the values the standard encoder
does not know; :func:`json_ready` converts a whole record for files that must be strict JSON (JSON
has no NaN: non-finite numbers become null).

>>> import numpy as np
>>> json_ready({"n": np.int64(3), "x": np.array([0.5, np.nan]), 1: (np.float32(2.0), float("inf"))})
{'n': 3, 'x': [0.5, None], '1': [2.0, None]}
"""
from __future__ import annotations

import math
from pathlib import PurePath

import numpy as np


def json_value(obj):
    """The JSON value of a numpy scalar (a Python number), a numpy array (nested lists) or a path
    (its text); ``TypeError`` for anything else."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, PurePath):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def json_ready(value):
    """``value`` with dict keys as text, tuples as lists, numpy values and paths as :func:`json_value`
    gives them, and NaN and infinities as None, recursively."""
    if isinstance(value, dict):
        return {str(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    if isinstance(value, (np.generic, np.ndarray, PurePath)):
        return json_ready(json_value(value))
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
