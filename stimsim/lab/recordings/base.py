"""Passive-viewing recordings: one response per (image presentation, electrode), read from NetCDF
or NWB, averaged per image, with split-half reliability per electrode.

In memory a :class:`Recordings` holds an ``xarray.DataArray`` named ``response`` with dims
``("presentation", "electrode")``, a ``stimulus_id`` coordinate on ``presentation`` and text
electrode ids, plus the :class:`~stimsim.lab.arrays.ArrayLayout` of the array.

**NetCDF layout** (``save_netcdf`` writes it; any file with these names, or names mapped onto them,
is read): variable ``response`` (presentation × electrode), coordinates ``stimulus_id``
(presentation), ``electrode`` (ids), and optionally ``x_mm``, ``y_mm`` (electrode; array frame) or
``x_um``, ``y_um`` (the same in micrometres, converted to mm).
Positions read from a file are kept as they are (the pose of an array rotates about its frame's
origin); pass a ``layout`` to use another frame.

**NWB layout** (plain pynwb; ``save_nwb`` writes it):

- ``electrodes`` table, one row per electrode, with the ``group`` (one ``ElectrodeGroup`` per array)
  and the columns ``electrode_id`` (text) and ``x_mm``, ``y_mm`` (position on the array, mm; or ``x_um``,
  ``y_um`` in micrometres);
  without an ``electrode_id`` column (and none named by ``names``) the table's ``label`` column, else its
  row ids, are the ids.
- a ``TimeIntervals`` table named ``presentations`` (in ``nwbfile.intervals``; a ``DynamicTable`` of
  that name anywhere in the file is read as well), one row per image presentation, with
  ``start_time``, ``stop_time`` (s), ``stimulus_id`` (text) and ``response``: a 2-D column
  (presentation × electrode) whose column j belongs to row j of the electrodes table.
  A ragged column (one list per row, of the electrodes table's length) is read too.

``names`` maps stimsim's names (``response``, ``stimulus_id``, ``electrode``, ``presentation``,
``x_mm``, ``y_mm``, ``x_um``, ``y_um``) onto the lab's, e.g. ``{"response": "mua", "stimulus_id": "image"}``: in NetCDF
they are variable/dimension/coordinate names, in NWB ``presentation`` names the table, ``electrode``
the electrodes table's id column, the others its columns.

The readers are one module per format (:mod:`~stimsim.lab.recordings.netcdf`, :mod:`~stimsim.lab.recordings.nwb`)
behind a registry (:mod:`~stimsim.lab.recordings.formats`); the checks of electrodes, positions and responses that
:class:`Recordings` relies on are made here, the same for every format.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import xarray as xr

from stimsim.lab.arrays.layout import ArrayLayout, check_spacing_mm
from stimsim.lab.recordings.formats import format_of
from stimsim.utilities.errors import ConfigError, DataError, FileFormatError
from stimsim.utilities.io import atomic_save

#: stimsim's names for the fields of a recordings file; ``names`` maps them onto a lab's.
FIELD_NAMES = ("response", "stimulus_id", "electrode", "presentation", "x_mm", "y_mm", "x_um", "y_um")
DEFAULT_NAMES = {"response": "response", "stimulus_id": "stimulus_id", "electrode": "electrode",
                 "presentation": "presentation", "x_mm": "x_mm", "y_mm": "y_mm", "x_um": "x_um", "y_um": "y_um"}
#: Largest disagreement (mm) between the distance of two electrodes in a recordings file and on the layout it is read
#: with; more, and the file belongs to another array, frame scale or unit.
POSITION_TOLERANCE_MM = 0.02


@dataclass(frozen=True, eq=False)
class Recordings:
    """Responses (presentation × electrode) with stimulus ids, electrode ids and the array layout.

    Attributes
    ----------
    response : DataArray named ``response``; attrs may hold ``units`` and ``window_ms``.
    layout : the array's layout, restricted to the recorded electrodes (same order).
    source : the file the recordings came from (named in error messages), or ``"<memory>"``.
    """

    response: xr.DataArray
    layout: ArrayLayout
    source: str = "<memory>"

    def __post_init__(self):
        response = self.response
        if response.dims != ("presentation", "electrode"):
            raise ValueError(f"response must have dims ('presentation', 'electrode'), got {response.dims}")
        ids = tuple(str(i) for i in response["electrode"].values)
        if ids != self.layout.electrode_ids:
            raise ValueError(f"{self.source}: electrode ids {ids[:5]}… do not match the layout's order")
        response = response.assign_coords(
            electrode=np.asarray(ids, dtype=object).astype(str),
            stimulus_id=("presentation", np.asarray(response["stimulus_id"].values).astype(str)))
        response = response.astype(np.float64).rename("response")
        object.__setattr__(self, "response", response)

    # --- constructors ---------------------------------------------------------------------
    @classmethod
    def from_arrays(cls, responses, stimulus_ids, layout: ArrayLayout, attrs: dict | None = None,
                    source: str = "<memory>") -> "Recordings":
        """Build from a (presentation × electrode) array whose columns follow ``layout``."""
        values = np.asarray(responses, dtype=np.float64)
        if values.shape != (len(stimulus_ids), len(layout)):
            raise ValueError(f"responses have shape {values.shape}; expected ({len(stimulus_ids)}, {len(layout)})")
        data = xr.DataArray(values, dims=("presentation", "electrode"), name="response",
                            coords={"presentation": np.arange(len(values)),
                                    "stimulus_id": ("presentation", np.asarray(stimulus_ids).astype(str)),
                                    "electrode": np.asarray(layout.electrode_ids)},
                            attrs=dict(attrs or {}))
        recordings = cls(data, layout, source)
        recordings.validate()
        return recordings

    # --- views ----------------------------------------------------------------------------
    @property
    def electrode_ids(self) -> tuple:
        return self.layout.electrode_ids

    @property
    def stimulus_ids(self) -> np.ndarray:
        """Unique stimulus ids in order of first presentation."""
        ids = self.response["stimulus_id"].values
        _, first = np.unique(ids, return_index=True)
        return ids[np.sort(first)]

    def repeats(self) -> xr.DataArray:
        """Number of presentations of every stimulus (DataArray on ``stimulus_id``)."""
        ids, counts = np.unique(self.response["stimulus_id"].values, return_counts=True)
        counts = xr.DataArray(counts, dims="stimulus_id", coords={"stimulus_id": ids}, name="repeats")
        return counts.sel(stimulus_id=self.stimulus_ids)

    def per_image(self) -> xr.DataArray:
        """Mean response over repeats: DataArray (stimulus_id × electrode), in first-shown order."""
        mean = self.response.groupby("stimulus_id").mean("presentation")
        mean = mean.sel(stimulus_id=self.stimulus_ids)
        mean.attrs = dict(self.response.attrs)
        return mean.rename("response")

    def select_electrodes(self, electrode_ids) -> "Recordings":
        """The recordings of ``electrode_ids`` only (in that order)."""
        layout = self.layout.subset(electrode_ids)
        return Recordings(self.response.sel(electrode=list(layout.electrode_ids)), layout, self.source)

    def select_stimuli(self, stimulus_ids) -> "Recordings":
        """The presentations of ``stimulus_ids`` only (e.g. a bootstrap or cross-validation split)."""
        keep = np.isin(self.response["stimulus_id"].values, np.asarray(stimulus_ids).astype(str))
        return Recordings(self.response.isel(presentation=np.flatnonzero(keep)), self.layout, self.source)

    def in_canonical_order(self) -> "Recordings":
        """The same recordings with the electrodes in array order and the presentations sorted by stimulus id (the
        repeats of an image by their responses), so that what is computed from them (cross-validation folds, split
        halves, resamples of images) does not depend on the order a file lists its rows and columns in. The
        ``presentation`` coordinate keeps each presentation's row in the file."""
        electrodes = self.layout.in_array_order(self.electrode_ids)
        response = self.response.sel(electrode=electrodes)
        values = response.values
        by_response = [values[:, column] for column in reversed(range(values.shape[1]))]
        order = np.lexsort(by_response + [response["stimulus_id"].values])  # the last key sorts first
        return Recordings(response.isel(presentation=order), self.layout.subset(electrodes), self.source)

    def split_half_reliability(self, seed: int = 0, n_splits: int = 20) -> xr.DataArray:
        """Per-electrode split-half reliability, Spearman–Brown corrected (Spearman 1910, Brown 1910).

        For each of ``n_splits`` random splits (seeded) the repeats of every image are divided into
        two halves; the Pearson r across images between the two halves' means is corrected to the
        full number of repeats, r_SB = 2r / (1 + r); the result is the mean over splits.
        Every image needs at least 2 repeats.
        """
        if n_splits < 1:
            raise ConfigError(f"n_splits must be >= 1, got {n_splits}")
        counts = self.repeats()
        too_few = counts.stimulus_id.values[counts.values < 2]
        if len(too_few):
            raise DataError(f"{self.source}: split-half reliability needs at least 2 repeats of every image; "
                            f"{len(too_few)} stimulus_id(s) have fewer: {_preview(too_few)}")
        rng = np.random.default_rng(seed)
        values = self.response.values
        ids = self.response["stimulus_id"].values
        groups = [np.flatnonzero(ids == s) for s in self.stimulus_ids]
        corrected = np.zeros((n_splits, values.shape[1]))
        for split in range(n_splits):
            half_a = np.empty((len(groups), values.shape[1]))
            half_b = np.empty_like(half_a)
            for g, rows in enumerate(groups):
                order = rng.permutation(rows)
                half = len(order) // 2
                half_a[g] = values[order[:half]].mean(0)
                half_b[g] = values[order[half:]].mean(0)
            r = _columnwise_pearson(half_a, half_b)
            corrected[split] = 2 * r / (1 + r)
        return xr.DataArray(corrected.mean(0), dims="electrode", coords={"electrode": list(self.electrode_ids)},
                            name="split_half_reliability",
                            attrs={"method": "Spearman-Brown corrected split-half Pearson r", "n_splits": n_splits,
                                   "seed": seed})

    # --- checks ---------------------------------------------------------------------------
    def validate(self, where: str = "response"):
        """Raise a DataError naming file, field, row and electrode for the first NaN/inf response."""
        values = self.response.values
        bad = np.argwhere(~np.isfinite(values))
        if len(bad):
            row, col = bad[0]
            raise DataError(f"{self.source}: {where}, row {row} (0-based; stimulus_id "
                            f"'{self.response['stimulus_id'].values[row]}'), electrode {self.electrode_ids[col]!r}: "
                            f"response is {values[row, col]} ({len(bad)} non-finite value(s) in all)"
                            + ("; the electrode has no finite response at all: a plan leaves it out when its "
                               "[array] broken_electrodes lists it" if not np.isfinite(values[:, col]).any() else ""))

    def check_stimuli(self, stimulus_ids, images_source: str = "the image set", where: str = "stimulus_id"):
        """Raise a DataError if a presented stimulus_id is not among ``stimulus_ids`` (the images); ``where`` names
        the field in the file."""
        known = set(np.asarray(stimulus_ids).astype(str))
        presented = self.response["stimulus_id"].values
        unknown_rows = [i for i, s in enumerate(presented) if s not in known]
        if unknown_rows:
            first = unknown_rows[0]
            names = sorted({presented[i] for i in unknown_rows})
            raise DataError(f"{self.source}: {where}, row {first} (0-based): '{presented[first]}' is not in "
                            f"{images_source}; {len(names)} unknown stimulus id(s): {_preview(names)}; the images' ids "
                            f"are e.g. {_preview(sorted(known), 3)}")

    # --- files ----------------------------------------------------------------------------
    def save_netcdf(self, path) -> Path:
        """Write the NetCDF layout (atomically)."""
        data = self.response.assign_coords(x_mm=("electrode", self.layout.positions_mm[:, 0]),
                                           y_mm=("electrode", self.layout.positions_mm[:, 1]))
        dataset = data.to_dataset(name="response")
        dataset.attrs["array"] = self.layout.name
        dataset.attrs.update({k: v for k, v in self.response.attrs.items() if isinstance(v, (str, int, float))})
        return atomic_save(path, lambda tmp: dataset.to_netcdf(tmp, engine="h5netcdf"))

    def save_nwb(self, path, subject_id: str = "subject", session_id: str = "passive_viewing",
                 presentation_s: float = 0.1, interval_s: float = 0.2, species: str | None = None) -> Path:
        """Write the NWB layout with pynwb: electrodes table + a ``presentations`` TimeIntervals table, of
        ``subject_id`` (of ``species``, when given). Presentation i runs from i·``interval_s`` for ``presentation_s``
        seconds; the session starts when the file is written."""
        from hdmf.common import VectorData
        from pynwb import NWBHDF5IO, NWBFile
        from pynwb.epoch import TimeIntervals
        from pynwb.file import Subject

        units = self.response.attrs.get("units", "a.u.")
        window = self.response.attrs.get("window_ms", "")
        nwbfile = NWBFile(session_description="passive viewing: one response per image presentation and electrode",
                          identifier=str(uuid.uuid4()), session_id=session_id,
                          session_start_time=datetime.now(timezone.utc),
                          subject=Subject(subject_id=subject_id, species=species))
        device = nwbfile.create_device(name="array", description=f"multi-electrode array {self.layout.name}")
        group = nwbfile.create_electrode_group(name=self.layout.name, description="one array",
                                               location="IT", device=device)
        nwbfile.add_electrode_column(name="electrode_id", description="electrode id (text)")
        nwbfile.add_electrode_column(name="x_mm", description="x position on the array, mm (array frame)")
        nwbfile.add_electrode_column(name="y_mm", description="y position on the array, mm (array frame)")
        for electrode_id, (x, y) in zip(self.electrode_ids, self.layout.positions_mm):
            nwbfile.add_electrode(group=group, location="IT", electrode_id=electrode_id, x_mm=float(x), y_mm=float(y))
        values = self.response.values
        starts = np.arange(len(values)) * interval_s
        columns = [
            VectorData(name="start_time", description="image onset (s)", data=starts),
            VectorData(name="stop_time", description="image offset (s)", data=starts + presentation_s),
            VectorData(name="stimulus_id", description="id of the image shown",
                       data=[str(s) for s in self.response["stimulus_id"].values]),
            VectorData(name="response", description=f"response ({units}; window {window} ms) of every electrode; "
                                                    "column j = row j of the electrodes table", data=values),
        ]
        table = TimeIntervals(name="presentations", description="image presentations of passive viewing",
                              columns=columns)
        nwbfile.add_time_intervals(table)

        def write(tmp):
            with NWBHDF5IO(tmp, "w") as io:
                io.write(nwbfile)

        return atomic_save(path, write)


# --------------------------------------------------------------------------- reading


def load_recordings(path, names: dict | None = None, layout: ArrayLayout | None = None,
                    stimulus_ids=None, images_source: str = "the image set",
                    electrode_group: str | None = None, broken_electrodes=()) -> Recordings:
    """Read recordings from ``.nc`` or ``.nwb``, or any registered recording format (by the file's suffix; see
    the module docstring for the built-in layouts).

    Parameters
    ----------
    names : stimsim field name → the lab's name (see :data:`FIELD_NAMES`).
    layout : the array layout; without it the positions stored in the file (x_mm, y_mm, or x_um, y_um) are
        used, and refused when their spacing is implausible for mm (see :func:`check_spacing_mm`).
        Every recorded electrode must be in the layout, and positions the file holds must agree with it
        (distances within ``POSITION_TOLERANCE_MM``).
    stimulus_ids : the ids of the images the lab showed (e.g. of a stimulus set); every presented
        stimulus_id must be among them.
    electrode_group : NWB only: the ``ElectrodeGroup`` (array) whose electrodes to read, needed when the file's
        electrodes belong to more than one (each array is registered on its own).
    broken_electrodes : ids of electrodes the lab knows are broken: one whose responses are not all finite (e.g. NaN
        throughout) is left out, as if the file did not hold it; on any other electrode a non-finite response is an
        error.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recordings file not found: {path}")
    names = dict(names or {})
    unknown = sorted(set(names) - set(FIELD_NAMES))
    if unknown:
        raise ConfigError(f"names: unknown field(s) {unknown}; stimsim's fields are {list(FIELD_NAMES)}")
    reader = format_of(path)
    if electrode_group is not None and not reader.electrode_groups:
        raise ConfigError(f"{path}: electrode_group = {electrode_group!r} selects an NWB ElectrodeGroup; a {reader.name} "
                          "file holds one array")
    values, stimulus_id, electrode_ids, positions, attrs, where = reader.read(
        path, {**DEFAULT_NAMES, **reader.default_names, **names}, set(names), electrode_group)
    duplicates = sorted({i for i in electrode_ids if electrode_ids.count(i) > 1})
    if duplicates:
        raise FileFormatError(path, f"{where['electrode']}: electrode id(s) repeated: {_preview(duplicates)}")
    if positions is not None:
        unplaced = np.flatnonzero(~np.isfinite(np.asarray(positions, dtype=np.float64)).all(axis=1))
        if unplaced.size:
            raise FileFormatError(path, f"{where['positions']}: electrode(s) {_preview([electrode_ids[i] for i in unplaced])} "
                                        f"(row(s) {_preview([int(i) + 1 for i in unplaced])}) have no finite position "
                                        "(NaN or infinite); give every electrode its position, or the array layout")
    if layout is None:
        if positions is None:
            raise ConfigError(f"{path}: the file has no electrode positions ({where['positions']}); "
                              "give the array layout (a Utah kind, .csv or .cmp)")
        check_spacing_mm(positions, electrode_ids, path, where["positions"])
        layout = ArrayLayout(path.stem, tuple(electrode_ids), positions)
    else:
        missing = [i for i in electrode_ids if i not in layout.electrode_ids]
        if missing:
            by_label = bool(layout.labels) and set(electrode_ids) <= set(layout.labels)
            raise DataError(f"{path}: {where['electrode']}: {len(missing)} recorded electrode(s) are not in the "
                            f"array layout {layout.name!r}: {_preview(missing)} (layout ids: "
                            f"{_preview(layout.electrode_ids)})"
                            + ("; the recordings name the electrodes by the map's labels: read it with "
                               "electrode_id=\"label\" ([recordings] layout_ids = \"label\" in a plan)"
                               if by_label else ""))
        layout = layout.subset(electrode_ids)
        if positions is not None:
            _check_positions_match(path, where["positions"], positions, layout)
    data = xr.DataArray(values, dims=("presentation", "electrode"), name="response",
                        coords={"presentation": np.arange(len(values)),
                                "stimulus_id": ("presentation", np.asarray(stimulus_id).astype(str)),
                                "electrode": np.asarray(layout.electrode_ids)}, attrs=attrs)
    result = Recordings(data, layout, str(path))
    broken = {str(e) for e in broken_electrodes}
    finite = np.isfinite(data.values).all(axis=0)
    unread = {e for e, ok in zip(layout.electrode_ids, finite) if e in broken and not ok}
    if unread:
        result = result.select_electrodes([e for e in layout.electrode_ids if e not in unread])
    result.validate(where["response"])
    if stimulus_ids is not None:
        result.check_stimuli(stimulus_ids, images_source, where["stimulus_id"])
    return result


def _check_positions_match(path: Path, where: str, positions_mm: np.ndarray, layout: ArrayLayout) -> None:
    """Refuse a file whose electrode positions contradict the layout it is read with (the same electrodes in the same
    order): every pairwise distance must agree within :data:`POSITION_TOLERANCE_MM`, and the frames may differ by a
    translation or rotation — not by a unit, another array or a mirror image."""
    from scipy.spatial.distance import pdist, squareform

    in_file, on_layout = squareform(pdist(positions_mm)), squareform(pdist(layout.positions_mm))
    difference = np.abs(in_file - on_layout)
    if difference.size and difference.max() > POSITION_TOLERANCE_MM:
        a, b = np.unravel_index(int(np.argmax(difference)), difference.shape)
        ids = layout.electrode_ids
        raise DataError(f"{path}: {where}: the electrode positions in the file disagree with the array layout "
                        f"{layout.name!r}: electrodes {ids[a]!r} and {ids[b]!r} are {in_file[a, b]:.4g} mm apart in "
                        f"the file, {on_layout[a, b]:.4g} mm on the layout; give the layout the recordings were made "
                        "with, or check the positions' unit (x_um, y_um for micrometres)"
                        + (f"; the .cmp map is read at a pitch of {on_layout[on_layout > 0].min():.4g} mm: its "
                           "pitch_mm (a plan's [recordings] pitch_mm) sets the array's spacing"
                           if layout.cerebus else ""))
    # equal distances leave a rotation or a mirror image (Kabsch: the best proper rotation must match too)
    a, b = positions_mm - positions_mm.mean(0), layout.positions_mm - layout.positions_mm.mean(0)
    u, _, vt = np.linalg.svd(a.T @ b)
    rotation = u @ np.diag([1.0, np.sign(np.linalg.det(u @ vt)) or 1.0]) @ vt
    if np.abs(a @ rotation - b).max() > POSITION_TOLERANCE_MM:
        raise DataError(f"{path}: {where}: the electrode positions in the file are the mirror image of the array layout "
                        f"{layout.name!r} (e.g. rows counted from the top in one and from the bottom in the other); give "
                        "the layout the recordings were made with")


def _columnwise_pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a - a.mean(0)
    b = b - b.mean(0)
    denominator = np.sqrt((a ** 2).sum(0) * (b ** 2).sum(0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (a * b).sum(0) / denominator, np.nan)


def _preview(values, n: int = 8) -> str:
    values = [str(v) for v in values]
    return ", ".join(values[:n]) + (f", … ({len(values)} in all)" if len(values) > n else "")
