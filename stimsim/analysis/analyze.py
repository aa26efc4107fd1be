"""The whole analysis of recorded sessions: per-site effects, statistics across sites (pooled and per
subject), reliability, and the comparison with a plan's predictions; saved as one result set.

Over 500 lines: the analysis, and the checks of its inputs against one another (sessions, plan, layout) that it makes
before any statistic, stay beside the one entry point that runs them.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats

from stimsim.analysis.comparison import (compare_predictions, expected_correlation, expected_correlation_reason,
                                         load_plan_predictions, load_plan_sequences, plan_effect,
                                         resampled_discrepancy)
from stimsim.analysis.effects import (CONDITIONS, SiteCounts, across_sites, check_session_table, count_trials,
                                      expected_fdr_discoveries_under_null, fdr_adjusted, site_effects,
                                      site_resampling_weights, spearman_brown, resampled_split_half_r,
                                      split_half_deltas, split_half_reliability)
from stimsim.analysis.plan_readback import read_plan_protocol, refuse_output_into_plan
from stimsim.behavior.metrics import finite_pearson
from stimsim.lab.sessions import SHAM, check_against_plan
from stimsim.lab.sessions.base import PROTOCOL_COLUMNS, off_protocol, planned_setting
from stimsim.utilities.errors import ConfigError, FileFormatError
from stimsim.utilities.jsonable import json_ready
from stimsim.utilities.limits import check_memory, check_seed
from stimsim.utilities.ordering import natural_key, naturally_ordered
from stimsim.utilities.progress import report_phase

#: Per-site permutation p below which a site counts as significant in the summary; also the false
#: discovery rate q of the Benjamini–Hochberg count.
SITE_ALPHA = 0.05


@dataclass
class Analysis:
    """Everything :func:`analyze` found. ``sites``: one row per (subject, electrode) with its effects
    (and the plan's predicted effect, :attr:`predicted_column`, given a plan); ``summary``: the numbers of
    ``summary.json``, with ``warnings`` (text) about what the statistics had to leave out or could not compute."""

    sessions: pd.DataFrame
    counts: SiteCounts
    sites: pd.DataFrame
    summary: dict
    parameters: dict = field(default_factory=dict)

    @property
    def predicted_column(self) -> str | None:
        """The column of ``sites`` with the plan's predicted effect (``predicted_delta_auc``,
        ``predicted_delta_p_face``, ...); None without a plan."""
        return f"predicted_{self.summary['plan_effect']}" if "plan_effect" in self.summary else None

    @property
    def predicted_label(self) -> str:
        """How figures and the report name the plan's predicted effect ("ΔAUC", "ΔP(face)")."""
        return self.summary.get("plan_effect_label") or str(self.summary.get("plan_effect", ""))

    def to_dataset(self) -> xr.Dataset:
        """Labelled arrays: counts and P(high) per (site, condition, step); per-site effects on site;
        the split-half reliability as scalars (``noise_ceiling`` NaN when undefined, with the reason in
        its ``undefined_reason`` attribute)."""
        site = np.arange(len(self.sites))
        data = xr.Dataset(
            {"n_trials": (("site", "condition", "step"), self.counts.n),
             "n_high": (("site", "condition", "step"), self.counts.n_high),
             "p_high": (("site", "condition", "step"), self.counts.p_high)},
            coords={"site": site, "condition": list(CONDITIONS), "step": self.counts.steps,
                    "subject_id": ("site", self.sites["subject_id"].astype(str).to_numpy()),
                    "electrode": ("site", self.sites["electrode"].astype(str).to_numpy())})
        for name in self.sites.columns:
            if name == "delta_auc_missing_reason":
                data[name] = ("site", self.sites[name].astype(str).to_numpy())
            elif name not in ("subject_id", "electrode"):
                values = self.sites[name].to_numpy()  # counts stay integers
                data[name] = ("site", values if values.dtype.kind in "iu" else values.astype(float))
        for name in ("split_half_r", "noise_ceiling"):
            data[name] = float(self.summary[name])
        if self.summary["noise_ceiling_undefined_reason"] is not None:
            data["noise_ceiling"].attrs["undefined_reason"] = self.summary["noise_ceiling_undefined_reason"]
        data["noise_ceiling"].attrs["description"] = "Spearman-Brown corrected split-half r of per-site delta_auc"
        data["split_half_r"].attrs["description"] = "split-half r of per-site delta_auc (trials split at random)"
        ci = f"{round(100 * self.parameters['ci'])} %"
        for name, (units, description) in {**VARIABLE_DESCRIPTIONS, **_interval_descriptions(ci)}.items():
            if name in data:
                data[name].attrs.update({"description": description, **({"units": units} if units else {})})
        data.attrs["summary_json"] = json.dumps(json_ready(naturally_ordered(self.summary)))
        data.attrs["parameters_json"] = json.dumps(self.parameters, default=str)
        return data


#: Units (None: a count, probability or score without one) and meaning of the variables of results.nc (the
#: per-site ones are also the columns of sites.csv).
VARIABLE_DESCRIPTIONS = {
    "n_trials": (None, "trials per site, condition and step"),
    "n_high": (None, "'high' choices per site, condition and step"),
    "p_high": (None, "P('high') per site, condition and step"),
    "n_sham": (None, "sham trials of the site"),
    "n_stimulated": (None, "stimulation trials of the site"),
    "n_empty_cells": (None, "(condition, step) cells of the site without a trial"),
    "current_uA": ("uA", "stimulation current of the site's stimulation trials"),
    "delta_auc": (None, "AUC of P(high) over steps scaled to [0, 1], stimulated - sham"),
    "delta_auc_missing_reason": (None, "why delta_auc is missing (empty where it is computed)"),
    "stim_logodds": ("log-odds", "stimulation term of the site's logistic regression of the choice on step and "
                                 "condition"),
    "stim_logodds_se": ("log-odds", "standard error of stim_logodds"),
    "stim_p": (None, "Wald p of stim_logodds (two-sided)"),
    "slope_logodds_per_step": ("log-odds per step", "step term of the site's logistic regression"),
    "shift_steps": ("steps", "x50(sham) - x50(stimulated); > 0: towards 'high'"),
    "shift_steps_se": ("steps", "standard error of shift_steps (delta method)"),
    "shift_boot_failed_fraction": (None, "share of bootstrap resamples without a shift (no rising curve)"),
    "permutation_p": (None, "two-sided permutation p of delta_auc (stimulated / sham labels shuffled within "
                            "the site)"),
    "p_fdr": (None, "permutation_p adjusted for the number of sites (Benjamini-Hochberg)"),
}


def _interval_descriptions(ci: str) -> dict:
    return {f"{name}_{end}": (units, f"{ci} bootstrap interval of {name}, {end} end")
            for name, units in (("delta_auc", None), ("shift_steps", "steps")) for end in ("low", "high")}


#: Peak memory of the resampling, bytes: per bootstrap resample or split half and (site, condition, step) cell,
#: and per permutation and trial of a site (measured with tracemalloc: 8.4, 6.8 and 3.2).
BOOT_BYTES_PER_CELL, SPLIT_BYTES_PER_CELL, PERM_BYTES_PER_TRIAL = 10 * 8, 8 * 8, 4 * 4


def _check_memory(counts, sessions: pd.DataFrame, n_boot: int, n_perm: int, n_splits: int) -> None:
    """Refuse resample counts whose arrays would not fit in the memory available (estimated before any work)."""
    cells = counts.n[..., 0, :].size * 2
    most_trials = int(counts.n.sum(axis=(1, 2)).max()) if counts.n.size else 0
    for option, count, needed in (("--boot", n_boot, BOOT_BYTES_PER_CELL * n_boot * cells),
                                  ("--splits", n_splits, SPLIT_BYTES_PER_CELL * n_splits * cells),
                                  ("--perm", n_perm, PERM_BYTES_PER_TRIAL * n_perm * most_trials)):
        check_memory(f"analyze: {option} {count} over {len(counts.electrode)} sites ({len(sessions)} trials)",
                     needed, option)


def analyze(sessions: pd.DataFrame, plan_dir=None, n_boot: int = 1000, n_perm: int = 1000,
            n_splits: int = 100, ci: float = 0.95, seed: int = 0, same_subject: bool = False) -> Analysis:
    """Analyse a validated session table (:func:`stimsim.lab.sessions.load_sessions`). Given a
    plan directory, trials of a sequence or at a step beyond the plan's are refused, and every site's curve
    spans the plan's steps (a step without trials leaves the site without ΔAUC, and says so).

    ``n_boot`` bootstrap resamples per site, ``n_perm`` label permutations per site (and 10 × as many
    for the statistics across sites), ``n_splits`` random split halves; everything is seeded by ``seed``.
    ``same_subject``: the sessions are of the animal the plan was made for, whatever their subject id.
    """
    for name, value, minimum in (("n_boot", n_boot, 2), ("n_perm", n_perm, 1), ("n_splits", n_splits, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    check_seed("seed", seed)
    if not 0 < ci < 1:
        raise ConfigError(f"ci must lie strictly between 0 and 1, got {ci}")
    check_session_table(sessions)
    parameters = {"plan_dir": str(plan_dir) if plan_dir else None, "n_boot": n_boot, "n_perm": n_perm,
                  "n_splits": n_splits, "ci": ci, "seed": seed, "site_alpha": SITE_ALPHA, "same_subject": same_subject}
    plan_sites, plan_summary, n_steps, effect = None, {}, None, None
    if plan_dir is not None:
        plan_sites, plan_summary = load_plan_predictions(plan_dir)
        effect = plan_effect(plan_summary)
        plan_file, n_sequences, n_steps = load_plan_sequences(plan_dir)
        check_against_plan(sessions, n_sequences, n_steps, plan_file)
        _check_plan_subject(plan_dir, plan_summary, sessions, same_subject)
        _plan_truth_on_sites(plan_summary, effect, sorted(sessions["electrode"].unique(), key=natural_key),
                             Path(plan_dir) / "summary.json")
    counts = count_trials(sessions, n_steps=n_steps)
    _check_memory(counts, sessions, n_boot, n_perm, n_splits)
    sites = site_effects(counts, n_boot=n_boot, n_perm=n_perm, ci=ci, seed=seed, sessions=sessions)
    if plan_sites is not None:
        interval = [name for name in (f"predicted_{effect}_low", f"predicted_{effect}_high") if name in plan_sites]
        sites = sites.merge(plan_sites[["electrode_id", f"predicted_{effect}", *interval]].rename(
            columns={"electrode_id": "electrode"}), on="electrode", how="left")

    planned = {} if effect is None else {"plan_effect": effect, "plan_effect_label": plan_summary.get("effect_label")}
    summary = {"n_trials": int(len(sessions)),
               "n_subjects": int(sessions["subject_id"].nunique()),
               "n_sessions": int(sessions[["subject_id", "session_id"]].drop_duplicates().shape[0]),
               "n_steps": int(counts.steps.size),
               "ci": ci, **planned,
               **_group_summary(sites, counts, plan_summary, n_boot, n_perm, n_splits, seed, effect)}
    given = [column for column in PROTOCOL_COLUMNS if column in sessions]  # the rig's columns, when a session has them
    protocol = [] if plan_dir is None or not given else _protocol_warnings(sessions, read_plan_protocol(plan_dir))
    summary["warnings"] = (_warnings(sites, summary) + _unrecorded_plan_sites(sessions, plan_sites)
                           + _current_warnings(sessions, sites, plan_sites) + protocol + _falling_curve_warning(counts))
    for message in summary["warnings"]:
        warnings.warn(message, stacklevel=2)
    subjects = sorted(sites["subject_id"].unique(), key=natural_key)
    if len(subjects) > 1:
        summary["per_subject"] = {
            str(subject): _group_summary(sites[sites["subject_id"] == subject].reset_index(drop=True),
                                         _subset(counts, counts.subject_id == subject), plan_summary, n_boot,
                                         n_perm, n_splits, seed, effect)
            for subject in subjects}
    return Analysis(sessions, counts, sites, summary, parameters)


def _check_plan_subject(plan_dir, plan_summary: dict, sessions: pd.DataFrame, same_subject: bool = False) -> None:
    """A plan predicts the sites of one subject's array: sessions of several subjects, or of another
    subject than the one a virtual-subject plan names (unless ``same_subject``), are refused."""
    subjects = sorted(sessions["subject_id"].unique(), key=natural_key)
    if len(subjects) > 1:
        raise ConfigError(f"{plan_dir}: a plan predicts the sites of one subject's array, but the sessions hold "
                          f"subjects {subjects}; analyse each subject with its own plan")
    planned = plan_summary.get("subject_id")
    if planned is not None and str(planned) != subjects[0] and not same_subject:
        raise ConfigError(f"{plan_dir}: the plan was made for subject {planned!r}, the sessions are of subject "
                          f"{subjects[0]!r}; give the plan of that subject (a table without a subject_id column "
                          f"is of subject 'subject'), or --same-subject if the lab names that animal differently")


def _site_label(subject, electrode, several_subjects: bool) -> str:
    """How a message names a site: "electrode 12", or "subject m1 electrode 12" when sessions hold several."""
    return f"{f'subject {subject} ' if several_subjects else ''}electrode {electrode}"


def _warnings(sites: pd.DataFrame, summary: dict) -> list[str]:
    """What the statistics across sites left out or could not compute, for people (sites in natural
    order, as in ``sites``)."""
    messages = []
    missing = sites[sites["delta_auc_missing_reason"] != ""]
    if len(missing):
        several = sites["subject_id"].nunique() > 1
        listed = "; ".join(f"{_site_label(s, e, several)} ({reason})" for s, e, reason in
                           zip(missing["subject_id"], missing["electrode"], missing["delta_auc_missing_reason"]))
        whole = missing["delta_auc_missing_reason"].str.contains("no sham trials|no stimulated trials")
        advice = (" A condition with no trial at all at a site is not a matter of too few trials: check that the rig "
                  "ran it there." if whole.any() else "")
        advice += " More trials per site fill the steps without a trial." if (~whole).any() else ""
        messages.append(f"{len(missing)} of {len(sites)} sites have no ΔAUC (a psychometric curve needs a trial at "
                        f"every step in both conditions) and are left out of the statistics across sites: "
                        f"{listed}.{advice}")
    if summary["wilcoxon_p_undefined_reason"] is not None:
        messages.append(f"Wilcoxon p and Cohen's d undefined: {summary['wilcoxon_p_undefined_reason']}.")
    if summary["noise_ceiling_undefined_reason"] is not None:
        consequence = (" The noise-ceiled r and the expected predicted vs observed r are undefined too."
                       if "noise_ceiled_r" in summary else "")
        messages.append(f"noise ceiling undefined: {summary['noise_ceiling_undefined_reason']}.{consequence}")
    return messages


def _unrecorded_plan_sites(sessions: pd.DataFrame, plan_sites: pd.DataFrame | None) -> list[str]:
    """The plan's chosen sites (its ``sites.csv`` rows with ``chosen`` true, every row of a plan without the column)
    that no trial of the sessions stimulates (in natural order)."""
    if plan_sites is None:
        return []
    chosen = plan_sites["electrode_id"] if "chosen" not in plan_sites else \
        plan_sites.loc[plan_sites["chosen"].astype(str).str.strip().str.lower() == "true", "electrode_id"]
    stimulated = set(sessions.loc[sessions["stimulated_electrode"] != SHAM, "electrode"])
    absent = sorted(set(chosen) - stimulated, key=natural_key)
    if not absent:
        return []
    return [f"{len(absent)} of the plan's {len(chosen)} chosen sites have no stimulation trial in the session(s) "
            f"and are not analysed: {', '.join(absent)}"]


def _current_warnings(sessions: pd.DataFrame, sites: pd.DataFrame, plan_sites: pd.DataFrame | None) -> list[str]:
    """Sites stimulated at several currents (one ΔAUC pools them), or at another current than the one the plan
    predicted their effect for (sites in natural order, as in ``sites``)."""
    stimulated = sessions[sessions["stimulated_electrode"] != SHAM]
    used = {site: np.unique(currents) for site, currents in
            stimulated.groupby(["subject_id", "electrode"])["current_uA"]}
    planned = {} if plan_sites is None or "current_uA" not in plan_sites else dict(
        zip(plan_sites["electrode_id"], pd.to_numeric(plan_sites["current_uA"], errors="coerce")))
    several = sites["subject_id"].nunique() > 1
    pooled, other = [], []
    for subject, electrode in zip(sites["subject_id"], sites["electrode"]):
        currents = used.get((subject, electrode), np.array([]))
        name = _site_label(subject, electrode, several)
        listed = ", ".join(f"{current:g}" for current in currents)
        if currents.size > 1:
            pooled.append(f"{name} ({listed} µA)")
        plan_current = planned.get(electrode, np.nan)
        if currents.size and np.isfinite(plan_current) and not np.allclose(currents, plan_current):
            other.append(f"{name} ({listed} µA; plan {plan_current:g} µA)")
    messages = []
    if pooled:
        messages.append(f"{len(pooled)} of {len(sites)} sites were stimulated at several currents, and each one's "
                        f"ΔAUC pools them (current_uA: their mean over the stimulated trials): {'; '.join(pooled)}. "
                        f"Analyse the trials of each current separately to compare currents.")
    if other:
        messages.append(f"{len(other)} of {len(sites)} sites were stimulated at another current than the one the plan "
                        f"predicted their effect for: {'; '.join(other)}. The predicted effect and the slope refer "
                        f"to the plan's current.")
    return messages


#: The p below which sham trials choosing 'high' less often at the 'high' end than at the 'low' end are taken as
#: choice codes the wrong way round (one-sided Fisher exact test, all sites pooled).
REVERSED_CODES_P = 0.01


def _falling_curve_warning(counts) -> list[str]:
    """Sham trials pooled over the sites: P('high') at the last step clearly below P('high') at step 0 means the
    choices are coded the other way round (step 0 is the 'low' end of every sequence; the signed signal level of the
    face task rises with the face signal), which flips every effect's sign."""
    from scipy.stats import fisher_exact

    n, high = counts.n[:, 0].sum(axis=0), counts.n_high[:, 0].sum(axis=0)  # sham, per step
    if n.size < 2 or n[0] == 0 or n[-1] == 0:
        return []
    table = [[high[-1], n[-1] - high[-1]], [high[0], n[0] - high[0]]]
    p = fisher_exact(table, alternative="less").pvalue
    if p >= REVERSED_CODES_P:
        return []
    return [f"without stimulation P('high') falls along the steps ({high[0] / n[0]:.2f} at step 0, "
            f"{high[-1] / n[-1]:.2f} at the last step; one-sided Fisher p = {p:.2g}): step 0 is the 'low' end, so the "
            "choice codes are most likely the other way round (map them with --values choice:CODE=low,CODE=high); "
            "every effect's sign is flipped"]


def _protocol_warnings(sessions: pd.DataFrame, stimulation: dict) -> list[str]:
    """Stimulation trials whose frequency, pulse width, train or train onset (the session columns of
    :data:`~stimsim.lab.sessions.base.PROTOCOL_COLUMNS` given) differ from the plan's protocol (``stimulation``, as
    :func:`~stimsim.analysis.plan_readback.read_plan_protocol` reads it)."""
    stimulated = (sessions["stimulated_electrode"] != SHAM).to_numpy()
    messages = []
    for column, unit in PROTOCOL_COLUMNS.items():
        if column not in sessions or column not in stimulation:
            continue
        planned = float(stimulation[column])
        given = sessions[column].to_numpy(dtype=float)
        other = off_protocol(given, stimulated, planned)
        if other.any():
            listed = np.unique(given[other])[:5]
            values = ", ".join(f"{value:g}" for value in listed) + f" {unit}"
            values += " (nan: no value)" if np.isnan(listed).any() else ""
            messages.append(f"{column}: {int(other.sum())} of {int(stimulated.sum())} stimulation trials give "
                            f"{values}, where {planned_setting(column, planned, unit)}; "
                            f"its predicted effects are for its own protocol")
    return messages


def _subset(counts: SiteCounts, keep: np.ndarray) -> SiteCounts:
    return SiteCounts(counts.subject_id[keep], counts.electrode[keep], counts.steps, counts.n[keep],
                      counts.n_high[keep], counts.current_uA[keep])


def _group_summary(sites: pd.DataFrame, counts: SiteCounts, plan_summary: dict, n_boot: int, n_perm: int,
                   n_splits: int, seed: int, effect: str | None) -> dict:
    """Statistics across the sites of one group (all subjects pooled, or one subject), and against the plan's
    predicted ``effect`` (column ``predicted_<effect>``; None: no plan). The false discovery rate is controlled over
    the group's own sites (Benjamini–Hochberg at q = SITE_ALPHA). The split-half r is resampled over the group's
    sites ``n_boot`` times: its interval, and the noise ceiling's uncertainty in the expected r."""
    significant = sites["permutation_p"] < SITE_ALPHA
    halves = split_half_deltas(counts, n_splits, seed)
    n_tested = int(np.isfinite(sites["permutation_p"]).sum())
    summary = {"n_sites_recorded": int(len(sites)), **across_sites(sites["delta_auc"], n_perm=10 * n_perm, seed=seed),
               # over the statistics' sample, the sites with a ΔAUC, as every other score across sites
               "mean_psychometric_shift_steps": _nanmean(sites["shift_steps"][np.isfinite(sites["delta_auc"])]),
               "mean_psychometric_shift_steps_chance": 0.0,
               "n_sites_significant": int(significant.sum()), "site_alpha": SITE_ALPHA,
               # expected false positives; rounded so that 0.05 × 24 reads 1.2, not 1.2000000000000002
               "n_sites_significant_chance": round(SITE_ALPHA * n_tested, 12),
               "n_sites_significant_fdr": int((fdr_adjusted(sites["permutation_p"]) < SITE_ALPHA).sum()),
               "n_sites_significant_fdr_chance": expected_fdr_discoveries_under_null(n_tested, SITE_ALPHA),
               **split_half_reliability(counts, halves)}
    weights = site_resampling_weights(len(sites), n_boot, seed)
    split_half_r_resampled = resampled_split_half_r(halves, weights)
    summary["split_half_r_95"] = (np.nanquantile(split_half_r_resampled, [0.025, 0.975]).tolist()
                                  if np.isfinite(split_half_r_resampled).any() else [float("nan")] * 2)
    if effect is None:
        return summary
    predicted = f"predicted_{effect}"
    comparison = compare_predictions(sites[predicted], sites["delta_auc"], summary["noise_ceiling"],
                                     n_perm=10 * n_perm, seed=seed)
    summary.update(comparison)
    summary["permutation_p"] = comparison["predicted_vs_observed_permutation_p"]
    direction = np.sign(sites[predicted]) * sites["delta_auc"]
    direction = direction[np.isfinite(direction)].to_numpy()
    summary["shift_in_predicted_direction"] = _nanmean(direction)
    summary["shift_in_predicted_direction_chance"] = 0.0
    summary["shift_in_predicted_direction_wilcoxon_p"] = (
        float(stats.wilcoxon(direction, alternative="greater").pvalue) if direction.size > 1 and np.ptp(direction) > 0
        else float("nan"))
    planned_r = plan_summary.get("predicted_vs_true_r")
    if planned_r is not None:
        summary["plan_predicted_vs_true_r"] = float(planned_r)
        summary["plan_predicted_vs_true_r_chance"] = 0.0
        # The plan's r is over every site it rehearsed; the sites of a session (e.g. the top-ranked ones) can
        # correlate less (a narrower range of predictions). With the plan's per-site truth, use these sites.
        plan_predicted, plan_true = _plan_truth_on_sites(plan_summary, effect, sites["electrode"])
        sites_r = finite_pearson(plan_predicted, plan_true)
        summary["plan_predicted_vs_true_r_these_sites"] = sites_r
        basis = sites_r if np.isfinite(sites_r) else float(planned_r)
        # a resample whose split-half r is <= 0 estimates no reliability: it expects r = 0 (one without a
        # split-half r stays NaN and is left out)
        resampled_ceilings = np.where(split_half_r_resampled <= 0, 0.0, spearman_brown(split_half_r_resampled))
        discrepancy = resampled_discrepancy(weights, sites[predicted], sites["delta_auc"], resampled_ceilings,
                                            predicted_vs_true_r=basis,
                                            true=plan_true if np.isfinite(sites_r) else None)
        reason = expected_correlation_reason(basis, summary["noise_ceiling"], comparison["n_sites_compared"])
        if reason is None and np.isfinite(discrepancy).sum() < 2:
            reason = "fewer than 2 resamples of the sites give an r; the interval needs them"
        expected, low, high = (expected_correlation(basis, summary["noise_ceiling"], comparison["n_sites_compared"],
                                                    resampled_discrepancy=discrepancy)
                               if reason is None else (float("nan"),) * 3)
        summary.update({"expected_predicted_vs_observed_r": expected,
                        "expected_predicted_vs_observed_r_95": [low, high],
                        "expected_predicted_vs_observed_r_undefined_reason": reason})
    return summary


def _plan_truth_on_sites(plan_summary: dict, effect: str, electrodes,
                         summary_path="summary.json") -> tuple[np.ndarray, np.ndarray]:
    """The plan's predicted and true ``effect`` at ``electrodes``: a plan made on a virtual subject lists both per
    electrode it rehearsed (``predicted_<effect>``, ``true_<effect>``), each a finite number (dead electrodes too);
    NaN throughout for a plan without them (made for a real subject). Lists that are not objects, or lack a finite
    number for one of ``electrodes``, are refused (FileFormatError naming ``summary_path``, the field and the
    electrodes) rather than left out of the r over these sites."""
    names = (f"predicted_{effect}", f"true_{effect}")
    if names[1] not in plan_summary:
        return np.full(len(electrodes), np.nan), np.full(len(electrodes), np.nan)
    per_site = []
    for name in names:
        listed = plan_summary.get(name)
        if not isinstance(listed, dict):
            raise FileFormatError(summary_path, f"field {name!r} must map each electrode the plan rehearsed to a "
                                                f"number, got {type(listed).__name__}; run the plan again")
        values = [listed.get(str(electrode)) for electrode in electrodes]
        bad = [(str(electrode), value) for electrode, value in zip(electrodes, values)
               if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value)]
        if bad:
            shown = ", ".join(f"{electrode} ({repr(value) if electrode in listed else 'missing'})"
                              for electrode, value in bad[:5]) + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")
            raise FileFormatError(summary_path, f"field {name!r} has no finite number for {len(bad)} of the "
                                                f"{len(values)} analysed sites: electrode {shown}; a plan on a virtual "
                                                "subject lists one for every electrode it rehearsed (a dead one too), "
                                                "so the file is damaged or of another plan: run the plan again")
        per_site.append(np.array(values, dtype=float))
    return per_site[0], per_site[1]


def _nanmean(values) -> float:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


def save_analysis(analysis: Analysis, out_dir, sources=(), report: bool = True, force: bool = False) -> Path:
    """Write the analysis into ``out_dir`` as one result set (:class:`stimsim.utilities.io.ResultSet`):
    ``results.nc``, ``sites.csv``, ``summary.json`` (with provenance) and, with ``report``,
    ``report.html`` + ``report.pdf``. ``force`` writes into a directory holding other files."""
    from stimsim.utilities.io import ResultSet
    from stimsim.utilities.locking import DirectoryLock

    with DirectoryLock(out_dir, "analyze"), ResultSet(out_dir, "analysis", force=force) as results:
        return _write_analysis(analysis, results, sources, report)


def _write_analysis(analysis: Analysis, results, sources, report: bool) -> Path:
    from stimsim.analysis.plan_readback import plan_checksum
    from stimsim.utilities.hashing import sha256_of
    from stimsim.utilities.io import atomic_write_json, atomic_write_text, csv_text, provenance

    record = provenance({**analysis.parameters, "sessions": [str(path) for path in sources],
                         "sessions_sha256": [sha256_of(path) for path in sources],
                         **plan_checksum(analysis.parameters["plan_dir"])})
    dataset = analysis.to_dataset()
    dataset.attrs["provenance_json"] = json.dumps(record, default=str)
    summary = naturally_ordered({**json_ready(analysis.summary), "provenance": record})
    savers = {"results.nc": lambda tmp: dataset.to_netcdf(tmp, engine="h5netcdf"),
              "sites.csv": lambda tmp: atomic_write_text(tmp, csv_text(analysis.sites))}
    if report:
        from stimsim.analysis.report import build_report

        savers.update(build_report(analysis, sources, record["config"]).savers())
    # an earlier analysis stays whole and readable until every new file is made
    results.write_together({**savers, "summary.json": lambda tmp: atomic_write_json(tmp, summary, sort_keys=False)})
    results.finish()
    return results.directory


#: The files :func:`run_analysis` writes into its output directory.
ANALYSIS_FILES = ("report.html", "report.pdf", "results.nc", "sites.csv", "summary.json")


def _refuse_output_over_sessions(out_dir, paths) -> None:
    """Refuse an output directory where a file the analysis writes would replace a session file it reads
    (``--force`` or not: the recording would be lost)."""
    written = {(Path(out_dir) / name).resolve() for name in ANALYSIS_FILES}
    replaced = [path for path in paths if Path(path).resolve() in written]
    if replaced:
        raise ConfigError(f"--out {out_dir}: the analysis writes its {Path(replaced[0]).name} there, which would "
                          f"replace the session file {replaced[0]}; give another folder")


def _check_plan_on_layout(sites: set, array, layout, by_label: bool) -> None:
    """Refuse a ``--layout`` that does not hold the plan's sites (another array, or a .cmp map read by channel for
    a plan that names its electrodes by the map's labels)."""
    missing = sorted(sites - set(array.electrode_ids), key=natural_key)
    if not missing:
        return
    hint = ("; the plan names them by the map's labels: add --layout-ids label" if by_label
            and set(missing) <= set(array.labels) else "; give the layout the plan was made with")
    raise ConfigError(f"--layout {layout}: {len(missing)} of the plan's {len(sites)} sites are not its electrodes: "
                      f"{', '.join(map(repr, missing[:5]))}{' …' if len(missing) > 5 else ''} (its ids e.g. "
                      f"{', '.join(map(repr, array.electrode_ids[:5]))}){hint}")


def run_analysis(session_paths, out_dir, plan_dir=None, columns: dict | None = None, layout=None,
                 n_boot: int = 1000, n_perm: int = 1000, n_splits: int = 100, seed: int = 0,
                 force: bool = False, values: dict | None = None, progress: bool = False,
                 layout_ids: str = "channel", same_subject: bool = False) -> Analysis:
    """Load and validate the session files (electrodes checked against the plan's sites when a plan
    is given, or against ``layout``: a Utah kind "10x10" / "8x8" or a .csv / .cmp layout file, a .cmp's
    ids its channel numbers or, with ``layout_ids="label"``, its labels; lab
    column names ``columns`` and value codes ``values`` translated), analyse them, and write the report
    (HTML + PDF), ``results.nc``, ``sites.csv`` and ``summary.json`` into ``out_dir`` as one result set.
    ``progress`` prints each phase on stderr."""
    from stimsim.lab.arrays.layout import cmp_options, load_layout
    from stimsim.lab.sessions import load_sessions
    from stimsim.utilities.io import ResultSet
    from stimsim.utilities.locking import DirectoryLock

    cmp = cmp_options(str(layout), layout_ids, names=("--layout-ids", "pitch_mm")) if layout is not None else {}
    if plan_dir is not None:
        refuse_output_into_plan(out_dir, plan_dir)
    paths = [session_paths] if isinstance(session_paths, (str, Path)) else list(session_paths)
    _refuse_output_over_sessions(out_dir, paths)
    if layout is None and layout_ids != "channel":
        raise ConfigError(f"--layout-ids {layout_ids}: names the ids of a .cmp --layout; no --layout is given")

    # The output directory is checked (and claimed) before the work; a run that fails or is interrupted
    # before writing leaves it as it was.
    with DirectoryLock(out_dir, "analyze"), ResultSet(out_dir, "analysis", force=force) as results:
        electrodes = plan_sequences = None
        source = "the plan's sites"
        if plan_dir is not None:
            electrodes = set(map(str, load_plan_predictions(plan_dir)[0]["electrode_id"]))
            plan_sequences = load_plan_sequences(plan_dir)
        if layout is not None:
            array = load_layout(layout, **cmp)
            by_label = bool(array.labels) and layout_ids == "channel"  # a .cmp map read by its channel numbers
            if electrodes is not None:
                _check_plan_on_layout(electrodes, array, layout, by_label)
            electrodes = set(array.electrode_ids) if electrodes is None else electrodes
            source = f"the array --layout {layout}" if plan_dir is None else f"the plan's sites (on --layout {layout})"
            if by_label:
                source += " (ids: its channel numbers; its labels need --layout-ids label)"
        report_phase(f"analyze: reading {len(paths)} session file(s)", progress)
        sessions = load_sessions(session_paths, columns=columns, electrodes=electrodes, values=values,
                                 plan_sequences=plan_sequences, electrodes_source=source)
        n_sites = len(sessions[["subject_id", "electrode"]].drop_duplicates())
        report_phase(f"analyze: statistics of {n_sites} site(s), {len(sessions)} trials ({n_boot} bootstrap "
                     f"resamples, {n_perm} permutations per site, {n_splits} split halves)", progress)
        analysis = analyze(sessions, plan_dir=plan_dir, n_boot=n_boot, n_perm=n_perm, n_splits=n_splits, seed=seed,
                           same_subject=same_subject)
        analysis.parameters.update({"columns": columns or {}, "values": values or {},
                                    "layout": str(layout) if layout is not None else None,
                                    "layout_ids": layout_ids})
        report_phase("analyze: writing the report (HTML and PDF), results.nc, sites.csv and summary.json", progress)
        _write_analysis(analysis, results, session_paths, report=True)
    return analysis
