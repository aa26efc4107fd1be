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
from stimsim.training.schedule import LearningRate, check_warmup
from stimsim.training.trunk_tuning import TrunkTuningTable
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.filemodels import FileModel, PlainName, Text, validate
from stimsim.utilities.ordering import repeated

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
    """ImageNet network whose trunk IT is built on: ``"mobilenet_v2"`` or ``"efficientnet_lite0"``."""
    grid_side: Annotated[int, Field(ge=2, le=400)] = 224
    """Side of the final IT grid, in units: IT has ``grid_side`` × ``grid_side`` units, densified from the trained
    grid (default 224: 50,176 units)."""
    trained_grid_side: Annotated[int, Field(ge=2, le=400)] = 64
    """Side of the grid of units IT is trained as (``trained_grid_side`` × ``trained_grid_side`` units), before it is
    densified onto the final grid."""
    it_rank: Annotated[int, Field(ge=1, le=4096)] = 128
    """Inner width of IT's low-rank product: pooled trunk features → ``it_rank`` → units."""
    head_rank: Annotated[int, Field(ge=1, le=4096)] = 128
    """Inner width of the ImageNet readout: IT units → ``head_rank`` → 1,000 classes."""
    area: Text = "IT"
    """Area label of the IT sheet in the model."""
    sheet_size_mm: _Positive = 10.0
    """Side of IT's square sheet, in model mm; the trained and the final grid cover the same sheet."""
    neighborhood_width_mm: _Positive = 2.0
    """Diameter of the spatial loss's neighbourhoods on the trained grid, in model mm; at most ``sheet_size_mm``."""
    n_neighborhoods: Annotated[int, Field(ge=1, le=100_000)] = 512
    """Neighbourhoods prepared on the trained grid (around random units), from which
    ``[training] neighborhoods_per_step`` are drawn at each step."""
    max_neighborhood_units: Annotated[int, Field(ge=2, le=5000)] = 500
    """Most units in a neighbourhood: every neighbourhood is subsampled to the smallest one's size, at most this
    many."""
    base_weights: Literal["imagenet", "random"] = "imagenet"
    """``"imagenet"``: the base network's ImageNet weights; ``"random"``: randomly initialised weights (a control;
    its trunk features are not cached)."""
    storage: Literal["float16", "float32"] = "float16"
    """``"float16"``: weights rounded to float16 before anything is measured and saved as float16, so the model
    measured is the model saved; ``"float32"``: full precision."""
    it_weights: Literal["per_unit", "trained_grid"] = "per_unit"
    """``"per_unit"``: every IT unit's interpolated weights are stored; ``"trained_grid"``: the trained grid's
    weights are stored and interpolated when the network runs (the same units, about ``it_rank`` × 2 bytes less
    per unit)."""
    it_projection: Literal["trained", "principal_components"] = "trained"
    """``"trained"``: IT's first product (features → ``it_rank``) is trained; ``"principal_components"``: it is fixed
    to the first principal components of the cached trunk features, scaled to unit mean variance."""
    it_principal_rank: Annotated[int, Field(ge=1, le=4096)] | None = None
    """With ``it_projection = "principal_components"``: how many of the ``it_rank`` directions are fixed to
    components, the others trained; at most ``it_rank``. Left out: all of them."""
    preprocessing: dict[str, Any] = {}
    """Changes to the base network's own preprocessing (keys ``size_px``, ``channels``, ``mean``, ``std``); empty:
    the base network's as it is."""

    @model_validator(mode="after")
    def _sizes_agree(self):
        if self.neighborhood_width_mm > self.sheet_size_mm:
            raise ValueError(f"neighborhood_width_mm ({self.neighborhood_width_mm:g}) must be at most sheet_size_mm "
                             f"({self.sheet_size_mm:g}): a neighbourhood is a disc on the sheet")
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
    """Image sets, each a stimulus source's table (``source`` and its own keys; a relative ``path`` is taken from the
    file's folder) with ``holdout_fraction``, the share held out in [0, 1) (default 0), and ``holdout_stratified``
    (default true: held out per value of ``label``); no image (stimulus id) in two sets."""
    label: Text = "category"
    """Stimulus label whose values ``domains`` gather and by which each set's held-out share is stratified; a set
    without it has no domain labels."""
    domains: dict[str, Annotated[list[Text], Field(min_length=1)]] = {}
    """The localizer's domains: domain → the values of ``label`` it gathers (e.g. ``face = ["adult", "child"]``), the
    targets of the domain readout; images of no domain carry no domain label. Empty: no domain readout."""
    positive_domain: Text = "face"
    """Domain whose largest cluster sets the scale under ``[cortex_scale] face_cluster_cortex_mm`` (its d′ against
    the other domains' images)."""
    views: Annotated[int, Field(ge=1, le=64)] = 4
    """Versions of each training image whose trunk features are cached: view 0 as the network receives it, the others
    cropped, flipped, contrast-jittered and with pixel noise."""
    min_signal_percent: Annotated[float, Field(ge=0, le=100)] = 40.0
    """Lowest visual signal of the augmented views, in %: each keeps a share of its pixels drawn in
    [``min_signal_percent``, 100] % and the rest is replaced by uniform noise."""
    crop_scale: Annotated[list[Annotated[float, Field(gt=0, le=1)]], Field(min_length=2, max_length=2)] = [0.6, 1.0]
    """Range [low, high] of the augmented views' crop area, as a share of the image's area, in (0, 1]."""
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    """Seed of the held-out split and of the augmented views (those of ``[trunk_tuning]`` too)."""

    @model_validator(mode="after")
    def _one_domain_each(self):
        again = repeated(value for values in self.domains.values() for value in values)
        if again:
            owners = [domain for domain, values in self.domains.items() if again[0] in values]
            raise ValueError(f"'domains' gives {self.label} {again[0]!r} to more than one domain ({owners}); each "
                             "value belongs to one domain")
        return self


class HeadTrainingTable(FileModel):
    """``[training]``: optimisation and the loss weights; ``feature_samples_per_step``: feature vectors drawn
    from a Gaussian fitted to the cached trunk features, added to every step's batch for the distillation
    loss only (see :class:`FeatureSampler`). The readouts of the densified IT are fitted again either by
    ``readout_steps`` steps of distillation (``readout_fit = "distill"``) or in closed form
    (``"ridge"``: :func:`ridge_readouts`, on ``readout_views`` of every training image — every view, or the
    clean image alone — and ``readout_samples`` feature vectors drawn from the Gaussian of those views'
    features)."""
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    """Seed of IT's initial weights, the neighbourhoods, every step's draws (images, views, neighbourhoods, feature
    samples) and the ridge readouts' validation split."""
    steps: Annotated[int, Field(ge=1, le=1_000_000)] = 1500
    """Training steps of IT on the trained grid."""
    batch_size: Annotated[int, Field(ge=2, le=4096)] = 256
    """Training images per step (all of them when there are fewer), each at a random view."""
    learning_rate: LearningRate = 1e-3
    """Peak learning rate of Adam: reached at the end of the warm-up, then decayed to 0 at ``steps`` on a cosine; the
    distilled readouts use a quarter of it."""
    warmup_steps: Annotated[int, Field(ge=0)] = 50
    """Steps over which the learning rate rises linearly to ``learning_rate``; when set in a file, at most ``steps``."""
    distill_temperature: _Positive = 2.0
    """Temperature T of the distillation loss (the KL divergence of IT's ImageNet outputs from the base network's,
    both softened by T, × T²)."""
    distill_weight: Annotated[float, Field(ge=0)] = 1.0
    """Weight of the distillation loss."""
    domain_weight: Annotated[float, Field(ge=0)] = 1.0
    """Weight of the cross-entropy of the localizer's domains."""
    spatial_alpha: Annotated[float, Field(ge=0)] = 1.0
    """Weight α of TDANN's relative spatial loss on IT."""
    neighborhoods_per_step: Annotated[int, Field(ge=1, le=1000)] = 8
    """Neighbourhoods drawn per step for the spatial loss; at most ``[model] n_neighborhoods``."""
    activity_l1: Annotated[float, Field(ge=0)] = 0.0
    """Weight of the L1 penalty on IT's mean absolute activity over the batch's images (not the drawn feature
    vectors); 0: none."""
    checkpoint_every_steps: _Count = 250
    """Steps between checkpoints (``DIR/checkpoint.pt``), from which a stopped build resumes; the last step is always
    saved."""
    readout_steps: Annotated[int, Field(ge=0, le=100_000)] = 400
    """With ``readout_fit = "distill"``: steps of the distillation and domain losses that fit the readouts again
    after densification (IT fixed)."""
    feature_samples_per_step: Annotated[int, Field(ge=0, le=65536)] = 0
    """Feature vectors drawn per step from a Gaussian fitted to the cached trunk features and added to the batch for
    the distillation loss only; 0: none."""
    readout_fit: Literal["distill", "ridge"] = "distill"
    """How the readouts of the densified IT are fitted again: ``"distill"``: ``readout_steps`` steps of distillation;
    ``"ridge"``: in closed form, by reduced-rank ridge regression."""
    readout_samples: Annotated[int, Field(ge=0, le=65536)] = 8000
    """With ``readout_fit = "ridge"``: feature vectors drawn from the Gaussian of the readout views' features, added
    to the images as rows of the regression."""
    readout_views: Literal["all", "clean"] = "all"
    """With ``readout_fit = "ridge"``: the views of every training image the readouts are fitted on: ``"all"`` or
    ``"clean"`` (view 0 alone)."""

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
    """The anatomical reasoning that sets the scale, in words; recorded with it in the model's metadata."""
    face_cluster_cortex_mm: _Positive | None = None
    """Cortex mm spanned by the largest cluster of ``[data] positive_domain`` units (smoothed d′ > 1) on the build's
    training images of every domain; the scale follows from it."""
    cortex_mm_per_model_mm: Annotated[float, Field(ge=1e-3, le=100)] | None = None
    """A fixed scale: millimetres of macaque cortex that one model mm of IT's sheet stands for."""

    @model_validator(mode="after")
    def _one(self):
        if (self.face_cluster_cortex_mm is None) == (self.cortex_mm_per_model_mm is None):
            raise ValueError("give exactly one of 'face_cluster_cortex_mm' and 'cortex_mm_per_model_mm'")
        return self


class HeadConfig(FileModel):
    """A ``topo_head`` build file: the ImageNet-trained base network, the IT grid and its sheet, the images and
    their domains, the training and the anatomical scale rule."""
    name: PlainName
    """Name of the built model (a plain name, no path)."""
    description: Text | None = None
    """Free text about the build; kept with the file in the model's metadata."""
    model: HeadModelTable
    """The base network and IT: its grids, ranks, sheet and storage."""
    data: HeadDataTable
    """The images, their domains and the augmented views."""
    training: HeadTrainingTable = HeadTrainingTable()
    """Training of IT and the fitting of its readouts."""
    trunk_tuning: TrunkTuningTable | None = None
    """Tuning of the trunk's last modules before IT is trained. Left out: the trunk stays as the base network's."""
    cortex_scale: CortexScaleTable
    """The physical scale of IT's sheet and the rule that sets it."""

    @model_validator(mode="after")
    def _tables_agree(self):
        if self.training.neighborhoods_per_step > self.model.n_neighborhoods:
            raise ValueError(f"[training] neighborhoods_per_step ({self.training.neighborhoods_per_step}) must be at "
                             f"most [model] n_neighborhoods ({self.model.n_neighborhoods}), the neighbourhoods drawn "
                             "from")
        if self.cortex_scale.face_cluster_cortex_mm is None:
            return self
        domains = sorted(self.data.domains)
        if self.data.positive_domain not in domains or len(domains) < 2:
            raise ValueError(f"[cortex_scale] face_cluster_cortex_mm measures the clusters of [data] positive_domain "
                             f"{self.data.positive_domain!r} against the other domains' images, so [data.domains] "
                             f"needs it and at least one other domain; domains: {domains}")
        return self


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
