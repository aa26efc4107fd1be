"""``stimsim visualize CONFIG.toml --out DIR``: predicted percepts of stimulation, as a figure grid.

The file (example: ``experiments/visualize_default.toml``) names

* top level: ``name``, ``description``, ``model`` (shipped name or model directory, a relative one read from
  this file's folder; ``--model`` overrides it), ``layer`` (default ``"IT"``), ``match_layer`` (default:
  ``layer``), ``seed`` (default 0);
* ``[[images]]``: the rows, each a table for ``stimsim.data.stimuli.load_stimulus_source`` (a folder's or
  table's relative ``path`` read from this file's folder) plus ``group`` (row label, e.g. ``"object"``),
  optional ``n`` (the first n images, at most as many as there are) and ``only`` (a table label → value the
  images must have);
* ``[localizer]``: ``sets`` (as ``[[images]]``; images shown in rows are left out, which a run notes), ``label``,
  ``positive`` (the face class), ``C`` of the face decoders (default 1e-3);
* ``[sites]``: ``method = "selectivity"`` (face site: the candidate point, ``candidate_step_mm`` grid
  ``margin_mm`` from the edge, where the unit face-d′ map smoothed with ``smoothing_sigma_mm`` is highest;
  control site: where it is lowest at least ``outside_min_distance_mm`` away), ``"explicit"``
  (``face_site_mm``, ``control_site_mm``) or ``"plan"`` (``plan`` = a ``stimsim plan`` directory, read from this
  file's folder when relative,
  ``face_electrode``, ``control_electrode``: their ``cortex_x_mm`` / ``cortex_y_mm`` in its sites.csv).
  Every length is in cortex mm, at the model's own scale (its ``cortex_scale``);
* ``[stimulation]``: an electrical stimulation template (``stimsim.stimulation.ElectricalStimulation``
  keys without ``sites_mm``, ``layer`` and ``current_uA``), ``currents_uA`` (rising; the face site gets
  each, the control site and the scrambled control the highest) and ``additive_scale`` (``"sd"``:
  ``activation_per_Hz`` is in SDs of the layer's response to the localizer images);
* ``[safety]``: as in experiment files (``max_shannon_k``, ``electrode_area_um2``, ``override``);
* ``[inversion]``: :class:`stimsim.percepts.InversionSettings` (``steps``, ``learning_rate``,
  ``tv_weight``, ``jitter_px``, ``blur_sigma_px``, ``match``, ``optimizer``, ``parametrization``,
  ``spectrum_decay``, ``gray_change``);
* ``[judge]``: ``model``, the independent judge (``--judge`` overrides it): another model whose face
  decoder scores the images without having been optimised against.

Output (one :class:`stimsim.utilities.io.ResultSet`): ``percepts.png`` (rows: images; columns: original,
unstimulated inversion, face site at each current, control site, scrambled; P(face) of both judges
under each), ``percepts.nc`` (``percept`` image × condition × y × x × channel in [0, 1], ``original``,
``p_face`` judge × image × condition, ``p_face_original``, ``match_loss``; condition coords ``kind``,
``current_uA``, ``site_x_mm``, ``site_y_mm``), ``summary.json`` (``judges`` → ``own`` / ``independent`` →
``pface_face_site`` by rising current, ``pface_control_site``, ``pface_scrambled``,
``pface_unstimulated``, ``pface_original``: means over the images of ``summary_groups``; the ``stimulation`` as
written, ``seed``, ``sites`` in cortex mm) and
``config.json`` (the file as run, sites, safety: the report at the top current and
``currents_outside_limits_uA``, decoders' fit, versions); what limits the results (``notes``) is in
both, in ``percepts.nc`` (attribute ``notes_json``) and under the figure.

Over 500 lines: the file, its sites, its conditions and its result files are read and written in one place, beside the
one run that uses them.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from stimsim.cortex.topography import smoothed_values_at
from stimsim.data.stimuli import SHOWN_REPEATS, StimulusSet, load_stimulus_source
from stimsim.engine.devices import resolve_device
from stimsim.models.preprocessing import input_geometry_notes
from stimsim.models.registry import load_model, resolve_model_path
from stimsim.paradigms.experiment_file import resolve_set_paths
from stimsim.paradigms.sites import candidate_points_mm, multi_unit_dprime, unit_dprime
from stimsim.percepts import (FaceJudge, InversionSettings, matched_layer, pixel_images, scrambled_effects,
                              synthesize)
from stimsim.percepts.figure import plot_percepts
from stimsim.percepts.visualize_file import VisualizeFile
from stimsim.stimulation import (Condition, SafetyLimits, additive_scale_record, check_additive_scale, check_protocol,
                                 enforce, perturbation_from_dict)
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError, DataError, FileFormatError, SafetyError
from stimsim.utilities.filemodels import validate
from stimsim.utilities.hashing import state_sha256
from stimsim.utilities.io import ResultSet, atomic_write_json, provenance
from stimsim.utilities.locking import DirectoryLock
from stimsim.utilities.jsonable import json_ready
from stimsim.utilities.ordering import repeated
from stimsim.utilities.progress import report_phase

PNG_FILE, DATA_FILE, SUMMARY_FILE, CONFIG_FILE = "percepts.png", "percepts.nc", "summary.json", "config.json"


@dataclasses.dataclass(frozen=True)
class VisualizeConfig:
    """A checked visualisation file (see the module docstring); ``raw`` is the file as parsed."""

    name: str
    model: str
    judge: str
    layer: str
    match_layer: str | None
    seed: int
    images: tuple[dict, ...]
    localizer: dict
    sites: dict
    stimulation: dict
    currents_uA: tuple[float, ...]
    additive_scale: str
    safety: dict
    inversion: InversionSettings
    summary_groups: tuple[str, ...]
    source: str
    raw: dict


def load_config(path, model: str | None = None, judge: str | None = None) -> VisualizeConfig:
    """Read and check a visualisation file; ``model`` / ``judge`` override the file's."""
    path = Path(path)
    raw = load_toml(path)
    where = str(path)
    for sets in (raw.get("images"), (raw.get("localizer") or {}).get("sets") if isinstance(raw.get("localizer"), dict)
                 else None):  # image folders and tables are read from the file's own folder
        resolve_set_paths(sets, path.parent)
    _resolve_file_paths(raw, path.parent)
    checked = validate(VisualizeFile, raw, where, "stimsim visualize")
    images = [entry.model_dump() for entry in checked.images]
    groups = {entry["group"] for entry in images}
    missing = [g for g in checked.summary_groups if g not in groups]
    if missing:
        raise ConfigError(f"{where}: 'summary_groups' must name groups of [[images]] ({sorted(groups)}), got "
                          f"{list(checked.summary_groups)}")
    stimulation = checked.stimulation
    template = stimulation.model_dump(exclude={"currents_uA", "additive_scale"})
    currents = tuple(stimulation.currents_uA)
    for key in ("sites_mm", "layer", "current_uA"):
        if key in template:
            raise ConfigError(f"{where} [stimulation]: {key!r} is not set here (sites come from [sites], the layer "
                              "from 'layer', currents from 'currents_uA')")
    if template.get("kind", "electrical") != "electrical":
        raise ConfigError(f"{where} [stimulation]: 'kind' must be \"electrical\", got {template.get('kind')!r}")
    template["kind"] = "electrical"
    if list(currents) != sorted(set(currents)):
        hint = f"e.g. {sorted(set(currents))}" if len(set(currents)) > 1 else "at least two different currents"
        raise ConfigError(f"{where} [stimulation]: 'currents_uA' must list its currents (µA) in rising order, each "
                          f"once, got {list(currents)} ({hint})")
    labels = [_current_label(current) for current in currents]
    alike = next((i for i in range(1, len(labels)) if labels[i] == labels[i - 1]), None)
    if alike is not None:
        raise ConfigError(f"{where} [stimulation]: 'currents_uA' holds {currents[alike - 1]!r} and "
                          f"{currents[alike]!r}, which read alike to 6 significant digits ({labels[alike]}) and would "
                          "label one condition; give currents that differ within those digits")
    problems, perturbations = {}, {}
    for current in currents:
        try:
            perturbations[current] = perturbation = perturbation_from_dict(
                {**template, "sites_mm": [[0.0, 0.0]], "layer": checked.layer, "current_uA": current},
                supplied=("sites_mm", "layer", "current_uA"), file_keys=("currents_uA", "additive_scale"))
        except ConfigError as exc:
            problems[current] = str(exc)
    if problems:  # the same problem at every current is the template's; else the currents named are out of range
        current, problem = next(iter(problems.items()))
        about = "" if len(problems) == len(currents) and len(set(problems.values())) == 1 else \
            f"'currents_uA' holds {current!r}: "
        raise ConfigError(f"{where} [stimulation]: {about}{problem}")
    try:
        check_additive_scale(stimulation.additive_scale, template.get("form"))
        perturbation.check_delivers()
    except ConfigError as exc:
        raise ConfigError(f"{where} [stimulation]: {exc}") from None
    safety = checked.safety.to_dict()
    # before any model is loaded: the protocol alone decides
    _enforce(perturbations, _limits(safety), safety["override"], f"{where} [safety]")
    sites = checked.sites.to_dict()
    for key in ("face_site_mm", "control_site_mm"):
        if key in sites:
            sites[key] = tuple(sites[key])
    return VisualizeConfig(name=checked.name, model=model or checked.model, judge=judge or checked.judge.model,
                           layer=checked.layer, match_layer=checked.match_layer, seed=checked.seed,
                           images=tuple(images), localizer=checked.localizer.to_dict(), sites=sites,
                           stimulation=template, currents_uA=currents, additive_scale=stimulation.additive_scale,
                           safety=checked.safety.to_dict(), inversion=checked.inversion,
                           summary_groups=tuple(checked.summary_groups), source=where,
                           raw=json.loads(json.dumps(raw, default=str)))


def _resolve_file_paths(raw: dict, base: Path) -> None:
    """The model and judge directories and the ``[sites]`` plan directory a file gives by relative paths, made
    absolute against ``base``, the file's folder (in place), as its image folders and tables are."""
    if "model" in raw:
        raw["model"] = resolve_model_path(raw["model"], base)
    judge, sites = raw.get("judge"), raw.get("sites")
    if isinstance(judge, dict) and "model" in judge:
        judge["model"] = resolve_model_path(judge["model"], base)
    if isinstance(sites, dict) and isinstance(sites.get("plan"), str) and sites["plan"].strip() \
            and not Path(sites["plan"]).is_absolute():
        sites["plan"] = str((base / sites["plan"]).absolute())


# --- running ------------------------------------------------------------------------------------
def run_visualize(config_path, out_dir, model: str | None = None, judge: str | None = None, progress: bool = True,
                  force: bool = False, device="cpu") -> dict:
    """Run a visualisation file and write its result set into ``out_dir``; returns the summary. A run that
    fails before writing a file leaves ``out_dir`` as it found it. ``device``: where both models compute (cpu,
    cuda, cuda:N, mps, auto)."""
    return run_config(load_config(config_path, model=model, judge=judge), out_dir, progress, force, device)


def run_config(config: VisualizeConfig, out_dir, progress: bool = True, force: bool = False, device="cpu") -> dict:
    """:func:`run_visualize` on a checked configuration (e.g. one whose sites a plan chose)."""
    sites = config.sites
    if sites["method"] == "explicit":  # known before any model is loaded
        check_site_separation(sites["face_site_mm"], sites["control_site_mm"], sites["recording_radius_mm"],
                              f"{config.source} [sites]")
    device = resolve_device(device)
    inputs = {"config": config.raw, "model": config.model, "judge_model": config.judge, "sites": sites}
    with DirectoryLock(out_dir, "visualize"), ResultSet(out_dir, "percepts", force=force, inputs=inputs) as results:
        return _run_into(results, config, progress, device)


def check_site_separation(face_mm, control_mm, recording_radius_mm: float, where: str) -> None:
    """The control site must lie farther than ``recording_radius_mm`` from the face site (cortex mm), or both would
    record the same units."""
    face, control = [round(float(v), 3) for v in face_mm], [round(float(v), 3) for v in control_mm]
    if math.dist(face, control) <= recording_radius_mm:
        raise ConfigError(f"{where}: the control site {control} lies within recording_radius_mm = "
                          f"{recording_radius_mm:g} of the face site {face}, so both would record the same units; "
                          "give a control site farther away")


def _scaled_model(name: str, layer: str, what: str, device, where: str):
    """The model ``name`` on ``device`` with its ``layer`` sheet in cortex mm (its own recorded scale); ``what`` (the
    model or the judge) is named when it cannot be loaded, and the file ``where`` when it lacks ``layer``."""
    try:
        topo = load_model(name, device=device)
    except DataError as exc:
        raise DataError(f"the {what} ({'[judge] model or --judge' if what == 'judge' else 'model or --model'}): "
                        f"{exc}") from None
    try:
        layer = topo.resolve_layer(layer)
    except ConfigError as exc:
        raise ConfigError(f"{where}: 'layer': {what} {name!r}: {exc}") from None
    scale = topo.cortex_scale(layer)
    topo, _ = topo.in_cortex_mm(layer)
    return topo, layer, scale


def _run_into(results: ResultSet, config: VisualizeConfig, progress: bool, device) -> dict:
    started = time.perf_counter()
    report_phase(f"visualize: loading model {config.model} and judge {config.judge}", progress)
    topo, layer, scale = _scaled_model(config.model, config.layer, "model", device, config.source)
    judge_model, judge_layer, _ = _scaled_model(config.judge, config.layer, "judge", device, config.source)
    notes = []  # what limits the results, said on stderr and kept in summary.json, config.json and the figure

    def note(message: str) -> None:
        notes.append(message)
        warnings.warn(message, stacklevel=3)

    if judge_model.name == topo.name:
        note(f"the independent judge {config.judge!r} is the model itself ({topo.name!r}); its P(face) is not "
             "independent of the inversion — give another model ([judge] model or --judge)")
    try:
        match_layer = None if config.match_layer is None else matched_layer(topo, layer, config.match_layer)
    except ConfigError as exc:
        raise ConfigError(f"{config.source}: 'match_layer': {exc}") from None
    try:
        config.inversion.check_image_size(topo.preprocessing.size_px)
    except ConfigError as exc:
        raise ConfigError(f"{config.source} [inversion]: {exc}") from None
    if config.sites["method"] == "explicit":  # known before the localizer's work
        check_on_sheet([config.sites["face_site_mm"], config.sites["control_site_mm"]], topo.sheet(layer),
                       f"{config.source} [sites]")
    rows = _load_rows(config)
    localizer, left_out = _load_localizer(config, set(rows.stimulus_id.tolist()))
    for images, where in ((rows, "[[images]]"), (localizer, "[localizer] sets")):
        for message in input_geometry_notes(images, topo.preprocessing.size_px, f"{config.source} {where}"):
            note(message)
    if left_out:
        note(f"{len(left_out)} image(s) shown in the rows are also in [localizer] sets and were left out of the "
             f"localizer, which fits the face decoders and the face-d′ map on the other {len(localizer)}: "
             f"{', '.join(left_out[:5])}{' …' if len(left_out) > 5 else ''}")
    values = np.asarray(localizer.labels[config.localizer["label"]]).astype(str)
    is_face = values == config.localizer["positive"]
    if min(is_face.sum(), (~is_face).sum()) < 2:
        kinds = sorted(set(values.tolist()))
        raise ConfigError(f"{config.source} [localizer]: label {config.localizer['label']!r} = "
                          f"{config.localizer['positive']!r} marks {int(is_face.sum())} of the {len(values)} localizer "
                          f"images as faces; both decoders need at least 2 faces and 2 others (its values: "
                          f"{', '.join(kinds[:10])}{' …' if len(kinds) > 10 else ''})")
    report_phase(f"localizer: {layer} responses to {len(localizer)} images ({int(is_face.sum())} "
                 f"{config.localizer['positive']}); face decoders of both models", progress)
    responses = topo.activations(localizer.images, layer).numpy()
    own = FaceJudge.fit(topo, localizer.images, is_face, layer, C=config.localizer["C"], seed=config.seed)
    independent = FaceJudge.fit(judge_model, localizer.images, is_face, judge_layer, C=config.localizer["C"],
                                seed=config.seed)
    sheet = topo.sheet(layer)
    sites = _choose_sites(config, sheet, responses, is_face)
    if not sites["face"]["dprime"] >= 1:
        note(f"the face site's face d′ is {sites['face']['dprime']:.2f} (multi-unit, within "
             f"{config.sites['recording_radius_mm']:g} mm), below 1: its percepts show stimulation of a site that is "
             "hardly face-selective")
    conditions, labels, kinds, currents, positions, template, safety = _conditions(config, layer, sites, responses)
    if safety["overridden"]:
        note(_override_note(safety))
    multiplier, additive = Condition.batch_effects([c for c in conditions if c is not None], sheet)
    multiplier, additive = multiplier.to(torch.float32), additive.to(torch.float32)
    scrambled = kinds.index("scrambled")
    source = labels.index(f"face_site_{_current_label(config.currents_uA[-1])}")
    ms, a_s = scrambled_effects(multiplier[source:source + 1], additive[source:source + 1], config.seed)
    multiplier = torch.cat([multiplier[:scrambled], ms, multiplier[scrambled:]])
    additive = torch.cat([additive[:scrambled], a_s, additive[scrambled:]])

    originals = pixel_images(topo, rows.images)
    percepts, losses, seconds = [], [], []
    for index, (image, stimulus_id) in enumerate(zip(originals, rows.stimulus_id)):
        report_phase(f"inversion {index + 1}/{len(rows)}: {stimulus_id} × {len(labels)} conditions, "
                     f"{config.inversion.steps} steps", progress)
        tick = time.perf_counter()
        try:
            images, loss = synthesize(topo, image, multiplier, additive, layer, match_layer, config.inversion,
                                      seed=config.seed + index)
        except ConfigError as exc:
            raise ConfigError(f"{config.source} {exc}") from None  # the message names its table
        seconds.append(time.perf_counter() - tick)
        percepts.append(images)
        losses.append(loss)
    percepts = torch.stack(percepts)  # (images, conditions, C, H, W)
    report_phase("scoring: P(face) of every image by both face decoders", progress)
    as_arrays = lambda batch: batch.permute(0, 2, 3, 1).numpy()  # noqa: E731
    flat = as_arrays(percepts.flatten(0, 1))
    p_face = np.stack([j.p_face(flat).reshape(len(rows), len(labels)) for j in (own, independent)])
    p_original = np.stack([j.p_face(as_arrays(originals)) for j in (own, independent)])

    groups = np.asarray(rows.labels["group"]).astype(str)
    scored = np.isin(groups, config.summary_groups)
    judges = {}
    for name, model_name, values, original in (("own", config.model, p_face[0], p_original[0]),
                                               ("independent", config.judge, p_face[1], p_original[1])):
        mean = values[scored].mean(axis=0)
        judges[name] = {"model": model_name,
                        "pface_face_site": [float(mean[labels.index(f"face_site_{_current_label(c)}")])
                                            for c in config.currents_uA],
                        "pface_control_site": float(mean[kinds.index("control_site")]),
                        "pface_scrambled": float(mean[kinds.index("scrambled")]),
                        "pface_unstimulated": float(mean[kinds.index("unstimulated")]),
                        "pface_original": float(original[scored].mean())}
    summary = json_ready({
        "name": config.name, "model": config.model, "judge_model": config.judge, "layer": layer,
        "match_layer": match_layer or layer, "currents_uA": list(config.currents_uA),
        "stimulation": {**config.stimulation, "additive_scale": config.additive_scale}, "seed": config.seed,
        "lengths": "cortex mm unless named model mm",
        "summary_groups": list(config.summary_groups), "n_images_scored": int(scored.sum()),
        "cortex_mm_per_model_mm": scale["cortex_mm_per_model_mm"], "sites": sites, "judges": judges,
        "safety_overridden": bool(safety["overridden"]),
        "seconds_per_image": float(np.mean(seconds)), "n_conditions": len(labels),
        "seconds_total": time.perf_counter() - started, "notes": notes,
    })
    created = provenance()
    record = json_ready({
        "config": config.raw, "config_file": config.source, "model": config.model, "judge_model": config.judge,
        "model_state_sha256": state_sha256(topo.network.state_dict()),
        "judge_state_sha256": state_sha256(judge_model.network.state_dict()),
        "layer": layer, "cortex_scale": scale, "sites": sites, "stimulation": template, "safety": safety,
        "conditions": [{"label": label, "kind": kind, "current_uA": current, "site_mm": position,
                        "condition": None if condition is None else condition.to_dict()}
                       for label, kind, current, position, condition in zip(labels, kinds, currents, positions,
                                                                            conditions)],
        "scrambled_from": labels[source], "inversion": config.inversion.to_dict(), "seed": config.seed,
        "decoders": {"own": own.decoder.readout.fit_params, "independent": independent.decoder.readout.fit_params},
        "created_utc": created["created_utc"], "software": created["software"], "device": str(device),
        "notes": notes,
    })
    dataset = _dataset(rows, groups, originals, percepts, np.asarray(losses), p_face, p_original, labels, kinds,
                       currents, positions, record)
    title = f"{config.name}: {config.model} (judge {config.judge})"
    results.write_together({  # an earlier run's files stay whole until every new one is made
        DATA_FILE: lambda tmp: dataset.to_netcdf(tmp, engine="h5netcdf"),
        PNG_FILE: lambda tmp: plot_percepts(dataset, tmp, title, notes),
        CONFIG_FILE: lambda tmp: atomic_write_json(tmp, record),
        SUMMARY_FILE: lambda tmp: atomic_write_json(tmp, summary)})
    results.finish()
    return summary


def _current_label(current_uA: float) -> str:
    return f"{current_uA:g}uA"


def _load_rows(config: VisualizeConfig) -> StimulusSet:
    """The row images, with labels ``group`` and ``source_set``."""
    images, ids, groups = [], [], []
    for index, entry in enumerate(config.images):
        where = f"{config.source} [[images]] #{index + 1}"
        params = dict(entry)
        group = params.pop("group")
        count = params.pop("n", None)
        only = params.pop("only", {})
        stimuli = load_stimulus_source(params, where)
        keep = np.ones(len(stimuli), dtype=bool)
        if not isinstance(only, dict):
            raise ConfigError(f"{where}: 'only' must be a table label = value")
        for label, value in only.items():
            if label not in stimuli.labels:
                raise ConfigError(f"{where}: 'only' names label {label!r}; the images have {sorted(stimuli.labels)}")
            values = np.asarray(stimuli.labels[label]).astype(str)
            if not (values == str(value)).any():
                kinds = sorted(set(values.tolist()))
                raise ConfigError(f"{where}: 'only' {label} = {value!r} matches none of the images; their values: "
                                  f"{', '.join(kinds[:10])}{' …' if len(kinds) > 10 else ''}")
            keep &= values == str(value)
        chosen = np.flatnonzero(keep)
        if count is not None:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ConfigError(f"{where}: 'n' must be a positive integer, got {count!r}")
            if count > len(chosen):
                raise ConfigError(f"{where}: 'n' = {count} asks for more images than the {len(chosen)} there are; "
                                  f"give at most {len(chosen)}, or leave 'n' out for all")
            chosen = chosen[:count]
        if len(chosen) == 0:
            raise ConfigError(f"{where}: no image is left (check 'only' and the source's keys)")
        images += [stimuli.images[i] for i in chosen]
        ids += [str(stimuli.stimulus_id[i]) for i in chosen]
        groups += [group] * len(chosen)
    _check_unique_ids(ids, f"{config.source} [[images]]")
    return StimulusSet(name="rows", images=images, stimulus_id=np.asarray(ids), labels={"group": np.asarray(groups)})


def _load_localizer(config: VisualizeConfig, shown: set) -> tuple[StimulusSet, list[str]]:
    """The localizer images without those shown in the rows, and the ids of those left out."""
    label = config.localizer["label"]
    images, ids, values, left_out = [], [], [], []
    for index, entry in enumerate(config.localizer["sets"]):
        where = f"{config.source} [localizer] sets[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be a table")
        stimuli = load_stimulus_source(entry, where)
        if label not in stimuli.labels:
            raise ConfigError(f"{where}: the images have no label {label!r}; labels: {sorted(stimuli.labels)}")
        for image, stimulus_id, value in zip(stimuli.images, stimuli.stimulus_id, stimuli.labels[label]):
            if str(stimulus_id) in shown:
                left_out.append(str(stimulus_id))
            else:
                images.append(image)
                ids.append(str(stimulus_id))
                values.append(str(value))
    _check_unique_ids(ids, f"{config.source} [localizer] sets")
    stimuli = StimulusSet(name="localizer", images=images, stimulus_id=np.asarray(ids),
                          labels={label: np.asarray(values)})
    return stimuli, left_out


def _check_unique_ids(ids: list, where: str) -> None:
    """Refuse image ids given more than once, naming them."""
    twice = repeated(ids, at_most=SHOWN_REPEATS)
    if twice:
        raise ConfigError(f"{where}: image id(s) {twice} come more than once (an image listed twice, or images of "
                          "two sources with one id); every image needs an id of its own")


def _choose_sites(config: VisualizeConfig, sheet, responses, is_face) -> dict:
    """Face and control sites (cortex mm) with their multi-unit face d′."""
    spec = config.sites
    where = f"{config.source} [sites]"
    if spec["method"] == "selectivity":
        try:
            candidates = candidate_points_mm(sheet, spec["candidate_step_mm"], spec["margin_mm"])
        except ConfigError as exc:
            raise ConfigError(f"{config.source}: {exc}") from None
        smoothed = smoothed_values_at(unit_dprime(responses, is_face), sheet, candidates, spec["smoothing_sigma_mm"])
        face = int(np.nanargmax(smoothed))
        far = (np.linalg.norm(candidates - candidates[face], axis=1) >= spec["outside_min_distance_mm"]) \
            & np.isfinite(smoothed)
        if not far.any():
            raise ConfigError(f"{where}: no candidate point lies {spec['outside_min_distance_mm']:g} mm or more from "
                              "the face site; lower outside_min_distance_mm")
        control = np.flatnonzero(far)[np.nanargmin(smoothed[far])]
        points = np.array([candidates[face], candidates[control]])
    elif spec["method"] == "explicit":
        points = np.array([spec["face_site_mm"], spec["control_site_mm"]])
    else:
        points = _plan_sites(spec, where, config.model)
    check_site_separation(points[0], points[1], spec["recording_radius_mm"], where)
    check_on_sheet(points, sheet, where)
    values, counts = multi_unit_dprime(responses, is_face, sheet, points, spec["recording_radius_mm"])
    return {name: {"x_mm": float(p[0]), "y_mm": float(p[1]), "dprime": float(v), "n_units": int(n)}
            for name, p, v, n in zip(("face", "control"), points, values, counts)}


def check_on_sheet(points, sheet, where: str) -> None:
    """Every site of ``points`` ([x, y] cortex mm) must lie on ``sheet``."""
    off = [tuple(round(float(v), 3) for v in p) for p in points if not sheet.contains(tuple(p))]
    if off:
        x0, x1, y0, y1 = sheet.extent_mm
        raise ConfigError(f"{where}: site(s) {off} lie off the sheet (x in [{x0:g}, {x1:g}], y in [{y0:g}, {y1:g}] "
                          "cortex mm)")


def _plan_sites(spec: dict, where: str, model: str) -> np.ndarray:
    """The cortex points of the plan's two electrodes, registered on its chosen model (which must be ``model``)."""
    import pandas as pd

    from stimsim.analysis.plan_readback import read_summary
    from stimsim.models.registry import model_path

    path = Path(spec["plan"]) / "sites.csv"
    if not path.is_file():
        raise ConfigError(f"{where}: plan {spec['plan']} has no sites.csv; give a directory written by `stimsim plan`")
    summary_path, summary = read_summary(spec["plan"])  # every file of the plan checked
    chosen = summary.get("chosen_model")
    if not isinstance(chosen, str):
        raise FileFormatError(summary_path, "field 'chosen_model' must name the plan's chosen model")
    if model != chosen and model_path(model).resolve() != model_path(chosen).resolve():
        raise ConfigError(f"{where}: the plan's sites were registered on its chosen model {chosen!r}, not on "
                          f"{model!r}; run on model = {chosen!r} (or --model {chosen})")
    table = pd.read_csv(path)
    points = []
    for key in ("face_electrode", "control_electrode"):
        match = table[table["electrode_id"].astype(str) == str(spec[key])]
        if match.empty:
            raise ConfigError(f"{where}: {key} {spec[key]!r} is not a working electrode of {path} (it lists the "
                              f"plan's working electrodes; broken and unreliable ones are left out): "
                              f"{', '.join(map(str, table['electrode_id'][:10]))}, ...")
        points.append([float(match["cortex_x_mm"].iloc[0]), float(match["cortex_y_mm"].iloc[0])])
    return np.array(points)


def _limits(safety: dict) -> SafetyLimits:
    """The safety limits of a file's ``[safety]`` table."""
    return SafetyLimits(max_shannon_k=safety["max_shannon_k"],
                        **({} if safety["electrode_area_um2"] is None else
                           {"electrode_area_um2": safety["electrode_area_um2"]}))


def _enforce(protocols: dict, limits: SafetyLimits, override: str | None, where: str) -> dict:
    """The safety record of the protocols (current µA → stimulation, rising): the top current's report (refused
    without an override if it violates a limit) with ``currents_outside_limits_uA``, every current that does."""
    outside = [current for current, stim in protocols.items() if not check_protocol(stim, limits).passed]
    top = max(protocols)
    try:
        report = enforce(protocols[top], limits, override=override)
    except SafetyError as exc:
        raise SafetyError(f"{where} at {_currents_text(outside)}: {exc}") from None
    return {**report.to_dict(), "currents_outside_limits_uA": outside}


def _currents_text(currents_uA) -> str:
    """``[300, 1000]`` → ``"300 and 1000 µA"``."""
    names = [f"{current:g}" for current in currents_uA]
    return (", ".join(names[:-1]) + " and " if len(names) > 1 else "") + f"{names[-1]} µA"


def _override_note(safety: dict) -> str:
    """The note of a run outside the safety limits under an override, naming every current outside them."""
    return (f"the protocol is outside the safety limits at {_currents_text(safety['currents_outside_limits_uA'])}, run "
            f"under the file's override ({safety['override_reason']}): {'; '.join(safety['violations'])}")


def _conditions(config: VisualizeConfig, layer: str, sites: dict, responses: np.ndarray):
    """Conditions in column order: unstimulated, the face site at each current, the control site and the
    scrambled one at the top current (None: made from the face site's effect by permuting units)."""
    template = dict(config.stimulation)
    if config.additive_scale == "sd":
        try:
            resolved = additive_scale_record(template["activation_per_Hz"], responses)
        except ConfigError as exc:
            raise ConfigError(f"{config.source} {exc}") from None  # the message names its table
        template["activation_per_Hz"] = resolved["activation_per_Hz"]
    top = config.currents_uA[-1]
    stim = lambda site, current: perturbation_from_dict({  # noqa: E731
        **template, "layer": layer, "current_uA": current,
        "sites_mm": [[sites[site]["x_mm"], sites[site]["y_mm"]]]})
    safety = _enforce({current: stim("face", current) for current in config.currents_uA}, _limits(config.safety),
                      config.safety["override"], f"{config.source} [safety]")
    face = lambda current: (f"face_site_{_current_label(current)}", "face_site", current,  # noqa: E731
                            (sites["face"]["x_mm"], sites["face"]["y_mm"]))
    rows = [("unstimulated", "unstimulated", 0.0, (np.nan, np.nan))] + [face(c) for c in config.currents_uA] + [
        (f"control_site_{_current_label(top)}", "control_site", top, (sites["control"]["x_mm"], sites["control"]["y_mm"])),
        (f"scrambled_{_current_label(top)}", "scrambled", top, (sites["face"]["x_mm"], sites["face"]["y_mm"]))]
    conditions = []
    for label, kind, current, _ in rows:
        if kind == "unstimulated":
            conditions.append(Condition(label))
        elif kind == "scrambled":
            conditions.append(None)
        else:
            conditions.append(Condition(label, (stim(kind.split("_")[0], current),)))
    labels, kinds, currents, positions = (list(column) for column in zip(*rows))
    return conditions, labels, kinds, currents, positions, template, safety


# --- outputs ------------------------------------------------------------------------------------
def _dataset(rows, groups, originals, percepts, losses, p_face, p_original, labels, kinds, currents, positions,
             record) -> xr.Dataset:
    channels = ["gray"] if originals.shape[1] == 1 else ["red", "green", "blue"]
    image_dims = ("stimulus_id", "condition", "y", "x", "channel")
    positions = np.asarray(positions, dtype=np.float64)
    return xr.Dataset(
        {"percept": (image_dims, percepts.permute(0, 1, 3, 4, 2).numpy(), {"units": "intensity in [0, 1]"}),
         "original": (("stimulus_id", "y", "x", "channel"), originals.permute(0, 2, 3, 1).numpy(),
                      {"units": "intensity in [0, 1]"}),
         "p_face": (("judge", "stimulus_id", "condition"), p_face, {"units": "probability"}),
         "p_face_original": (("judge", "stimulus_id"), p_original, {"units": "probability"}),
         "match_loss": (("stimulus_id", "condition"), losses,
                        {"units": "mean squared error / mean square of the unperturbed activity"})},
        coords={"stimulus_id": np.asarray(rows.stimulus_id, dtype=object), "group": ("stimulus_id", groups.astype(object)),
                "condition": np.asarray(labels, dtype=object), "kind": ("condition", np.asarray(kinds, dtype=object)),
                "current_uA": ("condition", np.asarray(currents, dtype=np.float64), {"units": "µA"}),
                "site_x_mm": ("condition", positions[:, 0], {"units": "mm (cortex)"}),
                "site_y_mm": ("condition", positions[:, 1], {"units": "mm (cortex)"}),
                "judge": np.asarray(["own", "independent"], dtype=object), "channel": channels},
        attrs={"model": record["model"], "judge_model": record["judge_model"], "layer": record["layer"],
               "config_json": json.dumps(record["config"], sort_keys=True),
               "software_json": json.dumps(record["software"], sort_keys=True), "created_utc": record["created_utc"],
               "notes_json": json.dumps(record["notes"])})
