"""Module paths from before the package re-layout (engine, cortex, lab, utilities), kept importable.

``import stimsim.arrays`` (or ``from stimsim.recordings import load_recordings``, ...) gives the module at its
new place, the same module object, with a ``DeprecationWarning`` naming that place, so that scripts written for
the earlier layout keep working while they are updated.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_UTILITIES = ("config", "errors", "figures", "filemodels", "hashing", "io", "jsonable", "limits", "locking",
              "ordering", "plugins", "progress")
#: Old module path → its place now.
MOVED = {
    "stimsim.activation_cache": "stimsim.engine.activation_cache",
    "stimsim.bench": "stimsim.engine.bench",
    "stimsim.devices": "stimsim.engine.devices",
    "stimsim.distributed": "stimsim.engine.distributed",
    "stimsim.sheet": "stimsim.cortex.sheet",
    "stimsim.topography": "stimsim.cortex.topography",
    "stimsim.models.positions": "stimsim.cortex.positions",
    "stimsim.arrays": "stimsim.lab.arrays",
    "stimsim.arrays.anatomy": "stimsim.lab.arrays.anatomy",
    "stimsim.arrays.layout": "stimsim.lab.arrays.layout",
    "stimsim.arrays.pose": "stimsim.lab.arrays.pose",
    "stimsim.recordings": "stimsim.lab.recordings",
    "stimsim.analysis.sessions": "stimsim.lab.sessions",
    **{f"stimsim.{name}": f"stimsim.utilities.{name}" for name in _UTILITIES},
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of :data:`MOVED` and loads it as the module at its new place."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} is now {MOVED[spec.name]}; import it from there", DeprecationWarning,
                      stacklevel=3)
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        """The module is the one at the new place, already run."""


def install() -> None:
    """Make the old paths importable (once per process)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
