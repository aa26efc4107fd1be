"""A topographic IT on an ImageNet-trained trunk: stimsim's default model family ``topo_head``.

The network (stages as ``print(model)`` names them)::

    trunk   the base network's convolutional layers (ImageNet weights, frozen in training)
    pool    global average pooling → (B, C) features
    it      fully connected IT: Linear(C → it_rank) → Linear(it_rank → it_units) → ReLU
            (a low-rank product, so that tens of thousands of units fit in a small file); every unit
            has a position on the IT sheet, in any arrangement the training gives it
    head    ImageNet readout of IT: Linear(it_units → head_rank) → Linear(head_rank → 1000), trained to
            reproduce the base network's own outputs (distillation), so IT keeps its ImageNet function
    domain_head   a small linear readout of the localizer's category domains, used as a training signal

``forward`` returns the ImageNet logits. IT is fully connected (as in Blauch et al. 2022's ITN or
Lee et al. 2020's topographic layer), so its units can take any arrangement on the sheet.
"""
from __future__ import annotations

import torch
from torch import nn

from stimsim.errors import ConfigError
from stimsim.models.base_networks import base_network_spec

FAMILY = "topo_head"
N_IMAGENET_CLASSES = 1000


class TopoHeadNet(nn.Module):
    """Base network trunk → pooled features → topographic IT → ImageNet head (see the module docstring).

    Parameters
    ----------
    base_network : a name of :data:`stimsim.models.base_networks.BASE_NETWORKS` (e.g. ``"mobilenet_v2"``).
    it_units : number of IT units (e.g. 50,176 = 224²).
    it_rank, head_rank : inner widths of the low-rank IT and ImageNet-head products.
    n_domains : outputs of the domain readout (0: none).
    """

    def __init__(self, base_network: str = "mobilenet_v2", it_units: int = 50176, it_rank: int = 128,
                 head_rank: int = 128, n_domains: int = 0):
        super().__init__()
        for key, value, low in (("it_units", it_units, 2), ("it_rank", it_rank, 1), ("head_rank", head_rank, 1),
                                ("n_domains", n_domains, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{FAMILY}: {key} must be an integer >= {low}, got {value!r}")
        spec = base_network_spec(base_network)
        self.base_network = base_network
        trunk, _ = spec.split(spec.build())
        self.trunk = trunk
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
        self.it = nn.Sequential(nn.Linear(spec.feature_channels, it_rank, bias=False), nn.Linear(it_rank, it_units),
                                nn.ReLU())
        self.head = nn.Sequential(nn.Linear(it_units, head_rank, bias=False), nn.Linear(head_rank, N_IMAGENET_CLASSES))
        self.domain_head = nn.Linear(it_units, n_domains) if n_domains else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.it(self.pool(self.trunk(x))))


def build_topo_head(**kwargs) -> nn.Module:
    """Builder of the ``topo_head`` architecture family (untrained; weights come from ``weights.pt``)."""
    try:
        return TopoHeadNet(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{FAMILY}: {exc}") from None
