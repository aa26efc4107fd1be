"""The file of a ``topo_head`` build (``stimsim train BUILD.toml``): its tables, checked as they are read.

A build file names an ImageNet-trained base network in ``[model]``; :mod:`stimsim.training.head_training` runs the
build it describes (see there for the recipe and :doc:`/file_format_train` for every key).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from stimsim.models.base_networks import base_network_spec
from stimsim.models.preprocessing import Preprocessing
from stimsim.training.schedule import check_warmup
from stimsim.training.trunk_tuning import TrunkTuningTable
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.filemodels import FileModel, PlainName, Text, validate

_Positive = Annotated[float, Field(gt=0)]
_Count = Annotated[int, Field(ge=1)]


class HeadModelTable(FileModel):
    """``[model]``: the base network, IT's size and sheet: IT is trained as a ``trained_grid_side`` ×
    ``trained_grid_side`` grid of units and then densified onto ``grid_side`` × ``grid_side``
    (:func:`stimsim.models.topo_head.densify`), its weights stored per unit or as the trained grid's
    (``it_weights``; the same units, about it_rank × 2 bytes less per unit). IT's first product (features →
    it_rank) is trained, or fixed to the first it_rank principal components of the cached trunk
    features (``it_projection = "principal_components"``: IT then draws on the directions in which the
    features vary most, not on those that serve the few training images best)."""
    base_network: Text
    grid_side: Annotated[int, Field(ge=2, le=400)] = 224
    trained_grid_side: Annotated[int, Field(ge=2, le=400)] = 64
    it_rank: Annotated[int, Field(ge=1, le=4096)] = 128
    head_rank: Annotated[int, Field(ge=1, le=4096)] = 128
    area: Text = "IT"
    sheet_size_mm: _Positive = 10.0
    neighborhood_width_mm: _Positive = 2.0
    n_neighborhoods: Annotated[int, Field(ge=1, le=100_000)] = 512
    max_neighborhood_units: Annotated[int, Field(ge=2, le=5000)] = 500
    base_weights: Literal["imagenet", "random"] = "imagenet"
    storage: Literal["float16", "float32"] = "float16"
    it_weights: Literal["per_unit", "trained_grid"] = "per_unit"
    it_projection: Literal["trained", "principal_components"] = "trained"
    it_principal_rank: Annotated[int, Field(ge=1, le=4096)] | None = None
    preprocessing: dict[str, Any] = {}

    @model_validator(mode="after")
    def _principal_rank(self):
        if self.it_principal_rank is None:
            return self
        if self.it_projection != "principal_components":
            raise ValueError('it_principal_rank needs it_projection = "principal_components"')
        if self.it_principal_rank > self.it_rank:
            raise ValueError(f"it_principal_rank must be at most it_rank ({self.it_rank}), got {self.it_principal_rank}")
        return self

    @property
    def principal_rank(self) -> int:
        """How many of IT's it_rank input directions are fixed to principal components (0: all trained)."""
        if self.it_projection != "principal_components":
            return 0
        return self.it_rank if self.it_principal_rank is None else self.it_principal_rank


class HeadDataTable(FileModel):
    """``[data]``: image sets (each ``{source = ..., holdout_fraction = ...}``; held out per value of ``label``
    where a set has that label, unless ``holdout_stratified = false``), the localizer's domains
    (domain → the values of ``label`` it gathers; images of no domain carry no domain label) and the
    augmented views."""
    sets: Annotated[list[dict[str, Any]], Field(min_length=1)]
    label: Text = "category"
    domains: dict[str, Annotated[list[Text], Field(min_length=1)]] = {}
    positive_domain: Text = "face"
    views: Annotated[int, Field(ge=1, le=64)] = 4
    min_signal_percent: Annotated[float, Field(ge=0, le=100)] = 40.0
    crop_scale: Annotated[list[Annotated[float, Field(gt=0, le=1)]], Field(min_length=2, max_length=2)] = [0.6, 1.0]
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0


class HeadTrainingTable(FileModel):
    """``[training]``: optimisation and the loss weights; ``feature_samples_per_step``: feature vectors drawn
    from a Gaussian fitted to the cached trunk features, added to every step's batch for the distillation
    loss only (see :class:`FeatureSampler`). The readouts of the densified IT are fitted again either by
    ``readout_steps`` steps of distillation (``readout_fit = "distill"``) or in closed form
    (``"ridge"``: :func:`ridge_readouts`, on ``readout_views`` of every training image — every view, or the
    clean image alone — and ``readout_samples`` feature vectors drawn from the Gaussian of those views'
    features)."""
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    steps: Annotated[int, Field(ge=1, le=1_000_000)] = 1500
    batch_size: Annotated[int, Field(ge=2, le=4096)] = 256
    learning_rate: _Positive = 1e-3
    warmup_steps: Annotated[int, Field(ge=0)] = 50
    distill_temperature: _Positive = 2.0
    distill_weight: Annotated[float, Field(ge=0)] = 1.0
    domain_weight: Annotated[float, Field(ge=0)] = 1.0
    spatial_alpha: Annotated[float, Field(ge=0)] = 1.0
    neighborhoods_per_step: Annotated[int, Field(ge=1, le=1000)] = 8
    activity_l1: Annotated[float, Field(ge=0)] = 0.0
    checkpoint_every_steps: _Count = 250
    readout_steps: Annotated[int, Field(ge=0, le=100_000)] = 400
    feature_samples_per_step: Annotated[int, Field(ge=0, le=65536)] = 0
    readout_fit: Literal["distill", "ridge"] = "distill"
    readout_samples: Annotated[int, Field(ge=0, le=65536)] = 8000
    readout_views: Literal["all", "clean"] = "all"

    @model_validator(mode="after")
    def _options_agree(self):
        check_warmup(self)
        if self.readout_fit == "ridge" and "readout_steps" in self.model_fields_set:
            raise ValueError("'readout_steps' belongs to readout_fit = \"distill\"; a ridge readout takes no steps "
                             "(remove it, or set readout_fit = \"distill\")")
        for key in ("readout_samples", "readout_views"):
            if self.readout_fit == "distill" and key in self.model_fields_set:
                raise ValueError(f"'{key}' belongs to readout_fit = \"ridge\" (remove it, or set "
                                 "readout_fit = \"ridge\")")
        return self


class CortexScaleTable(FileModel):
    """``[cortex_scale]``: the anatomical rule; exactly one of ``face_cluster_cortex_mm`` (the largest face
    cluster on the localizer spans that many cortex mm) and ``cortex_mm_per_model_mm`` (fixed)."""
    rule: Text
    face_cluster_cortex_mm: _Positive | None = None
    cortex_mm_per_model_mm: Annotated[float, Field(ge=1e-3, le=100)] | None = None

    @model_validator(mode="after")
    def _one(self):
        if (self.face_cluster_cortex_mm is None) == (self.cortex_mm_per_model_mm is None):
            raise ValueError("give exactly one of 'face_cluster_cortex_mm' and 'cortex_mm_per_model_mm'")
        return self


class HeadConfig(FileModel):
    """A ``topo_head`` build file: the ImageNet-trained base network, the IT grid and its sheet, the images and
    their domains, the training and the anatomical scale rule."""
    name: PlainName
    description: Text | None = None
    model: HeadModelTable
    data: HeadDataTable
    training: HeadTrainingTable = HeadTrainingTable()
    trunk_tuning: TrunkTuningTable | None = None
    cortex_scale: CortexScaleTable


def is_head_config(raw: dict) -> bool:
    """Whether a parsed training file describes a ``topo_head`` build (its ``[model]`` names a base network)."""
    return isinstance(raw.get("model"), dict) and "base_network" in raw["model"]


def load_head_config(path) -> tuple[HeadConfig, dict, Path]:
    """Read and check a build file: (config, raw table, the file's folder for relative paths)."""
    path = Path(path)
    raw = load_toml(path)
    config = validate(HeadConfig, raw, str(path))
    spec = base_network_spec(config.model.base_network)
    try:
        Preprocessing.from_dict({**spec.preprocessing.to_dict(), **config.model.preprocessing})
    except ConfigError as exc:
        raise ConfigError(f"{path} [model] preprocessing: {exc}") from None
    if config.model.principal_rank > spec.feature_channels:
        key = "it_rank" if config.model.it_principal_rank is None else "it_principal_rank"
        raise ConfigError(f"{path} [model] {key}: a projection onto principal components of {spec.feature_channels} "
                          f"trunk features has rank at most {spec.feature_channels}, got {config.model.principal_rank}")
    return config, raw, path.resolve().parent
