"""Categorisation paradigm: which class does the model report for an image, with and without a
perturbation at each site?

The task of Afraz, Kiani & Esteky 2006 (Nature 442:692) is the two-choice case: face or non-face,
on images whose visual signal is degraded by replacing a fraction of the pixels with uniform noise.
A logistic decoder on the readout layer is fitted on unperturbed images (clean and noisy) and
frozen; the remaining (test) images are then shown under every condition. Per site:

* expected accuracy (mean probability of the correct choice) and Δaccuracy = stimulated − control,
  with a bootstrap interval over test images (paired);
* two-choice tasks: ΔP(positive), the mean change of the probability of the positive choice;
* with noise levels: P(positive) against the signed signal level (positive class +s %, other
  classes −s %) is fitted with a logistic psychometric function, and the shift
  x50(control) − x50(stimulated) is in % signal (positive = towards the positive choice, as in
  Afraz et al. 2006).

Keys of ``[stimuli]`` besides ``sets`` (see :mod:`stimsim.paradigms.experiment_file` for the common ones):
``label`` (the label holding the class, default ``"category"``); ``positive`` (optional: a two-choice
task, this class against all others, which are merged into the choice ``negative``, default
``"non<positive>"``; without it every label value is a choice); ``n_per_choice`` (optional: draw this
many images of each choice at random). ``[stimuli.noise]`` (optional): ``signal_percent = [0, 15,
...]``, the visual-signal levels of Afraz et al. 2006 (a fraction 1 − s/100 of the pixels replaced by
uniform noise); with ``positive`` the choices are fitted as a psychometric function of the signed
signal level (positive class +s, others −s). The noise is added to the images at the model's input size
and colour (:meth:`~stimsim.models.preprocessing.Preprocessing.geometry`: shorter side resized to
``size_px``, centre crop, luma or gray repeated), so that the network sees exactly the stated fraction of
its input pixels replaced; noise added before the resize would be blurred (larger images) or enlarged
(smaller ones) into other pixels. The decoder's fitting images are split by clean image, so
all noisy copies of an image fall on the same side. With ``positive``, the default localizer is
``label`` with ``positive`` as the preferred class.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated

import numpy as np
import xarray as xr
from pydantic import Field

from stimsim.behavior import (LogisticDecoder, bootstrap_ci, fit_psychometric, psychometric_shift_percent,
                              stratified_fit_mask)
from stimsim.behavior.metrics import delta_accuracy, shift_summary, site_correlation, stratum_mean
from stimsim.data.stimuli import StimulusSet, pixel_noise
from stimsim.engine.activation_cache import cached_activations
from stimsim.paradigms.base import Paradigm, register_paradigm
from stimsim.paradigms.schema import DecoderFile, LocalizerFile, StimuliFile
from stimsim.paradigms.sites import CONTROL_LABEL, SiteSelection
from stimsim.paradigms.spec import TaskSettings
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.figures import pyplot, save_figure
from stimsim.utilities.filemodels import FileModel, Text


@dataclass(frozen=True)
class CategorizationOptions:
    """The class ``label``, optional ``positive``/``negative`` choices, ``n_per_choice`` and noise
    levels (% signal) of a categorisation experiment."""

    label: str = "category"
    positive: str | None = None
    negative: str | None = None
    n_per_choice: int | None = None
    signal_percent: tuple[float, ...] | None = None


class NoiseTable(FileModel):
    """``[stimuli.noise]``: visual-signal levels (% of pixels kept) of Afraz et al. 2006."""

    signal_percent: Annotated[list[Annotated[float, Field(ge=0, le=100)]], Field(min_length=1)]


class CategorizationStimuli(StimuliFile):
    """``[stimuli]`` of a categorisation experiment (module docstring)."""

    label: Text = "category"
    positive: Text | None = None
    negative: Text | None = None
    n_per_choice: Annotated[int, Field(ge=1)] | None = None
    noise: NoiseTable | None = None


def parse_options(stimuli: CategorizationStimuli, where: str) -> CategorizationOptions:
    """Categorisation's options from its validated ``[stimuli]`` table; ``where`` names the file."""
    positive, negative = stimuli.positive, stimuli.negative
    if negative is not None and positive is None:
        raise ConfigError(f"{where} [stimuli]: 'negative' names the merged choice of a two-choice task; "
                          f"give 'positive' too")
    if positive is not None:
        negative = negative if negative is not None else f"non{positive}"
        if negative == positive:
            raise ConfigError(f"{where} [stimuli]: 'negative' must differ from 'positive' ({positive!r})")
    levels = None
    if stimuli.noise is not None:
        levels = tuple(stimuli.noise.signal_percent)
        if len(set(levels)) != len(levels):
            raise ConfigError(f"{where} [stimuli.noise]: 'signal_percent' levels must be distinct percentages in "
                              f"[0, 100], got {list(levels)}")
        if positive is not None and len(levels) < 2:
            raise ConfigError(f"{where} [stimuli.noise]: a psychometric fit needs at least 2 signal levels, got "
                              f"{list(levels)}")
    return CategorizationOptions(label=stimuli.label, positive=positive, negative=negative,
                                 n_per_choice=stimuli.n_per_choice, signal_percent=levels)


@dataclass(frozen=True, eq=False)
class CategorizationTrials:
    """Fitting and test images of a categorisation experiment, and the frozen decoder.

    Both sets carry the labels ``true_choice``, ``signal_percent`` (100 without noise),
    ``base_stimulus_id`` (the clean image a noisy copy comes from) and ``source_set``; with a
    positive class also ``signed_signal_percent``. ``noise_input`` : with noise, the model input
    (``size_px``, ``channels``) at which it was added; None without noise.
    """

    choices: tuple[str, ...]
    positive: str | None
    fit: StimulusSet
    test: StimulusSet
    decoder: LogisticDecoder
    psychometric: bool
    noise_input: dict | None = None

    @property
    def images(self) -> list:
        return self.test.images

    @property
    def stimulus_ids(self) -> np.ndarray:
        return self.test.stimulus_id

    @property
    def stimulus_coords(self) -> dict:
        return dict(self.test.labels)

    @property
    def frozen_decoder(self) -> LogisticDecoder:
        return self.decoder

    def record(self) -> dict:
        """What to store about the trials and the decoder (JSON-friendly)."""
        return {
            "choices": list(self.choices),
            "positive": self.positive,
            "n_fit_images": len(self.fit),
            "n_test_images": len(self.test),
            "decoder_layer": self.decoder.layer,
            "decoder_fit_params": dict(self.decoder.readout.fit_params),
            "pixel_noise": None if self.noise_input is None else {
                **self.noise_input, "applied_to": "each image after it was resized (shorter side to size_px, "
                                                  "centre crop) and colour-matched to the model's input"},
            "fit_stimulus_ids": self.fit.stimulus_id.tolist(),
            "test_stimulus_ids": self.test.stimulus_id.tolist(),
        }


def true_choices(options: CategorizationOptions, stimuli: StimulusSet, where: str) -> np.ndarray:
    """The correct choice of every image: its label, or positive / negative in a two-choice task; ``where``
    names the file (and table) the options come from."""
    label, positive = options.label, options.positive
    if label not in stimuli.labels:
        raise ConfigError(f"{where}: the images have no label {label!r}; labels: {sorted(stimuli.labels)}")
    values = np.asarray(stimuli.labels[label]).astype(str)
    if positive is None:
        if len(np.unique(values)) < 2:
            raise ConfigError(f"{where}: label {label!r} has a single value {values[0]!r}; a categorisation needs at "
                              f"least 2 classes")
        return values
    if not np.any(values == positive):
        raise ConfigError(f"{where}: no image has {label} = {positive!r}; values: {sorted(set(values.tolist()))}")
    if np.all(values == positive):
        raise ConfigError(f"{where}: every image has {label} = {positive!r}; add images of other classes for the "
                          f"{options.negative!r} choice")
    return np.where(values == positive, positive, options.negative)


def clean_images(options: CategorizationOptions, stimuli: StimulusSet, seed: int, where: str,
                 count_key: str = "n_per_choice") -> StimulusSet:
    """The clean images of the task, labelled ``true_choice`` (and ``source_set`` where the images have it):
    all of them, or ``n_per_choice`` of each choice drawn with ``seed`` (``count_key`` is that number's name in
    the file, for errors)."""
    choice = true_choices(options, stimuli, where)
    selected = np.arange(len(stimuli))
    if options.n_per_choice is not None:
        rng = np.random.default_rng([seed, 3])
        picks = []
        for value in np.unique(choice):
            members = np.flatnonzero(choice == value)
            if len(members) < options.n_per_choice:
                raise ConfigError(f"{where}: {count_key} = {options.n_per_choice} but choice {str(value)!r} has only "
                                  f"{len(members)} images")
            picks.append(rng.choice(members, size=options.n_per_choice, replace=False))
        selected = np.sort(np.concatenate(picks))
    labels = {"true_choice": choice[selected]}
    if "source_set" in stimuli.labels:
        labels["source_set"] = np.asarray(stimuli.labels["source_set"])[selected]
    return StimulusSet(name=stimuli.name, images=[stimuli.images[i] for i in selected],
                       stimulus_id=stimuli.stimulus_id[selected], labels=labels)


def categorization_trials(options: CategorizationOptions, decoder: DecoderFile, model, stimuli: StimulusSet, seed: int,
                          where: str, count_key: str = "n_per_choice") -> CategorizationTrials:
    """The fitting and test images of :func:`shown_images`, and the frozen decoder fitted on the fitting images."""
    fit, test, noise_input = shown_images(options, decoder, model, stimuli, seed, where, count_key)
    layer = model.resolve_layer(decoder.layer)
    features = cached_activations(model, fit.images, layer).numpy()
    fitted = LogisticDecoder.fit(features, fit.labels["true_choice"], layer=layer, C=decoder.C, seed=seed,
                                 max_iter=decoder.max_iter)
    psychometric = options.positive is not None and options.signal_percent is not None
    return CategorizationTrials(choices=tuple(fitted.choices), positive=options.positive, fit=fit, test=test,
                                decoder=fitted, psychometric=psychometric, noise_input=noise_input)


def shown_images(options: CategorizationOptions, decoder: DecoderFile, model, stimuli: StimulusSet, seed: int,
                 where: str, count_key: str = "n_per_choice") -> tuple[StimulusSet, StimulusSet, dict | None]:
    """The images the task shows ``model``: the clean images (:func:`clean_images`) split into fitting and test
    images (stratified by choice; all noisy copies of an image on the same side), with noise added at ``model``'s
    input geometry; every draw from ``seed``. Returns the fitting and the test images and the geometry of the noise
    (None without visual-signal levels). ``where`` names the file for errors."""
    clean = clean_images(options, stimuli, seed, where, count_key)
    classes = clean.labels["true_choice"]
    is_fit_clean = stratified_fit_mask({f"class '{value}'": np.flatnonzero(classes == value)
                                        for value in np.unique(classes)},
                                       decoder.fit_fraction, np.random.default_rng([seed, 5]), where, "images")
    noise_input = None
    if options.signal_percent is not None:
        preprocessing = model.preprocessing
        noise_input = {"size_px": preprocessing.size_px, "channels": preprocessing.channels}
        shown = pixel_noise(replace(clean, images=preprocessing.geometry(clean.images)), options.signal_percent,
                            seed=seed)
        base_ids = np.tile(clean.stimulus_id, len(options.signal_percent))
        is_fit = np.tile(is_fit_clean, len(options.signal_percent))
    else:
        shown = clean.with_labels(signal_percent=np.full(len(clean), 100.0))
        base_ids, is_fit = clean.stimulus_id, is_fit_clean
    labels = {"base_stimulus_id": base_ids}
    if options.positive is not None:
        sign = np.where(shown.labels["true_choice"] == options.positive, 1.0, -1.0)
        labels["signed_signal_percent"] = sign * shown.labels["signal_percent"]
    shown = shown.with_labels(**labels)
    fit, test = shown.subset(is_fit, name=f"{shown.name}_fit"), shown.subset(~is_fit, name=f"{shown.name}_test")
    return fit, test, noise_input


def analyse(task: TaskSettings, trials: CategorizationTrials, probabilities: xr.DataArray,
            selection: SiteSelection) -> tuple[xr.Dataset, dict]:
    """Per-site metrics (dim ``site``; psychometric curves on ``condition`` × ``signal_level_percent``)
    and the summary numbers of a categorisation run. ``probabilities`` is the engine's output for the
    control condition and one condition per site, labelled as the sites."""
    site_labels = [site.label for site in selection.sites]
    conditions = [CONTROL_LABEL] + site_labels
    p = probabilities.sel(condition=conditions).values
    choice_index = {choice: i for i, choice in enumerate(probabilities["choice"].values.tolist())}
    truth = trials.test.labels["true_choice"]
    correct = p[:, np.arange(p.shape[1]), [choice_index[c] for c in truth]]
    analysis = task.analysis
    accuracy = correct.mean(axis=1)
    delta = delta_accuracy(correct[1:], correct[:1], axis=1)
    intervals = np.array([_paired_interval(correct[k], correct[0], analysis, task.seed)
                          for k in range(1, len(conditions))]).reshape(-1, 2)
    site_dprime = np.array([site.dprime for site in selection.sites])
    distance = selection.distance_to_peak_mm()
    variables = {
        "accuracy": ("site", accuracy[1:]),
        "delta_accuracy": ("site", delta),
        "delta_accuracy_ci_low": ("site", intervals[:, 0]),
        "delta_accuracy_ci_high": ("site", intervals[:, 1]),
        "control_accuracy": ((), accuracy[0]),
    }
    summary = {
        "n_sites": len(site_labels),
        "n_test_images": int(p.shape[1]),
        "n_fit_images": len(trials.fit),
        "choices": list(trials.choices),
        "control_accuracy": float(accuracy[0]),
    }
    mean_delta = stratum_mean(delta, analysis.n_boot, analysis.ci, task.seed)
    summary["mean_delta_accuracy"], summary["mean_delta_accuracy_ci"] = mean_delta["mean"], mean_delta["ci"]
    for name, x in (("dprime", site_dprime), ("distance", distance)):
        result = site_correlation(x, delta, analysis.n_perm, analysis.n_boot, analysis.ci, task.seed)
        summary[f"delta_accuracy_vs_{name}_r"] = result["r"]
        summary[f"delta_accuracy_vs_{name}_p"] = result["p"]
    coords = {"site": site_labels}
    if trials.positive is not None:
        p_positive = p[:, :, choice_index[trials.positive]]
        change = p_positive[1:].mean(axis=1) - p_positive[0].mean()
        variables["delta_p_positive"] = ("site", change)
        summary["mean_delta_p_positive"] = float(change.mean())
    if trials.psychometric:
        psychometric_vars, psychometric_summary = _psychometric(trials, p[:, :, choice_index[trials.positive]],
                                                                site_dprime, task)
        coords["condition"] = conditions
        variables.update(psychometric_vars)
        summary.update(psychometric_summary)
    dataset = xr.Dataset(variables, coords=coords)
    dataset["delta_accuracy"].attrs.update(units="fraction correct", description="stimulated − control")
    for name, units in (("accuracy", "fraction correct"), ("control_accuracy", "fraction correct"),
                        ("delta_accuracy_ci_low", "fraction correct"), ("delta_accuracy_ci_high", "fraction correct"),
                        ("delta_p_positive", "probability"), ("p_positive_curve", "probability"),
                        ("psychometric_shift_percent", "% signal"), ("psychometric_shift_logodds", "log-odds"),
                        ("midpoint_percent", "% signal"), ("control_midpoint_percent", "% signal"),
                        ("slope_per_percent", "log-odds per % signal"), ("signal_level_percent", "% signal")):
        if name in dataset:
            dataset[name].attrs.setdefault("units", units)
    return dataset, summary


def _paired_interval(stimulated: np.ndarray, control: np.ndarray, analysis, seed: int) -> tuple[float, float]:
    """Bootstrap interval of mean(stimulated − control) over images (pairs resampled together)."""
    _, low, high = bootstrap_ci(lambda s, c: np.mean(s - c), stimulated, control, n_boot=analysis.n_boot,
                                ci=analysis.ci, seed=seed)
    return low, high


def _psychometric(trials: CategorizationTrials, p_positive: np.ndarray, site_dprime: np.ndarray,
                  task: TaskSettings) -> tuple[dict, dict]:
    signed = trials.test.labels["signed_signal_percent"]
    levels = np.unique(signed)
    members = [signed == level for level in levels]
    counts = np.array([m.sum() for m in members], dtype=np.float64)
    curves = np.stack([p_positive[:, m].mean(axis=1) for m in members], axis=1)
    fits = [fit_psychometric(levels, curve, weights=counts) for curve in curves]
    control = fits[0]
    shifts = np.array([psychometric_shift_percent(control, fit) for fit in fits[1:]])
    # the same shift in log-odds: the stimulated curve's log-odds at the control's midpoint, where the control's
    # are 0 (= slope × shift); a shallow curve cannot turn a small change of choices into a large % shift
    shifts_logodds = np.array([fit.slope * shift for fit, shift in zip(fits[1:], shifts)])
    n_failed = sum(not fit.success for fit in fits)
    variables = {
        "signal_level_percent": ("signal_level_percent", levels),
        "p_positive_curve": (("condition", "signal_level_percent"), curves),
        "n_images_per_level": ("signal_level_percent", counts),
        "midpoint_percent": ("site", np.array([fit.midpoint_percent for fit in fits[1:]])),
        "slope_per_percent": ("site", np.array([fit.slope for fit in fits[1:]])),
        "fit_success": ("site", np.array([fit.success for fit in fits[1:]], dtype=bool)),
        "fit_message": ("site", np.array([fit.message for fit in fits[1:]], dtype=object)),
        "psychometric_shift_percent": ("site", shifts),
        "psychometric_shift_logodds": ("site", shifts_logodds),
        "control_midpoint_percent": ((), control.midpoint_percent),
        "control_fit_message": ((), control.message),
    }
    analysis = task.analysis
    summary = {
        "control_midpoint_percent": control.midpoint_percent if control.success else None,
        "control_fit_message": control.message,
        "n_failed_fits": n_failed,
        **shift_summary("model", site_dprime, shifts, task.sites.dprime_threshold, analysis.n_perm,
                        analysis.n_boot, analysis.ci, task.seed),
    }
    for name, mask in (("selective", site_dprime > task.sites.dprime_threshold),
                       ("other", site_dprime <= task.sites.dprime_threshold)):
        values = shifts_logodds[mask & np.isfinite(shifts_logodds)]
        summary[f"model_mean_shift_{name}_logodds"] = float(values.mean()) if values.size else None
    for level in (-50, 50):  # how steep the unstimulated curve is, against a trained animal's
        at = np.flatnonzero(np.isclose(levels, level))
        key = f"control_p_{trials.positive}_at_{'minus' if level < 0 else ''}{abs(level)}"
        summary[key] = float(curves[0, at[0]]) if at.size else None
    return variables, summary


def plot_site_effects(dataset: xr.Dataset, path, title: str) -> None:
    """Per-site effect (psychometric shift if measured, else Δaccuracy) against the site's d′ and its
    distance from the d′-map peak; PNG at ``path``."""
    plt = pyplot()
    if "psychometric_shift_percent" in dataset:
        effect, label = dataset["psychometric_shift_percent"].values, "psychometric shift (% signal)"
    else:
        effect, label = dataset["delta_accuracy"].values, "Δ accuracy (stimulated − control)"
    groups = dataset["site_group"].values.astype(str)
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6))
    for ax, (coord, xlabel) in zip(axes, (("site_dprime", "site d′ (multi-unit)"),
                                          ("distance_to_peak_mm", "distance from d′ peak (cortex mm)"))):
        x = dataset[coord].values
        for group in dict.fromkeys(groups):
            mask = groups == group
            ax.scatter(x[mask], effect[mask], s=18, alpha=0.8, linewidths=0, label=group)
        ax.axhline(0, color="grey", lw=0.6, ls=":")
        ax.set(xlabel=xlabel, ylabel=label)
    axes[0].legend(fontsize=7)
    unfitted = int(np.sum(~np.isfinite(effect)))
    if unfitted:
        title = f"{title}\n{unfitted} of {len(effect)} sites without a fitted curve are not shown"
        if unfitted == len(effect):
            for ax in axes:
                ax.text(0.5, 0.5, "no site's curve could be fitted", transform=ax.transAxes, ha="center",
                        va="center", color="grey")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def _site_description(dataset: xr.Dataset, index: int) -> str:
    """A site's id, with its d′ and position (mm) where the results hold them."""
    coords = dataset["site"][index].coords
    text = str(dataset["site"].values[index])
    if "site_dprime" in coords:
        text += f": d′ {float(coords['site_dprime']):.1f}"
    if "site_x_mm" in coords and "site_y_mm" in coords:
        text += f" at ({float(coords['site_x_mm']):.1f}, {float(coords['site_y_mm']):.1f}) mm"
    return text


def plot_psychometric(dataset: xr.Dataset, path, title: str, positive: str | None = None) -> None:
    """Mean P(positive) per signed signal level (``positive``: the positive class's name) for the control and for
    the sites with the largest and the smallest shift, each named with its d′ and position; PNG at ``path``."""
    plt = pyplot()
    levels = dataset["signal_level_percent"].values
    curves = dataset["p_positive_curve"]
    shifts = dataset["psychometric_shift_percent"].values
    sites = dataset["site"].values
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    ax.plot(levels, curves.sel(condition=CONTROL_LABEL).values, "o-", color="k", label="control")
    if np.isfinite(shifts).any():
        for index, colour in ((int(np.nanargmax(shifts)), "tab:red"), (int(np.nanargmin(shifts)), "tab:blue")):
            ax.plot(levels, curves.sel(condition=sites[index]).values, "o--", color=colour,
                    label=f"{_site_description(dataset, index)}, shift {shifts[index]:+.1f} %")
    ax.axhline(0.5, color="grey", lw=0.6, ls=":")
    name = "the positive class" if positive is None else repr(positive)
    unfitted = int((~np.isfinite(shifts)).sum())
    if unfitted:  # their curves could not be fitted, so they have no shift to rank (fit_message says why)
        title = f"{title}\n{unfitted} of {len(shifts)} sites without a fitted curve are not shown"
    ax.set(xlabel=f"signed signal level (%; {name} > 0)", ylabel=f"P(choose {name})", ylim=(-0.02, 1.02))
    ax.set_title(title, fontsize=10 if unfitted else None)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


@register_paradigm("categorization")
class Categorization(Paradigm):
    """Which class does the subject report? Accuracy, ΔP(positive) and psychometric shifts per site."""

    stimuli_model = CategorizationStimuli

    def parse(self, stimuli: CategorizationStimuli, tables: dict, where: str) -> CategorizationOptions:
        return parse_options(stimuli, where)

    def labels(self, task: TaskSettings) -> set[str]:
        return {task.options.label}

    def default_localizer(self, options: CategorizationOptions) -> LocalizerFile | None:
        if options.positive is None:
            return None
        return LocalizerFile(label=options.label, positive=options.positive)

    def prepare(self, task, model, stimuli, selection, progress=False):
        return categorization_trials(task.options, task.decoder, model, stimuli, task.seed, f"{task.source} [stimuli]")

    def analyse(self, task, trials, probabilities, selection):
        return analyse(task, trials, probabilities, selection)

    def figures(self, task, results, out_dir) -> None:
        plot_site_effects(results, out_dir / "site_effects.png", f"{task.name}: effect per site")
        if "psychometric_shift_percent" in results:
            plot_psychometric(results, out_dir / "psychometric.png", task.name, task.options.positive)
