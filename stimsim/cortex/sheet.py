"""Cortical sheets: where the units of one model layer sit, in millimetres.

A sheet holds the (x, y) position in mm of every unit of a layer whose output has dims (C, H, W);
row ``i`` of the coordinates is unit ``i`` of the output flattened in C-major order (torch's
``.flatten(1)``). Sheets read and write TDANN's per-layer position files (Margalit et al. 2024,
Neuron): ``.npz`` archives and the ``.pkl`` files that pickle ``spacetorch``'s ``LayerPositions``.
"""
from __future__ import annotations

import dataclasses
import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stimsim.utilities.errors import FileFormatError, unreadable_reason
from stimsim.utilities.io import atomic_write_bytes

#: The one class a TDANN ``.pkl`` positions file may hold, besides numpy arrays.
TDANN_POSITIONS_CLASS = ("spacetorch.models.positions", "LayerPositions")

#: Globals numpy needs to rebuild arrays and scalars from a pickle (numpy 1.x and 2.x names).
_NUMPY_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("copyreg", "_reconstructor"),
    ("builtins", "object"),
}


class _PickledLayerPositions:
    """Stand-in for ``spacetorch.models.positions.LayerPositions``: only collects its fields."""

    def __setstate__(self, state):
        self.__dict__.update(state)


class _PositionsUnpickler(pickle.Unpickler):
    """Unpickler that accepts TDANN's position class and numpy arrays, and refuses all else."""

    def __init__(self, file, path):
        super().__init__(file)
        self._path = path

    def find_class(self, module, name):
        if (module, name) == TDANN_POSITIONS_CLASS:
            return _PickledLayerPositions
        if (module, name) in _NUMPY_PICKLE_GLOBALS:
            return super().find_class(module, name)
        raise FileFormatError(
            self._path,
            f"refused to unpickle {module}.{name}: a positions file may only hold "
            f"{'.'.join(TDANN_POSITIONS_CLASS)} and numpy arrays",
        )


@dataclass(frozen=True, eq=False)
class CorticalSheet:
    """Positions (mm) of the units of one layer on a model cortical sheet.

    Parameters
    ----------
    name : layer name, e.g. ``"layer4.1"``.
    dims : output dims of the layer, (C, H, W).
    coordinates_mm : (N, 2) float array, N = C*H*W, column 0 = x, column 1 = y, in mm.
    neighborhood_indices : (P, Q) int array, each row one neighbourhood of unit indices
        (TDANN's precomputed neighbourhoods for the spatial loss), or an empty (0, 0) array.
    neighborhood_width_mm : width of those neighbourhoods, mm.
    cortex_mm_per_model_mm : the frame of the coordinates: how many of their mm one mm of the model's own sheet
        is (1: the model's own frame; a sheet in cortex mm, made by :meth:`scaled`, records its factor and
        converts back with :meth:`to_model_mm`).
    resting_activity : (N,) each unit's resting activity in the layer's activation units, or None (the model
        records none; :mod:`stimsim.models.resting`). The multiplicative form of electrical stimulation can act
        on it (``resting_fraction``).
    resting_reference : how ``resting_activity`` was measured (the reference images), "" without one.
    """

    name: str
    dims: tuple[int, int, int]
    coordinates_mm: np.ndarray
    neighborhood_indices: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    neighborhood_width_mm: float = float("nan")
    cortex_mm_per_model_mm: float = 1.0
    resting_activity: np.ndarray | None = None
    resting_reference: str = ""

    def __post_init__(self):
        dims = tuple(int(d) for d in np.atleast_1d(self.dims))
        if len(dims) == 1:
            dims = (dims[0], 1, 1)
        if len(dims) != 3 or min(dims) < 1:
            raise ValueError(f"sheet {self.name!r}: dims must be (C, H, W) with positive sizes, got {self.dims}")
        coords = np.asarray(self.coordinates_mm, dtype=np.float64)
        n_units = dims[0] * dims[1] * dims[2]
        if coords.shape != (n_units, 2):
            raise ValueError(
                f"sheet {self.name!r}: coordinates_mm must have shape (C*H*W, 2) = ({n_units}, 2) for dims "
                f"{dims}, got {coords.shape}"
            )
        if not np.all(np.isfinite(coords)):
            raise ValueError(f"sheet {self.name!r}: coordinates_mm contains NaN or infinite values")
        nbh = np.asarray(self.neighborhood_indices, dtype=np.int64)
        if nbh.size and (nbh.ndim != 2 or nbh.min() < 0 or nbh.max() >= n_units):
            raise ValueError(
                f"sheet {self.name!r}: neighborhood_indices must be a (P, Q) array of unit indices in [0, {n_units})"
            )
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "coordinates_mm", coords)
        object.__setattr__(self, "neighborhood_indices", nbh.reshape((0, 0)) if nbh.size == 0 else nbh)
        object.__setattr__(self, "neighborhood_width_mm", float(self.neighborhood_width_mm))
        if self.resting_activity is not None:
            resting = np.asarray(self.resting_activity, dtype=np.float64)
            if resting.shape != (n_units,) or not np.all(np.isfinite(resting)):
                raise ValueError(f"sheet {self.name!r}: resting_activity must be {n_units} finite values, one per "
                                 f"unit, got shape {resting.shape}")
            object.__setattr__(self, "resting_activity", resting)

    # --- geometry -------------------------------------------------------------------------
    @property
    def n_units(self) -> int:
        return len(self.coordinates_mm)

    @property
    def extent_mm(self) -> tuple[float, float, float, float]:
        """(x_min, x_max, y_min, y_max) of the unit positions, mm."""
        (x0, y0), (x1, y1) = self.coordinates_mm.min(0), self.coordinates_mm.max(0)
        return float(x0), float(x1), float(y0), float(y1)

    @property
    def centre_mm(self) -> tuple[float, float]:
        """(x, y) of the middle of the units' extent, mm."""
        x0, x1, y0, y1 = self.extent_mm
        return (x0 + x1) / 2, (y0 + y1) / 2

    @property
    def size_mm(self) -> float:
        """Side of the smallest square (aligned with the axes) that holds every unit, mm."""
        x0, x1, y0, y1 = self.extent_mm
        return max(x1 - x0, y1 - y0)

    @property
    def density_per_mm2(self) -> float:
        """Units per mm² of the sheet's bounding box."""
        x0, x1, y0, y1 = self.extent_mm
        return self.n_units / max((x1 - x0) * (y1 - y0), np.finfo(float).tiny)

    def unit_channels(self) -> np.ndarray:
        """Channel index of every unit (length N)."""
        c, h, w = self.dims
        return np.repeat(np.arange(c), h * w)

    def distances_mm(self, point_mm) -> np.ndarray:
        """Euclidean distance (mm) of every unit from ``point_mm`` = (x, y)."""
        point = np.asarray(point_mm, dtype=np.float64).reshape(2)
        return np.linalg.norm(self.coordinates_mm - point, axis=1)

    def units_within(self, point_mm, radius_mm: float) -> np.ndarray:
        """Indices of the units within ``radius_mm`` of ``point_mm`` (inclusive), ascending."""
        if not radius_mm >= 0:  # NaN included
            raise ValueError(f"radius_mm must be a number >= 0, got {radius_mm}")
        return np.flatnonzero(self.distances_mm(point_mm) <= radius_mm)

    def contains(self, point_mm, margin_mm: float = 0.0) -> bool:
        """Whether ``point_mm`` lies inside the sheet's bounding box grown by ``margin_mm``."""
        x, y = np.asarray(point_mm, dtype=np.float64).reshape(2)
        x0, x1, y0, y1 = self.extent_mm
        return bool(x0 - margin_mm <= x <= x1 + margin_mm and y0 - margin_mm <= y <= y1 + margin_mm)

    def with_neighborhoods(self, width_mm: float, n_neighborhoods: int, max_units: int = 500,
                           seed: int = 0) -> "CorticalSheet":
        """A copy with ``n_neighborhoods`` neighbourhoods: the units within a disc of diameter
        ``width_mm`` around random centre units, each randomly subsampled to a common size
        (the smallest neighbourhood's, at most ``max_units``) so they stack into a (P, Q) array."""
        if width_mm <= 0 or n_neighborhoods < 1 or max_units < 2:
            raise ValueError("need width_mm > 0, n_neighborhoods >= 1 and max_units >= 2")
        rng = np.random.default_rng(seed)
        centres = rng.choice(self.n_units, size=n_neighborhoods, replace=n_neighborhoods > self.n_units)
        members = [self.units_within(self.coordinates_mm[c], width_mm / 2) for c in centres]
        q = min(max_units, min(len(m) for m in members))
        if q < 2:
            raise ValueError(
                f"sheet {self.name!r}: neighbourhoods {width_mm} mm wide hold fewer than 2 units; use a wider one"
            )
        rows = np.stack([np.sort(rng.choice(m, size=q, replace=False)) for m in members])
        return dataclasses.replace(self, neighborhood_indices=rows, neighborhood_width_mm=width_mm)

    def scaled(self, factor: float) -> "CorticalSheet":
        """A copy with every position and the neighbourhood width multiplied by ``factor`` (e.g. to
        express a model sheet in millimetres of cortex); the copy records the factor in its frame."""
        if not factor > 0:
            raise ValueError(f"scale factor must be > 0, got {factor}")
        return dataclasses.replace(self, coordinates_mm=self.coordinates_mm * factor,
                                   neighborhood_width_mm=self.neighborhood_width_mm * factor,
                                   cortex_mm_per_model_mm=self.cortex_mm_per_model_mm * factor)

    def to_model_mm(self, points_mm) -> np.ndarray:
        """Points (…, 2) given in this sheet's frame, in mm of the model's own sheet."""
        return np.asarray(points_mm, dtype=np.float64) / self.cortex_mm_per_model_mm

    # --- files ----------------------------------------------------------------------------
    def save_resting(self, path) -> Path:
        """Write the resting-activity file (atomically): ``activity`` float32 per unit, ``reference`` as text."""
        if self.resting_activity is None:
            raise ValueError(f"sheet {self.name!r} holds no resting activity")
        buffer = io.BytesIO()
        np.savez(buffer, activity=self.resting_activity.astype(np.float32), reference=np.array(self.resting_reference))
        return atomic_write_bytes(Path(path), buffer.getvalue())

    def with_resting_file(self, path) -> "CorticalSheet":
        """A copy holding the resting activity of the file at ``path`` (written by :meth:`save_resting`)."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as archive:
                activity, reference = archive["activity"], str(archive["reference"])
        except (OSError, ValueError, KeyError) as exc:
            raise FileFormatError(path, f"not a resting-activity file with 'activity' and 'reference' "
                                        f"({unreadable_reason(exc)})") from None
        if activity.shape != (self.n_units,) or not np.all(np.isfinite(activity)):
            raise FileFormatError(path, f"'activity' must hold {self.n_units} finite values, one per unit of the "
                                        f"layer; got shape {activity.shape}")
        return dataclasses.replace(self, resting_activity=activity, resting_reference=reference)

    def save(self, path) -> Path:
        """Write a TDANN-format ``.npz`` positions file (atomically)."""
        path = Path(path)
        buffer = io.BytesIO()
        np.savez(
            buffer,
            name=np.array(self.name),
            dims=np.array(self.dims, dtype=np.int64),
            coordinates=self.coordinates_mm.astype(np.float32),
            neighborhood_indices=self.neighborhood_indices,
            neighborhood_width=np.array(self.neighborhood_width_mm),
        )
        atomic_write_bytes(path, buffer.getvalue())
        return path

    @classmethod
    def load(cls, path, expected_dims=None) -> "CorticalSheet":
        """Read a TDANN positions file (``.npz`` or ``.pkl``); check dims against ``expected_dims``."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"positions file not found: {path}")
        if path.suffix == ".npz":
            fields = _read_npz_fields(path)
        elif path.suffix == ".pkl":
            fields = _read_pkl_fields(path)
        else:
            raise FileFormatError(path, "positions files must end in .npz or .pkl")
        try:
            sheet = cls(
                name=str(fields["name"]),
                dims=tuple(np.atleast_1d(fields["dims"]).tolist()),
                coordinates_mm=fields["coordinates"],
                neighborhood_indices=fields.get("neighborhood_indices", np.zeros((0, 0), np.int64)),
                neighborhood_width_mm=float(fields.get("neighborhood_width", float("nan"))),
            )
        except (ValueError, TypeError) as exc:
            raise FileFormatError(path, str(exc)) from None
        if expected_dims is not None and sheet.dims != tuple(expected_dims):
            raise FileFormatError(
                path, f"positions are for dims {sheet.dims} but layer {sheet.name!r} outputs {tuple(expected_dims)}"
            )
        return sheet


_REQUIRED_FIELDS = ("name", "dims", "coordinates")


def _read_npz_fields(path: Path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as archive:
            fields = {key: archive[key] for key in archive.files}
    except Exception as exc:  # numpy raises many types for a damaged archive
        raise FileFormatError(path, f"not a readable .npz archive ({unreadable_reason(exc)})") from None
    missing = [key for key in _REQUIRED_FIELDS if key not in fields]
    if missing:
        raise FileFormatError(path, f"missing field(s) {missing}; a positions file needs {list(_REQUIRED_FIELDS)}")
    fields["name"] = fields["name"][()]
    if "neighborhood_width" in fields:
        fields["neighborhood_width"] = fields["neighborhood_width"][()]
    return fields


def _read_pkl_fields(path: Path) -> dict:
    with open(path, "rb") as handle:
        try:
            obj = _PositionsUnpickler(handle, path).load()
        except FileFormatError:
            raise
        except Exception as exc:
            raise FileFormatError(path, f"not a readable positions pickle ({exc})") from None
    if not isinstance(obj, _PickledLayerPositions):
        raise FileFormatError(path, f"expected a pickled {'.'.join(TDANN_POSITIONS_CLASS)}, got {type(obj).__name__}")
    fields = dict(obj.__dict__)
    missing = [key for key in _REQUIRED_FIELDS if key not in fields]
    if missing:
        raise FileFormatError(path, f"missing field(s) {missing}; a positions file needs {list(_REQUIRED_FIELDS)}")
    return fields
