"""Registration: the rigid pose of a recorded array on a model's IT sheet.

The pose (translation + rotation; scale optional) maximises the mean, over electrodes, of the Pearson
correlation across images between an electrode's recorded per-image response and the model's pooled
response at the electrode's mapped point (Mehrer et al. 2025: a virtual array slid and rotated over
the model sheet to maximise the mean site-wise correlation).

Pooled response at a sheet point p: the Gaussian-weighted mean of the IT units' activations,
weights exp(−d²/2σ²) for units within 3σ (σ = ``pooling_sigma_mm``). It is precomputed on a grid
of sheet points (``grid_spacing_mm``); every electrode's correlation with it becomes a map, and a pose
is scored by bilinear interpolation of the maps at the electrodes' mapped points — so all poses of a
coarse search (translations every ``coarse_step_mm``, rotations every ``coarse_step_deg``) are scored
at once. The best distinct coarse poses are refined with Nelder–Mead (scipy.optimize). Chance level:
the distribution of the score over the coarse search's poses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import xarray as xr
from scipy import optimize, sparse
from scipy.spatial import cKDTree

from stimsim.data.stimuli import StimulusSet
from stimsim.lab.arrays.anatomy import AnatomicalPose
from stimsim.lab.arrays.layout import ArrayLayout
from stimsim.lab.arrays.pose import ArrayPose, angle_difference_deg
from stimsim.mapping.predictivity import IT_AREA, aligned_features, checked_responses
from stimsim.utilities.errors import ConfigError, DataError

#: Fewest images whose responses a registration is fitted to.
MIN_REGISTRATION_IMAGES = 10


@dataclass(frozen=True)
class RegistrationSettings:
    """Parameters of the search (mm, deg)."""

    pooling_sigma_mm: float = 0.15
    grid_spacing_mm: float = 0.1
    coarse_step_mm: float = 0.2
    coarse_step_deg: float = 5.0
    n_refine: int = 8
    allow_scale: bool = False
    scale_bounds: tuple = (0.7, 1.4)

    def __post_init__(self):
        for key in ("pooling_sigma_mm", "grid_spacing_mm", "coarse_step_mm", "coarse_step_deg"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"registration: {key} must be > 0, got {getattr(self, key)}")
        if self.n_refine < 1:
            raise ConfigError(f"registration: n_refine must be >= 1, got {self.n_refine}")
        low, high = self.scale_bounds
        if not 0 < low <= 1 <= high:
            raise ConfigError(f"registration: scale_bounds must satisfy 0 < low <= 1 <= high, got {self.scale_bounds}")


class PooledSheet:
    """Pooled responses of a model's IT sheet at a grid of points, for a set of images."""

    def __init__(self, activations: np.ndarray, sheet, settings: RegistrationSettings):
        self.sheet = sheet
        self.settings = settings
        x0, x1, y0, y1 = sheet.extent_mm
        step = settings.grid_spacing_mm
        self.grid_x = np.arange(x0, x1 + step / 2, step)
        self.grid_y = np.arange(y0, y1 + step / 2, step)
        gx, gy = np.meshgrid(self.grid_x, self.grid_y)          # (ny, nx)
        points = np.column_stack([gx.ravel(), gy.ravel()])
        self.weights = pooling_weights(sheet.coordinates_mm, points, settings.pooling_sigma_mm)
        self.pooled = np.asarray(self.weights @ activations.T).T   # (N_images, ny*nx)
        self.pooled_squared = self.pooled ** 2
        self.activations = activations

    def correlation_maps(self, responses: np.ndarray, rows=None) -> np.ndarray:
        """(E, ny, nx) Pearson r across images (``rows`` of them, repeats allowed, as in a bootstrap;
        all if None) between every electrode's response (columns of ``responses``) and the pooled
        response at every grid point. Computed from weighted sums over the images, without copies of
        the pooled responses."""
        weights = (np.ones(len(responses)) if rows is None
                   else np.bincount(np.asarray(rows), minlength=len(responses)).astype(np.float64))
        total = weights.sum()
        centred = responses - weights @ responses / total
        z_recorded = centred / np.sqrt(weights @ centred ** 2 / total)
        covariance = (weights[:, None] * z_recorded).T @ self.pooled / total
        mean = weights @ self.pooled / total
        variance = np.maximum(weights @ self.pooled_squared / total - mean ** 2, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            maps = np.where(variance > 0, covariance / np.sqrt(variance), 0.0)
        return maps.reshape(len(maps), len(self.grid_y), len(self.grid_x))

    def pooled_at(self, points_mm: np.ndarray, rows=None) -> np.ndarray:
        """(N_images, N_points) pooled responses at arbitrary sheet points (exact, not interpolated)."""
        weights = pooling_weights(self.sheet.coordinates_mm, points_mm, self.settings.pooling_sigma_mm)
        activations = self.activations if rows is None else self.activations[rows]
        return np.asarray(weights @ activations.T).T


def pooling_weights(unit_xy: np.ndarray, points_xy: np.ndarray, sigma_mm: float) -> sparse.csr_matrix:
    """(N_points × N_units) sparse Gaussian weights (rows sum to 1) of units within 3σ of each point;
    a point with no unit within 3σ takes its nearest unit."""
    tree = cKDTree(unit_xy)
    neighbours = tree.query_ball_point(points_xy, r=3 * sigma_mm)
    rows, cols, values = [], [], []
    for i, units in enumerate(neighbours):
        if not units:
            units = [int(tree.query(points_xy[i])[1])]
        units = np.asarray(units)
        d2 = ((unit_xy[units] - points_xy[i]) ** 2).sum(1)
        w = np.exp(-d2 / (2 * sigma_mm ** 2))
        rows.extend([i] * len(units))
        cols.extend(units.tolist())
        values.extend((w / w.sum()).tolist())
    return sparse.csr_matrix((values, (rows, cols)), shape=(len(points_xy), len(unit_xy)))


@dataclass
class Registration:
    """A fitted pose of ``layout`` on the model's IT sheet, with per-electrode fit quality."""

    pose: ArrayPose
    layout: ArrayLayout
    electrode_correlation: xr.DataArray
    mean_correlation: float
    chance_mean_correlation_median: float
    chance_mean_correlation_p95: float
    model: str
    settings: RegistrationSettings
    noise_ceiled_correlation: xr.DataArray | None = None
    extra: dict = field(default_factory=dict)

    def electrode_sites_mm(self) -> dict:
        """Electrode id → mapped point on the model's IT sheet, in the sheet's frame (cortex mm for a model in cortex
        mm, :meth:`~stimsim.models.topographic.TopographicModel.in_cortex_mm`)."""
        sites = self.layout.on_sheet(self.pose)
        return {i: (float(x), float(y)) for i, (x, y) in zip(self.layout.electrode_ids, sites)}

    def site_table(self, anatomical: AnatomicalPose | None = None) -> pd.DataFrame:
        """Back-mapping, one row per electrode: electrode_id, array_x_mm, array_y_mm, sheet_x_mm, sheet_y_mm (the
        mapped point in the registered sheet's frame, as :meth:`electrode_sites_mm`), r, (noise_ceiled_r), and ap_mm,
        ml_mm when the implant's anatomical pose is given."""
        sites = self.layout.on_sheet(self.pose)
        table = pd.DataFrame({"electrode_id": list(self.layout.electrode_ids),
                              "array_x_mm": self.layout.positions_mm[:, 0], "array_y_mm": self.layout.positions_mm[:, 1],
                              "sheet_x_mm": sites[:, 0], "sheet_y_mm": sites[:, 1],
                              "r": self.electrode_correlation.sel(electrode=list(self.layout.electrode_ids)).values})
        if self.noise_ceiled_correlation is not None:
            table["noise_ceiled_r"] = self.noise_ceiled_correlation.sel(
                electrode=list(self.layout.electrode_ids)).values
        if anatomical is not None:
            coords = anatomical.to_anatomical(self.layout, self.layout.positions_mm)
            table["ap_mm"], table["ml_mm"] = coords[:, 0], coords[:, 1]
        return table

    def back_map(self, sheet_points_mm, anatomical: AnatomicalPose | None = None) -> pd.DataFrame:
        """Points on the registered sheet (its frame, as :meth:`electrode_sites_mm`) → the nearest mapped electrode:
        sheet_x_mm, sheet_y_mm, electrode_id, distance_mm (from the point to that electrode's mapped point),
        array_x_mm, array_y_mm (and ap_mm, ml_mm)."""
        points = np.asarray(sheet_points_mm, dtype=np.float64)
        if points.ndim == 0 or points.shape[-1] != 2 or not np.all(np.isfinite(points)):
            raise ConfigError(f"back_map takes finite (x, y) points in mm, shape (2,) or (n, 2); got shape "
                              f"{points.shape}" + ("" if np.all(np.isfinite(points)) else " with NaN or infinity"))
        points = points.reshape(-1, 2)
        sites = self.layout.on_sheet(self.pose)
        distance, nearest = cKDTree(sites).query(points)
        table = pd.DataFrame({"sheet_x_mm": points[:, 0], "sheet_y_mm": points[:, 1],
                              "electrode_id": [self.layout.electrode_ids[i] for i in nearest],
                              "distance_mm": distance,
                              "array_x_mm": self.layout.positions_mm[nearest, 0],
                              "array_y_mm": self.layout.positions_mm[nearest, 1]})
        if anatomical is not None:
            coords = anatomical.to_anatomical(self.layout, self.layout.positions_mm[nearest])
            table["ap_mm"], table["ml_mm"] = coords[:, 0], coords[:, 1]
        return table

    def to_dict(self) -> dict:
        out = {"model": self.model, "pose": self.pose.to_dict(), "array": self.layout.name,
               "mean_correlation": self.mean_correlation,
               "chance_mean_correlation_median": self.chance_mean_correlation_median,
               "chance_mean_correlation_p95": self.chance_mean_correlation_p95,
               "electrode_correlation": {str(k): float(v) for k, v in
                                         zip(self.electrode_correlation.electrode.values,
                                             self.electrode_correlation.values)},
               "electrode_sites_mm": self.electrode_sites_mm(),
               "settings": {k: (list(v) if isinstance(v, tuple) else v)
                            for k, v in self.settings.__dict__.items()}}
        if self.noise_ceiled_correlation is not None:
            out["noise_ceiled_correlation"] = {str(k): float(v) for k, v in
                                               zip(self.noise_ceiled_correlation.electrode.values,
                                                   self.noise_ceiled_correlation.values)}
        out.update(self.extra)
        return out


class RegistrationProblem:
    """Recorded per-image responses of an array and a model's pooled IT sheet for the same images."""

    def __init__(self, per_image_responses: xr.DataArray, model, images: StimulusSet, layout: ArrayLayout,
                 settings: RegistrationSettings | None = None, electrodes=None, source: str = "recordings"):
        self.settings = settings or RegistrationSettings()
        self.model = model
        per_image = checked_responses(per_image_responses, source, electrodes=())  # values: those fitted, below
        recorded_ids = [str(e) for e in per_image["electrode"].values]
        unknown = [e for e in recorded_ids if e not in layout.electrode_ids]
        if unknown:
            raise DataError(f"{source}: electrode: {len(unknown)} recorded electrode(s) are not in the array layout "
                            f"{layout.name!r}: {', '.join(unknown[:8])}{' …' if len(unknown) > 8 else ''}")
        if electrodes is not None:
            electrodes = [str(e) for e in electrodes]
            missing = [e for e in electrodes if e not in recorded_ids]
            if missing:
                raise DataError(f"{source}: electrode: electrode(s) {missing[:8]} chosen for registration were "
                                "not recorded")
        else:
            electrodes = recorded_ids
        if len(electrodes) < 3:
            raise DataError(f"{source}: registration needs at least 3 electrodes, got {len(electrodes)}")
        if per_image.sizes["stimulus_id"] < MIN_REGISTRATION_IMAGES:
            raise DataError(f"{source}: registration needs responses to at least {MIN_REGISTRATION_IMAGES} images, got "
                            f"{per_image.sizes['stimulus_id']}")
        self.layout = layout.subset(electrodes)
        checked_responses(per_image, source, electrodes)
        self.responses = per_image.sel(electrode=list(electrodes)).values.astype(np.float64)
        flat = np.flatnonzero(self.responses.std(0) == 0)
        if len(flat):
            raise DataError(f"{source}: electrode(s) {[electrodes[i] for i in flat]} respond identically to every "
                            "image; leave them out of the registration")
        self.sheet = model.sheet(IT_AREA)
        activations = aligned_features(per_image, model, images, source)
        self.pooled = PooledSheet(activations, self.sheet, self.settings)
        self._check_fits()

    def _check_fits(self):
        x0, x1, y0, y1 = self.sheet.extent_mm
        size = np.array([x1 - x0, y1 - y0])
        for angle in np.arange(0.0, 90.0, 1.0):
            rotated = ArrayPose(0, 0, angle).apply(self.layout.positions_mm)
            if np.all(rotated.max(0) - rotated.min(0) <= size):
                return
        raise ConfigError(f"array {self.layout.name!r} ({2 * self.layout.radius_mm:.2f} mm across) does not fit on "
                          f"the IT sheet of model {self.model.name!r} (extent x {x0:.2f}–{x1:.2f}, y {y0:.2f}–{y1:.2f} "
                          "mm) at any pose")

    # --- scoring --------------------------------------------------------------------------
    def _score(self, maps: np.ndarray, poses: np.ndarray, chunk: int = 8192) -> np.ndarray:
        """Mean interpolated correlation for poses (P, 4) = (x, y, rotation_deg, scale); −inf where
        an electrode falls off the grid. Bilinear interpolation, ``chunk`` poses at a time."""
        n_electrodes, ny, nx = maps.shape
        flat = maps.ravel()
        step = self.settings.grid_spacing_mm
        px, py = self.layout.positions_mm[:, 0], self.layout.positions_mm[:, 1]
        offsets = np.arange(n_electrodes) * ny * nx
        scores = np.empty(len(poses))
        for begin in range(0, len(poses), chunk):
            block = poses[begin:begin + chunk]
            theta = np.radians(block[:, 2])
            c, s, k = np.cos(theta)[:, None], np.sin(theta)[:, None], block[:, 3:4]
            col = (block[:, :1] + k * (c * px - s * py) - self.pooled.grid_x[0]) / step     # (P, E)
            row = (block[:, 1:2] + k * (s * px + c * py) - self.pooled.grid_y[0]) / step
            inside = np.all((col >= 0) & (col <= nx - 1) & (row >= 0) & (row <= ny - 1), axis=1)
            c0 = np.clip(np.floor(col).astype(np.int64), 0, nx - 2)
            r0 = np.clip(np.floor(row).astype(np.int64), 0, ny - 2)
            fc, fr = col - c0, row - r0
            base = offsets + r0 * nx + c0
            values = ((flat[base] * (1 - fc) + flat[base + 1] * fc) * (1 - fr)
                      + (flat[base + nx] * (1 - fc) + flat[base + nx + 1] * fc) * fr)
            scores[begin:begin + chunk] = np.where(inside, values.mean(1), -np.inf)
        return scores

    def _coarse_poses(self) -> np.ndarray:
        x0, x1, y0, y1 = self.sheet.extent_mm
        poses = []
        for angle in np.arange(0.0, 360.0, self.settings.coarse_step_deg):
            rotated = ArrayPose(0, 0, angle).apply(self.layout.positions_mm)
            low = np.array([x0, y0]) - rotated.min(0)
            high = np.array([x1, y1]) - rotated.max(0)
            if np.any(high < low):
                continue
            xs = _span(low[0], high[0], self.settings.coarse_step_mm)
            ys = _span(low[1], high[1], self.settings.coarse_step_mm)
            gx, gy = np.meshgrid(xs, ys)
            block = np.column_stack([gx.ravel(), gy.ravel(), np.full(gx.size, angle), np.ones(gx.size)])
            poses.append(block)
        return np.concatenate(poses)

    def fit(self, rows=None) -> tuple[ArrayPose, float, np.ndarray]:
        """Best pose for the images ``rows`` (all if None): (pose, mean correlation, coarse scores)."""
        maps = self.pooled.correlation_maps(self.responses, rows)
        coarse = self._coarse_poses()
        scores = self._score(maps, coarse)
        starts = _distinct_best(coarse, scores, self.settings.n_refine, self.settings.coarse_step_mm * 3,
                                self.settings.coarse_step_deg * 3)
        low, high = self.settings.scale_bounds

        def negative(params):
            scale = math.exp(params[3]) if self.settings.allow_scale else 1.0
            if not low <= scale <= high:
                return np.inf
            return -self._score(maps, np.array([[params[0], params[1], params[2], scale]]))[0]

        best, best_value = None, -np.inf
        for start in starts:
            initial = np.array([start[0], start[1], start[2], 0.0])
            simplex = np.array([initial, initial + [self.settings.coarse_step_mm, 0, 0, 0],
                                initial + [0, self.settings.coarse_step_mm, 0, 0],
                                initial + [0, 0, self.settings.coarse_step_deg, 0],
                                initial + [0, 0, 0, 0.05]])
            dims = 4 if self.settings.allow_scale else 3
            result = optimize.minimize(lambda p: negative(np.append(p, 0.0) if dims == 3 else p), initial[:dims],
                                       method="Nelder-Mead",
                                       options={"initial_simplex": simplex[:dims + 1, :dims], "xatol": 1e-3,
                                                "fatol": 1e-6, "maxiter": 2000})
            if -result.fun > best_value:
                best_value, best = -result.fun, result.x
        scale = math.exp(best[3]) if self.settings.allow_scale else 1.0
        pose = ArrayPose(float(best[0]), float(best[1]), float(best[2] % 360.0), scale)
        return pose, float(best_value), scores[np.isfinite(scores)]

    def electrode_correlations(self, pose: ArrayPose, rows=None) -> np.ndarray:
        """Exact Pearson r per electrode between recorded and pooled responses at the mapped points."""
        pooled = self.pooled.pooled_at(self.layout.on_sheet(pose), rows)
        recorded = self.responses if rows is None else self.responses[rows]
        return (_zscore(recorded) * _zscore(pooled)).mean(0)


def register(per_image_responses: xr.DataArray, model, images: StimulusSet, layout: ArrayLayout, seed: int = 0,
             allow_scale: bool = False, electrodes=None, reliability: xr.DataArray | None = None,
             settings: RegistrationSettings | None = None, source: str = "recordings",
             problem: RegistrationProblem | None = None) -> Registration:
    """Fit the pose of ``layout`` on ``model``'s IT sheet (see the module docstring).

    Parameters
    ----------
    per_image_responses : (stimulus_id × electrode) mean responses; ``images`` holds those stimuli.
    electrodes : ids used for the fit (e.g. the reliable, working ones); all recorded if None. Every
        layout electrode still gets its mapped point and correlation.
    reliability : per-electrode split-half reliability; gives ``noise_ceiled_correlation`` = r / √rel.
    seed : kept for the record (the search is deterministic).
    problem : a prepared :class:`RegistrationProblem` (its settings apply), to reuse its pooled sheet.
    """
    if problem is None:
        settings = settings or RegistrationSettings(allow_scale=allow_scale)
        if allow_scale and not settings.allow_scale:
            settings = replace(settings, allow_scale=True)
        problem = RegistrationProblem(per_image_responses, model, images, layout, settings, electrodes, source)
    settings = problem.settings
    pose, best, coarse_scores = problem.fit()
    recorded_ids = [str(e) for e in per_image_responses["electrode"].values]
    full = layout.subset([e for e in layout.electrode_ids if e in recorded_ids])
    per_image = per_image_responses.transpose("stimulus_id", "electrode").sel(electrode=list(full.electrode_ids))
    pooled = problem.pooled.pooled_at(full.on_sheet(pose))
    r = (_zscore(per_image.values.astype(np.float64)) * _zscore(pooled)).mean(0)
    correlation = xr.DataArray(r, dims="electrode", coords={"electrode": list(full.electrode_ids)},
                               name="electrode_correlation")
    ceiled = None
    if reliability is not None:
        rel = reliability.sel(electrode=list(full.electrode_ids)).values
        with np.errstate(invalid="ignore", divide="ignore"):
            ceiled = correlation.copy(data=np.where(rel > 0, r / np.sqrt(np.clip(rel, 1e-12, None)), np.nan))
        ceiled.name = "noise_ceiled_correlation"
    return Registration(pose=pose, layout=full, electrode_correlation=correlation, mean_correlation=best,
                        chance_mean_correlation_median=float(np.median(coarse_scores)),
                        chance_mean_correlation_p95=float(np.percentile(coarse_scores, 95)),
                        model=model.name, settings=settings, noise_ceiled_correlation=ceiled,
                        extra={"seed": seed, "n_images": int(per_image.sizes["stimulus_id"]),
                               "electrodes_used": list(problem.layout.electrode_ids)})


@dataclass
class BootstrapRegistration:
    """Stability of a registration over bootstrap resamples of the images."""

    poses: list
    reference: ArrayPose
    electrode_consistency: xr.DataArray
    consistency_radius_mm: float

    @property
    def sd_x_mm(self) -> float:
        return float(np.std([p.x_mm for p in self.poses], ddof=1))

    @property
    def sd_y_mm(self) -> float:
        return float(np.std([p.y_mm for p in self.poses], ddof=1))

    @property
    def sd_rotation_deg(self) -> float:
        """Circular spread: SD of the signed differences from the reference rotation, deg."""
        diffs = [(p.rotation_deg - self.reference.rotation_deg + 180.0) % 360.0 - 180.0 for p in self.poses]
        return float(np.std(diffs, ddof=1))

    @property
    def max_rotation_difference_deg(self) -> float:
        return max(angle_difference_deg(p.rotation_deg, self.reference.rotation_deg) for p in self.poses)

    def to_dict(self) -> dict:
        return {"n_boot": len(self.poses), "sd_x_mm": self.sd_x_mm, "sd_y_mm": self.sd_y_mm,
                "sd_rotation_deg": self.sd_rotation_deg, "consistency_radius_mm": self.consistency_radius_mm,
                "poses": [p.to_dict() for p in self.poses],
                "electrode_consistency": {str(k): float(v) for k, v in zip(self.electrode_consistency.electrode.values,
                                                                           self.electrode_consistency.values)}}


def bootstrap_registration(per_image_responses: xr.DataArray, model, images: StimulusSet, layout: ArrayLayout,
                           n_boot: int = 20, seed: int = 0, reference: Registration | None = None,
                           consistency_radius_mm: float = 0.2, electrodes=None,
                           settings: RegistrationSettings | None = None, source: str = "recordings",
                           problem: RegistrationProblem | None = None, progress: bool = False) -> BootstrapRegistration:
    """Refit the pose on ``n_boot`` resamples of the images (with replacement). Per electrode, the
    fraction of refits that map it within ``consistency_radius_mm`` of the reference registration's
    point (the full-data fit unless ``reference`` is given)."""
    from tqdm import tqdm

    if n_boot < 2:
        raise ConfigError(f"n_boot must be >= 2, got {n_boot}")
    problem = problem or RegistrationProblem(per_image_responses, model, images, layout, settings, electrodes, source)
    reference_pose = reference.pose if reference is not None else problem.fit()[0]
    rng = np.random.default_rng([seed, 0xB007])
    n_images = len(problem.responses)
    poses = []
    for _ in tqdm(range(n_boot), desc="registration bootstrap", disable=not progress):
        rows = rng.integers(0, n_images, n_images)
        poses.append(problem.fit(rows)[0])
    reference_sites = layout.on_sheet(reference_pose)
    hits = np.mean([np.linalg.norm(layout.on_sheet(p) - reference_sites, axis=1) <= consistency_radius_mm
                    for p in poses], axis=0)
    consistency = xr.DataArray(hits, dims="electrode", coords={"electrode": list(layout.electrode_ids)},
                               name="electrode_consistency")
    return BootstrapRegistration(poses, reference_pose, consistency, consistency_radius_mm)


def _zscore(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    centred = values - values.mean(0)
    scale = centred.std(0)
    scale[scale == 0] = np.inf
    return centred / scale


def _span(low: float, high: float, step: float) -> np.ndarray:
    """Points from low to high (inclusive) about ``step`` apart, centred in the interval."""
    n = int(math.floor((high - low) / step)) + 1
    offset = (high - low - (n - 1) * step) / 2
    return low + offset + step * np.arange(n)


def _distinct_best(poses: np.ndarray, scores: np.ndarray, n: int, min_mm: float, min_deg: float) -> list:
    """The ``n`` best poses, each at least min_mm or min_deg away from every better one kept."""
    order = np.argsort(-scores)
    kept = []
    for index in order:
        if not np.isfinite(scores[index]):
            break
        pose = poses[index]
        if all(math.hypot(pose[0] - k[0], pose[1] - k[1]) >= min_mm
               or angle_difference_deg(pose[2], k[2]) >= min_deg for k in kept):
            kept.append(pose)
        if len(kept) == n:
            break
    return kept
