"""Visualisation files (TOML; ``experiments/visualize_default.toml``), declared by :class:`VisualizeFile`, whose
JSON Schema ships as ``visualize.schema.json`` beside this module; the tables are described in
:mod:`stimsim.percepts.visualize`. Every length in cortex mm, current in µA."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Field

from stimsim.percepts import InversionSettings
from stimsim.stimulation import ADDITIVE_SCALES, MAX_CURRENT_UA
from stimsim.stimulation.safety import FileElectrodeArea, FileShannonK
from stimsim.utilities.filemodels import FileModel, Text
from stimsim.utilities.limits import MAX_SEED

#: Where the JSON Schema of visualisation files ships.
SCHEMA_PATH = Path(__file__).with_name("visualize.schema.json")

_Point = Annotated[list[float], Field(min_length=2, max_length=2)]
_Radius = Annotated[float, Field(ge=1e-6)]


class ImageRows(FileModel):
    """One ``[[images]]`` table: a stimulus source (its own keys) with the row label ``group``, optionally the
    first ``n`` images and ``only`` (label → the value the images must have)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Any] = Field(init=False)  # the source's own keys
    source: Text
    group: Text


class LocalizerTable(FileModel):
    """``[localizer]``: the images that fit both face decoders, the label and its face class, their ``C``."""

    sets: Annotated[list[dict[str, Any]], Field(min_length=1)]
    label: Text
    positive: Text
    C: Annotated[float, Field(ge=1e-12)] = 1e-3


class SelectivitySites(FileModel):
    """``[sites]`` chosen on the smoothed face-d′ map: the face site at its peak, the control site at its lowest
    point at least ``outside_min_distance_mm`` away."""

    method: Literal["selectivity"]
    recording_radius_mm: _Radius = 0.5
    smoothing_sigma_mm: _Radius = 1.0
    outside_min_distance_mm: Annotated[float, Field(ge=0)] = 3.0
    candidate_step_mm: Annotated[float, Field(ge=1e-3)] = 0.5
    margin_mm: Annotated[float, Field(ge=0)] = 0.5


class ExplicitSites(FileModel):
    """``[sites]`` given as [x, y] cortex mm."""

    method: Literal["explicit"]
    recording_radius_mm: _Radius = 0.5
    face_site_mm: _Point
    control_site_mm: _Point


class PlanSites(FileModel):
    """``[sites]`` at two electrodes of a ``stimsim plan`` directory (their cortex position in its sites.csv)."""

    method: Literal["plan"]
    recording_radius_mm: _Radius = 0.5
    plan: Text
    face_electrode: Annotated[int, Field(strict=True)] | Text
    control_electrode: Annotated[int, Field(strict=True)] | Text


class StimulationTable(FileModel):
    """``[stimulation]``: an electrical template (the keys of ``stimsim.stimulation.ElectricalStimulation`` but
    ``sites_mm``, ``layer`` and ``current_uA``), the rising ``currents_uA`` and the scale of its additive form."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Any] = Field(init=False)  # the electrical template's keys
    currents_uA: Annotated[list[Annotated[float, Field(gt=0, le=MAX_CURRENT_UA)]], Field(min_length=2)]
    additive_scale: Literal[ADDITIVE_SCALES] = "activation"


class SafetyTable(FileModel):
    """``[safety]``: as in experiment files."""

    max_shannon_k: FileShannonK = 1.85
    electrode_area_um2: FileElectrodeArea | None = None
    override: Text | None = None


class JudgeTable(FileModel):
    """``[judge]``: the model whose face decoder scores the images without having been optimised against."""

    model: Text


class VisualizeFile(FileModel):
    """A visualisation file: the model, the image rows, the localizer, the face and control sites, the currents,
    the inversion and the independent judge."""

    name: Text
    description: str = ""
    model: Text
    layer: Text = "IT"
    match_layer: Text | None = None
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    summary_groups: Annotated[list[Text], Field(min_length=1)] = ["object", "place"]
    images: Annotated[list[ImageRows], Field(min_length=1)]
    localizer: LocalizerTable
    sites: Annotated[Union[SelectivitySites, ExplicitSites, PlanSites], Field(discriminator="method")]
    stimulation: StimulationTable
    safety: SafetyTable = SafetyTable()
    inversion: InversionSettings = InversionSettings()
    judge: JudgeTable


def visualize_schema() -> dict:
    """JSON Schema of visualisation files."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "stimsim visualisation file",
            "description": "Predicted percepts of stimulation (TOML); see stimsim.percepts.visualize.",
            **VisualizeFile.model_json_schema()}
