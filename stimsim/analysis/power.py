"""Power of a planned session: how many trials per site detect the planned effects.

Sessions are simulated at several trial counts from the true P(high) curves of every site with and
without stimulation (``p_high``: (n_sites, 2, n_steps), condition 0 = sham, 1 = stimulated), with
stimulation and sham interleaved 50/50 and steps drawn uniformly, as the analysis expects them. Each
simulated session is analysed with the tests of :mod:`stimsim.analysis.effects`, on counts:

* per site: ΔAUC against its sampling error (two-sided z test; the normal approximation of the per-site
  permutation test, with the variance of a trapezoid AUC Σ w² p (1 − p) / n over steps and conditions);
  a site is detected when p < α and the sign of its ΔAUC is the planned one;
* across sites: Wilcoxon signed-rank test of ΔAUC signed by the planned direction, one-sided (the
  "shift in the predicted direction" of Mehrer et al. 2025, experiment 2).

Power = fraction of the simulated sessions that detect; the trials needed are the smallest simulated
count whose power reaches the target. Each count also gets the mean Pearson r across sites between the
observed ΔAUC and the true ΔAUC of the curves simulated from (what a closed-loop test can reach: its
square is the reliability of the per-site effects), and between the observed ΔAUC and the plan's; and
the same observed-vs-true r for the per-site logistic stimulation term (log-odds; the true value fitted
to the exact choice probabilities, every cell weighted equally), which uses every step's trials at once.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.proportion import proportion_confint
from tqdm.auto import tqdm

from stimsim.analysis.effects import delta_auc_of_counts, fit_grouped_logistic
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.limits import check_memory, check_seed

#: Power sought and significance level of the tests, unless told otherwise (the plan's forecast uses them as well).
TARGET_POWER, ALPHA = 0.8, 0.05

#: Trials per site simulated by default (stimulated + sham).
DEFAULT_TRIAL_COUNTS = (50, 100, 200, 400, 800, 1600)

#: Peak memory of one trial count per (session, site, condition, step) cell, bytes: the simulated counts and
#: the z-tests' and logistic fits' temporaries (measured: 10.5–11 with tracemalloc).
POWER_BYTES_PER_CELL = 12 * 8

#: The most trials per site a power curve simulates (far beyond any session).
MAX_TRIALS_PER_SITE = 1_000_000

#: Observed-vs-true r across sites that a session should reach (the closed-loop target).
TARGET_OBSERVED_VS_TRUE_R = 0.8

#: Fewest sites across which a Pearson r is computed (with 2, r is ±1 whatever the effects).
MIN_SITES_FOR_R = 3


def simulate_counts(p_high: np.ndarray, trials_per_site: int, n_sessions: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(n_high, n), each (n_sessions, n_sites, 2, n_steps): ``trials_per_site`` trials per site split
    50/50 between the conditions (an odd one goes to either at random), steps drawn uniformly."""
    n_sites, _, n_steps = p_high.shape
    stimulated = trials_per_site // 2 + rng.integers(0, 2, size=(n_sessions, n_sites)) * (trials_per_site % 2)
    per_condition = np.stack([trials_per_site - stimulated, stimulated], axis=-1)
    n = rng.multinomial(per_condition, np.full(n_steps, 1.0 / n_steps))
    return rng.binomial(n, np.broadcast_to(p_high, n.shape)), n


def site_z_p(n_high: np.ndarray, n: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ΔAUC and its two-sided z-test p from counts (..., 2, n_steps); NaN where a cell is empty.

    The variance of ΔAUC is taken under no effect, from each step's P(high) pooled over the two conditions
    (Σ w² p̄(1 − p̄)(1/n_sham + 1/n_stim), the score test's): with a few trials per cell, a cell's own
    P(high) is often 0 or 1 and its variance 0, which made the test reject far too often (one-sided, at 50 trials
    per site, 0.105 where 0.025 is due; pooled, 0.036)."""
    delta = delta_auc_of_counts(n_high, n, positions)
    widths = np.diff(positions) / (positions[-1] - positions[0])
    weights = np.zeros_like(positions)
    weights[:-1] += widths / 2
    weights[1:] += widths / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        pooled = n_high.sum(axis=-2) / n.sum(axis=-2)
        variance = (weights**2 * pooled * (1 - pooled) * (1 / n[..., 0, :] + 1 / n[..., 1, :])).sum(axis=-1)
        z = delta / np.sqrt(variance)
    p_value = 2 * stats.norm.sf(np.abs(z))
    p_value = np.where(variance > 0, p_value, np.where(delta != 0, 0.0, 1.0))  # no sampling error at all
    return delta, np.where(np.isfinite(delta), p_value, np.nan)


def power_analysis(p_high, electrodes=None, planned_effect=None, trial_counts=DEFAULT_TRIAL_COUNTS,
                   n_sessions: int = 200, alpha: float = ALPHA, target_power: float = TARGET_POWER,
                   seed: int = 0, progress: bool = False,
                   effect: str = "delta_auc") -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Simulate ``n_sessions`` sessions at every count of ``trial_counts`` (trials per site) from
    ``p_high``; the planned direction of every site is the sign of ``planned_effect``, the plan's predicted
    ``effect`` (default: the ΔAUC of ``p_high`` itself).

    Returns ``curve`` (one row per trial count: ``wilcoxon_power`` with the 95 % Wilson interval of a proportion of
    ``n_sessions`` sessions, ``wilcoxon_power_ci95_low`` and ``_high``, ``mean_site_power``, mean
    ``observed_vs_true_r`` and ``observed_vs_planned_r`` across sites),
    ``sites`` (one row per site: ``planned_<effect>``, ``simulated_delta_auc`` — the ΔAUC of ``p_high`` itself, the
    effect the sessions are drawn from —, power at every count, ``trials_needed``) and a
    summary (``wilcoxon_trials_needed``, ``median_site_trials_needed``,
    ``observed_vs_true_r_trials_needed`` for a mean r of :data:`TARGET_OBSERVED_VS_TRUE_R`, parameters;
    ``wilcoxon_trials_needed_undefined_reason`` and ``observed_vs_true_r_trials_needed_undefined_reason``: why no
    trial count reaches it with so few sites, else None).
    ``median_site_trials_needed`` is the lower median of the ``trials_needed`` of the sites that reach the
    target power (:func:`lower_median`): a simulated count, the fewest trials per site at which at least half of
    those sites reach it. A count that is never enough is reported as None. ``progress`` shows a bar over the trial counts.
    """
    p_high = np.asarray(p_high, dtype=float)
    if p_high.ndim != 3 or p_high.shape[1] != 2 or p_high.shape[2] < 2:
        raise ValueError(f"p_high must be (n_sites, 2, n_steps >= 2), got shape {p_high.shape}")
    if not np.all((p_high >= 0) & (p_high <= 1)):
        raise ValueError("p_high must hold probabilities in [0, 1]")
    if not 0 < alpha < 1 or not 0 < target_power < 1:
        raise ConfigError(f"alpha and power must lie strictly between 0 and 1, got {alpha} and {target_power}")
    n_sites, _, n_steps = p_high.shape
    counts = sorted({int(count) for count in trial_counts})
    if not counts or counts[0] < 2 * n_steps:
        raise ConfigError(f"--trials-per-site: trial counts must be integers >= {2 * n_steps} (a ΔAUC needs a trial at each of "
                          f"the {n_steps} steps in both conditions), got {list(trial_counts)}")
    if counts[-1] > MAX_TRIALS_PER_SITE:
        raise ConfigError(f"--trials-per-site: {counts[-1]} trials per site is beyond any session; give at most "
                          f"{MAX_TRIALS_PER_SITE:,}")
    if n_sessions < 10:
        raise ConfigError(f"n_sessions must be >= 10 for a power estimate, got {n_sessions}")
    check_seed("seed", seed)
    check_memory(f"power: {n_sessions} sessions of {n_sites} sites × {n_steps} steps × 2 conditions",
                 POWER_BYTES_PER_CELL * n_sessions * n_sites * 2 * n_steps, "--sessions (n_sessions)")
    electrodes = [str(i + 1) for i in range(n_sites)] if electrodes is None else [str(e) for e in electrodes]
    positions = np.linspace(0.0, 1.0, n_steps)
    planned = (delta_auc_of_counts(p_high, np.ones_like(p_high), positions) if planned_effect is None
               else np.asarray(planned_effect, dtype=float))
    if planned.shape != (n_sites,):
        raise ValueError(f"planned_effect must hold one value per site ({n_sites}), got shape {planned.shape}")
    direction = np.sign(planned)
    true_delta = delta_auc_of_counts(p_high, np.ones_like(p_high), positions)
    true_logodds = fit_grouped_logistic(p_high, np.ones_like(p_high), positions)[..., 2]
    rng = np.random.default_rng(seed)
    site_power, wilcoxon_power, versus_true, versus_planned, logodds_versus_true = [], [], [], [], []
    for count in tqdm(counts, desc="power: trial counts", unit="count", disable=not progress):
        n_high, n = simulate_counts(p_high, count, n_sessions, rng)
        delta, p_value = site_z_p(n_high, n, positions)
        versus_true.append(_mean_r_across_sites(delta, true_delta))
        versus_planned.append(_mean_r_across_sites(delta, planned))
        logodds_versus_true.append(_mean_r_across_sites(fit_grouped_logistic(n_high, n, positions)[..., 2],
                                                        true_logodds))
        detected = (p_value < alpha) & (np.sign(delta) == direction) & (direction != 0)
        site_power.append(detected.mean(axis=0))
        wilcoxon_power.append(float(np.mean(_directed_wilcoxon_p(delta[:, direction != 0] * direction[direction != 0])
                                            < alpha)))
    site_power = np.array(site_power)  # (counts, sites)

    def needed(power_by_count):
        reached = np.flatnonzero(np.asarray(power_by_count) >= target_power)
        return int(counts[reached[0]]) if reached.size else None

    low, high = proportion_confint(np.round(np.array(wilcoxon_power) * n_sessions), n_sessions, alpha=0.05,
                                   method="wilson")
    curve = pd.DataFrame({"trials_per_site": counts, "wilcoxon_power": wilcoxon_power,
                          "wilcoxon_power_ci95_low": low, "wilcoxon_power_ci95_high": high,
                          "mean_site_power": site_power.mean(axis=1), "observed_vs_true_r": versus_true,
                          "observed_vs_planned_r": versus_planned,
                          "stim_logodds_observed_vs_true_r": logodds_versus_true})
    sites = pd.DataFrame({"electrode": electrodes, f"planned_{effect}": planned, "simulated_delta_auc": true_delta})
    for i, count in enumerate(counts):
        sites[f"power_{count}"] = site_power[i]
    sites["trials_needed"] = pd.Series([needed(site_power[:, j]) for j in range(n_sites)], dtype=object)
    site_needs = [value for value in sites["trials_needed"] if value is not None]
    summary = {"alpha": alpha, "target_power": target_power, "n_sessions": n_sessions, "seed": seed,
               "trial_counts": counts, "n_sites": n_sites,
               "wilcoxon_trials_needed": needed(wilcoxon_power),
               "wilcoxon_trials_needed_undefined_reason": too_few_sites(n_sites, alpha),
               "median_site_trials_needed": lower_median(site_needs) if site_needs else None,
               "n_sites_detectable": len(site_needs),
               "site_power_chance": alpha / 2,
               "true_delta_auc_sd": float(np.std(true_delta, ddof=1)) if n_sites > 1 else float("nan"),
               "observed_vs_true_r_target": TARGET_OBSERVED_VS_TRUE_R,
               "observed_vs_true_r_trials_needed": _first_reaching(counts, versus_true, TARGET_OBSERVED_VS_TRUE_R),
               "observed_vs_true_r_trials_needed_undefined_reason": _r_undefined_reason(true_delta),
               "observed_vs_true_r_chance": 0.0}
    return curve, sites, summary


def _r_undefined_reason(true_delta: np.ndarray) -> str | None:
    """Why r across sites with the sites' true ΔAUC is undefined at any trial count, in words; None when it is
    defined (at least :data:`MIN_SITES_FOR_R` sites whose true ΔAUC differ)."""
    if len(true_delta) < MIN_SITES_FOR_R:
        return f"with {len(true_delta)} site(s) r across sites is undefined: it needs at least {MIN_SITES_FOR_R}"
    finite = true_delta[np.isfinite(true_delta)]
    if finite.size < MIN_SITES_FOR_R or np.ptp(finite) == 0:
        return (f"the sites' true ΔAUC do not vary ({', '.join(sorted({f'{value:.4g}' for value in finite}))}), "
                "so r across sites is undefined")
    return None


def lower_median(values) -> int:
    """The lower median of integers (:func:`statistics.median_low`): the ⌈n/2⌉-th smallest, itself one of ``values``
    (np.median averages the two middle values of an even n, which gives a trial count that was never simulated)."""
    return statistics.median_low([int(value) for value in values])


def _first_reaching(counts, values, target: float):
    reached = np.flatnonzero(np.nan_to_num(np.asarray(values, dtype=float), nan=-np.inf) >= target)
    return int(counts[reached[0]]) if reached.size else None


def _mean_r_across_sites(observed: np.ndarray, reference: np.ndarray) -> float:
    """Mean over simulated sessions (rows of ``observed``) of Pearson r across sites with ``reference``,
    each over the sites where both are finite; NaN when no session has :data:`MIN_SITES_FOR_R` such sites with
    spread."""
    correlations = []
    for row in observed:
        usable = np.isfinite(row) & np.isfinite(reference)
        if usable.sum() >= MIN_SITES_FOR_R and np.ptp(row[usable]) > 0 and np.ptp(reference[usable]) > 0:
            correlations.append(stats.pearsonr(row[usable], reference[usable]).statistic)
    return float(np.mean(correlations)) if correlations else float("nan")


def _directed_wilcoxon_p(signed: np.ndarray) -> np.ndarray:
    """One-sided Wilcoxon signed-rank p per row (session) of planned-direction-signed ΔAUC: scipy's
    exact distribution for rows without zeros or tied magnitudes, its normal approximation for the
    others (scipy's permutation fallback would cost seconds per session). Rows without two distinct
    usable values get p = 1."""
    signed = np.where(np.isfinite(signed), signed, 0.0)
    p = np.ones(signed.shape[0])
    if signed.shape[1] < 2:
        return p
    magnitudes = np.sort(np.abs(signed), axis=1)
    awkward = (magnitudes[:, 0] == 0) | np.any(np.diff(magnitudes, axis=1) == 0, axis=1)
    usable = np.any(signed != 0, axis=1)
    for rows, method in ((usable & ~awkward, "exact" if signed.shape[1] <= 50 else "asymptotic"),
                         (usable & awkward, "asymptotic")):
        if rows.any():
            p[rows] = stats.wilcoxon(signed[rows], alternative="greater", axis=1, method=method).pvalue
    return p


def curves_from_plan(plan_dir) -> dict:
    """P(high) per (chosen site, condition, step) to simulate sessions from, averaged over each site's
    sequences: the virtual subject's own curves with its lapses (``subject_p_high`` of the summary's
    ``truth_file``) when the plan was made on a virtual subject, else the plan's predictions (``plan.nc``, chosen
    model, fitted pose). Also the plan's predicted effect of those sites (their planned direction) and its name."""
    import xarray as xr

    from stimsim.analysis.comparison import load_plan_predictions, plan_effect
    from stimsim.analysis.plan_readback import (read_subject_p_high, summary_electrodes, summary_lapse_rate,
                                                 truth_path)
    from stimsim.utilities.errors import FileFormatError

    plan_dir = Path(plan_dir)
    summary_path = plan_dir / "summary.json"
    sites, summary = load_plan_predictions(plan_dir)
    if not isinstance(summary, dict):
        raise FileFormatError(summary_path, f"not a plan summary: a JSON {type(summary).__name__}, not an object")
    sites = sites.set_index("electrode_id")
    chosen = summary_electrodes(summary_path, summary) if "chosen_electrodes" in summary else list(sites.index)
    unknown = [e for e in chosen if e not in sites.index]
    if unknown:
        raise FileFormatError(summary_path, f"names electrode(s) {unknown} that {plan_dir / 'sites.csv'} does not "
                                            "list; the files are not of one plan")
    truth = truth_path(plan_dir, summary_path, summary)
    if truth is not None:
        p_high = read_subject_p_high(truth, chosen, summary_path)
        lapse = summary_lapse_rate(summary_path, summary, 0.0)
        source = f"virtual subject (lapse rate {lapse:g})"
    else:
        plan_path = plan_dir / "plan.nc"
        if not plan_path.is_file():
            raise FileFormatError(plan_path, "not found: the plan's predicted P(high) is needed")
        try:
            with xr.open_dataset(plan_path, engine="h5netcdf") as data:
                p_high = data["p_high"].sel(model=summary["chosen_model"], pose="fitted", electrode=chosen).transpose(
                    "electrode", "stimulated", "sequence", "step").load()
        except Exception as exc:  # a damaged file, or one of another plan (h5py and xarray raise many types)
            raise FileFormatError(plan_path, f"holds no predicted P(high) of the chosen model "
                                             f"{summary.get('chosen_model')!r} and sites {chosen} "
                                             f"({type(exc).__name__}: {exc})") from None
        values = p_high.values
        unusable = ~np.all((values >= 0) & (values <= 1), axis=tuple(range(1, values.ndim)))  # NaN fails too
        if unusable.any():
            raise FileFormatError(plan_path, f"'p_high' of the chosen model {summary['chosen_model']!r} at its fitted "
                                             f"pose holds no probability in [0, 1] (NaN: off its sheet) at chosen "
                                             f"electrode(s) {[e for e, bad in zip(chosen, unusable) if bad]}; power "
                                             "simulates sessions from these curves and cannot without them")
        lapse = 0.0
        source = f"plan predictions ({summary['chosen_model']})"
    curves = lapse / 2 + (1 - lapse) * p_high.values.mean(axis=2)
    effect = plan_effect(summary, summary_path)
    return {"p_high": curves, "electrodes": chosen, "source": source, "effect": effect,
            "planned_effect": sites.loc[chosen, f"predicted_{effect}"].to_numpy(dtype=float),
            "plan_forecast": summary.get("trials_per_site_needed")}


def trials_text(count, largest: int) -> str:
    """A trial count in words: "1,600", or "more than 6,400" when ``count`` is None (not reached up to ``largest``)."""
    return f"more than {largest:,}" if count is None else f"{int(count):,}"


def min_sites_across(alpha: float) -> int:
    """Fewest sites with which the one-sided exact Wilcoxon signed-rank test can reach p < ``alpha``: its smallest p
    is 1 / 2^n (every site in the planned direction)."""
    return math.floor(math.log2(1 / alpha)) + 1


def too_few_sites(n_sites: int, alpha: float) -> str | None:
    """Why no trial count gives the test across sites its power with ``n_sites`` sites (fewer than
    :func:`min_sites_across`), in words; None with enough sites."""
    fewest = min_sites_across(alpha)
    if n_sites >= fewest:
        return None
    return f"with {n_sites} site(s) the test across sites can never reach p < {alpha:g}: it needs at least {fewest}"


def _forecast_note(forecast: dict | None, source: str, n_sites: int) -> str:
    """How the plan's own power forecast of its ``n_sites`` chosen sites differs from this one ('' for a plan without
    one)."""
    if not isinstance(forecast, dict) or not isinstance(forecast.get("largest_simulated"), int):
        return ""
    few = too_few_sites(n_sites, ALPHA) if forecast.get("across_sites") is None else None
    count = trials_text(forecast.get("across_sites"), forecast["largest_simulated"])
    stated = f"no trial count across sites, {few}" if few else f"{count} trials per site across sites"
    this = (f"this one simulates the {source}, so the two numbers answer different questions"
            if source.startswith("virtual subject") else
            f"this one simulates the {source} alone, so the two agree when the plan had one candidate")
    return (f" The plan's own forecast (its report's first page: {stated}) simulates the "
            f"mean of the candidate models' predicted curves without lapses, made before any session; {this}.")


def run_power(plan_dir, out_dir, target_power: float = TARGET_POWER, alpha: float = ALPHA,
              trial_counts=DEFAULT_TRIAL_COUNTS, n_sessions: int = 200, seed: int = 0, force: bool = False,
              progress: bool = False) -> dict:
    """Power of the plan's chosen sites; writes ``power_curve.csv``, ``power_sites.csv``,
    ``summary.json`` and ``report.html`` / ``report.pdf`` (table and curve) into ``out_dir`` as one
    result set."""
    from stimsim.analysis.figures import plot_power_curve
    from stimsim.analysis.plan_readback import plan_checksum, refuse_output_into_plan
    from stimsim.report import Image, Paragraph, Report, Section, Table, figure_png
    from stimsim.utilities.io import ResultSet, atomic_write_json, atomic_write_text, csv_text, provenance
    from stimsim.utilities.jsonable import json_ready
    from stimsim.utilities.locking import DirectoryLock

    refuse_output_into_plan(out_dir, plan_dir)
    plan_found = Path(plan_dir).is_dir()  # seen before the default output folder inside it is made
    # The output directory is checked (and claimed) before the work; a run that fails or is interrupted
    # before writing leaves it as it was.
    with DirectoryLock(out_dir, "power"), ResultSet(out_dir, "power", force=force) as results:
        if not plan_found:
            raise FileNotFoundError(f"plan directory not found: {plan_dir} (a directory made by `stimsim plan`)")
        planned = curves_from_plan(plan_dir)
        curve, sites, summary = power_analysis(planned["p_high"], planned["electrodes"], planned["planned_effect"],
                                               trial_counts=trial_counts, n_sessions=n_sessions, alpha=alpha,
                                               target_power=target_power, seed=seed, progress=progress,
                                               effect=planned["effect"])
        summary = {**summary, "simulated_from": planned["source"], "plan_dir": str(plan_dir),
                   "planned_effect": planned["effect"]}
        parameters = {"plan_dir": str(plan_dir), **plan_checksum(plan_dir), "target_power": target_power,
                      "alpha": alpha, "trial_counts": list(summary["trial_counts"]), "n_sessions": n_sessions,
                      "seed": seed}
        beyond = f"more than {max(summary['trial_counts'])}"
        few = summary["wilcoxon_trials_needed_undefined_reason"]
        no_r = summary["observed_vs_true_r_trials_needed_undefined_reason"]
        spread = summary["true_delta_auc_sd"]
        spread = f"SD {spread:.4f} across the sites" if math.isfinite(spread) else "no SD with one site"
        report = Report("Power of the planned session", subtitle=str(plan_dir), parameters=parameters, sections=[
            Section("Trials per site needed", [
                Paragraph(f"Sessions simulated from the {planned['source']}: stimulation and sham 50/50, "
                          f"{n_sessions} sessions per trial count. Across sites: Wilcoxon signed-rank test of ΔAUC "
                          f"in the planned direction (one-sided, α = {alpha:g}: chance {alpha:g}); per site: z test "
                          f"of ΔAUC, two-sided at α = {alpha:g}, a detection counted only in the planned direction "
                          f"(chance per site {alpha / 2:g})."
                          + _forecast_note(planned["plan_forecast"], planned["source"], summary["n_sites"])),
                Table((("statistic", "trials per site")), (
                    ("across sites (Wilcoxon)", f"none: {few}" if few else summary["wilcoxon_trials_needed"] or beyond),
                    ("per site, lower median over the sites reaching the target",
                     summary["median_site_trials_needed"] or beyond),
                    ("sites reaching the target power", f"{summary['n_sites_detectable']} of {summary['n_sites']}"),
                    (f"observed vs true ΔAUC r ≥ {TARGET_OBSERVED_VS_TRUE_R:g} across sites (mean)",
                     f"none: {no_r}" if no_r else summary["observed_vs_true_r_trials_needed"] or beyond))),
                Paragraph(f"\"True\" ΔAUC here is the ΔAUC of the curves the sessions are simulated from (the "
                          f"{planned['source']}): {spread}. The power "
                          "curve table also gives, per trial count, the mean r across sites of the observed ΔAUC with "
                          "that true ΔAUC (chance 0; its square is the reliability of the per-site effects) and with "
                          "the plan's predicted ΔAUC."),
                Image(figure_png(plot_power_curve(curve, target_power, alpha)),
                      caption=f"Power against trials per site; target {target_power:g}.")]),
            Section("Power curve", [Table.from_dataframe(curve)]),
            Section("Per site", [Table.from_dataframe(sites, caption=f"the plan's predicted effect "
                                                                      f"({planned['effect']}), the ΔAUC the sessions "
                                                                      "are simulated from, power at every trial "
                                                                      "count, trials needed (– : not within the "
                                                                      "counts)")])])
        record = {**json_ready(summary), "provenance": provenance(parameters)}
        results.write_together({  # an earlier power analysis stays whole and readable until every new file is made
            **report.savers(),
            "power_curve.csv": lambda tmp: atomic_write_text(tmp, csv_text(curve)),
            "power_sites.csv": lambda tmp: atomic_write_text(tmp, csv_text(sites)),
            "summary.json": lambda tmp: atomic_write_json(tmp, record)})
        results.finish()
    return summary
