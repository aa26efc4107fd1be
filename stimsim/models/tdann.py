"""Loader for published TDANN models (Margalit et al. 2024, Neuron).

Margalit, Lee, Finzi, DiCarlo, Grill-Spector & Yamins (2024), "A unifying framework for functional
organization in early and higher ventral visual cortex", Neuron 112:2435. Code: neuroailab/TDANN;
checkpoints and positions: OSF project 64qv3.

A TDANN is a torchvision ResNet-18 (``fc`` replaced by identity) trained with VISSL. Its
checkpoint keeps the trunk weights under ``ckpt["classy_state_dict"]["base_model"]["model"]["trunk"]``.
In TDANN's ``spatial_resnet18`` trunk the network is the attribute ``base_model``, so the keys read
``base_model.layer4.1.conv1.weight``; the same modules are registered a second time in a
``_feature_blocks`` ModuleDict (``_feature_blocks.conv1``, ``_feature_blocks.layer4_1``, ...), so those
aliases hold the same tensors. Standard VISSL ResNe(X)t trunks only have ``_feature_blocks.`` keys with
torchvision names (``_feature_blocks.layer4.1.conv1.weight``). This loader takes the ``base_model.``
keys when there are any (and checks that the ``_feature_blocks.`` aliases agree with them), otherwise
the ``_feature_blocks.`` keys with ``layerX_Y`` read as ``layerX.Y``; ``fc.`` keys are dropped.

Positions: one TDANN positions file per layer, ``<layer>.npz`` or ``<layer>.pkl`` (see
``stimsim.cortex.sheet``), each checked against the layer's output dims at 224 px.

Areas (``TDANN_AREAS``): TDANN maps layer1.x to the retina, layer2.x to V1, layer3.0 to V2, layer3.1
to V4 and layer4.x to ventral temporal cortex (VTC, read here as IT). An area label must name one
layer, so the last block of each stage carries the plain label (layer4.1 = ``"IT"``, the layer the
published VTC analyses read out) and the first block of a two-block area a qualified one
(layer4.0 = ``"pIT"``, posterior IT, which comes earlier in the hierarchy; layer1.0 =
``"retina-early"``, layer2.0 = ``"V1-early"``).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch

from stimsim.cortex.sheet import CorticalSheet
from stimsim.models.architectures import build_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.topographic import TopographicModel
from stimsim.models.weights import load_weights, read_checkpoint_file
from stimsim.utilities.errors import ConfigError, FileFormatError
from stimsim.utilities.hashing import sha256_of

#: The eight topographic layers of a TDANN ResNet-18, in network order.
TDANN_LAYERS = ("layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1", "layer4.0", "layer4.1")

#: Area label of each layer (unique per layer; see the module docstring).
TDANN_AREAS = {
    "layer1.0": "retina-early", "layer1.1": "retina",
    "layer2.0": "V1-early", "layer2.1": "V1",
    "layer3.0": "V2", "layer3.1": "V4",
    "layer4.0": "pIT", "layer4.1": "IT",
}

#: TDANN's input: 224 px RGB, ImageNet mean and std.
TDANN_PREPROCESSING = Preprocessing(size_px=224, channels=3, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))

TDANN_CITATION = (
    "Margalit E, Lee H, Finzi D, DiCarlo JJ, Grill-Spector K, Yamins DLK (2024). A unifying framework for "
    "functional organization in early and higher ventral visual cortex. Neuron 112:2435-2451."
)

#: Where the trunk's state dict sits inside a VISSL checkpoint.
_TRUNK_PATH = ("classy_state_dict", "base_model", "model", "trunk")
_BASE_PREFIX = "base_model."
_BLOCKS_PREFIX = "_feature_blocks."


def read_vissl_trunk(checkpoint_path) -> dict[str, torch.Tensor]:
    """The ResNet-18 state dict (torchvision key names, no ``fc.``) inside a TDANN VISSL checkpoint."""
    path = Path(checkpoint_path)
    node = read_checkpoint_file(path)
    where = "checkpoint"
    for key in _TRUNK_PATH:
        if not isinstance(node, Mapping):
            raise FileFormatError(path, f"{where} is a {type(node).__name__}, expected a dict; a VISSL checkpoint "
                                        f"holds its weights under {_trunk_path_text()}")
        if key not in node:
            raise FileFormatError(path, f"{where} has no key {key!r} (keys: {sorted(map(str, node))[:8]}); a VISSL "
                                        f"checkpoint holds its weights under {_trunk_path_text()}")
        node, where = node[key], f"{where}[{key!r}]"
    if not isinstance(node, Mapping):
        raise FileFormatError(path, f"{where} is a {type(node).__name__}, expected a state dict")
    others = [key for key in node if not (isinstance(key, str) and key.startswith((_BASE_PREFIX, _BLOCKS_PREFIX)))]
    if others:
        raise FileFormatError(path, f"{where} has keys outside '{_BASE_PREFIX}' and '{_BLOCKS_PREFIX}': "
                                    f"{others[:5]}")
    base = {key[len(_BASE_PREFIX):]: value for key, value in node.items() if key.startswith(_BASE_PREFIX)}
    blocks = {_block_to_torchvision(key[len(_BLOCKS_PREFIX):]): value for key, value in node.items()
              if key.startswith(_BLOCKS_PREFIX)}
    if base:
        for key, value in blocks.items():
            if key not in base or not _same_tensor(value, base[key]):
                raise FileFormatError(path, f"{where}: '{_BLOCKS_PREFIX}' entry for {key!r} does not match "
                                            f"'{_BASE_PREFIX}{key}'")
        state = base
    elif blocks:
        state = blocks
    else:
        raise FileFormatError(path, f"{where} is empty; expected ResNet-18 weights with '{_BASE_PREFIX}' keys")
    return {key: value for key, value in state.items() if not key.startswith("fc.")}


def _trunk_path_text() -> str:
    return "ckpt" + "".join(f"[{key!r}]" for key in _TRUNK_PATH)


def _block_to_torchvision(key: str) -> str:
    """``layer4_1.conv1.weight`` (TDANN's block names) → ``layer4.1.conv1.weight``."""
    return re.sub(r"^(layer\d+)_(\d+)\.", r"\1.\2.", key)


def _same_tensor(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)


def load_tdann(checkpoint_path, positions_dir, layers=None, name: str | None = None,
               readout_layer: str = "layer4.1", areas: dict[str, str] | None = None) -> TopographicModel:
    """A published TDANN as a ``TopographicModel``.

    Parameters
    ----------
    checkpoint_path : the VISSL checkpoint (``.torch``), read with ``weights_only=True``.
    positions_dir : folder with ``<layer>.npz`` or ``<layer>.pkl`` per layer.
    layers : TDANN layers to give sheets (default: every layer of ``TDANN_LAYERS`` with a positions file).
    name : model name (default: from the checkpoint's folder and file name).
    readout_layer : layer a decoder reads (default ``"layer4.1"``, IT).
    areas : layer → area label overriding ``TDANN_AREAS`` for those layers.
    """
    checkpoint_path, positions_dir = Path(checkpoint_path), Path(positions_dir)
    if not positions_dir.is_dir():
        raise FileNotFoundError(f"positions folder not found: {positions_dir}")
    position_files = _position_files(positions_dir, layers)
    labels = {layer: TDANN_AREAS[layer] for layer in position_files}
    for layer, label in (areas or {}).items():
        if layer not in position_files:
            raise ConfigError(f"area given for layer {layer!r}, which is not loaded; loaded: {list(position_files)}")
        if not isinstance(label, str) or not label:
            raise ConfigError(f"area label of {layer!r} must be a non-empty string, got {label!r}")
        labels[layer] = label
    if len(set(labels.values())) != len(labels):
        raise ConfigError(f"area labels must differ between layers (a label names one layer), got {labels}")

    dims = _output_dims(list(position_files), TDANN_PREPROCESSING.size_px)
    sheets = {}
    for layer, path in position_files.items():
        sheet = CorticalSheet.load(path, expected_dims=dims[layer])
        sheets[layer] = CorticalSheet(layer, sheet.dims, sheet.coordinates_mm, sheet.neighborhood_indices,
                                      sheet.neighborhood_width_mm)
    network = build_network("tdann_resnet18")
    load_weights(network, read_vissl_trunk(checkpoint_path), source=checkpoint_path)
    metadata = {
        "source": "TDANN",
        "citation": TDANN_CITATION,
        "checkpoint": {"path": str(checkpoint_path), "sha256": sha256_of(checkpoint_path)},
        "positions": {layer: {"path": str(path), "sha256": sha256_of(path)} for layer, path in position_files.items()},
    }
    return TopographicModel(network, sheets, TDANN_PREPROCESSING, {"family": "tdann_resnet18", "kwargs": {}},
                            readout_layer=readout_layer, areas=labels,
                            name=name or f"TDANN {checkpoint_path.parent.name}/{checkpoint_path.name}",
                            metadata=metadata)


def _position_files(positions_dir: Path, layers) -> dict[str, Path]:
    if layers is None:
        wanted, required = TDANN_LAYERS, False
    else:
        wanted, required = ([layers] if isinstance(layers, str) else list(layers)), True
        unknown = [layer for layer in wanted if layer not in TDANN_LAYERS]
        if unknown or not wanted:
            raise ConfigError(f"layers must be TDANN layers from {TDANN_LAYERS}, got {wanted}")
    found = {}
    for layer in wanted:
        candidates = [positions_dir / f"{layer}{suffix}" for suffix in (".npz", ".pkl")]
        present = [path for path in candidates if path.is_file()]
        if len(present) == 2:
            raise ConfigError(f"both {present[0].name} and {present[1].name} are in {positions_dir}; keep one "
                              f"positions file per layer")
        if present:
            found[layer] = present[0]
        elif required:
            raise FileNotFoundError(f"no positions file for layer {layer}: looked for {candidates[0]} and "
                                    f"{candidates[1]}")
    if not found:
        raise FileNotFoundError(f"no TDANN positions files (<layer>.npz or <layer>.pkl for {TDANN_LAYERS}) in "
                                f"{positions_dir}")
    return found


def _output_dims(layers: list[str], size_px: int) -> dict[str, tuple[int, int, int]]:
    """Output dims (C, H, W) of ``layers`` of the TDANN network for a size_px × size_px RGB image,
    traced on torch's "meta" device (shapes only, no arithmetic)."""
    with torch.device("meta"):
        network = build_network("tdann_resnet18").eval()
    dims = {}
    for layer in layers:
        def record(module, inputs, output, layer=layer):
            dims[layer] = tuple(int(d) for d in output.shape[1:])
        network.get_submodule(layer).register_forward_hook(record)
    with torch.no_grad():
        network(torch.zeros(1, 3, size_px, size_px, device="meta"))
    return dims
