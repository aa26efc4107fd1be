"""The analysis report: session overview, per-site effects, psychometric curves of the top
sites, predictions against outcomes, every score beside its chance level or baseline."""
from __future__ import annotations

import math

import pandas as pd

from stimsim.analysis import figures
from stimsim.lab.sessions import SHAM
from stimsim.report import Image, Paragraph, Report, Section, Table, figure_png, format_value
from stimsim.utilities.ordering import natural_key

#: p below which the report says that the plan's predictions correlate with the observed effects.
SIGNIFICANCE = 0.05

#: Scores of the summary table: (key, meaning, chance level or baseline key / value).
_SCORES = (
    ("n_sites_recorded", "sites recorded (subject × electrode)", None),
    ("n_sites", "sites with a ΔAUC (in the statistics across sites)", None),
    ("n_sites_without_effect", "sites without a ΔAUC (a step without trials; see the warnings)", None),
    ("n_trials", "trials", None),
    ("mean_shift", "mean ΔAUC across sites (stimulated − sham)", "mean_shift_chance"),
    ("wilcoxon_p", "Wilcoxon signed-rank p of ΔAUC across sites (two-sided)", None),
    ("cohens_d", "Cohen's d of ΔAUC across sites", 0.0),
    ("mean_shift_permutation_p", "sign-flip permutation p of the mean ΔAUC", None),
    ("mean_psychometric_shift_steps", "mean psychometric shift (steps; > 0 towards 'high')", 0.0),
    ("n_sites_significant", "sites with a per-site permutation p < 0.05", "n_sites_significant_chance"),
    ("n_sites_significant_fdr", "sites with a Benjamini–Hochberg adjusted p < 0.05 (false discovery rate 0.05)",
     "n_sites_significant_fdr_chance"),
    ("split_half_r", "split-half r of per-site ΔAUC", 0.0),
    ("split_half_r_95", "its 95 % interval over sites resampled with replacement", None),
    ("split_half_mean_sites", "sites with a ΔAUC in both halves (mean over splits)", None),
    ("noise_ceiling", "noise ceiling (Spearman–Brown corrected split-half r; undefined when that r ≤ 0)", None),
    ("shift_in_predicted_direction", "mean ΔAUC in the direction the plan predicted (sign of its prediction × "
     "ΔAUC)", "shift_in_predicted_direction_chance"),
    ("shift_in_predicted_direction_wilcoxon_p", "Wilcoxon signed-rank p of that shift (one-sided, > 0: the test the "
     "plan's power forecast is for)", None),
    ("predicted_vs_observed_r", "Pearson r, predicted vs observed ΔAUC (chance: the 95 % interval of r with the "
     "predictions permuted across sites)", "predicted_vs_observed_r_null_95"),
    ("permutation_p", "permutation p of that r (two-sided)", None),
    ("noise_ceiled_r", "r / sqrt(noise ceiling)", None),
    ("slope", "slope of observed on predicted (< 1: the plan over-estimates)", "slope_ideal"),
    ("plan_predicted_vs_true_r", "the plan's predicted vs true r (virtual subject; all rehearsed sites)",
     "plan_predicted_vs_true_r_chance"),
    ("plan_predicted_vs_true_r_these_sites", "the same over the analysed sites", "plan_predicted_vs_true_r_chance"),
    ("expected_predicted_vs_observed_r", "expected r: plan r on these sites × sqrt(noise ceiling) (baseline: the "
     "95 % interval of the observed r it expects, sites resampled)", "expected_predicted_vs_observed_r_95"),
)


def _interval(value):
    """An interval (a pair) as "[low, high]", None (shown "–") where both ends are undefined; any other value as it
    is."""
    if not isinstance(value, (list, tuple)):
        return value
    if all(end is None or end != end for end in value):
        return None
    return "[" + ", ".join(format_value(end) for end in value) + "]"


def _score_table(summary: dict) -> Table:
    rows = []
    for key, meaning, baseline in _SCORES:
        if key not in summary:
            continue
        reference = summary.get(baseline) if isinstance(baseline, str) else baseline
        value = "undefined (see the notes)" if summary.get(f"{key}_undefined_reason") else summary[key]
        rows.append((key, meaning, _interval(value), _interval(reference)))
    return Table(("statistic", "meaning", "value", "chance / baseline"), tuple(rows), digits=3)


def _notes(summary: dict) -> list[Paragraph]:
    """The analysis's warnings, each in a warning box, and why each undefined score is undefined (scores undefined
    for one reason named together; the noise ceiling's reason is its warning's)."""
    notes = [Paragraph(f"Warning: {message}", css_class="warning") for message in summary.get("warnings", ())]
    by_reason: dict[str, list[str]] = {}
    for key, reason in summary.items():
        if key.endswith("_undefined_reason") and reason and key != "noise_ceiling_undefined_reason":
            by_reason.setdefault(reason.replace("(see noise_ceiling_undefined_reason)", "(see the warning above)"),
                                 []).append(key.removesuffix("_undefined_reason"))
    notes += [Paragraph(f"{' and '.join(keys)} {'is' if len(keys) == 1 else 'are'} undefined: {reason}.")
              for reason, keys in by_reason.items()]
    return notes


def _finite(summary: dict, key: str) -> bool:
    value = summary.get(key)
    return isinstance(value, (int, float)) and math.isfinite(value)


def _conclusion(summary: dict) -> Paragraph:
    """The result in words: sites that differ from sham against chance, the effect across sites, and how well the
    plan's predictions did (where a plan was given)."""
    text = (f"In short: {summary['n_sites_significant']} of {summary['n_sites']} sites differ from sham (per-site "
            f"permutation p < 0.05; {summary['n_sites_significant_chance']:.1f} expected by chance), "
            f"{summary['n_sites_significant_fdr']} after the false-discovery correction.")
    if _finite(summary, "mean_shift") and _finite(summary, "wilcoxon_p"):
        text += (f" Across sites the mean ΔAUC is {summary['mean_shift']:+.3f} (Wilcoxon p = "
                 f"{summary['wilcoxon_p']:.2g}).")
    if _finite(summary, "predicted_vs_observed_r") and _finite(summary, "permutation_p"):
        r, p = summary["predicted_vs_observed_r"], summary["permutation_p"]
        how = "correlate with" if p < SIGNIFICANCE else "do not detectably correlate with"
        text += f" The plan's predictions {how} the observed effects (r = {r:.2f}, permutation p = {p:.2g})."
    if _finite(summary, "shift_in_predicted_direction") and _finite(summary, "shift_in_predicted_direction_wilcoxon_p"):
        text += (f" In the direction the plan predicted, ΔAUC is {summary['shift_in_predicted_direction']:+.3f} on "
                 f"average (one-sided Wilcoxon p = {summary['shift_in_predicted_direction_wilcoxon_p']:.2g}, the "
                 "test of the plan's power forecast).")
    return Paragraph(text)


def _currents(sessions: pd.DataFrame) -> str:
    """The currents of the stimulated trials, in words (µA)."""
    stimulated = sessions.loc[sessions["stimulated_electrode"] != SHAM, "current_uA"] if "current_uA" in sessions \
        else pd.Series(dtype=float)
    currents = sorted(set(pd.to_numeric(stimulated, errors="coerce").dropna().astype(float)))
    if not currents:
        return "(the sessions give no current)"
    return f"at {', '.join(f'{c:g}' for c in currents)} µA"


def build_report(analysis, sources, parameters: dict) -> Report:
    """A :class:`~stimsim.report.Report` of an :class:`~stimsim.analysis.analyze.Analysis` of the session files
    ``sources``; ``parameters``: everything it depends on, as its summary.json's provenance records them (the sessions'
    and the plan's checksums too)."""
    summary, sites = analysis.summary, analysis.sites
    sessions = analysis.sessions.groupby(["subject_id", "session_id"], sort=False).agg(
        trials=("row", "size"), sites=("electrode", "nunique"),
        stimulated=("stimulated_electrode", lambda column: int((column != "sham").sum())),
        file=("file", "first")).reset_index().sort_values(["subject_id", "session_id"],
                                                          key=lambda column: column.map(natural_key))
    without = summary["n_sites_recorded"] - summary["n_sites"]
    overview = [Paragraph(f"{summary['n_trials']} trials from {summary['n_sessions']} session(s) of "
                          f"{summary['n_subjects']} subject(s), {summary['n_sites_recorded']} sites recorded, "
                          f"{summary['n_sites']} with a ΔAUC"
                          + (f" ({without} without: a step with no trial in a condition; see below)" if without else "")
                          + f", {summary['n_steps']} steps per sequence; stimulation {_currents(analysis.sessions)}."),
                Table.from_dataframe(sessions, caption="Sessions"),
                Image(figure_png(figures.plot_overview(analysis)),
                      caption="Trials per site and condition; P('high') per step, all sites pooled.")]
    site_columns = (["subject_id"] if summary["n_subjects"] > 1 else []) + [
        "electrode", "n_stimulated", "n_sham", "delta_auc", "delta_auc_low", "delta_auc_high", "shift_steps",
        "stim_logodds", "stim_logodds_se", "stim_p", "permutation_p", "p_fdr"]
    predicted = analysis.predicted_column
    if predicted is not None:
        site_columns.append(predicted)
    if (sites["delta_auc_missing_reason"] != "").any():
        site_columns.append("delta_auc_missing_reason")
    ci = round(100 * summary["ci"])
    by_effect = sites[site_columns].sort_values("delta_auc", key=abs, ascending=False, kind="stable")
    per_site_figure = Image(figure_png(figures.plot_site_effects(analysis)), css_class="first-page",
                            caption=f"ΔAUC per site with {ci} % bootstrap intervals (trials resampled within each "
                                    f"condition and step)" + ("; × the plan's prediction." if predicted else "."))
    effects = [Table.from_dataframe(by_effect,
                                    caption="Per-site effects (sorted by |ΔAUC|); stim_logodds: stimulation term of "
                                            "the per-site logistic regression with its standard error and Wald p "
                                            "(stim_p); "
                                            "p_fdr: the permutation p adjusted for the number of sites "
                                            "(Benjamini–Hochberg).")]
    sections = [Section("Summary", [Paragraph("Per-site stimulation effects, stimulated against interleaved sham "
                                              "trials; statistics across sites; every score beside its chance "
                                              "level or baseline."), per_site_figure, _conclusion(summary),
                                   _score_table(summary), *_notes(summary)]),
                Section("Session overview", overview),
                Section("Per-site effects", effects),
                Section("Psychometric curves of the top sites",
                        [Image(figure_png(figures.plot_top_sites(analysis)),
                               caption="P('high') per step, stimulated vs sham (bars: binomial standard errors), "
                                       f"for {figures.top_sites(analysis)[1]}.")])]
    if predicted is not None:
        sections.append(Section("Predictions against outcomes", [
            Image(figure_png(figures.plot_predicted_vs_observed(analysis)),
                  caption=f"Observed ΔAUC against the plan's predicted {analysis.predicted_label} per site (vertical "
                          f"bars: {ci} % bootstrap intervals of the observed ΔAUC; horizontal bars: the plan's 95 % "
                          "intervals over candidate models × registration poses, without the model-to-subject error), "
                          "identity line dashed."),
            Paragraph("Where r is clearly above 0, the slope of observed on predicted measures magnitude: below 1 "
                      "the plan over-estimates the effects. Observed effects of reliability ρ (the noise ceiling) "
                      "correlate with any prediction at most sqrt(ρ) times as well as the true effects do, so a plan "
                      "that correlates with the true effects at r should reach about r·sqrt(ρ) here.")]))
    if "per_subject" in summary:
        per_subject = pd.DataFrame([{"subject_id": subject, **{key: values.get(key) for key in (
            "n_sites_recorded", "n_sites", "mean_shift", "wilcoxon_p", "cohens_d", "n_sites_significant",
            "n_sites_significant_fdr", "split_half_r", "noise_ceiling",
            "predicted_vs_observed_r", "permutation_p", "slope") if key in values}}
            for subject, values in sorted(summary["per_subject"].items(), key=lambda item: natural_key(item[0]))])
        sections.append(Section("Per subject", [Table.from_dataframe(per_subject)]))
    return Report("Analysis of recorded stimulation sessions", sections=sections,
                  subtitle=", ".join(str(path) for path in sources),
                  parameters=parameters)
