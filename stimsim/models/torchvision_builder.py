"""Any torchvision classification network as a topographic model, with positions assigned by stimsim.

The chosen layers get TDANN-style retinotopic positions (``stimsim.cortex.positions.build_sheet``),
optionally swap-optimised on the network's responses to a few images
(``stimsim.models.swap.swap_optimize``; Margalit et al. 2024, Neuron). Weights come from a state
dict file read with ``torch.load(weights_only=True)`` (no arbitrary unpickling) or from memory.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch

from stimsim.cortex.positions import build_sheet
from stimsim.models.architectures import build_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.swap import swap_optimize
from stimsim.models.topographic import TopographicModel
from stimsim.models.weights import load_weights, read_checkpoint_file
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.hashing import sha256_of

#: Keys of one layer's sheet spec: required ones first.
SHEET_SPEC_REQUIRED = ("sheet_size_mm", "neighborhood_width_mm")
SHEET_SPEC_OPTIONAL = ("area", "n_neighborhoods")


def build_torchvision_model(arch: str, state_dict, layers: dict, preprocessing: Preprocessing = Preprocessing(),
                            seed: int = 0, swap_images=None, swap_steps: int = 0, network_kwargs: dict | None = None,
                            readout_layer: str | None = None, name: str | None = None,
                            cortex_scale: dict | None = None) -> TopographicModel:
    """A torchvision network whose ``layers`` get positions on cortical sheets.

    Parameters
    ----------
    arch : a torchvision model name (``torchvision.models.list_models()``), e.g. ``"resnet18"``.
    state_dict : path of a state dict file, a state dict, or None (random initial weights).
    layers : stage name (e.g. ``"layer4.1"``, ``"features.10"``) → sheet spec, a dict with
        ``sheet_size_mm`` (side of the square sheet, mm), ``neighborhood_width_mm`` (spatial-loss
        neighbourhood width, mm) and optionally ``area`` (label such as ``"IT"``) and
        ``n_neighborhoods`` (default 256).
    preprocessing : input size and normalisation (default 224 px RGB, ImageNet mean/std).
    seed : seeds the random initial weights (used when state_dict is None, without touching torch's
        global random state); layer i gets positions and swap choices from seed + 2·i.
    swap_images, swap_steps : if swap_steps > 0, each layer's positions are swap-optimised for
        ``swap_steps`` steps on the network's responses to ``swap_images`` (>= 2 images).
    network_kwargs : extra keyword arguments of the torchvision constructor (e.g. ``num_classes``).
    readout_layer : layer a decoder reads (default: the last topographic layer).
    name : model name (default: ``arch``).
    cortex_scale : the model's physical scale, fixed by an anatomical rule before any experiment runs on it:
        ``layer`` (one of ``layers``, or its area label), ``cortex_mm_per_model_mm`` (> 0) and ``rule`` (the rule
        in words); recorded in ``metadata["cortex_scale"]`` with the sheet's size in cortex mm. Without it, one
        cortex mm per model mm ("none recorded").

    Example
    -------
    >>> model = build_torchvision_model("resnet18", None, {"layer4.1": {"sheet_size_mm": 10.0,
    ...     "neighborhood_width_mm": 2.0, "area": "IT"}}, Preprocessing(size_px=64))
    >>> model.sheet("IT").dims
    (512, 2, 2)
    """
    network_kwargs = dict(network_kwargs or {})
    if "weights" in network_kwargs or "arch" in network_kwargs:
        raise ConfigError("network_kwargs may not contain 'weights' or 'arch'; pass weights through state_dict")
    if preprocessing.channels != 3:
        raise ConfigError(f"torchvision networks take RGB input: preprocessing.channels must be 3, "
                          f"got {preprocessing.channels}")
    if not isinstance(layers, Mapping) or not layers:
        raise ConfigError("layers must be a non-empty dict: layer name -> sheet spec")
    specs = {layer: _check_sheet_spec(layer, spec) for layer, spec in layers.items()}
    labels = [spec["area"] for spec in specs.values() if spec["area"]]
    if len(labels) != len(set(labels)):
        raise ConfigError(f"area labels must differ between layers (a label names one layer), got {labels}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")
    if isinstance(swap_steps, bool) or not isinstance(swap_steps, int) or swap_steps < 0:
        raise ConfigError(f"swap_steps must be an integer >= 0, got {swap_steps!r}")
    if swap_steps > 0 and swap_images is None:
        raise ConfigError("swap_steps > 0 needs swap_images (>= 2 images to compute responses on)")
    if swap_steps == 0 and swap_images is not None:
        raise ConfigError("swap_images were given but swap_steps is 0; set swap_steps > 0 to swap-optimise positions")

    architecture = {"family": "torchvision", "kwargs": {"arch": arch, **network_kwargs}}
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            network = build_network("torchvision", **architecture["kwargs"])
    except TypeError as exc:
        raise ConfigError(f"torchvision {arch!r} does not accept network_kwargs {network_kwargs}: {exc}") from None
    metadata = {"builder": "stimsim.models.torchvision_builder.build_torchvision_model", "seed": seed,
                "layers": specs, "swap_steps": swap_steps}
    if state_dict is None:
        metadata["weights"] = {"source": f"random initial weights (torch seed {seed})"}
    elif isinstance(state_dict, (str, Path)):
        path = Path(state_dict)
        load_weights(network, read_checkpoint_file(path), source=path)
        metadata["weights"] = {"source": "file", "path": str(path), "sha256": sha256_of(path)}
    else:
        load_weights(network, state_dict)
        metadata["weights"] = {"source": "state dict given in memory"}
    modules = dict(network.named_modules())
    unknown = [layer for layer in specs if layer not in modules or not layer]
    if unknown:
        stages = TopographicModel(network, {}, preprocessing, architecture).stage_names
        raise ConfigError(f"layer(s) {unknown} are not stages of {arch}; layer names are module names as "
                          f"print(model) shows them; stages: {stages}")
    plain = TopographicModel(network, {}, preprocessing, architecture, name=name or arch, stage_layers=list(specs))
    example = torch.zeros(1, preprocessing.channels, preprocessing.size_px, preprocessing.size_px)
    dims = plain.stage_output_dims(example)
    sheets, swap_losses = {}, {}
    for index, (layer, spec) in enumerate(specs.items()):
        layer_seed = seed + 2 * index
        sheet = build_sheet(layer, dims[layer], spec["sheet_size_mm"], spec["neighborhood_width_mm"],
                            n_neighborhoods=spec["n_neighborhoods"], seed=layer_seed)
        if swap_steps > 0:
            responses = plain.activations(swap_images, layer)
            sheet, history = swap_optimize(sheet, responses, swap_steps, seed=layer_seed)
            swap_losses[layer] = {"initial": float(history[0]), "final": float(history[-1])}
        sheets[layer] = sheet
    if swap_losses:
        metadata["swap_spatial_loss"] = swap_losses
    areas = {layer: spec["area"] for layer, spec in specs.items() if spec.get("area")}
    if cortex_scale is not None:
        metadata["cortex_scale"] = _checked_scale(cortex_scale, specs, areas)
    return TopographicModel(network, sheets, preprocessing, architecture, readout_layer=readout_layer, areas=areas,
                            name=name or arch, metadata=metadata)


def _checked_scale(scale, specs: dict, areas: dict) -> dict:
    """``cortex_scale`` as model.json records it, its layer by name and its sheet's size in cortex mm."""
    if not isinstance(scale, Mapping) or set(scale) != {"layer", "cortex_mm_per_model_mm", "rule"}:
        raise ConfigError(f"cortex_scale must be a dict with exactly the keys layer, cortex_mm_per_model_mm and rule, "
                          f"got {scale!r}")
    by_area = {area: layer for layer, area in areas.items()}
    layer = by_area.get(scale["layer"], scale["layer"])
    if layer not in specs:
        raise ConfigError(f"cortex_scale: layer must be one of the topographic layers {sorted(specs)} or their area "
                          f"labels {sorted(by_area)}, got {scale['layer']!r}")
    factor = scale["cortex_mm_per_model_mm"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
        raise ConfigError(f"cortex_scale: cortex_mm_per_model_mm must be a number > 0, got {factor!r}")
    if not isinstance(scale["rule"], str) or not scale["rule"].strip():
        raise ConfigError("cortex_scale: rule must say in words which anatomical rule set the scale")
    return {"layer": layer, "cortex_mm_per_model_mm": float(factor),
            "sheet_size_cortex_mm": float(factor) * specs[layer]["sheet_size_mm"], "rule": scale["rule"]}


def _check_sheet_spec(layer: str, spec) -> dict:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"layer {layer!r}: the sheet spec must be a dict with keys {SHEET_SPEC_REQUIRED}")
    unknown = set(spec) - set(SHEET_SPEC_REQUIRED) - set(SHEET_SPEC_OPTIONAL)
    if unknown:
        raise ConfigError(f"layer {layer!r}: unknown sheet spec key(s) {sorted(unknown)}; allowed: "
                          f"{SHEET_SPEC_REQUIRED + SHEET_SPEC_OPTIONAL}")
    missing = [key for key in SHEET_SPEC_REQUIRED if key not in spec]
    if missing:
        raise ConfigError(f"layer {layer!r}: sheet spec lacks {missing}")
    checked = {}
    for key in SHEET_SPEC_REQUIRED:
        try:
            checked[key] = float(spec[key])
        except (TypeError, ValueError):
            raise ConfigError(f"layer {layer!r}: {key} must be a number (mm), got {spec[key]!r}") from None
    if checked["sheet_size_mm"] <= 0:
        raise ConfigError(f"layer {layer!r}: sheet_size_mm must be > 0, got {spec['sheet_size_mm']}")
    n_neighborhoods = spec.get("n_neighborhoods", 256)
    if isinstance(n_neighborhoods, bool) or not isinstance(n_neighborhoods, int) or n_neighborhoods < 1:
        raise ConfigError(f"layer {layer!r}: n_neighborhoods must be an integer >= 1, got {n_neighborhoods!r}")
    checked["n_neighborhoods"] = n_neighborhoods
    area = spec.get("area")
    if area is not None and (not isinstance(area, str) or not area):
        raise ConfigError(f"layer {layer!r}: area must be a non-empty string such as 'IT', got {area!r}")
    checked["area"] = area
    return checked
