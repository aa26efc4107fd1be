"""A topographic IT on an ImageNet-trained trunk: stimsim's default model family ``topo_head``.

The network (stages as ``print(model)`` names them)::

    trunk   the base network's convolutional layers (ImageNet weights, frozen in training)
    pool    global average pooling → (B, C) features
    it      fully connected IT: Linear(C → it_rank) → Linear(it_rank → it_units) → ReLU
            (a low-rank product, so that tens of thousands of units fit in a small file); every unit
            has a position on the IT sheet, in any arrangement the training gives it. With
            ``it_grid_side`` the second product stores the weights of a coarser grid of the same sheet
            (the trained map) and gives each of the it_units = side² units their bilinear interpolation
            at its position (:class:`GridInterpolatedLinear`), so the file holds only the trained map
    head    ImageNet readout of IT: Linear(it_units → head_rank) → Linear(head_rank → 1000), trained to
            reproduce the base network's own outputs (distillation), so IT keeps its ImageNet function
    domain_head   a small linear readout of the localizer's category domains, used as a training signal

``forward`` returns the ImageNet logits. IT is fully connected (as in Blauch et al. 2022's ITN or
Lee et al. 2020's topographic layer), so its units can take any arrangement on the sheet.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from stimsim.models.base_networks import base_network_spec
from stimsim.utilities.errors import ConfigError

FAMILY = "topo_head"
N_IMAGENET_CLASSES = 1000


class GridInterpolatedLinear(nn.Module):
    """A linear layer onto a ``dense_side`` × ``dense_side`` grid of units whose weights and biases are the
    bilinear interpolation (:func:`_resample`) of those of a ``grid_side`` × ``grid_side`` grid on the same
    sheet; only the coarse grid's are parameters. Units are row-major, as :func:`grid_positions_mm`.

    Where no gradient reaches the parameters (inference, or an input-only gradient as in percept inversion),
    the dense weights are resampled once and kept until a parameter changes (in place or replaced), moves
    device or changes dtype; while the parameters are trained they are resampled at every call."""

    def __init__(self, in_features: int, grid_side: int, dense_side: int):
        super().__init__()
        self.in_features, self.grid_side, self.dense_side = in_features, grid_side, dense_side
        self.out_features = dense_side * dense_side
        coarse = nn.Linear(in_features, grid_side * grid_side)  # its initialisation
        self.weight = nn.Parameter(coarse.weight.detach().clone())
        self.bias = nn.Parameter(coarse.bias.detach().clone())
        self._dense: tuple | None = None  # (parameter state, dense weight, dense bias)

    def _parameter_state(self) -> tuple:
        # the parameters themselves are kept in the state, so that a replaced one is never mistaken for its
        # successor at the same address
        return tuple((p, p.data_ptr(), p._version, p.device, p.dtype) for p in (self.weight, self.bias))

    def _same_state(self, state: tuple) -> bool:
        return self._dense is not None and all(
            old[0] is new[0] and old[1:] == new[1:] for old, new in zip(self._dense[0], state))

    def dense_parameters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The dense (units, in_features) weights and (units,) biases that :meth:`forward` applies."""
        if torch.is_grad_enabled() and (self.weight.requires_grad or self.bias.requires_grad):
            self._dense = None
            return self._resampled()
        state = self._parameter_state()
        if not self._same_state(state):
            with torch.no_grad():
                self._dense = (state, *self._resampled())
        return self._dense[1], self._dense[2]

    def _resampled(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (_resample(self.weight, self.grid_side, self.dense_side),
                _resample(self.bias[:, None], self.grid_side, self.dense_side)[:, 0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, *self.dense_parameters())

    def __getstate__(self):
        # a copy or a pickle (e.g. a model sent to a worker process) leaves the kept dense weights behind
        return {**self.__dict__, "_dense": None}


class TopoHeadNet(nn.Module):
    """Base network trunk → pooled features → topographic IT → ImageNet head (see the module docstring).

    Parameters
    ----------
    base_network : a name of :data:`stimsim.models.base_networks.BASE_NETWORKS` (e.g. ``"mobilenet_v2"``).
    it_units : number of IT units (e.g. 50,176 = 224²).
    it_rank, head_rank : inner widths of the low-rank IT and ImageNet-head products.
    n_domains : outputs of the domain readout (0: none).
    it_grid_side : 0 (every IT unit has weights of its own), or the side of the coarser grid whose weights
        IT's units interpolate (:class:`GridInterpolatedLinear`; it_units must then be a square).
    """

    def __init__(self, base_network: str = "mobilenet_v2", it_units: int = 50176, it_rank: int = 128,
                 head_rank: int = 128, n_domains: int = 0, it_grid_side: int = 0):
        super().__init__()
        for key, value, low in (("it_units", it_units, 2), ("it_rank", it_rank, 1), ("head_rank", head_rank, 1),
                                ("n_domains", n_domains, 0), ("it_grid_side", it_grid_side, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{FAMILY}: {key} must be an integer >= {low}, got {value!r}")
        dense_side = math.isqrt(it_units)
        if it_grid_side and (dense_side * dense_side != it_units or not 2 <= it_grid_side <= dense_side):
            raise ConfigError(f"{FAMILY}: it_grid_side {it_grid_side} needs it_units to be a square of a side >= it_grid_side "
                              f"(and it_grid_side >= 2), got it_units {it_units}")
        spec = base_network_spec(base_network)
        self.base_network = base_network
        trunk, _ = spec.split(spec.build())
        self.trunk = trunk
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
        units = GridInterpolatedLinear(it_rank, it_grid_side, dense_side) if it_grid_side else nn.Linear(it_rank, it_units)
        self.it = nn.Sequential(nn.Linear(spec.feature_channels, it_rank, bias=False), units, nn.ReLU())
        self.head = nn.Sequential(nn.Linear(it_units, head_rank, bias=False), nn.Linear(head_rank, N_IMAGENET_CLASSES))
        self.domain_head = nn.Linear(it_units, n_domains) if n_domains else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.it(self.pool(self.trunk(x))))


def grid_positions_mm(side: int, sheet_size_mm: float) -> np.ndarray:
    """Cell centres (side², 2) of a side × side grid on a square sheet, row-major: unit ``row·side + col``
    sits at x = (col + ½)·pitch, y = (row + ½)·pitch, pitch = sheet_size_mm / side."""
    pitch = sheet_size_mm / side
    rows, cols = np.divmod(np.arange(side * side), side)
    return np.stack([(cols + 0.5) * pitch, (rows + 0.5) * pitch], axis=1)


def _resample(values: torch.Tensor, side: int, new_side: int) -> torch.Tensor:
    """Rows of ``values`` (side², K), one per grid cell, resampled bilinearly onto a new_side² grid of the same
    sheet (cell centres, as :func:`grid_positions_mm`)."""
    field = values.T.reshape(1, -1, side, side)
    dense = torch.nn.functional.interpolate(field, size=(new_side, new_side), mode="bilinear", align_corners=False)
    return dense.reshape(-1, new_side * new_side).T.contiguous()


def densify(network: TopoHeadNet, side: int, new_side: int, per_unit: bool = True) -> TopoHeadNet:
    """A network whose IT is ``network``'s side × side IT map resampled onto a finer new_side × new_side grid.

    Each new unit's input weights and bias are the bilinear interpolation of those of the trained units
    around its position, so its tuning is that of the map at that point (tuning varies smoothly below the
    trained grid's pitch): stored per unit (``per_unit``), or as the trained grid's own weights, which the
    network interpolates when it runs (``it_grid_side``; the same units, a much smaller file). The readouts'
    weights are resampled the same way and scaled by side² / new_side², so that a readout sums about as
    much activity as before.
    """
    if network.it[1].out_features != side * side:
        raise ConfigError(f"{FAMILY}: IT has {network.it[1].out_features} units, not a {side} x {side} grid")
    dense = TopoHeadNet(network.base_network, new_side * new_side, network.it[1].in_features,
                        network.head[0].out_features,
                        0 if network.domain_head is None else network.domain_head.out_features,
                        it_grid_side=0 if per_unit else side)
    share = (side / new_side) ** 2
    with torch.no_grad():
        dense.trunk.load_state_dict(network.trunk.state_dict())
        dense.it[0].weight.copy_(network.it[0].weight)
        if per_unit:
            dense.it[1].weight.copy_(_resample(network.it[1].weight, side, new_side))
            dense.it[1].bias.copy_(_resample(network.it[1].bias[:, None], side, new_side)[:, 0])
        else:
            dense.it[1].load_state_dict(network.it[1].state_dict())
        dense.head[0].weight.copy_(_resample(network.head[0].weight.T, side, new_side).T * share)
        dense.head[1].load_state_dict(network.head[1].state_dict())
        if network.domain_head is not None:
            dense.domain_head.weight.copy_(_resample(network.domain_head.weight.T, side, new_side).T * share)
            dense.domain_head.bias.copy_(network.domain_head.bias)
    return dense.eval()


def build_topo_head(**kwargs) -> nn.Module:
    """Builder of the ``topo_head`` architecture family (untrained; weights come from ``weights.pt``)."""
    try:
        return TopoHeadNet(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{FAMILY}: {exc}") from None
