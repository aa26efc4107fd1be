"""Recording formats as plug-ins: one reader module per file format, found by the file's suffix.

A reader turns a file into the parts :func:`stimsim.lab.recordings.load_recordings` checks the same way for every
format: the responses (presentation × electrode), the presented stimulus ids, the electrode ids, their positions
(mm, or None) and how error messages name each of them. Built in: NetCDF (:mod:`~stimsim.lab.recordings.netcdf`)
and NWB (:mod:`~stimsim.lab.recordings.nwb`). A new format is one module with a :class:`RecordingFormat` subclass
registered by ``@register_recording_format("name")``, or a class in another package registered through the entry
point group ``stimsim.recording_formats``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, NamedTuple

import numpy as np

from stimsim.lab.arrays.layout import POSITION_UNITS
from stimsim.utilities.errors import FileFormatError
from stimsim.utilities.plugins import Registry, plugin_for_suffix


class RecordingTable(NamedTuple):
    """What a reader found in a file.

    values : (n_presentations, n_electrodes) float64 responses.
    stimulus_id : the image id of every presentation (text).
    electrode_ids : the electrodes' ids (text), in the columns' order.
    positions : (n_electrodes, 2) positions in mm on the array, or None when the file holds none.
    attrs : metadata kept on the response array (str, int or float values).
    where : how errors name the fields: ``response``, ``electrode``, ``stimulus_id``, ``positions``.
    """

    values: np.ndarray
    stimulus_id: list
    electrode_ids: list
    positions: np.ndarray | None
    attrs: dict
    where: dict


class RecordingFormat(ABC):
    """A recordings file format (see the module docstring)."""

    #: Stable name (set by :func:`register_recording_format`).
    name: str = ""
    #: File suffixes (lower case, with the dot) of this format.
    suffixes: ClassVar[tuple[str, ...]] = ()
    #: The format's own defaults for stimsim's field names (``electrode``, ...), before a lab's ``names``.
    default_names: ClassVar[dict[str, str]] = {}
    #: Whether a file may hold several arrays, one of which is read (``electrode_group``).
    electrode_groups: ClassVar[bool] = False

    @abstractmethod
    def read(self, path: Path, names: dict, mapped: set, electrode_group: str | None) -> RecordingTable:
        """The file's contents; ``names`` maps every stimsim field name onto the file's, ``mapped`` holds the fields
        the lab named (a named field must exist). A damaged or foreign file is a ``FileFormatError``."""


#: Recording formats by name.
RECORDING_FORMATS = Registry("recording format", entry_point_group="stimsim.recording_formats",
                             packages=("stimsim.lab.recordings",), instance_of=RecordingFormat)


def register_recording_format(name: str):
    """Class decorator: register a :class:`RecordingFormat` subclass (an instance of it) as ``name``."""
    return RECORDING_FORMATS.register(name)


def format_of(path: Path) -> RecordingFormat:
    """The registered format that reads ``path`` (by its suffix); another suffix is a ``FileFormatError`` listing
    the known ones."""
    return plugin_for_suffix(RECORDING_FORMATS, path)


def position_fields(path: Path, names: dict, available: set, mapped=frozenset()):
    """The file's position fields — ``((x name, y name), factor to mm)`` — from x_mm, y_mm or x_um, y_um (by
    ``names``), or None when the file has neither pair. Both pairs, or half of one the lab named, are refused."""
    found = {unit: tuple(names[f] for f in fields) for unit, (fields, _) in POSITION_UNITS.items()
             if all(names[f] in available for f in fields)}
    for unit, (fields, _) in POSITION_UNITS.items():
        if unit not in found and any(f in mapped for f in fields):
            raise FileFormatError(path, f"names: {' and '.join(f for f in fields if f in mapped)} named, but the file "
                                        f"has no {' / '.join(names[f] for f in fields if names[f] not in available)} "
                                        f"for the other coordinate; name both {fields[0]} and {fields[1]}")
    if len(found) > 1:
        named = [unit for unit in found if any(f in mapped for f in POSITION_UNITS[unit][0])]
        if len(named) != 1:
            raise FileFormatError(path, f"positions in both mm ({', '.join(found['mm'])}) and µm "
                                        f"({', '.join(found['um'])}); name the pair to read with names "
                                        "(x_mm, y_mm or x_um, y_um)")
        found = {named[0]: found[named[0]]}
    if not found:
        return None
    unit, fields = next(iter(found.items()))
    return fields, POSITION_UNITS[unit][1]


def positions_where(kind: str, names: dict, position_names) -> str:
    """How error messages name the position fields: the ones read, else both pairs looked for."""
    if position_names is None:
        return f"{kind} {names['x_mm']!r}, {names['y_mm']!r} or {names['x_um']!r}, {names['y_um']!r}"
    x_name, y_name = position_names[0]
    return f"{kind} {x_name!r}, {y_name!r}"


def as_numbers(values, path: Path, where: str, axes=("row",)) -> np.ndarray:
    """``values`` as float64; a value that is not a number (text such as '0.4mm' or 'NA') is a FileFormatError naming
    ``where``, its position (0-based, along ``axes``) and the value."""
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        cells = np.asarray(values, dtype=object)
    for index in np.ndindex(cells.shape):
        try:
            float(cells[index])
        except (TypeError, ValueError):
            break
    value = cells[index].item() if isinstance(cells[index], np.generic) else cells[index]
    at = ", ".join(f"{axis} {i}" for axis, i in zip(axes, index))
    raise FileFormatError(path, f"{where}, {at} (0-based): {value!r} is not a number; every value must be a number "
                                "(no unit or other text in a value)")


def id_text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)
