"""``stimsim plan``: the site-planning job (Mehrer et al. 2025, arXiv 2510.03684, made into a tool).

Phases, each cached in ``DIR/cache/`` when finished so a killed plan resumes where it stopped (a cache
made with other parameters is refused, never mixed in; a cached file that was changed, or whose inputs did, is
computed again: :mod:`stimsim.planning.cache`):

1. inputs — the lab's recordings and images, or a virtual subject made from its file (``DIR/subject/``,
   recordings generated on the fly); the safety gate runs first, so a refused protocol stops the plan
   before any work;
2. mapping — every candidate model's cross-validated ridge predictivity, its registration of the array
   on the model's IT sheet and the registration bootstrap (:mod:`stimsim.mapping`);
3. sequences — on the best candidate, image sequences along every working electrode's mapped site;
4. rehearsal — the 2AFC task in every candidate at its own mapped sites, without and with stimulation
   at the fitted pose and at every bootstrap pose;
5. ranking and constraints — predicted ΔAUC per electrode = mean over candidates (fitted pose), its
   interval = 2.5–97.5 percentiles over candidates × bootstrap poses; greedy choice under the lab's
   constraints;
6. truth (virtual subject only, never used by the phases above) — the subject's own decoders and its
   true electrode positions give the true ΔAUC of the same sequences; ``predicted_vs_true_r``.

Over 500 lines: the plan's phases in the order they run, sharing its inputs and the phase cache.
"""
from __future__ import annotations

import shutil
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from stimsim.errors import ConfigError, DataError, SafetyError, StimsimError
from stimsim.hashing import sha256_of
from stimsim.io import atomic_save, atomic_write_json, atomic_write_text, csv_text, provenance
from stimsim.paradigms.sequence_2afc import fit_readouts
from stimsim.planning.cache import PhaseCache, directory_files_sha256, remove_temporaries
from stimsim.planning.config import PlanConfig
from stimsim.planning.detectability import (INTERVAL_SPANS, coverage, forecast, predicted_curves, subject_error_sd,
                                            with_subject_error)
from stimsim.planning.face_task import face_rehearsal, face_trials
from stimsim.planning.rehearsal import rehearse
from stimsim.planning.rig import trial_list, write_rig
from stimsim.planning.selection import (check_broken, choose_sites, left_out_message, ranking_reliability,
                                       screen_electrodes, shortfall_message)
from stimsim.progress import report_phase
from stimsim.sequences import build_sequences, excursion_warning, pooling_matrix
from stimsim.stimulation import enforce
from stimsim.stimulation.safety import charge_per_phase_nC

IT = "IT"


def model_checksums(name: str) -> dict:
    """sha256 of a model's weights file (and the model.json listing every file)."""
    from stimsim.models.registry import model_path

    directory = model_path(name)
    return {"model.json": sha256_of(directory / "model.json"), "weights.pt": sha256_of(directory / "weights.pt")}


def _stimulation_report(config: PlanConfig) -> dict:
    from stimsim.planning.rehearsal import stimulation_at

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
        from stimsim.recordings import load_recordings

        self.device = device
        self.subject = None
        self.subject_dir = None
        if config.recordings is None:
            from stimsim.subject import VirtualSubject
            from stimsim.subject.virtual import read_stimuli_npz

            if config.subject_dir is not None:
                self.subject_dir = config.subject_dir
            else:
                self.subject_dir = out_dir / "subject"
                if not (self.subject_dir / "truth.json").is_file():
                    report_phase("plan: making the virtual subject and its recordings", progress)
                    subject = VirtualSubject.from_file(config.subject_config)
                    if subject_seed is not None:
                        from stimsim.config import load_toml

                        raw = load_toml(config.subject_config)
                        raw["subject"] = {**raw["subject"], "seed": int(subject_seed)}
                        raw["array"] = {key: value for key, value in raw.get("array", {}).items() if key != "pose"}
                        subject = VirtualSubject.create(raw, source=str(config.subject_config), model=subject.source_model)
                        subject.config_dir = config.subject_config.parent
                    subject.model.to(device)
                    subject.save(self.subject_dir)
                else:
                    report_phase(f"plan: reusing the virtual subject in {self.subject_dir}", progress)
            recordings = load_recordings(self.subject_dir / "recordings.nc")
            self.images = read_stimuli_npz(self.subject_dir / "stimuli.npz")
            cmp_map = _subject_map(self.subject_dir)
            layout = recordings.layout if cmp_map is None else cmp_map
        else:
            from stimsim.arrays.layout import cmp_options, load_layout
            from stimsim.subject.virtual import build_stimuli

            layout = load_layout(config.recordings["layout"], **cmp_options(
                config.recordings["layout"], config.recordings["layout_ids"], config.recordings["pitch_mm"]))
            self.images = build_stimuli(config.recordings["images"], str(config.path), "[recordings] images")
            recordings = load_recordings(config.recordings["path"], names=config.recordings["names"] or None,
                                         layout=layout, stimulus_ids=self.images.stimulus_id,
                                         images_source=f"the images of {config.path} [recordings] images",
                                         electrode_group=config.recordings["electrode_group"])
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
    from stimsim.arrays.layout import cmp_options, load_layout
    from stimsim.config import load_toml

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
    from stimsim.arrays import ArrayPose

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
    this run made ``out_dir`` (removed again when the inputs or mapping fail; default: whether it is missing now)."""
    safety = _stimulation_report(config)  # refuses an unsafe protocol before anything is computed
    compute = {"device": "cpu", "scheduler": None, "scheduler_description": None, **(compute or {})}
    created = not Path(out_dir).exists() if created is None else created
    cache_created = not (Path(out_dir) / "cache").exists()
    try:  # bad input found while reading the inputs or mapping leaves nothing behind
        cache = PhaseCache(out_dir, config.digest() + (f"-subject{subject_seed}" if subject_seed is not None else "")
                           + (f"-random{n_random_poses}" if n_random_poses else ""), progress=progress)
        inputs = PlanInputs(config, out_dir, progress, subject_seed, device=compute["device"])
        face_task_trials = (face_trials(inputs.images, config.face_task, seed=config.seed, where=str(config.path))
                            if config.task == "face_categorization" else None)  # its images checked before any work
        models, scales = load_candidates(config.candidates, device=compute["device"])
        remove_temporaries(out_dir, Path(out_dir) / "truth")
        cache.bind({"subject_files": directory_files_sha256(inputs.subject_dir) if inputs.subject_dir else {},
                    "models": {name: model_checksums(name) for name in models}})
        mapping = cache.json("mapping", lambda: _mapping_phase(config, inputs, models, progress))
    except (StimsimError, FileNotFoundError):
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        elif cache_created:
            shutil.rmtree(Path(out_dir) / "cache", ignore_errors=True)
        raise
    chosen_model = mapping["selection"]["model"][0]
    working = mapping["working"]
    layout = inputs.layout

    def registered_points(name):
        reg = mapping["registrations"][name]
        poses = [reg["pose"]] + mapping["bootstraps"][name]["poses"]
        return _points(layout, poses, working)

    if config.task == "sequence_2afc":
        design_points = registered_points(chosen_model)[:, 0]
        companions = [(models[name], registered_points(name)[:, 0]) for name in models if name != chosen_model]
        task = cache.arrays("sequences", lambda: _sequences_phase(config, models[chosen_model], design_points,
                                                                  inputs.images, progress, companions),
                            after=("mapping.json",))
        phase = partial(_rehearsal_phase, scheduler=compute["scheduler"])
    else:
        task = face_task_trials
        phase = _face_phase
    effect = config.effect
    phases = ("mapping.json", "sequences.npz") if config.task == "sequence_2afc" else ("mapping.json",)
    rehearsals = {}
    for index, (name, model) in enumerate(models.items()):
        def rehearse_model(model=model, name=name, index=index):
            points = registered_points(name)
            if not n_random_poses:
                return phase(config, model, task, points, progress)
            random = random_registrations(layout, model.sheet(IT), n_random_poses,
                                          seed=(config.seed, subject_seed or 0, index))
            both = np.concatenate([points, _points(layout, random, working)], axis=1)
            result = phase(config, model, task, both, progress)
            registered = points.shape[1]
            result["random_effect"] = result[effect][:, registered:]
            result[effect] = result[effect][:, :registered]
            probability = "p_high" if effect == "delta_auc" else "p_face"
            result[probability] = result[probability][:, :registered + 1]
            return result
        rehearsals[name] = cache.arrays(f"rehearsal_{_cache_key(list(models), name)}", rehearse_model, after=phases)
    plan = _assemble(config, inputs, mapping, chosen_model, rehearsals, registered_points)
    truth = None
    if inputs.subject_dir is not None:
        truth = cache.arrays("truth", lambda: _truth_phase(config, inputs.load_subject(), working, task, progress,
                                                           compute["scheduler"]), after=phases)
        _write_truth(config, out_dir, truth, working, task)
    return _write_outputs(config, out_dir, inputs, mapping, chosen_model, task, rehearsals, plan, truth,
                          safety, models, scales, write_report, compute)


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


def _sequences_phase(config, model, points, images, progress, companions=()) -> dict:
    seq = build_sequences(model, points, images.images, config.sequences, layer=IT, seed=config.seed,
                          progress=progress, companions=companions)
    return {"images": seq.images, "start_index": seq.start_index, "site_response": seq.site_response,
            "others_change_sd": seq.others_change_sd, "natural_mean": seq.natural_mean,
            "natural_sd": seq.natural_sd}


def _onto_sheet(sheet, points: np.ndarray) -> np.ndarray:
    """Points moved to the nearest point of the sheet's extent; used only where the result is then marked
    as having no prediction (an electrode a registration maps off the sheet)."""
    x0, x1, y0, y1 = sheet.extent_mm
    return np.column_stack([np.clip(points[:, 0], x0, x1), np.clip(points[:, 1], y0, y1)])


def off_sheet(sheet, points: np.ndarray) -> np.ndarray:
    """Boolean mask of the points (..., 2) outside the sheet's extent (mm)."""
    x0, x1, y0, y1 = sheet.extent_mm
    return (points[..., 0] < x0) | (points[..., 0] > x1) | (points[..., 1] < y0) | (points[..., 1] > y1)


def _rehearsal_phase(config, model, sequences, points, progress, scheduler=None) -> dict:
    """The task in ``model`` at every electrode's mapped points (fitted pose, then bootstrap poses). A pose can
    send an electrode off the sheet: that (electrode, pose) has no prediction (NaN; left out of the pooled
    prediction and its interval); it is simulated at the nearest sheet point only to keep the batch
    rectangular."""
    sheet = model.sheet(IT)
    outside = off_sheet(sheet, points)
    fitted = _onto_sheet(sheet, points[:, 0])
    simulated = np.where(outside[..., None], fitted[:, None], points)
    pool = pooling_matrix(sheet, fitted, config.sequences.recording_radius_mm)
    readouts, noise_sd = fit_readouts(model, sequences["images"], pool, config.task_spec, seed=config.seed,
                                      progress=progress)
    responses = _site_responses(model, sequences["images"], pool)
    result = rehearse(model, sequences["images"], simulated, config.stimulation, readouts, config.task_spec,
                      responses, noise_sd, seed=config.seed, progress=progress, safety_limits=config.safety,
                      safety_override=config.safety_override, scheduler=scheduler)
    p_high, delta = result.p_high.copy(), result.delta_auc.copy()
    p_high[:, 1:][outside] = np.nan
    delta[outside] = np.nan
    return {"p_high": p_high, "delta_auc": delta, "slope_to_noise": result.slope_to_noise,
            "site_response": responses}


def _face_phase(config, model, trials, points, progress) -> dict:
    """The face task in ``model`` at every electrode's mapped points; off-sheet points have no prediction."""
    sheet = model.sheet(IT)
    outside = off_sheet(sheet, points)
    simulated = np.where(outside[..., None], _onto_sheet(sheet, points[:, 0])[:, None], points)
    result = face_rehearsal(model, trials, simulated, config.stimulation, config.face_task, seed=config.seed,
                            progress=progress, safety_limits=config.safety, safety_override=config.safety_override)
    result["p_face"][:, 1:][outside] = np.nan
    result["delta_p_face"][outside] = np.nan
    return result


def _site_responses(model, images, pool) -> np.ndarray:
    """(n_sites, n_seq, n_steps) each site's pooled response to its own sequences in ``model``."""
    n_sites, n_seq, n_steps = images.shape[:3]
    flat = list(images.reshape(-1, *images.shape[3:]))
    activity = model.activations(flat, IT, batch_size=512).numpy().reshape(n_sites, n_seq * n_steps, -1)
    weights = pool.numpy()
    return np.einsum("sif,sf->si", activity, weights).reshape(n_sites, n_seq, n_steps).astype(np.float64)


def _truth_phase(config, subject, working, task, progress, scheduler=None) -> dict:
    """The virtual subject's own P(high) for the plan's sequences (or its P(face) on the face task's images):
    its decoders, its true positions."""
    sites = subject.electrode_sites_mm()
    points = np.array([sites[e] for e in working])[:, None, :]
    dead = np.array([e in set(subject.dead_electrodes) for e in working])
    if config.task == "face_categorization":
        result = face_rehearsal(subject.model, task, points, config.stimulation, config.face_task, seed=config.seed + 1,
                                progress=progress, safety_limits=config.safety, safety_override=config.safety_override)
        return {"p_face": result["p_face"], "delta_p_face": result["delta_p_face"][:, 0], "dead": dead}
    sequences = task
    readouts, _ = fit_readouts(subject.model, sequences["images"], None, config.task_spec, seed=config.seed + 1,
                               progress=progress)
    result = rehearse(subject.model, sequences["images"], points, config.stimulation, readouts, config.task_spec,
                      seed=config.seed + 1, progress=progress, safety_limits=config.safety,
                      safety_override=config.safety_override, scheduler=scheduler)
    return {"p_high": result.p_high, "delta_auc": result.delta_auc[:, 0], "dead": dead}


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


def _write_truth(config, out_dir: Path, truth: dict, working, task) -> None:
    if config.task == "face_categorization":
        data = xr.Dataset(
            {"subject_p_face": (("electrode", "stimulated"), truth["p_face"]),
             "true_delta_p_face": (("electrode",), truth["delta_p_face"][:, 0]), "dead": ("electrode", truth["dead"])},
            coords={"electrode": list(working), "stimulated": [False, True]},
            attrs={"description": "the virtual subject's own P(face) on the face task's test images (validation only)"})
        atomic_save(out_dir / "truth" / "subject_p_face.nc", lambda tmp: data.to_netcdf(tmp, engine="h5netcdf"))
        return
    n_seq, n_steps = task["images"].shape[1:3]
    data = xr.Dataset(
        {"subject_p_high": (("electrode", "stimulated", "sequence", "step"), truth["p_high"]),
         "true_delta_auc": (("electrode", "sequence"), truth["delta_auc"]),
         "dead": ("electrode", truth["dead"])},
        coords={"electrode": list(working), "stimulated": [False, True], "sequence": np.arange(n_seq),
                "step": np.arange(n_steps)},
        attrs={"description": "the virtual subject's own P(high) for the plan's sequences (validation only)"})
    atomic_save(out_dir / "truth" / "subject_p_high.nc", lambda tmp: data.to_netcdf(tmp, engine="h5netcdf"))


def _write_outputs(config, out_dir, inputs, mapping, chosen_model, task, rehearsals, plan, truth, safety,
                   models, scales, write_report: bool, compute: dict) -> dict:
    from stimsim.models.registry import model_path
    from stimsim.planning.report import build_report

    effect = config.effect
    working = mapping["working"]
    order, chosen = plan["choice"]["order"], plan["choice"]["chosen"]
    anatomical = None
    if config.anatomical is not None:
        from stimsim.arrays.anatomy import AnatomicalPose

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
               "cortex_scale": scales,
               "registration": {name: {"pose": reg["pose"], "mean_correlation": reg["mean_correlation"],
                                       "chance_mean_correlation_p95": reg["chance_mean_correlation_p95"]}
                                for name, reg in mapping["registrations"].items()},
               "registration_stability": {name: {k: boot[k] for k in ("sd_x_mm", "sd_y_mm", "sd_rotation_deg", "n_boot")}
                                          for name, boot in mapping["bootstraps"].items()},
               "effect": effect, f"predicted_{effect}_median": float(np.nanmedian(plan["predicted"])),
               "interval_spans": INTERVAL_SPANS, "model_to_subject_sd": subject_sd,
               "layout_description": inputs.array_layout.description or None}
    _, summary["left_out_electrodes"] = _screen(config, inputs, mapping["reliability"] or None)
    summary["left_out_warning"] = left_out_message(summary["left_out_electrodes"], config.min_reliability)
    if summary["left_out_warning"] is not None:
        warnings.warn(summary["left_out_warning"], stacklevel=2)
    summary["sites_warning"] = shortfall_message(plan["choice"], config.selection)
    if summary["sites_warning"] is not None:
        warnings.warn(summary["sites_warning"], stacklevel=2)
    if config.task == "sequence_2afc":
        sequences = task
        summary.update({
            "sequence_response_change_sd": float(np.median(
                (sequences["site_response"][:, :, -1] - sequences["site_response"][:, :, 0]) / sequences["natural_sd"][:, None])),
            "sequence_others_change_sd": float(np.median(sequences["others_change_sd"][:, :, [0, -1]])),
            "ranking_reliability": _finite_or_none(ranking_reliability(np.nanmean(
                np.stack([rehearsals[n]["delta_auc"][:, 0] for n in rehearsals]), axis=0))),
            "ranking_reliability_chance": 0.0,
            "sequence_warning": excursion_warning(sequences["site_response"], sequences["natural_sd"],
                                                  config.sequences.recording_radius_mm)})
        if summary["sequence_warning"] is not None:
            warnings.warn(summary["sequence_warning"], stacklevel=2)
        summary.update(forecast(predicted_curves(rehearsals, chosen), [working[i] for i in chosen],
                                plan["predicted"][chosen], config.rig.trials_per_site, config.seed))
        if summary["power_warning"] is not None:
            warnings.warn(summary["power_warning"], stacklevel=2)
    else:
        summary["face_task_images"] = {
            "fit": task.n_fit_images, "test": task.n_test_images,
            "noise_at_input_size_px": {name: model.preprocessing.size_px for name, model in models.items()}}
        summary.update({"power_at_planned_trials": None, "trials_per_site_needed": None, "power_warning": None,
                        "power_forecast": "the power forecast and the rig package cover the sequence 2AFC only"})
    if truth is not None:
        subject = inputs.load_subject()
        alive = ~truth["dead"] & np.isfinite(plan["predicted"])
        true = truth[effect].mean(-1) if truth[effect].ndim > 1 else truth[effect]
        r = float(np.corrcoef(plan["predicted"][alive], true[alive])[0, 1]) if alive.sum() > 2 else float("nan")
        summary.update({"subject_dir": str(inputs.subject_dir), "predicted_vs_true_r": r,
                        "predicted_vs_true_r_per_model": {
                            name: _pearson(plan["per_model"][m, alive, 0], true[alive])
                            for m, name in enumerate(rehearsals)},
                        f"true_{effect}_median": float(np.median(true[alive])),
                        "interval_coverage_of_true": {
                            "interval": coverage(true[alive], plan["low"][alive], plan["high"][alive]),
                            "interval_with_subject": coverage(true[alive], subject_low[alive], subject_high[alive])},
                        **_random_pose_null(rehearsals, true, alive),
                        "subject_lapse_rate": subject.lapse_rate, "subject_id": f"virtual-{subject.seed}"})
    summary[f"predicted_{effect}"] = {e: float(v) for e, v in zip(working, plan["predicted"])}
    if truth is not None:
        summary[f"true_{effect}"] = {e: float(v) for e, v in zip(working, true)}
        summary["dead_electrodes_rehearsed"] = [e for e, d in zip(working, truth["dead"]) if d]
    if not write_report:
        atomic_write_json(out_dir / "summary.json", summary)
        return summary
    dataset = (_plan_dataset(config, working, task, rehearsals, plan, factor) if config.task == "sequence_2afc"
               else _face_dataset(config, working, rehearsals, plan, factor))
    atomic_save(out_dir / "plan.nc", lambda tmp: dataset.to_netcdf(tmp, engine="h5netcdf"))
    record = provenance(config.to_dict())
    record["model_checksums"] = {name: model_checksums(name) for name in models}
    record["model_directories"] = {name: str(model_path(name)) for name in models}
    record["device"] = str(compute["device"])
    record["scheduler"] = compute["scheduler_description"]
    record["cortex_scale"] = scales
    record["input_sha256"] = config.input_files()
    atomic_write_json(out_dir / "config.json", record)
    if config.task == "sequence_2afc":
        sites_chosen = [working[i] for i in chosen]
        n_sequences, n_steps = task["images"].shape[1:3]
        n_images = n_sequences * n_steps
        trials = trial_list(sites_chosen, n_sequences, n_steps, config.rig, config.stimulation, config.seed,
                            inputs.array_layout)
        write_rig(out_dir, task["images"][chosen], sites_chosen, config.rig, trials, config.name)
        summary["rig"] = {"folder": "rig", "n_trials": int(len(trials)), "n_images": int(len(chosen) * n_images)}
    atomic_write_json(out_dir / "summary.json", summary)
    build_report(config, inputs, mapping, chosen_model, task, rehearsals, plan, sites, summary, truth,
                 models, record).write(out_dir)
    return summary


def _finite_or_none(value: float):
    """``value``, or None (JSON null) where it is undefined (NaN)."""
    return value if np.isfinite(value) else None


def _random_pose_null(rehearsals, true, alive) -> dict:
    """r of the plans made at random registrations (mean over candidates, as the plan) against the true effect."""
    if not all("random_effect" in r for r in rehearsals.values()):
        return {}
    random = np.stack([r["random_effect"].mean(-1) for r in rehearsals.values()])  # (models, sites, n_random)
    predicted = np.nanmean(random, axis=0)
    values = [_pearson(predicted[alive, k], true[alive]) for k in range(predicted.shape[1])]
    return {"random_pose_r": values, "random_pose_r_p95": float(np.nanpercentile(values, 95)),
            "random_pose_r_median": float(np.nanmedian(values)), "n_random_poses": len(values)}


def _pearson(a, b) -> float:
    """Pearson r over the pairs where both are finite (NaN with fewer than 3)."""
    keep = np.isfinite(a) & np.isfinite(b)
    return float(np.corrcoef(a[keep], b[keep])[0, 1]) if keep.sum() > 2 else float("nan")


def _plan_dataset(config, working, sequences, rehearsals, plan, factor: float) -> xr.Dataset:
    names = list(rehearsals)
    n_sites, n_seq, n_steps = sequences["images"].shape[:3]
    first = rehearsals[names[0]]
    data = xr.Dataset(
        {"sequence_image": (("electrode", "sequence", "step", "y", "x"), sequences["images"]),
         "p_high": (("model", "electrode", "pose", "stimulated", "sequence", "step"),
                    np.stack([_p_high_by_pose(rehearsals[n]["p_high"]) for n in names])),
         "delta_auc": (("model", "electrode", "pose", "sequence"), np.stack([rehearsals[n]["delta_auc"] for n in names])),
         "slope_to_noise": (("model", "electrode", "sequence"), np.stack([rehearsals[n]["slope_to_noise"] for n in names])),
         "site_response": (("electrode", "sequence", "step"), sequences["site_response"]),
         "others_change_sd": (("electrode", "sequence", "step"), sequences["others_change_sd"]),
         "predicted_delta_auc": ("electrode", plan["predicted"]),
         "predicted_delta_auc_low": ("electrode", plan["low"]),
         "predicted_delta_auc_high": ("electrode", plan["high"]), **_site_coordinates(plan)},
        coords={"electrode": list(working), "model": names, "sequence": np.arange(n_seq), "step": np.arange(n_steps),
                "pose": ["fitted"] + [f"bootstrap_{k}" for k in range(first["delta_auc"].shape[1] - 1)],
                "stimulated": [False, True]},
        attrs={"task": config.task, "current_uA": config.stimulation["current_uA"], "cortex_mm_per_model_mm": factor,
               "description": "stimsim plan: sequences, P(high) with and without stimulation, predicted ΔAUC"})
    return data


def _site_coordinates(plan) -> dict:
    return {"model_x_mm": ("electrode", plan["model_xy"][:, 0]), "model_y_mm": ("electrode", plan["model_xy"][:, 1]),
            "cortex_x_mm": ("electrode", plan["cortex_xy"][:, 0]), "cortex_y_mm": ("electrode", plan["cortex_xy"][:, 1]),
            "array_x_mm": ("electrode", plan["array_xy"][:, 0]), "array_y_mm": ("electrode", plan["array_xy"][:, 1])}


def _face_dataset(config, working, rehearsals, plan, factor: float) -> xr.Dataset:
    names = list(rehearsals)
    p_face = np.stack([rehearsals[n]["p_face"] for n in names])  # (model, electrode, 1 + poses)
    control = np.broadcast_to(p_face[:, :, :1], p_face[:, :, 1:].shape)
    return xr.Dataset(
        {"p_face": (("model", "electrode", "pose", "stimulated"), np.stack([control, p_face[:, :, 1:]], axis=-1)),
         "delta_p_face": (("model", "electrode", "pose"), np.stack([rehearsals[n]["delta_p_face"][..., 0] for n in names])),
         "predicted_delta_p_face": ("electrode", plan["predicted"]),
         "predicted_delta_p_face_low": ("electrode", plan["low"]),
         "predicted_delta_p_face_high": ("electrode", plan["high"]), **_site_coordinates(plan)},
        coords={"electrode": list(working), "model": names, "stimulated": [False, True],
                "pose": ["fitted"] + [f"bootstrap_{k}" for k in range(p_face.shape[2] - 2)]},
        attrs={"task": config.task, "current_uA": config.stimulation["current_uA"], "cortex_mm_per_model_mm": factor,
               "description": "stimsim plan: P(face) on noisy face / non-face images with and without stimulation"})


def _p_high_by_pose(p_high: np.ndarray) -> np.ndarray:
    """(sites, 1 + poses, seq, steps) with condition 0 = control → (sites, poses, 2, seq, steps)."""
    control = np.broadcast_to(p_high[:, :1], p_high[:, 1:].shape)
    return np.stack([control, p_high[:, 1:]], axis=2)
