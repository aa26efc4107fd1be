"""ImageNet-trained base networks that stimsim's default models are built on.

A base network is an ImageNet classifier split into a convolutional ``trunk`` (image → feature map),
global average pooling and a ``classifier`` (pooled features → 1,000 ImageNet logits). Its weights are
the authors' original file, reached through a data manifest entry (sha256 checked), never downloaded
at import. :data:`BASE_NETWORKS` lists them by the name a model's ``base_network`` field uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from stimsim.errors import ConfigError


@dataclass(frozen=True)
class BaseNetworkSpec:
    """A base network: how to build it untrained, and where its ImageNet weights are.

    build : returns the untrained classifier (an ``nn.Module`` with ``trunk``/``classifier`` given by
        ``split``).
    split : network → (trunk, classifier); trunk maps (B, 3, H, W) to (B, C, h, w), classifier maps
        pooled (B, C) features to (B, 1000) logits.
    feature_channels : C, the trunk's output channels.
    manifest_entry, weights_file : the data manifest entry holding the weights, and the file in it.
    weights_sha256 : the weight file's sha256 (the manifest states it too).
    """

    name: str
    build: Callable[[], nn.Module]
    split: Callable[[nn.Module], tuple[nn.Module, nn.Module]]
    feature_channels: int
    manifest_entry: str
    weights_file: str
    weights_sha256: str
    citation: str


def _mobilenet_v2() -> nn.Module:
    import torchvision

    return torchvision.models.mobilenet_v2(weights=None)


def _split_mobilenet_v2(network: nn.Module) -> tuple[nn.Module, nn.Module]:
    return network.features, network.classifier


#: Base networks by name.
BASE_NETWORKS: dict[str, BaseNetworkSpec] = {
    "mobilenet_v2": BaseNetworkSpec(
        name="mobilenet_v2", build=_mobilenet_v2, split=_split_mobilenet_v2, feature_channels=1280,
        manifest_entry="mobilenet_v2_imagenet", weights_file="mobilenet_v2-b0353104.pth",
        weights_sha256="b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889",
        citation="Sandler, M., Howard, A., Zhu, M., Zhmoginov, A. & Chen, L.-C. (2018). MobileNetV2: inverted "
                 "residuals and linear bottlenecks. CVPR, 4510-4520; torchvision IMAGENET1K_V1 weights"),
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
    ``pretrained`` is False (then torchvision's default random initialisation)."""
    from stimsim.models.torchvision_builder import load_weights, read_checkpoint_file

    spec = base_network_spec(name)
    network = spec.build()
    if pretrained:
        path = base_weights_path(name, mirror=mirror)
        load_weights(network, read_checkpoint_file(path), source=path)
    return network.eval()


def imagenet_logits(trunk: nn.Module, classifier: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """ImageNet logits of a base network's parts for normalised input ``x`` (B, 3, H, W)."""
    return classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(trunk(x), 1), 1))
