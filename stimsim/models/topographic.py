"""Topographic models: a network run as named stages, with a cortical sheet for chosen layers.

Layers are named as the network's modules are in ``print(model)`` (``"layer4.1"``,
``"features.17"``, ``"it"``); :mod:`stimsim.models.stages` splits the network at them with
``torch.fx``, so a perturbation at a layer is followed by the later stages alone.

A model directory holds everything needed to rebuild a model exactly::

    model.json          architecture, layers (sheet file, area), preprocessing, readout layer,
                        training config, provenance, sha256 of every other file
    weights.pt          the network's state dict (loaded with ``weights_only=True``)
    positions/<layer>.npz   TDANN-format positions of each topographic layer
    resting/<layer>.npz     optional: each unit's resting activity (:mod:`stimsim.models.resting`)

Loading verifies the directory whole: ``files_sha256`` must cover ``weights.pt`` and every positions
(and resting-activity) file, name only files inside the directory, and match them; the weights must fit the
architecture and be finite. Saving the same model twice gives the same bytes.

Over 500 lines: the model and its directory are one concept: saving, loading, and the checks that a saved model
rebuilds exactly.
"""
from __future__ import annotations

import copy
import io
import json
import math
import numbers
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import numpy as np
import torch
import xarray as xr
from pydantic import ConfigDict, Field
from torch import nn

from stimsim.cortex.sheet import CorticalSheet
from stimsim.data.stimuli import SHOWN_REPEATS, StimulusSet
from stimsim.models.architectures import StimsimTopoNet, build_network
from stimsim.models.preprocessing import Preprocessing, image_sequence
from stimsim.models.shared_trunk import SHARED_TRUNK_STAGES, trunk_digest, trunk_output
from stimsim.models.stages import split_network
from stimsim.utilities.errors import ConfigError, DataError, FileFormatError
from stimsim.utilities.filemodels import FileModel, Text, validate_file
from stimsim.utilities.hashing import sha256_of
from stimsim.utilities.io import atomic_write_bytes, atomic_write_json, read_json
from stimsim.utilities.jsonable import json_value
from stimsim.utilities.ordering import repeated

MODEL_FORMAT = "stimsim-model/1"
#: Most input pixels (per channel) one batch of :meth:`TopographicModel.activations` runs at a time: 64 images of
#: 224 px. A larger batch of large images is split, so that an ImageNet network's early feature maps stay below
#: about 1 GB (a batch of 512 images at 224 px peaked at 5 GB); small images keep the batch asked for.
MAX_BATCH_PIXELS = 64 * 224 * 224
_SHA256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class LayerEntry(FileModel):
    """A topographic layer of ``model.json``: its positions file, cortical area label and, optionally, the file of
    its units' resting activity (:mod:`stimsim.models.resting`)."""

    positions_file: Text
    area: Text | None = None
    resting_activity_file: Text | None = None


class ArchitectureEntry(FileModel):
    """``model.json``'s network: a registered architecture family and its builder's arguments."""

    family: Text
    kwargs: dict[str, Any] = {}


class PreprocessingEntry(FileModel):
    """``model.json``'s image preprocessing (see :class:`~stimsim.models.preprocessing.Preprocessing`)."""

    size_px: Annotated[int, Field(ge=8)]
    channels: Literal[1, 3]
    mean: Annotated[list[float], Field(min_length=1, max_length=3)]
    std: Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=1, max_length=3)]


class CortexScaleEntry(FileModel):
    """``model.json`` → ``metadata.cortex_scale``: how a layer's sheet maps to macaque cortex (written by
    training from the configuration's ``[cortex_scale]``)."""

    layer: Text
    cortex_mm_per_model_mm: Annotated[float, Field(ge=1e-3, le=100.0)]
    sheet_size_cortex_mm: Annotated[float, Field(gt=0)] | None = None
    rule: Text


class MetadataEntry(FileModel):
    """``model.json``'s free ``metadata`` (training configuration, provenance, ...); only ``cortex_scale``,
    which experiments run at, is checked."""

    model_config = ConfigDict(extra="allow")
    cortex_scale: CortexScaleEntry | None = None


class ModelFile(FileModel):
    """``model.json`` of a model directory (see the module docstring)."""

    format: Literal[MODEL_FORMAT]
    name: Text | None = None
    architecture: ArchitectureEntry
    layers: dict[str, LayerEntry]
    readout_layer: Text | None = None
    preprocessing: PreprocessingEntry
    metadata: MetadataEntry = MetadataEntry()
    files_sha256: dict[str, _SHA256]


def declared_base_network(metadata: dict, architecture_kwargs: dict) -> str | None:
    """The ImageNet-trained network a model file says it is built on (its build's metadata, else its
    architecture's ``base_network`` argument), or None."""
    return metadata.get("base_network") or architecture_kwargs.get("base_network")


class TopographicModel:
    """A network whose layers named in ``sheets`` have unit positions on a cortical sheet.

    Parameters
    ----------
    network : the torch network (kept in eval mode by this class).
    sheets : layer name → CorticalSheet; a layer name is a module name as ``print(network)`` shows it
        (each becomes a stage, see ``stage_names``).
    preprocessing : how plain images become the network's input.
    architecture : ``{"family": ..., "kwargs": {...}}`` to rebuild the network (see architectures).
    readout_layer : the layer a behavioural decoder reads (default: the last topographic layer), a
        layer with a sheet, its area label or another module name.
    areas : layer name → cortical area label (e.g. ``{"it": "IT"}``); layers can be named by area.
    name, metadata : free description; metadata holds training config and provenance.
    stage_layers : further module names that must be stages (e.g. layers that will get sheets).
    """

    def __init__(self, network: nn.Module, sheets: dict[str, CorticalSheet], preprocessing: Preprocessing,
                 architecture: dict, readout_layer: str | None = None, areas: dict[str, str] | None = None,
                 name: str = "model", metadata: dict | None = None, stage_layers=()):
        self.network = network.eval()
        self.preprocessing = preprocessing
        self.architecture = dict(architecture)
        self.name = name
        self.metadata = dict(metadata or {})
        example = torch.zeros(2, preprocessing.channels, preprocessing.size_px, preprocessing.size_px)
        modules = dict(network.named_modules())
        stage_layers = list(sheets) + list(stage_layers) + (
            [readout_layer] if readout_layer in modules and readout_layer else [])
        self.stages = split_network(network, example, layers=list(dict.fromkeys(stage_layers)),
                                    open_sequentials=not isinstance(network, StimsimTopoNet))
        self.stage_names = [n for n, _ in self.stages]
        self.areas = dict(areas or {})
        shared = sorted(area for area, count in Counter(self.areas.values()).items() if count > 1)
        if shared:
            raise ConfigError(f"area label(s) {shared} given to more than one layer "
                              f"({ {layer: area for layer, area in self.areas.items() if area in shared} }); "
                              "each area names one layer")
        self.sheets: dict[str, CorticalSheet] = {}
        dims = self.stage_output_dims(example)
        for layer, sheet in sheets.items():
            if layer not in dims:
                raise ConfigError(f"layer {layer!r} is not a stage of this network; stages: {self.stage_names}")
            if tuple(sheet.dims) != dims[layer]:
                raise ConfigError(f"sheet for layer {layer!r} has dims {sheet.dims}, but the layer outputs {dims[layer]}")
            self.sheets[layer] = sheet
        for layer in self.areas:
            if layer not in self.sheets:
                raise ConfigError(f"area given for layer {layer!r}, which has no sheet")
        self.readout_layer = self.resolve_layer(readout_layer) if readout_layer else (
            max(self.sheets, key=self.stage_names.index) if self.sheets else self.stage_names[-1])

    # --- structure ------------------------------------------------------------------------
    @property
    def layers(self) -> list[str]:
        """Topographic layers, in network order."""
        return sorted(self.sheets, key=self.stage_names.index)

    @property
    def base_network(self) -> str:
        """The ImageNet-trained network this model is built on (e.g. ``"mobilenet_v2"``); for another model, its
        architecture: a torchvision network's name (e.g. ``"resnet18"``), else its family (e.g. ``"stimsim_topo"``)."""
        kwargs = self.architecture.get("kwargs", {})
        return declared_base_network(self.metadata, kwargs) or kwargs.get("arch") or self.architecture["family"]

    def resolve_layer(self, layer: str) -> str:
        """A stage name, given a stage name or an area label such as ``"IT"``."""
        if layer in self.stage_names:
            return layer
        matches = [name for name, area in self.areas.items() if area == layer]
        if len(matches) == 1:
            return matches[0]
        raise ConfigError(
            f"unknown layer {layer!r}; stages: {self.stage_names}; areas: {self.areas or 'none'}"
        )

    def sheet(self, layer: str) -> CorticalSheet:
        layer = self.resolve_layer(layer)
        if layer not in self.sheets:
            raise ConfigError(f"layer {layer!r} has no cortical sheet; topographic layers: {self.layers}")
        return self.sheets[layer]

    def cortex_scale(self, layer: str) -> dict:
        """How ``layer``'s sheet, as it is, maps to macaque cortex: ``cortex_mm_per_model_mm`` (cortex mm per mm of
        the sheet's coordinates), ``sheet_size_cortex_mm`` and the anatomical ``rule`` that set the scale, from the
        model's metadata (``metadata["cortex_scale"]``, written by training); 1 cortex mm per model mm, with the
        rule "none recorded", for a layer without one. For a sheet already converted (:meth:`in_cortex_mm`) the
        factor is what remains: 1, unless the conversion overrode the model's own scale."""
        layer = self.resolve_layer(layer)
        record = self.metadata.get("cortex_scale") or {}
        if record and self.resolve_layer(str(record.get("layer"))) == layer:  # a layer or its area label
            factor, rule = float(record["cortex_mm_per_model_mm"]), str(record["rule"])
        else:
            factor, rule = 1.0, "none recorded: 1 cortex mm per model mm"
        converted = self.sheet(layer).cortex_mm_per_model_mm
        if converted != 1.0:
            factor, rule = factor / converted, f"{rule} [sheet converted by {converted:g} cortex mm per model mm]"
        return {"layer": layer, "cortex_mm_per_model_mm": factor,
                "sheet_size_cortex_mm": round(factor * self.sheet(layer).size_mm, 3), "rule": rule}

    def in_cortex_mm(self, layer: str, cortex_mm_per_model_mm: float | None = None) -> tuple["TopographicModel", dict]:
        """A view of this model (same network) whose ``layer`` sheet is in cortex mm — the one place the cortex
        frame is made. Every length a lab or a file gives (array pitch, poses, radii, spread, separations) is in
        cortex mm; the sheet is converted by the model's own recorded scale (:meth:`cortex_scale`) unless
        ``cortex_mm_per_model_mm`` overrides it; the view's sheet converts back with
        :meth:`~stimsim.cortex.sheet.CorticalSheet.to_model_mm`. Returns ``(view, record)``, the record with
        ``cortex_mm_per_model_mm`` (used), ``model_cortex_mm_per_model_mm`` (the model's own) and
        ``scale_overridden``. On a view already converted, both scales are still per mm of the model's own sheet:
        the view is converted to the scale asked for, not by it once more."""
        if cortex_mm_per_model_mm is not None and (
                isinstance(cortex_mm_per_model_mm, bool) or not isinstance(cortex_mm_per_model_mm, numbers.Real)
                or not (math.isfinite(cortex_mm_per_model_mm) and cortex_mm_per_model_mm > 0)):
            raise ConfigError(f"cortex_mm_per_model_mm must be a finite number > 0 (cortex mm per model mm) or None "
                              f"(the model's own scale), got {cortex_mm_per_model_mm!r}")
        converted = self.sheet(self.resolve_layer(layer)).cortex_mm_per_model_mm
        own = self.cortex_scale(layer)["cortex_mm_per_model_mm"] * converted
        scale = own if cortex_mm_per_model_mm is None else float(cortex_mm_per_model_mm)
        view = self.with_sheet_scale(layer, scale / converted) if not math.isclose(scale, converted) else self
        return view, {"cortex_mm_per_model_mm": scale, "model_cortex_mm_per_model_mm": own,
                      "scale_overridden": not math.isclose(scale, own)}

    def with_sheet_scale(self, layer: str, cortex_mm_per_model_mm: float) -> "TopographicModel":
        """A view of this model (same network) whose ``layer`` sheet is scaled by ``cortex_mm_per_model_mm``
        (:meth:`in_cortex_mm` chooses the factor)."""
        layer = self.resolve_layer(layer)
        view = copy.copy(self)
        view.sheets = {**self.sheets, layer: self.sheet(layer).scaled(cortex_mm_per_model_mm)}
        return view

    def stage_output_dims(self, example: torch.Tensor) -> dict[str, tuple[int, int, int]]:
        """Output dims (C, H, W) of every stage for the model's input size; flat outputs are (C, 1, 1)."""
        dims = {}
        with torch.no_grad():
            x = example
            for name, module in self.stages:
                x = module(x)
                shape = tuple(x.shape[1:])
                dims[name] = shape if len(shape) == 3 else (int(np.prod(shape)), 1, 1)
        return dims

    # --- device ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the network's parameters are (the CPU for a network without any)."""
        for tensor in self.network.parameters():
            return tensor.device
        return torch.device("cpu")

    def to(self, device) -> "TopographicModel":
        """Move the network to ``device`` (a name as in :func:`stimsim.engine.devices.resolve_device`), in place;
        returns the model. Preprocessing, activations and the engine then compute there."""
        from stimsim.engine.devices import resolve_device

        self.network.to(resolve_device(device))
        return self

    def with_dtype(self, dtype: torch.dtype) -> "TopographicModel":
        """This model when its network already computes in ``dtype`` (e.g. ``torch.float64``), else a copy whose
        network does; the input ``preprocess`` gives stays float32 (convert it)."""
        for tensor in self.network.parameters():
            if tensor.dtype == dtype:
                return self
            break
        converted = copy.deepcopy(self)
        converted.network.to(dtype)
        for _, module in converted.stages:
            module.to(dtype)
        return converted

    # --- running --------------------------------------------------------------------------
    def preprocess(self, images) -> torch.Tensor:
        """Images → normalised float32 input (N, channels, size_px, size_px) on the model's device."""
        return self.preprocessing(images, device=self.device)

    def run_stages(self, x: torch.Tensor, start: str | None = None, stop: str | None = None) -> torch.Tensor:
        """Run the stages after ``start`` (from the input if None) up to and including ``stop``
        (the last stage if None) on ``x``."""
        first = 0 if start is None else self.stage_names.index(self.resolve_layer(start)) + 1
        last = len(self.stages) - 1 if stop is None else self.stage_names.index(self.resolve_layer(stop))
        if last < first - 1:
            raise ConfigError(f"stage {stop!r} comes before {start!r}")
        with torch.no_grad():
            shared = self._shared_trunk_end()
            if first == 0 and shared is not None and last >= shared:  # maybe computed by a model of the same trunk
                x = trunk_output(self._trunk_digest, x, lambda inputs: self._run_range(inputs, 0, shared))
                first = shared + 1
            x = self._run_range(x, first, last)
        return x

    def _run_range(self, x: torch.Tensor, first: int, last: int) -> torch.Tensor:
        for _, module in self.stages[first:last + 1]:
            x = module(x)
        return x

    def _shared_trunk_end(self) -> int | None:
        """Index of the last stage of a trunk this model may share with others (:mod:`stimsim.models.shared_trunk`)."""
        stage = SHARED_TRUNK_STAGES.get(self.architecture.get("family"))
        return self.stage_names.index(stage) if stage in self.stage_names else None

    def _trunk_digest(self) -> str:
        if getattr(self, "_trunk_sha256", None) is None:
            self._trunk_sha256 = trunk_digest(self.stages[:self._shared_trunk_end() + 1])
        return self._trunk_sha256

    #: ``images`` as a sequence with one entry per image (:func:`stimsim.models.preprocessing.image_sequence`).
    image_sequence = staticmethod(image_sequence)

    def activations(self, images, layer: str, batch_size: int = 64) -> torch.Tensor:
        """Activations of ``layer`` for ``images`` (one image, a sequence, a stacked array/tensor or a
        :class:`~stimsim.data.stimuli.StimulusSet`: :func:`~stimsim.models.preprocessing.image_sequence`),
        flattened to (N_images, N_units) in C-major order; computed on the model's device batch by batch (only one
        batch of preprocessed images is held at a time; at most :data:`MAX_BATCH_PIXELS` input pixels, whatever
        ``batch_size`` asks), returned on the CPU."""
        layer = self.resolve_layer(layer)
        batch_size = self.batch_limit(batch_size)
        images = self.image_sequence(images)
        if len(images) == 0:
            raise ValueError("no images given")
        outputs = [self.run_stages(self.preprocess(images[i:i + batch_size]), stop=layer).flatten(1).cpu()
                   for i in range(0, len(images), batch_size)]
        return torch.cat(outputs)

    def batch_limit(self, batch_size: int) -> int:
        """``batch_size`` (an integer >= 1), or fewer images where that many of this model's input size exceed
        :data:`MAX_BATCH_PIXELS`."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        return max(1, min(int(batch_size), MAX_BATCH_PIXELS // self.preprocessing.size_px ** 2))

    def activations_xarray(self, images, layer: str, stimulus_ids=None, batch_size: int = 64) -> xr.DataArray:
        """Activations as a labelled array (stimulus_id × unit) with unit coords x_mm, y_mm, channel; the
        stimulus ids those of a :class:`~stimsim.data.stimuli.StimulusSet` given as ``images`` unless given."""
        layer = self.resolve_layer(layer)
        values = self.activations(images, layer, batch_size).numpy()
        if stimulus_ids is None and isinstance(images, StimulusSet):
            stimulus_ids = images.stimulus_id
        if stimulus_ids is None:
            stimulus_ids = [f"image_{i:05d}" for i in range(len(values))]
        if len(stimulus_ids) != len(values):
            raise ValueError(f"got {len(stimulus_ids)} stimulus_ids for {len(values)} images")
        again = repeated(map(str, stimulus_ids), at_most=SHOWN_REPEATS)
        if again:
            raise ValueError(f"stimulus_ids must be unique (each labels one image); repeated: {again}")
        coords = {"stimulus_id": list(stimulus_ids), "unit": np.arange(values.shape[1])}
        if layer in self.sheets:
            sheet = self.sheets[layer]
            coords.update(x_mm=("unit", sheet.coordinates_mm[:, 0]), y_mm=("unit", sheet.coordinates_mm[:, 1]),
                          channel=("unit", sheet.unit_channels()))
        return xr.DataArray(values, dims=("stimulus_id", "unit"), coords=coords, name="activation",
                            attrs={"model": self.name, "layer": layer, "units": "model activation (a.u.)"})

    # --- files ----------------------------------------------------------------------------
    def save(self, directory) -> Path:
        """Write the model directory (weights, positions, model.json with checksums); its metadata is checked first as
        :meth:`load` checks it, a ``cortex_scale`` given by area label stored under its layer's name."""
        directory = Path(directory)
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"model directory {directory}: a file is there; give a folder to save the model in")
        metadata = self._metadata_to_save(directory / "model.json")
        self._check_rebuilds(directory / "model.json")
        state = self.network.state_dict()
        if self.metadata.get("weights_storage") == "float16":
            state = {key: value.half() if value.is_floating_point() else value for key, value in state.items()}
        _refuse_non_finite(state, f"model {self.name!r}")
        (directory / "positions").mkdir(parents=True, exist_ok=True)
        files = {}
        buffer = io.BytesIO()  # saved through memory, so no temporary file name ends up in the archive
        torch.save(state, buffer)
        atomic_write_bytes(directory / "weights.pt", buffer.getvalue())
        files["weights.pt"] = sha256_of(directory / "weights.pt")
        layers = {}
        for layer, sheet in self.sheets.items():
            rel = f"positions/{layer}.npz"
            sheet.save(directory / rel)
            files[rel] = sha256_of(directory / rel)
            layers[layer] = {"positions_file": rel, "area": self.areas.get(layer)}
            if sheet.resting_activity is not None:
                rel = f"resting/{layer}.npz"
                sheet.save_resting(directory / rel)  # makes resting/ as it writes
                files[rel] = sha256_of(directory / rel)
                layers[layer]["resting_activity_file"] = rel
        atomic_write_json(directory / "model.json", {
            "format": MODEL_FORMAT,
            "name": self.name,
            "architecture": self.architecture,
            "layers": layers,
            "readout_layer": self.readout_layer,
            "preprocessing": self.preprocessing.to_dict(),
            "metadata": metadata,
            "files_sha256": files,
        })
        return directory

    def _check_rebuilds(self, spec_path: Path) -> None:
        """Refuse a model whose ``architecture`` does not rebuild its network as :meth:`load` rebuilds it (a mistyped
        family, kwargs that do not fit, a network of other layers or shapes): it would be saved and fail only when
        loaded."""
        from stimsim.models.weights import load_weights

        family, kwargs = self.architecture.get("family"), self.architecture.get("kwargs", {})
        network = _built_network(family, kwargs, spec_path)
        try:
            load_weights(network, self.network.state_dict())
        except ConfigError as exc:
            raise ConfigError(f"{spec_path} [architecture]: family {family!r} with kwargs {kwargs} builds another "
                              f"network than this model's ({exc}); give the family and kwargs it was built "
                              "with") from None

    def _metadata_to_save(self, spec_path: Path) -> dict:
        metadata = dict(self.metadata)
        scale = metadata.get("cortex_scale")
        if isinstance(scale, dict) and "layer" in scale:
            try:
                metadata["cortex_scale"] = {**scale, "layer": self.resolve_layer(str(scale["layer"]))}
            except ConfigError as exc:
                raise FileFormatError(spec_path, f"[metadata.cortex_scale]: 'layer': {exc}") from None
            if metadata["cortex_scale"]["layer"] not in self.sheets:
                raise FileFormatError(spec_path, f"[metadata.cortex_scale]: 'layer' must be one of the model's layers "
                                                 f"{sorted(self.sheets)}, got {scale['layer']!r}")
        as_written = json.loads(json.dumps({  # as model.json will hold it: lists for tuples
            "format": MODEL_FORMAT, "name": self.name, "architecture": self.architecture,
            "layers": {layer: {"positions_file": f"positions/{layer}.npz"} for layer in self.sheets},
            "readout_layer": self.readout_layer, "preprocessing": self.preprocessing.to_dict(), "metadata": metadata,
            "files_sha256": {}}, default=json_value))
        validate_file(ModelFile, as_written, spec_path)
        return metadata

    @classmethod
    def load(cls, directory, device="cpu") -> "TopographicModel":
        """Load a model directory onto ``device`` (cpu, cuda, mps, auto), verifying that ``files_sha256`` covers
        every file the model needs and that each matches; weights that do not fit the architecture or are not
        finite are refused."""
        from stimsim.engine.devices import resolve_device
        from stimsim.models.weights import load_weights, read_checkpoint_file

        device = resolve_device(device)
        directory = Path(directory)
        spec_path = directory / "model.json"
        spec, raw_metadata = verified_model_files(directory)
        try:
            preprocessing = Preprocessing(**spec.preprocessing.model_dump())
        except ConfigError as exc:
            raise FileFormatError(spec_path, f"[preprocessing]: {exc}") from None
        network = _built_network(spec.architecture.family, spec.architecture.kwargs, spec_path)
        weights_path = directory / "weights.pt"
        state = read_checkpoint_file(weights_path)
        load_weights(network, state, source=weights_path)
        _refuse_non_finite(network.state_dict(), str(weights_path))
        sheets = {layer: _sheet_with_resting(directory, info) for layer, info in spec.layers.items()}
        areas = {layer: info.area for layer, info in spec.layers.items() if info.area}
        scale = spec.metadata.cortex_scale
        if scale is not None and scale.layer not in spec.layers:
            raise FileFormatError(spec_path, f"[metadata.cortex_scale]: 'layer' must be one of the model's layers "
                                             f"{sorted(spec.layers)}, got {scale.layer!r}")
        try:
            model = cls(network, sheets, preprocessing, spec.architecture.model_dump(),
                        readout_layer=spec.readout_layer, areas=areas, name=spec.name or directory.name,
                        metadata=raw_metadata)
        except ConfigError as exc:  # the layers, their sheets, areas and readout layer do not fit the network
            raise FileFormatError(spec_path, str(exc)) from None
        return model.to(device)


def _built_network(family: str, kwargs: dict, spec_path: Path) -> nn.Module:
    """The untrained network of ``model.json``'s architecture (``spec_path`` is named in the error when it fails),
    built without drawing on torch's global random state (its random initial weights are overwritten)."""
    try:
        with torch.random.fork_rng(devices=[]):
            return build_network(family, **kwargs)
    except TypeError as exc:
        raise FileFormatError(spec_path, f"[architecture]: kwargs do not fit family {family!r} ({exc})") from None
    except ConfigError as exc:
        raise ConfigError(f"{spec_path} [architecture]: {exc}") from None


def _sheet_with_resting(directory: Path, info: LayerEntry) -> CorticalSheet:
    """The sheet of one ``model.json`` layer, with its units' resting activity when the layer lists a file."""
    sheet = CorticalSheet.load(directory / info.positions_file)
    if info.resting_activity_file is None:
        return sheet
    return sheet.with_resting_file(directory / info.resting_activity_file)


def verified_model_files(directory: Path) -> tuple["ModelFile", dict]:
    """The checked ``model.json`` of the model directory ``directory`` (and its raw ``metadata``) once every file it
    lists is there with its sha256; a missing, damaged or uncovered file raises DataError or FileFormatError."""
    spec_path = directory / "model.json"
    if not spec_path.is_file():
        raise DataError(f"{directory} is not a stimsim model directory (no model.json)")
    raw = read_json(spec_path)
    raw_metadata = raw.get("metadata", {}) if isinstance(raw, dict) else {}
    spec = validate_file(ModelFile, raw, spec_path)
    needed = ["weights.pt"] + [rel for info in spec.layers.values()
                               for rel in (info.positions_file, info.resting_activity_file) if rel]
    uncovered = [rel for rel in needed if rel not in spec.files_sha256]
    if uncovered:
        raise FileFormatError(spec_path, f"files_sha256 does not cover {uncovered}; every file the model "
                                         f"needs must be listed with its sha256")
    for rel, expected in spec.files_sha256.items():
        path = _inside(directory, rel, spec_path)
        if not path.is_file():
            raise DataError(f"model {directory}: file {rel} is missing")
        actual = sha256_of(path)
        if actual != expected:
            raise DataError(f"model {directory}: checksum mismatch for {rel} (sha256 {actual}, expected {expected})")
    return spec, raw_metadata


def _inside(directory: Path, rel, spec_path: Path) -> Path:
    """``directory / rel`` for a relative path that stays inside ``directory`` (FileFormatError otherwise)."""
    if not isinstance(rel, str) or not rel or PurePosixPath(rel).is_absolute() or ".." in PurePosixPath(rel).parts \
            or "\\" in rel:
        raise FileFormatError(spec_path, f"file {rel!r} in files_sha256 is not a relative path inside the model "
                                         "directory")
    path = directory / rel
    if not path.resolve().is_relative_to(directory.resolve()):
        raise FileFormatError(spec_path, f"file {rel!r} in files_sha256 leads outside the model directory")
    return path


def _refuse_non_finite(state: dict, where: str) -> None:
    """DataError naming the tensors of ``state`` that hold NaN or infinite values."""
    bad = [name for name, tensor in state.items() if tensor.is_floating_point() and not torch.isfinite(tensor).all()]
    if bad:
        raise DataError(f"{where}: weights are not finite (NaN or infinite values in {', '.join(bad[:5])}"
                        f"{f' and {len(bad) - 5} more' if len(bad) > 5 else ''}); the model diverged or the file "
                        "is damaged")
