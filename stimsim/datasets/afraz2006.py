"""Afraz, Kiani & Esteky 2006 — microstimulation of IT biases face categorisation.

Afraz, S.-R., Kiani, R. & Esteky, H. (2006). Microstimulation of inferotemporal cortex influences
face categorization. Nature 442, 692-695. doi:10.1038/nature04982

Data: the 86 stimulated IT sites, each with the face selectivity d′ of its multi-unit response and
the psychometric shift (% visual signal, positive = towards "face") caused by stimulation, digitised
from the paper's figure (manifest entry ``afraz2006``). The comparison needs a categorisation
experiment with a positive class and noise levels (a psychometric shift per site) and sets the
model's shift-against-d′ relation beside the animals'.

Benchmark (:func:`score`): the metric is that relation itself, the Pearson r between a site's face d′ and its
psychometric shift, the measure the paper reports for its sites. The model's score is its r over its sites
(``model_r``); the ceiling is the monkeys' r over the 86 published sites (``data_r``, with its bootstrap
interval over sites, ``data_r_ci``): a model that ties shifts to selectivity as tightly as the animals did
reaches it, and a tighter one goes above it (normalized > 1, reported as it is). Chance is r = 0, the expected r
of shifts that do not depend on selectivity; normalized = model_r / data_r.
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from stimsim.behavior.metrics import shift_summary
from stimsim.data.manifest import entry_path
from stimsim.datasets.base import PublishedDataset, read_csv, register_dataset
from stimsim.utilities.errors import ConfigError, FileFormatError
from stimsim.utilities.figures import pyplot, save_figure

CITATION = "Afraz, Kiani & Esteky 2006, Nature 442:692"
MANIFEST_ENTRY = "afraz2006"
#: The per-site table of the manifest entry (stimulation 100-150 ms after image onset).
SITES_FILE = "sites_stim100-150ms.csv"

# Methods (paraphrased): sites were called face-selective when the face selectivity index d′ of their
# multi-unit activity exceeded 1; 31 of the 86 stimulated sites were.
#: "Face-selective" sites: multi-unit d′ > 1.
SELECTIVE_DPRIME = 1.0
# Methods (paraphrased): biphasic pulses, 50 µA, 200 Hz, 0.2 ms per phase, 50 ms trains; face / non-face
# categorisation of images whose visual signal was degraded by replacing a fraction of the pixels with
# noise. These are the values experiments/afraz2006.toml sets; they are not checked here, since a lab
# may rerun the comparison with another protocol on purpose.
#: Stimulation protocol of the paper (for reference and documentation).
PROTOCOL = {"current_uA": 50.0, "frequency_Hz": 200.0, "pulse_width_ms": 0.2, "train_ms": 50.0}
#: The benchmark's metric (see the module docstring).
METRIC = "shift-selectivity correlation"
METRIC_DESCRIPTION = ("Pearson r of site face d′ against psychometric shift; score: the model's r (model_r), "
                      "ceiling: the monkeys' r on the 86 published sites (data_r), chance: 0 (shifts that do "
                      "not depend on selectivity)")
#: The expected r of psychometric shifts that do not depend on the site's selectivity.
CHANCE_R = 0.0


def load(mirror=None) -> xr.Dataset:
    """The 86 published sites: ``data_face_selectivity`` (d′) and ``data_psychometric_shift_percent``
    on a ``data_site`` dimension, read through the verified ``afraz2006`` manifest entry."""
    path = entry_path(MANIFEST_ENTRY, SITES_FILE, mirror=mirror)
    table = read_csv(path, ("face_selectivity", "psychometric_shift"))
    try:
        selectivity = np.array([float(v) for v in table["face_selectivity"]])
        shift = np.array([float(v) for v in table["psychometric_shift"]])
    except ValueError as exc:
        raise FileFormatError(path, f"non-numeric value ({exc})") from None
    if not (np.all(np.isfinite(selectivity)) and np.all(np.isfinite(shift))):
        raise FileFormatError(path, "values must be finite numbers")
    return xr.Dataset(
        {"data_face_selectivity": ("data_site", selectivity),
         "data_psychometric_shift_percent": ("data_site", shift)},
        coords={"data_site": np.arange(len(table))},
        attrs={"data_source": f"{MANIFEST_ENTRY}/{SITES_FILE}", "data_citation": f"{CITATION} (digitised)"},
    )


def compare(n_perm: int, n_boot: int, ci: float, seed: int, mirror=None) -> tuple[xr.Dataset, dict]:
    """The published sites and the data side of the summary (``data_r``, ``data_p``,
    ``data_mean_shift_selective``, ...), computed as for the model; "selective" = d′ >
    :data:`SELECTIVE_DPRIME`."""
    data = load(mirror)
    summary = shift_summary("data", data["data_face_selectivity"].values,
                            data["data_psychometric_shift_percent"].values, SELECTIVE_DPRIME, n_perm, n_boot, ci,
                            seed)
    return data, summary


def score(summary: dict) -> dict:
    """The values of the benchmark from a run's summary: ``score`` = ``model_r`` (``score_ci`` its
    bootstrap interval), ``ceiling`` = ``data_r`` (``ceiling_ci``), ``chance`` = :data:`CHANCE_R` and the
    ``reasons`` for any that is undefined (arguments of :meth:`PublishedDataset.score_record`)."""
    reasons = []
    if summary.get("model_r") is None:
        reasons.append(f"model_r is undefined: fewer than 3 of the model's sites have a psychometric shift, or "
                       f"their d′ or their shifts do not vary ({summary.get('model_n_sites')} usable sites)")
    if summary.get("data_r") is None:
        reasons.append("data_r is unavailable: the published sites were not compared"
                       + (f" ({summary['comparison_skipped']})" if "comparison_skipped" in summary else ""))
    return {"score": summary.get("model_r"), "score_ci": summary.get("model_r_ci"),
            "ceiling": summary.get("data_r"), "ceiling_ci": summary.get("data_r_ci"), "chance": CHANCE_R,
            "reasons": reasons}


def plot(model_dprime, model_shift, data: xr.Dataset, summary: dict, path, model_threshold: float) -> None:
    """Psychometric shift against site d′, model beside monkeys, with the same axis labels and one shift axis (so
    the sizes of the shifts compare at a glance); dashed lines mark each side's selectivity threshold. PNG at
    ``path``."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 4.0), sharey=True)
    panels = (("model", "model", np.asarray(model_dprime), np.asarray(model_shift), model_threshold, "tab:blue"),
              ("data", "monkeys (Afraz et al. 2006)", data["data_face_selectivity"].values,
               data["data_psychometric_shift_percent"].values, SELECTIVE_DPRIME, "tab:red"))
    for ax, (prefix, who, x, y, threshold, colour) in zip(axes, panels):
        usable = np.isfinite(x) & np.isfinite(y)
        ax.scatter(x[usable], y[usable], s=16, color=colour, alpha=0.8, linewidths=0)
        if usable.sum() >= 2 and np.ptp(x[usable]) > 0:
            slope, intercept = np.polyfit(x[usable], y[usable], 1)
            xs = np.linspace(x[usable].min(), x[usable].max(), 2)
            ax.plot(xs, intercept + slope * xs, color="k", lw=1)
        ax.axhline(0, color="grey", lw=0.6, ls=":")
        ax.axvline(threshold, color="grey", lw=0.6, ls="--")
        r, p = summary.get(f"{prefix}_r"), summary.get(f"{prefix}_p")
        stats = "r not defined" if r is None else f"r = {r:.2f}, p = {p:.2g}"
        ax.set(xlabel="site face selectivity d′", ylabel="psychometric shift (% signal)",
               title=f"{who}\n{int(usable.sum())} sites, {stats}")
    fig.tight_layout()
    save_figure(fig, path)


@register_dataset("afraz2006")
class Afraz2006(PublishedDataset):
    """Per-site psychometric shift against face selectivity (categorisation with noise)."""

    paradigm = "categorization"
    citation = CITATION
    manifest_entry = MANIFEST_ENTRY
    metric = METRIC
    metric_description = METRIC_DESCRIPTION
    headline_keys = ("model_r", "model_p", "model_mean_shift_selective", "model_mean_shift_other", "data_r",
                     "data_mean_shift_selective", "data_mean_shift_other")

    def check(self, task) -> None:
        if task.options.positive is None or task.options.signal_percent is None:
            raise ConfigError("the afraz2006 comparison needs psychometric shifts: give [stimuli] positive and "
                              "[stimuli.noise] signal_percent")

    def compare(self, task, trials, mirror=None):
        analysis = task.analysis
        return compare(analysis.n_perm, analysis.n_boot, analysis.ci, task.seed, mirror=mirror)

    def figure(self, task, results, data, summary, out_dir) -> None:
        plot(results["site_dprime"].values, results["psychometric_shift_percent"].values, data, summary,
             out_dir / "afraz2006_comparison.png", task.sites.dprime_threshold)

    def score(self, task, trials, summary, data):
        return self.score_record(**score(summary))
