"""``stimsim plan``: the site-planning job (Mehrer et al. 2025, arXiv 2510.03684, made into a tool).

Phases, each cached in ``DIR/cache/`` when finished so a killed plan resumes where it stopped (a cache
made with other parameters is refused, never mixed in; a cached file that was changed, or whose inputs did, is
computed again: :mod:`stimsim.planning.cache`):

1. inputs — the lab's recordings and images, or a virtual subject made from its file (``DIR/subject/``,
   recordings generated on the fly); the safety gate runs first, so a refused protocol stops the plan
   before any work;
2. mapping — every candidate model's cross-validated ridge predictivity, its registration of the array
   on the model's IT sheet and the registration bootstrap (:mod:`stimsim.mapping`);
3. design (tasks that have one) — on the best candidate, the task's stimuli at every working electrode's
   mapped site (the 2AFC's image sequences along each site's tuning);
4. rehearsal — the plan's task (:mod:`stimsim.planning.tasks`) in every candidate at its own mapped sites,
   without and with stimulation at the fitted pose and at every bootstrap pose;
5. ranking and constraints — the predicted effect per electrode (ΔAUC for the 2AFC) = mean over candidates
   (fitted pose), its interval = 2.5–97.5 percentiles over candidates × poses (fitted and bootstrap); greedy
   choice under the lab's constraints;
6. truth (virtual subject only, never used by the phases above) — the subject's own decoders and its
   true electrode positions give the true effect of the same stimuli; ``predicted_vs_true_r``.

Over 500 lines: the plan's phases in the order they run, sharing its inputs and the phase cache.
"""
from __future__ import annotations

import copy
import math
import shutil
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from stimsim.analysis.plan_readback import mark_plan_unfinished, write_plan_files
from stimsim.behavior.metrics import finite_pearson
from stimsim.models.preprocessing import input_geometry_notes
from stimsim.planning.cache import PhaseCache, directory_files_sha256
from stimsim.planning.config import PlanConfig
from stimsim.planning.detectability import INTERVAL_SPANS, coverage, subject_error_sd, with_subject_error
from stimsim.planning.selection import (check_broken, choose_sites, left_out_message, screen_electrodes,
                                        shortfall_message)
from stimsim.planning.tasks import stimulation_at
from stimsim.stimulation import additive_scale_record, enforce
from stimsim.stimulation.safety import charge_per_phase_nC
from stimsim.utilities.errors import ConfigError, DataError, SafetyError, StimsimError
from stimsim.utilities.hashing import json_sha256, sha256_of
from stimsim.utilities.io import (atomic_save, atomic_write_json, atomic_write_text, csv_text, provenance,
                                  remove_temporaries)
from stimsim.utilities.progress import report_phase

IT = "IT"
#: The virtual subject's key beside the candidates' names in the resolved additive scales.
SUBJECT = "virtual_subject"


def model_checksums(name: str) -> dict:
    """sha256 of a model's weights file (and the model.json listing every file)."""
    from stimsim.models.registry import model_path

    directory = model_path(name)
    return {"model.json": sha256_of(directory / "model.json"), "weights.pt": sha256_of(directory / "weights.pt")}


def _stimulation_report(config: PlanConfig) -> dict:
    try:
        stim = stimulation_at((0.0, 0.0), config.stimulation)
    except ConfigError as exc:
        raise ConfigError(f"{config.path} [stimulation]: {exc}") from None
    try:
        report = enforce(stim, config.safety, override=config.safety_override)
    except SafetyError as exc:
        raise SafetyError(f"{config.path} [stimulation] current_uA = {stim.current_uA:g}, pulse_width_ms = "
                          f"{stim.pulse_width_ms:g}: {exc}") from None
    return report.to_dict()


class PlanInputs:
    """Recordings, images and layout the plan works from (and the virtual subject, if any)."""

    def __init__(self, config: PlanConfig, out_dir: Path, progress: bool, subject_seed: int | None = None,
                 device="cpu"):
        from stimsim.lab.recordings import load_recordings

        self.device = device
        self.subject = None
        self.subject_dir = None
        self.made_subject = False
        if config.recordings is None:
            from stimsim.subject import VirtualSubject
            from stimsim.subject.directory import check_subject_files, read_stimuli_npz

            if config.subject_dir is not None:
                self.subject_dir = config.subject_dir
            else:
                self.subject_dir = out_dir / "subject"
                if not (self.subject_dir / "truth.json").is_file():
                    report_phase("plan: making the virtual subject and its recordings", progress)
                    subject = VirtualSubject.from_file(config.subject_config)
                    if subject_seed is not None:  # from the file as read: its relative paths resolved
                        raw = copy.deepcopy(subject.config)
                        raw["subject"] = {**raw["subject"], "seed": int(subject_seed)}
                        raw["array"] = {key: value for key, value in raw.get("array", {}).items() if key != "pose"}
                        subject = VirtualSubject.create(raw, source=str(config.subject_config), model=subject.source_model)
                        subject.config_dir = config.subject_config.parent
                    subject.model.to(device)
                    subject.save(self.subject_dir)
                    self.made_subject = True
                else:
                    report_phase(f"plan: reusing the virtual subject in {self.subject_dir}", progress)
            check_subject_files(self.subject_dir)
            recordings = load_recordings(self.subject_dir / "recordings.nc")
            self.images = read_stimuli_npz(self.subject_dir / "stimuli.npz")
            cmp_map = _subject_map(self.subject_dir)
            layout = recordings.layout if cmp_map is None else cmp_map
        else:
            from stimsim.lab.arrays.layout import cmp_options, load_layout
            from stimsim.subject.virtual import build_stimuli

            layout = load_layout(config.recordings["layout"], **cmp_options(
                config.recordings["layout"], config.recordings["layout_ids"], config.recordings["pitch_mm"]))
            # a lab's files in any row order give the same plan: images by id, presentations by image
            images = build_stimuli(config.recordings["images"], str(config.path), "[recordings] images")
            self.images = images.subset(np.argsort(images.stimulus_id, kind="stable"))
            recordings = load_recordings(config.recordings["path"], names=config.recordings["names"] or None,
                                         layout=layout, stimulus_ids=self.images.stimulus_id,
                                         images_source=f"the images of {config.path} [recordings] images",
                                         electrode_group=config.recordings["electrode_group"],
                                         broken_electrodes=config.selection.broken_electrodes).in_canonical_order()
            self.images = _recorded_images_only(self.images, recordings, f"{config.path} [recordings] images")
        self.recordings = recordings
        self.layout = recordings.layout
        self.array_layout = layout  # every electrode of the array, recorded or not (the anatomical reference)
        self.per_image = recordings.per_image()
        from stimsim.mapping.registration import MIN_REGISTRATION_IMAGES

        needed = max(2 * config.n_folds, MIN_REGISTRATION_IMAGES)
        if self.per_image.sizes["stimulus_id"] < needed:
            raise ConfigError(f"{config.path} [models]: the recordings hold {self.per_image.sizes['stimulus_id']} "
                              f"images, fewer than the n_folds = {config.n_folds} ridge folds need ({needed}: 2 per "
                              f"fold, and at least {MIN_REGISTRATION_IMAGES} for the registration)")
        check_broken(config.selection.broken_electrodes, layout.electrode_ids,  # recorded or not
                     where=f"{config.path} [array] broken_electrodes")
        reference = str((config.anatomical or {}).get("reference", "centre"))
        if reference != "centre" and reference not in layout.electrode_ids:
            raise ConfigError(f"{config.path} [array] anatomical: reference {reference!r} is not an electrode of the "
                              f"array {layout.name!r} (ids e.g. {list(layout.electrode_ids[:6])}) nor \"centre\"")

    def load_subject(self):
        from stimsim.subject import VirtualSubject

        if self.subject is None and self.subject_dir is not None:
            self.subject = VirtualSubject.load(self.subject_dir)
            self.subject.model.to(self.device)
        return self.subject


def _subject_map(subject_dir: Path):
    """The Blackrock map of a virtual subject whose array comes from a .cmp file (its banks and labels), else None."""
    from stimsim.lab.arrays.layout import cmp_options, load_layout
    from stimsim.utilities.config import load_toml

    array = load_toml(subject_dir / "subject.toml").get("array", {})
    spec = str(array.get("layout", "10x10"))
    if not spec.lower().endswith(".cmp"):
        return None
    return load_layout(subject_dir / spec, **cmp_options(spec, array.get("layout_ids", "channel"),
                                                         array.get("pitch_mm")))


def _reliability(config: PlanConfig, recordings):
    """Per-electrode split-half reliability of the recordings; None when it is not asked for
    (``min_reliability = -1``) and some image was shown only once."""
    if config.min_reliability <= -1 and int(recordings.repeats().min()) < 2:
        return None
    try:
        return recordings.split_half_reliability(seed=config.seed)
    except DataError as exc:
        raise DataError(f"{exc}; [array] min_reliability = -1 in {config.path} plans without it (every electrode "
                        f"neither broken nor constant counts as working)") from None


def _screen(config: PlanConfig, inputs: PlanInputs, reliability: dict | None) -> tuple[list, dict]:
    """The working electrodes in array order — the sites' seeded noise is drawn in this order, not the order a lab's
    file lists its channels in — and the recorded ones left out, by reason (:func:`screen_electrodes`)."""
    response = inputs.recordings.response
    constant = response["electrode"].values[np.ptp(response.values, axis=0) == 0]
    return screen_electrodes(inputs.layout.in_array_order(inputs.layout.electrode_ids),
                             config.selection.broken_electrodes, reliability, config.min_reliability, constant)


def _mapping_phase(config: PlanConfig, inputs: PlanInputs, models: dict, progress: bool) -> dict:
    from stimsim.mapping import (RegistrationProblem, RegistrationSettings, bootstrap_registration, register,
                                 select_model)

    reliability = _reliability(config, inputs.recordings)
    rel = {} if reliability is None else {str(e): float(v) for e, v in zip(reliability["electrode"].values,
                                                                              reliability.values)}
    working, left_out = _screen(config, inputs, None if reliability is None else rel)
    if len(working) < 3:
        why = left_out_message(left_out, config.min_reliability)
        raise ConfigError(f"{config.path} [array]: only {len(working)} electrode(s) are working (not broken, split-half "
                          f"reliability >= min_reliability = {config.min_reliability}); at least 3 are needed"
                          + (f"; {why}" if why else ""))
    report_phase(f"plan: model selection over {len(models)} candidate(s), {config.n_folds}-fold ridge", progress)
    table, scores = select_model(inputs.per_image.sel(electrode=working), models, inputs.images,
                                 n_folds=config.n_folds, seed=config.seed)
    registrations, bootstraps = {}, {}
    for name, model in models.items():
        report_phase(f"plan: registering the array on {name}", progress)
        try:  # one pooled sheet per model for the fit and its bootstrap
            problem = RegistrationProblem(inputs.per_image, model, inputs.images, inputs.layout,
                                          RegistrationSettings(allow_scale=config.allow_scale), working)
        except ConfigError as exc:  # e.g. an array that fits the sheet at no pose
            where = (f"{config.path} [recordings] layout" if config.recordings is not None
                     else f"{config.subject_config or config.subject_dir} [array] layout")
            raise ConfigError(f"{where}: {exc}") from None
        registration = register(inputs.per_image, model, inputs.images, inputs.layout, seed=config.seed,
                                reliability=reliability, problem=problem)
        boot = bootstrap_registration(inputs.per_image, model, inputs.images, inputs.layout, n_boot=config.n_boot,
                                      seed=config.seed, reference=registration, problem=problem, progress=progress)
        registrations[name] = registration.to_dict()
        bootstraps[name] = boot.to_dict()
    return {"selection": table.to_dict(orient="list"), "working": working, "reliability": rel,
            "registrations": registrations, "bootstraps": bootstraps,
            "predictivity": {name: {str(e): float(v) for e, v in zip(r2["electrode"].values, r2.values)}
                             for name, r2 in scores.items()}}


def _points(layout, pose_dicts, electrodes) -> np.ndarray:
    """(n_electrodes, n_poses, 2) sheet points of ``electrodes`` under each pose."""
    from stimsim.lab.arrays import ArrayPose

    index = [layout.index_of(e) for e in electrodes]
    return np.stack([layout.on_sheet(ArrayPose.from_dict(p))[index] for p in pose_dicts], axis=1)


def plan_once(config: PlanConfig, out_dir: Path, progress: bool = True, subject_seed: int | None = None,
              write_report: bool = True, compute: dict | None = None, n_random_poses: int = 0,
              created: bool | None = None) -> dict:
    """One plan: every phase, then the outputs (``write_report`` False: summary.json, sites.csv and the truth
    only). ``subject_seed`` makes the virtual subject with that seed (another hidden pose). ``compute``:
    ``device`` (a torch.device), ``scheduler`` (None or a distributed.Client) and ``scheduler_description``
    (recorded in config.json), as :func:`run_plan` sets them; default: the CPU, this process.
    ``n_random_poses`` > 0 (virtual subjects): every candidate also rehearses the sequences at that many random
    registrations of the array on its sheet (rotation uniform, centre uniform where the array fits), the null
    of ``predicted_vs_true_r`` (``random_pose_r``, ``random_pose_r_p95`` in summary.json). ``created``: whether
    this run made ``out_dir`` (removed again when the inputs or mapping fail; default: whether it is missing now).
    Candidates on the same trunk (e.g. two MobileNetV2 instances) compute each image's trunk output once
    (:mod:`stimsim.models.shared_trunk`)."""
    from stimsim.models.shared_trunk import shared_trunk_outputs

    with shared_trunk_outputs():
        return _plan_once(config, out_dir, progress, subject_seed, write_report, compute, n_random_poses, created)


def _plan_once(config: PlanConfig, out_dir: Path, progress: bool, subject_seed: int | None, write_report: bool,
               compute: dict | None, n_random_poses: int, created: bool | None) -> dict:
    safety = _stimulation_report(config)  # refuses an unsafe protocol before anything is computed
    compute = {"device": "cpu", "scheduler": None, "scheduler_description": None, **(compute or {})}
    created = not Path(out_dir).exists() if created is None else created
    cache_created = not (Path(out_dir) / "cache").exists()
    subject_created = not (Path(out_dir) / "subject").exists()
    try:  # bad input found while reading the inputs or mapping leaves nothing behind
        record = config.digest_record()  # the input files hashed once
        suffix = (f"-subject{subject_seed}" if subject_seed is not None else "") + (
            f"-random{n_random_poses}" if n_random_poses else "")
        cache = PhaseCache(out_dir, json_sha256(record) + suffix, progress=progress,
                           record={**record, "subject_seed": subject_seed, "random_poses": n_random_poses})
        started = time.perf_counter()
        inputs = PlanInputs(config, out_dir, progress, subject_seed, device=compute["device"])
        plan_task = config.plan_task
        prepared = plan_task.prepare(config.task_options, inputs.images, config.seed, str(config.path))
        models, scales = load_candidates(config.candidates, device=compute["device"])
        if inputs.subject_dir is None:  # a subject's images were noted when it was made
            for size_px in sorted({model.preprocessing.size_px for model in models.values()}):
                for message in input_geometry_notes(inputs.images, size_px, f"{config.path} [recordings] images"):
                    warnings.warn(message, stacklevel=2)
        every_model = {**models, **({SUBJECT: inputs.load_subject().model} if inputs.subject_dir else {})}
        _check_stimulation_fits(config, every_model)
        plan_task.check_memory(config.task_options, every_model, len(inputs.layout.electrode_ids), str(config.path))
        cache.timings["inputs"] = {"seconds": round(time.perf_counter() - started, 3),
                                   "cached": not inputs.made_subject, "compute_seconds": None}
        remove_temporaries(out_dir, Path(out_dir) / "truth")
        cache.bind(config.portable({
            "subject_files": directory_files_sha256(inputs.subject_dir) if inputs.subject_dir else {},
            "models": {name: model_checksums(name) for name in models}}))
        mapping = cache.json("mapping", lambda: _mapping_phase(config, inputs, models, progress))
    except (StimsimError, FileNotFoundError):
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        else:  # an --out made beforehand keeps only what it held
            for part, made in (("cache", cache_created), ("subject", subject_created)):
                if made:
                    shutil.rmtree(Path(out_dir) / part, ignore_errors=True)
        raise
    chosen_model = mapping["selection"]["model"][0]
    working = mapping["working"]
    layout = inputs.layout

    def registered_points(name):
        reg = mapping["registrations"][name]
        poses = [reg["pose"]] + mapping["bootstraps"][name]["poses"]
        return _points(layout, poses, working)

    phases = ("mapping.json",)
    additive = {}
    if config.additive_scale == "sd":
        additive = cache.json("additive_scale", lambda: _additive_scales(config, inputs, models), after=phases)
        phases += ("additive_scale.json",)
    task = prepared
    if plan_task.design_phase is not None:
        design_points = registered_points(chosen_model)[:, 0]
        companions = [(models[name], registered_points(name)[:, 0]) for name in models if name != chosen_model]
        task = cache.arrays(plan_task.design_phase, lambda: plan_task.design(
            config.task_options, prepared, models[chosen_model], design_points, config.seed, progress, companions),
            after=phases)
        phases += (f"{plan_task.design_phase}.npz",)
    engine = {"safety_limits": config.safety, "safety_override": config.safety_override,
              "scheduler": compute["scheduler"]}
    phase = partial(_rehearsal_phase, engine=engine)
    stimulation_of = partial(_stimulation_in, config, additive)
    effect, probability = plan_task.effect, plan_task.probability
    rehearsals = {}
    for index, (name, model) in enumerate(models.items()):
        def rehearse_model(model=model, name=name, index=index):
            points = registered_points(name)
            stimulation = stimulation_of(name)
            if not n_random_poses:
                return phase(config, model, task, points, stimulation, progress)
            random = random_registrations(layout, model.sheet(IT), n_random_poses,
                                          seed=(config.seed, subject_seed or 0, index))
            both = np.concatenate([points, _points(layout, random, working)], axis=1)
            result = phase(config, model, task, both, stimulation, progress)
            registered = points.shape[1]
            result["random_effect"] = result[effect][:, registered:]
            result[effect] = result[effect][:, :registered]
            result[probability] = result[probability][:, :registered + 1]
            return result
        rehearsals[name] = cache.arrays(f"rehearsal_{_cache_key(list(models), name)}", rehearse_model, after=phases)
    plan = _assemble(config, inputs, mapping, chosen_model, rehearsals, registered_points)
    percepts = None
    if config.percepts is not None and write_report:
        rehearsed = tuple(f"rehearsal_{_cache_key(list(models), name)}.npz" for name in models)
        percepts = _percepts_phase(config, out_dir, cache, chosen_model, plan, working, progress, phases + rehearsed,
                                   compute["device"])
    if write_report:  # until every output below is written again (a validation pose writes no file list)
        mark_plan_unfinished(out_dir)
    truth = truth_file = None
    if inputs.subject_dir is not None:
        truth = cache.arrays("truth", lambda: _truth_phase(config, inputs.load_subject(), working, task,
                                                           stimulation_of(SUBJECT), progress, engine), after=phases)
        truth_file = _write_truth(config, out_dir, truth, working, task)
    return _write_outputs(config, out_dir, inputs, mapping, chosen_model, task, rehearsals, plan, truth, truth_file,
                          safety, models, scales, write_report, compute, cache.timings, percepts,
                          additive or {"additive_scale": config.additive_scale})


def _percepts_phase(config, out_dir: Path, cache: PhaseCache, chosen_model: str, plan: dict, working, progress: bool,
                    after: tuple, device) -> dict:
    """The report's view of predicted percepts (plan table ``[percepts]``, :mod:`stimsim.percepts`): the visualisation
    file run on the chosen model, its stimulated site the best-ranked chosen site (the best-ranked site when none is
    chosen), its control site the lowest-ranked working electrode with a prediction farther than the view's
    ``recording_radius_mm``; the result set is
    ``DIR/percepts/`` (as ``stimsim visualize`` writes it), and what the report needs is cached."""
    import dataclasses

    from stimsim.percepts.visualize import PNG_FILE, load_config, run_config

    folder = Path(out_dir) / "percepts"
    order, chosen = list(plan["choice"]["order"]), list(plan["choice"]["chosen"])
    predicted = [int(i) for i in order if np.isfinite(plan["predicted"][i])]
    site = int(chosen[0]) if chosen else (predicted[0] if predicted else None)
    visualize = load_config(config.percepts, model=chosen_model)
    radius = visualize.sites["recording_radius_mm"]
    far = [] if site is None else [i for i in predicted if math.dist(plan["cortex_xy"][i], plan["cortex_xy"][site])
                                   > radius]
    if not far:
        raise ConfigError(f"{config.path} [percepts]: the percept view needs two working electrodes with a prediction "
                          f"more than recording_radius_mm = {radius:g} apart (a stimulated and a control site); the "
                          f"plan has {len(predicted)} with a prediction")
    control = far[-1]

    def compute():
        sites = {"method": "explicit", "recording_radius_mm": visualize.sites["recording_radius_mm"],
                 "face_site_mm": tuple(map(float, plan["cortex_xy"][site])),
                 "control_site_mm": tuple(map(float, plan["cortex_xy"][control]))}
        summary = run_config(dataclasses.replace(visualize, sites=sites), folder, progress, force=True, device=device)
        return {"folder": "percepts", "electrode": working[site], "control_electrode": working[control],
                "model": chosen_model, "judge_model": summary["judge_model"], "currents_uA": summary["currents_uA"],
                "summary_groups": summary["summary_groups"], "judges": summary["judges"], "sites": summary["sites"]}

    return cache.json("percepts", compute, after=after, outputs=(folder / PNG_FILE,))


def random_registrations(layout, sheet, n: int, seed) -> list:
    """``n`` random poses (dicts) of ``layout`` on ``sheet``: rotation uniform in [0, 360)°, centre uniform
    among the positions where the whole array lies on the sheet."""
    from stimsim.subject.virtual import random_pose

    rng = np.random.default_rng([*np.atleast_1d(seed), 0x5917])
    return [random_pose(layout, sheet, rng).to_dict() for _ in range(n)]


def load_candidates(names, device="cpu") -> tuple[dict, dict]:
    """Candidate models (on ``device``) with their IT sheets in cortex mm (each by its own recorded scale, see
    :meth:`stimsim.models.topographic.TopographicModel.in_cortex_mm`), and each model's scale record."""
    from stimsim.models.registry import load_model

    models, scales = {}, {}
    for name in names:
        models[name], scales[name] = load_model(name, device=device).in_cortex_mm("IT")
    return models, scales


def _cache_key(names: list, name: str) -> str:
    """A file-name-safe key for a candidate's cached phase, unique among ``names``: a shipped model's name as it
    is; a model directory by its whole path (two candidates' directories may share their last name, e.g.
    ``seed0/model`` and ``seed1/model``)."""
    keys = ["".join(c if c.isalnum() or c in "-_" else "_" for c in str(n)) for n in names]
    key = keys[names.index(name)]
    return key if keys.count(key) == 1 else f"{names.index(name)}_{key}"


def _onto_sheet(sheet, points: np.ndarray) -> np.ndarray:
    """Points moved to the nearest point of the sheet's extent; used only where the result is then marked
    as having no prediction (an electrode a registration maps off the sheet)."""
    x0, x1, y0, y1 = sheet.extent_mm
    return np.column_stack([np.clip(points[:, 0], x0, x1), np.clip(points[:, 1], y0, y1)])


def off_sheet(sheet, points: np.ndarray) -> np.ndarray:
    """Boolean mask of the points (..., 2) outside the sheet's extent (mm)."""
    x0, x1, y0, y1 = sheet.extent_mm
    return (points[..., 0] < x0) | (points[..., 0] > x1) | (points[..., 1] < y0) | (points[..., 1] > y1)


def _additive_scales(config, inputs, models: dict) -> dict:
    """``additive_scale = "sd"`` resolved in every model (candidates by name, the virtual subject as :data:`SUBJECT`):
    the SD of its IT response to the plan's mapping images, and the ``activation_per_Hz`` it gives
    (:func:`stimsim.stimulation.additive_scale_record`), so that one value is equally strong in models of any scale."""
    every = dict(models)
    if inputs.subject_dir is not None:
        every[SUBJECT] = inputs.load_subject().model
    per_Hz_sd = config.stimulation["activation_per_Hz"]
    scales = {}
    for name, model in every.items():
        try:
            scales[name] = additive_scale_record(per_Hz_sd, model.activations(inputs.images.images, IT).numpy())
        except ConfigError as exc:
            raise ConfigError(f"{config.path} [stimulation] in {name}: {exc}") from None
    return scales


def _check_stimulation_fits(config, models: dict) -> None:
    """ConfigError naming the model when the stimulation needs what a model lacks (e.g. resting activity for
    ``resting_fraction``), before any of the plan's work."""
    for name, model in models.items():
        try:
            sheet = model.sheet("IT")
            stimulation_at(sheet.centre_mm, config.stimulation).effect(sheet)
        except ConfigError as exc:
            raise ConfigError(f"{config.path} [stimulation] in {name}: {exc}") from None


def _stimulation_in(config, additive: dict, name: str) -> dict:
    """The plan's train as model ``name`` receives it (``activation_per_Hz`` in its activation units)."""
    if name not in additive:
        return config.stimulation
    return {**config.stimulation, "activation_per_Hz": additive[name]["activation_per_Hz"]}


def _rehearsal_phase(config, model, trials, points, stimulation: dict, progress, engine: dict) -> dict:
    """The plan's task in ``model`` at every electrode's mapped points (fitted pose, then bootstrap poses). A pose
    can send an electrode off the sheet: that (electrode, pose) has no prediction (NaN; left out of the pooled
    prediction and its interval); it is simulated at the nearest sheet point only to keep the batch
    rectangular."""
    plan_task = config.plan_task
    sheet = model.sheet(IT)
    outside = off_sheet(sheet, points)
    simulated = np.where(outside[..., None], _onto_sheet(sheet, points[:, 0])[:, None], points)
    result = plan_task.rehearse(model, config.task_options, trials, simulated, stimulation, config.seed, engine,
                                progress)
    result[plan_task.probability] = np.array(result[plan_task.probability], dtype=np.float64)
    result[plan_task.effect] = np.array(result[plan_task.effect], dtype=np.float64)
    result[plan_task.probability][:, 1:][outside] = np.nan
    result[plan_task.effect][outside] = np.nan
    return result


def _recorded_images_only(images, recordings, where: str):
    """The images the recordings presented (a lab's table may list more, e.g. every image of a stimulus library);
    those left out are named in a warning."""
    presented = np.isin(images.stimulus_id, np.unique(recordings.response["stimulus_id"].values.astype(str)))
    if presented.all():
        return images
    unused = images.stimulus_id[~presented]
    more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
    warnings.warn(f"{where}: {len(unused)} of {len(images)} images were not presented in the recordings "
                  f"({', '.join(unused[:3])}{more}); the plan uses the {int(presented.sum())} recorded images",
                  stacklevel=3)
    return images.subset(presented)


def _truth_phase(config, subject, working, trials, stimulation: dict, progress, engine: dict) -> dict:
    """The virtual subject's own results for the plan's stimuli: its decoders, its true positions."""
    sites = subject.electrode_sites_mm()
    points = np.array([sites[e] for e in working])[:, None, :]
    dead = np.array([e in set(subject.dead_electrodes) for e in working])
    result = config.plan_task.truth(subject.model, config.task_options, trials, points, stimulation, config.seed,
                                    engine, progress)
    return {**result, "dead": dead}


def _assemble(config, inputs, mapping, chosen_model, rehearsals, registered_points) -> dict:
    names = list(rehearsals)
    per_model = np.stack([rehearsals[n][config.effect].mean(-1) for n in names])  # (models, sites, poses)
    fitted = per_model[:, :, 0]  # (models, sites); NaN where a model's registration maps the site off its sheet
    count = np.isfinite(fitted).sum(0)
    predicted = np.where(count > 0, np.nansum(fitted, axis=0) / np.maximum(count, 1), np.nan)
    variants = per_model.transpose(1, 0, 2).reshape(per_model.shape[1], -1)  # (sites, models × poses)
    low, high = np.full(len(predicted), np.nan), np.full(len(predicted), np.nan)
    some = np.isfinite(variants).any(1)
    low[some] = np.nanpercentile(variants[some], 2.5, axis=1)
    high[some] = np.nanpercentile(variants[some], 97.5, axis=1)
    working = mapping["working"]
    layout = inputs.layout
    index = [layout.index_of(e) for e in working]
    array_xy = layout.positions_mm[index]
    choice = choose_sites(working, array_xy, predicted, config.selection, array_ids=inputs.array_layout.electrode_ids)
    return {"predicted": predicted, "low": low, "high": high, "per_model": per_model, "choice": choice,
            "array_xy": array_xy, "cortex_xy": registered_points(chosen_model)[:, 0]}


def _write_truth(config, out_dir: Path, truth: dict, working, trials) -> str:
    """Write the virtual subject's own results; their path relative to ``out_dir`` (in POSIX form)."""
    name, data = config.plan_task.truth_dataset(working, truth, trials)
    atomic_save(out_dir / "truth" / name, lambda tmp: data.to_netcdf(tmp, engine="h5netcdf"))
    return f"truth/{name}"


#: Electrode resamples behind ``model_selection.p_ranked_first`` in summary.json.
SELECTION_BOOTSTRAP_RESAMPLES = 1000


def _selection_summary(mapping: dict, seed: int) -> dict:
    """summary.json's ``model_selection``: every candidate's median R² and how often it ranks first when the
    working electrodes are resampled (:func:`stimsim.mapping.selection_bootstrap`), in the working electrodes'
    order (a cached mapping.json keeps its keys in text order)."""
    from stimsim.mapping import selection_bootstrap

    table = mapping["selection"]
    scores = {name: [values[str(electrode)] for electrode in mapping["working"]]
              for name, values in mapping["predictivity"].items()}
    return {"median_r2": dict(zip(table["model"], table["median_r2"])),
            "p_ranked_first": selection_bootstrap(scores, SELECTION_BOOTSTRAP_RESAMPLES, seed),
            "n_boot": SELECTION_BOOTSTRAP_RESAMPLES,
            "method": "paired bootstrap over the working electrodes; chance 1/number of candidates"}


def _write_outputs(config, out_dir, inputs, mapping, chosen_model, task, rehearsals, plan, truth, truth_file, safety,
                   models, scales, write_report: bool, compute: dict, timings: dict, percepts: dict | None,
                   additive: dict) -> dict:
    from stimsim.models.registry import model_path
    from stimsim.planning.report import build_report

    plan_task = config.plan_task
    effect = plan_task.effect
    working = mapping["working"]
    order, chosen = plan["choice"]["order"], plan["choice"]["chosen"]
    anatomical = None
    if config.anatomical is not None:
        from stimsim.lab.arrays.anatomy import AnatomicalPose

        anatomical = AnatomicalPose.from_dict(config.anatomical).to_anatomical(inputs.array_layout, plan["array_xy"])
    charge = charge_per_phase_nC(config.stimulation["current_uA"], config.stimulation["pulse_width_ms"])
    verdict = "passed" if safety["passed"] else f"overridden: {safety['override_reason']}"
    factor = scales[chosen_model]["cortex_mm_per_model_mm"]
    plan = {**plan, "model_xy": models[chosen_model].sheet("IT").to_model_mm(plan["cortex_xy"])}
    rank_of = np.empty(len(working), dtype=np.int64)
    rank_of[order] = np.arange(1, len(working) + 1)
    subject_sd = subject_error_sd(plan["per_model"][:, :, 0])
    subject_low, subject_high = with_subject_error(plan["predicted"], plan["low"], plan["high"], subject_sd)
    rows = []
    for i in order:
        row = {"rank": int(rank_of[i]), "electrode_id": working[i]}
        row.update(inputs.array_layout.cerebus_numbers(working[i]) or {})
        row.update({"array_x_mm": plan["array_xy"][i, 0], "array_y_mm": plan["array_xy"][i, 1]})
        if anatomical is not None:
            row["ap_mm"], row["ml_mm"] = anatomical[i, 0], anatomical[i, 1]
        row.update({"model_x_mm": plan["model_xy"][i, 0], "model_y_mm": plan["model_xy"][i, 1],
                    "cortex_x_mm": plan["cortex_xy"][i, 0], "cortex_y_mm": plan["cortex_xy"][i, 1],
                    f"predicted_{effect}": plan["predicted"][i], f"predicted_{effect}_low": plan["low"][i],
                    f"predicted_{effect}_high": plan["high"][i], f"predicted_{effect}_subject_low": subject_low[i],
                    f"predicted_{effect}_subject_high": subject_high[i], "current_uA": config.stimulation["current_uA"],
                    "frequency_Hz": config.stimulation["frequency_Hz"],
                    "pulse_width_ms": config.stimulation["pulse_width_ms"], "charge_per_phase_nC": charge,
                    "safety_verdict": verdict, "chosen": bool(i in set(chosen.tolist())),
                    "status": plan["choice"]["reason"][i]})
        rows.append(row)
    sites = pd.DataFrame(rows)
    atomic_write_text(out_dir / "sites.csv", csv_text(sites, significant_digits=10))

    summary = {"name": config.name, "task": config.task, "n_sites": int(len(chosen)),
               "n_rehearsed": len(working), "chosen_electrodes": [working[i] for i in chosen],
               "current_uA": config.stimulation["current_uA"], "chosen_model": chosen_model,
               "candidate_models": list(models), "safety": safety, "lengths": "cortex mm unless named model mm",
               "cortex_scale": scales, "additive_scale": additive,
               "registration": {name: {"pose": reg["pose"], "mean_correlation": reg["mean_correlation"],
                                       "chance_mean_correlation_p95": reg["chance_mean_correlation_p95"]}
                                for name, reg in mapping["registrations"].items()},
               "registration_stability": {name: {k: boot[k] for k in ("sd_x_mm", "sd_y_mm", "sd_rotation_deg", "n_boot")}
                                          for name, boot in mapping["bootstraps"].items()},
               "effect": effect, "effect_label": plan_task.effect_label,
               f"predicted_{effect}_median": float(np.nanmedian(plan["predicted"])),
               "interval_spans": INTERVAL_SPANS, "model_to_subject_sd": subject_sd,
               "layout_description": inputs.array_layout.description or None,
               "model_selection": _selection_summary(mapping, config.seed),
               "candidate_base_networks": [models[name].base_network for name in models],
               "subject_base_network": None if inputs.subject_dir is None else inputs.load_subject().model.base_network,
               "phases": timings, "phases_seconds_total": round(sum(t["seconds"] for t in timings.values()), 3)}
    _, summary["left_out_electrodes"] = _screen(config, inputs, mapping["reliability"] or None)
    summary["left_out_warning"] = left_out_message(summary["left_out_electrodes"], config.min_reliability)
    if summary["left_out_warning"] is not None:
        warnings.warn(summary["left_out_warning"], stacklevel=2)
    summary["sites_warning"] = shortfall_message(plan["choice"], config.selection)
    if summary["sites_warning"] is not None:
        warnings.warn(summary["sites_warning"], stacklevel=2)
    summary.update(plan_task.summary(config.task_options, task, rehearsals, plan, working, models, config.rig,
                                     config.seed))
    if truth is not None:
        subject = inputs.load_subject()
        alive = ~truth["dead"] & np.isfinite(plan["predicted"])
        true = truth[effect].mean(-1) if truth[effect].ndim > 1 else truth[effect]
        r = float(np.corrcoef(plan["predicted"][alive], true[alive])[0, 1]) if alive.sum() > 2 else float("nan")
        summary.update({"subject_dir": str(inputs.subject_dir), "truth_file": truth_file, "predicted_vs_true_r": r,
                        "predicted_vs_true_r_per_model": {
                            name: finite_pearson(plan["per_model"][m, alive, 0], true[alive])
                            for m, name in enumerate(rehearsals)},
                        f"true_{effect}_median": float(np.median(true[alive])),
                        "true_effect_sd": _sd(true[alive]),
                        "interval_coverage_of_true": {
                            "interval": coverage(true[alive], plan["low"][alive], plan["high"][alive]),
                            "interval_with_subject": coverage(true[alive], subject_low[alive], subject_high[alive])},
                        **_random_pose_null(rehearsals, true, alive),
                        "subject_lapse_rate": subject.lapse_rate, "subject_id": subject.subject_id})
    # on a virtual subject, over the electrodes alive in it, as the true effects' SD
    summary["predicted_effect_sd"] = _sd(plan["predicted"] if truth is None else plan["predicted"][alive])
    summary[f"predicted_{effect}"] = {e: float(v) for e, v in zip(working, plan["predicted"])}
    if truth is not None:
        summary[f"true_{effect}"] = {e: float(v) for e, v in zip(working, true)}
        summary["dead_electrodes_rehearsed"] = [e for e, d in zip(working, truth["dead"]) if d]
    if not write_report:
        atomic_write_json(out_dir / "summary.json", summary)
        return summary
    dataset = _plan_dataset(config, working, task, rehearsals, plan, factor)
    atomic_save(out_dir / "plan.nc", lambda tmp: dataset.to_netcdf(tmp, engine="h5netcdf"))
    record = provenance(config.to_dict())
    record["model_checksums"] = {name: model_checksums(name) for name in models}
    record["model_directories"] = {name: str(model_path(name)) for name in models}
    record["device"] = str(compute["device"])
    record["scheduler"] = compute["scheduler_description"]
    record["cortex_scale"] = scales
    record["additive_scale"] = additive
    record["input_sha256"] = config.input_files()
    atomic_write_json(out_dir / "config.json", record)
    rig = plan_task.write_rig(out_dir, config.task_options, task, chosen, working, config.rig, config.stimulation,
                              config.seed, inputs.array_layout, config.name, models[chosen_model],
                              str(summary.get("subject_id", "subject")))
    if rig is not None:
        summary["rig"] = rig
    if percepts is not None:
        summary["percepts"] = percepts
    atomic_write_json(out_dir / "summary.json", summary)
    build_report(config, inputs, mapping, chosen_model, task, rehearsals, plan, sites, summary, truth,
                 models, record, out_dir).write(out_dir)
    data_files = ["summary.json", "sites.csv", "plan.nc", "config.json", *([truth_file] if truth_file else []),
                  *(["rig/trials.csv"] if (out_dir / "rig" / "trials.csv").is_file() else [])]
    write_plan_files(out_dir, data_files)
    return summary


def _random_pose_null(rehearsals, true, alive) -> dict:
    """r of the plans made at random registrations (mean over candidates, as the plan) against the true effect."""
    if not all("random_effect" in r for r in rehearsals.values()):
        return {}
    random = np.stack([r["random_effect"].mean(-1) for r in rehearsals.values()])  # (models, sites, n_random)
    predicted = np.nanmean(random, axis=0)
    values = [finite_pearson(predicted[alive, k], true[alive]) for k in range(predicted.shape[1])]
    return {"random_pose_r": values, "random_pose_r_p95": float(np.nanpercentile(values, 95)),
            "random_pose_r_median": float(np.nanmedian(values)), "n_random_poses": len(values)}


def _sd(values) -> float | None:
    """Sample SD (ddof 1) of the finite values; None (JSON null) with fewer than 2."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(np.std(values, ddof=1)) if values.size > 1 else None


def _plan_dataset(config, working, trials, rehearsals, plan, factor: float) -> xr.Dataset:
    """plan.nc: the task's variables, the pooled prediction with its interval, and every site's coordinates."""
    plan_task = config.plan_task
    effect = plan_task.effect
    variables, coords = plan_task.dataset_variables(working, trials, rehearsals)
    return xr.Dataset(
        {**variables, f"predicted_{effect}": ("electrode", plan["predicted"],
                                              {"description": "the prediction pooled over candidates and poses"}),
         **{f"predicted_{effect}_{end}": ("electrode", plan[end],
                                          {"description": f"{end} end of its 95 % interval over candidates and poses"})
            for end in ("low", "high")},
         **_site_coordinates(plan)},
        coords={"electrode": list(working), "model": list(rehearsals), "stimulated": [False, True], **coords},
        attrs={"task": config.task, "current_uA": config.stimulation["current_uA"], "cortex_mm_per_model_mm": factor,
               "description": f"stimsim plan: the {config.task} task with and without stimulation, predicted "
                              f"{plan_task.effect_label}"})


#: The frames of plan.nc's site coordinates.
_SITE_FRAMES = {"model": "on the chosen model's IT sheet, in the model's own mm",
                "cortex": "on the chosen model's IT sheet, in cortex mm (the model's recorded scale)",
                "array": "in the array's own frame (its layout's positions)"}


def _site_coordinates(plan) -> dict:
    return {f"{frame}_{axis}_mm": ("electrode", plan[f"{frame}_xy"][:, column],
                                   {"units": "mm", "description": f"site {axis} {where}"})
            for frame, where in _SITE_FRAMES.items() for column, axis in enumerate("xy")}
