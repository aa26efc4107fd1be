"""Safety gate for electrical microstimulation protocols.

For a protocol with current I (µA) and phase width PW (ms) on an electrode of geometric area A:

* charge per phase ``Q = I · PW`` (µA·ms = nC; 50 µA × 0.2 ms = 10 nC);
* charge density ``D = Q / A`` in µC/cm²;
* Shannon's criterion ``k = log10(D / (µC/cm²)) + log10(Q / µC)`` (Shannon 1992, IEEE Trans Biomed
  Eng 39:424); damage becomes likely above k ≈ 1.85 in the data Shannon fitted, and cautious labs
  use a lower limit;
* charge-balanced (biphasic) pulses only.

``check_protocol`` measures a protocol against :class:`SafetyLimits`; ``enforce`` refuses a protocol
that violates a limit (:class:`~stimsim.utilities.errors.SafetyError`) unless an override reason is given, and
then records the override in the report. Limits may be tightened freely; a limit looser than its
default (a higher ``max_shannon_k``, a larger ``electrode_area_um2`` than the Utah tip's) is itself a
violation, so loosening a limit needs an override reason like any other.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from stimsim.stimulation.base import Perturbation, _in_range
from stimsim.stimulation.electrical import CHARGE_BALANCED_WAVEFORMS
from stimsim.utilities.errors import ConfigError, SafetyError

#: Geometric surface area of one Utah-array electrode tip, µm²: the 2000 µm² sputtered-iridium-oxide
#: tips of the penetrating arrays characterised by Cogan, Ehrlich, Plante & Van Wagenen 2009
#: (Proc IEEE EMBC 2009:7147). Arrays with other tip exposures need their own value.
UTAH_TIP_AREA_UM2 = 2000.0
#: The usual limit on Shannon's k (Shannon 1992).
SHANNON_K_LIMIT = 1.85
#: Electrode areas accepted, µm²: from the tip of a fine microwire (1 µm²) to a 1 cm² surface electrode.
ELECTRODE_AREA_RANGE_UM2 = (1.0, 1e8)

#: The ``[safety]`` keys of experiment, plan and visualisation files, with the ranges :class:`SafetyLimits` takes.
FileShannonK = Annotated[float, Field(gt=0)]
FileElectrodeArea = Annotated[float, Field(ge=ELECTRODE_AREA_RANGE_UM2[0], le=ELECTRODE_AREA_RANGE_UM2[1])]
FileChargeLimit = Annotated[float, Field(gt=0)]

_UM2_PER_CM2 = 1e8
_NC_PER_UC = 1e3


@dataclass(frozen=True)
class SafetyLimits:
    """Limits a protocol must respect.

    Attributes
    ----------
    max_shannon_k : highest allowed Shannon k (dimensionless, > 0); 1.85 by default.
    electrode_area_um2 : geometric area of the stimulating electrode, µm² (Utah tip by default), within
        :data:`ELECTRODE_AREA_RANGE_UM2`.
    max_charge_per_phase_nC : optional highest charge per phase, nC (None = no such limit).
    """

    max_shannon_k: float = SHANNON_K_LIMIT
    electrode_area_um2: float = UTAH_TIP_AREA_UM2
    max_charge_per_phase_nC: float | None = None

    def __post_init__(self):
        for name, value in (("max_shannon_k", self.max_shannon_k), ("electrode_area_um2", self.electrode_area_um2)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
        if self.max_shannon_k <= 0:
            raise ConfigError(f"max_shannon_k must be a finite number > 0, got {self.max_shannon_k!r}")
        low, high = ELECTRODE_AREA_RANGE_UM2
        if not low <= self.electrode_area_um2 <= high:
            raise ConfigError(f"electrode_area_um2 must be in [{low:g}, {high:g}] µm² (a fine microwire's tip to a "
                              f"1 cm² surface electrode), got {self.electrode_area_um2!r}")
        limit_nC = self.max_charge_per_phase_nC
        if limit_nC is not None and (isinstance(limit_nC, bool) or not isinstance(limit_nC, (int, float))
                                     or not math.isfinite(limit_nC) or limit_nC <= 0):
            raise ConfigError(f"max_charge_per_phase_nC must be None or a finite number > 0 nC, got {limit_nC!r}")
        object.__setattr__(self, "max_shannon_k", float(self.max_shannon_k))
        object.__setattr__(self, "electrode_area_um2", float(self.electrode_area_um2))
        if limit_nC is not None:
            object.__setattr__(self, "max_charge_per_phase_nC", float(limit_nC))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def loosened(self) -> list[str]:
        """Messages naming every limit set looser than its default (empty when none is)."""
        defaults = SafetyLimits()
        messages = []
        if self.max_shannon_k > defaults.max_shannon_k:
            messages.append(f"max_shannon_k = {self.max_shannon_k:g} is above the default limit "
                            f"{defaults.max_shannon_k:g}")
        if self.electrode_area_um2 > defaults.electrode_area_um2:
            messages.append(f"electrode_area_um2 = {self.electrode_area_um2:g} µm² is larger than the default "
                            f"electrode's {defaults.electrode_area_um2:g} µm² (a Utah-array tip), which lowers "
                            f"the charge density checked")
        return messages


@dataclass(frozen=True)
class SafetyReport:
    """Outcome of a safety check: the protocol's charge figures, the limits, and any violations.

    ``passed`` is True only when no limit is violated; an overridden violation keeps
    ``passed=False`` and sets ``overridden=True`` with the ``override_reason``.
    """

    current_uA: float
    pulse_width_ms: float
    waveform: str
    charge_per_phase_nC: float
    charge_density_uC_per_cm2: float
    shannon_k: float
    charge_balanced: bool
    passed: bool
    violations: list[str]
    limits: SafetyLimits
    overridden: bool = False
    override_reason: str | None = None

    def to_dict(self) -> dict:
        """JSON-friendly record (numbers, strings, booleans, null, a list of messages)."""
        record = {spec_field.name: getattr(self, spec_field.name) for spec_field in dataclasses.fields(self)}
        record["violations"] = list(self.violations)
        record["limits"] = self.limits.to_dict()
        return record


def charge_per_phase_nC(current_uA: float, pulse_width_ms: float) -> float:
    """Charge per phase Q = I·PW, nC (µA × ms = nC); a current >= 0 µA and a phase width > 0 ms (finite), else
    ConfigError."""
    return (_in_range("current_uA", current_uA, "µA", low=0.0)
            * _in_range("pulse_width_ms", pulse_width_ms, "ms", low=0.0, low_open=True))


def charge_density_uC_per_cm2(charge_per_phase_nC: float, electrode_area_um2: float) -> float:
    """Charge density D = Q / A, µC/cm², for a charge per phase (nC, >= 0) on an electrode area (µm², > 0)."""
    charge = _in_range("charge_per_phase_nC", charge_per_phase_nC, "nC", low=0.0)
    area = _in_range("electrode_area_um2", electrode_area_um2, "µm²", low=0.0, low_open=True)
    return (charge / _NC_PER_UC) / (area / _UM2_PER_CM2)


def shannon_k(charge_per_phase_nC: float, electrode_area_um2: float) -> float:
    """Shannon's k = log10(D µC/cm²) + log10(Q µC) for a charge per phase (nC, > 0: k of no charge is -inf) on an
    area (µm²)."""
    _in_range("charge_per_phase_nC", charge_per_phase_nC, "nC", low=0.0, low_open=True)
    density = charge_density_uC_per_cm2(charge_per_phase_nC, electrode_area_um2)
    return math.log10(density) + math.log10(charge_per_phase_nC / _NC_PER_UC)


def largest_safe_current_uA(pulse_width_ms: float, limits: SafetyLimits | None = None) -> float:
    """The largest current (µA, rounded down to 0.1 µA; 0 where 0.1 µA is already outside) within ``limits`` at
    ``pulse_width_ms`` per phase: Shannon's k = 2 log10(Q / µC) − log10(A / cm²) ≤ max_shannon_k gives Q ≤ 10^((k_max + log10(A / cm²)) / 2) µC, and
    Q ≤ max_charge_per_phase_nC where that is set; I = Q / PW."""
    limits = SafetyLimits() if limits is None else limits
    charge_nC = _NC_PER_UC * 10 ** ((limits.max_shannon_k + math.log10(limits.electrode_area_um2 / _UM2_PER_CM2)) / 2)
    if limits.max_charge_per_phase_nC is not None:
        charge_nC = min(charge_nC, limits.max_charge_per_phase_nC)
    current = math.floor(charge_nC / pulse_width_ms * 10 + 1e-9) / 10

    def within(value):
        charge = charge_per_phase_nC(value, pulse_width_ms)
        return charge <= 0 or shannon_k(charge, limits.electrode_area_um2) <= limits.max_shannon_k and (
            limits.max_charge_per_phase_nC is None or charge <= limits.max_charge_per_phase_nC)

    return current if within(current) else round(current - 0.1, 1)  # a bound met only to rounding


def check_protocol(stim: Perturbation, limits: SafetyLimits | None = None) -> SafetyReport:
    """Measure ``stim``, a perturbation that carries charge (``carries_charge``: it has ``current_uA``,
    ``pulse_width_ms`` and ``waveform``), against ``limits`` (default :class:`SafetyLimits`) without raising."""
    if not getattr(stim, "carries_charge", False):
        raise TypeError(f"safety checks apply to perturbations that carry charge, got {type(stim).__name__}")
    limits = SafetyLimits() if limits is None else limits
    charge_nC = charge_per_phase_nC(stim.current_uA, stim.pulse_width_ms)
    density = charge_density_uC_per_cm2(charge_nC, limits.electrode_area_um2)
    k = shannon_k(charge_nC, limits.electrode_area_um2)
    balanced = stim.waveform in CHARGE_BALANCED_WAVEFORMS
    violations = [f"{message}; a limit looser than its default counts as an override"
                  for message in limits.loosened()]
    if k > limits.max_shannon_k:
        violations.append(
            f"Shannon's k = {k:.3f} exceeds the limit max_shannon_k = {limits.max_shannon_k:g} "
            f"({stim.current_uA:g} µA × {stim.pulse_width_ms:g} ms = {charge_nC:g} nC per phase, "
            f"{density:.1f} µC/cm² on a {limits.electrode_area_um2:g} µm² electrode)"
        )
    if limits.max_charge_per_phase_nC is not None and charge_nC > limits.max_charge_per_phase_nC:
        violations.append(
            f"charge per phase {charge_nC:g} nC exceeds the limit max_charge_per_phase_nC = "
            f"{limits.max_charge_per_phase_nC:g} nC"
        )
    if (k > limits.max_shannon_k or limits.max_charge_per_phase_nC is not None
            and charge_nC > limits.max_charge_per_phase_nC):
        violations[-1] += (f"; the largest current within the limits at {stim.pulse_width_ms:g} ms per phase is "
                           f"{largest_safe_current_uA(stim.pulse_width_ms, limits):g} µA")
    if not balanced:
        violations.append(
            f"waveform {stim.waveform!r} is not charge-balanced; the limit allows only "
            f"{', '.join(CHARGE_BALANCED_WAVEFORMS)}"
        )
    return SafetyReport(
        current_uA=stim.current_uA, pulse_width_ms=stim.pulse_width_ms, waveform=stim.waveform,
        charge_per_phase_nC=charge_nC, charge_density_uC_per_cm2=density, shannon_k=k,
        charge_balanced=balanced, passed=not violations, violations=violations, limits=limits,
    )


def enforce(stim: Perturbation, limits: SafetyLimits | None = None,
            override: str | None = None) -> SafetyReport:
    """Check ``stim``; raise SafetyError on a violation unless ``override`` gives a reason.

    With an override reason the report of a violating protocol says ``passed=False, overridden=True``
    and keeps the reason; a protocol within the limits passes and has nothing overridden.
    """
    if override is not None and (not isinstance(override, str) or not override.strip()):
        raise ConfigError(f"the safety override must be None or a non-empty reason (text), got {override!r}")
    report = check_protocol(stim, limits)
    if report.passed:
        return report
    if override is None:
        raise SafetyError(
            "stimulation protocol refused: " + "; ".join(report.violations)
            + ". To run it anyway, give an override reason (in Python safety_override='<reason>' to simulate(), "
            "override='<reason>' to enforce(); `override = \"...\"` in the [safety] table of an experiment, plan or "
            "visualisation file); the reason is recorded with the results."
        )
    return dataclasses.replace(report, overridden=True, override_reason=override.strip())
