"""Moeller, Crapse, Chang & Tsao 2017 — face-patch microstimulation and face identity.

Moeller, S., Crapse, T., Chang, L. & Tsao, D. Y. (2017). The effect of face patch microstimulation
on perception of faces and objects. Nature Neuroscience 20, 743-752. doi:10.1038/nn.4527

Data: the authors' summary table of hits and misses of "same" and "different" trials without and
with stimulation (``_MSC`` columns), inside and outside the face patches, per stimulus class and
monkey (manifest entry ``moeller2017``, which also holds their images). The table's column
``Current_Pulse_mA`` holds the current in µA; it is read as ``current_uA``. The comparison needs a
same/different experiment with ``face_patch`` sites and pair groups among the table's classes.

Benchmark (:func:`score`): "hit-drop agreement", 1 − the mean absolute difference between the model's hit drop
and the monkeys' (hit rate without − with stimulation) over the cells the table has trials for: location (inside,
outside the face patch) × pair group × trial type (same, different); objects outside the patches have none. The
paper's result is this pattern of drops (a large "same" drop for faces inside the patches, small ones outside
and for objects), so the metric weighs every cell alike. The ceiling is the agreement that the monkeys'
experiment reaches with itself: the table's hits in every cell redrawn from binomials with its trial counts at
its rates (:data:`CEILING_REPLICATES` replicates, seeded by the experiment's ``seed``), the mean agreement of a
replicate with the table, and the central interval of the replicates (``[analysis] ci``). Chance is the
agreement of a model whose stimulation changes nothing (every drop 0): 1 − the mean absolute drop of the table.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import xarray as xr

from stimsim.data.manifest import entry_path
from stimsim.datasets.base import PublishedDataset, read_csv, register_dataset
from stimsim.utilities.errors import ConfigError, FileFormatError

CITATION = "Moeller, Crapse, Chang & Tsao 2017, Nat Neurosci 20:743"
MANIFEST_ENTRY = "moeller2017"
SUMMARY_FILE = "summary_hits_misses.csv"
#: Stimulus classes of the summary table, by the category names of stimsim's Moeller stimulus set.
CLASSES = {"face": "Faces", "object": "Objects"}
#: Locations of the summary table, by site group of the ``face_patch`` site method.
LOCATIONS = {"inside": "within_facepatch", "outside": "outside_facepatch"}
TRIAL_TYPES = ("same", "different")
_COUNT_COLUMNS = {
    ("same", "off"): ("Hit_Same", "Miss_Same"),
    ("different", "off"): ("Hit_Different", "Miss_Different"),
    ("same", "on"): ("Hit_Same_MSC", "Miss_Same_MSC"),
    ("different", "on"): ("Hit_Different_MSC", "Miss_Different_MSC"),
}
# Methods (paraphrased): 300 µA, 150 Hz, 0.2 ms phases, 200 ms trains, delivered while the second image
# of the pair was on the screen, inside face patches (AM, ML, AL, MF, AF) and outside them. The table
# holds only these 300 µA sessions; the loader checks it.
#: Current of every row of the summary table (µA).
CURRENT_UA = 300.0
#: The benchmark's metric (see the module docstring).
METRIC = "hit-drop agreement"
METRIC_DESCRIPTION = ("1 − mean |model hit drop − monkeys' hit drop| over the published cells (location × pair "
                      "group × same/different); ceiling: the agreement of binomial replicates of the table with "
                      "it, chance: a model whose stimulation changes nothing (every drop 0)")
#: Binomial replicates of the table averaged for the ceiling.
CEILING_REPLICATES = 1000


def load(groups, mirror=None) -> xr.Dataset:
    """Hits and misses pooled over monkeys, as ``data_hits`` and ``data_misses`` with dims
    (data_location ["inside", "outside"], pair_group, trial_type ["same", "different"],
    stimulation ["off", "on"]); ``data_hit_rate`` = hits / (hits + misses), NaN where the table has
    no trials (e.g. objects outside the face patches). ``groups`` are category names of
    :data:`CLASSES`. Only the 300 µA rows exist in the table; they are checked."""
    unknown = [g for g in groups if g not in CLASSES]
    if unknown:
        raise ValueError(f"groups {unknown} have no counterpart in the Moeller et al. 2017 table; known: "
                         f"{sorted(CLASSES)}")
    path = entry_path(MANIFEST_ENTRY, SUMMARY_FILE, mirror=mirror)
    columns = [c for pair in _COUNT_COLUMNS.values() for c in pair]
    table = read_csv(path, tuple(columns) + ("Stimulus_Class", "Perturbation_Location", "Current_Pulse_mA",
                                             "Monkey"))
    locations, groups = list(LOCATIONS), list(groups)
    shape = (len(locations), len(groups), len(TRIAL_TYPES), 2)
    hits, misses = np.zeros(shape), np.zeros(shape)
    currents_uA, monkeys = set(), {}
    for row_number, row in enumerate(table.to_dict("records"), start=2):
        klass, location = row["Stimulus_Class"], row["Perturbation_Location"]
        group = next((g for g in groups if CLASSES[g] == klass), None)
        where = next((i for i, loc in enumerate(locations) if LOCATIONS[loc] == location), None)
        if group is None or where is None:
            continue
        try:
            counts = {column: int(row[column]) for column in columns}
            currents_uA.add(float(row["Current_Pulse_mA"]))
        except ValueError as exc:
            raise FileFormatError(path, f"line {row_number}: non-integer count ({exc})") from None
        monkeys.setdefault((group, location), set()).add(row["Monkey"])
        g = groups.index(group)
        for (trial, stimulation), (hit_column, miss_column) in _COUNT_COLUMNS.items():
            t, s = TRIAL_TYPES.index(trial), ("off", "on").index(stimulation)
            hits[where, g, t, s] += counts[hit_column]
            misses[where, g, t, s] += counts[miss_column]
    if currents_uA - {CURRENT_UA}:
        raise FileFormatError(path, f"expected the 300 µA rows of Moeller et al. 2017, found currents "
                                    f"{sorted(currents_uA)} µA (column Current_Pulse_mA, which holds µA)")
    trials = hits + misses
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(trials > 0, hits / np.where(trials > 0, trials, 1), np.nan)
    dims = ("data_location", "pair_group", "trial_type", "stimulation")
    return xr.Dataset(
        {"data_hits": (dims, hits), "data_misses": (dims, misses), "data_hit_rate": (dims, rate)},
        coords={"data_location": locations, "pair_group": groups, "trial_type": list(TRIAL_TYPES),
                "stimulation": ["off", "on"]},
        attrs={"data_source": f"{MANIFEST_ENTRY}/{SUMMARY_FILE}",
               "data_citation": f"{CITATION} (authors' summary table)",
               "data_current_uA": CURRENT_UA, "data_pooling": "hits and misses summed over monkeys",
               "data_monkeys": "; ".join(f"{g} {LOCATIONS.get(loc, loc)}: {sorted(m)}"
                                         for (g, loc), m in sorted(monkeys.items()))},
    )


def compare(groups, prefix_of, mirror=None) -> tuple[xr.Dataset, dict]:
    """The published counts and the data side of the summary: for every group, trial type and
    location, ``data_<prefix><trial>_hit_drop_<location>`` = hit rate without minus with stimulation,
    and the two rates (``..._hit_rate_<location>_off`` / ``_on``). ``prefix_of(group)`` gives the
    key prefix ("" for the headline group)."""
    data = load(groups, mirror=mirror)
    summary = {}
    rate = data["data_hit_rate"]
    for group in data["pair_group"].values:
        for trial in TRIAL_TYPES:
            for location in data["data_location"].values:
                off = float(rate.sel(data_location=location, pair_group=group, trial_type=trial, stimulation="off"))
                on = float(rate.sel(data_location=location, pair_group=group, trial_type=trial, stimulation="on"))
                key = f"data_{prefix_of(str(group))}{trial}_hit"
                summary[f"{key}_rate_{location}_off"] = _finite_or_none(off)
                summary[f"{key}_rate_{location}_on"] = _finite_or_none(on)
                summary[f"{key}_drop_{location}"] = _finite_or_none(off - on)
    return data, summary


def score(summary: dict, data: xr.Dataset | None, prefix_of, seed: int, ci: float = 0.95,
          n_replicates: int = CEILING_REPLICATES) -> dict:
    """The values of the benchmark (arguments of :meth:`PublishedDataset.score_record`): ``score`` from the
    model's ``model_<prefix><trial>_hit_drop_<location>`` keys of ``summary`` against the table's drops in
    ``data`` (from :func:`load`; None when not available), ``ceiling`` and ``ceiling_ci`` from
    ``n_replicates`` binomial replicates of the table drawn with ``seed``, ``chance`` and ``reasons``."""
    if data is None:
        reason = "the published counts are not available here" + (
            f" ({summary['comparison_skipped']})" if "comparison_skipped" in summary else "")
        return {"score": None, "ceiling": None, "chance": None, "reasons": [reason]}
    dims = ("data_location", "pair_group", "trial_type", "stimulation")
    cells = list(itertools.product(*(data[dim].values.astype(str).tolist() for dim in dims[:3])))
    hits = data["data_hits"].transpose(*dims).sel(stimulation=["off", "on"]).values.reshape(len(cells), 2)
    counts = hits + data["data_misses"].transpose(*dims).sel(stimulation=["off", "on"]).values.reshape(len(cells), 2)
    published = np.all(counts > 0, axis=1)  # cells with trials without and with stimulation
    cells, hits, counts = [c for c, keep in zip(cells, published) if keep], hits[published], counts[published]
    rates = hits / counts
    data_drop = rates[:, 0] - rates[:, 1]
    chance = 1.0 - float(np.mean(np.abs(data_drop)))

    rng = np.random.default_rng(seed)
    replicate = rng.binomial(counts.astype(np.int64), rates, size=(n_replicates, *counts.shape)) / counts
    agreement = 1.0 - np.mean(np.abs(replicate[..., 0] - replicate[..., 1] - data_drop), axis=1)
    ceiling = float(agreement.mean())
    ceiling_ci = np.quantile(agreement, [(1 - ci) / 2, (1 + ci) / 2])

    keys = [f"model_{prefix_of(group)}{trial}_hit_drop_{location}" for location, group, trial in cells]
    missing = [key for key in keys if summary.get(key) is None or not math.isfinite(summary[key])]
    if missing:
        return {"score": None, "ceiling": ceiling, "ceiling_ci": ceiling_ci, "chance": chance,
                "reasons": [f"the model has no hit drop for the published cell(s) {missing}"]}
    model_drop = np.array([summary[key] for key in keys], dtype=np.float64)
    return {"score": 1.0 - float(np.mean(np.abs(model_drop - data_drop))), "ceiling": ceiling,
            "ceiling_ci": ceiling_ci, "chance": chance, "reasons": []}


def _finite_or_none(value: float):
    return float(value) if math.isfinite(value) else None


@register_dataset("moeller2017")
class Moeller2017(PublishedDataset):
    """"Same" and "different" hit rates with and without stimulation, inside and outside face patches."""

    paradigm = "same_different"
    citation = CITATION
    manifest_entry = MANIFEST_ENTRY
    metric = METRIC
    metric_description = METRIC_DESCRIPTION
    headline_keys = ("model_same_hit_drop_inside", "model_same_hit_drop_outside", "model_object_same_hit_drop_inside",
                     "data_same_hit_drop_inside", "data_same_hit_drop_outside", "data_object_same_hit_drop_inside")

    def check(self, task) -> None:
        if task.sites.method != "face_patch":
            raise ConfigError("the moeller2017 comparison needs sites inside and outside the face patch: use "
                              "[sites] method = \"face_patch\"")
        groups = task.options.groups
        if groups is None or not set(groups) <= set(CLASSES):
            raise ConfigError(f"the moeller2017 comparison needs [pairs] groups drawn from {sorted(CLASSES)} (the "
                              f"stimulus classes of the published table), got "
                              f"{None if groups is None else list(groups)}")

    def compare(self, task, trials, mirror=None):
        return compare(list(trials.groups), trials.summary_prefix, mirror=mirror)

    def figure(self, task, results, data, summary, out_dir) -> None:
        from stimsim.paradigms.same_different import plot_hit_rates

        plot_hit_rates(results, out_dir / "moeller2017_comparison.png", f"{task.name}: same/different hit rates",
                       data=data, data_label="monkeys (Moeller et al. 2017)")

    def score(self, task, trials, summary, data):
        return self.score_record(**score(summary, data, trials.summary_prefix, task.seed, task.analysis.ci))
