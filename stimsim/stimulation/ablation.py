"""Ablation: a lesion that silences every unit within a radius of its sites."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from stimsim.cortex.sheet import CorticalSheet
from stimsim.stimulation.base import (Perturbation, _constant, _layer, _per_row, _reduce_rows, _site_distances, _sites,
                                      parameter, register_perturbation)


@register_perturbation
@dataclass(frozen=True)
class Ablation(Perturbation):
    """Lesion: multiplier 0 for every unit within ``radius_mm`` (inclusive) of any site, 1 elsewhere."""

    kind: ClassVar[str] = "ablation"

    sites_mm: tuple[tuple[float, float], ...]
    radius_mm: float = parameter(unit="mm", low=0.0, low_open=True)
    layer: str = "IT"

    def __post_init__(self):
        object.__setattr__(self, "sites_mm", _sites(self.sites_mm))
        self.check_parameters()
        object.__setattr__(self, "layer", _layer(self.layer))

    @classmethod
    def batch_effect(cls, perturbations, sheet: CorticalSheet, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        perturbations = list(perturbations)
        distance, owner = _site_distances(perturbations, sheet, device)
        outside = (distance > _per_row([p.radius_mm for p in perturbations], owner, distance)).to(distance.dtype)
        multiplier = _reduce_rows(outside, owner, len(perturbations), "prod")
        return multiplier, _constant(0.0, multiplier)

    def describe(self) -> dict:
        return {"kind": self.kind, "layer": self.layer, **self._describe_sites(), "radius_mm": self.radius_mm}
