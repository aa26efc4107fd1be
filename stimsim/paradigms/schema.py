"""The experiment file as typed models (pydantic): every table refuses unknown keys, every number
has its range, and the JSON Schema editors use (``experiment.schema.json``, shipped beside this
module) is generated from the same models.

The common tables are declared here; a paradigm adds the keys of ``[stimuli]`` it reads
(:attr:`~stimsim.paradigms.base.Paradigm.stimuli_model`, a subclass of :class:`StimuliFile`) and its
own tables (:attr:`~stimsim.paradigms.base.Paradigm.table_models`). :func:`validate_file` checks a
parsed file and turns pydantic's errors into messages that name the file, the table, the key and
what is allowed. The shipped schema is written by
``python -m stimsim.schemas``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from stimsim.models.registry import DEFAULT_MODEL
from stimsim.stimulation import ADDITIVE_SCALES, PERTURBATION_KINDS
from stimsim.stimulation.safety import FileChargeLimit, FileElectrodeArea, FileShannonK
from stimsim.utilities.filemodels import FileModel, Text, validate
from stimsim.utilities.ordering import repeated

#: The JSON Schema of experiment files shipped with the package.
SCHEMA_PATH = Path(__file__).with_name("experiment.schema.json")

#: Largest seed: numpy and scikit-learn take seeds below 2³².
MAX_SEED = 2**32 - 1
#: Most bootstrap resamples or permutations of ``[analysis]``: p-values to 1e-5, and arrays of resamples × sites that
#: fit in memory (one more zero is typed easily, and the analysis runs only once the simulation has finished).
MAX_RESAMPLES = 100_000
PositiveMM = Annotated[float, Field(gt=0)]


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

    @field_validator("sites_mm")
    @classmethod
    def _distinct(cls, sites: list) -> list:
        again = repeated(tuple(site) for site in sites)
        if again:
            raise ValueError(f"'sites_mm' gives the site {list(again[0])} more than once; each site once (a site given twice "
                             "would count twice in the statistics across sites)")
        return sites


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
    (checked by the perturbation class, ``stimsim.stimulation``). ``additive_scale``
    (electrical, ``form = "additive"``): ``"activation"`` (default: ``activation_per_Hz`` in model
    activation units) or ``"sd"`` (``activation_per_Hz`` in standard deviations of the stimulated
    layer's response to the localizer images, over images and units)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True,
                              json_schema_extra=lambda schema: _one_alternative_per_kind(schema))
    kind: Annotated[Text, Field(description="a registered perturbation kind",
                                examples=sorted(PERTURBATION_KINDS))]
    additive_scale: Literal[ADDITIVE_SCALES] = "activation"


def _one_alternative_per_kind(schema: dict) -> None:
    """The JSON Schema of ``[stimulation]``: one alternative per registered perturbation kind, its parameters as the
    kind declares them (:meth:`stimsim.stimulation.base.Perturbation.parameters_schema`), chosen by ``kind``.
    Files are checked by the kind itself; the schema states the same rules for editors and the documentation."""
    alternatives = []
    for _, kind in PERTURBATION_KINDS.items():
        alternative = kind.parameters_schema()
        alternative["properties"].pop("combine", None)  # one site at a time: no electrodes to combine
        if "additive" in alternative["properties"].get("form", {}).get("enum", ()):
            alternative["properties"]["additive_scale"] = schema["properties"]["additive_scale"]
        alternative["additionalProperties"] = False
        alternatives.append(alternative)
    for key in ("properties", "required", "additionalProperties", "type"):
        schema.pop(key, None)
    schema["oneOf"] = alternatives


class SafetyFile(FileModel):
    """``[safety]``: limits of electrical stimulation, and an explicit override reason."""

    max_shannon_k: FileShannonK = 1.85
    electrode_area_um2: FileElectrodeArea = 2000.0
    max_charge_per_phase_nC: FileChargeLimit | None = None
    override: Text | None = None


class ComparisonFile(FileModel):
    """``[comparison]``: a registered published dataset."""

    dataset: Text


class AnalysisFile(FileModel):
    """``[analysis]``: bootstrap resamples, permutations, confidence level."""

    n_boot: Annotated[int, Field(ge=2, le=MAX_RESAMPLES)] = 1000
    n_perm: Annotated[int, Field(ge=1, le=MAX_RESAMPLES)] = 1000
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
    """The model of an experiment file of ``paradigm`` (a registered Paradigm): the common tables, the
    paradigm's ``[stimuli]`` and its own tables — required unless every key of a table has a default. A
    paradigm's table named like a common one (e.g. ``decoder``) replaces it and must subclass its model."""
    tables = {}
    for name, model in paradigm.table_models.items():
        common = ExperimentFile.model_fields.get(name)
        if common is not None and not (isinstance(common.annotation, type) and issubclass(model, common.annotation)):
            raise TypeError(f"paradigm {paradigm.name!r}: table {name!r} replaces a common table, so its model must "
                            f"subclass {common.annotation!r}")
        optional = not any(field.is_required() for field in model.model_fields.values())
        tables[name] = (model, model() if optional else ...)
    return create_model(f"{paradigm.name}_experiment", __base__=ExperimentFile,
                        paradigm=(Literal[paradigm.name], ...), stimuli=(paradigm.stimuli_model, ...), **tables)


def validate_file(raw: dict, paradigm, where: str) -> ExperimentFile:
    """``raw`` checked against :func:`file_model`; the first problem is a ``ConfigError`` naming
    ``where``, the table, the key and what is allowed (:func:`stimsim.utilities.filemodels.validate`)."""
    return validate(file_model(paradigm), raw, where)
