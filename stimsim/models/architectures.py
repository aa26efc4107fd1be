"""Networks stimsim can build by name: architecture families as plug-ins.

A model directory names its network in ``model.json`` as ``{"family": ..., "kwargs": {...}}``;
:func:`build_network` builds it from :data:`MODEL_FAMILIES`. Built in: ``stimsim_topo`` (stimsim's own
small topographic network), ``tdann_resnet18`` (TDANN's backbone) and ``torchvision`` (any torchvision
classification network, ``kwargs = {"arch": "mobilenet_v2", ...}``). Other packages add their own
family through the entry point group ``stimsim.model_families`` (``name = package.module:builder``,
``builder(**kwargs)`` returning an untrained ``nn.Module``), so their saved model directories load in
any process; :func:`register_family` does the same from code. Networks are split into stages by
:mod:`stimsim.models.stages`.
"""
from __future__ import annotations

from numbers import Integral

from torch import nn

from stimsim.utilities.errors import ConfigError, StimsimError
from stimsim.utilities.plugins import Registry


def _check_builder(name: str, builder) -> None:
    """A family's builder is callable (what it builds is checked by :func:`build_network`)."""
    if not callable(builder):
        raise TypeError(f"architecture family {name!r} must be a builder (a callable returning an nn.Module), "
                        f"got {builder!r}")


#: Network builders by the family name a model directory uses.
MODEL_FAMILIES = Registry("architecture family", entry_point_group="stimsim.model_families", check=_check_builder)


def register_family(name: str, builder=None):
    """Register ``builder(**kwargs) -> nn.Module`` as architecture family ``name`` (or decorate it)."""
    return MODEL_FAMILIES.register(name, builder)


class StimsimTopoNet(nn.Sequential):
    """stimsim's small topographic network for grayscale images (default 32 px).

    Stages (dims at 32 px): ``v1`` (32,16,16) → ``v2`` (64,8,8) → ``v4`` (128,4,4) →
    ``pit`` (256,1,1) → ``it`` (it_units,1,1) → ``head`` (logits). ``it`` is a fully connected
    ReLU layer, so its units can take any arrangement on the IT sheet. ``it_batchnorm=False``
    replaces IT's batch normalisation by a bias: BatchNorm re-centres every unit on every batch, so
    about half of the units respond to any image (a dense code); without it IT can be sparse.
    """

    def __init__(self, n_classes: int = 12, it_units: int = 4096, in_channels: int = 1, it_batchnorm: bool = True):
        counts = (n_classes, it_units, in_channels)
        if any(isinstance(count, bool) or not isinstance(count, Integral) for count in counts) or not isinstance(
                it_batchnorm, bool) or n_classes < 2 or it_units < 1 or in_channels not in (1, 3):
            raise ConfigError("stimsim_topo needs integers n_classes >= 2, it_units >= 1 and in_channels 1 or 3, and "
                              f"it_batchnorm true or false; got n_classes = {n_classes!r}, it_units = {it_units!r}, "
                              f"in_channels = {in_channels!r}, it_batchnorm = {it_batchnorm!r}")

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
        it_layers = [nn.Linear(256, it_units, bias=False), nn.BatchNorm1d(it_units)] if it_batchnorm else [
            nn.Linear(256, it_units)]
        self.add_module("it", nn.Sequential(nn.Flatten(1), *it_layers, nn.ReLU(inplace=True)))
        self.add_module("head", nn.Linear(it_units, n_classes))


def build_network(family: str, **kwargs) -> nn.Module:
    """Build an (untrained) network of the registered ``family`` with keyword arguments ``kwargs``."""
    builder = MODEL_FAMILIES.get(family)
    try:
        network = builder(**kwargs)
    except (TypeError, StimsimError):  # TypeError: kwargs that do not fit (the caller names the file)
        raise
    except Exception as exc:  # a plug-in family's builder may raise anything
        raise ConfigError(f"architecture family {family!r} failed to build with kwargs {kwargs} "
                          f"({type(exc).__name__}: {exc})") from None
    if not isinstance(network, nn.Module):
        raise ConfigError(f"architecture family {family!r} built {type(network).__name__}, not a torch nn.Module")
    return network


@register_family("stimsim_topo")
def _stimsim_topo(**kwargs) -> nn.Module:
    return StimsimTopoNet(**kwargs)


@register_family("tdann_resnet18")
def _tdann_resnet18(**kwargs) -> nn.Module:
    import torchvision

    if kwargs:
        raise ConfigError(f"tdann_resnet18 takes no arguments, got {sorted(kwargs)}")
    net = torchvision.models.resnet18(weights=None)
    net.fc = nn.Identity()
    return net


@register_family("torchvision")
def _torchvision(arch=None, **kwargs) -> nn.Module:
    import torchvision

    if arch not in torchvision.models.list_models(module=torchvision.models):
        raise ConfigError(
            f"unknown torchvision architecture {arch!r}; choose one of torchvision.models.list_models()"
        )
    return torchvision.models.get_model(arch, weights=None, **kwargs)


@register_family("topo_head")
def _topo_head(**kwargs) -> nn.Module:
    from stimsim.models.topo_head import build_topo_head

    return build_topo_head(**kwargs)
