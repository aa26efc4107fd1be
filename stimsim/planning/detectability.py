"""What a plan can detect, and how far its predictions may be from the animal's effects.

* The power forecast of the chosen sites (:func:`stimsim.analysis.power.power_analysis`) on the plan's own
  predicted P(high) curves — mean over the candidates at their fitted registration and over each site's
  sequences, without lapses (so an upper bound for an animal that lapses) — at
  :data:`FORECAST_TRIAL_COUNTS` and the lab's planned ``[session] trials_per_site``, with
  :data:`FORECAST_SESSIONS` simulated sessions per count (``stimsim power`` runs 200 by default; this keeps the
  plan fast, at a binomial standard error of at most 5 points of power).
* The model-to-subject error: how far one brain-like instance's effect lies from another's, estimated from the
  candidates' agreement with each other (:func:`subject_error_sd`), added to the interval over candidates ×
  registration poses (:func:`with_subject_error`).
"""
from __future__ import annotations

import warnings

import numpy as np

from stimsim.analysis.power import ALPHA, TARGET_POWER, power_analysis, too_few_sites, trials_text

#: Trials per site the plan's forecast simulates (with the planned count added).
FORECAST_TRIAL_COUNTS = (50, 100, 200, 400, 800, 1600, 3200, 6400)
#: Simulated sessions per trial count in the plan's forecast.
FORECAST_SESSIONS = 100
#: The normal quantile of a two-sided 95 % interval.
Z95 = 1.959963984540054


def predicted_curves(rehearsals: dict, sites) -> np.ndarray:
    """(n_sites, 2, n_steps) predicted P(high) of ``sites`` (indices) without / with stimulation: the mean over the
    candidates at their fitted registration (those that map the site onto their sheet) and over its sequences."""
    stacked = np.stack([r["p_high"][np.asarray(sites, dtype=int)][:, :2] for r in rehearsals.values()])
    return np.nanmean(stacked, axis=(0, 3))


def forecast(curves: np.ndarray, electrodes, planned_effect, trials_per_site: int, seed: int) -> dict:
    """The summary.json keys of the power forecast of ``curves`` (:func:`predicted_curves`) at ``trials_per_site``:
    ``power_at_planned_trials``, ``trials_per_site_needed`` (None: more than the largest count simulated),
    ``power_forecast`` (how it was made, the power curve) and ``power_warning`` (None when the across-site test
    reaches :data:`TARGET_POWER` at the planned count)."""
    if len(electrodes) == 0:
        return {"power_at_planned_trials": None, "trials_per_site_needed": None, "power_forecast": None,
                "power_warning": "no site was chosen, so there is no effect to detect"}
    counts = sorted({*FORECAST_TRIAL_COUNTS, int(trials_per_site)})
    curve, sites, summary = power_analysis(curves, electrodes, planned_effect, trial_counts=counts,
                                           n_sessions=FORECAST_SESSIONS, alpha=ALPHA, target_power=TARGET_POWER,
                                           seed=seed)
    at = curve.set_index("trials_per_site").loc[int(trials_per_site)]
    per_site = dict(zip(sites["electrode"], sites[f"power_{int(trials_per_site)}"].astype(float)))
    needed = {"across_sites": summary["wilcoxon_trials_needed"],
              "per_site_median": summary["median_site_trials_needed"],
              "per_site": dict(zip(sites["electrode"], sites["trials_needed"])), "largest_simulated": counts[-1]}
    power = {"trials_per_site": int(trials_per_site), "across_sites": float(at["wilcoxon_power"]),
             "per_site_mean": float(at["mean_site_power"]), "per_site": per_site}
    return {"power_at_planned_trials": power, "trials_per_site_needed": needed,
            "power_forecast": {
                "source": "the plan's predicted P(high) of the chosen sites (mean over candidates at their fitted "
                          "registration and over sequences), without lapses",
                "tests": "across sites: one-sided Wilcoxon signed-rank of ΔAUC in the planned direction; per site: "
                         "two-sided z test of ΔAUC, detected when p < alpha in the planned direction",
                "alpha": ALPHA, "target_power": TARGET_POWER, "n_sessions": FORECAST_SESSIONS, "seed": seed,
                "curve": curve[["trials_per_site", "wilcoxon_power", "mean_site_power"]].to_dict(orient="list")},
            "power_warning": power_warning(power, needed)}


def power_forecast(rehearsals: dict, plan: dict, working: list, trials_per_site: int, seed: int) -> dict:
    """:func:`forecast` of a plan's chosen sites (``plan["choice"]["chosen"]``, indices into ``working``) on the
    candidates' P(high) curves (``rehearsals``: candidate → its ``p_high``), in the direction of their predicted
    effect; the warning is also issued."""
    chosen = plan["choice"]["chosen"]
    result = forecast(predicted_curves(rehearsals, chosen), [working[i] for i in chosen], plan["predicted"][chosen],
                      trials_per_site, seed)
    if result["power_warning"] is not None:
        warnings.warn(result["power_warning"], stacklevel=4)
    return result


def power_warning(power: dict, needed: dict) -> str | None:
    """In words, why the chosen sites cannot show their effects at the planned trial count; None when the across-site
    test reaches :data:`TARGET_POWER` there."""
    if power["across_sites"] >= TARGET_POWER:
        return None
    largest = needed["largest_simulated"]
    few = too_few_sites(len(power["per_site"]), ALPHA)
    per_site = trials_text(needed["per_site_median"], largest)
    needs = (f"no trial count reaches {TARGET_POWER:.0%} power across sites ({few}; its smallest p is 1/2^n), and "
             f"per site it needs {per_site} trials" if few else
             f"{TARGET_POWER:.0%} power needs {trials_text(needed['across_sites'], largest)} trials per site across "
             f"sites and {per_site} per site")
    return (f"at the planned {power['trials_per_site']:,} trials per site the chosen sites' predicted effects are "
            f"detected with {power['across_sites']:.0%} power across sites and {power['per_site_mean']:.0%} per site "
            f"(mean); {needs} (median), forecast from the predicted effects (on a virtual subject `stimsim power` "
            "simulates its true ones, which may need another count)")


def subject_error_sd(fitted: np.ndarray) -> float | None:
    """SD of the model-to-subject error of the plan's prediction, from ``fitted`` (n_models, n_sites) effects of the
    candidates at their fitted registration: each instance's effect = a shared part + its own deviation of variance
    σ², σ² = the mean over sites (every candidate predicting) of the candidates' variance (ddof 1); the mean of M
    candidates then lies σ √(1 + 1/M) from a new instance (the subject). None with fewer than 2 candidates or no
    site that all of them predict."""
    fitted = np.asarray(fitted, dtype=float)
    if fitted.shape[0] < 2:
        return None
    complete = np.isfinite(fitted).all(axis=0)
    if not complete.any():
        return None
    variance = float(np.mean(np.var(fitted[:, complete], axis=0, ddof=1)))
    return float(np.sqrt(variance * (1 + 1 / fitted.shape[0])))


def with_subject_error(predicted, low, high, sd: float | None) -> tuple[np.ndarray, np.ndarray]:
    """The 95 % interval of candidates × poses widened by the model-to-subject error: each side's distance from
    the prediction and 1.96 ``sd`` added in quadrature. NaN where ``sd`` is None."""
    predicted, low, high = (np.asarray(v, dtype=float) for v in (predicted, low, high))
    if sd is None:
        return np.full_like(predicted, np.nan), np.full_like(predicted, np.nan)
    below = np.sqrt(np.clip(predicted - low, 0, None) ** 2 + (Z95 * sd) ** 2)
    above = np.sqrt(np.clip(high - predicted, 0, None) ** 2 + (Z95 * sd) ** 2)
    return predicted - below, predicted + above


#: What the two intervals of the plan span (summary.json ``interval_spans``, the report).
INTERVAL_SPANS = {
    "interval": "2.5–97.5 percentiles over candidate models × registration poses (the fitted pose and every "
                "bootstrap pose): the uncertainty of the "
                "models and of the array's registration, not how far the animal's effect lies from the models'",
    "interval_with_subject": "the interval widened by the model-to-subject error (normal, 95 %): its SD estimated "
                             "from how far the candidate instances' effects lie from each other "
                             "(model_to_subject_sd); needs at least 2 candidates",
}


def coverage(true, low, high) -> float | None:
    """Fraction of the finite ``true`` effects inside [low, high] (None when there is none)."""
    true, low, high = (np.asarray(v, dtype=float) for v in (true, low, high))
    usable = np.isfinite(true) & np.isfinite(low) & np.isfinite(high)
    return float(np.mean((true[usable] >= low[usable]) & (true[usable] <= high[usable]))) if usable.any() else None
