"""Behavioural and selectivity metrics on numpy arrays: d', psychometric fits and shifts, ΔAUC,
Δaccuracy, bootstrap confidence intervals and correlations with permutation tests.

Signal levels are in percent (``signal_percent``: negative = non-face side, Afraz et al. 2006),
probabilities and accuracies are fractions in [0, 1].
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np


def _finite_array(name: str, values) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def _probability_array(name: str, values) -> np.ndarray:
    array = _finite_array(name, values)
    if np.any(array < 0) or np.any(array > 1):
        raise ValueError(f"{name} must hold probabilities or fractions in [0, 1], "
                         f"got values in [{array.min()}, {array.max()}]")
    return array


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------------------------
# Selectivity


def dprime(responses_a, responses_b, axis: int = 0, ddof: int = 1):
    """d' = (mean_a - mean_b) / sqrt((var_a + var_b) / 2) along ``axis``.

    For face selectivity pass face responses as ``a`` and non-face responses as ``b``, each
    (n_images, n_units): the result is one d' per unit ("face-selective" = d' > 1, Afraz et al. 2006).
    Variances use ``ddof`` (1: unbiased sample variance; each group needs more than ``ddof`` samples).

    Zero pooled variance: a unit whose responses are constant within both groups has d' = 0 if the
    two means are equal (e.g. a unit silent for every image: no selectivity) and d' = +inf or -inf
    if they differ (perfect separation, the limit of the formula).
    """
    a = _finite_array("responses_a", responses_a)
    b = _finite_array("responses_b", responses_b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("responses_a and responses_b must be arrays with a sample axis, not scalars")
    if not -a.ndim <= axis < a.ndim:
        raise ValueError(f"axis {axis} is out of range for arrays with {a.ndim} dimensions")
    if np.delete(np.array(a.shape), axis).tolist() != np.delete(np.array(b.shape), axis).tolist():
        raise ValueError(f"responses_a {a.shape} and responses_b {b.shape} must match on every axis but {axis}")
    ddof = _check_count("ddof", ddof, 0)
    for name, array in (("responses_a", a), ("responses_b", b)):
        if array.shape[axis] <= ddof:
            raise ValueError(f"{name} has {array.shape[axis]} samples along axis {axis}; d' with ddof={ddof} "
                             f"needs at least {ddof + 1}")
    difference = a.mean(axis=axis) - b.mean(axis=axis)
    pooled_sd = np.sqrt((a.var(axis=axis, ddof=ddof) + b.var(axis=axis, ddof=ddof)) / 2.0)
    zero_variance = pooled_sd == 0
    result = difference / np.where(zero_variance, 1.0, pooled_sd)  # 0 where both mean and variance agree
    result = np.where(zero_variance & (difference > 0), np.inf, result)
    result = np.where(zero_variance & (difference < 0), -np.inf, result)
    return float(result) if result.ndim == 0 else result


# --------------------------------------------------------------------------------------------
# Psychometric curves (Afraz, Kiani & Esteky 2006, Nature 442:692)


@dataclass(frozen=True)
class PsychometricFit:
    """Logistic psychometric function P(choice) = 1 / (1 + exp(-(intercept + slope * x))).

    Attributes
    ----------
    intercept : log-odds at x = 0 % signal.
    slope : log-odds change per % signal.
    midpoint_percent : x50 = -intercept / slope, % signal; NaN when the fit failed.
    success : False when the fit failed (see :func:`fit_psychometric` for the rule).
    message : why it failed, or "ok".
    signal_range_percent : (lowest, highest) tested signal level, %.
    """

    intercept: float
    slope: float
    midpoint_percent: float
    success: bool
    message: str
    signal_range_percent: tuple[float, float]

    def predict(self, signal_percent) -> np.ndarray:
        """Fitted P(choice) at the given signal levels (%)."""
        x = _finite_array("signal_percent", signal_percent)
        return 1.0 / (1.0 + np.exp(-(self.intercept + self.slope * x)))


def _log_sigmoid(z: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -z)


def fit_psychometric(signal_percent, p_choice, weights=None, *, expected_slope_sign: int | None = 1,
                     min_log_odds_span: float = 1.0, max_midpoint_extrapolation: float = 0.5,
                     max_log_odds_step: float = 20.0) -> PsychometricFit:
    """Maximum-likelihood logistic fit of choice proportions against signal level.

    Parameters
    ----------
    signal_percent : (M,) signal levels, % (negative = the other category).
    p_choice : (M,) proportion of the positive choice (e.g. "face") at each level, in [0, 1];
        fractional proportions and model probabilities are fine.
    weights : (M,) trials per level (>= 0; default 1 each). The negative log-likelihood is
        -sum w * (p log P + (1 - p) log(1 - P)), the binomial likelihood of the choices.
    expected_slope_sign : +1 (P rises with signal, the default), -1, or None (either sign).

    A fit is reported as failed (``success=False``, ``midpoint_percent`` NaN, never 0) when
      * the optimiser does not converge;
      * the slope has the wrong sign (``expected_slope_sign``);
      * the slope is about zero: over the tested range the fitted log-odds change by less than
        ``min_log_odds_span`` (1.0: e.g. P from 0.38 to 0.62), so no midpoint is defined;
      * the midpoint lies outside the tested range extended on each side by
        ``max_midpoint_extrapolation`` times its width;
      * the curve is a step: the fitted log-odds change by more than ``max_log_odds_step`` between
        two neighbouring tested levels (separated data; the maximum-likelihood slope is unbounded
        and the midpoint is not identified inside that gap).
    Invalid input (shapes, values outside [0, 1], fewer than 2 weighted levels) raises ValueError.
    """
    from scipy.optimize import minimize

    x = _finite_array("signal_percent", signal_percent)
    p = _probability_array("p_choice", p_choice)
    if x.ndim != 1 or p.shape != x.shape:
        raise ValueError(f"signal_percent and p_choice must be 1-D arrays of equal length, got {x.shape} and {p.shape}")
    w = np.ones_like(x) if weights is None else _finite_array("weights", weights)
    if w.shape != x.shape or np.any(w < 0):
        raise ValueError(f"weights must be {x.shape[0]} non-negative numbers (trials per level)")
    if expected_slope_sign not in (1, -1, None):
        raise ValueError(f"expected_slope_sign must be 1, -1 or None, got {expected_slope_sign!r}")
    for name, value in (("min_log_odds_span", min_log_odds_span), ("max_log_odds_step", max_log_odds_step)):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {value}")
    if not math.isfinite(max_midpoint_extrapolation) or max_midpoint_extrapolation < 0:
        raise ValueError(f"max_midpoint_extrapolation must be a finite number >= 0, got {max_midpoint_extrapolation}")
    levels = np.unique(x[w > 0])
    if levels.size < 2:
        raise ValueError("a psychometric fit needs at least 2 different signal levels with weight > 0")
    low, high = float(levels[0]), float(levels[-1])

    # Fit on standardised x for conditioning; convert back afterwards.
    centre, spread = float(np.average(x, weights=w)), float(np.std(levels))
    u = (x - centre) / spread

    def negative_log_likelihood(theta):
        z = theta[0] + theta[1] * u
        residual = w * (1.0 / (1.0 + np.exp(-z)) - p)
        value = -np.sum(w * (p * _log_sigmoid(z) + (1.0 - p) * _log_sigmoid(-z)))
        return value, np.array([residual.sum(), (residual * u).sum()])

    def hessian(theta):
        z = theta[0] + theta[1] * u
        curvature = w / (2.0 + np.exp(z) + np.exp(-z))  # w * P * (1 - P)
        return np.array([[curvature.sum(), (curvature * u).sum()],
                         [(curvature * u).sum(), (curvature * u * u).sum()]])

    # The likelihood is convex in (intercept, slope); a Newton trust-region method converges
    # to the exact optimum of noise-free data within a few iterations. Near the optimum the
    # likelihood can stop improving in floating point before the gradient reaches gtol; the
    # optimum is then accepted when the gradient is below the looser ``converged_gradient``.
    total_weight = max(1.0, float(w.sum()))
    result = minimize(negative_log_likelihood, x0=np.zeros(2), jac=True, hess=hessian, method="trust-exact",
                      options={"gtol": 1e-9 * total_weight, "maxiter": 200})
    converged_gradient = 1e-6 * total_weight
    converged = result.success or float(np.linalg.norm(negative_log_likelihood(result.x)[1])) <= converged_gradient
    slope = float(result.x[1] / spread)
    intercept = float(result.x[0] - slope * centre)

    def outcome(success: bool, message: str) -> PsychometricFit:
        midpoint = -intercept / slope if success else float("nan")
        return PsychometricFit(intercept, slope, midpoint, success, message, (low, high))

    if not converged:
        return outcome(False, f"optimiser did not converge: {result.message}")
    if abs(slope) * (high - low) < min_log_odds_span:
        return outcome(False, f"slope about zero: log-odds change {abs(slope) * (high - low):.3g} over the tested "
                              f"range, below min_log_odds_span={min_log_odds_span}")
    if expected_slope_sign is not None and np.sign(slope) != expected_slope_sign:
        return outcome(False, f"slope {slope:.3g} per % has the wrong sign (expected {expected_slope_sign:+d})")
    if abs(slope) * float(np.max(np.diff(levels))) > max_log_odds_step:
        return outcome(False, "step-like curve (separated choices): slope unbounded, midpoint not identified "
                              "within the gap between tested levels")
    midpoint = -intercept / slope
    margin = max_midpoint_extrapolation * (high - low)
    if not low - margin <= midpoint <= high + margin:
        return outcome(False, f"midpoint {midpoint:.3g} % lies outside the tested range [{low:g}, {high:g}] % "
                              f"extended by {max_midpoint_extrapolation} of its width")
    return outcome(True, "ok")


def psychometric_shift_percent(fit_control: PsychometricFit, fit_stim: PsychometricFit) -> float:
    """x50(control) - x50(stimulated), % signal; positive = stimulation moved choices towards the
    positive ("face") choice (Afraz et al. 2006). NaN if either fit failed."""
    if not (fit_control.success and fit_stim.success):
        return float("nan")
    return float(fit_control.midpoint_percent - fit_stim.midpoint_percent)


# --------------------------------------------------------------------------------------------
# Curves along an image sequence (Mehrer et al. 2025, arXiv 2510.03684)


def auc_of_curve(x, p, axis: int = -1):
    """Trapezoid area under P(choice) against positions ``x`` (strictly increasing, length M),
    divided by the width of the x range, so a flat curve at level c has AUC c. ``p`` may hold
    several curves; the curve runs along ``axis``."""
    from scipy.integrate import trapezoid

    positions = _finite_array("x", x)
    curves = _probability_array("p", p)
    if positions.ndim != 1 or positions.size < 2 or np.any(np.diff(positions) <= 0):
        raise ValueError(f"x must be a strictly increasing 1-D array of at least 2 positions, got {positions}")
    if curves.ndim == 0 or curves.shape[axis] != positions.size:
        raise ValueError(f"p must have {positions.size} values along axis {axis}, got shape {curves.shape}")
    area = trapezoid(curves, positions, axis=axis) / (positions[-1] - positions[0])
    return float(area) if np.ndim(area) == 0 else area


def delta_auc(p_stim, p_control, x=None, axis: int = -1):
    """AUC of the stimulated curve minus AUC of the control curve (Mehrer et al. 2025: P(choice)
    along a 7-step image sequence). ``x`` defaults to the sequence positions 0, 1, ..., M - 1."""
    stim = np.asarray(p_stim, dtype=np.float64)
    control = np.asarray(p_control, dtype=np.float64)
    if stim.shape != control.shape:
        raise ValueError(f"p_stim {stim.shape} and p_control {control.shape} must have the same shape")
    if stim.ndim == 0:
        raise ValueError("p_stim and p_control must be curves (arrays), not scalars")
    positions = np.arange(stim.shape[axis], dtype=np.float64) if x is None else x
    return auc_of_curve(positions, stim, axis=axis) - auc_of_curve(positions, control, axis=axis)


def delta_accuracy(correct_stim, correct_control, axis=None):
    """Mean correctness with stimulation minus without (fractions; e.g. Moeller et al. 2017:
    same-pair hit rate 0.91 -> 0.14 gives -0.77). Entries are booleans, 0/1 or model probabilities
    of the correct choice, in [0, 1]; the two arrays may hold different numbers of trials."""
    stim = _probability_array("correct_stim", correct_stim)
    control = _probability_array("correct_control", correct_control)
    if stim.size == 0 or control.size == 0:
        raise ValueError("correct_stim and correct_control must each hold at least one trial")
    difference = stim.mean(axis=axis) - control.mean(axis=axis)
    return float(difference) if np.ndim(difference) == 0 else difference


# --------------------------------------------------------------------------------------------
# Uncertainty


def bootstrap_ci(statistic_fn: Callable, *arrays, n_boot: int = 1000, ci: float = 0.95, seed: int = 0):
    """Percentile bootstrap: (estimate, low, high) of ``statistic_fn(*arrays)``.

    The arrays are resampled jointly along their first axis (row i of every array stays together,
    e.g. paired stimulated/control values of one site), ``n_boot`` times with a generator seeded by
    ``seed``, so the interval is deterministic. ``low``/``high`` are the (1 - ci)/2 and (1 + ci)/2
    quantiles of the resampled statistics; if any resample gives NaN (e.g. a failed psychometric
    fit) the bounds are NaN rather than an interval over the resamples that happened to work.
    Kept rather than ``scipy.stats.bootstrap``: scipy draws its resamples in its own order, so every
    stored interval would change with the switch (and may change with scipy's version).
    """
    if not callable(statistic_fn):
        raise TypeError("statistic_fn must be a function of the arrays")
    if not arrays:
        raise ValueError("bootstrap_ci needs at least one array to resample")
    data = [np.asarray(array) for array in arrays]
    if any(array.ndim == 0 for array in data):
        raise ValueError("every array must have a first (sample) axis")
    n_samples = data[0].shape[0]
    if n_samples < 2 or any(array.shape[0] != n_samples for array in data):
        raise ValueError(f"arrays must share a first axis of at least 2 samples, got lengths "
                         f"{[array.shape[0] for array in data]}")
    n_boot = _check_count("n_boot", n_boot, 2)
    if not 0 < ci < 1:
        raise ValueError(f"ci must lie strictly between 0 and 1, got {ci}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    estimate = np.asarray(statistic_fn(*data), dtype=np.float64)
    rng = np.random.default_rng(int(seed))
    resampled = np.empty((n_boot,) + estimate.shape)
    for i in range(n_boot):
        rows = rng.integers(0, n_samples, size=n_samples)
        resampled[i] = statistic_fn(*(array[rows] for array in data))
    low, high = np.quantile(resampled, [(1.0 - ci) / 2.0, (1.0 + ci) / 2.0], axis=0)
    if estimate.ndim == 0:
        return float(estimate), float(low), float(high)
    return estimate, low, high


def finite_pearson(x, y) -> float:
    """Pearson r of the pairs where both values are finite; NaN with fewer than 3 such pairs or where either
    side does not vary (the correlation is then undefined)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    both = np.isfinite(a) & np.isfinite(b)
    if both.sum() < 3 or np.ptp(a[both]) == 0 or np.ptp(b[both]) == 0:
        return float("nan")
    return float(np.corrcoef(a[both], b[both])[0, 1])


class PearsonResult(NamedTuple):
    """Pearson correlation with its parametric (t-test, two-sided) and permutation p-values."""

    r: float
    p_parametric: float
    p_permutation: float


def pearson_with_permutation(x, y, n_perm: int = 1000, seed: int = 0) -> PearsonResult:
    """Pearson r of paired samples, scipy's two-sided parametric p, and a two-sided permutation p
    (y shuffled ``n_perm`` times; ``p = (1 + #{|r_perm| >= |r|}) / (1 + n_perm)``, which is never 0;
    Phipson & Smyth 2010, Stat Appl Genet Mol Biol 9:39). Mehrer et al. 2025 report both kinds
    for the per-site model-vs-monkey ΔAUC correlation. ``scipy.stats.permutation_test``'s two-sided
    p doubles the smaller tail instead of counting ``|r_perm| >= |r|``, hence this function."""
    from scipy.stats import pearsonr

    a = _finite_array("x", x)
    b = _finite_array("y", y)
    if a.ndim != 1 or a.shape != b.shape or a.size < 3:
        raise ValueError(f"x and y must be 1-D arrays of equal length >= 3, got {a.shape} and {b.shape}")
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        raise ValueError("x and y must both vary; the correlation of a constant is undefined")
    n_perm = _check_count("n_perm", n_perm, 1)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    observed = pearsonr(a, b)
    rng = np.random.default_rng(int(seed))
    shuffled = rng.permuted(np.tile(b, (n_perm, 1)), axis=1)
    a_centred = (a - a.mean()) / np.linalg.norm(a - a.mean())
    b_centred = shuffled - shuffled.mean(axis=1, keepdims=True)
    r_perm = (b_centred @ a_centred) / np.linalg.norm(b_centred, axis=1)
    r = float(observed.statistic)
    exceed = int(np.sum(np.abs(r_perm) >= abs(r) - 1e-12))
    return PearsonResult(r, float(observed.pvalue), (1 + exceed) / (1 + n_perm))


# --------------------------------------------------------------------------------------------
# Per-site statistics shared by model results and published data


def site_correlation(x, y, n_perm: int, n_boot: int, ci: float, seed: int) -> dict:
    """Pearson r of per-site ``y`` against ``x`` with its parametric and permutation p-values and a
    bootstrap confidence interval over sites (pairs resampled). Sites with a NaN are left out; fewer
    than 3 usable sites or a constant variable give ``None`` values (and ``n_sites``)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    usable = np.isfinite(x) & np.isfinite(y)
    x, y = x[usable], y[usable]
    result = {"r": None, "p": None, "p_permutation": None, "r_ci": None, "n_sites": int(usable.sum())}
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return result
    pearson = pearson_with_permutation(x, y, n_perm=n_perm, seed=seed)

    def r_of(a, b):
        if np.ptp(a) == 0 or np.ptp(b) == 0:
            return np.nan
        return np.corrcoef(a, b)[0, 1]

    _, low, high = bootstrap_ci(r_of, x, y, n_boot=n_boot, ci=ci, seed=seed)
    result.update(r=pearson.r, p=pearson.p_parametric, p_permutation=pearson.p_permutation,
                  r_ci=_interval(low, high))
    return result


def stratum_mean(values, n_boot: int, ci: float, seed: int) -> dict:
    """Mean of the finite ``values`` with a bootstrap confidence interval (``None`` with fewer than 2)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return {"mean": None, "ci": None, "n": 0}
    if len(values) < 2:
        return {"mean": float(values.mean()), "ci": None, "n": 1}
    mean, low, high = bootstrap_ci(np.mean, values, n_boot=n_boot, ci=ci, seed=seed)
    return {"mean": mean, "ci": _interval(low, high), "n": int(len(values))}


def _interval(low, high):
    return None if not (math.isfinite(low) and math.isfinite(high)) else [float(low), float(high)]


def shift_summary(prefix: str, dprime, shift, threshold: float, n_perm: int, n_boot: int, ci: float,
                  seed: int) -> dict:
    """Afraz-style numbers for one source (``prefix`` "model" or "data"): correlation of the shift with
    d′ (``<prefix>_r``, ``_p``, ``_p_permutation``, ``_r_ci``) and the mean shift of selective
    (d′ > ``threshold``) and other sites (``<prefix>_mean_shift_selective``, ``_other``, ``_ci``, ``_n``)."""
    dprime, shift = np.asarray(dprime, dtype=np.float64), np.asarray(shift, dtype=np.float64)
    correlation = site_correlation(dprime, shift, n_perm, n_boot, ci, seed)
    summary = {f"{prefix}_r": correlation["r"], f"{prefix}_p": correlation["p"],
               f"{prefix}_p_permutation": correlation["p_permutation"], f"{prefix}_r_ci": correlation["r_ci"],
               f"{prefix}_n_sites": correlation["n_sites"]}
    for name, mask in (("selective", dprime > threshold), ("other", dprime <= threshold)):
        stratum = stratum_mean(shift[mask], n_boot, ci, seed)
        summary[f"{prefix}_mean_shift_{name}"] = stratum["mean"]
        summary[f"{prefix}_mean_shift_{name}_ci"] = stratum["ci"]
        summary[f"{prefix}_n_{name}"] = stratum["n"]
    return summary
