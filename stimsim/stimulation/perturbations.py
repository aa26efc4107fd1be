"""Perturbation specs with units, and what they do to the units of one layer.

A perturbation is a frozen spec (site(s) in sheet mm, current in µA, power in mW, ...). Given the
:class:`~stimsim.sheet.CorticalSheet` of the layer it acts on, ``effect(sheet)`` returns a
:class:`UnitEffect`: per-unit ``multiplier`` and ``additive`` terms, applied as
``activity × multiplier + additive``. A :class:`Condition` groups the perturbations of one
experimental condition (none = control). For sweeps, ``batch_effect`` (per class) and
:meth:`Condition.batch_effects` build the effects of many perturbations or conditions at once as
(n, N) tensors on any torch device — the same numbers as ``effect``, with the distances of all sites
to all units computed in one vectorised step.

Specs round-trip through plain dicts (``to_dict`` / ``from_dict``, JSON and TOML friendly: ``None``
values are left out, since TOML has no null) and refuse unknown keys, so a typo in an experiment file
is an error rather than a silently ignored parameter.

Over 500 lines: the four perturbation kinds share the spread laws, the site geometry and the batched effects'
layout.
"""
from __future__ import annotations

import abc
import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from stimsim.errors import ConfigError
from stimsim.plugins import Registry
from stimsim.sheet import CorticalSheet
from stimsim.stimulation.spread import (
    KUMARAVELU_THRESHOLD_UA,
    SPREAD_LAWS,
    TEHOVNIK_K_DEFAULT_UA_PER_MM2,
    electrical_profile,
    gaussian_profile,
    spread_extent_mm,
    validate_tehovnik_K,
)

#: Pulse shapes whose two phases carry equal and opposite charge.
CHARGE_BALANCED_WAVEFORMS = ("biphasic_cathodic_first", "biphasic_anodic_first")
#: Pulse shapes that leave net charge in the tissue; refused.
MONOPHASIC_WAVEFORMS = ("monophasic_cathodic", "monophasic_anodic")
#: How the spatial profiles of several electrodes of one stimulation combine.
ELECTRODE_COMBINATIONS = ("sum", "max")
#: How stimulation changes activity.
STIMULATION_FORMS = ("multiplicative", "additive")
#: Highest current accepted, µA (well above the 300 µA of Moeller et al. 2017).
MAX_CURRENT_UA = 5000.0
#: Gaussian spread of optogenetic suppression, mm² (σ ≈ 0.48 mm), calibrated on Chow et al. 2010
#: (Nature 463:98) as in Schrimpf et al. 2024 (bioRxiv 2024.01.09.572970).
CHOW2010_VARIANCE_MM2 = 0.234
#: Gaussian spread of muscimol inactivation, mm² (σ ≈ 1.08 mm), calibrated on Arikan et al. 2002
#: (J Neurosci Methods 118:51) as in Schrimpf et al. 2024.
ARIKAN2002_VARIANCE_MM2 = 1.17


def _check_perturbation_class(kind: str, cls) -> None:
    """A perturbation kind is a :class:`Perturbation` subclass registered under its own ``kind``."""
    if not (isinstance(cls, type) and issubclass(cls, Perturbation)):
        raise TypeError(f"perturbation kind {kind!r} must be a Perturbation subclass, got {cls!r}")
    fields = {field.name for field in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    if not {"sites_mm", "layer"} <= fields or not cls.__dataclass_params__.frozen:
        raise TypeError(f"perturbation kind {kind!r}: class {cls.__name__} must be a frozen dataclass with the fields "
                        f"sites_mm and layer besides its parameters (see stimsim.stimulation.perturbations)")
    if getattr(cls, "kind", None) != kind:
        raise TypeError(f"perturbation kind {kind!r} is registered as class {cls.__name__}, whose kind is "
                        f"{getattr(cls, 'kind', None)!r}; a kind is registered under its own name")


#: Perturbation classes by their ``kind`` (a new kind: one module in :mod:`stimsim.stimulation` with a
#: :class:`Perturbation` subclass decorated with :func:`register_perturbation`, or a class in another
#: package registered through the entry point group ``stimsim.perturbations``).
PERTURBATION_KINDS = Registry("perturbation kind", entry_point_group="stimsim.perturbations",
                              packages=("stimsim.stimulation",), check=_check_perturbation_class)


def register_perturbation(cls):
    """Class decorator: register a :class:`Perturbation` subclass under its ``kind``."""
    return PERTURBATION_KINDS.register(cls.kind, cls)


# --- unit effects ---------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class UnitEffect:
    """What perturbations do to the N units of one layer: ``activity × multiplier + additive``.

    ``multiplier`` and ``additive`` are read-only (N,) float64 arrays; ``additive`` is in model
    activation units. Unit ``i`` is unit ``i`` of the layer output flattened in C-major order.
    """

    multiplier: np.ndarray
    additive: np.ndarray

    def __post_init__(self):
        multiplier = np.array(self.multiplier, dtype=np.float64)
        additive = np.array(self.additive, dtype=np.float64)
        if multiplier.ndim != 1 or multiplier.shape != additive.shape:
            raise ValueError(
                f"multiplier and additive must be 1-D arrays of the same length, got shapes "
                f"{multiplier.shape} and {additive.shape}"
            )
        if not (np.all(np.isfinite(multiplier)) and np.all(np.isfinite(additive))):
            raise ValueError("multiplier and additive must hold finite values")
        multiplier.setflags(write=False)
        additive.setflags(write=False)
        object.__setattr__(self, "multiplier", multiplier)
        object.__setattr__(self, "additive", additive)

    @classmethod
    def identity(cls, n_units: int) -> "UnitEffect":
        """The effect that changes nothing (multiplier 1, additive 0) on ``n_units`` units."""
        return cls(np.ones(int(n_units)), np.zeros(int(n_units)))

    @property
    def n_units(self) -> int:
        return len(self.multiplier)

    @property
    def is_identity(self) -> bool:
        """True when every multiplier is exactly 1 and every additive term exactly 0."""
        return bool(np.all(self.multiplier == 1.0) and np.all(self.additive == 0.0))

    def combine(self, other: "UnitEffect") -> "UnitEffect":
        """Effect of two simultaneous, independent perturbations: multipliers multiply, additives add."""
        if not isinstance(other, UnitEffect):
            raise TypeError(f"can only combine a UnitEffect with another UnitEffect, got {type(other).__name__}")
        if other.n_units != self.n_units:
            raise ValueError(f"cannot combine effects on {self.n_units} and {other.n_units} units")
        return UnitEffect(self.multiplier * other.multiplier, self.additive + other.additive)

    def apply(self, activity):
        """``activity × multiplier + additive`` for a numpy array or torch tensor.

        ``activity`` is (..., N) with units on the last axis, or (batch, C, H, W) with C·H·W = N.
        The identity effect returns ``activity`` itself, unchanged.
        """
        if self.is_identity:
            return activity
        shape = tuple(activity.shape)
        if shape and shape[-1] == self.n_units:
            unit_shape = (self.n_units,)
        elif len(shape) >= 2 and math.prod(shape[1:]) == self.n_units:
            unit_shape = shape[1:]
        else:
            raise ValueError(f"activity of shape {shape} does not hold the {self.n_units} units of this effect")
        if isinstance(activity, np.ndarray):
            return apply_effect(activity, self.multiplier.reshape(unit_shape), self.additive.reshape(unit_shape))
        import torch

        def as_tensor(values):
            return torch.tensor(values.reshape(unit_shape), dtype=activity.dtype, device=activity.device)

        return apply_effect(activity, as_tensor(self.multiplier), as_tensor(self.additive))


def apply_effect(activity, multiplier, additive):
    """``activity × multiplier + additive``: the one place perturbed activity is computed (the engine
    and :meth:`UnitEffect.apply` call it). Arrays or tensors that broadcast against ``activity``
    (e.g. multiplier (K, 1, N) against activity (1, B, N) for K conditions × B images); a new array
    is returned, ``activity`` is left unchanged."""
    perturbed = activity * multiplier
    perturbed += additive
    return perturbed


def signed_gain_warning(perturbation, sheet: CorticalSheet, activity) -> str | None:
    """A warning when ``perturbation`` multiplies units by a gain above 1 while the layer's
    ``activity`` (images × units, e.g. its response to the localizer images) takes negative values:
    a gain then pushes negative units further down instead of driving them (many networks have no
    ReLU after their blocks). None when that is not the case."""
    activity = np.asarray(activity)
    negative = float(np.mean(activity < 0)) if activity.size else 0.0
    if negative == 0.0 or float(np.max(perturbation.effect(sheet).multiplier)) <= 1.0:
        return None
    return (f"{perturbation.kind} stimulation multiplies the activity of layer {perturbation.layer!r} by a gain > 1, "
            f"but {negative:.0%} of that layer's responses are negative: a gain pushes them further down instead of "
            f"driving those units; use form = \"additive\" (e.g. with additive_scale = \"sd\") or a layer whose "
            f"activity is not signed (after a ReLU)")


# --- validation helpers ---------------------------------------------------------------------
def _number(name: str, value, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number ({unit}), got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be finite ({unit}), got {value}")
    return value


def _in_range(name: str, value, unit: str, low: float | None = None, high: float | None = None,
              low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a float, or ConfigError naming the allowed interval."""
    value = _number(name, value, unit)
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        left = "(" if low_open or low is None else "["
        right = ")" if high_open or high is None else "]"
        low_text = "-inf" if low is None else f"{low:g}"
        high_text = "inf" if high is None else f"{high:g}"
        raise ConfigError(f"{name} must be in {left}{low_text}, {high_text}{right} {unit}, got {value:g}")
    return value


def _choice(name: str, value, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}; got {value!r}")
    return value


def _sites(value) -> tuple[tuple[float, float], ...]:
    """Normalise one (x, y) pair or a sequence of pairs (mm) to a tuple of float pairs."""
    problem = ("sites_mm must be one (x, y) pair or a non-empty sequence of (x, y) pairs, in mm; "
               f"got {value!r}")
    if isinstance(value, (str, bytes)):
        raise ConfigError(problem)
    try:
        sites = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(problem) from None
    if sites.shape == (2,):
        sites = sites[None, :]
    if sites.ndim != 2 or sites.shape[1] != 2 or len(sites) == 0:
        raise ConfigError(problem)
    if not np.all(np.isfinite(sites)):
        raise ConfigError(f"sites_mm must hold finite coordinates, got {value!r}")
    return tuple((float(x), float(y)) for x, y in sites)


def _layer(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"layer must be a non-empty stage name or area label (e.g. 'IT'), got {value!r}")
    return value


# --- vectorised effects ---------------------------------------------------------------------
def _effect_dtype(device) -> torch.dtype:
    """float64, except on Apple MPS, which has no float64."""
    return torch.float32 if torch.device(device or "cpu").type == "mps" else torch.float64


def _site_distances(perturbations, sheet: CorticalSheet, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Distances (mm) of every unit from every site of every perturbation, (n_sites_total, N), and the index
    of the perturbation each row belongs to; sites off the sheet are refused first."""
    x0, x1, y0, y1 = sheet.extent_mm
    sites = np.array([site for p in perturbations for site in p.sites_mm], dtype=np.float64).reshape(-1, 2)
    if not np.all((sites[:, 0] >= x0) & (sites[:, 0] <= x1) & (sites[:, 1] >= y0) & (sites[:, 1] <= y1)):
        for perturbation in perturbations:
            perturbation._require_sites_on(sheet)
    dtype = _effect_dtype(device)
    sites = torch.as_tensor(sites, dtype=dtype, device=device)
    owner = torch.tensor([i for i, p in enumerate(perturbations) for _ in p.sites_mm], device=device)
    coords = torch.as_tensor(sheet.coordinates_mm, dtype=dtype, device=device)
    distance = (coords[None, :, 0] - sites[:, 0, None]).square_()
    distance.add_((coords[None, :, 1] - sites[:, 1, None]).square_())
    return distance.sqrt_(), owner


def _constant(value: float, like: torch.Tensor) -> torch.Tensor:
    """A read-only (rows, N) tensor of ``value`` like ``like``, without the memory (stride 0)."""
    return torch.full((1, like.shape[1]), value, dtype=like.dtype, device=like.device).expand(like.shape)


def _per_row(values, owner: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """One parameter value per perturbation, broadcast to the site rows as a (rows, 1) column."""
    return torch.tensor(values, dtype=like.dtype, device=like.device)[owner, None]


def _slots(owner: torch.Tensor) -> list[torch.Tensor]:
    """Rows grouped by their rank within their owner: slot j holds the j-th row of every owner that has one,
    so each slot touches an owner at most once (rows of one owner are assumed contiguous and in order)."""
    counts = torch.bincount(owner)
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(owner), device=owner.device) - first[owner]
    return [torch.nonzero(rank == j).flatten() for j in range(int(counts.max()))]


def _reduce_rows(rows: torch.Tensor, owner: torch.Tensor, n: int, how: str) -> torch.Tensor:
    """Combine the site rows of each of n perturbations (every one has at least one): ``"sum"``, ``"max"`` or
    ``"prod"`` → (n, N), in site order."""
    if len(owner) == n:  # one site each
        return rows
    combine = {"sum": torch.add, "max": torch.maximum, "prod": torch.mul}[how]
    out = torch.empty((n, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    for j, picked in enumerate(_slots(owner)):
        target = owner[picked]
        out[target] = rows[picked] if j == 0 else combine(out[target], rows[picked])
    return out


# --- perturbations --------------------------------------------------------------------------
class Perturbation(abc.ABC):
    """Base of all perturbation specs (frozen dataclasses with ``sites_mm`` and ``layer``).

    Subclasses set ``kind`` and implement ``effect`` and ``describe``.
    """

    kind: ClassVar[str]
    sites_mm: tuple[tuple[float, float], ...]
    layer: str

    @abc.abstractmethod
    def effect(self, sheet: CorticalSheet) -> UnitEffect:
        """Per-unit effect on the layer whose positions are ``sheet``; sites off the sheet are refused."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """Flat ``{name_with_unit: number | str}`` record of the spec, for labelled results."""

    @classmethod
    def batch_effect(cls, perturbations, sheet: CorticalSheet, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Effects of several perturbations of this class on ``sheet``: (multiplier, additive), each (n, N)
        float64 (float32 on devices without float64) on ``device``; row i equals ``perturbations[i].effect``.
        Treat them as read-only: a term that is the same everywhere may be one row broadcast (stride 0).

        This fallback stacks ``effect``; the classes here override it with a vectorised computation."""
        effects = [p.effect(sheet) for p in perturbations]
        dtype = _effect_dtype(device)
        multiplier = torch.tensor(np.stack([e.multiplier for e in effects]), dtype=dtype, device=device)
        additive = torch.tensor(np.stack([e.additive for e in effects]), dtype=dtype, device=device)
        return multiplier, additive

    def to_dict(self) -> dict:
        """Plain dict with ``kind`` and every parameter (``None`` values left out)."""
        record = {"kind": self.kind}
        for spec_field in dataclasses.fields(self):
            value = getattr(self, spec_field.name)
            if value is None:
                continue
            record[spec_field.name] = [list(site) for site in value] if spec_field.name == "sites_mm" else value
        return record

    @classmethod
    def from_dict(cls, record: Mapping) -> "Perturbation":
        """Rebuild a spec from ``to_dict`` output; unknown or missing keys raise ConfigError."""
        if cls is Perturbation:
            return perturbation_from_dict(record)
        if not isinstance(record, Mapping):
            raise ConfigError(f"a {cls.kind} perturbation must be a table/dict, got {type(record).__name__}")
        params = dict(record)
        kind = params.pop("kind", cls.kind)
        if kind != cls.kind:
            raise ConfigError(f"{cls.__name__}.from_dict got kind {kind!r}, expected {cls.kind!r}")
        spec_fields = dataclasses.fields(cls)
        allowed = [f.name for f in spec_fields]
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise ConfigError(
                f"unknown key(s) {unknown} for a {cls.kind} perturbation; allowed keys: kind, {', '.join(allowed)}"
            )
        missing = [f.name for f in spec_fields if f.name not in params
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ConfigError(f"a {cls.kind} perturbation needs key(s) {missing}")
        return cls(**params)

    def _require_sites_on(self, sheet: CorticalSheet) -> None:
        for site in self.sites_mm:
            if not sheet.contains(site):
                x0, x1, y0, y1 = sheet.extent_mm
                raise ConfigError(
                    f"{self.kind} site ({site[0]:g}, {site[1]:g}) mm is off sheet {sheet.name!r}, which spans "
                    f"x in [{x0:g}, {x1:g}] mm and y in [{y0:g}, {y1:g}] mm"
                )

    def _describe_sites(self) -> dict:
        """First site, number of sites and all sites as text."""
        (x, y) = self.sites_mm[0]
        return {
            "site_x_mm": x,
            "site_y_mm": y,
            "n_sites": len(self.sites_mm),
            "sites_mm": "; ".join(f"({sx:g}, {sy:g})" for sx, sy in self.sites_mm),
        }


@dataclass(frozen=True)
class ElectricalStimulation(Perturbation):
    """Electrical microstimulation through one or more electrodes.

    Spatial weight of one electrode at distance d (mm): ``w(d) = exp(−d/λ(I))`` with
    ``λ(I) = 0.00505047·(I − 5.26062)`` mm (``spread="kumaravelu"``, Kumaravelu et al. 2022, Brain
    Stimulation 15:141), or 1 inside the disc of radius ``sqrt(I/K)`` mm and 0 outside
    (``spread="tehovnik"``, Tehovnik et al. 2006); see :mod:`stimsim.stimulation.spread`.

    Several electrodes (``sites_mm`` with more than one pair): ``combine="sum"`` adds the
    per-electrode weights (increments superpose), ``combine="max"`` keeps the strongest electrode
    at every unit.

    ``form="multiplicative"`` (the lab's public code): ``gain = 1 + (f / baseline_frequency_Hz)·w``,
    activity × gain; with ``gain_cap`` set, gain = min(gain, gain_cap) (an older variant used a cap of
    2). f = 0 Hz gives exactly the identity. Units with zero activity stay at zero.

    ``form="additive"`` (Mehrer et al. 2025): a rate increment
    ``Δr = min(rate_base_Hz + rate_gain_Hz_per_Hz·f, rate_max_Hz)·w`` in Hz, added to activity as
    ``activation_per_Hz·Δr`` — model activations are not in Hz, so ``activation_per_Hz`` is required.
    The default gain of 1 Hz per Hz of pulse rate assumes one extra spike per pulse in directly
    activated neurons, up to ``rate_max_Hz``. Units with zero activity are driven too.

    Current in µA: (5.26062, 5000] for the Kumaravelu law, (0, 5000] for the Tehovnik law. Pulse
    width, interphase gap, train duration and onset (ms) do not change the static model: they are
    validated, recorded and checked by :mod:`stimsim.stimulation.safety`. Only charge-balanced
    (biphasic) waveforms are accepted.

    >>> stim = ElectricalStimulation(((1.0, 2.0),), current_uA=50, frequency_Hz=200)
    >>> round(stim.spread_extent_mm, 3)
    0.226
    """

    kind: ClassVar[str] = "electrical"

    sites_mm: tuple[tuple[float, float], ...]
    current_uA: float = 50.0
    frequency_Hz: float = 200.0
    pulse_width_ms: float = 0.2
    interphase_ms: float = 0.1
    train_ms: float = 50.0
    onset_ms: float = 0.0
    waveform: str = "biphasic_cathodic_first"
    spread: str = "kumaravelu"
    tehovnik_K_uA_per_mm2: float = TEHOVNIK_K_DEFAULT_UA_PER_MM2
    form: str = "multiplicative"
    baseline_frequency_Hz: float = 30.0
    gain_cap: float | None = None
    rate_base_Hz: float = 30.0
    rate_max_Hz: float = 200.0
    rate_gain_Hz_per_Hz: float = 1.0
    activation_per_Hz: float | None = None
    combine: str = "sum"
    layer: str = "IT"

    def __post_init__(self):
        def put(name, value):  # fields of a frozen dataclass are set through object.__setattr__
            object.__setattr__(self, name, value)

        put("sites_mm", _sites(self.sites_mm))
        put("spread", _choice("spread", self.spread, SPREAD_LAWS))
        if self.spread == "kumaravelu":
            low_uA = KUMARAVELU_THRESHOLD_UA
            unit = f"µA (the Kumaravelu et al. 2022 spread length λ(I) is <= 0 at or below {low_uA} µA)"
        else:
            low_uA, unit = 0.0, "µA"
        put("current_uA", _in_range("current_uA", self.current_uA, unit, low_uA, MAX_CURRENT_UA, low_open=True))
        put("tehovnik_K_uA_per_mm2", validate_tehovnik_K(
            _number("tehovnik_K_uA_per_mm2", self.tehovnik_K_uA_per_mm2, "µA/mm²")))
        put("frequency_Hz", _in_range("frequency_Hz", self.frequency_Hz, "Hz", 0.0, 1000.0))
        put("pulse_width_ms", _in_range("pulse_width_ms", self.pulse_width_ms, "ms", 0.0, 2.0, low_open=True))
        put("interphase_ms", _in_range("interphase_ms", self.interphase_ms, "ms", 0.0, 1.0))
        put("train_ms", _in_range("train_ms", self.train_ms, "ms", 0.0, None, low_open=True))
        put("onset_ms", _in_range("onset_ms", self.onset_ms, "ms", 0.0, None))
        if self.frequency_Hz > 0:
            pulse_ms = 2 * self.pulse_width_ms + self.interphase_ms
            period_ms = 1000.0 / self.frequency_Hz
            if pulse_ms > period_ms:
                raise ConfigError(
                    f"a biphasic pulse (2 × pulse_width_ms + interphase_ms = {pulse_ms:g} ms) must fit in the "
                    f"pulse period 1000 / frequency_Hz = {period_ms:g} ms"
                )
        if self.waveform in MONOPHASIC_WAVEFORMS:
            raise ConfigError(
                f"waveform {self.waveform!r} is not charge-balanced; only biphasic, charge-balanced pulses are "
                f"allowed: {', '.join(CHARGE_BALANCED_WAVEFORMS)}"
            )
        put("waveform", _choice("waveform", self.waveform, CHARGE_BALANCED_WAVEFORMS))
        put("form", _choice("form", self.form, STIMULATION_FORMS))
        put("combine", _choice("combine", self.combine, ELECTRODE_COMBINATIONS))
        put("baseline_frequency_Hz", _in_range("baseline_frequency_Hz", self.baseline_frequency_Hz, "Hz",
                                               0.0, 1000.0, low_open=True))
        put("rate_max_Hz", _in_range("rate_max_Hz", self.rate_max_Hz, "Hz", 0.0, 1000.0, low_open=True))
        put("rate_base_Hz", _in_range("rate_base_Hz", self.rate_base_Hz, "Hz (at most rate_max_Hz)",
                                      0.0, self.rate_max_Hz))
        put("rate_gain_Hz_per_Hz", _in_range("rate_gain_Hz_per_Hz", self.rate_gain_Hz_per_Hz, "Hz per Hz", 0.0))
        if self.gain_cap is not None:
            if self.form != "multiplicative":
                raise ConfigError("gain_cap applies to form='multiplicative' only; leave it unset for 'additive'")
            put("gain_cap", _in_range("gain_cap", self.gain_cap, "(gain, dimensionless)", 1.0))
        if self.activation_per_Hz is not None:
            if self.form != "additive":
                raise ConfigError(
                    "activation_per_Hz applies to form='additive' only; leave it unset for 'multiplicative'")
            put("activation_per_Hz", _in_range("activation_per_Hz", self.activation_per_Hz,
                                               "activation units per Hz", 0.0, low_open=True))
        elif self.form == "additive":
            raise ConfigError(
                "form='additive' needs activation_per_Hz (> 0, model activation units per Hz of rate increment): "
                "model activations are not in Hz"
            )
        put("layer", _layer(self.layer))

    @property
    def spread_extent_mm(self) -> float:
        """λ(I) (mm) for the Kumaravelu law, the activated-disc radius (mm) for the Tehovnik law."""
        return spread_extent_mm(self.current_uA, self.spread, self.tehovnik_K_uA_per_mm2)

    @property
    def rate_increment_Hz(self) -> float:
        """Peak rate increment of the additive form, min(rate_base_Hz + rate_gain_Hz_per_Hz·f, rate_max_Hz)."""
        return min(self.rate_base_Hz + self.rate_gain_Hz_per_Hz * self.frequency_Hz, self.rate_max_Hz)

    def spatial_weight(self, sheet: CorticalSheet) -> np.ndarray:
        """Combined spatial weight of all electrodes at every unit of ``sheet`` ((N,) array)."""
        self._require_sites_on(sheet)
        weights = np.stack([
            electrical_profile(sheet.distances_mm(site), self.current_uA, self.spread, self.tehovnik_K_uA_per_mm2)
            for site in self.sites_mm
        ])
        return weights.sum(axis=0) if self.combine == "sum" else weights.max(axis=0)

    def effect(self, sheet: CorticalSheet) -> UnitEffect:
        weight = self.spatial_weight(sheet)
        if self.form == "multiplicative":
            gain = 1.0 + (self.frequency_Hz / self.baseline_frequency_Hz) * weight
            if self.gain_cap is not None:
                gain = np.minimum(gain, self.gain_cap)
            return UnitEffect(gain, np.zeros_like(gain))
        additive = self.activation_per_Hz * self.rate_increment_Hz * weight
        return UnitEffect(np.ones_like(additive), additive)

    @classmethod
    def batch_effect(cls, perturbations, sheet: CorticalSheet, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        perturbations = list(perturbations)
        distance, owner = _site_distances(perturbations, sheet, device)
        extent = _per_row([p.spread_extent_mm for p in perturbations], owner, distance)
        laws = {p.spread for p in perturbations}
        disc = (distance <= extent).to(distance.dtype) if "tehovnik" in laws else None
        weight = distance.div_(-extent).exp_() if "kumaravelu" in laws else disc  # in place: exp(−d/λ)
        if len(laws) == 2:
            exponential = _per_row([p.spread == "kumaravelu" for p in perturbations], owner, distance) > 0
            weight = torch.where(exponential, weight, disc)
        n = len(perturbations)
        column = lambda values: torch.tensor(values, dtype=distance.dtype, device=distance.device)[:, None]  # noqa: E731
        combined = {how: _reduce_rows(weight, owner, n, how) for how in {p.combine for p in perturbations}}
        weight = combined["sum"] if len(combined) == 1 and "sum" in combined else combined.get("max")
        if len(combined) == 2:
            weight = torch.where(column([p.combine == "sum" for p in perturbations]) > 0, combined["sum"], weight)
        forms = {p.form for p in perturbations}
        multiplier, additive = _constant(1.0, weight), _constant(0.0, weight)
        if "additive" in forms:
            additive = column([(p.activation_per_Hz or 0.0) * p.rate_increment_Hz for p in perturbations]) * weight
        if "multiplicative" in forms:  # gain = 1 + (f / f_baseline)·w, in place on the weights when they are not needed
            gain = weight if "additive" not in forms else weight.clone()
            gain.mul_(column([p.frequency_Hz / p.baseline_frequency_Hz for p in perturbations])).add_(1.0)
            if any(p.gain_cap is not None for p in perturbations):
                gain = torch.minimum(gain, column([math.inf if p.gain_cap is None else p.gain_cap
                                                   for p in perturbations]))
            multiplier = gain
        if len(forms) == 2:
            multiplicative = column([p.form == "multiplicative" for p in perturbations]) > 0
            multiplier = torch.where(multiplicative, multiplier, 1.0)
            additive = torch.where(multiplicative, 0.0, additive)
        return multiplier, additive

    def describe(self) -> dict:
        record = {"kind": self.kind, "layer": self.layer, **self._describe_sites(),
                  "current_uA": self.current_uA, "frequency_Hz": self.frequency_Hz,
                  "pulse_width_ms": self.pulse_width_ms, "interphase_ms": self.interphase_ms,
                  "train_ms": self.train_ms, "onset_ms": self.onset_ms, "waveform": self.waveform,
                  "spread": self.spread}
        if self.spread == "kumaravelu":
            record["spread_length_mm"] = self.spread_extent_mm
        else:
            record["spread_radius_mm"] = self.spread_extent_mm
            record["tehovnik_K_uA_per_mm2"] = self.tehovnik_K_uA_per_mm2
        record["form"] = self.form
        record["combine"] = self.combine
        if self.form == "multiplicative":
            record["baseline_frequency_Hz"] = self.baseline_frequency_Hz
            record["gain_cap"] = "none" if self.gain_cap is None else self.gain_cap
        else:
            record.update(rate_base_Hz=self.rate_base_Hz, rate_max_Hz=self.rate_max_Hz,
                          rate_gain_Hz_per_Hz=self.rate_gain_Hz_per_Hz, rate_increment_Hz=self.rate_increment_Hz,
                          activation_per_Hz=self.activation_per_Hz)
        return record


def _gaussian_suppression(sheet: CorticalSheet, sites_mm, amount: float, variance_mm2: float) -> UnitEffect:
    """Multiplier Π_sites max(1 − amount·g(d), 0), g the peak-normalised Gaussian of ``variance_mm2``."""
    multiplier = np.ones(sheet.n_units)
    for site in sites_mm:
        multiplier *= np.maximum(1.0 - amount * gaussian_profile(sheet.distances_mm(site), variance_mm2), 0.0)
    return UnitEffect(multiplier, np.zeros_like(multiplier))


def _batch_gaussian_suppression(perturbations, amounts, sheet: CorticalSheet, device):
    """Vectorised :func:`_gaussian_suppression` for several perturbations (``variance_mm2`` each)."""
    perturbations = list(perturbations)
    distance, owner = _site_distances(perturbations, sheet, device)
    variance = _per_row([p.variance_mm2 for p in perturbations], owner, distance)
    amount = _per_row(amounts, owner, distance)
    factor = torch.clamp(1.0 - amount * torch.exp(-distance ** 2 / (2.0 * variance)), min=0.0)
    multiplier = _reduce_rows(factor, owner, len(perturbations), "prod")
    return multiplier, _constant(0.0, multiplier)


@dataclass(frozen=True)
class OptogeneticSuppression(Perturbation):
    """Optogenetic silencing through an optical fibre (calibrated on Chow et al. 2010, Nature 463:98).

    Multiplier ``max(1 − P·g(d), 0)`` with P the fibre output power in mW (P ≥ 1 mW silences the
    centre) and g a peak-normalised Gaussian of variance ``variance_mm2`` (0.234 mm², σ ≈ 0.48 mm).
    Several fibres silence independently: their multipliers multiply. Power in [0, 100] mW.
    """

    kind: ClassVar[str] = "optogenetic"

    sites_mm: tuple[tuple[float, float], ...]
    power_mW: float
    variance_mm2: float = CHOW2010_VARIANCE_MM2
    layer: str = "IT"

    def __post_init__(self):
        object.__setattr__(self, "sites_mm", _sites(self.sites_mm))
        object.__setattr__(self, "power_mW", _in_range("power_mW", self.power_mW, "mW", 0.0, 100.0))
        object.__setattr__(self, "variance_mm2", _in_range("variance_mm2", self.variance_mm2, "mm²", 0.0,
                                                           low_open=True))
        object.__setattr__(self, "layer", _layer(self.layer))

    def effect(self, sheet: CorticalSheet) -> UnitEffect:
        self._require_sites_on(sheet)
        return _gaussian_suppression(sheet, self.sites_mm, self.power_mW, self.variance_mm2)

    @classmethod
    def batch_effect(cls, perturbations, sheet: CorticalSheet, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        perturbations = list(perturbations)
        return _batch_gaussian_suppression(perturbations, [p.power_mW for p in perturbations], sheet, device)

    def describe(self) -> dict:
        return {"kind": self.kind, "layer": self.layer, **self._describe_sites(), "power_mW": self.power_mW,
                "variance_mm2": self.variance_mm2}


@dataclass(frozen=True)
class MuscimolInactivation(Perturbation):
    """Pharmacological inactivation by a muscimol injection (calibrated on Arikan et al. 2002,
    J Neurosci Methods 118:51).

    Multiplier ``max(1 − V·g(d), 0)`` with V the injected volume in µL and g a peak-normalised
    Gaussian of variance ``variance_mm2`` (1.17 mm², σ ≈ 1.08 mm). Several injections silence
    independently: their multipliers multiply. Volume in [0, 10] µL.
    """

    kind: ClassVar[str] = "muscimol"

    sites_mm: tuple[tuple[float, float], ...]
    volume_uL: float
    variance_mm2: float = ARIKAN2002_VARIANCE_MM2
    layer: str = "IT"

    def __post_init__(self):
        object.__setattr__(self, "sites_mm", _sites(self.sites_mm))
        object.__setattr__(self, "volume_uL", _in_range("volume_uL", self.volume_uL, "µL", 0.0, 10.0))
        object.__setattr__(self, "variance_mm2", _in_range("variance_mm2", self.variance_mm2, "mm²", 0.0,
                                                           low_open=True))
        object.__setattr__(self, "layer", _layer(self.layer))

    def effect(self, sheet: CorticalSheet) -> UnitEffect:
        self._require_sites_on(sheet)
        return _gaussian_suppression(sheet, self.sites_mm, self.volume_uL, self.variance_mm2)

    @classmethod
    def batch_effect(cls, perturbations, sheet: CorticalSheet, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        perturbations = list(perturbations)
        return _batch_gaussian_suppression(perturbations, [p.volume_uL for p in perturbations], sheet, device)

    def describe(self) -> dict:
        return {"kind": self.kind, "layer": self.layer, **self._describe_sites(), "volume_uL": self.volume_uL,
                "variance_mm2": self.variance_mm2}


@dataclass(frozen=True)
class Ablation(Perturbation):
    """Lesion: multiplier 0 for every unit within ``radius_mm`` (inclusive) of any site, 1 elsewhere."""

    kind: ClassVar[str] = "ablation"

    sites_mm: tuple[tuple[float, float], ...]
    radius_mm: float
    layer: str = "IT"

    def __post_init__(self):
        object.__setattr__(self, "sites_mm", _sites(self.sites_mm))
        object.__setattr__(self, "radius_mm", _in_range("radius_mm", self.radius_mm, "mm", 0.0, low_open=True))
        object.__setattr__(self, "layer", _layer(self.layer))

    def effect(self, sheet: CorticalSheet) -> UnitEffect:
        self._require_sites_on(sheet)
        multiplier = np.ones(sheet.n_units)
        for site in self.sites_mm:
            multiplier[sheet.units_within(site, self.radius_mm)] = 0.0
        return UnitEffect(multiplier, np.zeros_like(multiplier))

    @classmethod
    def batch_effect(cls, perturbations, sheet: CorticalSheet, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        perturbations = list(perturbations)
        distance, owner = _site_distances(perturbations, sheet, device)
        outside = (distance > _per_row([p.radius_mm for p in perturbations], owner, distance)).to(distance.dtype)
        multiplier = _reduce_rows(outside, owner, len(perturbations), "prod")
        return multiplier, _constant(0.0, multiplier)

    def describe(self) -> dict:
        return {"kind": self.kind, "layer": self.layer, **self._describe_sites(), "radius_mm": self.radius_mm}


for _cls in (ElectricalStimulation, OptogeneticSuppression, MuscimolInactivation, Ablation):
    register_perturbation(_cls)


def perturbation_from_dict(record: Mapping) -> Perturbation:
    """Build a perturbation from a dict whose ``kind`` is one of :data:`PERTURBATION_KINDS`."""
    if not isinstance(record, Mapping):
        raise ConfigError(f"a perturbation must be a table/dict, got {type(record).__name__}")
    kind = record.get("kind")
    if kind not in PERTURBATION_KINDS:
        raise ConfigError(f"perturbation kind must be one of {', '.join(PERTURBATION_KINDS)}; got {kind!r}")
    return PERTURBATION_KINDS[kind].from_dict(record)


# --- conditions -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Condition:
    """One condition of an experiment: a label and the perturbations applied together (none = control).

    All perturbations must act on the same layer. Their effects combine as independent
    perturbations (:meth:`UnitEffect.combine`: multipliers multiply, additives add); to combine
    electrodes by ``"sum"`` or ``"max"``, put them in one :class:`ElectricalStimulation`.
    """

    label: str
    perturbations: tuple[Perturbation, ...] = ()

    def __post_init__(self):
        if not isinstance(self.label, str) or not self.label.strip():
            raise ConfigError(f"a condition needs a non-empty label, got {self.label!r}")
        if isinstance(self.perturbations, Perturbation):
            raise ConfigError(f"condition {self.label!r}: perturbations must be a sequence, e.g. (stim,)")
        perturbations = tuple(self.perturbations)
        for item in perturbations:
            if not isinstance(item, Perturbation):
                raise ConfigError(f"condition {self.label!r}: {item!r} is not a Perturbation")
        object.__setattr__(self, "perturbations", perturbations)
        self.layer()

    @property
    def is_control(self) -> bool:
        return not self.perturbations

    def layer(self) -> str | None:
        """The layer every perturbation acts on, or None for a control condition."""
        layers = sorted({p.layer for p in self.perturbations})
        if len(layers) > 1:
            raise ConfigError(
                f"condition {self.label!r} perturbs several layers {layers}; one condition acts on one layer"
            )
        return layers[0] if layers else None

    def effect(self, sheet: CorticalSheet) -> UnitEffect:
        """Combined effect on ``sheet`` (exactly the identity for a control condition)."""
        combined = UnitEffect.identity(sheet.n_units)
        for perturbation in self.perturbations:
            combined = combined.combine(perturbation.effect(sheet))
        return combined

    @staticmethod
    def batch_effects(conditions, sheet: CorticalSheet, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Combined effects of many conditions on ``sheet`` at once: (multiplier, additive), each
        (n_conditions, N) float64 (float32 on MPS) on ``device``; row i equals ``conditions[i].effect(sheet)``
        (a control row is exactly the identity). Perturbations of one class are computed together. Treat the
        results as read-only (see :meth:`Perturbation.batch_effect`)."""
        conditions = list(conditions)
        dtype = _effect_dtype(device)
        by_class: dict[type, list[tuple[int, Perturbation]]] = {}
        for row, condition in enumerate(conditions):
            for perturbation in condition.perturbations:
                by_class.setdefault(type(perturbation), []).append((row, perturbation))
        if len(by_class) == 1:
            kind, members = next(iter(by_class.items()))
            if [row for row, _ in members] == list(range(len(conditions))):  # one perturbation of one kind each
                m, a = kind.batch_effect([p for _, p in members], sheet, device)
                return m.to(dtype), a.to(dtype)
        multiplier = torch.ones((len(conditions), sheet.n_units), dtype=dtype, device=device)
        additive = torch.zeros((len(conditions), sheet.n_units), dtype=dtype, device=device)
        for kind, members in by_class.items():
            rows = torch.tensor([row for row, _ in members], dtype=torch.long, device=device)
            m, a = kind.batch_effect([p for _, p in members], sheet, device)
            for picked in _slots(rows):  # a condition may hold several perturbations of one class
                target = rows[picked]
                multiplier[target] = multiplier[target] * m[picked].to(dtype)
                additive[target] = additive[target] + a[picked].to(dtype)
        return multiplier, additive

    def describe(self) -> dict:
        """Flat record: the label, and the parameters of the perturbation(s) (prefixed ``p<i>_`` when several)."""
        record = {"label": self.label, "n_perturbations": len(self.perturbations)}
        if self.is_control:
            record["kind"] = "control"
        elif len(self.perturbations) == 1:
            record.update(self.perturbations[0].describe())
        else:
            record["kind"] = "+".join(p.kind for p in self.perturbations)
            record["layer"] = self.layer()
            for index, perturbation in enumerate(self.perturbations):
                record.update({f"p{index}_{key}": value for key, value in perturbation.describe().items()})
        return record

    def to_dict(self) -> dict:
        return {"label": self.label, "perturbations": [p.to_dict() for p in self.perturbations]}

    @classmethod
    def from_dict(cls, record: Mapping) -> "Condition":
        """Rebuild from ``to_dict`` output; unknown keys raise ConfigError."""
        if not isinstance(record, Mapping):
            raise ConfigError(f"a condition must be a table/dict, got {type(record).__name__}")
        unknown = sorted(set(record) - {"label", "perturbations"})
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown} for a condition; allowed keys: label, perturbations")
        if "label" not in record:
            raise ConfigError("a condition needs a 'label'")
        return cls(record["label"], tuple(perturbation_from_dict(p) for p in record.get("perturbations", ())))
