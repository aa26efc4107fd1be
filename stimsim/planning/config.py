"""A plan file read and checked (:func:`load_plan_config`): its tables (:mod:`stimsim.planning.plan_file`) with
the checks that span several tables, its paths resolved, and what the plan's phases are computed from
(:meth:`PlanConfig.digest_record`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from stimsim.data.stimuli import source_files
from stimsim.lab.arrays.anatomy import AnatomicalPose
from stimsim.lab.arrays.layout import cmp_options
from stimsim.lab.recordings import FIELD_NAMES
from stimsim.planning.plan_file import DEFAULT_TASK, PlanFile, RecordingsTable, plan_file_model
from stimsim.planning.rig import RigSpec
from stimsim.planning.selection import SelectionSpec
from stimsim.planning.tasks import PLAN_TASKS, PlanTask, get_plan_task, stimulation_at
from stimsim.stimulation import SafetyLimits, check_additive_scale
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError, StimsimError
from stimsim.utilities.filemodels import validate
from stimsim.utilities.hashing import json_sha256, sha256_of


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
    checked = validate(plan_file_model([plan_task]), raw, where, "stimsim plan")
    from stimsim.models.registry import resolve_model_path

    candidates = [resolve_model_path(c, path.parent) for c in checked.models.candidates]
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
