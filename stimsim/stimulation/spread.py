"""Spread laws: how far a perturbation reaches on the cortical sheet.

Every law here maps a distance from the site (mm) to a spatial weight in [0, 1] that equals 1
at the site. The perturbation specs (``perturbations.py``) turn these weights into unit effects.

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

import math

import numpy as np

from stimsim.errors import ConfigError

#: Slope of the Kumaravelu et al. 2022 spread length, mm per µA.
KUMARAVELU_SLOPE_MM_PER_UA = 0.00505047
#: Current (µA) at which the Kumaravelu et al. 2022 spread length reaches zero; the law needs I above it.
KUMARAVELU_THRESHOLD_UA = 5.26062
#: Default excitability constant K of I = K·r² (Tehovnik et al. 2006), µA/mm².
TEHOVNIK_K_DEFAULT_UA_PER_MM2 = 1292.0
#: Range of K reported across neuron types by Tehovnik et al. 2006, µA/mm².
TEHOVNIK_K_RANGE_UA_PER_MM2 = (300.0, 27000.0)
#: Names of the electrical spread laws.
SPREAD_LAWS = ("kumaravelu", "tehovnik")


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


def spread_extent_mm(current_uA: float, law: str = "kumaravelu",
                     tehovnik_K_uA_per_mm2: float = TEHOVNIK_K_DEFAULT_UA_PER_MM2) -> float:
    """The law's length (mm): the exponential length λ for ``"kumaravelu"``, the disc radius for ``"tehovnik"``."""
    if law == "kumaravelu":
        return kumaravelu_length_mm(current_uA)
    if law == "tehovnik":
        return tehovnik_radius_mm(current_uA, tehovnik_K_uA_per_mm2)
    raise ConfigError(f"unknown spread law {law!r}; allowed: {', '.join(SPREAD_LAWS)}")


def electrical_profile(distance_mm, current_uA: float, law: str = "kumaravelu",
                       tehovnik_K_uA_per_mm2: float = TEHOVNIK_K_DEFAULT_UA_PER_MM2) -> np.ndarray:
    """Spatial weight in [0, 1] of one electrode at ``distance_mm`` (array, mm) from its tip.

    ``"kumaravelu"``: exp(−d/λ(I)); ``"tehovnik"``: 1 where d ≤ sqrt(I/K), else 0.
    """
    distance_mm = _distances(distance_mm)
    extent_mm = spread_extent_mm(current_uA, law, tehovnik_K_uA_per_mm2)
    if law == "kumaravelu":
        return np.exp(-distance_mm / extent_mm)
    return (distance_mm <= extent_mm).astype(np.float64)


def gaussian_profile(distance_mm, variance_mm2: float) -> np.ndarray:
    """Peak-normalised Gaussian exp(−d² / (2·variance)) at ``distance_mm`` (array, mm); variance in mm²."""
    variance_mm2 = float(variance_mm2)
    if not math.isfinite(variance_mm2) or variance_mm2 <= 0:
        raise ConfigError(f"variance_mm2 must be a finite number > 0 mm², got {variance_mm2}")
    distance_mm = _distances(distance_mm)
    return np.exp(-distance_mm ** 2 / (2.0 * variance_mm2))


def _distances(distance_mm) -> np.ndarray:
    distance_mm = np.asarray(distance_mm, dtype=np.float64)
    if not np.all(np.isfinite(distance_mm)) or np.any(distance_mm < 0):
        raise ValueError("distance_mm must hold finite values >= 0 mm")
    return distance_mm
