"""Per-site stimulation effects, stimulated against interleaved sham trials, and their statistics.

A site is one (subject, electrode). Its trials are counted per condition (sham, stimulated) and step
of its image sequence; every statistic below works on those counts:

* ΔAUC (Mehrer et al. 2025, arXiv 2510.03684): area under P("high") against the step position scaled
  to [0, 1] (trapezoid), stimulated minus sham; interval: percentile bootstrap over trials resampled
  with replacement within each (condition, step) cell, which draws the number of "high" choices of a
  cell from Binomial(n, k/n).
* A logistic regression per site, logit P(high) = a + b·x + c·stimulated with x = step / last step
  (statsmodels GLM, binomial; its standard errors): ``stim_logodds`` = c, and the psychometric shift
  x50(sham) − x50(stimulated) = c / b, in steps (positive: stimulation moved choices towards "high";
  Afraz et al. 2006 define the shift the same way), with a delta-method standard error and a bootstrap
  interval over the same resamples as ΔAUC.
* A per-site permutation p of ΔAUC (stimulated/sham labels shuffled among the site's trials), and
  its Benjamini–Hochberg adjustment over the sites tested (false discovery rate; scipy).
* Across sites: Wilcoxon signed-rank test of the per-site ΔAUC against 0, Cohen's d (mean / SD), a
  sign-flip permutation test of the mean, and the split-half reliability of the per-site ΔAUC with the
  Spearman–Brown correction (the noise ceiling of any correlation with them; undefined when the
  split-half r is not positive).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats
from scipy.integrate import trapezoid

from stimsim.lab.sessions import CHOICES, REQUIRED, SHAM
from stimsim.utilities.ordering import natural_key

#: Condition axis of the counts.
CONDITIONS = ("sham", "stimulated")

#: Newton iterations of the batched bootstrap fits, and the step size below which one has converged.
_NEWTON_ITERATIONS = 40
_NEWTON_TOLERANCE = 1e-8


@dataclass(frozen=True)
class SiteCounts:
    """Trials per site, condition and step.

    ``subject_id``, ``electrode``: (n_sites,) text; ``steps``: (n_steps,) step numbers 0..last;
    ``n``, ``n_high``: (n_sites, 2, n_steps) trials and "high" choices, condition 0 = sham,
    1 = stimulated; ``current_uA``: (n_sites,) mean current of the stimulated trials.
    """

    subject_id: np.ndarray
    electrode: np.ndarray
    steps: np.ndarray
    n: np.ndarray
    n_high: np.ndarray
    current_uA: np.ndarray

    @property
    def positions(self) -> np.ndarray:
        """Step positions scaled to [0, 1]."""
        return self.steps / self.steps[-1]

    @property
    def p_high(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.n_high / self.n


def check_session_table(sessions: pd.DataFrame) -> None:
    """Refuse a trial table the counts would misread (TypeError, ValueError naming the column, the first row and its
    value): one that is not a DataFrame, lacks a column of a validated table
    (:func:`stimsim.lab.sessions.load_sessions`), has no trial, a choice other than 'low'/'high' or a step that is
    not an integer >= 0."""
    if not isinstance(sessions, pd.DataFrame):
        raise TypeError(f"sessions must be a trial table (a pandas DataFrame, as stimsim.lab.sessions.load_sessions "
                        f"gives), got {type(sessions).__name__}")
    needed = [*REQUIRED, "subject_id", "session_id"]
    missing = [name for name in needed if name not in sessions]
    if missing:
        raise ValueError(f"sessions: missing column(s) {missing}; a trial table needs {needed} "
                         "(stimsim.lab.sessions.load_sessions reads a session file into one)")
    if len(sessions) == 0:
        raise ValueError("sessions: the trial table has no rows")
    bad_choice = ~sessions["choice"].isin(CHOICES).to_numpy()
    step = pd.to_numeric(sessions["step"], errors="coerce").to_numpy(dtype=float)
    bad_step = ~np.isfinite(step) | (step != np.round(step)) | (step < 0)
    for column, bad, allowed in (("choice", bad_choice, f"one of {list(CHOICES)}"),
                                 ("step", bad_step, "an integer >= 0")):
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            value = sessions[column].iloc[first]
            value = value.item() if isinstance(value, np.generic) else value
            raise ValueError(f"sessions: column {column!r} must be {allowed}; {int(bad.sum())} row(s) are not, the "
                             f"first at position {first}: {value!r}")


def count_trials(sessions: pd.DataFrame, n_steps: int | None = None) -> SiteCounts:
    """Count a validated session table (:func:`stimsim.lab.sessions.load_sessions`) over steps
    0 .. ``n_steps`` - 1 (a plan's sequences; None: up to the last step in the table). A step without
    trials is an empty cell; a table :func:`check_session_table` refuses is not counted."""
    check_session_table(sessions)
    last_step = int(sessions["step"].max()) if n_steps is None else n_steps - 1
    if sessions["step"].max() > last_step:
        raise ValueError(f"trials at step {sessions['step'].max()}, beyond the {n_steps} steps counted")
    if last_step < 1:
        raise ValueError("the sessions hold only step 0; a psychometric curve needs at least 2 steps")
    sites = sessions[["subject_id", "electrode"]].drop_duplicates().sort_values(
        ["subject_id", "electrode"], key=lambda column: column.map(natural_key)).reset_index(drop=True)
    site_index = pd.MultiIndex.from_frame(sites).get_indexer(
        pd.MultiIndex.from_frame(sessions[["subject_id", "electrode"]]))
    condition = (sessions["stimulated_electrode"].to_numpy() != SHAM).astype(int)
    step = sessions["step"].to_numpy()
    high = (sessions["choice"].to_numpy() == "high").astype(int)
    shape = (len(sites), 2, last_step + 1)
    flat = np.ravel_multi_index((site_index, condition, step), shape)
    size = int(np.prod(shape))
    n = np.bincount(flat, minlength=size).reshape(shape)
    n_high = np.bincount(flat, weights=high, minlength=size).reshape(shape).astype(int)
    stimulated = condition == 1
    current_sum = np.bincount(site_index[stimulated], weights=sessions["current_uA"].to_numpy()[stimulated],
                              minlength=len(sites))
    with np.errstate(invalid="ignore", divide="ignore"):
        current = current_sum / n[:, 1].sum(axis=1)
    return SiteCounts(sites["subject_id"].to_numpy(dtype=object), sites["electrode"].to_numpy(dtype=object),
                      np.arange(last_step + 1), n, n_high, current)


def delta_auc_of_counts(n_high, n, positions) -> np.ndarray:
    """ΔAUC from counts (..., 2, n_steps): AUC(stimulated) − AUC(sham); NaN where a cell is empty."""
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(n > 0, n_high / np.maximum(n, 1), np.nan)
    auc = trapezoid(p, positions, axis=-1) / (positions[-1] - positions[0])
    return auc[..., 1] - auc[..., 0]


def site_effects(counts: SiteCounts, n_boot: int = 1000, n_perm: int = 1000, ci: float = 0.95,
                 seed: int = 0, sessions: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per site: trial counts, ΔAUC and psychometric shift with bootstrap intervals, the
    logistic-regression stimulation term with its standard error and p, and (given the trial table
    ``sessions``) the permutation p of ΔAUC and its Benjamini–Hochberg adjustment over all the sites
    (``p_fdr``)."""
    if n_boot < 2:
        raise ValueError(f"n_boot must be >= 2, got {n_boot}")
    if not 0 < ci < 1:
        raise ValueError(f"ci must lie strictly between 0 and 1, got {ci}")
    x = counts.positions
    rng = np.random.default_rng(seed)
    quantiles = [(1 - ci) / 2, (1 + ci) / 2]
    table = pd.DataFrame({
        "subject_id": counts.subject_id, "electrode": counts.electrode,
        "n_sham": counts.n[:, 0].sum(axis=1), "n_stimulated": counts.n[:, 1].sum(axis=1),
        "n_empty_cells": (counts.n == 0).sum(axis=(1, 2)), "current_uA": counts.current_uA,
        "delta_auc": delta_auc_of_counts(counts.n_high, counts.n, x),
        "delta_auc_missing_reason": [missing_cells_reason(n, counts.steps) for n in counts.n],
    })

    # Bootstrap: the "high" count of every (site, condition, step) cell resampled as Binomial(n, k/n).
    with np.errstate(invalid="ignore", divide="ignore"):
        p_hat = np.where(counts.n > 0, counts.n_high / np.maximum(counts.n, 1), 0.0)
    boot_high = rng.binomial(counts.n, p_hat, size=(n_boot,) + counts.n.shape)
    boot_delta = delta_auc_of_counts(boot_high, counts.n, x)
    table["delta_auc_low"], table["delta_auc_high"] = _percentile_interval(boot_delta, quantiles)

    glm = pd.DataFrame([_site_glm(counts.n_high[i], counts.n[i], x) for i in range(len(table))])
    last_step = float(counts.steps[-1])
    table["stim_logodds"], table["stim_logodds_se"], table["stim_p"] = glm["c"], glm["c_se"], glm["c_p"]
    table["slope_logodds_per_step"] = glm["b"] / last_step
    table["shift_steps"] = glm["c"] / glm["b"] * last_step
    table["shift_steps_se"] = glm["shift_se"] * last_step
    boot_theta = fit_grouped_logistic(boot_high, counts.n, x)
    with np.errstate(invalid="ignore", divide="ignore"):  # a site without one condition has no fit
        boot_shift = boot_theta[..., 2] / boot_theta[..., 1] * last_step
    boot_shift[~(boot_theta[..., 1] > 0)] = np.nan  # no midpoint without a rising curve
    table["shift_steps_low"], table["shift_steps_high"] = _percentile_interval(boot_shift, quantiles)
    table["shift_boot_failed_fraction"] = np.mean(~np.isfinite(boot_shift), axis=0)
    if sessions is not None:
        table["permutation_p"] = _site_permutation_p(sessions, counts, n_perm, seed)
        table["p_fdr"] = fdr_adjusted(table["permutation_p"])
    return table


def missing_cells_reason(n: np.ndarray, steps: np.ndarray) -> str:
    """Why a site has no ΔAUC, from its trial counts ``n`` (2, n_steps; condition 0 = sham): the
    conditions and steps without a trial (a curve needs every step); "" when every cell has trials."""
    reasons = []
    for condition, name in enumerate(CONDITIONS):
        empty = steps[n[condition] == 0]
        if empty.size == steps.size:
            reasons.append(f"no {name} trials")
        elif empty.size:
            reasons.append(f"no {name} trial at step{'s' if empty.size > 1 else ''} "
                           f"{', '.join(str(int(step)) for step in empty)}")
    return "; ".join(reasons)


def _percentile_interval(resampled: np.ndarray, quantiles) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over the finite resamples; NaN for a site with none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanquantile(resampled, quantiles, axis=0)
    return low, high


def _site_glm(n_high: np.ndarray, n: np.ndarray, x: np.ndarray) -> dict:
    """statsmodels binomial GLM logit P(high) = a + b·x + c·stimulated on one site's (2, n_steps) cells."""
    import statsmodels.api as sm
    from statsmodels.tools.sm_exceptions import PerfectSeparationError, PerfectSeparationWarning

    keep = n.ravel() > 0
    design = np.column_stack([np.ones(n.size), np.tile(x, 2), np.repeat([0.0, 1.0], n.shape[1])])[keep]
    endog = np.column_stack([n_high.ravel(), (n - n_high).ravel()])[keep]
    failed = {"b": np.nan, "c": np.nan, "c_se": np.nan, "c_p": np.nan, "shift_se": np.nan}
    if np.linalg.matrix_rank(design) < 3:
        return failed
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PerfectSeparationWarning)
            fit = sm.GLM(endog, design, family=sm.families.Binomial()).fit()
    except (PerfectSeparationError, PerfectSeparationWarning, np.linalg.LinAlgError):
        return failed
    _, b, c = fit.params
    covariance = fit.cov_params()
    gradient = np.array([0.0, -c / b**2, 1.0 / b])  # d(c/b)/d(a, b, c)
    return {"b": b, "c": c, "c_se": fit.bse[2], "c_p": fit.pvalues[2],
            "shift_se": float(np.sqrt(gradient @ covariance @ gradient))}


def fit_grouped_logistic(n_high, n, x) -> np.ndarray:
    """Maximum-likelihood (a, b, c) of logit P(high) = a + b·x + c·stimulated for many count tables
    at once: ``n_high`` (..., 2, n_steps), ``n`` broadcastable to it; returns (..., 3). Newton's
    method, batched (the bootstrap needs thousands of fits); NaN where it did not converge
    (separated choices) or where the cells with trials cannot tell a, b and c apart (e.g. no sham trials). The
    same model as the statsmodels GLM of :func:`site_effects`."""
    n_high = np.asarray(n_high, dtype=float)
    n_steps = n_high.shape[-1]
    design = np.column_stack([np.ones(2 * n_steps), np.tile(x, 2), np.repeat([0.0, 1.0], n_steps)])
    # a table whose filled cells cannot separate a, b and c (e.g. no sham trials) has no fit, whatever Newton gives
    tables = np.broadcast_to(np.asarray(n), np.broadcast_shapes(np.shape(n), n_high.shape[-2:]))
    filled = tables.reshape(tables.shape[:-2] + (2 * n_steps,)) > 0
    identifiable = np.broadcast_to(np.linalg.matrix_rank(design * filled[..., None]) == 3, n_high.shape[:-2])
    n = np.broadcast_to(np.asarray(n, dtype=float), n_high.shape)
    k = n_high.reshape(n_high.shape[:-2] + (2 * n_steps,))
    m = n.reshape(k.shape)
    theta = np.zeros(k.shape[:-1] + (3,))
    converged = np.zeros(k.shape[:-1], dtype=bool)
    ridge = 1e-12 * np.eye(3)
    for _ in range(_NEWTON_ITERATIONS):
        eta = theta @ design.T
        mu = 1.0 / (1.0 + np.exp(-eta))
        gradient = (k - m * mu) @ design
        weight = m * mu * (1.0 - mu)
        hessian = np.einsum("...j,ja,jb->...ab", weight, design, design) + ridge
        step = np.linalg.solve(hessian, gradient[..., None])[..., 0]
        theta = theta + step
        converged = np.max(np.abs(step), axis=-1) < _NEWTON_TOLERANCE
        if converged.all():
            break
    theta[~(converged & identifiable)] = np.nan
    return theta


def _site_permutation_p(sessions: pd.DataFrame, counts: SiteCounts, n_perm: int, seed: int) -> np.ndarray:
    """Two-sided permutation p of each site's ΔAUC: the stimulated/sham labels of its trials are
    shuffled ``n_perm`` times (all shuffles of a site at once, one matrix product for their counts);
    p = (1 + #{|ΔAUC_perm| >= |ΔAUC|}) / (1 + n_perm) (Phipson & Smyth 2010, never 0)."""
    if n_perm < 1:
        raise ValueError(f"n_perm must be >= 1, got {n_perm}")
    x = counts.positions
    n_steps = x.size
    rng = np.random.default_rng(seed)
    p_values = np.full(len(counts.electrode), np.nan)
    observed = delta_auc_of_counts(counts.n_high, counts.n, x)
    groups = sessions.groupby(["subject_id", "electrode"], sort=False).indices
    for i, site in enumerate(zip(counts.subject_id, counts.electrode)):
        trials = sessions.iloc[groups[site]]
        code = trials["step"].to_numpy() * 2 + (trials["choice"].to_numpy() == "high")
        stimulated = trials["stimulated_electrode"].to_numpy() != SHAM
        if stimulated.all() or not stimulated.any() or not np.isfinite(observed[i]):
            continue
        one_hot = (code[:, None] == np.arange(2 * n_steps)).astype(np.float32)
        labels = rng.permuted(np.tile(stimulated.astype(np.float32), (n_perm, 1)), axis=1)
        per_code_stim = np.rint(labels @ one_hot).astype(int)
        per_code_all = one_hot.sum(axis=0).astype(int)
        stim_high, stim_n = per_code_stim[:, 1::2], per_code_stim[:, 1::2] + per_code_stim[:, 0::2]
        all_high, all_n = per_code_all[1::2], per_code_all[1::2] + per_code_all[0::2]
        null = delta_auc_of_counts(np.stack([all_high - stim_high, stim_high], axis=-2),
                                   np.stack([all_n - stim_n, stim_n], axis=-2), x)
        exceed = np.sum(np.abs(null) >= abs(observed[i]) - 1e-12)  # NaN (an emptied cell) never counts
        p_values[i] = (1 + exceed) / (1 + n_perm)
    return p_values


def fdr_adjusted(p_values) -> np.ndarray:
    """Benjamini–Hochberg adjusted p of each site (``scipy.stats.false_discovery_control``) over the
    sites with a p; NaN where the p is NaN (a site without ΔAUC is not tested). Declaring the sites
    with an adjusted p below q keeps the expected false discovery rate at or below q
    (Benjamini & Hochberg 1995)."""
    p_values = np.asarray(p_values, dtype=float)
    adjusted = np.full(p_values.shape, np.nan)
    tested = np.isfinite(p_values)
    if tested.any():
        adjusted[tested] = stats.false_discovery_control(p_values[tested], method="bh")
    return adjusted


def expected_fdr_discoveries_under_null(n_tests: int, q: float) -> float:
    """Expected number of sites the Benjamini–Hochberg procedure at level ``q`` declares among
    ``n_tests`` sites none of which has an effect (independent, uniform p): the chance level of the
    FDR count. Exactly r are declared when r p-values lie below c_r = r·q/m, none between c_r and
    c_{r+1}, and the other m − r, rescaled to (c_r, 1], stay above the line i·q/(m − r·q) — a
    probability of 1 − (m − r)·q/(m − r·q) (Daniels 1945): P(R = r) = Binomial(r; m, c_r) ·
    (1 − (m − r)·q/(m − r·q)) (Finner & Roters 2002); some site is declared with probability q."""
    if n_tests < 0:
        raise ValueError(f"n_tests must be >= 0, got {n_tests}")
    if not 0 < q < 1:
        raise ValueError(f"q must lie strictly between 0 and 1, got {q}")
    r = np.arange(1, n_tests + 1)
    probability = stats.binom.pmf(r, n_tests, r * q / n_tests) * (1 - (n_tests - r) * q / (n_tests - r * q))
    return float(np.sum(r * probability))


def across_sites(effects, n_perm: int = 10000, seed: int = 0) -> dict:
    """Is the per-site effect (e.g. ΔAUC) shifted from 0 across sites? Wilcoxon signed-rank test
    (two-sided, scipy), Cohen's d = mean / SD (ddof 1), and a sign-flip permutation p of the mean.
    Sites whose effect is NaN are left out and counted. With fewer than 2 sites, or no spread between
    them, the tests and d are NaN and ``wilcoxon_p_undefined_reason`` / ``cohens_d_undefined_reason``
    say why (None when defined)."""
    values = np.asarray(effects, dtype=float)
    finite = values[np.isfinite(values)]
    result = {"n_sites": int(finite.size), "n_sites_without_effect": int(values.size - finite.size),
              "mean_shift": float(np.mean(finite)) if finite.size else float("nan"),
              "mean_shift_chance": 0.0, "cohens_d_chance": 0.0,
              "wilcoxon_p_undefined_reason": None, "cohens_d_undefined_reason": None}
    if finite.size < 2 or np.ptp(finite) == 0:
        reason = (f"{finite.size} site(s) with an effect; the statistics across sites need at least 2"
                  if finite.size < 2 else f"all {finite.size} sites have the same effect ({finite[0]:g}): no spread")
        return {**result, "wilcoxon_statistic": float("nan"), "wilcoxon_p": float("nan"),
                "cohens_d": float("nan"), "mean_shift_permutation_p": float("nan"),
                "wilcoxon_p_undefined_reason": reason, "cohens_d_undefined_reason": reason}
    wilcoxon = stats.wilcoxon(finite)
    permutation = stats.permutation_test((finite,), np.mean, vectorized=True, n_resamples=n_perm,
                                         permutation_type="samples", alternative="two-sided",
                                         random_state=seed)
    return {**result, "wilcoxon_statistic": float(wilcoxon.statistic), "wilcoxon_p": float(wilcoxon.pvalue),
            "cohens_d": float(np.mean(finite) / np.std(finite, ddof=1)),
            "mean_shift_permutation_p": float(permutation.pvalue)}


def spearman_brown(r, factor: float = 2.0):
    """Reliability of a measure ``factor`` times as long: factor·r / (1 + (factor − 1)·r)
    (Spearman 1910; Brown 1910). A reliability (true-score variance over total variance) is never
    negative, so a negative ``r`` has no prediction: NaN there (and for NaN); ``r`` above 1 is an error."""
    r = np.asarray(r, dtype=float)
    if np.any(r > 1):
        raise ValueError(f"a correlation lies in [-1, 1], got {r[r > 1].tolist()}")
    if factor <= 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    with np.errstate(invalid="ignore", divide="ignore"):
        result = np.where(r >= 0, factor * r / (1.0 + (factor - 1.0) * r), np.nan)
    return float(result) if result.ndim == 0 else result


def noise_ceiling_of(split_half_r: float) -> tuple[float, str | None]:
    """The noise ceiling (Spearman–Brown corrected split-half r) and, when it is undefined (NaN), why.

    A split-half r ≤ 0 estimates no reliability: the per-site effects are not reliable at this trial
    count (their between-site spread is lost in the trial noise), and 2r/(1 + r) would be no
    reliability (negative, and −∞ as r → −1). It is reported as undefined, not clamped to 0."""
    if not np.isfinite(split_half_r):
        return float("nan"), ("no split-half r: fewer than 3 sites have a ΔAUC in both halves of a split "
                              "(too few trials per step and condition)")
    if split_half_r <= 0:
        return float("nan"), (f"split-half r = {split_half_r:.3g} <= 0: the per-site ΔAUC are not reliable at "
                              "this trial count, and the Spearman–Brown correction 2r/(1+r) is defined only for "
                              "a positive reliability")
    return spearman_brown(split_half_r), None


def split_half_deltas(counts: SiteCounts, n_splits: int = 100, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """ΔAUC of the two halves of ``n_splits`` random splits, (n_splits, n_sites) each: every (site, condition,
    step) cell's trials are split at random into two halves (the "high" count of a half is hypergeometric)."""
    if n_splits < 1:
        raise ValueError(f"n_splits must be >= 1, got {n_splits}")
    rng = np.random.default_rng(seed)
    n_first = counts.n // 2 + rng.integers(0, 2, size=(n_splits,) + counts.n.shape) * (counts.n % 2)
    high_first = rng.hypergeometric(np.broadcast_to(counts.n_high, n_first.shape),
                                    np.broadcast_to(counts.n - counts.n_high, n_first.shape), n_first)
    return (delta_auc_of_counts(high_first, n_first, counts.positions),
            delta_auc_of_counts(counts.n_high - high_first, counts.n - n_first, counts.positions))


def split_half_reliability(counts: SiteCounts, halves: tuple[np.ndarray, np.ndarray]) -> dict:
    """Split-half reliability of the per-site ΔAUC of ``counts``: the Pearson r across sites between the ΔAUC of
    the two ``halves`` of every random split (:func:`split_half_deltas`), averaged over the splits
    (``split_half_r``; the result's ``n_splits`` counts the splits where at least 3 sites have a ΔAUC in both
    halves, ``split_half_mean_sites`` of them on average); ``noise_ceiling`` is its Spearman–Brown correction to
    the full number of trials, NaN with ``noise_ceiling_undefined_reason`` when the split-half r is not positive
    (:func:`noise_ceiling_of`)."""
    first, second = halves
    correlations, n_sites = [], []
    for a, b in zip(first, second):
        usable = np.isfinite(a) & np.isfinite(b)
        if usable.sum() >= 3 and np.ptp(a[usable]) > 0 and np.ptp(b[usable]) > 0:
            correlations.append(stats.pearsonr(a[usable], b[usable]).statistic)
            n_sites.append(int(usable.sum()))
    split_half_r = float(np.mean(correlations)) if correlations else float("nan")
    noise_ceiling, reason = noise_ceiling_of(split_half_r)
    with_effect = int(np.isfinite(delta_auc_of_counts(counts.n_high, counts.n, counts.positions)).sum())
    if not correlations and with_effect < 3:
        reason = (f"no split-half r: {with_effect} site(s) have a ΔAUC, and a correlation across sites needs "
                  f"3 or more")
    return {"split_half_r": split_half_r, "split_half_r_chance": 0.0, "noise_ceiling": noise_ceiling,
            "noise_ceiling_undefined_reason": reason, "n_splits": len(correlations),
            "split_half_mean_sites": float(np.mean(n_sites)) if n_sites else 0.0}


def site_resampling_weights(n_sites: int, n_boot: int, seed: int = 0) -> np.ndarray:
    """(n_boot, n_sites) counts of each site in ``n_boot`` resamples of the sites drawn with replacement."""
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    return np.random.default_rng([seed, 1]).multinomial(n_sites, np.full(n_sites, 1 / n_sites),
                                                        size=n_boot).astype(float)


def weighted_pearson(weights: np.ndarray, x, y) -> np.ndarray:
    """Pearson r of ``x`` and ``y`` (n_sites,) with each site counted as often as ``weights`` (n_boot, n_sites)
    says, one r per row; sites where either is NaN are left out; NaN for a row with fewer than 3 distinct sites
    left or no spread."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    usable = np.isfinite(x) & np.isfinite(y)
    if not usable.any():
        return np.full(len(weights), np.nan)
    # centred, so that the weighted moments below do not lose digits
    x = np.where(usable, x - x[usable].mean(), 0.0)
    y = np.where(usable, y - y[usable].mean(), 0.0)
    weights = weights * usable
    with np.errstate(invalid="ignore", divide="ignore"):
        total = weights.sum(axis=1)
        mean_x, mean_y = weights @ x / total, weights @ y / total
        mean_square_x, mean_square_y = weights @ (x * x) / total, weights @ (y * y) / total
        var_x, var_y = mean_square_x - mean_x ** 2, mean_square_y - mean_y ** 2
        r = (weights @ (x * y) / total - mean_x * mean_y) / np.sqrt(var_x * var_y)
    # no spread: a variance at the rounding level of the moments it is computed from
    defined = (((weights > 0).sum(axis=1) >= 3) & (var_x > 1e-12 * mean_square_x) & (var_y > 1e-12 * mean_square_y))
    return np.where(defined, np.clip(r, -1.0, 1.0), np.nan)


def resampled_split_half_r(halves: tuple[np.ndarray, np.ndarray], weights: np.ndarray) -> np.ndarray:
    """The split-half r of :func:`split_half_reliability` on the same ``halves`` (:func:`split_half_deltas`), on
    resamples of the sites (``weights`` of :func:`site_resampling_weights`): its sampling distribution over
    sites. NaN for a resample where no split has a defined r."""
    first, second = halves
    per_split = np.stack([weighted_pearson(weights, a, b) for a, b in zip(first, second)], axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a resample with no defined split is NaN
        return np.nanmean(per_split, axis=1)
