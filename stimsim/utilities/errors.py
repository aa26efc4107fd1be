"""Exceptions that tell a user what is wrong with their input, and where."""
from __future__ import annotations

from pathlib import Path


class StimsimError(Exception):
    """Base class of the errors stimsim raises for user input."""


class FileFormatError(StimsimError, ValueError):
    """A file exists but its content is not what stimsim expects."""

    def __init__(self, path, problem: str):
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ConfigError(StimsimError, ValueError):
    """A configuration (TOML file or parameters) has unknown, missing or invalid values."""


class DataError(StimsimError):
    """A dataset or checkpoint is missing, unreachable or fails its checksum."""


class DataUnavailable(DataError):
    """A data file is in none of the places stimsim looks (cache, installed package, mirror, download): unlike a copy
    that fails its checksum, a reason to fall back on other data where a command offers it."""


class SafetyError(StimsimError, ValueError):
    """A stimulation protocol exceeds a safety limit and no override was given."""


class TrainingDiverged(StimsimError):
    """Training produced a non-finite loss or weight; the last good checkpoint is kept."""


def unreadable_reason(exc: BaseException) -> str:
    """Why a reader refused a file, for a message: the exception's kind and first line (of its last argument where
    it has several, as hdmf's errors put a dump of the object first and the reason last), and for numpy's advice to
    load pickled data unsafely what it means (the file holds Python objects, which stimsim never loads)."""
    if "allow_pickle" in str(exc):
        return "it holds Python objects (pickled data), which stimsim never loads from a file"
    text = exc.args[-1] if len(exc.args) > 1 and isinstance(exc.args[-1], str) else str(exc)
    first = text.splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
