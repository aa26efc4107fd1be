"""Training files (TOML) of the small topographic networks trained from scratch
(``experiments/train_stimsim_topo_seed0.toml``): the network and its sheets, the images, the optimisation and
the spatial loss. Declared by :class:`TrainFile`; a ``topo_head`` build file is declared by
:class:`stimsim.training.head_config.HeadConfig`. The JSON Schema of both kinds ships as ``train.schema.json``
beside this module; every length in mm."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, model_validator

from stimsim.models.preprocessing import MAX_SIZE_PX, MIN_SIZE_PX
from stimsim.training.head_config import HeadConfig
from stimsim.training.schedule import check_warmup
from stimsim.utilities.filemodels import FileModel, PlainName, Text

#: Where the JSON Schema of training files ships.
SCHEMA_PATH = Path(__file__).with_name("train.schema.json")

_Length = Annotated[float, Field(ge=1e-3)]
_NonNegative = Annotated[float, Field(ge=0)]


class PreprocessingTable(FileModel):
    """``[model.preprocessing]``: input side (px), channels, per-channel mean and SD."""

    size_px: Annotated[int, Field(ge=MIN_SIZE_PX, le=MAX_SIZE_PX)]
    channels: Literal[1, 3]
    mean: Annotated[list[float], Field(min_length=1)]
    std: Annotated[list[float], Field(min_length=1)]


class LayerTable(FileModel):
    """``[model.layers.NAME]``: the layer's square sheet (side, mm), its spatial-loss neighbourhood width (mm)
    and its area label."""

    sheet_size_mm: _Length
    neighborhood_width_mm: _Length
    area: Text | None = None


class ModelTable(FileModel):
    """``[model]``: the registered network family with its keyword arguments, the readout layer and the
    topographic layers."""

    family: Text
    kwargs: dict[str, Any] = {}
    readout_layer: Text | None = None
    preprocessing: PreprocessingTable
    layers: Annotated[dict[str, LayerTable], Field(min_length=1)]


class DataSet(FileModel):
    """One image set of ``[data] sets``: a stimulus source (``source`` and its own keys) and the share held
    out from training."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Any] = Field(init=False)  # the source's own keys
    source: Text
    holdout_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.0


class DataTable(FileModel):
    """``[data]``: the training images and the label the task learns."""

    sets: Annotated[list[DataSet], Field(min_length=1)]
    label: Text = "category"


class LayerScaleTable(FileModel):
    """``[cortex_scale]``: how many cortex mm one model mm of ``layer`` stands for, and the anatomical rule."""

    layer: Text
    cortex_mm_per_model_mm: Annotated[float, Field(ge=1e-3, le=100)]
    rule: Text


class TrainingTable(FileModel):
    """``[training]``: optimisation (SGD with momentum, warm-up) of the supervised or SimCLR task."""

    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    steps: Annotated[int, Field(ge=1)]
    batch_size: Annotated[int, Field(ge=2, le=4096)] = 128
    learning_rate: _NonNegative = 0.05
    momentum: Annotated[float, Field(ge=0, le=1)] = 0.9
    weight_decay: _NonNegative = 5e-4
    warmup_steps: Annotated[int, Field(ge=0)] = 50
    task: Literal["supervised", "simclr"] = "supervised"
    simclr_temperature: Annotated[float, Field(ge=1e-4)] = 0.1
    augment: bool = True
    checkpoint_every_steps: Annotated[int, Field(ge=1)] = 100

    @model_validator(mode="after")
    def _warmup_ends(self):
        check_warmup(self)
        return self


class SpatialLossTable(FileModel):
    """``[spatial_loss]``: weight α of the TDANN relative spatial loss, its layers, neighbourhoods per step."""

    alpha: _NonNegative = 0.25
    layers: list[Text] = []
    neighborhoods_per_step: Annotated[int, Field(ge=1)] = 8


class ActivityPenaltyTable(FileModel):
    """``[activity_penalty]``: L1 weight on the activity of its layers."""

    l1: _NonNegative = 0.0
    layers: list[Text] = []


class TrainFile(FileModel):
    """A training file of a network trained from scratch: the network and its sheets, the images, the optimisation,
    the spatial loss and the activity penalty."""

    name: PlainName
    model: ModelTable
    data: DataTable
    cortex_scale: LayerScaleTable | None = None
    training: TrainingTable
    spatial_loss: SpatialLossTable = SpatialLossTable()
    activity_penalty: ActivityPenaltyTable = ActivityPenaltyTable()

    @model_validator(mode="after")
    def _layers_have_sheets(self):
        layers = self.model.layers
        if self.cortex_scale is not None and self.cortex_scale.layer not in layers:
            raise ValueError(f"[cortex_scale] layer {self.cortex_scale.layer!r} has no sheet in [model.layers]")
        for block, names in (("spatial_loss", self.spatial_loss.layers),
                             ("activity_penalty", self.activity_penalty.layers)):
            unknown = [layer for layer in names if layer not in layers]
            if unknown:
                raise ValueError(f"[{block}] layers {unknown} have no sheet in [model.layers]")
        return self


def train_schema() -> dict:
    """JSON Schema of training files: a network trained from scratch or a ``topo_head`` build."""
    schema = TypeAdapter(TrainFile | HeadConfig).json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "stimsim training file",
            "description": "A training run (TOML): a network trained from scratch (stimsim.training.train_file) or a "
                           "topo_head build (stimsim.training.head_training).", **schema}
