"""The experiment file as typed models (pydantic): every table refuses unknown keys, every number
has its range, and the JSON Schema editors use (``experiment.schema.json``, shipped beside this
module) is generated from the same models.

The common tables are declared here; a paradigm adds the keys of ``[stimuli]`` it reads
(:attr:`~stimsim.paradigms.base.Paradigm.stimuli_model`, a subclass of :class:`StimuliFile`) and its
own tables (:attr:`~stimsim.paradigms.base.Paradigm.table_models`). :func:`validate_file` checks a
parsed file and turns pydantic's errors into messages that name the file, the table, the key and
what is allowed. Regenerate the shipped schema with
``python -c "from stimsim.paradigms.schema import write_schema; write_schema()"``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from stimsim.errors import ConfigError
from stimsim.models.registry import DEFAULT_MODEL
from stimsim.stimulation import PERTURBATION_KINDS

#: The JSON Schema of experiment files shipped with the package.
SCHEMA_PATH = Path(__file__).with_name("experiment.schema.json")

#: Non-empty, printable text (no control characters such as NUL or newline).
Text = Annotated[str, Field(min_length=1, pattern=r"^[^\x00-\x1f\x7f]*[^\x00-\x20\x7f][^\x00-\x1f\x7f]*$")]
#: Largest seed: numpy and scikit-learn take seeds below 2³².
MAX_SEED = 2**32 - 1
PositiveMM = Annotated[float, Field(gt=0)]


class FileModel(BaseModel):
    """A table of an experiment file: strict types (no text for numbers), unknown keys refused,
    NaN and infinity refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class StimulusSource(BaseModel):
    """One image set: ``source`` plus that source's own keys (checked when the set is loaded, see
    ``stimsim.data.stimuli.load_stimulus_source``), and ``heldout_only``."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    source: Text
    heldout_only: bool = False


class StimuliFile(FileModel):
    """``[stimuli]``: the image ``sets``; paradigms subclass it with their own keys."""

    sets: Annotated[list[StimulusSource], Field(min_length=1)]


class DecoderFile(FileModel):
    """``[decoder]``: the frozen decoder (C as in Brain-Score; share of trials used to fit it)."""

    C: Annotated[float, Field(gt=0)] = 1e-3
    fit_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.5
    layer: Text | None = None
    max_iter: Annotated[int, Field(ge=1)] = 1000


class LocalizerFile(FileModel):
    """``[sites.localizer]``: d′ of ``positive`` against the rest of ``label``, on ``sets`` (default:
    the experiment's own clean images)."""

    label: Text
    positive: Text
    sets: Annotated[list[StimulusSource], Field(min_length=1)] | None = None


class _SitesCommon(FileModel):
    localizer: LocalizerFile | None = None
    recording_radius_mm: PositiveMM = 0.5
    dprime_threshold: float = 1.0
    smoothing_sigma_mm: PositiveMM = 0.5


class ExplicitSites(_SitesCommon):
    method: Literal["explicit"]
    sites_mm: Annotated[list[Annotated[list[float], Field(min_length=2, max_length=2)]], Field(min_length=1)]
    groups: list[Text] | None = None


class _SitesOnGrid(_SitesCommon):
    margin_mm: Annotated[float, Field(ge=0)] = 0.5


class SelectivitySites(_SitesOnGrid):
    method: Literal["selectivity"]
    n_selective: Annotated[int, Field(ge=0)]
    n_other: Annotated[int, Field(ge=0)]
    candidate_step_mm: PositiveMM = 0.25
    min_separation_mm: Annotated[float, Field(ge=0)] = 0.0


class FacePatchSites(_SitesOnGrid):
    method: Literal["face_patch"]
    candidate_step_mm: PositiveMM = 0.25
    outside_min_distance_mm: PositiveMM = 3.0


class GridSites(_SitesOnGrid):
    method: Literal["grid"]
    grid_step_mm: PositiveMM = 2.0


SitesFile = Annotated[Union[ExplicitSites, SelectivitySites, FacePatchSites, GridSites], Field(discriminator="method")]


class StimulationFile(BaseModel):
    """``[stimulation]``: one perturbation template, ``kind`` and that kind's parameters with units
    (checked by the perturbation class, ``stimsim.stimulation.perturbations``). ``additive_scale``
    (electrical, ``form = "additive"``): ``"activation"`` (default: ``activation_per_Hz`` in model
    activation units) or ``"sd"`` (``activation_per_Hz`` in standard deviations of the stimulated
    layer's response to the localizer images, over images and units)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    kind: Annotated[Text, Field(description="a registered perturbation kind",
                                examples=sorted(PERTURBATION_KINDS))]
    additive_scale: Literal["activation", "sd"] = "activation"


class SafetyFile(FileModel):
    """``[safety]``: limits of electrical stimulation, and an explicit override reason."""

    max_shannon_k: float = 1.85
    electrode_area_um2: Annotated[float, Field(gt=0)] = 2000.0
    max_charge_per_phase_nC: Annotated[float, Field(gt=0)] | None = None
    override: Text | None = None


class ComparisonFile(FileModel):
    """``[comparison]``: a registered published dataset."""

    dataset: Text


class AnalysisFile(FileModel):
    """``[analysis]``: bootstrap resamples, permutations, confidence level."""

    n_boot: Annotated[int, Field(ge=2)] = 1000
    n_perm: Annotated[int, Field(ge=1)] = 1000
    ci: Annotated[float, Field(gt=0, lt=1)] = 0.95


class ExperimentFile(FileModel):
    """The tables every experiment file has; :func:`file_model` adds a paradigm's own."""

    name: Text
    description: str = ""
    citation: str = ""
    paradigm: Text
    model: Text = DEFAULT_MODEL
    layer: Text = "IT"
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    cortex_mm_per_model_mm: Annotated[float, Field(gt=0, le=100)] | None = None
    stimuli: StimuliFile
    decoder: DecoderFile = DecoderFile()
    sites: SitesFile
    stimulation: StimulationFile
    safety: SafetyFile | None = None
    comparison: ComparisonFile | None = None
    analysis: AnalysisFile = AnalysisFile()


def file_model(paradigm) -> type[ExperimentFile]:
    """The model of an experiment file of ``paradigm`` (a registered Paradigm)."""
    tables = {name: (model, ...) for name, model in paradigm.table_models.items()}
    return create_model(f"{paradigm.name}_experiment", __base__=ExperimentFile,
                        paradigm=(Literal[paradigm.name], ...), stimuli=(paradigm.stimuli_model, ...), **tables)


def validate_file(raw: dict, paradigm, where: str) -> ExperimentFile:
    """``raw`` checked against :func:`file_model`; the first problem is a ``ConfigError`` naming
    ``where``, the table, the key and what is allowed."""
    model = file_model(paradigm)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_error(exc.errors()[0], model, where)) from None


def describe_error(error: dict, model: type[BaseModel], where: str) -> str:
    """One pydantic error as ``"<where> [table]: 'key' must be ..., got ..."``."""
    raw_loc = list(error["loc"])
    loc, current = [], [model]
    for part in raw_loc:  # drop the tags pydantic adds for the chosen member of a union
        members = _step(current, part)
        if members is None:
            continue
        loc.append(part)
        current = members
    names = [i for i, part in enumerate(loc) if isinstance(part, str)]
    key = loc[names[-1]] if names else ""
    table = _location(loc[:names[-1]] if names else loc)
    place = f"{where} [{table}]" if table else where
    kind, ctx, given = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed(model, raw_loc[:-1])
        return f"{place}: unknown key {key!r}" + (f"; allowed: {allowed}" if allowed else "")
    if kind == "missing":
        return f"{place}: missing required key {key!r}"
    if kind == "union_tag_invalid":
        return f"{where} [{_location(loc)}]: 'method' must be one of [{ctx.get('expected_tags')}], got {ctx.get('tag')!r}"
    if kind == "union_tag_not_found":
        return f"{where} [{_location(loc)}]: missing required key 'method'"
    bounds = {"greater_than": "> {gt}", "greater_than_equal": ">= {ge}", "less_than": "< {lt}",
              "less_than_equal": "<= {le}"}
    if kind in bounds:
        return f"{place}: {key!r} must be {bounds[kind].format(**ctx)}, got {given!r}"
    if kind == "literal_error":
        return f"{place}: {key!r} must be one of {ctx.get('expected')}, got {given!r}"
    if kind == "string_pattern_mismatch":
        return f"{place}: {key!r} must be printable text without control characters (NUL, newline, ...), not blank; " \
               f"got {given!r}"
    if kind in ("too_short", "too_long"):
        return f"{place}: {key!r} {error['msg'].lower()}, got {given!r}"
    expected = {"float_type": "a number", "int_type": "an integer", "string_type": "text",
                "bool_type": "true or false", "list_type": "a list", "model_type": "a table",
                "dict_type": "a table", "finite_number": "a finite number"}.get(kind)
    if expected:
        return f"{place}: {key!r} must be {expected}, got {given!r}"
    return f"{place}: {key!r}: {error['msg']}, got {given!r}"


def _location(parts) -> str:
    """``("sites", "localizer", "sets", 0)`` → ``"sites.localizer.sets[0]"``."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _models_in(annotation) -> list:
    """The BaseModel classes inside ``X``, ``X | None``, ``list[X]``, unions or ``Annotated[...]``."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [found for arg in typing.get_args(annotation) for found in _models_in(arg)]


def _step(current: list, part):
    """The models one location step down (a field of the current model, a list position, or the
    union member a tag names); None when ``part`` is a union tag rather than a key."""
    if isinstance(part, int):
        return current
    fields = [m.model_fields[part] for m in current if part in m.model_fields]
    if fields:
        return _models_in(fields[0].annotation)
    tagged = [m for m in current if "method" in m.model_fields
              and part in getattr(m.model_fields["method"].annotation, "__args__", ())]
    if tagged:
        current[:] = tagged
        return None
    return current


def _allowed(model: type[BaseModel], loc) -> list[str]:
    """Keys allowed in the table at ``loc``."""
    current = [model]
    for part in loc:
        step = _step(current, part)
        if step is not None:
            current = step
    return sorted(current[0].model_fields) if len(current) == 1 else []


def experiment_schema() -> dict:
    """JSON Schema of experiment files of every registered paradigm (one alternative per
    paradigm, chosen by ``paradigm``)."""
    from pydantic import TypeAdapter

    from stimsim.paradigms.base import PARADIGMS

    models = [file_model(paradigm) for _, paradigm in PARADIGMS.items()]
    union = Annotated[Union[tuple(models)], Field(discriminator="paradigm")] if len(models) > 1 else models[0]
    schema = TypeAdapter(union).json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "stimsim experiment file",
            "description": "An in-silico stimulation experiment (TOML); see stimsim.paradigms.spec.", **schema}


def write_schema(path=SCHEMA_PATH) -> Path:
    """Write :func:`experiment_schema` as JSON (sorted keys, 2-space indent)."""
    path = Path(path)
    path.write_text(json.dumps(experiment_schema(), indent=2, sort_keys=True) + "\n")
    return path
