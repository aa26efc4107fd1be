"""NWB recordings (``.nwb``; the layout ``Recordings.save_nwb`` writes): the ``electrodes`` table (ids, positions,
one ``ElectrodeGroup`` per array) and a ``presentations`` table with ``stimulus_id`` and a 2-D ``response`` column
(presentation × electrode)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stimsim.lab.recordings.formats import (RecordingFormat, RecordingTable, as_numbers, id_text, position_fields,
                                            positions_where, register_recording_format)
from stimsim.utilities.errors import FileFormatError, unreadable_reason


@register_recording_format("NWB")
class NWBRecordings(RecordingFormat):
    """NWB files read with pynwb; a file may hold several arrays (``electrode_group`` chooses one)."""

    suffixes = (".nwb",)
    default_names = {"electrode": "electrode_id", "presentation": "presentations"}
    electrode_groups = True

    def read(self, path, names, mapped, electrode_group) -> RecordingTable:
        return RecordingTable(*_read_nwb(path, names, mapped, electrode_group))


def _read_nwb(path: Path, names: dict, mapped=frozenset(), electrode_group: str | None = None):
    """``mapped``: the fields the lab named; a named electrodes-table column must exist (without a name the ids fall
    back to the ``label`` column, then the row ids). ``electrode_group``: the array to read when the electrodes belong
    to several ``ElectrodeGroup``s (refused without it)."""
    from hdmf.common import DynamicTable
    from pynwb import NWBHDF5IO

    try:
        io = NWBHDF5IO(str(path), "r")
        nwbfile = io.read()
    except Exception as exc:  # pynwb/h5py raise many types for a damaged or foreign file
        raise FileFormatError(path, f"not a readable NWB file ({unreadable_reason(exc)})") from None
    with io:
        if nwbfile.electrodes is None or len(nwbfile.electrodes) == 0:
            raise FileFormatError(path, "the NWB file has no electrodes table")
        electrodes = nwbfile.electrodes
        columns = set(electrodes.colnames)
        for field in ("electrode", "x_mm", "y_mm", "x_um", "y_um"):
            if field in mapped and names[field] not in columns:
                raise FileFormatError(path, f"names: {field} = {names[field]!r}, but the electrodes table has no such "
                                            f"column; columns: {list(electrodes.colnames)}")
        id_column = names["electrode"]
        if id_column in columns:
            electrode_ids = [id_text(v) for v in electrodes[id_column].data[:]]
            id_where = f"electrodes table, column {id_column!r}"
        elif "label" in columns:
            electrode_ids = [id_text(v) for v in electrodes["label"].data[:]]
            id_where = "electrodes table, column 'label'"
        else:
            electrode_ids = [str(int(v)) for v in electrodes.id.data[:]]
            id_where = "electrodes table, row ids"
        position_names = position_fields(path, names, columns, mapped)
        positions = None
        if position_names is not None:
            (x_name, y_name), to_mm = position_names
            positions = np.column_stack([as_numbers(electrodes[name].data[:], path, f"electrodes table, column {name!r}")
                                         for name in (x_name, y_name)]) * to_mm
        table_name = names["presentation"]
        candidates = [obj for obj in nwbfile.objects.values()
                      if isinstance(obj, DynamicTable) and obj.name == table_name]
        if not candidates:
            tables = sorted({obj.name for obj in nwbfile.objects.values() if isinstance(obj, DynamicTable)})
            raise FileFormatError(path, f"no table named {table_name!r} (presentations); tables in the file: "
                                        f"{tables}; map yours with names={{'presentation': ...}}")
        table = candidates[0]
        where_table = f"table {table_name!r}"
        for field in ("stimulus_id", "response"):
            if names[field] not in table.colnames:
                raise FileFormatError(path, f"{where_table}: no column {names[field]!r} ({field}); columns: "
                                            f"{list(table.colnames)}")
        stimulus_id = [id_text(v) for v in table[names["stimulus_id"]].data[:]]
        column = table[names["response"]]
        n_electrodes = len(electrode_ids)
        group_names = [str(group.name) for group in electrodes["group"].data[:]]
        counts = {name: group_names.count(name) for name in dict.fromkeys(group_names)}
        listed = ", ".join(f"{name!r} ({n} electrodes)" for name, n in counts.items())
        arrays = ""  # said when the response does not fit: a file of several arrays is read one way only
        if len(counts) > 1:
            arrays = (f"; the electrodes table holds {len(counts)} arrays (ElectrodeGroups {listed}): the response "
                      "needs a column for each of its rows, and electrode_group chooses the array (a table per array "
                      "is not read)")
            if len(candidates) > 1:
                arrays += f"; the file holds {len(candidates)} tables named {table_name!r}, and the first was read"
        if hasattr(column, "target"):  # a ragged column: VectorIndex over VectorData
            rows = [as_numbers(column[i], path, f"{where_table}, column {names['response']!r}, row {i}", ("value",))
                    for i in range(len(table))]
            for i, row in enumerate(rows):
                if row.shape != (n_electrodes,):
                    raise FileFormatError(path, f"{where_table}, column {names['response']!r}, row {i} (0-based): "
                                                f"{row.size} values for {n_electrodes} electrodes{arrays}")
            values = np.stack(rows) if rows else np.zeros((0, n_electrodes))
        else:
            values = as_numbers(column.data[:], path, f"{where_table}, column {names['response']!r}", ("row", "column"))
            if values.ndim == 1 and n_electrodes == 1:
                values = values[:, None]
            if values.ndim != 2 or values.shape[1] != n_electrodes:
                raise FileFormatError(path, f"{where_table}, column {names['response']!r}: shape {values.shape}; "
                                            f"expected (presentations, {n_electrodes} electrodes of the "
                                            f"electrodes table){arrays}")
        if "start_time" in table.colnames:
            _refuse_repeated_onsets(path, where_table, as_numbers(table["start_time"].data[:], path,
                                                                  f"{where_table}, column 'start_time'"))
        attrs = {"units_description": column.description}
        if electrode_group is not None or len(counts) > 1:
            if electrode_group is None:
                raise FileFormatError(path, f"electrodes table: electrodes of {len(counts)} arrays (ElectrodeGroups "
                                            f"{listed}); a plan registers one array: choose it with electrode_group "
                                            "([recordings] electrode_group in a plan)")
            if electrode_group not in counts:
                raise FileFormatError(path, f"electrodes table: no ElectrodeGroup {electrode_group!r}; groups: {listed}")
            keep = [i for i, name in enumerate(group_names) if name == electrode_group]
            electrode_ids = [electrode_ids[i] for i in keep]
            values = values[:, keep]
            positions = None if positions is None else positions[keep]
            id_where += f" (ElectrodeGroup {electrode_group!r})"
    where = {"response": f"{where_table}, column {names['response']!r}", "electrode": id_where,
             "stimulus_id": f"{where_table}, column {names['stimulus_id']!r}",
             "positions": positions_where("electrodes table columns", names, position_names)}
    return values, stimulus_id, electrode_ids, positions, attrs, where


def _refuse_repeated_onsets(path: Path, where_table: str, starts: np.ndarray) -> None:
    """Two presentations of one array cannot start at the same time: rows with a repeated ``start_time`` are rows
    written twice (an export concatenated with itself), which would make every electrode look reliable."""
    _, first, counts = np.unique(starts, return_index=True, return_counts=True)
    if (counts > 1).any():
        again = int(np.sum(counts[counts > 1] - 1))
        example = float(starts[first[np.argmax(counts > 1)]])
        raise FileFormatError(path, f"{where_table}: {again} presentation(s) start at the time of another (e.g. "
                                    f"{example:g} s, rows {', '.join(map(str, np.flatnonzero(starts == example)[:3]))} "
                                    "0-based); rows written twice would count as repeats and make every electrode "
                                    "look reliable")
