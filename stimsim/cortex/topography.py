"""Spatial organisation of a property over a cortical sheet: clustering statistics and maps.

The clustering statistic is Moran's I (Moran 1950) of a per-unit value (e.g. face d′) with binary
weights w_ij = 1 for distinct units closer than ``radius_mm``; its null distribution comes from
shuffling the unit positions (equivalently, permuting the values over the fixed positions).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import sparse
from scipy.spatial import cKDTree

from stimsim.cortex.sheet import CorticalSheet
from stimsim.utilities.figures import pyplot, save_figure
from stimsim.utilities.limits import check_memory

#: Position shuffles evaluated together (one sparse product each batch).
_SHUFFLE_BATCH = 100


@dataclass(frozen=True)
class ClusteringTest:
    """Moran's I of a map and its position-shuffle null (n_shuffles draws)."""
    morans_i: float
    null_mean: float
    null_sd: float
    p_value: float
    n_shuffles: int
    radius_mm: float

    def to_dict(self) -> dict:
        return asdict(self)


def _positive_mm(name: str, value) -> float:
    """``value`` as a float, or ValueError: a length in mm must be a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of mm > 0, got {value!r}")
    return float(value)


def _check_sheet(sheet) -> None:
    if not isinstance(sheet, CorticalSheet):
        raise TypeError(f"sheet must be a CorticalSheet (e.g. model.sheet('IT')), got {type(sheet).__name__}")


def _values_at_units(values, coordinates_mm) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (N,) and ``coordinates_mm`` (N, 2) as float arrays, or ValueError naming the shapes or the number
    of values that are not finite (Moran's I of a map with a NaN unit is NaN)."""
    values, coordinates_mm = np.asarray(values, float), np.asarray(coordinates_mm, float)
    if coordinates_mm.ndim != 2 or coordinates_mm.shape[1] != 2 or values.shape != (len(coordinates_mm),):
        raise ValueError(f"values must hold one number per unit and coordinates_mm one (x, y) per unit: shapes (N,) "
                         f"and (N, 2), got {values.shape} and {coordinates_mm.shape}")
    not_finite = int(np.sum(~np.isfinite(values)))
    if not_finite:
        raise ValueError(f"Moran's I needs finite values for every unit; {not_finite} of {len(values)} are NaN or "
                         "infinite (leave those units out of values and coordinates_mm)")
    return values, coordinates_mm


def _neighbour_pairs(coordinates_mm: np.ndarray, radius_mm: float) -> np.ndarray:
    radius_mm = _positive_mm("radius_mm", radius_mm)
    pairs = cKDTree(coordinates_mm).query_pairs(radius_mm, output_type="ndarray")
    if len(pairs) == 0:
        raise ValueError(f"no two units lie within radius_mm = {radius_mm}; use a larger radius")
    return pairs


def nearest_pair_mm(coordinates_mm: np.ndarray) -> float:
    """The distance (mm) between the two closest of ``coordinates_mm`` (N ≥ 2, 2); inf for fewer than two."""
    coordinates_mm = np.asarray(coordinates_mm, float)
    if len(coordinates_mm) < 2:
        return math.inf
    return float(cKDTree(coordinates_mm).query(coordinates_mm, k=2)[0][:, 1].min())


def morans_i(values: np.ndarray, coordinates_mm: np.ndarray, radius_mm: float = 1.0) -> float:
    """Moran's I of ``values`` (N,) at ``coordinates_mm`` (N, 2): > 0 when nearby units are alike; NaN (undefined)
    when every value is the same."""
    values, coordinates_mm = _values_at_units(values, coordinates_mm)
    return _morans_i_from_pairs(values, _neighbour_pairs(coordinates_mm, radius_mm))


def _morans_i_from_pairs(values: np.ndarray, pairs: np.ndarray) -> float:
    z = values - values.mean()
    denominator = np.dot(z, z)
    if denominator == 0:
        return float("nan")
    # each unordered pair counts twice in the symmetric weight matrix
    return float(len(values) / (2 * len(pairs)) * 2 * np.sum(z[pairs[:, 0]] * z[pairs[:, 1]]) / denominator)


def clustering_test(values, coordinates_mm, radius_mm: float = 1.0, n_shuffles: int = 1000,
                    seed: int = 0) -> ClusteringTest:
    """Moran's I of ``values`` against ``n_shuffles`` shuffles of the unit positions.

    p = (1 + #{shuffles with I ≥ observed}) / (1 + n_shuffles), one-sided (clustering).
    """
    if n_shuffles < 1:
        raise ValueError(f"n_shuffles must be >= 1, got {n_shuffles}")
    values, coordinates_mm = _values_at_units(values, coordinates_mm)
    pairs = _neighbour_pairs(coordinates_mm, radius_mm)
    observed = _morans_i_from_pairs(values, pairs)
    rng = np.random.default_rng(seed)
    n = len(values)
    weights = sparse.coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n)).tocsr()
    z = values - values.mean()
    null = np.empty(n_shuffles)
    for start in range(0, n_shuffles, _SHUFFLE_BATCH):
        # z is centred, so every permutation of it is too: I = N / (2·pairs) · 2·Σ_pairs z_i z_j / zᵀz
        shuffled = np.stack([rng.permutation(z) for _ in range(min(_SHUFFLE_BATCH, n_shuffles - start))], axis=1)
        null[start:start + shuffled.shape[1]] = (
            n / len(pairs) * np.einsum("ik,ik->k", shuffled, weights @ shuffled) / np.dot(z, z))
    p_value = (1 + np.sum(null >= observed)) / (1 + n_shuffles)
    return ClusteringTest(observed, float(null.mean()), float(null.std()), float(p_value), n_shuffles, radius_mm)


#: Unit–point pairs held at once by :func:`smoothed_values_at` (three 8-byte numbers each, a few times over).
SMOOTHING_NEIGHBOURS_PER_CHUNK = 2_000_000


def smoothed_values_at(values, sheet: CorticalSheet, points_mm, sigma_mm: float = 0.5) -> np.ndarray:
    """Gaussian-weighted mean (σ = ``sigma_mm``) of a per-unit value around each point (M, 2) in mm, units whose
    value is NaN left out; NaN where no other unit lies within 3σ. Points are taken in chunks, so memory stays
    bounded on dense sheets (about :data:`SMOOTHING_NEIGHBOURS_PER_CHUNK` unit–point pairs at a time)."""
    _check_sheet(sheet)
    sigma_mm = _positive_mm("sigma_mm", sigma_mm)
    values = np.asarray(values, float)
    n_units = len(sheet.coordinates_mm)
    if values.shape != (n_units,):
        raise ValueError(f"values must hold one number per unit of the sheet, shape ({n_units},), got shape "
                         f"{values.shape}")
    if np.isnan(values).all():
        raise ValueError("every value is NaN: there is nothing to map")
    counted = ~np.isnan(values)
    values = np.where(counted, values, 0.0)
    points = np.asarray(points_mm, float).reshape(-1, 2)
    numerator, denominator = np.zeros(len(points)), np.zeros(len(points))
    units = cKDTree(sheet.coordinates_mm)
    per_point = sheet.density_per_mm2 * math.pi * (3 * sigma_mm) ** 2
    chunk = max(1, int(SMOOTHING_NEIGHBOURS_PER_CHUNK // max(per_point, 1.0)))
    for start in range(0, len(points), chunk):
        block = slice(start, start + chunk)
        pairs = cKDTree(points[block]).sparse_distance_matrix(units, 3 * sigma_mm, output_type="ndarray")
        weights = np.exp(-pairs["v"] ** 2 / (2 * sigma_mm ** 2)) * counted[pairs["j"]]
        size = len(points[block])
        numerator[block] = np.bincount(pairs["i"], weights * values[pairs["j"]], minlength=size)
        denominator[block] = np.bincount(pairs["i"], weights, minlength=size)
    result = np.full(len(points), np.nan)
    reached = denominator > 0
    result[reached] = numerator[reached] / denominator[reached]
    return result


#: Peak memory per grid point of :func:`sheet_grid` and the smoothed map on it, bytes: its (x, y) in the mesh and
#: the points (two 8-byte numbers, each a few times over) and the map's value and its sums.
GRID_BYTES_PER_POINT = 80


def sheet_grid(sheet: CorticalSheet, grid_step_mm: float = 0.1):
    """A regular grid over the sheet's extent: (x_mm, y_mm, points (len(y_mm) · len(x_mm), 2) in mm, rows by y)."""
    _check_sheet(sheet)
    grid_step_mm = _positive_mm("grid_step_mm", grid_step_mm)
    x0, x1, y0, y1 = sheet.extent_mm
    n_points = (math.floor((x1 - x0) / grid_step_mm) + 2) * (math.floor((y1 - y0) / grid_step_mm) + 2)
    check_memory(f"a grid of step grid_step_mm = {grid_step_mm:g} mm over a {x1 - x0:.3g} × {y1 - y0:.3g} mm sheet "
                 f"({n_points:.3g} points)", GRID_BYTES_PER_POINT * n_points,
                 "the number of points (a larger grid_step_mm)")
    xs = np.arange(x0, x1 + grid_step_mm / 2, grid_step_mm)
    ys = np.arange(y0, y1 + grid_step_mm / 2, grid_step_mm)
    return xs, ys, np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2)


def smoothed_map(values, sheet: CorticalSheet, sigma_mm: float = 0.5, grid_step_mm: float = 0.1):
    """Gaussian-smoothed map of a per-unit value on a regular grid: (x_mm, y_mm, map[y, x])."""
    xs, ys, grid = sheet_grid(sheet, grid_step_mm)
    return xs, ys, smoothed_values_at(values, sheet, grid, sigma_mm).reshape(len(ys), len(xs))


def peak_location_mm(values, sheet: CorticalSheet, sigma_mm: float = 0.5) -> tuple[float, float]:
    """Position (mm) of the maximum of the smoothed map: e.g. the centre of the face patch. A map whose units all
    have the same value has no maximum: ValueError."""
    counted = np.asarray(values, float)
    counted = counted[~np.isnan(counted)]
    if counted.size and np.all(counted == counted[0]):
        raise ValueError(f"every unit has the value {counted[0]:g}: the map is flat and has no peak")
    xs, ys, smooth = smoothed_map(values, sheet, sigma_mm)
    iy, ix = np.unravel_index(np.nanargmax(smooth), smooth.shape)
    return float(xs[ix]), float(ys[iy])


def selective_clusters_mm(values, sheet: CorticalSheet, threshold: float = 1.0, sigma_mm: float = 0.5,
                          grid_step_mm: float = 0.1, min_diameter_mm: float = 0.0) -> list[float]:
    """Sizes of the clusters of a per-unit value (e.g. face d′) on a sheet, largest first, in the sheet's mm.

    The value is Gaussian-smoothed onto a grid (σ = ``sigma_mm``, step ``grid_step_mm``, as
    :func:`smoothed_map`); a cluster is a 4-connected region of grid points above ``threshold``; its size is
    the diameter of the disc of the same area, 2·sqrt(area / π). Regions smaller than
    ``min_diameter_mm`` are dropped.
    """
    from scipy import ndimage

    _, _, smooth = smoothed_map(values, sheet, sigma_mm, grid_step_mm)
    labels, n = ndimage.label(np.nan_to_num(smooth, nan=-np.inf) > threshold)
    areas_mm2 = np.bincount(labels.ravel(), minlength=n + 1)[1:] * grid_step_mm ** 2
    diameters = sorted((float(2 * np.sqrt(a / np.pi)) for a in areas_mm2), reverse=True)
    return [d for d in diameters if d >= min_diameter_mm]


def plot_sheet_map(values, sheet: CorticalSheet, path, title: str, label: str = "face d′",
                   vmin: float = -2.0, vmax: float = 2.0, frame: str = "model"):
    """Scatter the units on the sheet coloured by ``values``; saved as PNG at ``path``. ``frame`` names the sheet's
    lengths on the axes: "model" mm, or "cortex" mm for a sheet at its model's cortex scale."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.6, 4))
    order = np.argsort(values)
    points = ax.scatter(sheet.coordinates_mm[order, 0], sheet.coordinates_mm[order, 1], c=np.asarray(values)[order],
                        s=max(2.0, 6000 / sheet.n_units), cmap="RdBu_r", vmin=vmin, vmax=vmax, linewidths=0)
    fig.colorbar(points, ax=ax, label=label)
    ax.set(xlabel=f"x ({frame} mm)", ylabel=f"y ({frame} mm)", title=title, aspect="equal")
    fig.tight_layout()
    save_figure(fig, path)
