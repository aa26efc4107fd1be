"""Reading TOML configurations strictly: unknown keys, missing keys and wrong types are errors."""
from __future__ import annotations

import math
import tomllib
from pathlib import Path

from stimsim.errors import ConfigError, FileFormatError

_MISSING = object()


def load_toml(path) -> dict:
    """Parse a TOML file; a syntax error names the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"configuration file not found: {path}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise FileFormatError(path, f"not UTF-8 text (byte {exc.start}: {exc.reason}); save the file as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise FileFormatError(path, f"invalid TOML ({exc})") from None


class Section:
    """A table of a configuration that hands out typed values and refuses unknown keys.

    ``where`` names the table in error messages (e.g. ``"train.toml [training]"``).
    """

    def __init__(self, values: dict | None, where: str):
        if values is not None and not isinstance(values, dict):
            raise ConfigError(f"{where} must be a table, got {type(values).__name__}")
        self.values = dict(values or {})
        self.where = where
        self._used: set[str] = set()

    def get(self, key: str, kind, default=_MISSING, choices=None, minimum=None, maximum=None):
        """The value of ``key`` converted to ``kind``; checked against ``choices`` and bounds."""
        self._used.add(key)
        if key not in self.values:
            if default is _MISSING:
                raise ConfigError(f"{self.where}: missing required key {key!r}")
            return default
        value = self.values[key]
        try:
            if kind is float and isinstance(value, bool) or kind is int and isinstance(value, bool):
                raise TypeError
            if kind is float and isinstance(value, int):
                value = float(value)
            if kind is int and isinstance(value, float) and value.is_integer():
                value = int(value)
            if not isinstance(value, kind):
                raise TypeError
        except TypeError:
            raise ConfigError(f"{self.where}: {key!r} must be {_kind_name(kind)}, got {value!r}") from None
        if kind is float and not math.isfinite(value):
            raise ConfigError(f"{self.where}: {key!r} must be a finite number, got {value!r}")
        if choices is not None and value not in choices:
            raise ConfigError(f"{self.where}: {key!r} must be one of {list(choices)}, got {value!r}")
        if minimum is not None and value < minimum:
            raise ConfigError(f"{self.where}: {key!r} must be >= {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise ConfigError(f"{self.where}: {key!r} must be <= {maximum}, got {value!r}")
        return value

    def text(self, key: str, default=_MISSING) -> str:
        """The non-empty text of ``key`` (blank text is an error)."""
        value = self.get(key, str, default)
        if not value.strip():
            raise ConfigError(f"{self.where}: {key!r} must be non-empty text")
        if any(not character.isprintable() for character in value):
            raise ConfigError(f"{self.where}: {key!r} must be printable text without control characters "
                              f"(NUL, newline, ...), got {value!r}")
        return value

    def numbers(self, key: str, default=_MISSING) -> tuple[float, ...]:
        """The list of finite numbers at ``key``, as a tuple of floats."""
        values = self.get(key, list, default)
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in values):
            raise ConfigError(f"{self.where}: {key!r} must be a list of finite numbers, got {values!r}")
        return tuple(float(v) for v in values)

    def section(self, key: str, required: bool = False) -> "Section":
        self._used.add(key)
        if required and key not in self.values:
            raise ConfigError(f"{self.where}: missing required table [{key}]")
        return Section(self.values.get(key), table_location(self.where, key))

    def finish(self):
        """Raise if the table holds keys nobody asked for (typos are errors, not ignored)."""
        unknown = sorted(set(self.values) - self._used)
        if unknown:
            raise ConfigError(f"{self.where}: unknown key(s) {unknown}; allowed: {sorted(self._used)}")


def table_location(where: str, key: str) -> str:
    """How error messages name the table ``key`` inside ``where``: ``x.toml [stimuli]``, then
    ``x.toml [stimuli.noise]``."""
    if where.endswith("]") and " [" in where:
        return f"{where[:-1]}.{key}]"
    return f"{where} [{key}]"


def _kind_name(kind) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return {float: "a number", int: "an integer", str: "a string", bool: "true or false", list: "a list",
            dict: "a table"}.get(kind, kind.__name__)
