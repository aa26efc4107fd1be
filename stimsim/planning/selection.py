"""Ranking of rehearsed sites and the lab's constraints on which electrodes may be chosen.

Sites are ranked by predicted ΔAUC (largest first; ties by electrode order). The chosen sites are taken
greedily down that ranking: an electrode is skipped when it is broken (listed by the lab, or failing the
reliability criterion) or closer than ``min_separation_mm`` (``"euclidean"`` or ``"manhattan"``, on the
array, mm) to a site already chosen; selection stops at ``n_sites``.
"""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from stimsim.utilities.errors import ConfigError
from stimsim.utilities.filemodels import FileModel
from stimsim.utilities.ordering import natural_key

METRICS = ("euclidean", "manhattan")
#: Separations within this much (mm) of ``min_separation_mm`` count as equal to it: grid positions such as
#: 1.4 and 1.8 mm carry binary round-off, so two Utah electrodes exactly two pitches apart can come out at
#: 0.7999999999999998 mm.
SEPARATION_TOLERANCE_MM = 1e-9


class SelectionSpec(FileModel):
    """A plan's ``[selection]`` table and the broken electrodes of its ``[array]``: n_sites : sites to choose;
    min_separation_mm : between any two chosen sites (array mm); metric : "euclidean" or "manhattan";
    broken_electrodes : ids the lab marks broken (numbers are read as their text)."""

    table: ClassVar[str] = "selection"

    n_sites: Annotated[int, Field(ge=1)] = 16
    min_separation_mm: Annotated[float, Field(ge=0)] = 0.0
    metric: Literal[METRICS] = "euclidean"
    broken_electrodes: tuple[str, ...] = ()

    @field_validator("broken_electrodes", mode="before")
    @classmethod
    def _as_text(cls, ids):
        if isinstance(ids, (list, tuple)) and all(isinstance(e, (str, int)) and not isinstance(e, bool) for e in ids):
            return tuple(str(e) for e in ids)
        return ids


#: Why a recorded electrode that is not broken is left out of a plan as not working, in the order checked.
LEFT_OUT_REASONS = {
    "constant_response": "a constant response (every presentation the same value: split-half reliability undefined)",
    "reliability_undefined": "split-half reliability undefined (in some split, one half's image means do not vary)",
    "below_min_reliability": "split-half reliability below min_reliability"}


def screen_electrodes(electrode_ids, broken, reliability, min_reliability: float, constant=()) -> tuple[list, dict]:
    """The working electrodes of ``electrode_ids`` (their order kept) and, by reason (:data:`LEFT_OUT_REASONS`),
    the ones left out that are not ``broken``, in the natural order of their ids ("3" before "10", as a lab
    looks them up), whatever the order of ``electrode_ids``.

    ``reliability`` maps electrode id → split-half reliability (NaN where undefined), or is None when none is
    asked for: then every electrode that is not broken and not constant works. ``constant`` holds the ids of the
    electrodes whose recorded responses are all the same value: they tell nothing, whatever the reliability asked."""
    broken, constant = set(map(str, broken)), set(map(str, constant))
    working, left_out = [], {reason: [] for reason in LEFT_OUT_REASONS}
    for electrode in map(str, electrode_ids):
        if electrode in broken:
            continue
        value = np.nan if reliability is None else float(reliability.get(electrode, np.nan))
        if electrode in constant:
            left_out["constant_response"].append(electrode)
        elif reliability is None:
            working.append(electrode)
        elif not np.isfinite(value):
            left_out["reliability_undefined"].append(electrode)
        elif value < min_reliability:
            left_out["below_min_reliability"].append(electrode)
        else:
            working.append(electrode)
    return working, {reason: sorted(ids, key=natural_key) for reason, ids in left_out.items()}


def left_out_message(left_out: dict, min_reliability: float) -> str | None:
    """One sentence naming the electrodes left out by :func:`screen_electrodes` and why; None when there are none."""
    parts = [LEFT_OUT_REASONS[reason] + (f" = {min_reliability:g}" if reason == "below_min_reliability" else "")
             + f": {len(ids)} ({', '.join(ids)})" for reason, ids in left_out.items() if ids]
    if not parts:
        return None
    total = sum(len(ids) for ids in left_out.values())
    return f"{total} recorded electrode(s) left out of the plan as not working — " + "; ".join(parts)


def check_broken(broken, electrode_ids, where: str = "selection.broken_electrodes") -> None:
    """Every broken id must name an electrode of the array."""
    known = set(str(e) for e in electrode_ids)
    unknown = [str(e) for e in broken if str(e) not in known]
    if unknown:
        preview = sorted(known, key=lambda e: (len(e), e))[:6]
        raise ConfigError(f"{where}: unknown electrode id(s) {unknown}; the array's ids are e.g. {preview}")


def separation_mm(a, b, metric: str) -> np.ndarray:
    """Distances (mm) between points ``a`` (..., 2) and ``b`` (..., 2)."""
    difference = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if metric == "euclidean":
        return np.sqrt((difference ** 2).sum(-1))
    if metric == "manhattan":
        return np.abs(difference).sum(-1)
    raise ConfigError(f"metric must be one of {list(METRICS)}, got {metric!r}")


def rank_sites(predicted: np.ndarray) -> np.ndarray:
    """Indices of sites from the largest predicted effect to the smallest (stable for ties; NaN last)."""
    values = np.asarray(predicted, dtype=np.float64)
    return np.lexsort((np.arange(len(values)), np.where(np.isnan(values), np.inf, -values)))


def choose_sites(electrode_ids, array_xy_mm, predicted, spec: SelectionSpec, unusable=(), array_ids=None) -> dict:
    """Greedy choice under the constraints.

    Returns ``{"order": ranked indices, "chosen": indices chosen (rank order), "reason": per-site text}``:
    "chosen", "broken", "unreliable", "no prediction" (NaN), "too close to <id>" or "beyond n_sites". Broken ids are checked against
    ``array_ids`` (every electrode of the array; default ``electrode_ids``).
    """
    ids = [str(e) for e in electrode_ids]
    check_broken(spec.broken_electrodes, ids if array_ids is None else array_ids)
    xy = np.asarray(array_xy_mm, dtype=np.float64)
    predicted = np.asarray(predicted, dtype=np.float64)
    order = rank_sites(predicted)
    broken, unusable = set(spec.broken_electrodes), set(str(e) for e in unusable)
    chosen, reason = [], [""] * len(ids)
    for index in order:
        if ids[index] in broken:
            reason[index] = "broken"
        elif ids[index] in unusable:
            reason[index] = "unreliable"
        elif not np.isfinite(predicted[index]):
            reason[index] = "no prediction"
        elif len(chosen) >= spec.n_sites:
            reason[index] = "beyond n_sites"
        else:
            distance = separation_mm(xy[chosen], xy[index], spec.metric) if chosen else np.array([])
            close = np.flatnonzero(distance < spec.min_separation_mm - SEPARATION_TOLERANCE_MM)
            if len(close):
                reason[index] = f"too close to {ids[chosen[close[0]]]}"
            else:
                chosen.append(int(index))
                reason[index] = "chosen"
    return {"order": order, "chosen": np.asarray(chosen, dtype=np.int64), "reason": reason}


def shortfall_message(choice: dict, spec: SelectionSpec) -> str | None:
    """None when :func:`choose_sites` chose ``spec.n_sites`` sites; else why it chose fewer (counts per reason)."""
    chosen = len(choice["chosen"])
    if chosen >= spec.n_sites:
        return None
    reasons = ["too close" if r.startswith("too close to") else "without a prediction" if r == "no prediction" else r
               for r in choice["reason"] if r != "chosen"]
    counts = {reason: reasons.count(reason) for reason in dict.fromkeys(reasons)}
    why = ", ".join(f"{n} {'within min_separation_mm = %g of a chosen site' % spec.min_separation_mm if r == 'too close' else r}"
                    for r, n in counts.items())
    return (f"{chosen} site(s) chosen of the n_sites = {spec.n_sites} asked: the other working electrodes are "
            f"{why or 'none'}")


def ranking_reliability(effects: np.ndarray) -> float:
    """How reproducible the sites' ranking is over image sequences: ICC(1,k) of ``effects`` (sites × sequences).

    One-way random-effects intraclass correlation of the mean of k sequences (Shrout & Fleiss 1979, case 1,k):
    (MS_between − MS_within) / MS_between — the share of the spread of the site means that a fresh set of k
    sequences would reproduce. Sites with a NaN are left out; NaN when fewer than 3 sites or 2 sequences
    remain, or the site means do not vary. Chance (no site differences) is 0; it can fall below 0 by noise.
    """
    effects = np.asarray(effects, dtype=float)
    effects = effects[np.isfinite(effects).all(1)]
    n_sites, k = effects.shape
    if n_sites < 3 or k < 2:
        return float("nan")
    between = k * effects.mean(1).var(ddof=1)
    within = effects.var(1, ddof=1).mean()
    return float((between - within) / between) if between > 0 else float("nan")
