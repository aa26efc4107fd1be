"""Trunk outputs shared by models built on the same trunk.

Models of the ``topo_head`` family (stimsim-mnv2-s0, -s1, ...) run an ImageNet trunk (frozen or tuned once at build
time) and pool its features before their own IT (:mod:`stimsim.models.topo_head`). A plan rehearses the same images
in every candidate, so inside a :func:`shared_trunk_outputs` block the pooled trunk output of each input batch
(1,280 numbers per image for MobileNetV2) is computed once and reused by every model whose trunk is the same: the
key is the sha256 of the trunk's stages (their modules and weights) and of the input batch (shape, dtype and bytes),
so a model with other trunk weights, or another input, never receives it, and what a model gets is exactly what it
computes on its own.
Outside such a block nothing is kept.
"""
from __future__ import annotations

import contextlib
import hashlib
from typing import Callable

import torch

from stimsim.utilities.hashing import update_with_tensors

#: The stage at which each family's shareable trunk ends (the pooled features of a ``topo_head`` model).
SHARED_TRUNK_STAGES = {"topo_head": "pool.1"}
#: Largest total size (bytes) of the outputs one block keeps; beyond it outputs are computed but not kept.
MAX_KEPT_BYTES = 1 << 30


class _Kept:
    """The outputs a block keeps: (trunk digest, input digest) → tensor, and their total size."""

    def __init__(self):
        self.outputs: dict[tuple[str, str], torch.Tensor] = {}
        self.bytes = 0
        self.hits = 0


_KEPT: _Kept | None = None


@contextlib.contextmanager
def shared_trunk_outputs():
    """Within this block, models with the same trunk compute each input batch's trunk output once (module
    docstring). Blocks nest: an inner block uses the outer one's outputs. Yields the record of kept outputs
    (``hits``: how many trunk passes were saved)."""
    global _KEPT
    outer = _KEPT
    if outer is None:
        _KEPT = _Kept()
    try:
        yield _KEPT
    finally:
        if outer is None:
            _KEPT = None


def trunk_digest(stages) -> str:
    """sha256 of a trunk: every stage's name, module structure and weights, in order."""
    digest = hashlib.sha256()
    for name, module in stages:
        digest.update(f"{name}:{module!r};".encode())
        update_with_tensors(digest, module.state_dict())
    return digest.hexdigest()


def _input_digest(x: torch.Tensor) -> str:
    digest = hashlib.sha256(f"{tuple(x.shape)}:{x.dtype}:{x.device}".encode())
    digest.update(x.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def trunk_output(digest: Callable[[], str], x: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``run(x)``, the trunk's output; inside a :func:`shared_trunk_outputs` block the one kept for this trunk
    (``digest()``, asked for only inside a block) and this input, if any, else computed and kept."""
    if _KEPT is None:
        return run(x)
    key = (digest(), _input_digest(x))
    kept = _KEPT.outputs.get(key)
    if kept is not None:
        _KEPT.hits += 1
        return kept.clone()  # a copy: the caller may change what it gets in place
    output = run(x)
    size = output.element_size() * output.nelement()
    if _KEPT.bytes + size <= MAX_KEPT_BYTES:
        _KEPT.outputs[key] = output.clone()
        _KEPT.bytes += size
    return output
