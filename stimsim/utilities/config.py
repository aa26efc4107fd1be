"""Reading TOML files: a syntax error or a file that is not UTF-8 names the file and the problem. What a file
may hold is declared by its file model (:mod:`stimsim.utilities.filemodels`). :func:`to_toml` writes a configuration
back as TOML."""
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from stimsim.utilities.errors import ConfigError, FileFormatError


def load_toml(path) -> dict:
    """Parse a TOML file; a syntax error names the file and the problem."""
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(f"{path} is a directory; give a configuration file (TOML), e.g. one of those in "
                                "experiments/")
    if not path.is_file():
        raise FileNotFoundError(f"configuration file not found: {path}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark (some Windows editors) is dropped
    except UnicodeDecodeError as exc:
        raise FileFormatError(path, f"not UTF-8 text (byte {exc.start}: {exc.reason}); save the file as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise FileFormatError(path, f"invalid TOML ({exc})") from None


def to_toml(config: dict) -> str:
    """TOML text of a configuration made of tables of scalars/lists/inline tables and arrays of tables."""
    lines = []
    for table, values in config.items():
        if isinstance(values, list):
            for entry in values:
                lines.append(f"[[{_toml_key(table)}]]")
                lines.extend(f"{_toml_key(key)} = {_toml_value(value)}" for key, value in entry.items())
                lines.append("")
        else:
            lines.append(f"[{_toml_key(table)}]")
            lines.extend(f"{_toml_key(key)} = {_toml_value(value)}" for key, value in values.items())
            lines.append("")
    return "\n".join(lines)


def _toml_key(key: str) -> str:
    """A bare key as it is; any other (a space, a dot, ...) quoted."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"cannot write {type(value).__name__} to TOML")
