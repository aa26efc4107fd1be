"""sha256 digests of what results depend on: files, text, JSON records and tensors; what differs between two records.

Records are hashed as canonical JSON (keys sorted; numpy numbers and arrays as JSON values, any other
object by its ``repr``), so equal records give equal digests in every process. Tensors are hashed by
name, shape, dtype and raw bytes (on the CPU).

>>> sha256_text("abc")[:16]
'ba7816bf8f01cfea'
>>> json_sha256({"b": 1, "a": [1.5]}) == sha256_text('{"a": [1.5], "b": 1}')
True
"""
from __future__ import annotations

import hashlib
import json

from stimsim.utilities.jsonable import json_value

#: Bytes read at a time when hashing a file.
CHUNK_BYTES = 1 << 20


def sha256_of(path, chunk_bytes: int = CHUNK_BYTES) -> str:
    """sha256 (hex) of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_bytes), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_text(text: str) -> str:
    """sha256 (hex) of ``text`` encoded as UTF-8."""
    return hashlib.sha256(text.encode()).hexdigest()


def canonical_json(obj) -> str:
    """``obj`` as JSON with sorted keys; numpy values as JSON values, other objects by their ``repr``."""
    return json.dumps(obj, sort_keys=True, default=_value_or_repr)


def json_sha256(obj) -> str:
    """sha256 (hex) of :func:`canonical_json` of ``obj``."""
    return sha256_text(canonical_json(obj))


def changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested dicts, as ``key (old → new)``.

    >>> changed_keys({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}, "d": 4})
    ['b.c (2 → 3)', 'd (absent → 4)']
    """
    changed = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            changed += changed_keys(before, after, f"{prefix}{key}.")
        elif key not in old or key not in new or before != after:
            shown = [repr(side[key]) if key in side else "absent" for side in (old, new)]
            changed.append(f"{prefix}{key} ({shown[0]} → {shown[1]})")
    return changed


def update_with_tensors(digest, tensors: dict) -> None:
    """Feed ``digest`` (a ``hashlib`` object) every tensor of ``tensors`` (name → tensor) in the given
    order: ``"name:shape:dtype"``, then its bytes."""
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(_tensor_bytes(tensor))


def state_sha256(state: dict) -> str:
    """sha256 (hex) of a network's ``state_dict()`` (parameters and buffers sorted by name)."""
    digest = hashlib.sha256()
    update_with_tensors(digest, dict(sorted(state.items())))
    return digest.hexdigest()


def tensor_sha256(tensor) -> str:
    """sha256 (hex) of one tensor's shape, dtype and bytes (on the CPU)."""
    tensor = tensor.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{tuple(tensor.shape)}:{tensor.dtype}".encode())
    digest.update(_tensor_bytes(tensor))
    return digest.hexdigest()


def _tensor_bytes(tensor) -> bytes:
    import torch

    return tensor.reshape(-1).view(torch.uint8).numpy().tobytes()


def _value_or_repr(obj):
    try:
        return json_value(obj)
    except TypeError:
        return repr(obj)
