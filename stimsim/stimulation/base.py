"""The perturbation interface: frozen specs with units, and what they do to the units of one layer.

A perturbation is a frozen spec (site(s) in sheet mm, current in µA, power in mW, ...). Given the
:class:`~stimsim.cortex.sheet.CorticalSheet` of the layer it acts on, its kind's ``batch_effect`` gives the per-unit
``multiplier`` and ``additive`` terms of many perturbations at once as (n, N) tensors on any torch device, applied
as ``activity × multiplier + additive``; ``effect(sheet)`` is the same computation for one perturbation, as a
:class:`UnitEffect`. Each kind is one module of this package (:mod:`~stimsim.stimulation.electrical`,
:mod:`~stimsim.stimulation.suppression`, :mod:`~stimsim.stimulation.ablation`), registered in
:data:`PERTURBATION_KINDS`.

Specs round-trip through plain dicts (``to_dict`` / ``from_dict``, JSON and TOML friendly: ``None``
values are left out, since TOML has no null) and refuse unknown keys, so a typo in an experiment file
is an error rather than a silently ignored parameter.
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

from stimsim.cortex.sheet import CorticalSheet
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.plugins import Registry


def _check_perturbation_class(kind: str, cls) -> None:
    """A perturbation kind is a :class:`Perturbation` subclass registered under its own ``kind``."""
    if not (isinstance(cls, type) and issubclass(cls, Perturbation)):
        raise TypeError(f"perturbation kind {kind!r} must be a Perturbation subclass, got {cls!r}")
    fields = {field.name for field in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    if not {"sites_mm", "layer"} <= fields or not cls.__dataclass_params__.frozen:
        raise TypeError(f"perturbation kind {kind!r}: class {cls.__name__} must be a frozen dataclass with the fields "
                        f"sites_mm and layer besides its parameters (see stimsim.stimulation.base)")
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
def parameter(default=dataclasses.MISSING, *, unit: str, low: float | None = None, high: float | None = None,
              low_open: bool = False, high_open: bool = False, choices=None):
    """A perturbation parameter, declared once: its unit, and its allowed interval (``low``/``high``, each closed
    unless ``low_open``/``high_open``; None: unbounded) or its ``choices`` (a tuple of text, or a function that
    returns one, e.g. a registry's names). The perturbation checks it on creation
    (:meth:`Perturbation.check_parameters`; a default of None means the parameter may be left unset) and its JSON
    Schema states it (:meth:`Perturbation.parameters_schema`)."""
    return dataclasses.field(default=default, metadata={
        "unit": unit, "low": low, "high": high, "low_open": low_open, "high_open": high_open, "choices": choices})


def _allowed(choices) -> tuple[str, ...]:
    """The allowed values of a :func:`parameter` declared with ``choices``."""
    return tuple(choices()) if callable(choices) else tuple(choices)


def _number(name: str, value, unit: str) -> float:
    in_unit = unit if unit.startswith("(") else f"in {unit}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number {in_unit}, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be finite {in_unit}, got {value}")
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

    Subclasses set ``kind`` and implement ``batch_effect`` (their physics, in torch, for one perturbation or
    many) and ``describe``.
    """

    kind: ClassVar[str]
    sites_mm: tuple[tuple[float, float], ...]
    layer: str

    #: Whether the kind passes charge through an electrode (it then has ``current_uA``, ``pulse_width_ms`` and
    #: ``waveform``): every such perturbation goes through the safety gate (:func:`stimsim.stimulation.enforce`).
    carries_charge: ClassVar[bool] = False

    #: The parameters at which 0 delivers nothing (a train of 0 Hz, 0 mW of light, 0 µL of muscimol): allowed in
    #: code, where a null perturbation is a useful control, refused in a file by :meth:`check_delivers`.
    doses: ClassVar[tuple[str, ...]] = ()

    def check_delivers(self) -> None:
        """Refuse (``ConfigError``) a perturbation that delivers nothing because one of its :attr:`doses` is 0:
        in an experiment file that is a mistake (the unperturbed condition is the control already)."""
        for name in self.doses:
            if getattr(self, name) == 0:
                unit = next(f.metadata["unit"] for f in dataclasses.fields(self) if f.name == name)
                raise ConfigError(f"{name} must be > 0 {unit}: {self.kind} stimulation at 0 delivers nothing, and the "
                                  "unstimulated condition is the control already")

    @classmethod
    @abc.abstractmethod
    def batch_effect(cls, perturbations, sheet: CorticalSheet, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The kind's physics, stated once: the effects of several perturbations of this class on ``sheet``,
        (multiplier, additive), each (n, N) float64 (float32 on devices without float64) on ``device``. Treat
        them as read-only: a term that is the same everywhere may be one row broadcast (stride 0). Sites off
        the sheet are refused."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """Flat ``{name_with_unit: number | str}`` record of the spec, for labelled results."""

    def check_parameters(self) -> None:
        """Check every parameter declared with :func:`parameter` (``ConfigError`` naming it, its unit and what is
        allowed) and store it as a float (numbers) or as given (choices)."""
        for declared in dataclasses.fields(self):
            rule = declared.metadata
            value = getattr(self, declared.name)
            if "unit" not in rule or (value is None and declared.default is None):
                continue
            if rule["choices"] is not None:
                value = _choice(declared.name, value, _allowed(rule["choices"]))
            else:
                try:
                    value = _in_range(declared.name, value, rule["unit"], rule["low"], rule["high"],
                                      rule["low_open"], rule["high_open"])
                except ConfigError as exc:
                    below = isinstance(value, numbers.Real) and not isinstance(value, bool) and value < 0
                    if below and declared.name in self.doses and rule["low"] == 0:
                        raise ConfigError(f"{exc} (0 delivers nothing: a null control in code, refused in a "
                                          "file)") from None
                    raise
            object.__setattr__(self, declared.name, value)

    @classmethod
    def parameters_schema(cls) -> dict:
        """JSON Schema of the kind's parameters as a file's table gives them (``kind`` and every declared
        parameter with its unit, bounds or choices and default; ``sites_mm`` and ``layer`` come from elsewhere)."""
        properties = {"kind": {"const": cls.kind, "description": "the perturbation kind"}}
        required = ["kind"]
        for declared in dataclasses.fields(cls):
            rule = declared.metadata
            if "unit" not in rule:
                continue
            entry = {"description": f"unit: {rule['unit']}"}
            if rule["choices"] is not None:
                entry.update(type="string", enum=list(_allowed(rule["choices"])))
            else:
                entry["type"] = "number"
                for bound, closed, opened in (("low", "minimum", "exclusiveMinimum"),
                                              ("high", "maximum", "exclusiveMaximum")):
                    if rule[bound] is not None:
                        # a file refuses a dose of 0 (check_delivers)
                        is_open = rule[f"{bound}_open"] or (bound == "low" and declared.name in cls.doses)
                        entry[opened if is_open else closed] = rule[bound]
            if declared.default is dataclasses.MISSING:
                required.append(declared.name)
            elif declared.default is None:
                entry = {"anyOf": [entry, {"type": "null"}], "default": None}
            else:
                entry["default"] = declared.default
            properties[declared.name] = entry
        return {"title": f"{cls.__name__} ([stimulation] kind = {cls.kind!r})", "type": "object",
                "description": (cls.__doc__ or "").strip().split("\n\n")[0], "properties": properties,
                "required": required}

    def effect(self, sheet: CorticalSheet) -> UnitEffect:
        """Per-unit effect on the layer whose positions are ``sheet``: :meth:`batch_effect` of this one
        perturbation, on the CPU in float64."""
        if not isinstance(sheet, CorticalSheet):
            raise TypeError(f"{self.kind} effect needs the CorticalSheet of the layer it acts on (e.g. "
                            f"model.sheet({self.layer!r})), got {type(sheet).__name__}")
        multiplier, additive = type(self).batch_effect([self], sheet, device="cpu")
        return UnitEffect(multiplier[0].numpy(), additive[0].numpy())

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
    def from_dict(cls, record: Mapping, supplied: tuple[str, ...] = (),
                  file_keys: tuple[str, ...] = ()) -> "Perturbation":
        """Rebuild a spec from ``to_dict`` output; unknown or missing keys raise ConfigError. For a file's table:
        ``supplied``, keys the caller fills in itself (the file's sites and layer), left out of the allowed keys an
        error names; ``file_keys``, the table's own keys besides the kind's, named among them."""
        if cls is Perturbation:
            return perturbation_from_dict(record, supplied, file_keys)
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
            named = ", ".join([name for name in allowed if name not in supplied] + list(file_keys))
            raise ConfigError(f"unknown key(s) {unknown} for a perturbation of kind {cls.kind!r}; allowed keys: kind, "
                              f"{named}")
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


def perturbation_from_dict(record: Mapping, supplied: tuple[str, ...] = (),
                           file_keys: tuple[str, ...] = ()) -> Perturbation:
    """Build a perturbation from a dict whose ``kind`` is one of :data:`PERTURBATION_KINDS` (``supplied``,
    ``file_keys``: as in :meth:`Perturbation.from_dict`)."""
    if not isinstance(record, Mapping):
        raise ConfigError(f"a perturbation must be a table/dict, got {type(record).__name__}")
    kind = record.get("kind")
    if kind not in PERTURBATION_KINDS:
        raise ConfigError(f"perturbation kind must be one of {', '.join(PERTURBATION_KINDS)}; got {kind!r}")
    return PERTURBATION_KINDS[kind].from_dict(record, supplied, file_keys)
