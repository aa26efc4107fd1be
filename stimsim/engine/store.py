"""The engine's resumable store: a directory of finished chunks of a simulation, each a NetCDF4 file of the
probabilities of some conditions, bound to the store by its id (the digest of the inputs' fingerprint) and to its
numbers by a sha256; a killed run resumes from the verified chunks, and a changed or foreign chunk is discarded
and computed again."""
from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from stimsim.utilities.errors import ConfigError, FileFormatError
from stimsim.utilities.hashing import json_sha256
from stimsim.utilities.io import atomic_save, atomic_write_json, is_temporary_file, read_json

#: Format tag of ``store.json``.
STORE_FORMAT = "stimsim-simulation-store/1"


def open_store(directory: Path, fingerprint: dict, shape: dict, probabilities: np.ndarray, done: np.ndarray,
               replace_stale: bool = False) -> str:
    """Create the store (``store.json``: its format, ``fingerprint`` — digests of everything the result depends on
    — and ``shape``: n_conditions, n_images, choices), or check its fingerprint and load its verified chunks into
    ``probabilities`` (marking them in ``done``); returns the store's id (the digest of its fingerprint) that binds
    every chunk to it. A store written for other inputs is emptied and begun again when its own sweep finished
    (:func:`mark_finished`: nothing in it is work to resume) or with ``replace_stale``; otherwise a ConfigError."""
    store_id = json_sha256(fingerprint)
    spec_path = directory / "store.json"
    if not spec_path.is_file():
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"store directory {directory} is a file; give a directory")
        leftovers = [p for p in directory.iterdir() if not is_temporary_file(p.name)] if directory.is_dir() else []
        if leftovers:
            raise ConfigError(f"store directory {directory} is not empty and holds no store.json; "
                              "give an empty or new directory")
        atomic_write_json(spec_path, {"format": STORE_FORMAT, "fingerprint": fingerprint, **shape})
        return store_id
    spec = read_json(spec_path)
    if not isinstance(spec, dict) or spec.get("format") != STORE_FORMAT:
        raise FileFormatError(spec_path, f"not a simulation store (format should be {STORE_FORMAT!r})")
    stored = spec.get("fingerprint", {})
    stored = stored if isinstance(stored, dict) else {}
    differing = sorted(key for key in set(stored) | set(fingerprint) if stored.get(key) != fingerprint.get(key))
    if differing and (replace_stale or spec.get("finished") is True):
        for path in directory.glob("chunk_*.nc"):
            path.unlink()
        spec_path.unlink()
        return open_store(directory, fingerprint, shape, probabilities, done)
    if differing:
        raise ConfigError(f"store {directory} holds the unfinished work of a run with different inputs (they "
                          f"differ in: {', '.join(differing)}); resume it with the same call, give a new directory, "
                          f"or replace it to run these inputs there from the start (replace_stale_store=True; "
                          f"--force on the command line)")
    for path in sorted(directory.glob("chunk_*.nc")):
        try:
            indices, values = read_chunk(path, probabilities.shape, store_id)
        except FileFormatError as exc:
            warnings.warn(f"simulation store: {exc}; the chunk is discarded and recomputed", stacklevel=3)
            path.unlink()
            continue
        probabilities[indices] = values
        done[indices] = True
    return store_id


def mark_finished(directory: Path) -> None:
    """Record in ``store.json`` that every chunk of the store's sweep is written: another sweep may replace it."""
    spec_path = directory / "store.json"
    spec = read_json(spec_path)
    if spec.get("finished") is not True:  # a store read back whole stays as it is
        atomic_write_json(spec_path, {**spec, "finished": True})


def write_chunk(directory: Path, indices: np.ndarray, values: np.ndarray, store_id: str) -> None:
    """One finished chunk as NetCDF4 (HDF5): probabilities of the conditions ``indices``, with the store's
    id and the sha256 of its numbers as attributes."""
    indices = np.asarray(indices, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    chunk = xr.Dataset({"probability": (("condition_index", "stimulus", "choice"), values)},
                       coords={"condition_index": indices},
                       attrs={"store_id": store_id, "sha256": chunk_sha256(store_id, indices, values)})
    atomic_save(directory / f"chunk_{int(indices.min()):08d}.nc", lambda tmp: chunk.to_netcdf(tmp, engine="h5netcdf"))


def read_chunk(path: Path, shape: tuple[int, int, int], store_id: str) -> tuple[np.ndarray, np.ndarray]:
    """The condition indices and probabilities of a chunk, after checking that it belongs to the store
    ``store_id``, fits its shape and that its numbers match their checksum (FileFormatError otherwise)."""
    try:
        with xr.open_dataset(path, engine="h5netcdf") as chunk:
            indices = chunk["condition_index"].values
            values = chunk["probability"].values
            attrs = dict(chunk.attrs)
    except Exception as exc:  # h5py and xarray raise many types for a damaged file
        raise FileFormatError(path, f"not a readable chunk file ({exc})") from None
    if (indices.ndim != 1 or values.shape != (len(indices),) + shape[1:] or len(indices) == 0
            or indices.min() < 0 or indices.max() >= shape[0]):
        raise FileFormatError(path, f"chunk does not fit this store ({len(indices)} condition indices, "
                                    f"probabilities {values.shape}; store has {shape[0]} conditions × {shape[1:]})")
    if attrs.get("store_id") != store_id:
        raise FileFormatError(path, "chunk belongs to another store (written for other inputs)")
    indices, values = np.asarray(indices, dtype=np.int64), np.asarray(values, dtype=np.float64)
    if attrs.get("sha256") != chunk_sha256(store_id, indices, values):
        raise FileFormatError(path, "chunk fails its checksum (its numbers were changed after it was written)")
    return indices, values


def chunk_sha256(store_id: str, indices: np.ndarray, values: np.ndarray) -> str:
    digest = hashlib.sha256(store_id.encode())
    digest.update(f"{indices.shape}{values.shape}".encode())
    digest.update(np.ascontiguousarray(indices, dtype="<i8").tobytes())
    digest.update(np.ascontiguousarray(values, dtype="<f8").tobytes())
    return digest.hexdigest()
