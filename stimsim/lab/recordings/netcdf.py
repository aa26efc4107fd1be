"""NetCDF recordings (``.nc``; the layout ``Recordings.save_netcdf`` writes): variable ``response``
(presentation × electrode), coordinates ``stimulus_id`` (presentation), ``electrode`` (ids), and optionally
``x_mm``, ``y_mm`` or ``x_um``, ``y_um`` (electrode)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from stimsim.lab.recordings.formats import (RecordingFormat, RecordingTable, as_numbers, id_text, position_fields,
                                            positions_where, register_recording_format)
from stimsim.utilities.errors import FileFormatError


@register_recording_format("NetCDF")
class NetCDFRecordings(RecordingFormat):
    """NetCDF4 files read with xarray (h5netcdf)."""

    suffixes = (".nc", ".nc4", ".netcdf", ".h5netcdf")

    def read(self, path, names, mapped, electrode_group) -> RecordingTable:
        return RecordingTable(*_read_netcdf(path, names, mapped))


def _read_netcdf(path: Path, names: dict, mapped=frozenset()):
    """``mapped``: the fields the lab named; a named position variable must exist (the defaults are optional)."""
    try:
        dataset = xr.open_dataset(path, engine="h5netcdf")
    except Exception as exc:  # xarray/h5py raise many types for a damaged or foreign file
        raise FileFormatError(path, f"not a readable NetCDF4 file ({exc})") from None
    with dataset:
        response_name = names["response"]
        if response_name not in dataset:
            raise FileFormatError(path, f"no variable {response_name!r} (response); variables: "
                                        f"{sorted(dataset.data_vars)}; map yours with names={{'response': ...}}")
        response = dataset[response_name]
        dims = {names["presentation"]: "presentation", names["electrode"]: "electrode"}
        if set(response.dims) != set(dims):
            raise FileFormatError(path, f"variable {response_name!r} has dims {response.dims}; expected "
                                        f"({names['presentation']!r}, {names['electrode']!r})")
        response = response.transpose(names["presentation"], names["electrode"])
        if names["stimulus_id"] not in response.coords and names["stimulus_id"] not in dataset:
            raise FileFormatError(path, f"no coordinate {names['stimulus_id']!r} (stimulus_id) on "
                                        f"{names['presentation']!r}")
        stimulus_id = dataset[names["stimulus_id"]]
        if stimulus_id.dims != (names["presentation"],):
            raise FileFormatError(path, f"{names['stimulus_id']!r} must lie on dim {names['presentation']!r}, "
                                        f"got {stimulus_id.dims}")
        if names["electrode"] not in dataset.coords:
            raise FileFormatError(path, f"no coordinate {names['electrode']!r} holding electrode ids")
        electrode_ids = [id_text(v) for v in dataset[names["electrode"]].values]
        for field in ("x_mm", "y_mm", "x_um", "y_um"):
            if field in mapped and names[field] not in dataset:
                raise FileFormatError(path, f"names: {field} = {names[field]!r}, but the file has no such variable; "
                                            f"variables and coordinates: {sorted(map(str, dataset.variables))}")
        position_names = position_fields(path, names, set(map(str, dataset.variables)), mapped)
        positions = None
        if position_names is not None:
            (x_name, y_name), to_mm = position_names
            positions = np.column_stack([as_numbers(dataset[name].values, path, f"variable {name!r}")
                                         for name in (x_name, y_name)]) * to_mm
        attrs = {k: v for k, v in response.attrs.items() if isinstance(v, (str, int, float))}
        values = as_numbers(response.values, path, f"variable {response_name!r}", ("row", "column"))
        stimulus_values = [id_text(s) for s in stimulus_id.values]
    where = {"response": f"variable {names['response']!r}", "electrode": f"coordinate {names['electrode']!r}",
             "stimulus_id": f"coordinate {names['stimulus_id']!r}",
             "positions": positions_where("coordinates", names, position_names)}
    return values, stimulus_values, electrode_ids, positions, attrs, where
