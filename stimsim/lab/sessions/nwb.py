"""NWB sessions: the file's ``trials`` table, its subject id and session id."""
from __future__ import annotations

from pathlib import Path

from stimsim.lab.sessions.formats import SessionFormat, register_session_format
from stimsim.utilities.errors import FileFormatError


@register_session_format("NWB")
class NWBSessions(SessionFormat):
    """NWB files read with pynwb (the ``trials`` table as written by ``stimsim session``)."""

    suffixes = (".nwb",)

    def read(self, path):
        return _read_nwb(path)


def _read_nwb(path: Path):
    from pynwb import NWBHDF5IO

    try:
        with NWBHDF5IO(str(path), "r") as io:
            try:
                nwbfile = io.read()
            except TypeError as exc:  # pynwb's answer to an HDF5 file without the NWB version
                raise FileFormatError(path, f"not a readable NWB file ({exc})") from None
            if nwbfile.trials is None:
                raise FileFormatError(path, "the NWB file has no trials table")
            table = nwbfile.trials.to_dataframe().reset_index(drop=True)
            subject = nwbfile.subject.subject_id if nwbfile.subject is not None else None
            return table, subject, nwbfile.session_id
    except FileFormatError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise FileFormatError(path, f"not a readable NWB file ({exc})") from None
