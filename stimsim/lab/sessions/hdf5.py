"""HDF5 sessions: a group ``trials`` with one 1-D dataset per column, or a compound dataset ``trials``."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from stimsim.lab.sessions.formats import SessionFormat, register_session_format
from stimsim.utilities.errors import FileFormatError


@register_session_format("HDF5")
class HDF5Sessions(SessionFormat):
    """HDF5 files read with h5py; byte columns are decoded as UTF-8."""

    suffixes = (".h5", ".hdf5")

    def read(self, path):
        return _read_hdf5(path), None, None


def _read_hdf5(path: Path) -> pd.DataFrame:
    """A group ``trials`` with one 1-D dataset per column, or a compound dataset ``trials``."""
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            if "trials" not in handle:
                raise FileFormatError(path, "no 'trials' group or dataset; expected /trials with one "
                                            "1-D dataset per column (or a compound dataset)")
            node = handle["trials"]
            if isinstance(node, h5py.Dataset):
                if node.dtype.names is None:
                    raise FileFormatError(path, "/trials is a plain dataset; it must be a compound "
                                                "dataset or a group of columns")
                data = node[()]
                columns = {name: data[name] for name in node.dtype.names}
            else:
                columns = {name: node[name][()] for name in node if isinstance(node[name], h5py.Dataset)}
    except FileFormatError:
        raise
    except OSError as exc:
        raise FileFormatError(path, f"not a readable HDF5 file ({exc})") from None
    shapes = {name: np.shape(values) for name, values in columns.items()}
    not_1d = {name: shape for name, shape in shapes.items() if len(shape) != 1}
    if not_1d:
        raise FileFormatError(path, "/trials columns must be 1-D (one value per trial); "
                                    + ", ".join(f"column {name!r} has shape {shape}" for name, shape in not_1d.items()))
    lengths = {name: shape[0] for name, shape in shapes.items()}
    if len(set(lengths.values())) > 1:
        raise FileFormatError(path, f"/trials columns must be of equal length, got lengths {lengths}")
    decoded = {name: _decoded(path, name, values) if np.asarray(values).dtype.kind in "OS" else values
               for name, values in columns.items()}
    return pd.DataFrame(decoded)


def _decoded(path: Path, name: str, values) -> list:
    """The text of an HDF5 column of bytes (UTF-8); undecodable bytes name the column and row."""
    text = []
    for row, value in enumerate(values, start=1):
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FileFormatError(path, f"/trials column {name!r}, row {row}: not UTF-8 text ({exc.reason} at "
                                            f"byte {exc.start}: {value[max(exc.start - 8, 0):exc.start + 8]!r})") from None
        text.append(value)
    return text
