"""Electrode array layouts: electrode ids and their positions (mm) in the array's own frame.

The array frame has its origin at the centre of the array (the midpoint of the bounding box of the
electrode grid), x to the right along the columns and y up along the rows, as seen on the
Blackrock map (column 0 on the left, row 0 at the bottom).
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.spatial import cKDTree

from stimsim.lab.arrays.pose import ArrayPose
from stimsim.utilities.errors import ConfigError, FileFormatError

#: Electrode pitch of Utah arrays (Blackrock Microsystems), mm.
UTAH_PITCH_MM = 0.4
#: Utah grids stimsim builds: grid side → whether the four corners are unconnected.
UTAH_GRIDS = {"10x10": (10, True), "8x8": (8, False)}
#: Blackrock banks of 32 channels each, in channel order.
CMP_BANKS = "ABCD"
CMP_CHANNELS_PER_BANK = 32
#: Largest col / row of a .cmp grid position (a Utah array has 10; larger numbers are typing errors).
CMP_MAX_GRID = 1000
#: Position columns of a layout CSV (and position fields of a recordings file) by unit, with the factor to mm.
POSITION_UNITS = {"mm": (("x_mm", "y_mm"), 1.0), "um": (("x_um", "y_um"), 1e-3)}
#: Median nearest-neighbour spacing (mm) a layout can plausibly have: Utah arrays 0.4 mm, floating microelectrode
#: arrays 0.4–0.8 mm, dense shanks 0.02 mm. Above the upper bound positions are almost surely in µm read as mm,
#: below the lower one in m.
PLAUSIBLE_SPACING_MM = (0.005, 5.0)
#: :attr:`ArrayLayout.description` of a .cmp map whose first line after its comments is already an electrode line.
NO_CMP_DESCRIPTION = "(no description line: the map's electrode lines follow its comments)"


@dataclass(frozen=True, eq=False)
class ArrayLayout:
    """Electrode ids (text) and positions (mm, array frame, centre at 0, 0) of one array.

    Attributes
    ----------
    name : e.g. ``"utah_10x10"`` or the file the layout came from.
    electrode_ids : N unique ids as text, e.g. ``"1"`` … ``"96"``.
    positions_mm : (N, 2) float array, row i = (x, y) of electrode i.
    labels : optional N extra labels (e.g. a Blackrock ``elec12`` label), or empty.
    description : what the layout file says of itself (a .cmp map's description line), or empty.
    cerebus : for a .cmp map, N (bank, elec) pairs — bank ``"A"``–``"D"``, elec 1–32 — or empty.
    """

    name: str
    electrode_ids: tuple
    positions_mm: np.ndarray
    labels: tuple = ()
    description: str = ""
    cerebus: tuple = ()

    def __post_init__(self):
        ids = tuple(str(i) for i in self.electrode_ids)
        if not ids:
            raise ValueError(f"array {self.name!r}: a layout needs at least one electrode")
        if any(not i.strip() for i in ids):
            raise ValueError(f"array {self.name!r}: electrode ids must be non-empty text")
        seen, repeated = set(), []
        for i in ids:
            if i in seen:
                repeated.append(i)
            seen.add(i)
        if repeated:
            raise ValueError(f"array {self.name!r}: electrode ids must be unique; repeated: {sorted(set(repeated))}")
        positions = np.asarray(self.positions_mm, dtype=np.float64)
        if positions.shape != (len(ids), 2):
            raise ValueError(f"array {self.name!r}: positions_mm must have shape ({len(ids)}, 2), got {positions.shape}")
        if not np.all(np.isfinite(positions)):
            raise ValueError(f"array {self.name!r}: positions_mm holds NaN or infinite values")
        labels = tuple(str(label) for label in self.labels)
        if labels and len(labels) != len(ids):
            raise ValueError(f"array {self.name!r}: {len(labels)} labels for {len(ids)} electrodes")
        cerebus = tuple((str(bank), int(elec)) for bank, elec in self.cerebus)
        if cerebus and len(cerebus) != len(ids):
            raise ValueError(f"array {self.name!r}: {len(cerebus)} (bank, elec) pairs for {len(ids)} electrodes")
        positions.setflags(write=False)
        object.__setattr__(self, "electrode_ids", ids)
        object.__setattr__(self, "positions_mm", positions)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "cerebus", cerebus)

    def __len__(self) -> int:
        return len(self.electrode_ids)

    def index_of(self, electrode_id) -> int:
        """Row of ``electrode_id`` in this layout; an unknown id is a ConfigError."""
        try:
            return self.electrode_ids.index(str(electrode_id))
        except ValueError:
            raise ConfigError(f"array {self.name!r} has no electrode {str(electrode_id)!r}; "
                              f"ids: {_preview(self.electrode_ids)}") from None

    def subset(self, electrode_ids) -> "ArrayLayout":
        """The electrodes named by ``electrode_ids``, in that order (positions unchanged)."""
        rows = [self.index_of(i) for i in electrode_ids]
        return ArrayLayout(self.name, tuple(self.electrode_ids[r] for r in rows), self.positions_mm[rows],
                           tuple(self.labels[r] for r in rows) if self.labels else (), self.description,
                           tuple(self.cerebus[r] for r in rows) if self.cerebus else ())

    def cerebus_numbers(self, electrode_id) -> dict | None:
        """``{"channel", "bank", "elec"}`` of one electrode of a .cmp map (channel = bank index × 32 + elec, as the
        Cerebus system numbers channels), or None for a layout that has no banks."""
        if not self.cerebus:
            return None
        bank, elec = self.cerebus[self.index_of(electrode_id)]
        return {"channel": CMP_BANKS.index(bank) * CMP_CHANNELS_PER_BANK + elec, "bank": bank, "elec": elec}

    def position_of(self, electrode_id) -> tuple[float, float]:
        """(x, y) of one electrode in the array frame, mm."""
        x, y = self.positions_mm[self.index_of(electrode_id)]
        return float(x), float(y)

    def in_array_order(self, electrode_ids) -> list:
        """``electrode_ids`` by their place on the array — rows from the bottom, then columns from the left
        (positions to 1 nm; ties by id) — whatever order a file lists them in."""
        def place(electrode_id):
            x, y = self.position_of(electrode_id)
            return round(y, 6), round(x, 6), electrode_id

        return sorted((str(e) for e in electrode_ids), key=place)

    def on_sheet(self, pose: ArrayPose) -> np.ndarray:
        """(N, 2) sheet positions (mm) of the electrodes when the array sits at ``pose``."""
        return pose.apply(self.positions_mm)

    @property
    def radius_mm(self) -> float:
        """Largest distance of an electrode from the array centre, mm."""
        return float(np.max(np.linalg.norm(self.positions_mm, axis=1)))

    def to_dict(self) -> dict:
        out = {"name": self.name, "electrode_ids": list(self.electrode_ids),
               "positions_mm": self.positions_mm.tolist()}
        if self.labels:
            out["labels"] = list(self.labels)
        if self.description:
            out["description"] = self.description
        if self.cerebus:
            out["cerebus"] = [list(pair) for pair in self.cerebus]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ArrayLayout":
        return cls(data["name"], tuple(data["electrode_ids"]), np.asarray(data["positions_mm"]),
                   tuple(data.get("labels", ())), str(data.get("description", "")),
                   tuple(tuple(pair) for pair in data.get("cerebus", ())))

    @classmethod
    def from_positions(cls, name: str, electrode_ids, positions_mm, labels=(), description: str = "",
                       cerebus=()) -> "ArrayLayout":
        """A layout from positions in any frame, moved so the bounding box's midpoint is at 0, 0."""
        positions = np.asarray(positions_mm, dtype=np.float64)
        if positions.ndim != 2 or positions.shape[1:] != (2,) or len(positions) == 0:
            raise ValueError(f"array {name!r}: positions_mm must have shape (N, 2), got {positions.shape}")
        return cls(name, tuple(electrode_ids), positions - (positions.min(0) + positions.max(0)) / 2, tuple(labels),
                   description, tuple(cerebus))

    # --- files ----------------------------------------------------------------------------
    @classmethod
    def from_csv(cls, path, name: str | None = None) -> "ArrayLayout":
        """Read a layout from a CSV with columns ``electrode_id, x_mm, y_mm`` — or ``electrode_id, x_um, y_um``
        for positions in micrometres (converted to mm) — one row per electrode, positions in any frame (they are
        centred on the bounding box's midpoint). Read row by row with the csv module, so that every problem names
        its row; a layout whose electrodes sit implausibly far apart for mm (or on top of each other) is refused,
        see :func:`check_spacing_mm`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"array layout file not found: {path}")
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            if "electrode_id" not in columns:
                raise FileFormatError(path, f"missing column 'electrode_id'; an array layout CSV needs electrode_id "
                                            f"and x_mm, y_mm (or x_um, y_um) (found {columns})")
            units = [unit for unit, (pair, _) in POSITION_UNITS.items() if any(c in columns for c in pair)]
            if len(units) != 1 or not all(c in columns for c in POSITION_UNITS[units[0]][0]):
                raise FileFormatError(path, f"position columns: give x_mm, y_mm (millimetres) or x_um, y_um "
                                            f"(micrometres), one pair (found {columns})")
            position_columns, to_mm = POSITION_UNITS[units[0]]
            ids, positions = [], []
            for row_number, row in enumerate(reader, start=2):
                electrode_id = (row["electrode_id"] or "").strip()
                if not electrode_id:
                    raise FileFormatError(path, f"row {row_number}, column electrode_id: empty")
                if electrode_id in ids:
                    raise FileFormatError(path, f"row {row_number}, column electrode_id: {electrode_id!r} "
                                                f"repeats row {ids.index(electrode_id) + 2}")
                xy = []
                for column in position_columns:
                    try:
                        value = float(row[column])
                    except (TypeError, ValueError):
                        raise FileFormatError(path, f"row {row_number}, column {column}: {row[column]!r} "
                                                    "is not a number") from None
                    if not np.isfinite(value):
                        raise FileFormatError(path, f"row {row_number}, column {column}: must be finite")
                    xy.append(value * to_mm)
                ids.append(electrode_id)
                positions.append(xy)
        if not ids:
            raise FileFormatError(path, "no electrode rows")
        check_spacing_mm(np.asarray(positions), ids, path, f"columns {position_columns[0]}, {position_columns[1]}")
        return cls.from_positions(name or path.stem, ids, np.asarray(positions))

    @classmethod
    def from_cmp(cls, path, pitch_mm: float = UTAH_PITCH_MM, electrode_id: str = "channel",
                 name: str | None = None) -> "ArrayLayout":
        """Read a Blackrock map file (``.cmp``).

        Format: lines starting with ``//`` are comments; the first other line is the map's
        description (e.g. ``Cerebus mapping for array ... SN ...``) unless it reads as an electrode line
        (maps written by hand often have none); every further line is ``col row bank elec [label]``
        separated by tabs or spaces — col 0-based from left to right, row 0-based from bottom to top,
        bank A–D, elec 1–32 within the bank, label optional (e.g. ``elec12``; everything after the fourth
        field, so a label may hold spaces: ``elec 12``, ``Utah A 12``). Position = (col, row) ×
        ``pitch_mm``, moved so the middle of the grid's bounding box is at 0, 0. What was read of the
        first line is kept in :attr:`description` (the description, or a note that the map has none); the
        bank and elec of every electrode in :attr:`cerebus`.

        electrode_id : ``"channel"`` — the Cerebus channel number (bank index × 32 + elec, as the
            recording system numbers channels) — or ``"label"`` — the label column.
        """
        path = Path(path)
        if electrode_id not in ("channel", "label"):
            raise ConfigError(f"electrode_id must be 'channel' or 'label', got {electrode_id!r}")
        check_pitch_mm(pitch_mm)
        if not path.is_file():
            raise FileNotFoundError(f"array map file not found: {path}")
        ids, positions, labels, banks, cells = [], [], [], [], {}
        description = None
        channels, given_labels = {}, {}
        # utf-8-sig: a byte-order mark (as Windows tools write one) is no part of the first line
        for line_number, line in enumerate(path.read_text(encoding="utf-8-sig", errors="replace").splitlines(), 1):
            text = line.strip()
            if not text or text.startswith("//"):
                continue
            if description is None:
                description = NO_CMP_DESCRIPTION if _reads_as_electrode_line(text) else text
                if description is not NO_CMP_DESCRIPTION:
                    continue
            fields = _cmp_fields(text)
            if len(fields) < 4:
                raise FileFormatError(path, f"line {line_number}: expected 'col row bank elec [label]', got {text!r}")
            try:
                col, row = int(fields[0]), int(fields[1])
            except ValueError:
                raise FileFormatError(path, f"line {line_number}: col and row must be integers, got "
                                            f"{fields[0]!r}, {fields[1]!r}") from None
            bank = fields[2].upper()
            if bank not in CMP_BANKS:
                raise FileFormatError(path, f"line {line_number}, column bank: {fields[2]!r} is not one of "
                                            f"{list(CMP_BANKS)}")
            try:
                elec = int(fields[3])
            except ValueError:
                elec = -1
            if not 1 <= elec <= CMP_CHANNELS_PER_BANK:
                raise FileFormatError(path, f"line {line_number}, column elec: {fields[3]!r} is not an "
                                            f"integer in 1–{CMP_CHANNELS_PER_BANK}")
            if not (0 <= col <= CMP_MAX_GRID and 0 <= row <= CMP_MAX_GRID):
                raise FileFormatError(path, f"line {line_number}: col and row must be integers in 0–{CMP_MAX_GRID}, "
                                            f"got {fields[0][:20]!r}, {fields[1][:20]!r}")
            label = fields[4] if len(fields) > 4 else ""
            if "\ufffd" in label:  # bytes that are not UTF-8, read as U+FFFD
                raise FileFormatError(path, f"line {line_number}, column label: not UTF-8 text ({label!r}); save the "
                                            "map as UTF-8")
            if electrode_id == "label" and not label:
                raise FileFormatError(path, f"line {line_number}, column label: empty, but ids come from labels")
            this_id = label if electrode_id == "label" else str(CMP_BANKS.index(bank) * CMP_CHANNELS_PER_BANK + elec)
            if (col, row) in cells:
                raise FileFormatError(path, f"line {line_number}: grid position col {col}, row {row} repeats "
                                            f"line {cells[(col, row)]}")
            if this_id in ids:
                raise FileFormatError(path, f"line {line_number}: electrode {this_id!r} appears twice")
            # one channel is one electrode: two lines on one bank and elec would send two sites' stimulation to one
            for seen, key, what in ((channels, (bank, elec), f"bank {bank}, elec {elec}"),
                                    (given_labels, label, f"label {label!r}")):
                if key and key in seen:
                    raise FileFormatError(path, f"line {line_number}: {what} repeats line {seen[key]}; each "
                                                "electrode of a map has its own channel and label")
                seen[key] = line_number
            cells[(col, row)] = line_number
            ids.append(this_id)
            positions.append((col * pitch_mm, row * pitch_mm))
            labels.append(label)
            banks.append((bank, elec))
        if not ids:
            raise FileFormatError(path, "no electrode lines (expected 'col row bank elec label' lines, after a "
                                        "description line or directly after the // comments)")
        return cls.from_positions(name or path.stem, ids, np.asarray(positions, dtype=np.float64),
                                  labels if all(labels) else (), description, banks)


def check_spacing_mm(positions_mm, electrode_ids, path, where: str) -> None:
    """Refuse electrode positions read from ``path`` (``where``: its columns) as mm when their median
    nearest-neighbour spacing lies outside :data:`PLAUSIBLE_SPACING_MM` — µm read as mm puts a 0.4 mm Utah pitch at
    400 mm — or when two electrodes share one position. One electrode has no spacing to check."""
    positions = np.asarray(positions_mm, dtype=np.float64)
    if len(positions) < 2:
        return
    tree = cKDTree(positions)
    shared = sorted(tree.query_pairs(0.0))
    if shared:
        i, j = shared[0]
        raise FileFormatError(path, f"{where}: electrodes {electrode_ids[i]!r} and {electrode_ids[j]!r} "
                                    f"share the position {tuple(float(v) for v in positions[i])} mm")
    spacing = float(np.median(tree.query(positions, k=2)[0][:, 1]))
    low, high = PLAUSIBLE_SPACING_MM
    if spacing > high:
        raise FileFormatError(path, f"{where}: electrodes are {spacing:g} mm from their nearest neighbour (median), "
                                    f"implausible for an array in mm (> {high:g} mm); positions in micrometres go "
                                    "in x_um, y_um")
    if spacing < low:
        raise FileFormatError(path, f"{where}: electrodes are {spacing:g} mm from their nearest neighbour (median), "
                                    f"implausible for an array in mm (< {low:g} mm); give positions in mm "
                                    "(x_mm, y_mm) or micrometres (x_um, y_um)")


def _cmp_fields(text: str) -> list:
    """A .cmp electrode line's fields: col, row, bank, elec and, when there is one, the label — the rest of the
    line, spaces inside it kept (``0 1 A 1 elec 6`` → label ``elec 6``)."""
    return re.split(r"\s+", text.strip(), maxsplit=4)


def _reads_as_electrode_line(text: str) -> bool:
    """Whether a .cmp line has the form ``col row bank elec [label]`` (integers, a bank letter, an integer)."""
    fields = _cmp_fields(text)
    return (len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit()
            and fields[2].upper() in CMP_BANKS and fields[3].isdigit())


def check_pitch_mm(pitch_mm, name: str = "pitch_mm", what: str = "the electrode spacing") -> float:
    """A grid's electrode spacing as a float, or ConfigError naming ``name`` (the option as the user writes it) and
    ``what`` it is: a number of mm within :data:`PLAUSIBLE_SPACING_MM`."""
    low, high = PLAUSIBLE_SPACING_MM
    is_number = isinstance(pitch_mm, (int, float, np.integer, np.floating)) and not isinstance(pitch_mm, bool)
    if not (is_number and low <= pitch_mm <= high):
        shown = f"{pitch_mm:g}" if is_number else repr(pitch_mm)
        raise ConfigError(f"{name}: {what} in mm, from {low:g} to {high:g} (a Utah array's is {UTAH_PITCH_MM:g}; "
                          f"µm given as mm are 1000 times too many); got {shown}")
    return float(pitch_mm)


def utah_array(kind: str = "10x10", pitch_mm: float = UTAH_PITCH_MM) -> ArrayLayout:
    """A Utah array grid: ``"10x10"`` (96 electrodes, the four corners unconnected) or ``"8x8"`` (64).

    Ids ``"1"`` … ``"N"`` run row by row from the bottom-left electrode (left to right, then up),
    skipping unconnected corners; positions at ``pitch_mm`` spacing, centred on the grid.
    """
    if kind not in UTAH_GRIDS:
        raise ConfigError(f"unknown Utah array {kind!r}; choose one of {sorted(UTAH_GRIDS)}")
    check_pitch_mm(pitch_mm)
    side, corners_unconnected = UTAH_GRIDS[kind]
    corners = {(0, 0), (0, side - 1), (side - 1, 0), (side - 1, side - 1)} if corners_unconnected else set()
    cells = [(col, row) for row in range(side) for col in range(side) if (col, row) not in corners]
    positions = (np.asarray(cells, dtype=np.float64) - (side - 1) / 2) * pitch_mm
    return ArrayLayout(f"utah_{kind}", tuple(str(i + 1) for i in range(len(cells))), positions)


def cmp_options(layout: str, layout_ids: str = "channel", pitch_mm: float | None = None, where: str = "",
                names: tuple[str, str] = ("layout_ids", "pitch_mm")) -> dict:
    """The checked .cmp options of ``layout`` as :func:`load_layout` keywords.

    ``layout_ids`` ("channel" or "label") and ``pitch_mm`` (the electrode spacing, mm, within
    :data:`PLAUSIBLE_SPACING_MM`; default :data:`UTAH_PITCH_MM`) apply to a Blackrock ``.cmp`` map only; set for
    another layout, whose ids and positions are its own, they are refused. ``where`` (e.g. ``"plan.toml
    [recordings]"``) and ``names`` (the two options as the user writes them) place an error."""
    ids_name, pitch_name = names
    prefix = f"{where} " if where else ""
    if layout_ids not in ("channel", "label"):
        raise ConfigError(f"{prefix}{ids_name}: \"channel\" (a .cmp map's Cerebus channel numbers) or \"label\" (its "
                          f"label column), got {layout_ids!r}")
    if not str(layout).lower().endswith(".cmp"):
        if layout_ids != "channel":
            raise ConfigError(f"{prefix}{ids_name}: \"label\" takes the ids from a .cmp map's label column; the "
                              f"layout is {str(layout)!r}")
        if pitch_mm is not None:
            raise ConfigError(f"{prefix}{pitch_name}: spaces the grid of a .cmp map; the layout is {str(layout)!r}, "
                              "whose positions are its own")
        return {}
    pitch_mm = check_pitch_mm(UTAH_PITCH_MM if pitch_mm is None else pitch_mm, f"{prefix}{pitch_name}",
                              "the .cmp map's electrode spacing")
    return {"cmp_ids": layout_ids, "cmp_pitch_mm": pitch_mm}


def load_layout(spec, cmp_ids: str = "channel", cmp_pitch_mm: float = UTAH_PITCH_MM) -> ArrayLayout:
    """A layout from a Utah kind (``"10x10"``, ``"8x8"``, ``"utah_10x10"``) or a ``.csv``/``.cmp`` path; a .cmp's
    ids are its channel numbers or, with ``cmp_ids="label"``, its labels, and its grid is spaced ``cmp_pitch_mm``
    apart (see :meth:`ArrayLayout.from_cmp`)."""
    text = str(spec)
    kind = text[len("utah_"):] if text.startswith("utah_") else text
    if kind in UTAH_GRIDS:
        return utah_array(kind)
    path = Path(text)
    if path.suffix.lower() == ".cmp":
        return ArrayLayout.from_cmp(path, pitch_mm=cmp_pitch_mm, electrode_id=cmp_ids)
    if path.suffix.lower() == ".csv":
        return ArrayLayout.from_csv(path)
    raise ConfigError(f"array {text!r}: give a Utah kind {sorted(UTAH_GRIDS)} or a .csv / .cmp layout file")


def _preview(ids, n: int = 8) -> str:
    ids = list(ids)
    return ", ".join(ids[:n]) + (f", … ({len(ids)} in all)" if len(ids) > n else "")


