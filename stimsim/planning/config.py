"""Plan files (TOML): what to plan on, with which models, under which constraints.

Tables and keys (every length in mm, current in µA; unknown keys are errors), declared by :class:`PlanFile`,
whose JSON Schema ships as ``plan.schema.json`` beside this module:

top level       name, description, seed, task (a registered plan task, :mod:`stimsim.planning.tasks`:
                "sequence_2afc", the 2AFC of Mehrer et al. 2025, the default; "face_categorization",
                the face / non-face task of Afraz et al. 2006)
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
(the task's)    the tables of the plan's task (:attr:`stimsim.planning.tasks.PlanTask.tables`): [sequences]
                and [decoder] of the 2AFC, [face_task] of the face task; a table of another task is refused
[stimulation]   current_uA, frequency_Hz, pulse_width_ms, interphase_ms, train_ms, waveform, and any other key of an
                electrical stimulation (spread, form, combine, ...; as in experiment files); additive_scale
                ("activation" or "sd": form = "additive"'s activation_per_Hz in SDs of each model's IT response to
                the plan's mapping images, resolved per model)
[safety]        max_shannon_k, electrode_area_um2, max_charge_per_phase_nC, override (a reason)
[selection]     n_sites, min_separation_mm, metric ("euclidean" / "manhattan")
[session]       the lab's session: trials_per_site (even, default 400; the power forecast and the trial list),
                train_onset_ms (train onset relative to image onset, default 0)
[display]       size_deg (image width, degrees of visual angle, default 8), viewing_distance_cm (default 57)
[percepts]      optional: config = a visualisation file (``stimsim visualize`` format): the report shows the
                predicted percepts of stimulating the best-ranked chosen site in the chosen model, with that file's
                images, currents, inversion and judge, the lowest-ranked working electrode as the control site
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

from stimsim.data.stimuli import source_files
from stimsim.lab.arrays.anatomy import AnatomicalPose
from stimsim.lab.arrays.layout import cmp_options
from stimsim.lab.recordings import FIELD_NAMES
from stimsim.planning.rig import DisplayTable, RigSpec, SessionTable
from stimsim.planning.selection import SelectionSpec
from stimsim.planning.tasks import PLAN_TASKS, PlanTask, get_plan_task, stimulation_at
from stimsim.stimulation import ADDITIVE_SCALES, ElectricalStimulation, SafetyLimits, check_additive_scale
from stimsim.stimulation.safety import FileChargeLimit, FileElectrodeArea, FileShannonK
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError, StimsimError
from stimsim.utilities.filemodels import FileModel, Text, validate
from stimsim.utilities.hashing import json_sha256, sha256_of
from stimsim.utilities.limits import MAX_SEED
from stimsim.utilities.ordering import natural_key

#: The plan task of a file that names none.
DEFAULT_TASK = "sequence_2afc"
#: Where the JSON Schema of plan files ships.
SCHEMA_PATH = Path(__file__).with_name("plan.schema.json")

_NonNegative = Annotated[float, Field(ge=0)]


class ModelsTable(FileModel):
    """``[models]``: the candidate models (shipped names or model directories) and the ridge CV folds."""

    candidates: Annotated[list[Text], Field(min_length=1)]
    n_folds: Annotated[int, Field(ge=2)] = 10


class SubjectTable(FileModel):
    """``[subject]``: exactly one of ``config`` (a virtual-subject file) and ``dir`` (a subject directory)."""

    config: Text | None = None
    dir: Text | None = None

    @model_validator(mode="after")
    def _one(self):
        if (self.config is None) == (self.dir is None):
            raise ValueError("give exactly one of config (a subject file) or dir (a subject directory)")
        return self


class RecordingsTable(FileModel):
    """``[recordings]``: a lab's passive-viewing recordings, their images and the array's layout."""

    path: Text
    images: Annotated[list[dict[str, Any]], Field(min_length=1)]
    layout: Text = "10x10"
    layout_ids: Text = "channel"
    pitch_mm: float | None = None  # a .cmp map's spacing, checked against the plausible range
    names: dict[str, Any] = {}
    electrode_group: Text | None = None


class ArrayTable(FileModel):
    """``[array]``: broken electrodes, the reliability below which an electrode is not working, the anatomical
    pose (optional)."""

    broken_electrodes: list[Annotated[int, Field(strict=True)] | Text] = []
    min_reliability: Annotated[float, Field(ge=-1, le=1)] = 0.3
    anatomical: dict[str, Any] | None = None

    @field_validator("broken_electrodes")
    @classmethod
    def _once_each(cls, ids):
        texts = [str(e) for e in ids]
        again = sorted({e for e in texts if texts.count(e) > 1}, key=natural_key)
        if again:
            raise ValueError(f"'broken_electrodes' lists electrode(s) {again} more than once (a number and its text "
                             "name the same id); give each broken electrode once")
        return ids


class RegistrationTable(FileModel):
    """``[registration]``: bootstrap resamples of the array's registration onto each model; allow a scale."""

    n_boot: Annotated[int, Field(ge=2)] = 10
    allow_scale: bool = False


#: The electrical kind's defaults, which a plan's train takes.
_ELECTRICAL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ElectricalStimulation)}
#: Keys of an electrical stimulation that a plan sets elsewhere, and why.
_NOT_IN_STIMULATION = {
    "kind": "is not set here: a plan stimulates electrically",
    "sites_mm": "is not set here: the sites are the array's electrodes",
    "layer": "is not set here: a plan stimulates the models' IT",
    "onset_ms": "is not set here: the train's onset relative to the image is [session] train_onset_ms",
}


class StimulationTable(FileModel):
    """``[stimulation]``: the electrical train given at every candidate site: the keys below and any other of
    :class:`stimsim.stimulation.ElectricalStimulation` (``spread``, ``form``, ``combine``, ...), checked by it, as
    an experiment's ``[stimulation]`` is."""

    model_config = ConfigDict(extra="allow", json_schema_extra=lambda schema: _electrical_parameters(schema))
    __pydantic_extra__: dict[str, Any] = Field(init=False)  # the electrical kind's other keys
    current_uA: _NonNegative = _ELECTRICAL_DEFAULTS["current_uA"]
    frequency_Hz: _NonNegative = _ELECTRICAL_DEFAULTS["frequency_Hz"]
    pulse_width_ms: _NonNegative = _ELECTRICAL_DEFAULTS["pulse_width_ms"]
    interphase_ms: _NonNegative = _ELECTRICAL_DEFAULTS["interphase_ms"]
    train_ms: _NonNegative = _ELECTRICAL_DEFAULTS["train_ms"]
    waveform: Text = _ELECTRICAL_DEFAULTS["waveform"]
    additive_scale: Annotated[Literal[ADDITIVE_SCALES], Field(description=(
        'form = "additive": "activation" (activation_per_Hz in each model\'s activation units) or "sd" (in SDs of '
        "each model's IT response to the plan's mapping images, resolved per model: the same relative strength in "
        "candidates and subject)"))] = "activation"

    @model_validator(mode="before")
    @classmethod
    def _refuse_keys_set_elsewhere(cls, data):
        for key, why in _NOT_IN_STIMULATION.items():
            if isinstance(data, dict) and key in data:
                raise ValueError(f"{key!r} {why}")
        return data


def _electrical_parameters(schema: dict) -> None:
    """The JSON Schema of a plan's ``[stimulation]``: the electrical kind's parameters as it declares them
    (:meth:`stimsim.stimulation.base.Perturbation.parameters_schema`: a train of more than 0 Hz), but for the keys
    a plan sets elsewhere."""
    declared = ElectricalStimulation.parameters_schema()
    properties = {key: value for key, value in declared["properties"].items() if key not in _NOT_IN_STIMULATION}
    properties["additive_scale"] = schema["properties"]["additive_scale"]
    schema.update(properties=properties, additionalProperties=False)
    schema.pop("required", None)


class SafetyTable(FileModel):
    """``[safety]``: the limits every site's train must respect, and an override with its reason."""

    max_shannon_k: FileShannonK = 1.85
    electrode_area_um2: FileElectrodeArea = 2000.0
    max_charge_per_phase_nC: FileChargeLimit | None = None
    override: str | None = None

    @field_validator("override")
    @classmethod
    def _reason(cls, override):
        if override is not None and not override.strip():
            raise ValueError("'override' must be the reason the limits are overridden (non-empty text); leave the "
                             "key out to enforce them")
        return override


class SelectionTable(SelectionSpec):
    """``[selection]``: :class:`~stimsim.planning.selection.SelectionSpec` but for the broken electrodes, which
    ``[array]`` gives."""

    model_config = {"json_schema_extra": lambda schema: schema["properties"].pop("broken_electrodes", None)}

    @model_validator(mode="before")
    @classmethod
    def _refuse_broken(cls, data):
        if isinstance(data, dict) and "broken_electrodes" in data:
            raise ValueError("'broken_electrodes' is given in [array]")
        return data


class PerceptsTable(FileModel):
    """``[percepts]``: a visualisation file (read relative to the plan file) for the report's percept view."""

    config: Text


class PlanFile(FileModel):
    """A plan file: what to plan on (a virtual subject or a lab's recordings), with which candidate models, under
    which constraints; the tables are described in the module docstring. The task's own tables are added by
    :func:`plan_file_model`."""

    name: Text | None = None
    description: str = ""
    task: Text = DEFAULT_TASK
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    models: ModelsTable
    subject: SubjectTable | None = None
    recordings: RecordingsTable | None = None
    array: ArrayTable = ArrayTable()
    registration: RegistrationTable = RegistrationTable()
    stimulation: StimulationTable = StimulationTable()
    safety: SafetyTable = SafetyTable()
    selection: SelectionTable = SelectionTable()
    session: SessionTable = SessionTable()
    display: DisplayTable = DisplayTable()
    percepts: PerceptsTable | None = None


def plan_file_model(tasks: list[PlanTask]) -> type[PlanFile]:
    """:class:`PlanFile` with ``task`` one of ``tasks`` and the tables every one of them takes (a table name that
    the plan or another of them declares with another model is a ``ConfigError``)."""
    tables: dict[str, type[FileModel]] = {}
    for task in tasks:
        for table, model in task.tables.items():
            if table in PlanFile.model_fields or tables.get(table, model) is not model:
                raise ConfigError(f"plan task {task.name!r}: its table [{table}] is already a plan table with another "
                                  f"model")
            tables[table] = model
    names = tuple(task.name for task in tasks)
    return create_model("PlanFile", __base__=PlanFile, __doc__=PlanFile.__doc__,
                        task=(Literal[names], DEFAULT_TASK if DEFAULT_TASK in names else names[0]),
                        **{table: (model, model()) for table, model in tables.items()})


def plan_schema() -> dict:
    """JSON Schema of plan files, with every registered task and its tables."""
    model = plan_file_model([task for _, task in PLAN_TASKS.items()])
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "stimsim plan file",
            "description": "A site-planning job (TOML); see stimsim.planning.config.", **model.model_json_schema()}


@dataclass
class PlanConfig:
    name: str
    path: Path
    raw: dict
    task: str
    task_options: SimpleNamespace
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
    stimulation: dict
    safety: SafetyLimits
    safety_override: str | None
    selection: SelectionSpec
    rig: RigSpec = field(default_factory=RigSpec)
    description: str = ""
    extra: dict = field(default_factory=dict)
    percepts: Path | None = None
    additive_scale: str = "activation"

    @property
    def plan_task(self) -> PlanTask:
        """The registered task the plan rehearses."""
        return get_plan_task(self.task)

    @property
    def effect(self) -> str:
        """What the task predicts per site (e.g. "delta_auc" for the 2AFC, "delta_p_face" for the face task)."""
        return self.plan_task.effect

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
            **self.plan_task.record(self.task_options),
            "stimulation": {**self.stimulation, "additive_scale": self.additive_scale},
            "safety": {**self.safety.to_dict(), "override": self.safety_override},
            "selection": self.selection.to_dict(),
            **self.rig.to_dict(),
            **({} if self.percepts is None else {"percepts": {"config": str(self.percepts)}}),
        }

    def input_files(self) -> dict:
        """sha256 of every file the plan reads its inputs from: the recordings, a layout file, the image tables and
        the image files they name or a folder holds, or the virtual subject's file."""
        paths = []
        if self.recordings is not None:
            paths.append(self.recordings["path"])
            if self.recordings["layout"] not in ("10x10", "8x8"):
                paths.append(self.recordings["layout"])
            paths += [file for entry in self.recordings["images"] for file in source_files(entry)]
        if self.subject_config is not None:
            paths.append(self.subject_config)
        if self.percepts is not None:
            paths.append(self.percepts)
        return {str(p): sha256_of(p) for p in paths}

    def digest_record(self) -> dict:
        """What the plan's phases are computed from: the resolved parameters and the sha256 of every input file. The
        session, the display and the selection (the constraints the ranked sites are chosen under, applied after
        every phase) change no computed phase, nor do the plan's name (by default its file's name) and its file's own
        path. Paths under the plan file's folder are given relative to it, so that a project folder
        moved or copied whole (to the rig's machine, say) resumes its plans."""
        record = self.to_dict()
        for key in ("name", "description", "file", "selection", *RigSpec().to_dict()):
            record.pop(key)
        record["input_sha256"] = self.input_files()
        return self.portable(record)

    def portable(self, record):
        """``record`` (JSON) with every absolute path under the plan file's folder, as a value or a key, made
        relative to that folder."""
        return _paths_relative_to(record, self.path.resolve().parent)

    def digest(self) -> str:
        """sha256 of :meth:`digest_record`: a cache of another configuration, or of files that have changed since, is
        never reused."""
        return json_sha256(self.digest_record())


def _paths_relative_to(value, folder: Path):
    """``value`` (JSON) with every absolute path under ``folder``, as a value or a key, relative to it."""
    if isinstance(value, dict):
        return {_paths_relative_to(key, folder): _paths_relative_to(item, folder) for key, item in value.items()}
    if isinstance(value, list):
        return [_paths_relative_to(item, folder) for item in value]
    if isinstance(value, str) and Path(value).is_absolute() and Path(value).is_relative_to(folder):
        return Path(value).relative_to(folder).as_posix()
    return value


def _check_model(name: str, where: str) -> None:
    """A model name that is neither shipped nor a model directory is an error naming where it was given."""
    from stimsim.models.registry import model_path
    from stimsim.utilities.errors import DataError

    try:
        model_path(name)
    except DataError as exc:
        raise ConfigError(f"{where}: {exc}") from None


#: The files of a subject directory (``stimsim subject make``) that a plan reads.
SUBJECT_DIR_FILES = ("subject.toml", "truth.json", "recordings.nc", "stimuli.npz")


def _check_subject_dir(directory: Path, where: str) -> None:
    """A ``[subject] dir`` that is not a subject directory is an error naming what it lacks (and, for a plan's
    folder, where that plan keeps its subject)."""
    if not directory.is_dir():
        raise ConfigError(f"{where}: {directory} is not a directory; give the folder `stimsim subject make` wrote")
    missing = [name for name in SUBJECT_DIR_FILES if not (directory / name).is_file()]
    if missing:
        inner = directory / "subject"
        hint = (f"; {inner} is one (a plan keeps the subject it made in its subject/ folder)"
                if all((inner / name).is_file() for name in SUBJECT_DIR_FILES) else "")
        raise ConfigError(f"{where}: {directory} is not a subject directory (it lacks {', '.join(missing)}; "
                          f"`stimsim subject make` writes them){hint}")


def _check_distinct_models(names: list, where: str) -> None:
    """Two candidates that are one model (the same name, or a shipped name and its directory) are an error: the plan
    would average over fewer candidates than the file lists."""
    from stimsim.models.registry import model_path

    seen = {}
    for name in names:
        directory = model_path(name).resolve()
        if directory in seen:
            raise ConfigError(f"{where}: {name!r} is the same model as {seen[directory]!r}; list each candidate "
                              "once (the prediction is the mean over distinct candidates)")
        seen[directory] = name


def load_plan_config(path) -> PlanConfig:
    """Read and check a plan file: the tables of :class:`PlanFile`, then what depends on several of them and
    on the files they name; relative paths are taken from the file's folder."""
    path = Path(path)
    raw = load_toml(path)
    where = str(path)
    plan_task = _plan_task(raw, where)
    checked = validate(plan_file_model([plan_task]), raw, where)
    candidates = [str((path.parent / c).resolve()) if ("/" in c and not Path(c).is_absolute()) else c
                  for c in checked.models.candidates]
    for candidate in candidates:
        _check_model(candidate, f"{where} [models] candidates")
    _check_distinct_models(candidates, f"{where} [models] candidates")

    subject_config = subject_dir = recordings = None
    if checked.subject is not None and checked.recordings is not None:
        raise ConfigError(f"{where}: give either [subject] (a virtual subject) or [recordings] (a lab's), not both")
    if checked.subject is not None:
        if checked.subject.config is not None:
            subject_config = (path.parent / checked.subject.config).resolve()
            if not subject_config.is_file():
                raise ConfigError(f"{where} [subject]: config file {subject_config} not found")
        else:
            subject_dir = (path.parent / checked.subject.dir).resolve()
            _check_subject_dir(subject_dir, f"{where} [subject] dir")
    elif checked.recordings is not None:
        recordings = _recordings(checked.recordings, path.parent, f"{where} [recordings]")
    else:
        raise ConfigError(f"{where}: missing [subject] (a virtual subject) or [recordings] (a lab's recordings)")

    anatomical = checked.array.anatomical
    if anatomical is not None:  # checked now, not when the outputs are written after the plan's work
        try:
            AnatomicalPose.from_dict(anatomical)
        except ConfigError as exc:
            raise ConfigError(f"{where} [array] anatomical: {str(exc).removeprefix('anatomical pose: ')}") from None

    task_options = SimpleNamespace(**{table: getattr(checked, table) for table in plan_task.tables})
    plan_task.check(task_options, where)

    stimulation = checked.stimulation.to_dict()
    additive_scale = stimulation.pop("additive_scale")
    try:
        check_additive_scale(additive_scale, stimulation.get("form"))
        stimulation_at((0.0, 0.0), stimulation).check_delivers()
    except ConfigError as exc:
        raise ConfigError(f"{where} [stimulation]: {exc}") from None
    safety = checked.safety
    limits = SafetyLimits(max_shannon_k=safety.max_shannon_k, electrode_area_um2=safety.electrode_area_um2,
                          max_charge_per_phase_nC=safety.max_charge_per_phase_nC)
    selection = SelectionSpec(**checked.selection.model_dump(exclude={"broken_electrodes"}),
                              broken_electrodes=tuple(checked.array.broken_electrodes))
    n_steps = plan_task.steps_per_stimulus(task_options)
    if checked.session.trials_per_site < 2 * n_steps:
        raise ConfigError(f"{where} [session]: 'trials_per_site' must be >= {2 * n_steps} (every step of a sequence "
                          f"once sham and once stimulated), got {checked.session.trials_per_site}")
    percepts = None
    if checked.percepts is not None:  # checked now, so that a bad file stops the plan before any work
        from stimsim.percepts.visualize import load_config

        percepts = (path.parent / checked.percepts.config).resolve()
        if not percepts.is_file():
            raise ConfigError(f"{where} [percepts]: config file {percepts} not found")
        try:
            load_config(percepts)
        except StimsimError as exc:  # named as the plan's view, not as a file given on its own
            raise ConfigError(f"{where} [percepts] config (a `stimsim visualize` file): {exc}") from None
    return PlanConfig(name=checked.name or path.stem, path=path.resolve(), raw=raw, task=checked.task,
                      task_options=task_options, seed=checked.seed, candidates=candidates, n_folds=checked.models.n_folds,
                      subject_config=subject_config, subject_dir=subject_dir, recordings=recordings,
                      min_reliability=checked.array.min_reliability, anatomical=anatomical,
                      n_boot=checked.registration.n_boot, allow_scale=checked.registration.allow_scale,
                      stimulation=stimulation, additive_scale=additive_scale,
                      safety=limits, safety_override=safety.override, selection=selection,
                      rig=RigSpec(session=checked.session, display_table=checked.display),
                      description=checked.description, percepts=percepts)


def _plan_task(raw: dict, where: str) -> PlanTask:
    """The task a plan file names (``task``, default :data:`DEFAULT_TASK`); a table that belongs to another
    registered task is refused, naming that task."""
    name = raw.get("task", DEFAULT_TASK)
    if not isinstance(name, str) or name not in PLAN_TASKS:
        raise ConfigError(f"{where} task: must be one of {PLAN_TASKS.names()}, got {name!r}")
    task = get_plan_task(name)
    for table in sorted(set(raw) - set(PlanFile.model_fields) - set(task.tables)):
        owners = [other for other in PLAN_TASKS.names() if other != name and table in _tables_of(other)]
        if owners:
            takes = ", ".join(f"[{t}]" for t in task.tables) or "no table of its own"
            raise ConfigError(f"{where}: [{table}] belongs to task = \"{owners[0]}\"; task {name!r} takes {takes}")
    return task


def _tables_of(name: str) -> dict:
    """The tables of the registered task ``name``; none for a plug-in that cannot be loaded (the plan does not
    use it)."""
    try:
        return get_plan_task(name).tables
    except ConfigError:
        return {}


def _recordings(table: RecordingsTable, folder: Path, where: str) -> dict:
    """The ``[recordings]`` table with its paths resolved against ``folder`` and its files and options checked."""
    recordings = {**table.model_dump(), "path": str((folder / table.path).resolve()),
                  "images": [dict(entry) for entry in table.images]}
    if not Path(recordings["path"]).is_file():
        raise ConfigError(f"{where} path: file {recordings['path']} not found")
    if table.layout not in ("10x10", "8x8"):
        if Path(table.layout).suffix.lower() not in (".csv", ".cmp"):
            raise ConfigError(f"{where} layout: give \"10x10\" or \"8x8\" (a Utah array) or a layout file (.csv or a "
                              f"Blackrock .cmp), got {table.layout!r}")
        recordings["layout"] = str((folder / table.layout).resolve())
        if not Path(recordings["layout"]).is_file():
            raise ConfigError(f"{where} layout: file {recordings['layout']} not found")
    if table.electrode_group is not None and not recordings["path"].lower().endswith(".nwb"):
        raise ConfigError(f"{where} electrode_group: selects an ElectrodeGroup (array) of an NWB file; "
                          f"the recordings are {Path(recordings['path']).name}")
    recordings["pitch_mm"] = cmp_options(table.layout, table.layout_ids, table.pitch_mm, where=where).get("cmp_pitch_mm")
    unknown = sorted(set(table.names) - set(FIELD_NAMES))
    if unknown or not all(isinstance(v, str) and v for v in table.names.values()):
        raise ConfigError(f"{where} names: maps stimsim's fields {list(FIELD_NAMES)} onto your names "
                          f"(text), e.g. {{ response = \"mua\" }}; got {table.names!r}")
    for entry in recordings["images"]:
        if "path" in entry:
            entry["path"] = str((folder / entry["path"]).resolve())
    return recordings
