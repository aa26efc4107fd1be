"""Assigning unit positions (mm) to a layer: TDANN-style retinotopic initialisation.

Margalit et al. 2024 (Neuron), "A unifying framework for functional organization in early and
higher ventral visual cortex": each spatial location (h, w) of a (C, H, W) layer owns a square
patch of the sheet, its C channels are scattered inside that patch (patches overlap), then
jittered. A layer with H = W = 1 (e.g. a fully connected layer) spreads its channels over the
whole sheet.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from stimsim.cortex.sheet import CorticalSheet
from stimsim.utilities.errors import ConfigError


def retinotopic_positions(dims, sheet_size_mm: float, overlap: float = 0.5, jitter: float = 0.3,
                          seed: int = 0) -> np.ndarray:
    """Positions (N, 2) in mm for a layer of ``dims`` (C, H, W) on a square sheet of side ``sheet_size_mm``.

    Inside each patch the C channels take the sites of a near-square lattice in random order;
    ``overlap`` widens every patch by that fraction of its side (neighbouring patches overlap),
    ``jitter`` moves each unit by up to that fraction of the lattice spacing. The widened layout is
    then scaled back linearly onto [0, sheet_size_mm]² (no clipping, so no units pile up at the
    borders). Row i is unit i of the (C, H, W) output flattened in C-major order.
    """
    if isinstance(dims, (str, bytes)) or not hasattr(dims, "__len__") or len(dims) != 3 or any(
            isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1 for d in dims):
        raise ConfigError(f"dims must be a layer's (C, H, W), three integers >= 1, got {dims!r}")
    channels, height, width = (int(d) for d in dims)
    if isinstance(sheet_size_mm, bool) or not isinstance(sheet_size_mm, numbers.Real) or not (
            math.isfinite(sheet_size_mm) and sheet_size_mm > 0):
        raise ConfigError(f"sheet_size_mm must be a finite number of mm > 0, got {sheet_size_mm!r}")
    if not 0 <= overlap <= 2:
        raise ConfigError(f"overlap must be in [0, 2] (fraction of a patch side), got {overlap}")
    if not 0 <= jitter <= 1:
        raise ConfigError(f"jitter must be in [0, 1] (fraction of the lattice spacing), got {jitter}")
    rng = np.random.default_rng(seed)
    patch_x_mm, patch_y_mm = sheet_size_mm / width, sheet_size_mm / height
    side = math.ceil(math.sqrt(channels))
    lattice = (np.stack(np.meshgrid(np.arange(side), np.arange(side), indexing="xy"), -1).reshape(-1, 2) + 0.5) / side
    coords = np.empty((channels, height, width, 2))
    for h in range(height):
        for w in range(width):
            sites = lattice[rng.permutation(len(lattice))[:channels]]
            sites = sites + rng.uniform(-jitter / (2 * side), jitter / (2 * side), size=sites.shape)
            spread_x, spread_y = patch_x_mm * (1 + overlap), patch_y_mm * (1 + overlap)
            centre = ((w + 0.5) * patch_x_mm, (h + 0.5) * patch_y_mm)
            coords[:, h, w, 0] = centre[0] + (sites[:, 0] - 0.5) * spread_x
            coords[:, h, w, 1] = centre[1] + (sites[:, 1] - 0.5) * spread_y
    coords = coords.reshape(-1, 2)
    margin = np.array([patch_x_mm, patch_y_mm]) * (overlap + jitter / side) / 2
    return (coords + margin) * sheet_size_mm / (sheet_size_mm + 2 * margin)


def build_sheet(name: str, dims, sheet_size_mm: float, neighborhood_width_mm: float,
                n_neighborhoods: int = 256, max_neighborhood_units: int = 500, overlap: float = 0.5,
                jitter: float = 0.3, seed: int = 0) -> CorticalSheet:
    """A retinotopically initialised sheet with precomputed spatial-loss neighbourhoods."""
    if isinstance(neighborhood_width_mm, bool) or not isinstance(neighborhood_width_mm, numbers.Real) or not (
            0 < neighborhood_width_mm <= sheet_size_mm):
        raise ConfigError(
            f"sheet {name!r}: neighborhood_width_mm must be in (0, sheet_size_mm={sheet_size_mm}], "
            f"got {neighborhood_width_mm}"
        )
    coords = retinotopic_positions(dims, sheet_size_mm, overlap=overlap, jitter=jitter, seed=seed)
    sheet = CorticalSheet(name, tuple(dims), coords)
    return sheet.with_neighborhoods(neighborhood_width_mm, n_neighborhoods, max_neighborhood_units, seed=seed + 1)
