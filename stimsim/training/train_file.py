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
from stimsim.training.schedule import LearningRate, check_warmup
from stimsim.utilities.filemodels import FileModel, PlainName, Text
from stimsim.utilities.ordering import repeated

#: Where the JSON Schema of training files ships.
SCHEMA_PATH = Path(__file__).with_name("train.schema.json")

_Length = Annotated[float, Field(ge=1e-3)]
_NonNegative = Annotated[float, Field(ge=0)]


class PreprocessingTable(FileModel):
    """``[model.preprocessing]``: input side (px), channels, per-channel mean and SD."""

    size_px: Annotated[int, Field(ge=MIN_SIZE_PX, le=MAX_SIZE_PX)]
    """Side of the square network input, in px: each image is resized so that its shorter side is this many px
    (aspect kept), then its centre square is cut out."""
    channels: Literal[1, 3]
    """Input channels: 1 (gray; colour images become luma) or 3 (RGB; gray images are repeated on the three
    channels)."""
    mean: Annotated[list[float], Field(min_length=1)]
    """Per-channel mean subtracted from intensities in [0, 1]; one value per channel."""
    std: Annotated[list[float], Field(min_length=1)]
    """Per-channel standard deviation that the mean-subtracted intensities are divided by; one value per channel."""


class LayerTable(FileModel):
    """``[model.layers.NAME]``: the layer's square sheet (side, mm), its spatial-loss neighbourhood width (mm)
    and its area label."""

    sheet_size_mm: _Length
    """Side of the layer's square sheet, in model mm; its units get retinotopically initialised positions on it,
    fixed during training."""
    neighborhood_width_mm: _Length
    """Diameter of the spatial loss's neighbourhoods (discs of units on the sheet), in model mm; at most
    ``sheet_size_mm``."""
    area: Text | None = None
    """Cortical area label of the layer (e.g. ``"IT"``), by which experiments can name it; each label names one
    layer. Left out: no label."""


class ModelTable(FileModel):
    """``[model]``: the registered network family with its keyword arguments, the readout layer and the
    topographic layers."""

    family: Text
    """Registered architecture family that builds the network (e.g. ``"stimsim_topo"``; other packages register
    theirs through the ``stimsim.model_families`` entry point)."""
    kwargs: dict[str, Any] = {}
    """Keyword arguments of the family's builder (e.g. ``n_classes``, ``it_units``); empty: the builder's defaults."""
    readout_layer: Text | None = None
    """Layer that a behavioural decoder reads: a layer with a sheet, its area label or another module name. Left out:
    the last layer of ``[model.layers]`` in the network's order."""
    preprocessing: PreprocessingTable
    """How images become the network's input: size (px), channels and normalisation."""
    layers: Annotated[dict[str, LayerTable], Field(min_length=1)]
    """The topographic layers, each by its module name as ``print(model)`` shows it (e.g. ``"it"``), with its sheet;
    at least one."""


class DataSet(FileModel):
    """One image set of ``[data] sets``: a stimulus source (``source`` and its own keys) and the share held
    out from training."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Any] = Field(init=False)  # the source's own keys
    source: Text
    """Stimulus source of the set (e.g. ``"lfw_subset"``, ``"fashion_mnist"``, ``"folder"``, ``"table"``); the set's
    other keys are that source's own (e.g. ``split``, ``n_per_class``, ``path``; a relative path is taken from the
    training file's folder)."""
    holdout_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Share of the set's images held out from training, in [0, 1), drawn per value of ``[data] label`` with
    ``[training] seed``; the held-out ids are recorded in the model's metadata."""


class DataTable(FileModel):
    """``[data]``: the training images and the label the task learns."""

    sets: Annotated[list[DataSet], Field(min_length=1)]
    """The image sets whose images, pooled, are the training data; at least one, no image (stimulus id) in two."""
    label: Text = "category"
    """Stimulus label whose values are the classes: the targets of the supervised task, the groups that batches draw
    evenly from and the strata of each set's held-out share. Every set must have it."""


class LayerScaleTable(FileModel):
    """``[cortex_scale]``: how many cortex mm one model mm of ``layer`` stands for, and the anatomical rule."""

    layer: Text
    """Layer of ``[model.layers]`` whose sheet the scale is for."""
    cortex_mm_per_model_mm: Annotated[float, Field(ge=1e-3, le=100)]
    """Millimetres of macaque cortex that one model mm of the layer's sheet stands for; experiments run at this scale
    unless they set their own."""
    rule: Text
    """The anatomical reasoning that sets the scale, in words; recorded with it in the model's metadata."""


class TrainingTable(FileModel):
    """``[training]``: optimisation (SGD with momentum, warm-up) of the supervised or SimCLR task."""

    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    """Seed of the initial weights, the sheets' positions, the held-out split and every step's draws (batch,
    augmentation, neighbourhoods)."""
    steps: Annotated[int, Field(ge=1, le=1_000_000)]
    """Number of optimisation steps (batches)."""
    batch_size: Annotated[int, Field(ge=2, le=4096)] = 128
    """Images per step, drawn class-balanced (a class drawn uniformly, then an image of that class)."""
    learning_rate: LearningRate = 0.05
    """Peak learning rate of SGD: reached at the end of the warm-up, then decayed to 0 at ``steps`` on a cosine."""
    momentum: Annotated[float, Field(ge=0, le=1)] = 0.9
    """Momentum of SGD (Nesterov momentum when above 0)."""
    weight_decay: _NonNegative = 5e-4
    """Weight decay (L2 penalty) of SGD."""
    warmup_steps: Annotated[int, Field(ge=0)] = 50
    """Steps over which the learning rate rises linearly to ``learning_rate``; when set in a file, at most ``steps``."""
    task: Literal["supervised", "simclr"] = "supervised"
    """``"supervised"``: cross-entropy against the classes of ``[data] label`` (the network outputs one score per
    class); ``"simclr"``: SimCLR's contrastive loss between two augmented views of each image (the output is an
    embedding)."""
    simclr_temperature: Annotated[float, Field(ge=1e-4)] = 0.1
    """Temperature of the SimCLR (NT-Xent) loss; used only with ``task = "simclr"``."""
    augment: bool = True
    """Whether the batch is augmented: random rotation (±15°), scale (0.75–1.25), shift (±15 %), horizontal flip,
    contrast and brightness. The second view of SimCLR is augmented either way."""
    checkpoint_every_steps: Annotated[int, Field(ge=1)] = 100
    """Steps between checkpoints (``DIR/checkpoint.pt``), from which a stopped run resumes; the last step is always
    saved."""

    @model_validator(mode="after")
    def _warmup_ends(self):
        check_warmup(self)
        return self


class SpatialLossTable(FileModel):
    """``[spatial_loss]``: weight α of the TDANN relative spatial loss, its layers, neighbourhoods per step."""

    alpha: _NonNegative = 0.25
    """Weight α of the spatial loss (summed over its layers) in the total loss; 0: no spatial loss."""
    layers: list[Text] = []
    """Layers of ``[model.layers]`` the spatial loss acts on, each named once; empty: none."""
    neighborhoods_per_step: Annotated[int, Field(ge=1)] = 8
    """Neighbourhoods drawn per layer and step, over which the layer's spatial loss is averaged; at most 256, the
    number prepared on each sheet."""


class ActivityPenaltyTable(FileModel):
    """``[activity_penalty]``: L1 weight on the activity of its layers."""

    l1: _NonNegative = 0.0
    """Weight of the L1 penalty: ``l1`` × the mean absolute activity of each listed layer is added to the loss
    (logged as ``mean_activity_LAYER``); 0: no penalty."""
    layers: list[Text] = []
    """Layers of ``[model.layers]`` whose activity is penalised, each named once; empty: none."""


class TrainFile(FileModel):
    """A training file of a network trained from scratch: the network and its sheets, the images, the optimisation,
    the spatial loss and the activity penalty."""

    name: PlainName
    """Name of the trained model (a plain name, no path)."""
    model: ModelTable
    """The network, its input and its topographic layers."""
    data: DataTable
    """The training images and the label that gives their classes."""
    cortex_scale: LayerScaleTable | None = None
    """Physical scale of one layer's sheet, copied into the model's metadata. Left out: no scale recorded
    (experiments then take 1 cortex mm per model mm unless they set their own)."""
    training: TrainingTable
    """The optimisation: steps, batches, SGD, learning-rate schedule and task."""
    spatial_loss: SpatialLossTable = SpatialLossTable()
    """TDANN's relative spatial loss; left out: on no layer."""
    activity_penalty: ActivityPenaltyTable = ActivityPenaltyTable()
    """L1 penalty on layer activity; left out: none."""

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
            if repeated(names):
                raise ValueError(f"[{block}] layers lists {repeated(names)} more than once; name each layer once")
        areas = {name: layer.area for name, layer in layers.items() if layer.area is not None}
        again = repeated(areas.values())
        if again:
            shared = [name for name, area in areas.items() if area in again]
            raise ValueError(f"[model.layers] area label(s) {again} given to more than one layer ({shared}); each "
                             "area names one layer")
        return self


def train_schema() -> dict:
    """JSON Schema of training files: a network trained from scratch or a ``topo_head`` build."""
    schema = TypeAdapter(TrainFile | HeadConfig).json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "stimsim training file",
            "description": "A training run (TOML): a network trained from scratch (stimsim.training.train_file) or a "
                           "topo_head build (stimsim.training.head_training).", **schema}
