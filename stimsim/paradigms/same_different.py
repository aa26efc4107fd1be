"""Same/different identity paradigm (Moeller, Crapse, Chang & Tsao 2017, Nat Neurosci 20:743).

Two images are shown one after the other; the subject reports whether they show the same identity.
A "same" pair shows one identity in two different images (another expression, another view); a
"different" pair shows two identities. Pairs are drawn within one group of images (faces with faces,
objects with objects).

Stimulation acts while one image of the pair is seen (``stimulated_image``: the second by default,
as the perturbation then changes the activity that is compared with the remembered first image);
the other image is represented without perturbation. The decoder
(:class:`~stimsim.behavior.SameDifferentDecoder`, on ``|f_a − f_b|`` of the readout layer) is fitted on
unperturbed pairs and frozen. Its representation is symmetric in the two images, so stimulating the
first image is simulated by perturbing it and comparing with the unperturbed second.

Hit rate of a trial type = mean probability of the correct report ("same" on same pairs, "different"
on different pairs) over the test pairs; a drop = control hit rate − stimulated hit rate.

``[stimuli]`` takes only ``sets``. ``[pairs]`` (required): ``identity_label`` (default
``"identity"``), ``group_label`` (default ``"category"``: pairs are drawn within one group, e.g. faces
with faces), ``groups`` (default: every value of the group label), ``n_same_per_group``,
``n_different_per_group`` (ordered pairs drawn per group; "same" = same identity, different image;
"different" = different identities), ``stimulated_image`` (``"second"``, default, or ``"first"``: the
image of each pair seen during stimulation; the other image is seen without it). ``[decoder]
fit_fraction`` is a share of pairs, stratified by group and trial type. ``[sites.localizer]`` is
required.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import xarray as xr
from pydantic import Field

from stimsim.behavior import (SAME_DIFFERENT_CHOICES, BoundSameDifferentDecoder, SameDifferentDecoder, bootstrap_ci,
                              stratified_fit_mask)
from stimsim.data.stimuli import StimulusSet
from stimsim.engine.activation_cache import cached_activations
from stimsim.paradigms.base import Paradigm, register_paradigm
from stimsim.paradigms.sites import CONTROL_LABEL, SiteSelection
from stimsim.paradigms.spec import TaskSettings
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.figures import pyplot, save_figure
from stimsim.utilities.filemodels import FileModel, Text

TRIAL_TYPES = ("same", "different")
STIMULATED_IMAGES = ("second", "first")


class PairsSpec(FileModel):
    """``[pairs]``: how same/different pairs are drawn (see the module docstring)."""

    identity_label: Text = "identity"
    group_label: Text = "category"
    groups: Annotated[list[Text], Field(min_length=1)] | None = None
    n_same_per_group: Annotated[int, Field(ge=2)]
    n_different_per_group: Annotated[int, Field(ge=2)]
    stimulated_image: Literal[STIMULATED_IMAGES] = "second"


@dataclass(frozen=True, eq=False)
class PairTrials:
    """Pairs of a same/different experiment and the frozen decoder bound to the test pairs.

    first, second : (P,) indices into ``stimuli`` of each pair's images.
    group : (P,) group name; same : (P,) bool; is_fit : (P,) bool (fitting pair or test pair).
    """

    stimuli: StimulusSet
    first: np.ndarray
    second: np.ndarray
    group: np.ndarray
    same: np.ndarray
    is_fit: np.ndarray
    stimulated_image: str
    pair_decoder: SameDifferentDecoder
    decoder: BoundSameDifferentDecoder
    groups: tuple[str, ...]
    headline_group: str

    @property
    def frozen_decoder(self) -> SameDifferentDecoder:
        return self.pair_decoder

    def summary_prefix(self, group: str) -> str:
        """Summary-key prefix of a pair group: none for the headline group, ``"<group>_"`` otherwise."""
        return group_prefix(group, self.headline_group)

    @property
    def test(self) -> np.ndarray:
        return np.flatnonzero(~self.is_fit)

    @property
    def _stimulated(self) -> np.ndarray:
        return self.second if self.stimulated_image == "second" else self.first

    @property
    def images(self) -> list:
        return [self.stimuli.images[i] for i in self._stimulated[self.test]]

    @property
    def stimulus_ids(self) -> np.ndarray:
        return np.array([f"pair_{k:05d}" for k in self.test])

    @property
    def stimulus_coords(self) -> dict:
        test, ids = self.test, self.stimuli.stimulus_id
        return {
            "first_stimulus_id": ids[self.first[test]],
            "second_stimulus_id": ids[self.second[test]],
            "pair_category": self.group[test],
            "same_identity": self.same[test],
        }

    def record(self) -> dict:
        """What to store about the pairs and the decoder (JSON-friendly)."""
        ids = self.stimuli.stimulus_id
        return {
            "stimulated_image": self.stimulated_image,
            "groups": list(self.groups),
            "n_fit_pairs": int(self.is_fit.sum()),
            "n_test_pairs": int((~self.is_fit).sum()),
            "decoder_layer": self.pair_decoder.layer,
            "decoder_fit_params": dict(self.pair_decoder.readout.fit_params),
            "pairs": [{"pair": f"pair_{k:05d}", "first": str(ids[a]), "second": str(ids[b]), "group": str(g),
                       "same": bool(s), "fit": bool(f)}
                      for k, (a, b, g, s, f) in enumerate(zip(self.first, self.second, self.group, self.same,
                                                              self.is_fit))],
        }


def sample_pairs(identity, group, groups, n_same: int, n_different: int, seed: int):
    """Ordered pairs drawn without replacement within each group: ``n_same`` with the same identity
    (two different images) and ``n_different`` with different identities.

    Returns (first, second, pair_group, same) arrays, group by group, same pairs first."""
    identity, group = np.asarray(identity).astype(str), np.asarray(group).astype(str)
    rng = np.random.default_rng([seed, 11])
    first, second, pair_group, same = [], [], [], []
    for name in groups:
        members = np.flatnonzero(group == name)
        a, b = np.meshgrid(members, members, indexing="ij")
        a, b = a.ravel(), b.ravel()
        distinct = a != b
        a, b = a[distinct], b[distinct]
        is_same = identity[a] == identity[b]
        for wanted, mask, kind in ((n_same, is_same, "same"), (n_different, ~is_same, "different")):
            available = np.flatnonzero(mask)
            if len(available) < wanted:
                raise ConfigError(f"[pairs] group {name!r} offers {len(available)} {kind} pairs, fewer than the "
                                  f"{wanted} requested; lower n_{kind}_per_group")
            chosen = np.sort(rng.choice(available, size=wanted, replace=False))
            first.append(a[chosen])
            second.append(b[chosen])
            pair_group.append(np.full(wanted, name))
            same.append(np.full(wanted, kind == "same"))
    return (np.concatenate(first), np.concatenate(second), np.concatenate(pair_group).astype(str),
            np.concatenate(same))


def prepare(task: TaskSettings, model, stimuli: StimulusSet) -> PairTrials:
    """Draw the pairs, split them into fitting and test pairs (stratified by group and trial type),
    fit the frozen decoder on the fitting pairs and bind it to the unperturbed image of every test pair."""
    pairs = task.options
    for label in (pairs.identity_label, pairs.group_label):
        if label not in stimuli.labels:
            raise ConfigError(f"{task.source} [pairs]: the images have no label {label!r}; labels: "
                              f"{sorted(stimuli.labels)}")
    group_values = np.asarray(stimuli.labels[pairs.group_label]).astype(str)
    groups = pairs.groups if pairs.groups is not None else tuple(dict.fromkeys(group_values.tolist()))
    missing = [g for g in groups if g not in set(group_values.tolist())]
    if missing:
        raise ConfigError(f"{task.source} [pairs]: no image has {pairs.group_label} in {missing}; values: "
                          f"{sorted(set(group_values.tolist()))}")
    first, second, group, same = sample_pairs(stimuli.labels[pairs.identity_label], group_values, groups,
                                              pairs.n_same_per_group, pairs.n_different_per_group, task.seed)
    strata = {f"the {'same' if kind else 'different'} pairs of {name!r}": np.flatnonzero((group == name) & (same == kind))
              for name in groups for kind in (True, False)}
    is_fit = stratified_fit_mask(strata, task.decoder.fit_fraction, np.random.default_rng([task.seed, 13]),
                                 task.source, "pairs")
    layer = model.resolve_layer(task.decoder.layer)
    features = cached_activations(model, stimuli.images, layer).numpy()
    pair_decoder = SameDifferentDecoder.fit(features[first[is_fit]], features[second[is_fit]], same[is_fit],
                                            layer=layer, C=task.decoder.C, seed=task.seed,
                                            max_iter=task.decoder.max_iter)
    unperturbed = first if pairs.stimulated_image == "second" else second
    decoder = pair_decoder.bind(features[unperturbed[~is_fit]])
    return PairTrials(stimuli=stimuli, first=first, second=second, group=group, same=same, is_fit=is_fit,
                      stimulated_image=pairs.stimulated_image, pair_decoder=pair_decoder, decoder=decoder,
                      groups=tuple(groups), headline_group=task.sites.localizer.positive)


def analyse(task: TaskSettings, trials: PairTrials, probabilities: xr.DataArray,
            selection: SiteSelection, headline_group: str) -> tuple[xr.Dataset, dict]:
    """Hit rates per site, group and trial type, their change with stimulation (with a bootstrap
    interval over test pairs), and the summary. Summary keys name the trial type and site group,
    e.g. ``model_same_hit_drop_inside``; groups other than ``headline_group`` are prefixed
    (``model_object_same_hit_drop_inside``)."""
    site_labels = [site.label for site in selection.sites]
    p = probabilities.sel(condition=[CONTROL_LABEL] + site_labels)
    p_same = p.sel(choice=SAME_DIFFERENT_CHOICES[0]).values
    p_different = p.sel(choice=SAME_DIFFERENT_CHOICES[1]).values
    test = trials.test
    same = trials.same[test]
    correct = np.where(same[None, :], p_same, p_different)
    group = trials.group[test]
    groups = list(trials.groups)
    shape = (len(site_labels), len(groups), len(TRIAL_TYPES))
    rate, change, low, high = (np.full(shape, np.nan) for _ in range(4))
    control = np.full(shape[1:], np.nan)
    analysis = task.analysis
    for g, name in enumerate(groups):
        for t, kind in enumerate(TRIAL_TYPES):
            mask = (group == name) & (same == (kind == "same"))
            control[g, t] = correct[0, mask].mean()
            for s in range(len(site_labels)):
                rate[s, g, t] = correct[s + 1, mask].mean()
                change[s, g, t], low[s, g, t], high[s, g, t] = bootstrap_ci(
                    lambda a, b: np.mean(a - b), correct[s + 1, mask], correct[0, mask],
                    n_boot=analysis.n_boot, ci=analysis.ci, seed=task.seed)
    dims = ("site", "pair_group", "trial_type")
    dataset = xr.Dataset(
        {"hit_rate": (dims, rate), "hit_rate_control": (dims[1:], control), "hit_rate_change": (dims, change),
         "hit_rate_change_ci_low": (dims, low), "hit_rate_change_ci_high": (dims, high),
         "n_test_pairs": (dims[1:], np.array([[np.sum((group == name) & (same == (kind == "same")))
                                                for kind in TRIAL_TYPES] for name in groups]))},
        coords={"site": site_labels, "pair_group": groups, "trial_type": list(TRIAL_TYPES)},
    )
    dataset["hit_rate_change"].attrs.update(units="fraction of trials", description="stimulated − control")
    site_groups = np.array([site.group for site in selection.sites])
    summary = {"n_sites": len(site_labels), "n_test_pairs": int(len(test)), "n_fit_pairs": int(trials.is_fit.sum()),
               "stimulated_image": trials.stimulated_image}
    for g, name in enumerate(groups):
        prefix = group_prefix(name, headline_group)
        for t, kind in enumerate(TRIAL_TYPES):
            key = f"model_{prefix}{kind}_hit"
            summary[f"{key}_rate_control"] = float(control[g, t])
            for site_group in dict.fromkeys(site_groups.tolist()):
                in_group = site_groups == site_group
                stimulated = float(rate[in_group, g, t].mean())
                summary[f"{key}_rate_{site_group}"] = stimulated
                summary[f"{key}_drop_{site_group}"] = float(control[g, t]) - stimulated
    return dataset, summary


def group_prefix(group: str, headline_group: str) -> str:
    """Summary-key prefix of a pair group: none for the headline group, ``"<group>_"`` otherwise."""
    return "" if group == headline_group else f"{group}_"


def plot_hit_rates(dataset: xr.Dataset, path, title: str, data: xr.Dataset | None = None,
                   data_label: str = "animals") -> None:
    """Bar chart of hit rates without and with stimulation per trial type and site group, one panel
    per pair group; with ``data`` (published rates: ``data_hit_rate`` with dims data_location,
    pair_group, trial_type and stimulation ["off", "on"]) a second row, titled ``data_label``, shows
    the animals' rates for the same cells. PNG at ``path``."""
    plt = pyplot()
    groups = [str(g) for g in dataset["pair_group"].values]
    site_groups = list(dict.fromkeys(dataset["site_group"].values.astype(str).tolist()))
    rows = [("model", None)] + ([(data_label, data)] if data is not None else [])
    fig, axes = plt.subplots(len(rows), len(groups), figsize=(4.2 * len(groups), 3.2 * len(rows)), squeeze=False)
    cells = [(kind, location) for kind in TRIAL_TYPES for location in site_groups]
    x = np.arange(len(cells))
    for r, (who, source) in enumerate(rows):
        for c, name in enumerate(groups):
            ax = axes[r, c]
            off, on = [], []
            for kind, location in cells:
                if source is None:
                    off.append(float(dataset["hit_rate_control"].sel(pair_group=name, trial_type=kind)))
                    in_group = dataset["site_group"].values.astype(str) == location
                    on.append(float(dataset["hit_rate"].sel(pair_group=name, trial_type=kind).values[in_group].mean()))
                elif location in source["data_location"].values and name in source["pair_group"].values:
                    cell = source["data_hit_rate"].sel(data_location=location, pair_group=name, trial_type=kind)
                    off.append(float(cell.sel(stimulation="off")))
                    on.append(float(cell.sel(stimulation="on")))
                else:
                    off.append(np.nan)
                    on.append(np.nan)
            ax.bar(x - 0.18, np.nan_to_num(off), width=0.36, color="0.6", label="no stimulation")
            ax.bar(x + 0.18, np.nan_to_num(on), width=0.36, color="tab:red", label="stimulation")
            for i, (a, b) in enumerate(zip(off, on)):
                if not (np.isfinite(a) and np.isfinite(b)):
                    ax.text(x[i], 0.05, "no data", ha="center", rotation=90, fontsize=7)
            ax.set_xticks(x, [f"{kind}\n{location}" for kind, location in cells], fontsize=8)
            ax.set(ylim=(0, 1), ylabel="hit rate", title=f"{who}: {name}")
    # one legend above the panels, where it covers no bar
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="upper right", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    save_figure(fig, path)


@register_paradigm("same_different")
class SameDifferent(Paradigm):
    """Same or different identity? Hit rates of same and different pairs per site group."""

    table_models = {"pairs": PairsSpec}

    def parse(self, stimuli, tables: dict, where: str) -> PairsSpec:
        pairs = tables["pairs"]
        if pairs.groups is not None and len(set(pairs.groups)) != len(pairs.groups):
            raise ConfigError(f"{where} [pairs]: 'groups' must be distinct names, got {pairs.groups!r}")
        return pairs

    def labels(self, task: TaskSettings) -> set[str]:
        return {task.options.identity_label, task.options.group_label}

    def prepare(self, task, model, stimuli, selection, progress=False):
        return prepare(task, model, stimuli)

    def analyse(self, task, trials, probabilities, selection):
        return analyse(task, trials, probabilities, selection, trials.headline_group)

    def figures(self, task, results, out_dir) -> None:
        plot_hit_rates(results, out_dir / "hit_rates.png", f"{task.name}: same/different hit rates")
