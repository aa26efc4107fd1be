"""Unperturbed layer activity cached on disk across runs.

A sweep perturbs layer L and needs the unperturbed output of L for every image: the forward pass
through every stage up to L, usually the largest single cost of a run. That output depends only on
the model's weights, the layer, the preprocessing and the images, so it is stored in the stimsim
cache (``$STIMSIM_CACHE_DIR/activations``, see :func:`stimsim.data.manifest.cache_dir`) under a key
made of their sha256 digests. Re-running an experiment with another stimulation block, other sites
or other currents then skips the forward pass.

Each entry is ``<key>.pt`` (a float32 tensor, saved atomically) and ``<key>.json`` (what it is, and the sha256
of the ``.pt`` file). On every reuse the sha256 of the whole ``.pt`` file (all rows) is computed and compared
with the record — this catches any damaged or changed byte; it reads the file once more and costs about 1.2 ms
per MB on one CPU core (a shipped model's IT activity is 16 KB per image: 0.02 ms per image, against 1 ms per
image for the forward pass it saves; measured on 512 images, 8.4 MB). The checksum says nothing when it was
recomputed together with the numbers, so the content is checked too: the activity of the first, the last and
``SAMPLED_ROWS`` images drawn at random among the others (anew on every reuse) is computed again and must
match the stored rows. An entry with its numbers and checksum both replaced is therefore caught when a
replaced row is among those checked — always when most rows were replaced, with probability about
``SAMPLED_ROWS / n`` when a single one of ``n`` was; the 10 rows cost 16 ms on a shipped model, and verifying
every row would cost the forward pass the cache saves. An entry that fails a check, or that cannot be read, is
reported with a warning naming its file and computed again. A cache that cannot be written (read-only, full, not a
directory) is warned about once per process, and the activity is used without being stored.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from stimsim.utilities.hashing import canonical_json, json_sha256, sha256_of, update_with_tensors
from stimsim.utilities.io import atomic_save, atomic_write_json

#: Format tag of an entry's ``.json`` record.
CACHE_FORMAT = "stimsim-activation-cache/1"

#: Subdirectory of the stimsim cache holding the entries.
SUBDIR = "activations"


def default_directory() -> Path:
    """``<stimsim cache>/activations``."""
    from stimsim.data.manifest import cache_dir

    return cache_dir() / SUBDIR


def entry_key(model_sha256: str, layer: str, preprocessing: dict, inputs_sha256: str) -> str:
    """The key of the activity of ``layer`` for the model whose weights digest is ``model_sha256``, on the
    inputs whose digest is ``inputs_sha256`` (of the preprocessed input tensor, or of the images or image
    files themselves: the preprocessing is part of the key)."""
    return json_sha256({"format": CACHE_FORMAT, "model": model_sha256, "layer": layer,
                        "preprocessing": preprocessing, "inputs": inputs_sha256})


def model_sha256(model) -> str:
    """sha256 of what a :class:`~stimsim.models.topographic.TopographicModel`'s activations depend on besides
    the input: its architecture, its stages and its weights."""
    digest = hashlib.sha256(canonical_json({"architecture": model.architecture,
                                            "stages": model.stage_names}).encode())
    update_with_tensors(digest, model.network.state_dict())
    return digest.hexdigest()


def images_sha256(images) -> str:
    """sha256 of a sequence of image arrays: every image's shape, dtype and values, in order."""
    import numpy as np

    digest = hashlib.sha256()
    for image in images:
        array = np.ascontiguousarray(image)
        digest.update(f"{array.shape}:{array.dtype};".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def cached_activations(model, images, layer: str, directory=None, batch_size: int = 64) -> torch.Tensor:
    """``model.activations(images, layer)`` (N_images, N_units), stored in the activation cache
    (``directory``, default :func:`default_directory`) and reused while the model, the layer, the
    preprocessing and the images are the same."""
    layer = model.resolve_layer(layer)
    images = model.image_sequence(images)
    key = entry_key(model_sha256(model), layer, model.preprocessing.to_dict(), images_sha256(images))
    return cached_activity(directory if directory is not None else default_directory(), key,
                           lambda: model.activations(images, layer, batch_size),
                           describe={"model": model.name, "layer": layer, "n_images": len(images)},
                           compute_rows=lambda rows: model.activations([images[i] for i in rows], layer),
                           n_rows=len(images))


#: The cache directories this process has already warned about as not writable: a run stores an entry per phase,
#: image set and layer, and says so once.
_UNWRITABLE: set[Path] = set()

#: Rows drawn at random (besides the first and the last) whose activity is recomputed on every reuse.
SAMPLED_ROWS = 8

#: Relative and absolute tolerance of the recomputed rows against the stored ones: float32 sums in another
#: batch order, or a batch of another size (another convolution algorithm), differ in their last bits. The
#: absolute tolerance grows with the rows' largest value (a deep network's logits of magnitude 20 differ by
#: about 5e-5 between batch sizes).
ROW_RTOL, ROW_ATOL = 1e-4, 1e-5


def cached_activity(directory, key: str, compute: Callable[[], torch.Tensor], describe: dict,
                    device=None, compute_rows: Callable[[list[int]], torch.Tensor] | None = None,
                    n_rows: int | None = None) -> torch.Tensor:
    """The tensor stored under ``key`` in ``directory`` (checksum verified), moved to ``device``; else
    ``compute()``, stored (atomically, with its checksum and ``describe``) and returned as computed.

    ``compute_rows(indices)`` gives the activity of some images alone; with it and ``n_rows`` (the number of
    images), a stored tensor must have ``n_rows`` rows whose first, last and ``SAMPLED_ROWS`` random ones match
    their recomputation."""
    directory = Path(directory)
    data_path, record_path = directory / f"{key}.pt", directory / f"{key}.json"
    if data_path.is_file() and record_path.is_file():
        problem = _verify(data_path, record_path)
        if problem is None:
            try:
                stored = torch.load(data_path, map_location="cpu", weights_only=True)
            except Exception as exc:  # torch raises many types for a damaged file
                problem = f"unreadable ({exc})"
            else:
                problem = None if compute_rows is None else _content_problem(stored, compute_rows, n_rows)
                if problem is None:
                    return stored.to(device)
        warnings.warn(f"cached activations {data_path} {problem}; computing them again", stacklevel=3)
    activity = compute()
    try:
        atomic_save(data_path, lambda tmp: torch.save(activity.detach().cpu().contiguous(), tmp))
        atomic_write_json(record_path, {"format": CACHE_FORMAT, "key": key, "sha256": sha256_of(data_path),
                                        "shape": list(activity.shape), "dtype": str(activity.dtype), **describe})
    except OSError as exc:  # a read-only or full cache costs the reuse, not the run
        if directory not in _UNWRITABLE:
            from stimsim.data.manifest import CACHE_DIR_ENV

            _UNWRITABLE.add(directory)
            warnings.warn(f"cannot keep the activations in the cache {directory} ({exc.strerror or exc}: "
                          f"{exc.filename or data_path}); continuing without storing them (make the cache writable, "
                          f"or set {CACHE_DIR_ENV} to a writable directory, to reuse them)", stacklevel=3)
    return activity


def _verify(data_path: Path, record_path: Path) -> str | None:
    """None when the entry's checksum matches its record, else what is wrong."""
    try:
        record = json.loads(record_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"has an unreadable record {record_path.name} ({exc})"
    if not isinstance(record, dict) or record.get("format") != CACHE_FORMAT:
        return f"has a record that is not a {CACHE_FORMAT} record"
    actual = sha256_of(data_path)
    if actual != record.get("sha256"):
        return f"fails its checksum (sha256 {actual}, recorded {record.get('sha256')})"
    return None


def _content_problem(stored, compute_rows: Callable[[list[int]], torch.Tensor], n_rows: int | None) -> str | None:
    """None when ``stored`` has ``n_rows`` rows and its first, last and ``SAMPLED_ROWS`` random rows match their
    recomputation."""
    if not isinstance(stored, torch.Tensor) or stored.ndim < 1 or (n_rows is not None and len(stored) != n_rows):
        shape = tuple(stored.shape) if isinstance(stored, torch.Tensor) else type(stored).__name__
        return f"holds {shape}, not the activity of {n_rows} images"
    middle = np.arange(1, len(stored) - 1)
    drawn = np.random.default_rng().choice(middle, size=min(SAMPLED_ROWS, len(middle)), replace=False)
    rows = sorted({0, len(stored) - 1, *drawn.tolist()})
    fresh = compute_rows(rows).detach().cpu()
    if fresh.shape[1:] != stored.shape[1:]:
        return f"holds rows of shape {tuple(stored.shape[1:])}, the layer gives {tuple(fresh.shape[1:])}"
    expected = stored[rows].to(fresh.dtype)
    atol = max(ROW_ATOL, ROW_RTOL * float(expected.abs().max()))
    if not torch.allclose(expected, fresh, rtol=ROW_RTOL, atol=atol):
        difference = float((expected - fresh).abs().max())
        return (f"does not match the model's activity of the images checked, {rows} (largest difference "
                f"{difference:.3g}); its content was changed")
    return None
