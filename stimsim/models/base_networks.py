"""ImageNet-trained base networks that stimsim's default models are built on.

A base network is an ImageNet classifier split into a convolutional ``trunk`` (image → feature map),
global average pooling and a ``classifier`` (pooled features → 1,000 ImageNet logits). Its weights are
the authors' original file, reached through a data manifest entry (sha256 checked), never downloaded
at import. :data:`BASE_NETWORKS` lists them by the name a model's ``base_network`` field uses.

- ``mobilenet_v2``: torchvision's MobileNetV2 and its IMAGENET1K_V1 file; input normalised with the
  ImageNet mean and SD.
- ``efficientnet_lite0``: EfficientNet-Lite0 (Tan & Le 2019; Lite: no squeeze-excitation, ReLU6, stem
  and head not scaled) built by timm as ``tf_efficientnet_lite0``: TensorFlow's asymmetric 'same'
  padding and BatchNorm ε = 10⁻³, which the weights were trained with (timm's symmetric-padding
  ``efficientnet_lite0`` loses about 5 points of top-1 with them). The weight file uses the
  efficientnet-pytorch key names (``_conv_stem``, ``_blocks.N._depthwise_conv`` …), renamed to timm's
  on loading (:func:`efficientnet_keys_to_timm`). Input normalised as TensorFlow's EfficientNet-Lite
  does: (x·255 − 127)/128 on every channel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from stimsim.models.preprocessing import Preprocessing
from stimsim.utilities.errors import ConfigError


@dataclass(frozen=True)
class BaseNetworkSpec:
    """A base network: how to build it untrained, and where its ImageNet weights are.

    Attributes
    ----------
    name : the name :data:`BASE_NETWORKS` lists it under.
    build : returns the untrained classifier (an ``nn.Module`` with ``trunk``/``classifier`` given by
        ``split``).
    split : network → (trunk, classifier); trunk maps (B, 3, H, W) to (B, C, h, w), classifier maps
        pooled (B, C) features to (B, 1000) logits.
    feature_channels : C, the trunk's output channels.
    manifest_entry, weights_file : the data manifest entry holding the weights, and the file in it.
    weights_sha256 : the weight file's sha256 (the manifest states it too).
    citation : the paper and the weights' origin.
    preprocessing : the input the weights were trained with (size, normalisation).
    rename_keys : weight-file state dict → the built network's key names (None: the same names); a key
        it cannot place raises ``ValueError``.
    """

    name: str
    build: Callable[[], nn.Module]
    split: Callable[[nn.Module], tuple[nn.Module, nn.Module]]
    feature_channels: int
    manifest_entry: str
    weights_file: str
    weights_sha256: str
    citation: str
    preprocessing: Preprocessing = Preprocessing()
    rename_keys: Callable[[dict], dict] | None = None


def _mobilenet_v2() -> nn.Module:
    import torchvision

    return torchvision.models.mobilenet_v2(weights=None)


def _split_mobilenet_v2(network: nn.Module) -> tuple[nn.Module, nn.Module]:
    return network.features, network.classifier


def _efficientnet_lite0() -> nn.Module:
    import timm

    return timm.create_model("tf_efficientnet_lite0", pretrained=False)


def _split_timm_efficientnet(network: nn.Module) -> tuple[nn.Module, nn.Module]:
    trunk = nn.Sequential(network.conv_stem, network.bn1, network.blocks, network.conv_head, network.bn2)
    return trunk, network.classifier


#: EfficientNet-B0/Lite0 blocks per stage (Tan & Le 2019, table 1: stages 2-8).
_EFFICIENTNET_STAGE_BLOCKS = (1, 2, 2, 3, 3, 4, 1)
_EFFICIENTNET_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2",
                     "_fc": "classifier"}
#: Layers of a block without expansion (the first: depthwise → project) and of the inverted residuals.
_EFFICIENTNET_SEPARABLE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_EFFICIENTNET_INVERTED = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
                          "_project_conv": "conv_pwl", "_bn2": "bn3"}


def efficientnet_keys_to_timm(state_dict: dict) -> dict:
    """An EfficientNet-B0/Lite0 state dict with efficientnet-pytorch names (blocks numbered 0–15 in one
    list) renamed to timm's (``blocks.<stage>.<block>``); a key of neither form raises ``ValueError``."""
    stage_of = [(stage, index) for stage, n in enumerate(_EFFICIENTNET_STAGE_BLOCKS) for index in range(n)]
    renamed = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        try:
            if parts[0] == "_blocks":
                block = int(parts[1])
                layers = _EFFICIENTNET_SEPARABLE if stage_of[block] == (0, 0) else _EFFICIENTNET_INVERTED
                stage, index = stage_of[block]
                new = ["blocks", str(stage), str(index), layers[parts[2]], *parts[3:]]
            else:
                new = [_EFFICIENTNET_TOP[parts[0]], *parts[1:]]
        except (KeyError, IndexError, ValueError):
            raise ValueError(f"key {key!r} is not an efficientnet-pytorch name of EfficientNet-B0/Lite0") from None
        renamed[".".join(new)] = value
    return renamed


#: Base networks by name.
BASE_NETWORKS: dict[str, BaseNetworkSpec] = {
    "mobilenet_v2": BaseNetworkSpec(
        name="mobilenet_v2", build=_mobilenet_v2, split=_split_mobilenet_v2, feature_channels=1280,
        manifest_entry="mobilenet_v2_imagenet", weights_file="mobilenet_v2-b0353104.pth",
        weights_sha256="b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889",
        citation="Sandler, M., Howard, A., Zhu, M., Zhmoginov, A. & Chen, L.-C. (2018). MobileNetV2: inverted "
                 "residuals and linear bottlenecks. CVPR, 4510-4520; torchvision IMAGENET1K_V1 weights"),
    "efficientnet_lite0": BaseNetworkSpec(
        name="efficientnet_lite0", build=_efficientnet_lite0, split=_split_timm_efficientnet, feature_channels=1280,
        manifest_entry="efficientnet_lite0_imagenet", weights_file="efficientnet-lite0-57934424.pth",
        weights_sha256="579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
        citation="Tan, M. & Le, Q. V. (2019). EfficientNet: rethinking model scaling for convolutional neural "
                 "networks. ICML, 6105-6114; EfficientNet-Lite0 weights of the TensorFlow TPU models repository",
        preprocessing=Preprocessing(mean=(127 / 255,) * 3, std=(128 / 255,) * 3),
        rename_keys=efficientnet_keys_to_timm),
}


def base_network_spec(name: str) -> BaseNetworkSpec:
    """The :class:`BaseNetworkSpec` called ``name``; an unknown name is a ``ConfigError`` listing the known."""
    try:
        return BASE_NETWORKS[name]
    except KeyError:
        raise ConfigError(f"unknown base network {name!r}; known: {sorted(BASE_NETWORKS)}") from None


def base_weights_path(name: str, mirror=None):
    """Path of base network ``name``'s ImageNet weight file, fetched into the cache through its manifest
    entry if needed (sha256 verified)."""
    from stimsim.data.manifest import entry_path

    spec = base_network_spec(name)
    return entry_path(spec.manifest_entry, spec.weights_file, mirror=mirror)


def load_base_network(name: str, pretrained: bool = True, mirror=None) -> nn.Module:
    """Base network ``name`` as an ImageNet classifier in eval mode, with its ImageNet weights unless
    ``pretrained`` is False (then the architecture's default random initialisation)."""
    from stimsim.models.weights import load_weights, read_checkpoint_file
    from stimsim.utilities.errors import FileFormatError

    spec = base_network_spec(name)
    network = spec.build()
    if pretrained:
        path = base_weights_path(name, mirror=mirror)
        state_dict = read_checkpoint_file(path)
        if spec.rename_keys is not None:
            try:
                state_dict = spec.rename_keys(state_dict)
            except ValueError as exc:
                raise FileFormatError(path, f"not {name} weights: {exc}") from None
        load_weights(network, state_dict, source=path)
    return network.eval()


def imagenet_logits(trunk: nn.Module, classifier: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """ImageNet logits of a base network's parts for normalised input ``x`` (B, 3, H, W)."""
    return classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(trunk(x), 1), 1))
