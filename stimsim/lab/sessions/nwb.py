"""NWB sessions: the file's ``trials`` table, its subject id and session id."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stimsim.lab.recordings.formats import id_text
from stimsim.lab.sessions.formats import SessionFormat, register_session_format
from stimsim.utilities.errors import FileFormatError, unreadable_reason


@register_session_format("NWB")
class NWBSessions(SessionFormat):
    """NWB files read with pynwb (the ``trials`` table as written by ``stimsim session``)."""

    suffixes = (".nwb",)

    def read(self, path):
        return _read_nwb(path)


def _read_nwb(path: Path):
    from hdmf.common import DynamicTableRegion
    from pynwb import NWBHDF5IO

    try:
        with NWBHDF5IO(str(path), "r") as io:
            try:
                nwbfile = io.read()
            except Exception as exc:  # pynwb/hdmf raise many types for a damaged or foreign file (TypeError without
                # the NWB version, ConstructError for a table whose columns differ in length, ...)
                raise FileFormatError(path, f"not a readable NWB file ({unreadable_reason(exc)})") from None
            if nwbfile.trials is None:
                raise FileFormatError(path, "the NWB file has no trials table")
            table = nwbfile.trials.to_dataframe(index=True).reset_index(drop=True)
            for name in nwbfile.trials.colnames:
                if isinstance(nwbfile.trials[name], DynamicTableRegion):
                    table[name] = _referenced_ids(nwbfile.trials[name], path)
            subject = nwbfile.subject.subject_id if nwbfile.subject is not None else None
            return table, subject, nwbfile.session_id
    except FileFormatError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise FileFormatError(path, f"not a readable NWB file ({unreadable_reason(exc)})") from None


def _referenced_ids(column, path: Path) -> list[str]:
    """The ids of the rows a trials column of references (NWB's DynamicTableRegion, e.g. into the electrodes
    table) points at, as stimsim reads electrode ids there: the table's ``electrode_id`` column, else its ``label``,
    else its row ids."""
    rows = np.asarray(column.data[:])
    if rows.ndim != 1:
        raise FileFormatError(path, f"trials column {column.name!r} references several rows of table "
                                    f"{column.table.name!r} per trial; a trial shows one site")
    target = column.table
    for name in ("electrode_id", "label"):
        if name in target.colnames:
            ids = [id_text(value) for value in target[name].data[:]]
            break
    else:
        ids = [str(int(value)) for value in target.id.data[:]]
    return [ids[row] for row in rows]
