"""Plan files (TOML): their tables, what to plan on, with which models, under which constraints.

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
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

from stimsim.planning.rig import DisplayTable, SessionTable
from stimsim.planning.selection import SelectionSpec
from stimsim.planning.tasks import PLAN_TASKS, PlanTask
from stimsim.stimulation import ADDITIVE_SCALES, ElectricalStimulation
from stimsim.stimulation.safety import FileChargeLimit, FileElectrodeArea, FileShannonK
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.filemodels import FileModel, Text
from stimsim.utilities.limits import MAX_SEED
from stimsim.utilities.ordering import natural_key, repeated

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
        again = sorted(repeated(texts), key=natural_key)
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
            "description": "A site-planning job (TOML); see stimsim.planning.plan_file.", **model.model_json_schema()}
