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
with its ``name`` set to the registered name; the decorator returns the class itself. A registry made
with ``check`` calls ``check(name, item)`` on every item it registers (it raises ``TypeError`` naming
what is wrong).

Entry points are read when a registry is first used, but a plug-in's module is imported only when its
name is looked up, so a broken plug-in that an experiment does not use does not stop it. A plug-in that
cannot be imported or does not fit the registry, and a name that two sources register (a plug-in and a
built-in, or two installed packages), are ``ConfigError`` naming the entry point, its group and the
package that declares it, when that name is looked up.

>>> from stimsim.utilities.plugins import Registry
>>> shapes = Registry("shape", entry_point_group=None)
>>> @shapes.register("square")
... class Square:
...     sides = 4
>>> shapes.get("square").sides, shapes.names()
(4, ['square'])
>>> shapes.get("circle")
Traceback (most recent call last):
...
stimsim.utilities.errors.ConfigError: unknown shape 'circle'; registered: ['square']
"""
from __future__ import annotations

import importlib
import pkgutil
import traceback
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from stimsim.utilities.errors import ConfigError, FileFormatError

#: Packages whose entry points this process has loaded: distribution name → version.
_LOADED_PACKAGES: dict[str, str] = {}


def plugin_packages() -> dict[str, str]:
    """The installed packages (name → version) whose plug-ins this process has loaded through entry points,
    for the provenance stored with results."""
    return dict(sorted(_LOADED_PACKAGES.items()))


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
    check : ``check(name, item)``, called before ``item`` is registered; raises ``TypeError`` saying
        why ``item`` cannot be a plug-in of this kind (None: no check).
    """

    def __init__(self, kind: str, entry_point_group: str | None, packages: tuple[str, ...] = (),
                 instance_of: type | None = None, check=None):
        self.kind = kind
        self.instance_of = instance_of
        self.entry_point_group = entry_point_group
        self.packages = tuple(packages)
        self.check = check
        self._items: dict[str, object] = {}
        self._entry_points: dict[str, EntryPoint] = {}  # declared by installed packages, not imported yet
        self._clashes: dict[str, list[str]] = {}  # names that several sources register: their descriptions
        self._discovered = False

    def register(self, name: str, item=None):
        """Register ``item`` under ``name``; without ``item``, a class decorator that registers the
        class. A name can be registered once (a second, different item is refused)."""
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{self.kind} names must be non-empty text, got {name!r}")

        def add(obj):
            known = self._items.get(name)
            if name in self._entry_points:
                if not _declares(self._entry_points[name], obj):
                    raise ConfigError(f"{self.kind} {name!r} is registered already "
                                      f"({_entry_point_text(self._entry_points[name])})")
                del self._entry_points[name]  # the entry point's own module registering what it declares
            if known is None:
                if self.check is not None:
                    self.check(name, obj)
                self._items[name] = self._instance(name, obj) if self.instance_of else obj
            elif obj is not self._target(known):
                raise ConfigError(f"{self.kind} {name!r} is registered already ({known!r})")
            return obj

        return add if item is None else add(item)

    def _instance(self, name: str, cls):
        if not (isinstance(cls, type) and issubclass(cls, self.instance_of)):
            raise TypeError(f"{self.kind} {name!r} must be a {self.instance_of.__name__} subclass, got {cls!r}")
        instance = cls()
        instance.name = name
        return instance

    def _target(self, item):
        """What was registered for a stored ``item`` (its class, in a registry of instances)."""
        return type(item) if self.instance_of else item

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a registered name only)."""
        self._discover()
        if name not in self:
            raise ConfigError(f"unknown {self.kind} {name!r}; registered: {self.names()}")
        for table in (self._items, self._entry_points, self._clashes):
            table.pop(name, None)

    def get(self, name: str):
        """The plug-in registered as ``name``; an unknown name is a ``ConfigError`` listing the known ones,
        and so is a plug-in that cannot be loaded or a name registered by several sources."""
        self._discover()
        if name in self._clashes:
            raise ConfigError(
                f"{self.kind} {name!r} is registered more than once: {'; '.join(self._clashes[name])}; uninstall "
                f"one of these packages or rename its entry point")
        if name in self._entry_points:
            self._load(name)
        if name not in self._items:
            raise ConfigError(f"unknown {self.kind} {name!r}; registered: {self.names()}")
        return self._items[name]

    def names(self) -> list[str]:
        """Registered names (built in, registered from code, or declared by installed packages), sorted."""
        self._discover()
        return sorted({*self._items, *self._entry_points, *self._clashes})

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self.names()

    def __getitem__(self, name: str):
        return self.get(name)

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def items(self) -> list[tuple[str, object]]:
        """(name, plug-in) pairs, sorted by name (every installed plug-in is loaded)."""
        return [(name, self.get(name)) for name in self.names()]

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
            name = entry_point.name
            if name in self._clashes:
                self._clashes[name].append(_entry_point_text(entry_point))
            elif name in self._items:
                known = self._target(self._items[name])
                if not _declares(entry_point, known):
                    self._clashes[name] = [f"{known.__module__}:{known.__qualname__}", _entry_point_text(entry_point)]
                    del self._items[name]
            elif name in self._entry_points:
                if self._entry_points[name].value != entry_point.value:
                    self._clashes[name] = [_entry_point_text(self._entry_points.pop(name)),
                                           _entry_point_text(entry_point)]
            else:
                self._entry_points[name] = entry_point

    def _load(self, name: str) -> None:
        """Import the plug-in an installed package declares as ``name`` and register it."""
        entry_point = self._entry_points[name]
        where = _entry_point_text(entry_point)
        try:
            item = entry_point.load()
        except Exception as exc:
            frames = [frame for frame in traceback.extract_tb(exc.__traceback__)[1:]  # the plug-in's, not importlib's
                      if not any(part.startswith("importlib") for part in Path(frame.filename).parts)
                      and not frame.filename.startswith("<frozen")]
            at = f" (raised at {frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
            raise ConfigError(f"{self.kind} {name!r}: {where} cannot be imported: "
                              f"{type(exc).__name__}: {exc}{at}") from exc
        self._entry_points.pop(name, None)  # gone already if the module registered the item itself
        try:
            self.register(name, item)
        except (TypeError, ConfigError) as exc:
            self._entry_points[name] = entry_point
            raise ConfigError(f"{self.kind} {name!r}: {where} is not a usable plug-in: {exc}") from None
        dist = getattr(entry_point, "dist", None)
        if dist is not None:
            _LOADED_PACKAGES[dist.name] = dist.version


def plugin_for_suffix(registry: Registry, path):
    """The plug-in of ``registry`` (file formats: each has ``suffixes``, lower case with the dot) that reads ``path``,
    by its suffix; another suffix is a ``FileFormatError`` naming the formats known and their suffixes."""
    suffix = Path(path).suffix.lower()
    known = registry.items()
    for _, plugin in known:
        if suffix in plugin.suffixes:
            return plugin
    listed = "; ".join(f"{name} ({', '.join(plugin.suffixes)})" for name, plugin in known)
    raise FileFormatError(path, f"unknown {registry.kind} {suffix!r}; known: {listed}")


def _declares(entry_point: EntryPoint, obj) -> bool:
    """Whether ``entry_point`` (``module:attr``) names ``obj``."""
    return entry_point.value.replace(" ", "") == f"{getattr(obj, '__module__', '')}:{getattr(obj, '__qualname__', '')}"


def _entry_point_text(entry_point: EntryPoint) -> str:
    """``entry point 'name = module:attr' (group G, package P V)``, for messages."""
    dist = getattr(entry_point, "dist", None)
    package = f", package {dist.name} {dist.version}" if dist is not None else ""
    return f"entry point '{entry_point.name} = {entry_point.value}' (group {entry_point.group}{package})"
