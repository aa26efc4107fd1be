"""Networks stimsim can build by name, and their split into sequential stages.

A topographic model runs its network as an ordered list of named stages (output of one = input of
the next), so that a perturbation at one layer can be followed by the later stages alone.
"""
from __future__ import annotations

import torch
from torch import nn

from stimsim.errors import ConfigError

#: Families a model directory may name in ``architecture.family``.
FAMILIES = ("stimsim_topo", "torchvision", "tdann_resnet18")


class StimsimTopoNet(nn.Sequential):
    """stimsim's small topographic network for grayscale images (default 32 px).

    Stages (dims at 32 px): ``v1`` (32,16,16) → ``v2`` (64,8,8) → ``v4`` (128,4,4) →
    ``pit`` (256,1,1) → ``it`` (it_units,1,1) → ``head`` (logits). ``it`` is a fully connected
    ReLU layer, so its units can take any arrangement on the IT sheet.
    """

    def __init__(self, n_classes: int = 12, it_units: int = 4096, in_channels: int = 1):
        if n_classes < 2 or it_units < 1 or in_channels not in (1, 3):
            raise ConfigError("stimsim_topo needs n_classes >= 2, it_units >= 1 and in_channels 1 or 3")

        def conv_block(c_in, c_out):
            return nn.Sequential(
                nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            )

        super().__init__()
        self.add_module("v1", conv_block(in_channels, 32))
        self.add_module("v2", conv_block(32, 64))
        self.add_module("v4", conv_block(64, 128))
        self.add_module("pit", nn.Sequential(
            nn.Conv2d(128, 256, 3, padding=1, bias=False), nn.BatchNorm2d(256), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        ))
        self.add_module("it", nn.Sequential(
            nn.Flatten(1), nn.Linear(256, it_units, bias=False), nn.BatchNorm1d(it_units), nn.ReLU(inplace=True),
        ))
        self.add_module("head", nn.Linear(it_units, n_classes))


def build_network(family: str, **kwargs) -> nn.Module:
    """Build an (untrained) network of ``family`` with keyword arguments ``kwargs``."""
    if family == "stimsim_topo":
        return StimsimTopoNet(**kwargs)
    if family == "tdann_resnet18":
        import torchvision

        if kwargs:
            raise ConfigError(f"tdann_resnet18 takes no arguments, got {sorted(kwargs)}")
        net = torchvision.models.resnet18(weights=None)
        net.fc = nn.Identity()
        return net
    if family == "torchvision":
        import torchvision

        kwargs = dict(kwargs)
        arch = kwargs.pop("arch", None)
        if arch not in torchvision.models.list_models(module=torchvision.models):
            raise ConfigError(
                f"unknown torchvision architecture {arch!r}; choose one of torchvision.models.list_models()"
            )
        return torchvision.models.get_model(arch, weights=None, **kwargs)
    raise ConfigError(f"unknown architecture family {family!r}; choose one of {FAMILIES}")


def sequential_stages(network: nn.Module, example_input: torch.Tensor) -> list[tuple[str, nn.Module]]:
    """Split ``network`` into named stages that reproduce its forward pass in order.

    Top-level children are taken in registration order; a child that is an ``nn.Sequential``
    is opened one level (``layer4`` → ``layer4.0``, ``layer4.1``), except in stimsim's own net whose
    children already are the stages; a flatten is inserted before the first ``nn.Linear``. The
    split is checked against ``network(example_input)`` and refused if it differs.
    """
    stages: list[tuple[str, nn.Module]] = []
    open_sequentials = not isinstance(network, StimsimTopoNet)
    flattened = False
    for name, child in network.named_children():
        if open_sequentials and isinstance(child, nn.Sequential) and len(child) > 0:
            parts = [(f"{name}.{sub}", mod) for sub, mod in child.named_children()]
        else:
            parts = [(name, child)]
        for part_name, module in parts:
            if isinstance(module, nn.Linear) and not flattened:
                stages.append((f"{part_name}_flatten", nn.Flatten(1)))
            if isinstance(module, (nn.Linear, nn.Flatten)) or (
                isinstance(module, nn.Sequential) and any(isinstance(m, nn.Flatten) for m in module)
            ):
                flattened = True
            stages.append((part_name, module))
    was_training = network.training
    network.eval()
    with torch.no_grad():
        expected = network(example_input)
        x = example_input
        try:
            for _, module in stages:
                x = module(x)
        except RuntimeError:  # a child cannot take its predecessor's output: the forward does more
            x = None
        if x is not None and x.dim() > expected.dim() and x.flatten(1).shape == expected.shape:
            stages.append(("flatten", nn.Flatten(1)))
            x = x.flatten(1)
    network.train(was_training)
    if x is None or x.shape != expected.shape or not torch.allclose(x, expected, atol=1e-5, rtol=1e-4):
        raise ConfigError(
            f"{type(network).__name__} cannot be run as a sequence of its children "
            "(its forward does more than call them in order); stimsim supports sequential networks "
            "such as ResNet, VGG, AlexNet, MobileNet v3, EfficientNet, ConvNeXt and RegNet (not MobileNet v2, "
            "whose forward pools between its children)"
        )
    return stages
