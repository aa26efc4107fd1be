"""Registries of plug-ins: things that grow (paradigms, published datasets, model families) are
found by a stable name.

A registry is filled three ways: by the modules of stimsim's own plug-in packages (every module of
``packages`` is imported the first time a name is looked up, and registers itself with
:meth:`Registry.register`), by code that calls :meth:`Registry.register` directly, and by other
installed packages through a Python entry point group (``[options.entry_points]`` in their
``setup.cfg``, e.g. ``stimsim.paradigms = my_task = my_lab.tasks:MyTask``): the entry point's name is
the registered name and its object the plug-in.

A registry made with ``instance_of`` holds one instance of each registered class: registering a
subclass of ``instance_of`` (directly, as a decorator, or through an entry point) stores ``cls()``
with its ``name`` set to the registered name; the decorator returns the class itself.

>>> from stimsim.plugins import Registry
>>> shapes = Registry("shape", entry_point_group=None)
>>> @shapes.register("square")
... class Square:
...     sides = 4
>>> shapes.get("square").sides, shapes.names()
(4, ['square'])
>>> shapes.get("circle")
Traceback (most recent call last):
...
stimsim.errors.ConfigError: unknown shape 'circle'; registered: ['square']
"""
from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points

from stimsim.errors import ConfigError


class Registry:
    """Plug-ins of one kind by stable name.

    Parameters
    ----------
    kind : what a plug-in is, for messages (``"paradigm"``).
    entry_point_group : the entry point group other packages register through (None: none).
    packages : stimsim packages whose modules are imported before the first lookup so that they can
        register themselves.
    instance_of : a base class: plug-ins are registered as its subclasses and stored as one instance
        each (see the module docstring); None: any object is stored as given.
    """

    def __init__(self, kind: str, entry_point_group: str | None, packages: tuple[str, ...] = (),
                 instance_of: type | None = None):
        self.kind = kind
        self.instance_of = instance_of
        self.entry_point_group = entry_point_group
        self.packages = tuple(packages)
        self._items: dict[str, object] = {}
        self._discovered = False

    def register(self, name: str, item=None):
        """Register ``item`` under ``name``; without ``item``, a class decorator that registers the
        class. A name can be registered once (a second, different item is refused)."""
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"a {self.kind} name must be non-empty text, got {name!r}")

        def add(obj):
            known = self._items.get(name)
            if known is None:
                self._items[name] = self._instance(name, obj) if self.instance_of else obj
            elif obj is not (type(known) if self.instance_of else known):
                raise ConfigError(f"{self.kind} {name!r} is registered already ({known!r})")
            return obj

        return add if item is None else add(item)

    def _instance(self, name: str, cls):
        if not (isinstance(cls, type) and issubclass(cls, self.instance_of)):
            raise TypeError(f"{self.kind} {name!r} must be a {self.instance_of.__name__} subclass, got {cls!r}")
        instance = cls()
        instance.name = name
        return instance

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a registered name only)."""
        self._discover()
        if name not in self._items:
            raise ConfigError(f"unknown {self.kind} {name!r}; registered: {self.names()}")
        del self._items[name]

    def get(self, name: str):
        """The plug-in registered as ``name``; an unknown name is a ``ConfigError`` listing the known ones."""
        self._discover()
        if name not in self._items:
            raise ConfigError(f"unknown {self.kind} {name!r}; registered: {self.names()}")
        return self._items[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        self._discover()
        return sorted(self._items)

    def __contains__(self, name) -> bool:
        self._discover()
        return name in self._items

    def __getitem__(self, name: str):
        return self.get(name)

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def items(self) -> list[tuple[str, object]]:
        """(name, plug-in) pairs, sorted by name."""
        return [(name, self._items[name]) for name in self.names()]

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for package_name in self.packages:
            package = importlib.import_module(package_name)
            for module in pkgutil.iter_modules(package.__path__):
                if not module.name.startswith("_"):
                    importlib.import_module(f"{package_name}.{module.name}")
        if self.entry_point_group is None:
            return
        for entry_point in entry_points(group=self.entry_point_group):
            if entry_point.name not in self._items:
                self.register(entry_point.name, entry_point.load())
