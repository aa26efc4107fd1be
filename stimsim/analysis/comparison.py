"""Predictions against outcomes: the plan's predicted per-site effect against the observed ΔAUC.

Mehrer et al. 2025 (arXiv 2510.03684) report the per-site model-vs-monkey Pearson r with a
permutation p, and that the model over-estimated effect magnitudes; here also the slope of observed on
predicted (1 = right magnitude, below 1 = over-estimation) and the correlation divided by the square
root of the observed effects' noise ceiling (correction for attenuation, Spearman 1904).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from stimsim.analysis.effects import weighted_pearson
from stimsim.analysis.plan_readback import check_plan_files, not_a_plan
from stimsim.utilities.errors import FileFormatError

#: The per-site effect of a plan whose summary names none (plans made before ``effect`` was recorded).
DEFAULT_PLAN_EFFECT = "delta_auc"


def plan_effect(summary: dict, summary_path="summary.json") -> str:
    """The per-site effect a plan predicts, as its summary.json names it (``delta_auc`` for the sequence task,
    ``delta_p_face`` for the face task); its sites.csv holds it as ``predicted_<effect>``. Sessions
    measure ΔAUC of P(high) over the steps of every site's stimuli; for both tasks the plan's effect is a mean of
    the per-step changes of that same P(high) (the face task's: over its images, every level equally), so that
    they are compared by r, and by the slope only as a rough scale."""
    effect = summary.get("effect", DEFAULT_PLAN_EFFECT)
    if not isinstance(effect, str) or not effect.isidentifier():
        raise FileFormatError(summary_path, f"field 'effect' must name the plan's effect, got {effect!r}")
    return effect


def load_plan_predictions(plan_dir) -> tuple[pd.DataFrame, dict]:
    """``sites.csv`` (electrode_id as text, the predicted effect of :func:`plan_effect` with its interval, ...)
    and ``summary.json`` of a plan."""
    plan_dir = Path(plan_dir)
    sites_path, summary_path = plan_dir / "sites.csv", plan_dir / "summary.json"
    if not plan_dir.is_dir():
        raise FileNotFoundError(f"plan directory not found: {plan_dir} (a directory made by `stimsim plan`)")
    check_plan_files(plan_dir)  # first: a plan stopped while writing its outputs is said to be one
    for path in (sites_path, summary_path):
        if not path.is_file():
            raise FileNotFoundError(f"plan directory {plan_dir} has no {path.name} (made by `stimsim plan`)"
                                    f"{not_a_plan(plan_dir)}")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FileFormatError(summary_path, f"invalid JSON ({exc})") from None
    predicted = f"predicted_{plan_effect(summary if isinstance(summary, dict) else {}, summary_path)}"
    numbers = (predicted, f"{predicted}_low", f"{predicted}_high")
    sites = pd.read_csv(sites_path, dtype={"electrode_id": str})
    missing = [name for name in ("electrode_id", predicted) if name not in sites]
    if missing:
        raise FileFormatError(sites_path, f"missing column(s) {missing}{not_a_plan(plan_dir)}")
    if sites["electrode_id"].duplicated().any():
        raise FileFormatError(sites_path, "an electrode_id appears twice")
    problems = []
    for name in ("electrode_id", *numbers):
        if name not in sites:
            continue
        bad = (sites[name].isna() | (sites[name].astype(str).str.strip() == "")) if name == "electrode_id" else \
            ~np.isfinite(pd.to_numeric(sites[name], errors="coerce").to_numpy(dtype=float))
        if np.any(bad):
            rows = np.flatnonzero(bad) + 1
            problems.append(f"column {name!r}, row(s) {', '.join(map(str, rows[:5]))}"
                            f"{f' (+{rows.size - 5} more)' if rows.size > 5 else ''}: "
                            f"{'empty' if name == 'electrode_id' else 'not a number (empty, NaN or text)'}")
    if problems:
        raise FileFormatError(sites_path, "; ".join(problems) + " (every site of a plan has an id and a predicted "
                                                                 "effect with its interval)")
    for name in numbers:
        if name in sites:
            sites[name] = sites[name].astype(float)
    return sites, summary


def load_plan_sequences(plan_dir) -> tuple[Path, int, int]:
    """``plan.nc`` of a plan, the number of image sequences per site and the number of steps of each
    (its ``sequence`` and ``step`` dimensions; sessions of the plan show sequences 0 .. n_sequences - 1
    at steps 0 .. n_steps - 1)."""
    import xarray as xr

    path = Path(plan_dir) / "plan.nc"
    if not path.is_file():
        raise FileNotFoundError(f"plan directory {plan_dir} has no plan.nc (made by `stimsim plan`)")
    try:
        with xr.open_dataset(path, engine="h5netcdf") as data:
            sizes = dict(data.sizes)
    except (OSError, ValueError) as exc:
        raise FileFormatError(path, f"not a readable netCDF file ({exc})") from None
    for name, least in (("sequence", 1), ("step", 2)):
        if sizes.get(name, 0) < least:
            raise FileFormatError(path, f"no {name!r} dimension of {least} or more (the plan's sequences), got "
                                        f"{sizes.get(name) or 'none'}")
    return path, int(sizes["sequence"]), int(sizes["step"])


def _checked_noise_ceiling(noise_ceiling: float) -> float:
    """A noise ceiling is a reliability in (0, 1], or NaN when undefined (a split-half r <= 0)."""
    noise_ceiling = float(noise_ceiling)
    if not math.isnan(noise_ceiling) and not 0 < noise_ceiling <= 1:
        raise ValueError(f"a noise ceiling is a reliability in (0, 1] or NaN (undefined), got {noise_ceiling}")
    return noise_ceiling


def expected_correlation(predicted_vs_true_r: float, noise_ceiling: float, n_sites: int, ci: float = 0.95,
                         resampled_discrepancy=None) -> tuple[float, float, float]:
    """What r(predicted, observed) should be if the plan correlates with the true effects at
    ``predicted_vs_true_r`` and the observed effects have reliability ``noise_ceiling``: r·sqrt(reliability)
    (attenuation), with an interval. The noise ceiling is itself estimated from the session, and its error moves
    with the observed r's; given ``resampled_discrepancy`` (:func:`resampled_discrepancy`), the interval is the
    expectation's Fisher z plus that discrepancy's percentile spread about its median. Without it, a Fisher-z
    interval for ``n_sites`` sites that takes the ceiling as known (too narrow when the ceiling is low). NaN (all
    three) when either is undefined (NaN) or there are fewer than 4 sites (:func:`expected_correlation_reason`)."""
    noise_ceiling = _checked_noise_ceiling(noise_ceiling)
    predicted_vs_true_r = float(predicted_vs_true_r)
    if not (math.isnan(predicted_vs_true_r) or -1 <= predicted_vs_true_r <= 1):
        raise ValueError(f"predicted_vs_true_r is a correlation in [-1, 1] or NaN (undefined), got "
                         f"{predicted_vs_true_r:g}")
    if isinstance(n_sites, bool) or not isinstance(n_sites, (int, np.integer)) or n_sites < 0:
        raise ValueError(f"n_sites must be an integer >= 0 (sites compared), got {n_sites!r}")
    if not 0 < ci < 1:
        raise ValueError(f"ci must lie strictly between 0 and 1, got {ci}")
    if expected_correlation_reason(predicted_vs_true_r, noise_ceiling, n_sites) is not None:
        return float("nan"), float("nan"), float("nan")
    expected = predicted_vs_true_r * math.sqrt(noise_ceiling)
    z = math.atanh(max(min(expected, 0.999999), -0.999999))
    if resampled_discrepancy is None:
        half_width = stats.norm.ppf((1 + ci) / 2) / math.sqrt(n_sites - 3)
        return expected, math.tanh(z - half_width), math.tanh(z + half_width)
    discrepancy = np.asarray(resampled_discrepancy, dtype=float)
    discrepancy = discrepancy[np.isfinite(discrepancy)]
    if discrepancy.size < 2:
        raise ValueError(f"the interval needs at least 2 finite resampled discrepancies, got {discrepancy.size}")
    low, high = np.quantile(discrepancy - np.median(discrepancy), [(1 - ci) / 2, (1 + ci) / 2])
    return expected, math.tanh(z + low), math.tanh(z + high)


def resampled_discrepancy(weights, predicted, observed, resampled_ceilings, predicted_vs_true_r=None,
                          true=None) -> np.ndarray:
    """atanh r(predicted, observed) − atanh(r(predicted, true)·sqrt(noise ceiling)) on resamples of the sites
    (``weights`` (n_boot, n_sites) of :func:`stimsim.analysis.effects.site_resampling_weights`), each with the
    noise ceiling of the same resample (``resampled_ceilings``, 0 where it estimates no reliability) and, given
    the sites' ``true`` effects, the r(predicted, true) of the same resample (else ``predicted_vs_true_r``
    throughout). Its spread is the sampling error of the observed r against its expectation."""
    if true is None and predicted_vs_true_r is None:
        raise ValueError("give either the sites' true effects or the plan's predicted_vs_true_r")
    basis = weighted_pearson(weights, predicted, true) if true is not None else float(predicted_vs_true_r)
    observed_r = weighted_pearson(weights, predicted, observed)
    expected = np.clip(basis * np.sqrt(np.asarray(resampled_ceilings, dtype=float)), -0.999999, 0.999999)
    return np.arctanh(np.clip(observed_r, -0.999999, 0.999999)) - np.arctanh(expected)


def expected_correlation_reason(predicted_vs_true_r: float, noise_ceiling: float, n_sites: int) -> str | None:
    """Why :func:`expected_correlation` has no value, or None when it has one."""
    if not math.isfinite(noise_ceiling):
        return "the noise ceiling is undefined (see noise_ceiling_undefined_reason)"
    if not math.isfinite(predicted_vs_true_r):
        return "the plan gives no predicted vs true r"
    if n_sites < 4:
        return f"{n_sites} sites compared; the interval needs at least 4"
    return None


def compare_predictions(predicted, observed, noise_ceiling: float = float("nan"), n_perm: int = 10000,
                        seed: int = 0) -> dict:
    """Per-site predicted vs observed effects: Pearson r, its two-sided permutation p (scipy,
    pairings shuffled) and the 95 % interval of r under that null (chance), the slope of observed on
    predicted with its standard error, and r / sqrt(noise_ceiling). Sites where either is NaN are
    left out. ``noise_ceiled_r`` is NaN, with ``noise_ceiled_r_undefined_reason``, when the noise
    ceiling is undefined (NaN) or r is."""
    noise_ceiling = _checked_noise_ceiling(noise_ceiling)
    predicted = np.asarray(predicted, dtype=float)
    observed = np.asarray(observed, dtype=float)
    if predicted.ndim != 1 or predicted.shape != observed.shape:
        raise ValueError(f"predicted and observed must be 1-D, one effect per site each, got shapes {predicted.shape} "
                         f"and {observed.shape}")
    if isinstance(n_perm, bool) or not isinstance(n_perm, (int, np.integer)) or n_perm < 1:
        raise ValueError(f"n_perm must be an integer >= 1 (permutations), got {n_perm!r}")
    usable = np.isfinite(predicted) & np.isfinite(observed)
    a, b = predicted[usable], observed[usable]
    result = {"n_sites_compared": int(usable.sum()), "predicted_vs_observed_r_chance": 0.0, "slope_ideal": 1.0}
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        nan = float("nan")
        return {**result, "predicted_vs_observed_r": nan, "predicted_vs_observed_p": nan,
                "predicted_vs_observed_permutation_p": nan, "predicted_vs_observed_r_null_95": [nan, nan],
                "slope": nan, "slope_se": nan, "intercept": nan, "noise_ceiled_r": nan,
                "noise_ceiled_r_undefined_reason": f"no predicted vs observed r ({a.size} sites with both values "
                                                   "and spread; at least 3 needed)"}
    r = stats.pearsonr(a, b)
    permutation = stats.permutation_test((a, b), lambda x, y, axis=-1: _pearson(x, y, axis), vectorized=True,
                                         n_resamples=n_perm, permutation_type="pairings",
                                         alternative="two-sided", random_state=seed)
    fit = stats.linregress(a, b)
    defined = math.isfinite(noise_ceiling)
    ceiled = float(r.statistic / math.sqrt(noise_ceiling)) if defined else float("nan")
    return {**result, "predicted_vs_observed_r": float(r.statistic), "predicted_vs_observed_p": float(r.pvalue),
            "predicted_vs_observed_permutation_p": float(permutation.pvalue),
            "predicted_vs_observed_r_null_95": np.quantile(permutation.null_distribution, [0.025, 0.975]).tolist(),
            "slope": float(fit.slope), "slope_se": float(fit.stderr), "intercept": float(fit.intercept),
            "noise_ceiled_r": ceiled,
            "noise_ceiled_r_undefined_reason": None if defined else
            "the noise ceiling is undefined (see noise_ceiling_undefined_reason)"}


def _pearson(x, y, axis=-1):
    x = x - x.mean(axis=axis, keepdims=True)
    y = y - y.mean(axis=axis, keepdims=True)
    return (x * y).sum(axis=axis) / np.sqrt((x * x).sum(axis=axis) * (y * y).sum(axis=axis))
