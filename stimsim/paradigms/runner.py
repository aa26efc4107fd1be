"""Running an experiment file end to end: ``stimsim run EXPERIMENT.toml --out DIR``.

Steps: read and check the file (:mod:`stimsim.paradigms.experiment_file`; an unsafe protocol is refused
there), load the model and the images, choose the sites from the localizer's selectivity map
(:mod:`stimsim.paradigms.sites`), fit the frozen decoder on unperturbed trials, simulate the control
condition and one condition per site with the batched engine (:func:`stimsim.engine.simulate`,
resumable: the chunks it finishes are kept under ``DIR/simulation_store``), compute the paradigm's
per-site metrics, compare with published data when asked, and write into ``DIR`` one result set
(:class:`stimsim.utilities.io.ResultSet`: each file atomically, then ``result_set.json`` with the sha256 of
every file; :func:`load_results` refuses a set that does not match it, and a ``DIR`` holding files
stimsim did not write is refused unless forced):

``results.nc``
    xarray Dataset (NetCDF4, h5netcdf engine): ``choice_probability`` (condition × stimulus_id ×
    choice) with the stimulation parameters as condition coordinates (the stimulated position as
    ``condition_site_x_mm`` / ``condition_site_y_mm``); per-site metrics on the ``site`` dimension
    with ``site_x_mm``, ``site_y_mm``, ``site_group``, ``site_dprime``, ``site_n_units`` and
    ``distance_to_peak_mm``; ``unit_dprime`` of every unit of the stimulated layer; published data
    (``data_*``) when compared. Its attributes hold the experiment, model, safety report, comparison
    source and software versions as JSON text. A site's label is the label of its condition.
``summary.json``
    headline numbers (also returned); JSON null where a number is undefined. Categorisation:
    ``control_accuracy``, ``mean_delta_accuracy`` (+ ``_ci``), ``delta_accuracy_vs_dprime_r`` / ``_p``
    and ``..._vs_distance_...``; two-choice: ``mean_delta_p_positive``; with noise levels:
    ``control_midpoint_percent``, ``n_failed_fits``, ``model_r`` / ``model_p`` /
    ``model_p_permutation`` / ``model_r_ci`` (psychometric shift against site d′) and
    ``model_mean_shift_selective`` / ``_other`` (+ ``_ci``, ``model_n_...``). Same/different:
    ``model_<group>_<trial>_hit_rate_control``, ``..._hit_rate_<site group>`` and
    ``..._hit_drop_<site group>`` (control − stimulated; the localizer's preferred group without the
    ``<group>_`` prefix, e.g. ``model_same_hit_drop_inside``). 2AFC sequences: ``own_delta_auc``
    (per site, on its own sequences), ``cross_abs_delta_auc`` (per site, on the other sites'),
    ``mean_own_delta_auc``, ``mean_own_abs_delta_auc`` / ``mean_cross_abs_delta_auc`` and
    ``mean_locality_abs_delta_auc`` (their difference; + ``_ci``), ``control_step_auc_mean`` (chance 0.5).
    Compared data add the same numbers with a ``data_`` prefix, and ``score``: the model's score on the dataset's
    benchmark with its ceiling and chance level (:meth:`stimsim.datasets.base.PublishedDataset.score_record`).
``config.json``
    the experiment as run, model name and checksums, sites, conditions, safety report, decoder fit
    and trials, notes, time and software versions (:func:`stimsim.utilities.io.provenance`).
``decoder.json``
    the frozen decoder's numbers (``stimsim.behavior.decoder_from_dict`` rebuilds it; the 2AFC
    sequences' readouts: ``stimsim.paradigms.sequence_2afc.SequenceReadouts.from_dict``).
figures (PNG)
    ``sites.png`` (the d′ map and the sites) and the paradigm's figures.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from stimsim.data.stimuli import StimulusSet, load_stimulus_source
from stimsim.datasets import DATASETS
from stimsim.engine.activation_cache import cached_activations
from stimsim.models.preprocessing import input_geometry_notes
from stimsim.models.registry import load_model, model_path
from stimsim.models.topographic import TopographicModel
from stimsim.paradigms.base import get_paradigm
from stimsim.paradigms.experiment_file import load_experiment
from stimsim.paradigms.sites import CONTROL_LABEL, SiteSelection, plot_sites, select_sites
from stimsim.paradigms.spec import ExperimentSpec
from stimsim.stimulation import Condition, SafetyLimits, additive_scale_record, signed_gain_warning
from stimsim.utilities.errors import ConfigError, DataError
from stimsim.utilities.hashing import sha256_of, state_sha256
from stimsim.utilities.io import ResultSet, provenance, read_result_set
from stimsim.utilities.jsonable import json_ready
from stimsim.utilities.locking import DirectoryLock
from stimsim.utilities.progress import report_phase

#: Name of the engine's resumable store inside the output directory.
STORE_DIRNAME = "simulation_store"
RESULTS_FILE, SUMMARY_FILE, CONFIG_FILE, DECODER_FILE = "results.nc", "summary.json", "config.json", "decoder.json"
#: The units a results variable's name ends with, written as its ``units`` attribute where it has none.
UNIT_SUFFIXES = {"_uA": "µA", "_Hz": "Hz", "_mm": "mm", "_ms": "ms", "_uL": "µL", "_mW": "mW", "_nC": "nC",
                 "_percent": "%", "_deg": "degrees"}


def run_experiment(experiment, out_dir, model=None, progress: bool = True, figures: bool = True,
                   force: bool = False, device="cpu", scheduler=None) -> dict:
    """Run an experiment and write its results into ``out_dir`` as one result set
    (:class:`stimsim.utilities.io.ResultSet`); returns the summary. A run that fails before writing any result
    leaves ``out_dir`` as it found it (a directory it made is removed, unless it holds the simulation
    store of a run to resume).

    The unperturbed activity of the stimulated layer is kept in the stimsim cache
    (:mod:`stimsim.engine.activation_cache`): another run on the same model and images skips that forward pass.

    Parameters
    ----------
    experiment : path of an experiment file, or an :class:`~stimsim.paradigms.spec.ExperimentSpec`.
    model : None (the file's ``model``), a shipped model name or model directory (overrides the
        file), or a loaded ``TopographicModel``.
    progress : show progress bars.
    figures : write the PNG figures (the data files are always written).
    force : write into ``out_dir`` even if it holds files stimsim did not write, or the simulation store of an
        unfinished run with other inputs (which is then replaced).
    device : where the model, effects and decoder compute (cpu, cuda, cuda:N, mps, auto).
    scheduler : None (this process) or a Dask scheduler for the sweep (see :mod:`stimsim.engine.distributed`).
    """
    from stimsim.engine.devices import resolve_device
    from stimsim.engine.distributed import check_scheduler

    device = resolve_device(device)
    check_scheduler(scheduler)
    if isinstance(experiment, dict):
        raise ConfigError("run_experiment takes an experiment file's path or an ExperimentSpec; make one from a dict "
                          "of the file's tables with stimsim.paradigms.parse_experiment(dict)")
    spec = experiment if isinstance(experiment, ExperimentSpec) else load_experiment(experiment)
    if isinstance(model, (str, Path)):
        spec = spec.with_model(str(model))
    with DirectoryLock(out_dir, "run"), \
            ResultSet(out_dir, "experiment run", keep=(STORE_DIRNAME,), force=force,
                      inputs={"experiment": spec.to_dict()}) as results:
        return _run_into(results, spec, model, progress, figures, device, scheduler, replace_stale_store=force)


def _run_into(results: ResultSet, spec: ExperimentSpec, model, progress: bool, figures: bool, device,
              scheduler, replace_stale_store: bool) -> dict:
    """The body of :func:`run_experiment` once its result set is open: inputs, simulation, outputs."""
    out_dir = results.directory
    topo, model_record = _load_model(spec, model)
    topo.to(device)
    notes: list[str] = []

    try:
        layer = topo.resolve_layer(spec.layer)
        model_scale = topo.cortex_scale(layer)
    except ConfigError as exc:
        raise ConfigError(f"{spec.source}: 'layer': {exc}") from None
    _check_decoder_layer(spec, topo, layer)
    topo, scale_record = topo.in_cortex_mm(layer, spec.cortex_mm_per_model_mm)
    scale, scale_overridden = scale_record["cortex_mm_per_model_mm"], scale_record["scale_overridden"]
    if scale_overridden:
        notes.append(f"the experiment file sets cortex_mm_per_model_mm = {scale:g}, overriding the model's own "
                     f"{scale_record['model_cortex_mm_per_model_mm']:g} ({model_scale['rule']})")
    safety_overridden = bool(spec.safety and spec.safety.get("overridden"))
    if safety_overridden:
        message = (f"the protocol is outside the safety limits, run under the file's override "
                   f"({spec.safety['override_reason']}): {'; '.join(spec.safety['violations'])}")
        notes.append(message)
        warnings.warn(message, stacklevel=2)
    sheet = topo.sheet(layer)
    try:
        spec.perturbation_at(sheet.centre_mm).effect(sheet)  # what it needs of the model (e.g. resting activity)
    except ConfigError as exc:
        raise ConfigError(f"{spec.source} [stimulation]: {exc}") from None
    localizer = spec.sites.localizer
    paradigm = get_paradigm(spec.paradigm)
    labels = paradigm.labels(spec.settings()) | ({localizer.label} if localizer.sets is None else set())
    stimuli = load_stimuli(spec.stimuli.sets, sorted(labels), topo, notes, f"{spec.source} [stimuli]")
    localizer_images = stimuli if localizer.sets is None else load_stimuli(
        localizer.sets, [localizer.label], topo, notes, f"{spec.source} [sites.localizer]")
    localizer_values = np.asarray(localizer_images.labels[localizer.label]).astype(str)
    if not np.any(localizer_values == localizer.positive):
        where = ("[sites.localizer]" if localizer.sets is not None else
                 "[stimuli] (its images are the localizer's: [sites.localizer] 'positive', or the paradigm's preferred "
                 "class, e.g. [stimuli] 'positive', when the file has no [sites.localizer])")
        raise ConfigError(f"{spec.source} {where}: no localizer image has {localizer.label} = "
                          f"{localizer.positive!r}; values: {sorted(set(localizer_values.tolist()))}")
    report_phase(f"localizer: responses of {layer} to {len(localizer_images)} images", progress)
    responses = cached_activations(topo, localizer_images.images, layer).numpy()
    try:
        selection = select_sites(spec.sites, sheet, responses, localizer_values == localizer.positive, spec.seed)
    except ConfigError as exc:
        raise ConfigError(f"{spec.source}: {exc}") from None

    try:
        stimulation_scale = _resolve_additive_scale(spec, responses, layer, notes)
    except ConfigError as exc:
        raise ConfigError(f"{spec.source} [stimulation]: {exc}") from None
    spec = spec.with_additive_scale(stimulation_scale)
    conditions = [Condition(CONTROL_LABEL)] + [
        Condition(site.label, (spec.perturbation_at(site.position_mm),)) for site in selection.sites]
    _warn_signed_gain(conditions, sheet, responses, notes)
    _warn_untouched_sites(conditions, sheet, notes)
    _note_timing_without_effect(spec.raw.get("stimulation", {}), notes)
    report_phase(f"trials: preparing the {spec.paradigm} trials and fitting their readout without stimulation", progress)
    task = spec.settings()
    try:
        trials = paradigm.prepare(task, topo, stimuli, selection, progress=progress)
    except ConfigError as exc:  # a task setting that does not fit the model or the images: name the file
        raise exc if str(exc).startswith(str(spec.source)) else ConfigError(f"{spec.source}: {exc}") from None
    probabilities = paradigm.simulate(task, topo, trials, conditions, out_dir / STORE_DIRNAME, progress,
                                      device=device, activation_cache=True, scheduler=scheduler,
                                      replace_stale_store=replace_stale_store,
                                      **_safety_arguments(spec))
    metrics, summary = paradigm.analyse(task, trials, probabilities, selection)
    if summary.get("n_failed_fits") and summary.get("control_midpoint_percent") is None:
        message = (f"the control's psychometric curve could not be fitted ({summary['control_fit_message']}), so no "
                   f"site has a shift ({summary['n_failed_fits']} of {len(conditions)} curves failed); with control "
                   f"accuracy {summary['control_accuracy']:.3f} (chance {1 / len(summary['choices']):.3f}) and "
                   f"{summary['n_fit_images']} images to fit the decoder, more images may give a curve to fit")
        notes.append(message)
        warnings.warn(message, stacklevel=2)

    data, data_summary = None, {}
    comparison = None if spec.comparison is None else DATASETS.get(spec.comparison)
    try:
        if comparison is not None:
            data, data_summary = comparison.compare(task, trials)
    except DataError as exc:
        # the model's results stand on their own; the published data are optional
        message = (f"comparison with {spec.comparison!r} skipped, its data are not available here "
                   f"(fetch them with `stimsim data fetch {spec.comparison} --mirror DIR`): {exc}")
        notes.append(message)
        warnings.warn(message, stacklevel=2)
        data_summary = {"comparison_skipped": message}
    score = {} if comparison is None else {"score": comparison.score(task, trials, {**summary, **data_summary}, data)}

    summary = json_ready({
        "experiment": spec.name, "paradigm": spec.paradigm, "model": model_record["name"], "layer": layer,
        "cortex_mm_per_model_mm": scale, "scale_overridden": scale_overridden, "safety_overridden": safety_overridden,
        "model_cortex_mm_per_model_mm": scale_record["model_cortex_mm_per_model_mm"], "scale_rule": model_scale["rule"],
        "sheet_size_mm": sheet.size_mm,
        "site_method": spec.sites.method, **summary, **data_summary, **score,
    })
    created = provenance()
    config = json_ready({
        "experiment": spec.to_dict(),
        "experiment_file": spec.source,
        "experiment_sha256": spec.sha256(),
        "model": model_record,
        "layer": layer,
        "sites": selection.to_records(),
        "site_selection": {"method": selection.method, "peak_mm": list(selection.peak_mm),
                           "recording_radius_mm": selection.recording_radius_mm,
                           "smoothing_sigma_mm": selection.smoothing_sigma_mm,
                           "n_localizer_images": int(len(localizer_images)),
                           "localizer_preferred": localizer.positive},
        "conditions": [c.to_dict() for c in conditions],
        "stimulation_scale": stimulation_scale,
        "safety": spec.safety if spec.safety is not None else "not applicable: no electrical stimulation",
        "trials": trials.record(),
        "comparison": None if data is None else dict(data.attrs),
        "notes": notes,
        "device": str(device),
        "scheduler": scheduler if scheduler is None or isinstance(scheduler, str) else type(scheduler).__name__,
        "torch_threads": created["torch_threads"],  # float32 sums round in another order with another count
        "created_utc": created["created_utc"],
        "software": created["software"],
    })
    dataset = _results_dataset(probabilities, metrics, selection, data, sheet, layer)
    dataset.attrs.update({
        "experiment": spec.name, "paradigm": spec.paradigm, "model": model_record["name"], "layer": layer,
        "experiment_json": json.dumps(config["experiment"], sort_keys=True),
        "model_json": json.dumps(config["model"], sort_keys=True),
        "safety_json": json.dumps(config["safety"], sort_keys=True),
        "comparison_json": json.dumps(config["comparison"], sort_keys=True),
        "software_json": json.dumps(config["software"], sort_keys=True),
        "created_utc": config["created_utc"],
        "notes": "; ".join(notes),
    })
    results.write(RESULTS_FILE, lambda tmp: dataset.to_netcdf(tmp, engine="h5netcdf"))
    results.write_json(DECODER_FILE, trials.frozen_decoder.to_dict())
    if figures:
        plot_sites(selection, sheet, results / "sites.png",
                   f"{spec.name}: sites by {selection.method}\nlayer {sheet.name}, {scale:.3g} cortex mm per model mm")
        paradigm.figures(task, dataset, results)
        if data is not None:
            comparison.figure(task, dataset, data, summary, results)
    results.write_json(CONFIG_FILE, config)
    results.write_json(SUMMARY_FILE, summary)
    results.finish()
    return summary


# --- inputs -------------------------------------------------------------------------------------
def _check_decoder_layer(spec: ExperimentSpec, model, layer: str) -> None:
    """Check the file's ``[decoder] layer`` before any work: a layer of the model, at or after the stimulated one."""
    decoder_layer = (spec.raw.get("decoder") or {}).get("layer")
    if decoder_layer is None:
        return
    try:
        resolved = model.resolve_layer(decoder_layer)
    except ConfigError as exc:
        raise ConfigError(f"{spec.source} [decoder]: 'layer': {exc}") from None
    if model.stage_names.index(resolved) < model.stage_names.index(layer):
        raise ConfigError(f"{spec.source} [decoder]: 'layer' = {decoder_layer!r} ({resolved}) comes before the "
                          f"stimulated layer {spec.layer!r} ({layer}), so stimulation could not reach the decoder; "
                          f"give the stimulated layer or a later one")


def _resolve_additive_scale(spec: ExperimentSpec, responses: np.ndarray, layer: str, notes: list) -> dict:
    """What ``additive_scale`` means in this run (recorded in ``config.json``); with ``"sd"`` the
    layer's SD over the localizer images and units, and the activation_per_Hz it gives."""
    if spec.additive_scale != "sd":
        return {"additive_scale": spec.additive_scale}
    record = additive_scale_record(spec.perturbation.activation_per_Hz, responses)
    notes.append(f"additive_scale = \"sd\": activation_per_Hz = {spec.perturbation.activation_per_Hz} SD of layer "
                 f"{layer!r} per Hz × SD {record['layer_sd']:.6g} (its response to {len(responses)} localizer images) = "
                 f"{record['activation_per_Hz']:.6g} activation units per Hz")
    return record


def _warn_untouched_sites(conditions: list, sheet, notes: list) -> None:
    """Warn (and record it) when a condition's perturbation changes no unit of the sheet (e.g. a Tehovnik disc so
    small that it holds no unit): that site's result is the control's by construction."""
    untouched = [condition.label for condition in conditions if condition.perturbations and all(
        np.all(effect.multiplier == 1) and np.all(effect.additive == 0)
        for effect in (perturbation.effect(sheet) for perturbation in condition.perturbations))]
    if untouched:
        shown = ", ".join(untouched[:5]) + (f" and {len(untouched) - 5} more" if len(untouched) > 5 else "")
        message = (f"{len(untouched)} of {len(conditions) - 1} sites reach no unit of the sheet ({shown}): their "
                   "perturbation changes nothing, so their results equal the control's (a larger current or radius "
                   "reaches units)")
        notes.append(message)
        warnings.warn(message, stacklevel=3)


#: Keys of an electrical [stimulation] table that a static feed-forward model does not respond to (recorded; the
#: pulse width also enters the safety gate's charge per phase).
TIMING_KEYS = ("pulse_width_ms", "interphase_ms", "train_ms", "onset_ms", "waveform")


def _note_timing_without_effect(stimulation: dict, notes: list) -> None:
    """Note (in config.json) the timing keys the file sets that the model's responses do not depend on, so that a
    sweep of them is not read as a null result of the brain."""
    given = [key for key in TIMING_KEYS if key in stimulation]
    if given and stimulation.get("kind", "electrical") == "electrical":
        notes.append(f"[stimulation] {', '.join(given)}: a static feed-forward model's responses do not depend on "
                     "them (recorded; the pulse width enters the safety gate's charge per phase); runs that differ "
                     "only there give the same results")


def _warn_signed_gain(conditions: list, sheet, responses: np.ndarray, notes: list) -> None:
    """Warn once per run (and record it) when a gain > 1 acts on a layer with negative activity."""
    for condition in conditions:
        for perturbation in condition.perturbations:
            message = signed_gain_warning(perturbation, sheet, responses)
            if message is not None:
                notes.append(message)
                warnings.warn(message, stacklevel=3)
                return


def load_stimuli(sets, labels, model, notes: list, where: str) -> StimulusSet:
    """The images of ``sets`` (tables for ``load_stimulus_source``, optionally ``heldout_only``) in
    one set that keeps the ``labels`` named, as text, plus ``source_set`` (the set's name).

    ``heldout_only`` keeps the images listed in the model's ``metadata["holdout_stimulus_ids"]``, and every image
    of a source its training took no image from (written to ``notes``); a model that lists no held-out images
    keeps all images, which is written to ``notes`` and warned about."""
    from stimsim.training.evaluation import training_sources, training_took_from

    held = set(model.metadata.get("holdout_stimulus_ids", []))
    trained_on = training_sources(model)
    parts = []
    for index, entry in enumerate(sets):
        params = dict(entry)
        heldout_only = params.pop("heldout_only", False)
        loaded = load_stimulus_source(params, f"{where} sets[{index}]")
        if heldout_only:
            if training_took_from(model, params) is False:
                source = repr(params.get("source")) + (f" split {params['split']!r}" if "split" in params else "")
                other_split = f"; of {params.get('source')!r}, from another split" if params.get("source") in \
                    trained_on else ""
                notes.append(f"{where} sets[{index}] ({loaded.name}): heldout_only keeps all {len(loaded)} images: "
                             f"model {model.name!r} was trained on none of source {source} (its training took "
                             f"images from {sorted(trained_on)}{other_split})")
            elif not held:
                message = (f"{where} sets[{index}] ({loaded.name}): heldout_only requested but model "
                           f"{model.name!r} lists no held-out stimuli; all {len(loaded)} images are used")
                notes.append(message)
                warnings.warn(message, stacklevel=2)
            else:
                keep = np.array([sid in held for sid in loaded.stimulus_id])
                if not keep.any():
                    raise ConfigError(f"{where} sets[{index}] ({loaded.name}): none of its images is among the "
                                      f"{len(held)} the model's training held out")
                loaded = loaded.subset(keep)
        missing = [label for label in labels if label not in loaded.labels]
        if missing:
            raise ConfigError(f"{where} sets[{index}] ({loaded.name}): no label(s) {missing}; it has "
                              f"{sorted(loaded.labels)}")
        for message in input_geometry_notes(loaded, model.preprocessing.size_px, f"{where} sets[{index}] "
                                                                                  f"({loaded.name})"):
            notes.append(message)
            warnings.warn(message, stacklevel=2)
        for label in labels:
            blank = _missing_label_values(loaded.labels[label])
            if blank.any():
                shown = ", ".join(loaded.stimulus_id[blank][:3].tolist()) + (", ..." if blank.sum() > 3 else "")
                raise ConfigError(f"{where} sets[{index}] ({loaded.name}): label {label!r} is empty for "
                                  f"{int(blank.sum())} of {len(loaded)} images ({shown}); the task sorts the images "
                                  f"by it, so give every image a value (or leave those images out)")
        kept = {label: np.asarray(loaded.labels[label]).astype(str) for label in labels}
        kept["source_set"] = np.full(len(loaded), loaded.name)
        parts.append(StimulusSet(name=loaded.name, images=loaded.images, stimulus_id=loaded.stimulus_id,
                                 labels=kept))
    try:
        stimuli = StimulusSet.concat(*parts)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    _note_repeated_images(stimuli, notes, where)
    return stimuli


def _note_repeated_images(stimuli: StimulusSet, notes: list, where: str) -> None:
    """Warn (and note) images whose pixels repeat another's under another stimulus id: such a picture may be among
    both the images that fit the frozen decoder and the images it is tested on."""
    first, repeats = {}, []
    for stimulus_id, image in zip(stimuli.stimulus_id, stimuli.images):
        key = hashlib.sha256(str(image.shape).encode() + np.ascontiguousarray(image).tobytes()).digest()
        if key in first:
            repeats.append(f"{stimulus_id} = {first[key]}")
        first.setdefault(key, stimulus_id)
    if repeats:
        shown = ", ".join(repeats[:3]) + (f" and {len(repeats) - 3} more" if len(repeats) > 3 else "")
        message = (f"{where}: {len(repeats)} image(s) have the same pixels as another image under another stimulus "
                   f"id ({shown}); a repeated picture may be both among the images that fit the decoder and among "
                   "those it is tested on (leave the copies out)")
        notes.append(message)
        warnings.warn(message, stacklevel=3)


def _missing_label_values(values) -> np.ndarray:
    """Which images have no value of a label: empty (or blank) text, or NaN (an empty cell of a numeric column)."""
    values = np.asarray(values)
    if values.dtype.kind == "f":
        return np.isnan(values)
    return np.char.strip(values.astype(str)) == ""


def _load_model(spec: ExperimentSpec, model):
    """The model and the record stored with results (name, where from, checksums)."""
    if isinstance(model, TopographicModel):
        return model, {"name": model.name, "source": "in-memory model", "state_sha256": state_sha256(model.network.state_dict())}
    if model is not None and not isinstance(model, (str, Path)):
        raise ConfigError(f"model must be a name, a model directory or a TopographicModel, got {type(model).__name__}")
    try:
        directory = model_path(spec.model)
    except DataError as exc:
        raise DataError(f"{spec.source}: {'--model' if model is not None else repr('model')}: {exc}") from None
    topo = load_model(directory)
    record = {"name": topo.name, "source": str(directory),
              "weights_sha256": sha256_of(directory / "weights.pt"),
              "model_json_sha256": sha256_of(directory / "model.json"),
              "state_sha256": state_sha256(topo.network.state_dict())}
    return topo, record


def _safety_arguments(spec: ExperimentSpec) -> dict:
    """The experiment's safety limits and override reason, for the engine's own safety gate."""
    if spec.safety is None:
        return {}
    return {"safety_limits": SafetyLimits(**spec.safety["limits"]), "safety_override": spec.safety["override_reason"]}


# --- outputs ------------------------------------------------------------------------------------
def _results_dataset(probabilities: xr.DataArray, metrics: xr.Dataset, selection: SiteSelection,
                     data: xr.Dataset | None, sheet, layer: str) -> xr.Dataset:
    renames = {name: f"condition_{name}" for name in ("site_x_mm", "site_y_mm") if name in probabilities.coords}
    probabilities = probabilities.rename(renames)
    dataset = xr.Dataset({"choice_probability": probabilities})
    sites = selection.sites
    dataset = dataset.merge(metrics.assign_coords(
        site_x_mm=("site", [s.x_mm for s in sites]), site_y_mm=("site", [s.y_mm for s in sites]),
        site_group=("site", np.array([s.group for s in sites], dtype=object)),
        site_dprime=("site", [s.dprime for s in sites]), site_n_units=("site", [s.n_units for s in sites]),
        distance_to_peak_mm=("site", selection.distance_to_peak_mm()),
    ))
    dataset["unit_dprime"] = xr.DataArray(
        selection.unit_dprime, dims=("unit",),
        coords={"unit": np.arange(sheet.n_units), "unit_x_mm": ("unit", sheet.coordinates_mm[:, 0]),
                "unit_y_mm": ("unit", sheet.coordinates_mm[:, 1])},
        attrs={"layer": layer, "description": "d′ of each unit, localizer preferred class vs the rest"})
    if data is not None:
        dataset = dataset.merge(data)
    for name in ("site_x_mm", "site_y_mm", "condition_site_x_mm", "condition_site_y_mm", "unit_x_mm", "unit_y_mm",
                 "distance_to_peak_mm"):
        if name in dataset.coords:
            dataset[name].attrs["frame"] = ("cortex mm on the IT sheet, at the run's scale (config.json: the model's "
                                            "recorded scale unless overridden)")
    for name in [*dataset.data_vars, *dataset.coords]:  # every quantity whose name ends in its unit
        unit = next((unit for suffix, unit in UNIT_SUFFIXES.items() if str(name).endswith(suffix)), None)
        if unit is not None:
            dataset[name].attrs.setdefault("units", unit)
    return dataset


def load_results(out_dir) -> tuple[xr.Dataset, dict, dict]:
    """Read a run's ``results.nc``, ``summary.json`` and ``config.json`` back; a set that is
    incomplete or mixes files of different runs is refused (DataError)."""
    files = read_result_set(out_dir, required=(RESULTS_FILE, SUMMARY_FILE, CONFIG_FILE))
    paths = [files[RESULTS_FILE], files[SUMMARY_FILE], files[CONFIG_FILE]]
    dataset = xr.load_dataset(paths[0], engine="h5netcdf")
    return dataset, json.loads(paths[1].read_text()), json.loads(paths[2].read_text())
