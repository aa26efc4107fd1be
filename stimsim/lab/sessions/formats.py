"""Session formats as plug-ins: one reader module per file format of behavioural trials, found by the suffix.

A reader returns the file's trial table with its own column names (text or numbers, unvalidated) and the
file-level subject and session ids where the format holds them; :func:`stimsim.lab.sessions.load_sessions`
maps, recodes and validates every format the same way. Built in: CSV (:mod:`~stimsim.lab.sessions.csv_table`),
NWB ``trials`` tables (:mod:`~stimsim.lab.sessions.nwb`) and HDF5 (:mod:`~stimsim.lab.sessions.hdf5`). A new
format is one module with a :class:`SessionFormat` subclass registered by ``@register_session_format("name")``,
or a class in another package registered through the entry point group ``stimsim.session_formats``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

import pandas as pd

from stimsim.utilities.plugins import Registry, plugin_for_suffix


class SessionFormat(ABC):
    """A session file format (see the module docstring)."""

    #: Stable name (set by :func:`register_session_format`).
    name: str = ""
    #: File suffixes (lower case, with the dot) of this format.
    suffixes: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def read(self, path: Path) -> tuple[pd.DataFrame, str | None, str | None]:
        """The trials (one row each, the file's column names), the subject id and the session id (None where the
        file has none). A damaged or foreign file is a ``FileFormatError``."""


#: Session formats by name.
SESSION_FORMATS = Registry("session format", entry_point_group="stimsim.session_formats",
                           packages=("stimsim.lab.sessions",), instance_of=SessionFormat)


def register_session_format(name: str):
    """Class decorator: register a :class:`SessionFormat` subclass (an instance of it) as ``name``."""
    return SESSION_FORMATS.register(name)


def session_format_of(path: Path) -> SessionFormat:
    """The registered format that reads ``path`` (by its suffix); another suffix is a ``FileFormatError`` listing
    the known ones."""
    return plugin_for_suffix(SESSION_FORMATS, path)
