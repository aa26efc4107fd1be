"""Conditions: the perturbations of one experimental condition, applied together to one layer (none = control),
and their combined effects for one condition or many at once."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from stimsim.cortex.sheet import CorticalSheet
from stimsim.stimulation.base import Perturbation, UnitEffect, _effect_dtype, _slots, perturbation_from_dict
from stimsim.utilities.errors import ConfigError


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
