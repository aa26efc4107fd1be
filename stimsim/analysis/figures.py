"""Figures of an analysis, as matplotlib figures (for a report, or stimsim.utilities.figures.save_figure):
session overview, per-site effects with intervals, psychometric curves of the top sites,
predicted against observed effects, and the power curve."""
from __future__ import annotations

import numpy as np

from stimsim.utilities.figures import pyplot


def _site_labels(sites) -> list[str]:
    multiple = sites["subject_id"].nunique() > 1
    return [f"{s}:{e}" if multiple else str(e) for s, e in zip(sites["subject_id"], sites["electrode"])]


def plot_overview(analysis):
    """Trials per site and condition; P(high) against step, all sites pooled, stimulated vs sham."""
    plt = pyplot()
    counts = analysis.counts
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [2, 1]})
    index = np.arange(len(analysis.sites))
    left.bar(index, counts.n[:, 0].sum(axis=1), color="0.6", label="sham")
    left.bar(index, counts.n[:, 1].sum(axis=1), bottom=counts.n[:, 0].sum(axis=1), color="C3", label="stimulated")
    left.set_xlabel("site (ordered by subject, electrode)")
    left.set_ylabel("trials")
    if len(index) <= 40:
        left.set_xticks(index, _site_labels(analysis.sites), rotation=90, fontsize=6)
    left.legend(frameon=False, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2)
    # sites with trials in both conditions only, so that the two curves pool the same sites
    both = (counts.n[:, 0].sum(axis=1) > 0) & (counts.n[:, 1].sum(axis=1) > 0)
    with np.errstate(invalid="ignore", divide="ignore"):  # a step without trials in a condition: no point, not 0
        pooled = counts.n_high[both].sum(axis=0) / counts.n[both].sum(axis=0)
    right.plot(counts.steps, pooled[0], "o-", color="0.4", label="sham")
    right.plot(counts.steps, pooled[1], "o-", color="C3", label="stimulated")
    right.set_title(f"pooled over the {int(both.sum())} sites with both conditions" if not both.all()
                    else "pooled over all sites", fontsize=8)
    right.set_xlabel("step (0 = 'low' end)")
    right.set_ylabel("P(choose 'high')")
    right.set_ylim(-0.02, 1.02)
    right.legend(frameon=False)
    fig.tight_layout()
    return fig


def plot_site_effects(analysis):
    """Per-site ΔAUC with bootstrap intervals, sorted; the plan's predicted effect beside it if given."""
    plt = pyplot()
    sites = analysis.sites.sort_values("delta_auc").reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(6, 0.12 * len(sites) + 2), 3.8))
    index = np.arange(len(sites))
    error = np.abs(np.vstack([sites["delta_auc"] - sites["delta_auc_low"], sites["delta_auc_high"] - sites["delta_auc"]]))
    ax.errorbar(index, sites["delta_auc"], yerr=np.nan_to_num(error), fmt="o", ms=3, color="C0", label="observed")
    if analysis.predicted_column is not None:
        ax.plot(index, sites[analysis.predicted_column], "x", color="C1",
                label=f"predicted (plan, {analysis.predicted_label})")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("site (sorted by observed ΔAUC)")
    ax.set_ylabel("ΔAUC (stimulated − sham)")
    if len(sites) <= 40:
        ax.set_xticks(index, _site_labels(sites), rotation=90, fontsize=6)
    ax.legend(frameon=False, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2)
    fig.tight_layout()
    return fig


def top_sites(analysis, n_top: int = 6) -> tuple[np.ndarray, str]:
    """Row indices of the top sites and how they were picked: the plan's largest predicted effect when
    the sites carry predictions (picked before seeing the data), else the largest observed |ΔAUC|."""
    sites, column = analysis.sites, analysis.predicted_column
    if column is not None and np.isfinite(sites[column]).any():
        predicted = sites[column].to_numpy(dtype=float)
        return np.argsort(-np.where(np.isfinite(predicted), predicted, -np.inf), kind="stable")[:n_top], \
            f"the plan's top-ranked sites (largest predicted {analysis.predicted_label})"
    observed = np.abs(np.nan_to_num(sites["delta_auc"].to_numpy(dtype=float)))
    return np.argsort(-observed, kind="stable")[:n_top], "the sites with the largest observed |ΔAUC|"


def plot_top_sites(analysis, n_top: int = 6):
    """P(high) per step, stimulated vs sham, for the top sites (:func:`top_sites`), each point with its binomial
    standard error sqrt(p (1 − p) / n)."""
    plt = pyplot()
    order, _ = top_sites(analysis, n_top)
    columns = min(3, len(order))
    rows = int(np.ceil(len(order) / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.6 * rows), squeeze=False)
    labels = _site_labels(analysis.sites)
    p_high, n = analysis.counts.p_high, analysis.counts.n
    with np.errstate(invalid="ignore", divide="ignore"):
        standard_error = np.sqrt(p_high * (1 - p_high) / n)
    for ax, i in zip(axes.ravel(), order):
        for condition, colour, label in ((0, "0.4", "sham"), (1, "C3", "stimulated")):
            ax.errorbar(analysis.counts.steps, p_high[i, condition], yerr=np.nan_to_num(standard_error[i, condition]),
                        fmt="o-", ms=4, capsize=2, color=colour, label=label)
        observed = analysis.sites["delta_auc"].iloc[i]
        title = f"site {labels[i]}: " + (f"ΔAUC {observed:+.3f}" if np.isfinite(observed) else "no ΔAUC")
        if analysis.predicted_column is not None:
            title += f" (plan {analysis.predicted_label} {analysis.sites[analysis.predicted_column].iloc[i]:+.3f})"
        ax.set_title(title, fontsize=8)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("step")
        ax.set_ylabel("P('high')")
    for ax in axes.ravel()[len(order):]:
        ax.axis("off")
    axes[0, 0].legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


def plot_predicted_vs_observed(analysis):
    """Observed ΔAUC against the plan's predicted effect per site (vertical bars: the observed bootstrap interval;
    horizontal bars: the plan's prediction interval where the plan gives one), with the identity line and
    the fitted slope. Each axis spans its own data, so a narrow range of predictions stays readable."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    sites = analysis.sites
    fig, ax = plt.subplots(figsize=(5.0, 4.4))
    column = analysis.predicted_column
    predicted = sites[column].to_numpy(dtype=float)
    yerr = np.abs(np.vstack([sites["delta_auc"] - sites["delta_auc_low"], sites["delta_auc_high"] - sites["delta_auc"]]))
    xerr = None
    x_values = [predicted]
    if {f"{column}_low", f"{column}_high"} <= set(sites.columns):
        xerr = np.nan_to_num(np.abs(np.vstack([predicted - sites[f"{column}_low"],
                                               sites[f"{column}_high"] - predicted])))
        x_values += [sites[f"{column}_low"].to_numpy(dtype=float), sites[f"{column}_high"].to_numpy(dtype=float)]
    ax.errorbar(predicted, sites["delta_auc"], yerr=np.nan_to_num(yerr), xerr=xerr, fmt="o", ms=4, color="C0",
                ecolor="0.6", elinewidth=0.8, alpha=0.9)
    x_low, x_high = _padded_range(np.concatenate(x_values))
    y_low, y_high = _padded_range(np.concatenate([sites["delta_auc_low"], sites["delta_auc_high"],
                                                  sites["delta_auc"]]).astype(float))
    both = np.array([min(x_low, y_low), max(x_high, y_high)])
    ax.plot(both, both, "k--", lw=1, label="identity")
    summary = analysis.summary
    if summary.get("slope") is not None and np.isfinite(summary.get("slope", np.nan)):
        ax.plot(both, summary["intercept"] + summary["slope"] * both, color="C1",
                label=f"fit: slope {summary['slope']:.2f}")
    ax.set_xlim(x_low, x_high)
    ax.set_ylim(y_low, y_high)
    ax.xaxis.set_major_locator(MaxNLocator(5))  # the predictions' narrow range has long tick labels
    ax.set_xlabel(f"predicted {analysis.predicted_label} (plan)")
    ax.set_ylabel("observed ΔAUC")
    r, p = (summary.get(key) for key in ("predicted_vs_observed_r", "permutation_p"))
    defined = all(isinstance(value, (int, float)) and np.isfinite(value) for value in (r, p))
    ax.set_title(f"r = {r:.2f}, permutation p = {p:.3g}" if defined else "r undefined (see the notes)", fontsize=9)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


def _padded_range(values, fraction: float = 0.08) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if not values.size:
        return -1.0, 1.0
    low, high = float(values.min()), float(values.max())
    pad = fraction * (high - low) if high > low else max(abs(high), 1e-3) * 0.5
    return low - pad, high + pad


def plot_power_curve(table, target_power: float, alpha: float | None = None):
    """Power against trials per site: the across-site Wilcoxon test (with its interval when the table has it) and the
    mean per-site power; with
    the mean observed-vs-true ΔAUC r across sites when the table has it; given ``alpha``, the chance levels of
    the two tests (α across sites, one-sided; α/2 per site, counted in the planned direction)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    if "wilcoxon_power_ci95_low" in table:  # a simulated proportion of sessions: its 95 % interval
        ax.errorbar(table["trials_per_site"], table["wilcoxon_power"], fmt="o-", capsize=2,
                    yerr=[table["wilcoxon_power"] - table["wilcoxon_power_ci95_low"],
                          table["wilcoxon_power_ci95_high"] - table["wilcoxon_power"]],
                    label="power across sites (Wilcoxon; 95 % interval of the simulated sessions)")
    else:
        ax.plot(table["trials_per_site"], table["wilcoxon_power"], "o-", label="power across sites (Wilcoxon)")
    ax.plot(table["trials_per_site"], table["mean_site_power"], "s-", label="power per site (mean over sites)")
    if "observed_vs_true_r" in table:
        ax.plot(table["trials_per_site"], table["observed_vs_true_r"], "^:", color="C2",
                label="observed vs true ΔAUC r (mean)")
    ax.axhline(target_power, color="k", ls="--", lw=1, label=f"target power {target_power:g}")
    if alpha is not None:
        ax.axhline(alpha, color="C0", ls=":", lw=1, label=f"chance across sites ({alpha:g})")
        ax.axhline(alpha / 2, color="C1", ls=":", lw=1, label=f"chance per site ({alpha / 2:g}); r: 0")
    ax.set_xscale("log", base=2)
    ax.set_xticks(table["trials_per_site"], [str(v) for v in table["trials_per_site"]])
    ax.minorticks_off()
    ax.set_xlabel("trials per site (stimulated + sham)")
    ax.set_ylabel("power / r")
    r = np.asarray(table.get("observed_vs_true_r", []), dtype=float)
    ax.set_ylim(min([0.0, *r[np.isfinite(r)]]) - 0.02, 1.02)  # no r at any count (too few trials): from 0
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig
