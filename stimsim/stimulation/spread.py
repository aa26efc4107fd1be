"""Spread laws: how far a perturbation reaches on the cortical sheet.

Every law here maps a distance from the site (mm) to a spatial weight in [0, 1] that equals 1
at the site. The perturbation kinds (:mod:`stimsim.stimulation.electrical`, :mod:`stimsim.stimulation.suppression`)
turn these weights into unit effects. The electrical laws are classes registered in :data:`SPREAD_LAWS` (a new
law: a :class:`SpreadLaw` subclass registered with ``@register_spread_law("name")``, or through the entry point
group ``stimsim.spread_laws``); each states its weights once, in torch, for the batched effects; the numpy
functions below are views of the same laws for single distances.

Electrical microstimulation
    ``"kumaravelu"`` — exponential decay ``exp(-d / λ(I))`` with the length constant fitted to
    the activation-vs-distance data of Kumaravelu et al. 2022 (Brain Stimulation 15:141, fig. 2C):
    ``λ(I) = 0.00505047 · (I − 5.26062)`` mm for a current I in µA. λ ≤ 0 at or below 5.26062 µA,
    so the law is refused there.

    ``"tehovnik"`` — the current–distance relation ``I = K · r²`` (Stoney, Thompson & Asanuma 1968,
    J Neurophysiol 31:659; reviewed by Tehovnik et al. 2006, J Neurophysiol 96:512): a neuron at
    distance d is excited when ``I ≥ K·d²``, so every unit within ``r = sqrt(I / K)`` mm is activated
    (weight 1) and every unit beyond it is not (weight 0) — a hard disc, which is what the law states.
    K = 1292 µA/mm² by default; the review reports 300–27,000 µA/mm² across neuron types.

Pharmacological and optogenetic suppression
    A peak-normalised Gaussian ``exp(-d² / (2·variance))`` (Chow et al. 2010, Nature 463:98 for
    light; Arikan et al. 2002, J Neurosci Methods 118:51 for muscimol).
"""
from __future__ import annotations

import abc
import math
from typing import ClassVar

import numpy as np
import torch

from stimsim.utilities.errors import ConfigError
from stimsim.utilities.plugins import Registry

#: Slope of the Kumaravelu et al. 2022 spread length, mm per µA.
KUMARAVELU_SLOPE_MM_PER_UA = 0.00505047
#: Current (µA) at which the Kumaravelu et al. 2022 spread length reaches zero; the law needs I above it.
KUMARAVELU_THRESHOLD_UA = 5.26062
#: Default excitability constant K of I = K·r² (Tehovnik et al. 2006), µA/mm².
TEHOVNIK_K_DEFAULT_UA_PER_MM2 = 1292.0
#: Range of K reported across neuron types by Tehovnik et al. 2006, µA/mm².
TEHOVNIK_K_RANGE_UA_PER_MM2 = (300.0, 27000.0)


def kumaravelu_length_mm(current_uA: float) -> float:
    """Exponential spread length λ (mm) for a current in µA (Kumaravelu et al. 2022).

    >>> round(kumaravelu_length_mm(50.0), 3)
    0.226
    """
    current_uA = float(current_uA)
    if not math.isfinite(current_uA) or current_uA <= KUMARAVELU_THRESHOLD_UA:
        raise ConfigError(
            f"current_uA = {current_uA} is outside the Kumaravelu et al. 2022 spread law: "
            f"λ(I) = {KUMARAVELU_SLOPE_MM_PER_UA}·(I − {KUMARAVELU_THRESHOLD_UA}) mm is positive only for "
            f"I > {KUMARAVELU_THRESHOLD_UA} µA"
        )
    return KUMARAVELU_SLOPE_MM_PER_UA * (current_uA - KUMARAVELU_THRESHOLD_UA)


def tehovnik_radius_mm(current_uA: float, K_uA_per_mm2: float = TEHOVNIK_K_DEFAULT_UA_PER_MM2) -> float:
    """Radius r = sqrt(I / K) (mm) of the disc of directly activated neurons (Tehovnik et al. 2006).

    >>> round(tehovnik_radius_mm(1292.0), 3)
    1.0
    """
    current_uA = float(current_uA)
    if not math.isfinite(current_uA) or current_uA <= 0:
        raise ConfigError(f"current_uA must be > 0 µA for the Tehovnik spread law, got {current_uA}")
    validate_tehovnik_K(K_uA_per_mm2)
    return math.sqrt(current_uA / float(K_uA_per_mm2))


def validate_tehovnik_K(K_uA_per_mm2: float) -> float:
    """Return K as a float, or raise ConfigError when it is outside the range Tehovnik et al. 2006 report."""
    low, high = TEHOVNIK_K_RANGE_UA_PER_MM2
    value = float(K_uA_per_mm2)
    if not (low <= value <= high):
        raise ConfigError(
            f"tehovnik_K_uA_per_mm2 must be in [{low:g}, {high:g}] µA/mm² (the range reported by "
            f"Tehovnik et al. 2006), got {K_uA_per_mm2}"
        )
    return value


class SpreadLaw(abc.ABC):
    """An electrical spread law: how far a current reaches (:meth:`extent_mm`, mm) and the spatial weight of a unit
    at a distance for that reach (:meth:`weights`)."""

    #: The law's name in files (``spread = "..."``), set when it is registered.
    name: str = ""
    #: What the law's extent is, for records (e.g. ``"spread_length_mm"``).
    extent_name: ClassVar[str] = "spread_extent_mm"
    #: Why currents at or below :meth:`lowest_current_uA` give no reach, for error messages ("" when obvious).
    lowest_current_note: ClassVar[str] = ""

    @abc.abstractmethod
    def lowest_current_uA(self) -> float:
        """Currents must lie above this (µA) for the law to give a reach."""

    @abc.abstractmethod
    def extent_mm(self, current_uA: float, tehovnik_K_uA_per_mm2: float) -> float:
        """The law's length (mm) at ``current_uA``."""

    @abc.abstractmethod
    def weights(self, distance_mm: torch.Tensor, extent_mm: torch.Tensor) -> torch.Tensor:
        """Weights in [0, 1] at ``distance_mm`` for reaches ``extent_mm`` (broadcast); may reuse ``distance_mm``'s
        memory."""


#: Electrical spread laws by the name files use.
SPREAD_LAWS = Registry("spread law", entry_point_group="stimsim.spread_laws", instance_of=SpreadLaw)


def register_spread_law(name: str):
    """Class decorator: register a :class:`SpreadLaw` subclass (an instance of it) as ``name``."""
    return SPREAD_LAWS.register(name)


@register_spread_law("kumaravelu")
class Kumaravelu(SpreadLaw):
    """Exponential decay ``exp(−d / λ(I))``, λ from Kumaravelu et al. 2022 (:func:`kumaravelu_length_mm`)."""

    extent_name = "spread_length_mm"
    lowest_current_note = (f"the Kumaravelu et al. 2022 spread length λ(I) is <= 0 at or below "
                           f"{KUMARAVELU_THRESHOLD_UA} µA")

    def lowest_current_uA(self) -> float:
        return KUMARAVELU_THRESHOLD_UA

    def extent_mm(self, current_uA: float, tehovnik_K_uA_per_mm2: float) -> float:
        return kumaravelu_length_mm(current_uA)

    def weights(self, distance_mm: torch.Tensor, extent_mm: torch.Tensor) -> torch.Tensor:
        return distance_mm.div_(-extent_mm).exp_()


@register_spread_law("tehovnik")
class Tehovnik(SpreadLaw):
    """A hard disc: weight 1 within ``r = sqrt(I / K)`` mm, 0 beyond (:func:`tehovnik_radius_mm`)."""

    extent_name = "spread_radius_mm"

    def lowest_current_uA(self) -> float:
        return 0.0

    def extent_mm(self, current_uA: float, tehovnik_K_uA_per_mm2: float) -> float:
        return tehovnik_radius_mm(current_uA, tehovnik_K_uA_per_mm2)

    def weights(self, distance_mm: torch.Tensor, extent_mm: torch.Tensor) -> torch.Tensor:
        return (distance_mm <= extent_mm).to(distance_mm.dtype)


def spread_extent_mm(current_uA: float, law: str = "kumaravelu",
                     tehovnik_K_uA_per_mm2: float = TEHOVNIK_K_DEFAULT_UA_PER_MM2) -> float:
    """The law's length (mm): the exponential length λ for ``"kumaravelu"``, the disc radius for ``"tehovnik"``."""
    if law not in SPREAD_LAWS:
        raise ConfigError(f"unknown spread law {law!r}; allowed: {', '.join(SPREAD_LAWS)}")
    return SPREAD_LAWS.get(law).extent_mm(current_uA, tehovnik_K_uA_per_mm2)


def electrical_profile(distance_mm, current_uA: float, law: str = "kumaravelu",
                       tehovnik_K_uA_per_mm2: float = TEHOVNIK_K_DEFAULT_UA_PER_MM2) -> np.ndarray:
    """Spatial weight in [0, 1] of one electrode at ``distance_mm`` (array, mm) from its tip (a view of the law's
    :meth:`SpreadLaw.weights`).

    ``"kumaravelu"``: exp(−d/λ(I)); ``"tehovnik"``: 1 where d ≤ sqrt(I/K), else 0.
    """
    distance = torch.as_tensor(_distances(distance_mm), dtype=torch.float64).clone()
    extent = torch.tensor(spread_extent_mm(current_uA, law, tehovnik_K_uA_per_mm2), dtype=torch.float64)
    return SPREAD_LAWS.get(law).weights(distance, extent).numpy()


def gaussian_weights(distance_mm: torch.Tensor, variance_mm2: torch.Tensor) -> torch.Tensor:
    """Peak-normalised Gaussian exp(−d² / (2·variance)) (tensors, mm and mm², broadcast)."""
    return torch.exp(-distance_mm ** 2 / (2.0 * variance_mm2))


def gaussian_profile(distance_mm, variance_mm2: float) -> np.ndarray:
    """Peak-normalised Gaussian exp(−d² / (2·variance)) at ``distance_mm`` (array, mm); variance in mm² (a view of
    :func:`gaussian_weights`)."""
    variance_mm2 = float(variance_mm2)
    if not math.isfinite(variance_mm2) or variance_mm2 <= 0:
        raise ConfigError(f"variance_mm2 must be a finite number > 0 mm², got {variance_mm2}")
    distance = torch.as_tensor(_distances(distance_mm), dtype=torch.float64)
    return gaussian_weights(distance, torch.tensor(variance_mm2, dtype=torch.float64)).numpy()


def _distances(distance_mm) -> np.ndarray:
    distance_mm = np.asarray(distance_mm, dtype=np.float64)
    if not np.all(np.isfinite(distance_mm)) or np.any(distance_mm < 0):
        raise ValueError("distance_mm must hold finite values >= 0 mm")
    return distance_mm
