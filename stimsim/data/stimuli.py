"""Stimulus sets: images with stable identifiers and labels, and the image sets stimsim knows.

A :class:`StimulusSet` holds N images (float32 arrays in [0, 1], (H, W) gray or (H, W, 3) colour;
sizes may differ), N unique ``stimulus_id`` strings and labels (name → array of length N). Its
:meth:`StimulusSet.to_coords` gives the labels as xarray coordinates on a ``stimulus_id`` dimension.

Constructors: :func:`from_folder`, :func:`from_table` (CSV or HDF5), :func:`lfw_subset`,
:func:`fashion_mnist`, :func:`moeller2017`, :func:`floc`, :func:`imagenet_samples`; transform: :func:`pixel_noise` (Afraz et al. 2006).
The named sets are read through their data manifests (:mod:`stimsim.data.manifest`), so every
file is checksum-verified when it is read.

Over 500 lines: :class:`StimulusSet` and the readers of the named image sets, each short, share its checks of
ids, labels and pixel values.
"""
from __future__ import annotations

import csv
import gzip
import inspect
import re
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from stimsim.data.images import TransparentImageWarning, load_image
from stimsim.data.manifest import entry_path, entry_paths, get_entry
from stimsim.utilities.errors import ConfigError, FileFormatError, unreadable_reason
from stimsim.utilities.io import atomic_save
from stimsim.utilities.ordering import repeated

#: Repeated stimulus ids (or columns) an error names at most.
SHOWN_REPEATS = 5
#: File name endings read as images (case-insensitive).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif", ".webp")
TABLE_SUFFIXES_CSV = (".csv",)
TABLE_SUFFIXES_HDF5 = (".h5", ".hdf5", ".hdf")

#: Fashion-MNIST class names in class-index order (Xiao, Rasul & Vollgraf 2017).
FASHION_MNIST_CLASSES = ("tshirt_top", "trouser", "pullover", "dress", "coat",
                         "sandal", "shirt", "sneaker", "bag", "ankle_boot")
_FASHION_MNIST_COUNTS = {"train": 60000, "test": 10000}
_FASHION_MNIST_PREFIX = {"train": "train", "test": "t10k"}

#: Stimulus folders of Moeller et al. 2017 in the ``moeller2017`` data entry.
MOELLER2017_FOLDERS = ("Faces", "Objects", "Abstract_Faces", "Abstract_Houses", "Eliciting_Face_Response")
#: Drawing styles that prefix the identity in the abstract stimuli's file names.
_MOELLER_RENDERINGS = ("mooneyUD", "mooney", "linedrawing", "cartoon", "silhouette")
_MOELLER_NAME = re.compile(r"^ID_(?P<token>[^_]+)_(?P<rest>.*)-ORI_A(?P<az>-?\d+)_E(?P<el>-?\d+)(?:-.*)?$")
_MOELLER_EXPRESSION = re.compile(r"EXP_[\d.]+pct_(?P<expression>[A-Za-z]+)")

#: fLoc categories (folders of the ``floc`` data entry) and the domain each belongs to (Stigliani et al. 2015).
FLOC_DOMAINS = {"adult": "face", "child": "face", "body": "body", "limb": "body", "house": "place",
                "corridor": "place", "word": "character", "number": "character", "car": "object",
                "instrument": "object", "scrambled": "scrambled"}
FLOC_CATEGORIES = tuple(FLOC_DOMAINS)

LFW_SUBSET_FILE = "data/lfw_subset.npy"
_LFW_SUBSET_SHAPE = (200, 25, 25)


@dataclass(frozen=True, eq=False)
class StimulusSet:
    """Images with unique ids and per-image labels.

    Attributes
    ----------
    name : name of the set (used in results and file names).
    images : list of N float32 arrays with values in [0, 1], (H, W) or (H, W, 3).
    stimulus_id : N unique strings.
    labels : label name → array of length N (strings or numbers); ``"stimulus_id"`` is reserved.
    """

    name: str
    images: list
    stimulus_id: np.ndarray
    labels: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a stimulus set needs a non-empty name, got {self.name!r}")
        ids = list(self.stimulus_id)
        if not all(isinstance(i, str) for i in ids):
            raise ValueError("stimulus_id values must be strings")
        if len(ids) != len(self.images):
            raise ValueError(f"{len(self.images)} images but {len(ids)} stimulus ids")
        duplicates = repeated(map(str, ids), at_most=SHOWN_REPEATS)
        if duplicates:
            raise ValueError(f"stimulus ids must be unique; repeated: {duplicates}")
        images = [_unit_image(image, ids[i]) for i, image in enumerate(self.images)]
        labels = {}
        for label, values in self.labels.items():
            if not isinstance(label, str) or not label or label == "stimulus_id":
                raise ValueError(f"label names must be non-empty strings other than 'stimulus_id', got {label!r}")
            values = np.asarray(values)
            if values.ndim != 1 or len(values) != len(ids):
                raise ValueError(f"label '{label}' needs one value per image ({len(ids)}), got shape {values.shape}")
            if values.dtype == object:
                raise ValueError(f"label '{label}' must hold strings or numbers, not Python objects")
            labels[label] = values
        object.__setattr__(self, "images", images)
        object.__setattr__(self, "stimulus_id", np.asarray(ids, dtype=str))
        object.__setattr__(self, "labels", labels)

    def __len__(self) -> int:
        return len(self.images)

    def subset(self, selection, name: str | None = None) -> "StimulusSet":
        """The images picked by ``selection``: a boolean mask of length N or integer indices."""
        selection = np.asarray(selection)
        if selection.dtype == bool:
            if selection.shape != (len(self),):
                raise ValueError(f"a boolean mask must have shape ({len(self)},), got {selection.shape}")
            indices = np.flatnonzero(selection)
        elif selection.size == 0:
            indices = np.zeros(0, dtype=np.int64)
        elif np.issubdtype(selection.dtype, np.integer) and selection.ndim == 1:
            if selection.min() < -len(self) or selection.max() >= len(self):
                raise ValueError(f"indices must lie in [-{len(self)}, {len(self) - 1}]")
            indices = selection
        else:
            raise ValueError("select with a 1-D boolean mask or 1-D integer indices")
        return StimulusSet(
            name=name or self.name,
            images=[self.images[i] for i in indices],
            stimulus_id=self.stimulus_id[indices],
            labels={key: values[indices] for key, values in self.labels.items()},
        )

    @classmethod
    def concat(cls, *sets: "StimulusSet", name: str | None = None) -> "StimulusSet":
        """One set holding ``sets`` in order; they must share their label names and their ids must
        stay unique. ``name`` defaults to the set names joined by ``+``."""
        if not sets:
            raise ValueError("concat needs at least one stimulus set")
        if not all(isinstance(s, StimulusSet) for s in sets):
            raise ValueError("concat accepts StimulusSet objects only")
        keys = set(sets[0].labels)
        for other in sets[1:]:
            if set(other.labels) != keys:
                raise ValueError(f"cannot concatenate sets with different labels: '{sets[0].name}' has "
                                 f"{sorted(keys)}, '{other.name}' has {sorted(other.labels)}")
        labels = {}
        for key in sets[0].labels:
            parts = [s.labels[key] for s in sets]
            if len({"string" if p.dtype.kind in "US" else "number" for p in parts}) > 1:
                raise ValueError(f"label '{key}' is text in some sets and numeric in others")
            labels[key] = np.concatenate(parts)
        return cls(
            name=name or "+".join(s.name for s in sets),
            images=[image for s in sets for image in s.images],
            stimulus_id=np.concatenate([s.stimulus_id for s in sets]),
            labels=labels,
        )

    def with_labels(self, **labels) -> "StimulusSet":
        """A copy with ``labels`` added (or replaced), each of length N."""
        return StimulusSet(name=self.name, images=self.images, stimulus_id=self.stimulus_id,
                           labels={**self.labels, **labels})

    def to_coords(self) -> dict:
        """``stimulus_id`` and every label as xarray coordinates on the ``stimulus_id`` dimension,
        e.g. ``xr.DataArray(values, dims=("stimulus_id", ...), coords=stimuli.to_coords())``."""
        coords = {"stimulus_id": ("stimulus_id", self.stimulus_id)}
        coords.update({key: ("stimulus_id", values) for key, values in self.labels.items()})
        return coords

    def to_hdf5(self, path) -> Path:
        """Write the set to an HDF5 file that :func:`from_table` reads back: dataset ``images``
        (N, H, W[, 3]) float32, ``stimulus_id`` and one 1-D dataset per label. All images must
        share their shape."""
        import h5py

        shapes = {image.shape for image in self.images}
        if len(shapes) != 1:
            raise ValueError(f"to_hdf5 needs images of one shape, found {sorted(shapes)}; resize them first")
        reserved = {"images", "stimulus_id"} & set(self.labels)
        if reserved:
            raise ValueError(f"label name(s) {sorted(reserved)} clash with the HDF5 layout's datasets")
        text = h5py.string_dtype("utf-8")

        def write(tmp):
            with h5py.File(tmp, "w") as handle:
                handle.attrs["name"] = self.name
                handle.create_dataset("images", data=np.stack(self.images).astype(np.float32), compression="gzip")
                handle.create_dataset("stimulus_id", data=self.stimulus_id.astype(object), dtype=text)
                for key, values in self.labels.items():
                    if values.dtype.kind in "US":
                        handle.create_dataset(key, data=values.astype(str).astype(object), dtype=text)
                    else:
                        handle.create_dataset(key, data=values)

        return atomic_save(path, write)



def _unit_image(image, stimulus_id: str) -> np.ndarray:
    array = np.asarray(image)
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"image '{stimulus_id}' has dtype {array.dtype}; images must be float arrays in [0, 1] "
                         f"(divide 8-bit images by 255)")
    if not (array.ndim == 2 or (array.ndim == 3 and array.shape[-1] == 3)):
        raise ValueError(f"image '{stimulus_id}' has shape {array.shape}; expected (H, W) or (H, W, 3)")
    if array.size == 0 or not np.all(np.isfinite(array)) or array.min() < 0.0 or array.max() > 1.0:
        raise ValueError(f"image '{stimulus_id}' must be non-empty with finite values in [0, 1]")
    return array.astype(np.float32, copy=False)


# --------------------------------------------------------------------------- folders and tables


def _is_image_file(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


def from_folder(path, label_from: str | None = "subfolder", name: str | None = None) -> StimulusSet:
    """Every image file under ``path`` (recursively; suffixes :data:`IMAGE_SUFFIXES`, hidden files
    skipped), sorted by relative path, which is also its ``stimulus_id``.

    Parameters
    ----------
    label_from : ``"subfolder"`` — label ``category`` = the first-level subfolder an image sits in
        (every image must sit in one); ``"none"`` (or None) — no labels.
    name : set name; default the folder's name.
    """
    if label_from not in ("subfolder", "none", None):
        raise ValueError(f"label_from must be \"subfolder\" (label 'category' from each image's first-level "
                         f"subfolder) or \"none\" (no labels), got {label_from!r}")
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"stimulus folder not found: {root}")
    files = _folder_image_files(root)
    if not files:
        raise FileFormatError(root, f"no image files ({', '.join(IMAGE_SUFFIXES)}) in this folder")
    ids = [p.relative_to(root).as_posix() for p in files]
    labels = {}
    if label_from == "subfolder":
        loose = [i for i in ids if "/" not in i]
        if loose:
            raise FileFormatError(root, f"label_from = \"subfolder\" (the default) needs every image inside a "
                                        f"subfolder, its class; found {len(loose)} at the top level, e.g. {loose[0]} "
                                        "(label_from = \"none\" reads the images without labels)")
        labels["category"] = np.asarray([i.split("/", 1)[0] for i in ids])
    return StimulusSet(name=name or root.name, images=_load_images(files, root),
                       stimulus_id=np.asarray(ids), labels=labels)


def _folder_image_files(root: Path) -> list[Path]:
    """The image files of :func:`from_folder`, in its order."""
    return sorted((p for p in root.rglob("*") if _is_image_file(p)), key=lambda p: p.relative_to(root).as_posix())


def _table_image_path(table: Path, value: str) -> Path:
    """An image file named in a CSV table's ``path`` column: absolute, or relative to the table's folder."""
    image_path = Path(value.strip())
    return image_path if image_path.is_absolute() else table.parent / image_path


def source_files(entry: dict) -> list[Path]:
    """The files of a lab's own stimulus source (``[[stimuli]]``-style entry) that its images are read from: a
    table and the image files a CSV table names, or every image file of a folder; none for the named data sets
    (their files are verified by the manifests' checksums) or for paths that do not exist (loading says so)."""
    path = Path(entry["path"]) if isinstance(entry.get("path"), (str, Path)) else None
    if path is None:
        return []
    if entry.get("source") == "folder" and path.is_dir():
        return _folder_image_files(path)
    if entry.get("source") != "table" or not path.is_file():
        return []
    if path.suffix.lower() not in TABLE_SUFFIXES_CSV:
        return [path]
    with open(path, newline="", encoding="utf-8-sig") as handle:
        named = [_table_image_path(path, row.get("path") or "") for row in csv.DictReader(handle)]
    return [path, *(image for image in named if image.is_file())]


def from_table(path, name: str | None = None) -> StimulusSet:
    """A stimulus set from a table file.

    CSV (``.csv``): columns ``stimulus_id`` and ``path`` (image file, relative to the CSV's folder
    or absolute); every other column becomes a label (integers, floats or text, whichever all its
    values parse as). HDF5 (``.h5``, ``.hdf5``, ``.hdf``): dataset ``images`` (N, H, W) or
    (N, H, W, 1|3), uint8 (0–255) or float (0–1); ``stimulus_id`` (N strings); every other dataset
    must be 1-D of length N and becomes a label. ``name`` defaults to the file's ``name`` attribute
    (HDF5) or its stem.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"stimulus table not found: {path}")
    suffix = path.suffix.lower()
    if suffix in TABLE_SUFFIXES_CSV:
        return _from_csv(path, name)
    if suffix in TABLE_SUFFIXES_HDF5:
        return _from_hdf5(path, name)
    raise ValueError(f"unknown table type '{path.suffix}' for {path}; "
                     f"use one of {TABLE_SUFFIXES_CSV + TABLE_SUFFIXES_HDF5}")


def _from_csv(path: Path, name: str | None) -> StimulusSet:
    # Read with the csv module rather than pandas: pandas fills the values missing from a short row
    # with empty text, so a row that lost a value could not be told from one with an empty value.
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        columns = reader.fieldnames or []
        rows = list(reader)
    repeated_columns = repeated((column.strip() for column in columns), at_most=SHOWN_REPEATS)
    if repeated_columns:  # the csv module would keep the last column of a name and drop the others unseen
        raise FileFormatError(path, f"column(s) {repeated_columns} appear more than once in the header; name each column once")
    missing = {"stimulus_id", "path"} - set(columns)
    if missing:
        raise FileFormatError(path, f"missing column(s) {sorted(missing)}; a stimulus table needs "
                                    f"'stimulus_id' and 'path'")
    if not rows:
        raise FileFormatError(path, "the table has no rows")
    if any(None in row or any(v is None for v in row.values()) for row in rows):
        raise FileFormatError(path, "every row must have exactly one value per column")
    ids = [row["stimulus_id"].strip() for row in rows]
    if any(not i for i in ids):
        raise FileFormatError(path, "empty stimulus_id")
    duplicates = repeated(map(str, ids), at_most=SHOWN_REPEATS)
    if duplicates:
        raise FileFormatError(path, f"stimulus ids must be unique; repeated: {duplicates}")
    image_paths = []
    for row_number, row in enumerate(rows, start=2):
        image_path = _table_image_path(path, row["path"])
        if not image_path.is_file():
            raise FileFormatError(path, f"line {row_number}: image file {image_path} not found")
        image_paths.append(image_path)
    images = _load_images(image_paths, path)
    labels = {column: _parse_column([row[column] for row in rows])
              for column in columns if column not in ("stimulus_id", "path")}
    return StimulusSet(name=name or path.stem, images=images, stimulus_id=np.asarray(ids), labels=labels)


def _load_images(paths: list[Path], source: Path) -> list[np.ndarray]:
    """The image files of one folder or table, with one warning for all those with transparent pixels."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TransparentImageWarning)
        images = [load_image(image_path) for image_path in paths]
    transparent = [w for w in caught if issubclass(w.category, TransparentImageWarning)]
    for other in caught:
        if not issubclass(other.category, TransparentImageWarning):
            warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    if transparent:
        warnings.warn(f"{source}: {len(transparent)} of {len(paths)} images have transparent pixels (the first: "
                      f"{transparent[0].message.path}); their alpha is dropped, so those pixels show the colour "
                      "stored under them (flatten the images onto the background the monkey saw)", stacklevel=3)
    return images


def _parse_column(values: list[str]) -> np.ndarray:
    stripped = [v.strip() for v in values]
    if any("_" in v for v in stripped):  # Python's int() and float() would read "1_0" as 10
        return np.asarray(stripped, dtype=str)
    try:
        return np.asarray([int(v) for v in stripped], dtype=np.int64)
    except ValueError:
        pass
    try:
        return np.asarray([float(v) if v else np.nan for v in stripped], dtype=np.float64)
    except ValueError:
        return np.asarray(stripped, dtype=str)


def _from_hdf5(path: Path, name: str | None) -> StimulusSet:
    import h5py

    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise FileFormatError(path, f"cannot open as HDF5 ({exc})") from None
    with handle:
        for required in ("images", "stimulus_id"):
            if required not in handle or not isinstance(handle[required], h5py.Dataset):
                raise FileFormatError(path, f"missing dataset '{required}'")
        images = handle["images"][()]
        ids = _read_strings(handle["stimulus_id"], path)
        labels = {}
        for key, item in handle.items():
            if key in ("images", "stimulus_id"):
                continue
            if not isinstance(item, h5py.Dataset) or item.ndim != 1 or len(item) != len(ids):
                raise FileFormatError(path, f"'{key}' must be a 1-D dataset with one value per stimulus "
                                            f"({len(ids)}) to be read as a label")
            labels[key] = _read_strings(item, path) if h5py.check_string_dtype(item.dtype) else item[()]
        set_name = name or str(handle.attrs.get("name", path.stem))
    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    if not (images.ndim == 3 or (images.ndim == 4 and images.shape[-1] == 3)):
        raise FileFormatError(path, f"'images' must be (N, H, W) or (N, H, W, 1|3), got shape {images.shape}")
    if len(images) != len(ids):
        raise FileFormatError(path, f"{len(images)} images but {len(ids)} stimulus ids")
    if not len(ids):
        raise FileFormatError(path, "the table has no images")
    if images.dtype == np.uint8:
        images = images.astype(np.float32) / 255.0
    elif np.issubdtype(images.dtype, np.floating):
        if images.size and (not np.all(np.isfinite(images)) or images.min() < 0 or images.max() > 1):
            raise FileFormatError(path, "float images must have finite values in [0, 1]")
    else:
        raise FileFormatError(path, f"'images' must be uint8 or float, got {images.dtype}")
    duplicates = repeated(map(str, ids), at_most=SHOWN_REPEATS)
    if duplicates:
        raise FileFormatError(path, f"stimulus ids must be unique; repeated: {duplicates}")
    return StimulusSet(name=set_name, images=list(images), stimulus_id=np.asarray(ids), labels=labels)


def _read_strings(dataset, path: Path) -> list[str]:
    import h5py

    if not h5py.check_string_dtype(dataset.dtype) or dataset.ndim != 1:
        raise FileFormatError(path, f"'{dataset.name.lstrip('/')}' must be a 1-D dataset of strings")
    return [str(v) for v in dataset.asstr()[()]]


# --------------------------------------------------------------------------- named image sets


def lfw_subset(mirror=None) -> StimulusSet:
    """scikit-image's 200 LFW crops (25×25 gray): 100 faces then 100 non-face background patches
    (Huang et al. 2007, 2012), read through the verified ``lfw_subset`` data entry.

    Labels: ``category`` ("face" / "nonface"). Ids: ``lfw_face_000`` … ``lfw_nonface_099``.
    """
    path = entry_path("lfw_subset", LFW_SUBSET_FILE, mirror=mirror)
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise FileFormatError(path, f"cannot read as a numpy array ({unreadable_reason(exc)})") from None
    if array.shape != _LFW_SUBSET_SHAPE or not np.issubdtype(array.dtype, np.floating):
        raise FileFormatError(path, f"expected a float array of shape {_LFW_SUBSET_SHAPE}, "
                                    f"got {array.dtype} {array.shape}")
    n_faces = _LFW_SUBSET_SHAPE[0] // 2
    categories = ["face"] * n_faces + ["nonface"] * n_faces
    ids = [f"lfw_{category}_{i % n_faces:03d}" for i, category in enumerate(categories)]
    return StimulusSet(name="lfw_subset", images=[image.astype(np.float32) for image in array],
                       stimulus_id=np.asarray(ids), labels={"category": np.asarray(categories)})


def _read_idx(path: Path, expected_ndim: int) -> np.ndarray:
    """Read a gzipped idx file of unsigned bytes (LeCun's MNIST format) as a uint8 array."""
    try:
        with gzip.open(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError) as exc:
        raise FileFormatError(path, f"cannot decompress ({exc})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08 or data[3] != expected_ndim:
        raise FileFormatError(path, f"not an idx file of unsigned bytes with {expected_ndim} dimension(s)")
    header_bytes = 4 + 4 * expected_ndim
    dims = tuple(int.from_bytes(data[4 + 4 * k: 8 + 4 * k], "big") for k in range(expected_ndim))
    if len(data) != header_bytes + int(np.prod(dims)):
        raise FileFormatError(path, f"header announces dims {dims} but the file holds "
                                    f"{len(data) - header_bytes} data bytes")
    return np.frombuffer(data, dtype=np.uint8, offset=header_bytes).reshape(dims)


def fashion_mnist(split: str = "train", n_per_class: int | None = None, seed: int = 0,
                  mirror=None) -> StimulusSet:
    """Fashion-MNIST (Xiao, Rasul & Vollgraf 2017) 28×28 gray images from the verified
    ``fashion_mnist`` data entry. Labels: ``category`` (:data:`FASHION_MNIST_CLASSES`),
    ``class_index`` (0–9). Ids: ``fashion_mnist_<split>_<index in the file, 5 digits>``.

    Parameters
    ----------
    split : ``"train"`` (60,000) or ``"test"`` (10,000).
    n_per_class : draw this many images per class at random (without replacement, generator
        seeded by ``seed``), or None for all; kept in file order.
    """
    if split not in _FASHION_MNIST_COUNTS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if n_per_class is not None and (isinstance(n_per_class, bool) or not isinstance(n_per_class, (int, np.integer))
                                    or n_per_class < 1):
        raise ValueError(f"n_per_class must be a positive integer (or left out, for all), got {n_per_class!r}")
    prefix = _FASHION_MNIST_PREFIX[split]
    images_path, labels_path = entry_paths(
        "fashion_mnist", [f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz"], mirror=mirror)
    classes = _read_idx(labels_path, 1)
    images = _read_idx(images_path, 3)
    expected = _FASHION_MNIST_COUNTS[split]
    if len(classes) != expected or images.shape != (expected, 28, 28):
        raise FileFormatError(images_path, f"expected {expected} images of 28×28 and as many labels, got "
                                           f"images {images.shape} and {len(classes)} labels")
    if classes.max() >= len(FASHION_MNIST_CLASSES):
        raise FileFormatError(labels_path, f"class indices must be 0–9, found {int(classes.max())}")
    if n_per_class is None:
        selected = np.arange(expected)
    else:
        rng = np.random.default_rng(seed)
        picks = []
        for class_index in range(len(FASHION_MNIST_CLASSES)):
            members = np.flatnonzero(classes == class_index)
            if n_per_class > len(members):
                raise ValueError(f"n_per_class={n_per_class} exceeds the {len(members)} '{split}' images of "
                                 f"class '{FASHION_MNIST_CLASSES[class_index]}'")
            picks.append(rng.choice(members, size=n_per_class, replace=False))
        selected = np.sort(np.concatenate(picks))
    chosen_classes = classes[selected].astype(np.int64)
    return StimulusSet(
        name=f"fashion_mnist_{split}",
        images=[images[i].astype(np.float32) / 255.0 for i in selected],
        stimulus_id=np.asarray([f"fashion_mnist_{split}_{i:05d}" for i in selected]),
        labels={"category": np.asarray(FASHION_MNIST_CLASSES)[chosen_classes], "class_index": chosen_classes},
    )


def _moeller_labels(rel: str) -> dict:
    """Labels of one Moeller et al. 2017 stimulus from its path ``<folder>/ID_<...>.<ext>``."""
    folder, file_name = rel.split("/", 1)
    match = _MOELLER_NAME.match(PurePosixPath(file_name).stem)
    if match is None:
        raise FileFormatError(rel, "file name does not follow the ID_<name>_<...>-ORI_A<az>_E<el> pattern")
    token, rest = match["token"], match["rest"]
    rendering = next((r for r in _MOELLER_RENDERINGS if re.fullmatch(rf"{r}\d+", token)), None)
    if rendering is None:
        identity, rendering = token, "photo"
    else:
        identity = rest.split("_", 1)[0]
    expression = _MOELLER_EXPRESSION.search(rest)
    if expression is not None or "homo_sapiens" in rest:
        category = "face"
    elif "-house" in rest:
        category = "house"
    elif "objects-none" in rest:
        category = "object"
    else:
        raise FileFormatError(rel, "cannot tell whether this stimulus shows a face, a house or an object")
    return {
        "stimulus_set": folder,
        "category": category,
        "identity": identity,
        "rendering": rendering,
        "expression": expression["expression"] if expression is not None else "",
        "view": f"A{match['az']}_E{match['el']}",
        "azimuth_deg": float(match["az"]),
        "elevation_deg": float(match["el"]),
    }


def moeller2017(folders=("Faces", "Objects"), mirror=None) -> StimulusSet:
    """The stimulus images of Moeller, Crapse, Chang & Tsao 2017, from the verified ``moeller2017``
    data entry (a mirror or the cache; see the entry's instructions).

    folders : any of :data:`MOELLER2017_FOLDERS` (a single name is accepted too).
    Ids: the path in the entry, e.g. ``Faces/ID_r001_130115-EXP_033.0pct_Anger-ORI_A000_E010.jpg``.
    Labels: ``stimulus_set`` (folder); ``category`` ("face", "object", "house"); ``identity``
    (Faces: "r001" …; objects: e.g. "alarmclock156"; abstract stimuli: the person or house drawn,
    e.g. "BR", "house09"); ``rendering`` ("photo", "cartoon", "linedrawing", "mooney", "mooneyUD"
    = upside-down Mooney, "silhouette"); ``expression`` (Anger, Disgust, Fear, None = neutral,
    Sad, Surprise; "" for stimuli without one); ``view`` (e.g. "A-45_E00"), ``azimuth_deg`` and
    ``elevation_deg`` parsed from it.
    """
    folders = (folders,) if isinstance(folders, str) else tuple(folders)
    unknown = [f for f in folders if f not in MOELLER2017_FOLDERS]
    if unknown or not folders or len(set(folders)) != len(folders):
        raise ValueError(f"folders must be distinct names from {list(MOELLER2017_FOLDERS)}, got {list(folders)}")
    all_rels = sorted(spec.path for spec in get_entry("moeller2017").files)
    rels = [rel for folder in folders for rel in all_rels
            if rel.split("/", 1)[0] == folder and PurePosixPath(rel).suffix.lower() in IMAGE_SUFFIXES]
    paths = entry_paths("moeller2017", rels, mirror=mirror)
    per_image = [_moeller_labels(rel) for rel in rels]
    labels = {key: np.asarray([row[key] for row in per_image]) for key in per_image[0]}
    return StimulusSet(name="moeller2017_" + "+".join(folders), images=[load_image(p) for p in paths],
                       stimulus_id=np.asarray(rels), labels=labels)


def _count_or_none(value, key: str):
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
        raise ValueError(f"{key} must be a positive integer (or left out, for all), got {value!r}")
    return value


def floc(categories=FLOC_CATEGORIES, n_per_category: int | None = None, mirror=None) -> StimulusSet:
    """The fLoc localizer images (Stigliani, Weiner & Grill-Spector 2015; 144 gray 256 px images per
    category) from the verified ``floc`` data entry.

    categories : any of :data:`FLOC_CATEGORIES` (default all eleven; a single name is accepted too).
    n_per_category : the first this many images of each category in path order (at most its count), or None for all.
    Ids: the path in the entry, e.g. ``adult/adult-1.jpg``. Labels: ``category`` (the fLoc folder) and
    ``domain`` (:data:`FLOC_DOMAINS`: face, body, place, character, object, scrambled).
    """
    categories = (categories,) if isinstance(categories, str) else tuple(categories)
    unknown = [c for c in categories if c not in FLOC_DOMAINS]
    if unknown or not categories or len(set(categories)) != len(categories):
        raise ValueError(f"categories must be distinct names from {list(FLOC_CATEGORIES)}, got {list(categories)}")
    _count_or_none(n_per_category, "n_per_category")
    all_rels = [spec.path for spec in get_entry("floc").files]
    rels = []
    for category in categories:
        held = [r for r in all_rels if r.split("/", 1)[0] == category]
        if n_per_category is not None and n_per_category > len(held):
            raise ValueError(f"n_per_category = {n_per_category} asks for more images of category {category!r} than "
                             f"the {len(held)} it has; give at most {len(held)}, or leave n_per_category out for all")
        rels += held[:n_per_category]
    paths = entry_paths("floc", rels, mirror=mirror)
    folder = [rel.split("/", 1)[0] for rel in rels]
    return StimulusSet(name="floc", images=[load_image(p) for p in paths], stimulus_id=np.asarray(rels),
                       labels={"category": np.asarray(folder), "domain": np.asarray([FLOC_DOMAINS[c] for c in folder])})


def imagenet_samples(limit: int | None = None, mirror=None) -> StimulusSet:
    """One photograph per ImageNet-1k class (the verified ``imagenet_samples`` data entry), in class order.

    limit : the first this many classes (at most 1,000), or None for all 1,000. Ids: the file name, e.g.
    ``n01440764_tench.jpg``. Labels: ``wnid``, ``class_index`` (position of the wnid in sorted order, the
    order of an ImageNet classifier's outputs) and ``category`` (the class name of the file name).
    """
    _count_or_none(limit, "limit")
    every = sorted(spec.path for spec in get_entry("imagenet_samples").files)
    if limit is not None and limit > len(every):
        raise ValueError(f"limit = {limit} asks for more ImageNet classes than the {len(every)} the samples have; "
                         f"give at most {len(every)}, or leave limit out for all")
    rels = every[:limit]
    wnids = [rel.split("_", 1)[0] for rel in rels]
    order = {wnid: i for i, wnid in enumerate(sorted(rel.split("_", 1)[0] for rel in every))}
    paths = entry_paths("imagenet_samples", rels, mirror=mirror)
    return StimulusSet(name="imagenet_samples", images=[load_image(p) for p in paths], stimulus_id=np.asarray(rels),
                       labels={"wnid": np.asarray(wnids), "class_index": np.asarray([order[w] for w in wnids]),
                               "category": np.asarray([PurePosixPath(rel).stem.split("_", 1)[1] for rel in rels])})


# --------------------------------------------------------------------------- transforms


def pixel_noise(stimuli: StimulusSet, signal_percent_levels, seed: int = 0) -> StimulusSet:
    """Noisy copies of every image at each visual-signal level (Afraz, Kiani & Esteky 2006,
    Nature 442:692: signal level = percentage of image pixels not replaced by noise).

    For signal level s (%) a random set of exactly round((1 − s/100)·H·W) pixel positions is
    replaced by independent uniform noise in [0, 1] (every channel of a colour pixel gets its own
    noise value); 100 % returns the original, 0 % pure noise independent of the image. The noise
    depends only on (seed, s, stimulus_id), so a stimulus gets the same noisy copy in any set.
    Give it the images at the size and colour the network receives
    (:meth:`stimsim.models.preprocessing.Preprocessing.geometry`): a resize after the noise would
    blur it into the kept pixels or enlarge it, and the network would not see level s.

    Returns one copy per level, level-major, ids ``<stimulus_id>_signal<s>``; labels keep the
    originals' and gain ``signal_percent``.
    """
    if not isinstance(stimuli, StimulusSet):
        raise ValueError("pixel_noise needs a StimulusSet")
    if "signal_percent" in stimuli.labels:
        raise ValueError(f"'{stimuli.name}' already has a 'signal_percent' label; add noise to the clean images")
    levels = np.atleast_1d(np.asarray(signal_percent_levels))
    if levels.size == 0 or levels.ndim != 1 or levels.dtype == bool or not np.issubdtype(levels.dtype, np.number):
        raise ValueError(f"signal_percent_levels must be a non-empty list of numbers, got {signal_percent_levels!r}")
    levels = levels.astype(np.float64)
    if not np.all(np.isfinite(levels)) or levels.min() < 0 or levels.max() > 100:
        raise ValueError(f"signal levels are percentages in [0, 100], got {levels.tolist()}")
    if len(np.unique(levels)) != len(levels):
        raise ValueError(f"signal levels must be distinct, got {levels.tolist()}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    images, ids = [], []
    for level in levels:
        level_key = int(round(level * 1000))
        for image, stimulus_id in zip(stimuli.images, stimuli.stimulus_id):
            rng = np.random.default_rng([int(seed), level_key, zlib.crc32(str(stimulus_id).encode("utf-8"))])
            n_pixels = image.shape[0] * image.shape[1]
            n_replaced = int(np.floor((1.0 - level / 100.0) * n_pixels + 0.5))
            positions = rng.choice(n_pixels, size=n_replaced, replace=False)
            noisy = image.copy()
            flat = noisy.reshape(n_pixels, -1)
            flat[positions] = rng.random((n_replaced, flat.shape[1]), dtype=np.float32)
            images.append(noisy)
            ids.append(f"{stimulus_id}_signal{level:g}")
    labels = {key: np.tile(values, len(levels)) for key, values in stimuli.labels.items()}
    labels["signal_percent"] = np.repeat(levels, len(stimuli))
    return StimulusSet(name=f"{stimuli.name}_pixel_noise", images=images, stimulus_id=np.asarray(ids),
                       labels=labels)


#: Stimulus sources a configuration can name, with the constructor that builds each.
STIMULUS_SOURCES = {
    "folder": from_folder,
    "table": from_table,
    "lfw_subset": lfw_subset,
    "fashion_mnist": fashion_mnist,
    "moeller2017": moeller2017,
    "floc": floc,
    "imagenet_samples": imagenet_samples,
}


def load_stimulus_source(entry: dict, where: str | None = None) -> StimulusSet:
    """Build a stimulus set from a configuration table: ``{"source": NAME, **constructor kwargs}``, and
    optionally ``labels``, text labels given to every image of the set (``{domain = "imagenet"}``: a label
    that another set has, so that sets combined in one list keep it). With ``where`` (e.g.
    ``"train.toml [data] sets[0]"``) every problem with the entry, and a folder or table its path names that
    does not exist, is a ConfigError placed there.

    >>> load_stimulus_source({"source": "lfw_subset"}).name
    'lfw_subset'
    """
    if where is None:
        return _build_stimulus_source(entry)
    try:
        return _build_stimulus_source(entry)
    except (ConfigError, ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except FileNotFoundError as exc:  # a folder or table named by the entry's path
        raise ConfigError(f"{where} path: {exc}") from None


def _build_stimulus_source(entry: dict) -> StimulusSet:
    entry = dict(entry)
    source = entry.pop("source", None)
    constant_labels = entry.pop("labels", None)
    if source not in STIMULUS_SOURCES:
        raise ConfigError(f"unknown stimulus source {source!r}; choose one of {sorted(STIMULUS_SOURCES)}")
    constructor = STIMULUS_SOURCES[source]
    allowed = set(inspect.signature(constructor).parameters)
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ConfigError(f"stimulus source {source!r}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    for key in ("folders", "categories"):
        if isinstance(entry.get(key), list):
            entry[key] = tuple(entry[key])
    stimuli = constructor(**entry)
    return stimuli if constant_labels is None else with_constant_labels(stimuli, constant_labels)


def with_constant_labels(stimuli: StimulusSet, labels) -> StimulusSet:
    """``stimuli`` with each of ``labels`` (label name → text) given to every image; a label the set already has
    is an error (its own values would be lost).

    >>> with_constant_labels(lfw_subset(), {"domain": "face"}).labels["domain"][:2]
    array(['face', 'face'], dtype='<U4')
    """
    if not isinstance(labels, dict) or not all(isinstance(k, str) and k and isinstance(v, str) and v
                                               for k, v in labels.items()):
        raise ConfigError(f"'labels' must be a table of label names and text values (e.g. labels = "
                          f"{{ domain = \"imagenet\" }}), got {labels!r}")
    clash = sorted(set(labels) & set(stimuli.labels))
    if clash:
        raise ConfigError(f"'labels': the set {stimuli.name!r} already has label(s) {clash}; 'labels' only adds "
                          f"labels it lacks (its own: {sorted(stimuli.labels)})")
    return stimuli.with_labels(**{name: np.full(len(stimuli), value) for name, value in labels.items()})
