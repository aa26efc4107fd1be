"""Unperturbed layer activity cached on disk across runs.

A sweep perturbs layer L and needs the unperturbed output of L for every image: the forward pass
through every stage up to L, usually the largest single cost of a run. That output depends only on
the model's weights, the layer, the preprocessing and the images, so it is stored in the stimsim
cache (``$STIMSIM_CACHE_DIR/activations``, see :func:`stimsim.data.manifest.cache_dir`) under a key
made of their sha256 digests. Re-running an experiment with another stimulation block, other sites
or other currents then skips the forward pass.

Each entry is ``<key>.pt`` (a float32 tensor, saved atomically) and ``<key>.json`` (what it is, and
the sha256 of the ``.pt`` file). The checksum is verified on every reuse; an entry that fails it, or
that cannot be read, is reported with a warning and computed again.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Callable

import torch

from stimsim.hashing import json_sha256, sha256_of
from stimsim.io import atomic_save, atomic_write_json

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
    images whose preprocessed-input digest is ``inputs_sha256``."""
    return json_sha256({"format": CACHE_FORMAT, "model": model_sha256, "layer": layer,
                        "preprocessing": preprocessing, "inputs": inputs_sha256})


def cached_activity(directory, key: str, compute: Callable[[], torch.Tensor], describe: dict,
                    device=None) -> torch.Tensor:
    """The tensor stored under ``key`` in ``directory`` (checksum verified), moved to ``device``; else
    ``compute()``, stored (atomically, with its checksum and ``describe``) and returned as computed."""
    directory = Path(directory)
    data_path, record_path = directory / f"{key}.pt", directory / f"{key}.json"
    if data_path.is_file() and record_path.is_file():
        problem = _verify(data_path, record_path)
        if problem is None:
            try:
                return torch.load(data_path, map_location="cpu", weights_only=True).to(device)
            except Exception as exc:  # torch raises many types for a damaged file
                problem = f"unreadable ({exc})"
        warnings.warn(f"cached activations {data_path} {problem}; computing them again", stacklevel=3)
    activity = compute()
    atomic_save(data_path, lambda tmp: torch.save(activity.detach().cpu().contiguous(), tmp))
    atomic_write_json(record_path, {"format": CACHE_FORMAT, "key": key, "sha256": sha256_of(data_path),
                                    "shape": list(activity.shape), "dtype": str(activity.dtype), **describe})
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
