"""Plan files (TOML): what to plan on, with which models, under which constraints.

Tables and keys (every length in mm, current in µA; unknown keys are errors):

top level       name, description, seed, task ("sequence_2afc": the 2AFC of Mehrer et al. 2025;
                "face_categorization": the face / non-face task of Afraz et al. 2006)
[models]        candidates (shipped names or model directories), n_folds (ridge CV folds)
[subject]       config = a virtual-subject file (``stimsim subject make`` format) or dir = a subject
                directory: plan on its recordings (truth is read only to validate)
[recordings]    instead of [subject]: path (.nc / .nwb), images (list of stimulus-set tables, as in
                experiment files), layout ("10x10", "8x8", .csv or .cmp), layout_ids ("channel": a .cmp's
                Cerebus channel numbers, or "label": its label column), pitch_mm (a .cmp's electrode spacing,
                mm; default 0.4), names (stimsim name → lab name),
                electrode_group (an NWB file's ElectrodeGroup to plan on, when it holds several arrays)
[array]         broken_electrodes, min_reliability (split-half; below it an electrode is not working),
                anatomical = {ap_mm, ml_mm, rotation_deg, hemisphere, reference} (optional)
[registration]  n_boot, allow_scale
[sequences]     see :class:`stimsim.sequences.SequenceSpec`
[decoder]       the 2AFC decoder: see :class:`stimsim.paradigms.sequence_2afc.TaskSpec`
[face_task]     the face task's images and decoder: see :class:`stimsim.planning.face_task.FaceTaskSpec`
                ([sequences] and [decoder] belong to the 2AFC and are refused with the face task)
[stimulation]   current_uA, frequency_Hz, pulse_width_ms, interphase_ms, train_ms, waveform
[safety]        max_shannon_k, electrode_area_um2, max_charge_per_phase_nC, override (a reason)
[selection]     n_sites, min_separation_mm, metric ("euclidean" / "manhattan")
[session]       the lab's session: trials_per_site (even, default 400; the power forecast and the trial list),
                train_onset_ms (train onset relative to image onset, default 0)
[display]       size_deg (image width, degrees of visual angle, default 8), viewing_distance_cm (default 57)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stimsim.arrays.anatomy import AnatomicalPose
from stimsim.arrays.layout import cmp_options
from stimsim.config import Section, load_toml
from stimsim.errors import ConfigError
from stimsim.hashing import json_sha256, sha256_of
from stimsim.limits import MAX_SEED
from stimsim.paradigms.sequence_2afc import TaskSpec
from stimsim.planning.face_task import FaceTaskSpec
from stimsim.planning.rig import RigSpec, read_rig_spec
from stimsim.planning.selection import SelectionSpec
from stimsim.recordings import FIELD_NAMES
from stimsim.sequences import SequenceSpec
from stimsim.stimulation import SafetyLimits

TASKS = ("sequence_2afc", "face_categorization")
#: The effect each task predicts per site (names of the columns and keys of the outputs).
EFFECTS = {"sequence_2afc": "delta_auc", "face_categorization": "delta_p_face"}
STIMULATION_KEYS = {"current_uA": 50.0, "frequency_Hz": 200.0, "pulse_width_ms": 0.2, "interphase_ms": 0.1,
                    "train_ms": 50.0}


@dataclass
class PlanConfig:
    name: str
    path: Path
    raw: dict
    task: str
    seed: int
    candidates: list
    n_folds: int
    subject_config: Path | None
    subject_dir: Path | None
    recordings: dict | None
    min_reliability: float
    anatomical: dict | None
    n_boot: int
    allow_scale: bool
    sequences: SequenceSpec
    task_spec: TaskSpec
    stimulation: dict
    safety: SafetyLimits
    safety_override: str | None
    selection: SelectionSpec
    face_task: FaceTaskSpec = field(default_factory=FaceTaskSpec)
    rig: RigSpec = field(default_factory=RigSpec)
    description: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def effect(self) -> str:
        """What the task predicts per site: "delta_auc" (2AFC) or "delta_p_face" (face task)."""
        return EFFECTS[self.task]

    def to_dict(self) -> dict:
        """Every resolved parameter (JSON-ready)."""
        return {
            "name": self.name, "description": self.description, "file": str(self.path), "task": self.task,
            "seed": self.seed, "models": {"candidates": list(self.candidates), "n_folds": self.n_folds},
            "subject": {"config": str(self.subject_config) if self.subject_config else None,
                        "dir": str(self.subject_dir) if self.subject_dir else None},
            "recordings": self.recordings,
            "array": {"broken_electrodes": list(self.selection.broken_electrodes),
                      "min_reliability": self.min_reliability, "anatomical": self.anatomical},
            "registration": {"n_boot": self.n_boot, "allow_scale": self.allow_scale},
            **({"sequences": self.sequences.to_dict(), "task_spec": self.task_spec.to_dict()}
               if self.task == "sequence_2afc" else {"face_task": self.face_task.to_dict()}),
            "stimulation": dict(self.stimulation),
            "safety": {**self.safety.to_dict(), "override": self.safety_override},
            "selection": self.selection.to_dict(),
            **self.rig.to_dict(),
        }

    def input_files(self) -> dict:
        """sha256 of every file the plan reads its inputs from: the recordings, a layout file and image tables, or the
        virtual subject's file (the images of a folder source are not included)."""
        paths = []
        if self.recordings is not None:
            paths.append(self.recordings["path"])
            if self.recordings["layout"] not in ("10x10", "8x8"):
                paths.append(self.recordings["layout"])
            paths += [entry["path"] for entry in self.recordings["images"]
                      if "path" in entry and Path(entry["path"]).is_file()]
        if self.subject_config is not None:
            paths.append(self.subject_config)
        return {str(p): sha256_of(p) for p in paths}

    def digest(self) -> str:
        """sha256 of the resolved parameters and of the input files: a cache of another configuration, or of files
        that have changed since, is never reused."""
        record = self.to_dict()
        for key in ("description", *RigSpec().to_dict()):  # the session and display change no computed phase
            record.pop(key)
        record["input_sha256"] = self.input_files()
        return json_sha256(record)


def _number_or_none(section: Section, key: str):
    value = section.get(key, (int, float), None)
    return None if value is None else float(value)


def _spec(kind, where: str, table: str, **values):
    """``kind(**values)``; its errors name the file and the table."""
    try:
        return kind(**values)
    except ConfigError as exc:
        raise ConfigError(f"{where} [{table}]: {exc}") from None


def _check_model(name: str, where: str) -> None:
    """A model name that is neither shipped nor a model directory is an error naming where it was given."""
    from stimsim.errors import DataError
    from stimsim.models.registry import model_path

    try:
        model_path(name)
    except DataError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_plan_config(path) -> PlanConfig:
    path = Path(path)
    raw = load_toml(path)
    where = str(path)
    root = Section(raw, where)
    name = root.get("name", str, path.stem)
    description = root.get("description", str, "")
    task = root.get("task", str, "sequence_2afc", choices=TASKS)
    seed = root.get("seed", int, 0, minimum=0, maximum=MAX_SEED)

    models = root.section("models", required=True)
    candidates = models.get("candidates", list)
    if not candidates or not all(isinstance(c, str) and c for c in candidates):
        raise ConfigError(f"{where} [models]: candidates must be a non-empty list of model names or directories")
    candidates = [str((path.parent / c).resolve()) if ("/" in c and not Path(c).is_absolute()) else c
                  for c in candidates]
    for candidate in candidates:
        _check_model(candidate, f"{where} [models] candidates")
    n_folds = models.get("n_folds", int, 10, minimum=2)
    models.finish()

    subject_config = subject_dir = recordings = None
    if "subject" in raw and "recordings" in raw:
        raise ConfigError(f"{where}: give either [subject] (a virtual subject) or [recordings] (a lab's), not both")
    if "subject" in raw:
        subject = root.section("subject")
        config_file = subject.get("config", str, None)
        directory = subject.get("dir", str, None)
        subject.finish()
        if (config_file is None) == (directory is None):
            raise ConfigError(f"{where} [subject]: give exactly one of config (a subject file) or dir (a subject directory)")
        if config_file is not None:
            subject_config = (path.parent / config_file).resolve()
            if not subject_config.is_file():
                raise ConfigError(f"{where} [subject]: config file {subject_config} not found")
        else:
            subject_dir = (path.parent / directory).resolve()
    elif "recordings" in raw:
        section = root.section("recordings")
        recordings = {
            "path": str((path.parent / section.get("path", str)).resolve()),
            "images": section.get("images", list),
            "layout": section.get("layout", str, "10x10"),
            "layout_ids": section.get("layout_ids", str, "channel"),
            "pitch_mm": section.get("pitch_mm", float, None),
            "names": section.get("names", dict, {}),
            "electrode_group": section.get("electrode_group", str, None),
        }
        section.finish()
        if not Path(recordings["path"]).is_file():
            raise ConfigError(f"{where} [recordings] path: file {recordings['path']} not found")
        layout_spec = recordings["layout"]
        if layout_spec not in ("10x10", "8x8"):
            recordings["layout"] = str((path.parent / layout_spec).resolve())
            if not Path(recordings["layout"]).is_file():
                raise ConfigError(f"{where} [recordings] layout: file {recordings['layout']} not found")
        if recordings["electrode_group"] is not None and not recordings["path"].lower().endswith(".nwb"):
            raise ConfigError(f"{where} [recordings] electrode_group: selects an ElectrodeGroup (array) of an NWB file; "
                              f"the recordings are {Path(recordings['path']).name}")
        recordings["pitch_mm"] = cmp_options(layout_spec, recordings["layout_ids"], recordings["pitch_mm"],
                                             where=f"{where} [recordings]").get("cmp_pitch_mm")
        unknown = sorted(set(recordings["names"]) - set(FIELD_NAMES))
        if unknown or not all(isinstance(v, str) and v for v in recordings["names"].values()):
            raise ConfigError(f"{where} [recordings] names: maps stimsim's fields {list(FIELD_NAMES)} onto your names "
                              f"(text), e.g. {{ response = \"mua\" }}; got {recordings['names']!r}")
        for entry in recordings["images"]:
            if not isinstance(entry, dict):
                raise ConfigError(f"{where} [recordings]: images must be tables such as {{ source = \"folder\", path = ... }}")
            if "path" in entry:
                entry["path"] = str((path.parent / entry["path"]).resolve())
    else:
        raise ConfigError(f"{where}: missing [subject] (a virtual subject) or [recordings] (a lab's recordings)")

    array = root.section("array")
    broken = array.get("broken_electrodes", list, [])
    min_reliability = array.get("min_reliability", float, 0.3, minimum=-1.0, maximum=1.0)
    anatomical = array.get("anatomical", dict, None)
    array.finish()
    if anatomical is not None:  # checked now, not when the outputs are written after the plan's work
        try:
            AnatomicalPose.from_dict(anatomical)
        except ConfigError as exc:
            raise ConfigError(f"{where} [array] anatomical: {str(exc).removeprefix('anatomical pose: ')}") from None

    registration = root.section("registration")
    n_boot = registration.get("n_boot", int, 10, minimum=2)
    allow_scale = registration.get("allow_scale", bool, False)
    registration.finish()

    if task == "face_categorization":
        extra = [name for name in ("sequences", "decoder") if name in raw]
        if extra:
            raise ConfigError(f"{where}: {extra} belong to task = \"sequence_2afc\"; the face task takes [face_task]")
    elif "face_task" in raw:
        raise ConfigError(f"{where}: [face_task] belongs to task = \"face_categorization\" (task is {task!r})")
    face = root.section("face_task")
    defaults = FaceTaskSpec()
    face_spec = _spec(FaceTaskSpec, where, "face_task", n_per_class=face.get("n_per_class", int, defaults.n_per_class),
                      signal_percent=tuple(face.get("signal_percent", list, list(defaults.signal_percent))),
                      fit_fraction=face.get("fit_fraction", float, defaults.fit_fraction),
                      C=face.get("C", float, defaults.C))
    face.finish()
    sequences = root.section("sequences")
    sequence_spec = _spec(SequenceSpec, where, "sequences", **{key: sequences.get(key, type(default), default)
                                                               for key, default in SequenceSpec().to_dict().items()})
    sequences.finish()
    task_section = root.section("decoder")
    task_spec = _spec(TaskSpec, where, "decoder",
                      **{key: task_section.get(key, int if isinstance(default, int) else float, default)
                         for key, default in TaskSpec().to_dict().items()})
    task_section.finish()

    stim = root.section("stimulation")
    stimulation = {key: stim.get(key, float, default, minimum=0.0) for key, default in STIMULATION_KEYS.items()}
    stimulation["waveform"] = stim.get("waveform", str, "biphasic_cathodic_first")
    stim.finish()
    if stimulation["frequency_Hz"] <= 0:
        raise ConfigError(f"{where} [stimulation]: 'frequency_Hz' must be > 0 (a train at 0 Hz delivers no pulse), "
                          f"got {stimulation['frequency_Hz']:g}")

    safety = root.section("safety")
    limits = SafetyLimits(max_shannon_k=safety.get("max_shannon_k", float, 1.85),
                          electrode_area_um2=safety.get("electrode_area_um2", float, 2000.0),
                          max_charge_per_phase_nC=_number_or_none(safety, "max_charge_per_phase_nC"))
    override = safety.get("override", str, None)
    safety.finish()
    if override is not None and not override.strip():
        raise ConfigError(f"{where} [safety]: 'override' must be the reason the limits are overridden (non-empty "
                          "text); leave the key out to enforce them")

    selection = root.section("selection")
    selection_spec = _spec(SelectionSpec, where, "selection", n_sites=selection.get("n_sites", int, 16),
                                   min_separation_mm=selection.get("min_separation_mm", float, 0.0),
                                   metric=selection.get("metric", str, "euclidean"),
                                   broken_electrodes=tuple(str(b) for b in broken))
    selection.finish()
    session, display = root.section("session"), root.section("display")
    rig = read_rig_spec(session, display, where, sequence_spec.n_steps if task == "sequence_2afc" else 1)
    session.finish()
    display.finish()
    root.finish()
    return PlanConfig(name=name, path=path.resolve(), raw=raw, task=task, seed=seed, candidates=candidates,
                      n_folds=n_folds, subject_config=subject_config, subject_dir=subject_dir, recordings=recordings,
                      min_reliability=min_reliability, anatomical=anatomical, n_boot=n_boot, allow_scale=allow_scale,
                      sequences=sequence_spec, task_spec=task_spec, stimulation=stimulation, safety=limits,
                      safety_override=override, selection=selection_spec, face_task=face_spec,
                      rig=rig, description=description)
