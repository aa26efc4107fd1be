"""Suppression that falls off as a Gaussian around each site: optogenetic silencing and muscimol inactivation, two
calibrations of one law (Schrimpf et al. 2024, bioRxiv 2024.01.09.572970)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from stimsim.cortex.sheet import CorticalSheet
from stimsim.stimulation.base import (Perturbation, _constant, _layer, _per_row, _reduce_rows, _site_distances, _sites,
                                      parameter, register_perturbation)
from stimsim.stimulation.spread import gaussian_weights

#: Gaussian spread of optogenetic suppression, mm² (σ ≈ 0.48 mm), calibrated on Chow et al. 2010
#: (Nature 463:98) as in Schrimpf et al. 2024 (bioRxiv 2024.01.09.572970).
CHOW2010_VARIANCE_MM2 = 0.234
#: Gaussian spread of muscimol inactivation, mm² (σ ≈ 1.08 mm), calibrated on Arikan et al. 2002
#: (J Neurosci Methods 118:51) as in Schrimpf et al. 2024.
ARIKAN2002_VARIANCE_MM2 = 1.17


class GaussianSuppression(Perturbation):
    """Multiplier ``Π_sites max(1 − a·g(d), 0)``: ``a`` the kind's :attr:`amount` (its dose), g the peak-normalised
    Gaussian of the kind's ``variance_mm2`` (:func:`stimsim.stimulation.spread.gaussian_weights`). Several sites
    silence independently: their multipliers multiply."""

    variance_mm2: float
    #: The name of the dose's parameter (e.g. ``"power_mW"``).
    dose: ClassVar[str]

    def __post_init__(self):
        object.__setattr__(self, "sites_mm", _sites(self.sites_mm))
        self.check_parameters()
        object.__setattr__(self, "layer", _layer(self.layer))

    @property
    def amount(self) -> float:
        """The dose in the kind's unit (mW of light, µL of muscimol); 1 silences the centre."""
        return getattr(self, self.dose)

    def describe(self) -> dict:
        return {"kind": self.kind, "layer": self.layer, **self._describe_sites(),
                self.dose: self.amount, "variance_mm2": self.variance_mm2}

    @classmethod
    def batch_effect(cls, perturbations, sheet: CorticalSheet, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        perturbations = list(perturbations)
        distance, owner = _site_distances(perturbations, sheet, device)
        variance = _per_row([p.variance_mm2 for p in perturbations], owner, distance)
        amount = _per_row([p.amount for p in perturbations], owner, distance)
        factor = torch.clamp(1.0 - amount * gaussian_weights(distance, variance), min=0.0)
        multiplier = _reduce_rows(factor, owner, len(perturbations), "prod")
        return multiplier, _constant(0.0, multiplier)


@register_perturbation
@dataclass(frozen=True)
class OptogeneticSuppression(GaussianSuppression):
    """Optogenetic silencing through an optical fibre (calibrated on Chow et al. 2010, Nature 463:98).

    Multiplier ``max(1 − P·g(d), 0)`` with P the fibre output power in mW (P ≥ 1 mW silences the
    centre) and g a peak-normalised Gaussian of variance ``variance_mm2`` (0.234 mm², σ ≈ 0.48 mm).
    Several fibres silence independently: their multipliers multiply. Power in [0, 100] mW.
    """

    kind: ClassVar[str] = "optogenetic"
    dose: ClassVar[str] = "power_mW"
    doses: ClassVar[tuple[str, ...]] = ("power_mW",)

    sites_mm: tuple[tuple[float, float], ...]
    power_mW: float = parameter(unit="mW", low=0.0, high=100.0)
    variance_mm2: float = parameter(CHOW2010_VARIANCE_MM2, unit="mm²", low=0.0, low_open=True)
    layer: str = "IT"



@register_perturbation
@dataclass(frozen=True)
class MuscimolInactivation(GaussianSuppression):
    """Pharmacological inactivation by a muscimol injection (calibrated on Arikan et al. 2002,
    J Neurosci Methods 118:51).

    Multiplier ``max(1 − V·g(d), 0)`` with V the injected volume in µL and g a peak-normalised
    Gaussian of variance ``variance_mm2`` (1.17 mm², σ ≈ 1.08 mm). Several injections silence
    independently: their multipliers multiply. Volume in [0, 10] µL.
    """

    kind: ClassVar[str] = "muscimol"
    dose: ClassVar[str] = "volume_uL"
    doses: ClassVar[tuple[str, ...]] = ("volume_uL",)

    sites_mm: tuple[tuple[float, float], ...]
    volume_uL: float = parameter(unit="µL", low=0.0, high=10.0)
    variance_mm2: float = parameter(ARIKAN2002_VARIANCE_MM2, unit="mm²", low=0.0, low_open=True)
    layer: str = "IT"
