"""Electrical microstimulation: a charge-balanced pulse train through one or more electrodes, its spread over the
sheet by a registered spread law (:mod:`stimsim.stimulation.spread`) and its multiplicative or additive effect."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from stimsim.cortex.sheet import CorticalSheet
from stimsim.stimulation.base import (Perturbation, _choice, _constant, _in_range, _layer, _per_row, _reduce_rows,
                                      _site_distances, _sites, parameter, register_perturbation)
from stimsim.stimulation.spread import (SPREAD_LAWS, TEHOVNIK_K_DEFAULT_UA_PER_MM2, TEHOVNIK_K_RANGE_UA_PER_MM2,
                                        spread_extent_mm)
from stimsim.utilities.errors import ConfigError

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
#: Longest train accepted, ms (10 s; published IT microstimulation trains last 50-500 ms).
MAX_TRAIN_MS = 10_000.0
#: How a file states the additive form's ``activation_per_Hz``: in the stimulated layer's activation units, or in
#: standard deviations of its response (so that one value means the same strength in models of any scale).
ADDITIVE_SCALES = ("activation", "sd")


def check_additive_scale(additive_scale: str, form: str | None) -> None:
    """``additive_scale = "sd"`` sets the scale of the additive form: with another ``form`` a ConfigError."""
    if additive_scale == "sd" and form != "additive":
        raise ConfigError('additive_scale = "sd" sets the scale of the additive form; give form = "additive" or '
                          "remove additive_scale")


def additive_scale_record(activation_per_Hz_sd: float, responses) -> dict:
    """``additive_scale = "sd"`` resolved for one model: ``activation_per_Hz_sd`` (SDs of the layer's response per Hz
    of rate increment) × the SD of ``responses`` (images × units of that layer; one SD over both, population SD)
    gives ``activation_per_Hz`` in the layer's activation units. Returns {"additive_scale": "sd", "layer_sd",
    "activation_per_Hz_sd", "activation_per_Hz"}; a layer whose response does not vary is a ConfigError."""
    layer_sd = float(torch.as_tensor(responses, dtype=torch.float64).std(correction=0))
    if not math.isfinite(layer_sd) or layer_sd <= 0:
        raise ConfigError(f"additive_scale = \"sd\" needs a layer whose response varies; its SD over "
                          f"{len(responses)} images is {layer_sd}")
    return {"additive_scale": "sd", "layer_sd": layer_sd, "activation_per_Hz_sd": float(activation_per_Hz_sd),
            "activation_per_Hz": float(activation_per_Hz_sd) * layer_sd}


@register_perturbation
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
    2). f = 0 Hz gives exactly the identity. Units with zero activity stay at zero, unless
    ``resting_fraction`` K > 0: then activity a becomes ``gain·a + (gain − 1)·K·s``, with s each unit's
    resting activity recorded with the model (:mod:`stimsim.models.resting`; a model without it is refused).

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
    carries_charge: ClassVar[bool] = True
    doses: ClassVar[tuple[str, ...]] = ("frequency_Hz",)

    sites_mm: tuple[tuple[float, float], ...]
    current_uA: float = parameter(50.0, unit="µA", low=0.0, high=MAX_CURRENT_UA, low_open=True)
    frequency_Hz: float = parameter(200.0, unit="Hz", low=0.0, high=1000.0)
    pulse_width_ms: float = parameter(0.2, unit="ms", low=0.0, high=2.0, low_open=True)
    interphase_ms: float = parameter(0.1, unit="ms", low=0.0, high=1.0)
    train_ms: float = parameter(50.0, unit="ms", low=0.0, high=MAX_TRAIN_MS, low_open=True)
    onset_ms: float = parameter(0.0, unit="ms", low=0.0)
    waveform: str = parameter("biphasic_cathodic_first", unit="pulse shape", choices=CHARGE_BALANCED_WAVEFORMS)
    spread: str = parameter("kumaravelu", unit="spread law", choices=lambda: SPREAD_LAWS.names())
    tehovnik_K_uA_per_mm2: float = parameter(TEHOVNIK_K_DEFAULT_UA_PER_MM2,
                                             unit="µA/mm² (the range reported by Tehovnik et al. 2006)",
                                             low=TEHOVNIK_K_RANGE_UA_PER_MM2[0], high=TEHOVNIK_K_RANGE_UA_PER_MM2[1])
    form: str = parameter("multiplicative", unit="how stimulation changes activity", choices=STIMULATION_FORMS)
    baseline_frequency_Hz: float = parameter(30.0, unit="Hz", low=0.0, high=1000.0, low_open=True)
    gain_cap: float | None = parameter(None, unit="(gain, dimensionless; a cap of 1 would allow no gain)", low=1.0,
                                       low_open=True)
    resting_fraction: float = parameter(0.0, unit="(of each unit's resting activity, dimensionless)", low=0.0,
                                        high=1.0)
    rate_base_Hz: float = parameter(30.0, unit="Hz (at most rate_max_Hz)", low=0.0)
    rate_max_Hz: float = parameter(200.0, unit="Hz", low=0.0, high=1000.0, low_open=True)
    rate_gain_Hz_per_Hz: float = parameter(1.0, unit="Hz per Hz", low=0.0)
    activation_per_Hz: float | None = parameter(None, unit="activation units per Hz", low=0.0, low_open=True)
    combine: str = parameter("sum", unit="how electrodes combine", choices=ELECTRODE_COMBINATIONS)
    layer: str = "IT"

    def __post_init__(self):
        def put(name, value):  # fields of a frozen dataclass are set through object.__setattr__
            object.__setattr__(self, name, value)

        put("sites_mm", _sites(self.sites_mm))
        put("spread", _choice("spread", self.spread, tuple(SPREAD_LAWS)))  # the law's lowest current comes first
        if self.waveform in MONOPHASIC_WAVEFORMS:
            raise ConfigError(
                f"waveform {self.waveform!r} is not charge-balanced; only biphasic, charge-balanced pulses are "
                f"allowed: {', '.join(CHARGE_BALANCED_WAVEFORMS)}"
            )
        law = SPREAD_LAWS.get(self.spread)
        below_law = (isinstance(self.current_uA, (int, float)) and not isinstance(self.current_uA, bool)
                     and self.current_uA <= law.lowest_current_uA())  # the law's note only where it applies
        unit = f"µA ({law.lowest_current_note})" if law.lowest_current_note and below_law else "µA"
        # the spread law sets the lowest current: checked before the declared bounds, with the law's reason
        put("current_uA", _in_range("current_uA", self.current_uA, unit, law.lowest_current_uA(), MAX_CURRENT_UA,
                                    low_open=True))
        self.check_parameters()
        pulse_ms = 2 * self.pulse_width_ms + self.interphase_ms
        if self.train_ms < pulse_ms:
            raise ConfigError(f"train_ms = {self.train_ms:g} ms is shorter than one biphasic pulse (2 × pulse_width_ms + "
                              f"interphase_ms = {pulse_ms:g} ms); a train holds at least one whole pulse")
        if self.frequency_Hz > 0:
            period_ms = 1000.0 / self.frequency_Hz
            if pulse_ms > period_ms:
                raise ConfigError(
                    f"a biphasic pulse (2 × pulse_width_ms + interphase_ms = {pulse_ms:g} ms) must fit in the "
                    f"pulse period 1000 / frequency_Hz = {period_ms:g} ms"
                )
        for name, key, needed in (("baseline_frequency_Hz", "form", "multiplicative"),
                                  ("rate_base_Hz", "form", "additive"), ("rate_max_Hz", "form", "additive"),
                                  ("rate_gain_Hz_per_Hz", "form", "additive"),
                                  ("tehovnik_K_uA_per_mm2", "spread", "tehovnik")):
            default = self.__dataclass_fields__[name].default  # a value the other form or law ignores is refused
            if getattr(self, key) != needed and getattr(self, name) != default:
                raise ConfigError(f"{name} applies to {key}={needed!r} only, and this stimulation has "
                                  f"{key}={getattr(self, key)!r}; leave it at its default {default:g}")
        put("rate_base_Hz", _in_range("rate_base_Hz", self.rate_base_Hz, "Hz (at most rate_max_Hz)",
                                      0.0, self.rate_max_Hz))
        if self.gain_cap is not None and self.form != "multiplicative":
            raise ConfigError("gain_cap applies to form='multiplicative' only; leave it unset for 'additive'")
        if self.resting_fraction > 0 and self.form != "multiplicative":
            raise ConfigError("resting_fraction applies to form='multiplicative' only; leave it at 0 for 'additive'")
        if self.activation_per_Hz is not None and self.form != "additive":
            raise ConfigError("activation_per_Hz applies to form='additive' only; leave it unset for 'multiplicative'")
        if self.activation_per_Hz is None and self.form == "additive":
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

    @classmethod
    def batch_effect(cls, perturbations, sheet: CorticalSheet, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        perturbations = list(perturbations)
        distance, owner = _site_distances(perturbations, sheet, device)
        extent = _per_row([p.spread_extent_mm for p in perturbations], owner, distance)
        laws = sorted({p.spread for p in perturbations})
        if len(laws) == 1:  # the weights may take the distances' memory
            weight = SPREAD_LAWS.get(laws[0]).weights(distance, extent)
        else:
            weight = torch.zeros_like(distance)
            for name in laws:
                rows = _per_row([p.spread == name for p in perturbations], owner, distance) > 0
                weight = torch.where(rows, SPREAD_LAWS.get(name).weights(distance.clone(), extent), weight)
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
        fraction = [p.resting_fraction for p in perturbations]  # 0 on rows of the additive form
        if any(fraction):  # the gain acting on each unit's resting activity: (gain − 1)·K·s
            additive = additive + (multiplier - 1.0) * column(fraction) * _resting(sheet, multiplier)
        return multiplier, additive

    def describe(self) -> dict:
        record = {"kind": self.kind, "layer": self.layer, **self._describe_sites(),
                  "current_uA": self.current_uA, "frequency_Hz": self.frequency_Hz,
                  "pulse_width_ms": self.pulse_width_ms, "interphase_ms": self.interphase_ms,
                  "train_ms": self.train_ms, "onset_ms": self.onset_ms, "waveform": self.waveform,
                  "spread": self.spread}
        record[SPREAD_LAWS.get(self.spread).extent_name] = self.spread_extent_mm
        if self.spread == "tehovnik":
            record["tehovnik_K_uA_per_mm2"] = self.tehovnik_K_uA_per_mm2
        record["form"] = self.form
        record["combine"] = self.combine
        if self.form == "multiplicative":
            record["baseline_frequency_Hz"] = self.baseline_frequency_Hz
            record["gain_cap"] = "none" if self.gain_cap is None else self.gain_cap
            record["resting_fraction"] = self.resting_fraction
        else:
            record.update(rate_base_Hz=self.rate_base_Hz, rate_max_Hz=self.rate_max_Hz,
                          rate_gain_Hz_per_Hz=self.rate_gain_Hz_per_Hz, rate_increment_Hz=self.rate_increment_Hz,
                          activation_per_Hz=self.activation_per_Hz)
        return record


def _resting(sheet: CorticalSheet, like: torch.Tensor) -> torch.Tensor:
    """The sheet's resting activity per unit (1, N), as ``like``; ConfigError when the model records none."""
    if sheet.resting_activity is None:
        raise ConfigError(f"resting_fraction > 0 acts on each unit's resting activity, and the model records none "
                          f"for layer {sheet.name!r}; add it with `stimsim models resting MODEL_DIR` or set "
                          "resting_fraction = 0")
    return torch.as_tensor(sheet.resting_activity, dtype=like.dtype, device=like.device)[None, :]
