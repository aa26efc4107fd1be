"""Model against published data: the per-site results of Afraz et al. 2006 and the hit/miss counts
of Moeller et al. 2017, read through the data manifest, and the statistics that set them side by side.

* Afraz, Kiani & Esteky 2006 (Nature 442:692): 86 IT sites, each with the face selectivity d′ of its
  multi-unit response and the psychometric shift (% signal, positive = towards "face") caused by
  stimulation (manifest entry ``afraz2006``, digitised from the paper's figure).
* Moeller, Crapse, Chang & Tsao 2017 (Nat Neurosci 20:743): hits and misses of "same" and
  "different" trials without and with 300 µA stimulation (``_MSC`` columns), inside and outside the
  face patches, per stimulus class and monkey (manifest entry ``moeller2017``). The table's column
  ``Current_Pulse_mA`` holds the current in µA; it is read as ``current_uA``.
"""
from __future__ import annotations

import csv
import math

import numpy as np
import xarray as xr

from stimsim.behavior.metrics import bootstrap_ci, pearson_with_permutation
from stimsim.data.manifest import entry_path
from stimsim.errors import FileFormatError
from stimsim.figures import pyplot, save_figure

AFRAZ2006_ENTRY = "afraz2006"
AFRAZ2006_FILE = "sites_stim100-150ms.csv"
#: "Face-selective" sites in Afraz et al. 2006 and DESIGN.md §4: multi-unit d′ > 1.
AFRAZ2006_SELECTIVE_DPRIME = 1.0

MOELLER2017_ENTRY = "moeller2017"
MOELLER2017_FILE = "summary_hits_misses.csv"
#: Stimulus classes of the summary table, by the category names of stimsim's Moeller stimulus set.
MOELLER2017_CLASSES = {"face": "Faces", "object": "Objects"}
#: Locations of the summary table, by site group of the ``face_patch`` site method.
MOELLER2017_LOCATIONS = {"inside": "within_facepatch", "outside": "outside_facepatch"}
TRIAL_TYPES = ("same", "different")
_MOELLER_COUNT_COLUMNS = {
    ("same", "off"): ("Hit_Same", "Miss_Same"),
    ("different", "off"): ("Hit_Different", "Miss_Different"),
    ("same", "on"): ("Hit_Same_MSC", "Miss_Same_MSC"),
    ("different", "on"): ("Hit_Different_MSC", "Miss_Different_MSC"),
}


# --- statistics shared by model and data -------------------------------------------------------
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


# --- Afraz et al. 2006 -------------------------------------------------------------------------
def load_afraz2006(mirror=None) -> xr.Dataset:
    """The 86 published sites: ``face_selectivity`` (d′) and ``psychometric_shift_percent`` on a
    ``data_site`` dimension, read through the verified ``afraz2006`` manifest entry."""
    path = entry_path(AFRAZ2006_ENTRY, AFRAZ2006_FILE, mirror=mirror)
    rows = _read_csv(path, ("face_selectivity", "psychometric_shift"))
    try:
        selectivity = np.array([float(row["face_selectivity"]) for row in rows])
        shift = np.array([float(row["psychometric_shift"]) for row in rows])
    except ValueError as exc:
        raise FileFormatError(path, f"non-numeric value ({exc})") from None
    if not (np.all(np.isfinite(selectivity)) and np.all(np.isfinite(shift))):
        raise FileFormatError(path, "values must be finite numbers")
    return xr.Dataset(
        {"data_face_selectivity": ("data_site", selectivity),
         "data_psychometric_shift_percent": ("data_site", shift)},
        coords={"data_site": np.arange(len(rows))},
        attrs={"data_source": f"{AFRAZ2006_ENTRY}/{AFRAZ2006_FILE}",
               "data_citation": "Afraz, Kiani & Esteky 2006, Nature 442:692 (digitised)"},
    )


def compare_afraz2006(n_perm: int, n_boot: int, ci: float, seed: int, mirror=None) -> tuple[xr.Dataset, dict]:
    """The published sites and the data side of the summary (``data_r``, ``data_p``,
    ``data_mean_shift_selective``, ...), computed as for the model; "selective" = d′ >
    :data:`AFRAZ2006_SELECTIVE_DPRIME`."""
    data = load_afraz2006(mirror)
    summary = shift_summary("data", data["data_face_selectivity"].values,
                            data["data_psychometric_shift_percent"].values, AFRAZ2006_SELECTIVE_DPRIME, n_perm,
                            n_boot, ci, seed)
    return data, summary


def plot_afraz2006(model_dprime, model_shift, data: xr.Dataset, summary: dict, path,
                   model_threshold: float) -> None:
    """Psychometric shift against site d′, model beside monkeys, with the same axis labels; dashed
    lines mark each side's selectivity threshold. PNG at ``path``."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 4.0))
    panels = (("model", "model", np.asarray(model_dprime), np.asarray(model_shift), model_threshold, "tab:blue"),
              ("data", "monkeys (Afraz et al. 2006)", data["data_face_selectivity"].values,
               data["data_psychometric_shift_percent"].values, AFRAZ2006_SELECTIVE_DPRIME, "tab:red"))
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


# --- Moeller et al. 2017 -----------------------------------------------------------------------
def load_moeller2017(groups, mirror=None) -> xr.Dataset:
    """Hits and misses pooled over monkeys, as ``data_hits`` and ``data_misses`` with dims
    (data_location ["inside", "outside"], pair_group, trial_type ["same", "different"],
    stimulation ["off", "on"]); ``data_hit_rate`` = hits / (hits + misses), NaN where the table has
    no trials (e.g. objects outside the face patches). ``groups`` are category names of
    :data:`MOELLER2017_CLASSES`. Only the 300 µA rows exist in the table; they are checked."""
    unknown = [g for g in groups if g not in MOELLER2017_CLASSES]
    if unknown:
        raise ValueError(f"groups {unknown} have no counterpart in the Moeller et al. 2017 table; known: "
                         f"{sorted(MOELLER2017_CLASSES)}")
    path = entry_path(MOELLER2017_ENTRY, MOELLER2017_FILE, mirror=mirror)
    columns = [c for pair in _MOELLER_COUNT_COLUMNS.values() for c in pair]
    rows = _read_csv(path, tuple(columns) + ("Stimulus_Class", "Perturbation_Location", "Current_Pulse_mA",
                                             "Monkey"))
    locations, groups = list(MOELLER2017_LOCATIONS), list(groups)
    shape = (len(locations), len(groups), len(TRIAL_TYPES), 2)
    hits, misses = np.zeros(shape), np.zeros(shape)
    currents_uA, monkeys = set(), {}
    for row_number, row in enumerate(rows, start=2):
        klass, location = row["Stimulus_Class"].strip(), row["Perturbation_Location"].strip()
        group = next((g for g in groups if MOELLER2017_CLASSES[g] == klass), None)
        where = next((i for i, loc in enumerate(locations) if MOELLER2017_LOCATIONS[loc] == location), None)
        if group is None or where is None:
            continue
        try:
            counts = {column: int(row[column]) for column in columns}
            currents_uA.add(float(row["Current_Pulse_mA"]))
        except ValueError as exc:
            raise FileFormatError(path, f"line {row_number}: non-integer count ({exc})") from None
        monkeys.setdefault((group, location), set()).add(row["Monkey"].strip())
        g = groups.index(group)
        for (trial, stimulation), (hit_column, miss_column) in _MOELLER_COUNT_COLUMNS.items():
            t, s = TRIAL_TYPES.index(trial), ("off", "on").index(stimulation)
            hits[where, g, t, s] += counts[hit_column]
            misses[where, g, t, s] += counts[miss_column]
    if currents_uA - {300.0}:
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
        attrs={"data_source": f"{MOELLER2017_ENTRY}/{MOELLER2017_FILE}",
               "data_citation": "Moeller, Crapse, Chang & Tsao 2017, Nat Neurosci 20:743 (authors' summary table)",
               "data_current_uA": 300.0, "data_pooling": "hits and misses summed over monkeys",
               "data_monkeys": "; ".join(f"{g} {MOELLER2017_LOCATIONS.get(loc, loc)}: {sorted(m)}"
                                         for (g, loc), m in sorted(monkeys.items()))},
    )


def compare_moeller2017(groups, prefix_of, mirror=None) -> tuple[xr.Dataset, dict]:
    """The published counts and the data side of the summary: for every group, trial type and
    location, ``data_<prefix><trial>_hit_drop_<location>`` = hit rate without minus with stimulation,
    and the two rates (``..._hit_rate_<location>_off`` / ``_on``). ``prefix_of(group)`` gives the
    key prefix ("" for the headline group)."""
    data = load_moeller2017(groups)
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


def _finite_or_none(value: float):
    return float(value) if math.isfinite(value) else None


# --- files and figures -------------------------------------------------------------------------
def _read_csv(path, required: tuple[str, ...]) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle, skipinitialspace=True)
        columns = [c.strip() for c in reader.fieldnames or []]
        rows = [{key.strip(): (value or "").strip() for key, value in row.items() if key is not None}
                for row in reader]
    missing = [c for c in required if c not in columns]
    if missing:
        raise FileFormatError(path, f"missing column(s) {missing}; found {columns}")
    if not rows:
        raise FileFormatError(path, "the table has no rows")
    return rows


