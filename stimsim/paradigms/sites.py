"""Choosing stimulation sites on a cortical sheet from the selectivity of the units around them.

A site's selectivity is that of a multi-unit recording: the responses of the units within
``recording_radius_mm`` of the site are averaged per image, and d′ of that average is taken between
the localizer's preferred class and the rest (Afraz, Kiani & Esteky 2006 measured the face
selectivity of the multi-unit activity at each stimulation site). "Selective" means d′ above a
threshold (d′ > 1 for face-selective sites, as in Afraz et al. 2006).

Methods (see :mod:`stimsim.paradigms.experiment_file`): explicit positions; selectivity strata (n sites above
the threshold and n at or below it, drawn at random among candidate grid points); the face patch
(inside = peak of the smoothed unit-d′ map, outside = the least selective candidate far from it);
a regular grid.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import sparse
from scipy.spatial import cKDTree

from stimsim.behavior.metrics import dprime
from stimsim.cortex.sheet import CorticalSheet
from stimsim.cortex.topography import peak_location_mm, smoothed_values_at
from stimsim.paradigms.schema import SitesFile
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.figures import pyplot, save_figure
from stimsim.utilities.limits import check_memory

#: Label of the unperturbed condition of an experiment; site i is condition ``site_<iii>``.
CONTROL_LABEL = "control"
#: Bytes a grid point takes while the grid is laid out (its coordinates and their copies).
GRID_BYTES_PER_SITE = 64
#: Bytes each unit within a site's radius takes while the sites' multi-unit responses are formed (its index, as
#: the neighbour query returns it, and its entry in the averaging matrix).
NEIGHBOUR_BYTES = 64


@dataclass(frozen=True)
class Site:
    """One stimulation site: ``label`` (also its condition's label), position in sheet mm, ``group``
    (e.g. "selective", "other", "inside", "outside"), multi-unit ``dprime`` and the number of units
    within the recording radius."""

    label: str
    x_mm: float
    y_mm: float
    group: str
    dprime: float
    n_units: int

    @property
    def position_mm(self) -> tuple[float, float]:
        return (self.x_mm, self.y_mm)


@dataclass(frozen=True, eq=False)
class SiteSelection:
    """The chosen sites, with the map they were chosen on.

    Attributes
    ----------
    unit_dprime : (N,) d′ of every unit of the sheet (localizer preferred class vs the rest).
    peak_mm : peak of the unit-d′ map smoothed with ``smoothing_sigma_mm`` (the face-patch centre).
    """

    sites: tuple[Site, ...]
    method: str
    unit_dprime: np.ndarray
    peak_mm: tuple[float, float]
    recording_radius_mm: float
    smoothing_sigma_mm: float

    def distance_to_peak_mm(self) -> np.ndarray:
        """Distance (mm) of every site from the peak of the smoothed d′ map."""
        positions = np.array([s.position_mm for s in self.sites], dtype=np.float64).reshape(-1, 2)
        return np.linalg.norm(positions - np.asarray(self.peak_mm), axis=1)

    def to_records(self) -> list[dict]:
        """One JSON-friendly record per site, with its distance to the d′ peak."""
        return [{**asdict(site), "distance_to_peak_mm": float(d)}
                for site, d in zip(self.sites, self.distance_to_peak_mm())]


def unit_dprime(responses, is_positive) -> np.ndarray:
    """d′ of every unit: responses (n_images, N) of the preferred class (``is_positive``) vs the rest."""
    responses, is_positive = _check_responses(responses, is_positive)
    return dprime(responses[is_positive], responses[~is_positive])


def multi_unit_dprime(responses, is_positive, sheet: CorticalSheet, points_mm,
                      radius_mm: float) -> tuple[np.ndarray, np.ndarray]:
    """Multi-unit d′ at each point: d′ of the mean response of the units within ``radius_mm``.

    Returns (dprime (P,), n_units (P,)); d′ is NaN at points with no unit within the radius.
    """
    responses, is_positive = _check_responses(responses, is_positive)
    if responses.shape[1] != sheet.n_units:
        raise ValueError(f"responses have {responses.shape[1]} units, sheet {sheet.name!r} has {sheet.n_units}")
    if not radius_mm > 0:
        raise ConfigError(f"recording_radius_mm must be > 0 mm, got {radius_mm}")
    points = np.asarray(points_mm, dtype=np.float64).reshape(-1, 2)
    units_per_site = sheet.density_per_mm2 * np.pi * radius_mm ** 2
    check_memory(f"the multi-unit responses of {len(points):,} sites (about {units_per_site:,.0f} units each) to "
                 f"{responses.shape[0]:,} images", len(points) * (units_per_site * NEIGHBOUR_BYTES
                                                                 + 2 * 8 * responses.shape[0]),
                 "the number of sites (a grid's step) or recording_radius_mm")
    neighbours = cKDTree(sheet.coordinates_mm).query_ball_point(points, radius_mm)
    counts = np.array([len(n) for n in neighbours], dtype=np.int64)
    rows = np.concatenate([np.asarray(n, dtype=np.int64) for n in neighbours]) if counts.sum() else np.zeros(0, int)
    cols = np.repeat(np.arange(len(points)), counts)
    weights = 1.0 / counts[cols]
    averaging = sparse.csr_matrix((weights, (rows, cols)), shape=(sheet.n_units, len(points)))
    multi_unit = np.asarray(averaging.T.dot(responses.T).T)
    values = np.full(len(points), np.nan)
    recorded = counts > 0
    if recorded.any():
        values[recorded] = dprime(multi_unit[is_positive][:, recorded], multi_unit[~is_positive][:, recorded])
    return values, counts


def candidate_points_mm(sheet: CorticalSheet, step_mm: float, margin_mm: float) -> np.ndarray:
    """Points of a square grid ``step_mm`` apart, centred on the sheet's bounding box and at least
    ``margin_mm`` inside it (0 to half the box's shorter side); (P, 2) mm, row-major from the lowest y.
    A bad margin is named as ``[sites] 'margin_mm'``, the key of the experiment and visualisation files."""
    if not step_mm > 0:
        raise ConfigError(f"grid step must be > 0 mm, got {step_mm}")
    x0, x1, y0, y1 = sheet.extent_mm
    widest = np.floor(min(x1 - x0, y1 - y0) / 2 * 1000) / 1000  # rounded down, so that the value given is allowed
    if margin_mm < 0:
        raise ConfigError(f"[sites] 'margin_mm' must be >= 0 mm (the distance kept from the sheet's edge), got "
                          f"{margin_mm:g}; give 0 to {widest:g} mm on sheet {sheet.name!r}")
    bounds = ((x0 + margin_mm, x1 - margin_mm), (y0 + margin_mm, y1 - margin_mm))
    if any(high < low for low, high in bounds):
        raise ConfigError(f"[sites] 'margin_mm' = {margin_mm:g} mm leaves no room on sheet {sheet.name!r} "
                          f"(extent x [{x0:g}, {x1:g}], y [{y0:g}, {y1:g}] mm); give 0 to {widest:g} mm")
    counts = [int(np.floor((high - low) / step_mm + 1e-9)) + 1 for low, high in bounds]
    check_memory(f"a grid of {counts[0] * counts[1]:,} sites {step_mm:g} mm apart on sheet {sheet.name!r}",
                 counts[0] * counts[1] * GRID_BYTES_PER_SITE, "the number of sites: widen the grid's step")
    axes = [(low + high) / 2 - (n - 1) * step_mm / 2 + step_mm * np.arange(n) for (low, high), n in zip(bounds, counts)]
    xs, ys = np.meshgrid(axes[0], axes[1])
    return np.stack([xs.ravel(), ys.ravel()], axis=1)


def select_sites(spec: SitesFile, sheet: CorticalSheet, responses, is_positive, seed: int = 0) -> SiteSelection:
    """Choose the sites that ``spec`` describes on ``sheet``, from the localizer ``responses``
    (n_images, N) and ``is_positive`` (n_images,) bool; random draws use ``seed``."""
    responses, is_positive = _check_responses(responses, is_positive)
    unit_values = unit_dprime(responses, is_positive)
    peak = _peak_on_sheet(unit_values, sheet, spec.smoothing_sigma_mm)
    radius = spec.recording_radius_mm
    x0, x1, y0, y1 = sheet.extent_mm
    if radius > max(x1 - x0, y1 - y0):
        raise ConfigError(f"[sites] 'recording_radius_mm' = {radius:g} is larger than sheet {sheet.name!r} (x in "
                          f"[{x0:g}, {x1:g}] mm, y in [{y0:g}, {y1:g}] mm): every site would record the whole sheet; "
                          f"give at most {max(x1 - x0, y1 - y0):.3g} mm")
    if spec.method == "explicit":
        points = np.asarray(spec.sites_mm, dtype=np.float64)
        off = [f"({x:g}, {y:g})" for x, y in points if not sheet.contains((x, y))]
        if off:
            raise ConfigError(f"[sites] 'sites_mm': {', '.join(off)} mm lie{'s' if len(off) == 1 else ''} off sheet "
                              f"{sheet.name!r}, which spans x in [{x0:g}, {x1:g}] mm and y in [{y0:g}, {y1:g}] mm")
        groups = list(spec.groups)
    elif spec.method == "selectivity":
        points, groups = _selectivity_strata(spec, sheet, responses, is_positive, seed)
    elif spec.method == "face_patch":
        points, groups = _face_patch(spec, sheet, responses, is_positive, peak)
    elif spec.method == "grid":
        points = candidate_points_mm(sheet, spec.grid_step_mm, spec.margin_mm)
        if len(points) == 1:
            room = max(x1 - x0, y1 - y0) - 2 * spec.margin_mm
            raise ConfigError(f"[sites] 'grid_step_mm' = {spec.grid_step_mm:g} mm is wider than sheet {sheet.name!r} "
                              f"inside its margin_mm = {spec.margin_mm:g} mm (x in [{x0:g}, {x1:g}] mm, y in "
                              f"[{y0:g}, {y1:g}] mm): the grid would be one site at the centre; give a step of at "
                              f"most {room:.3g} mm, or method = \"explicit\" for sites of your own")
        groups = ["grid"] * len(points)
    else:
        raise ConfigError(f"unknown site method {spec.method!r}")
    values, counts = multi_unit_dprime(responses, is_positive, sheet, points, radius)
    empty = [f"({p[0]:.3f}, {p[1]:.3f})" for p, n in zip(points, counts) if n == 0]
    if empty:
        more = f" and {len(empty) - 5} more" if len(empty) > 5 else ""
        raise ConfigError(f"[sites] no unit of sheet {sheet.name!r} lies within recording_radius_mm = {radius} mm "
                          f"of site(s) {', '.join(empty[:5])}{more} (mm); move them or widen the radius")
    sites = tuple(Site(label=f"site_{i:03d}", x_mm=float(p[0]), y_mm=float(p[1]), group=str(g),
                       dprime=float(v), n_units=int(n))
                  for i, (p, g, v, n) in enumerate(zip(points, groups, values, counts)))
    return SiteSelection(sites=sites, method=spec.method, unit_dprime=unit_values, peak_mm=peak,
                         recording_radius_mm=radius, smoothing_sigma_mm=spec.smoothing_sigma_mm)


def _selectivity_strata(spec: SitesFile, sheet, responses, is_positive, seed):
    """n_selective points with d′ > threshold, then n_other with d′ <= threshold, each sorted by
    decreasing d′, drawn at random (at least ``min_separation_mm`` apart)."""
    candidates = candidate_points_mm(sheet, spec.candidate_step_mm, spec.margin_mm)
    values, counts = multi_unit_dprime(responses, is_positive, sheet, candidates, spec.recording_radius_mm)
    recorded = counts > 0
    strata = (("selective", spec.n_selective, recorded & (values > spec.dprime_threshold)),
              ("other", spec.n_other, recorded & (values <= spec.dprime_threshold)))
    rng = np.random.default_rng([seed, 17])
    chosen_points, groups = [], []
    for group, wanted, pool in strata:
        if wanted == 0:
            continue
        indices = np.flatnonzero(pool)
        picked = _draw_separated(candidates, indices, wanted, spec.min_separation_mm, chosen_points, rng)
        if len(picked) < wanted:
            relation = ">" if group == "selective" else "<="
            if group == "selective" and len(indices) == 0:
                largest = np.max(values[recorded]) if recorded.any() else float("nan")
                raise ConfigError(
                    f"[sites] no point of sheet {sheet.name!r} has a multi-unit d′ > {spec.dprime_threshold:g} for the "
                    f"localizer's preferred class (the largest is {largest:.2f}, on a {spec.candidate_step_mm:g} mm "
                    "grid): the model has no patch selective for it, so its 'selective' sites cannot be placed (a "
                    "model trained on other images than the localizer's may have none)")
            raise ConfigError(
                f"[sites] only {len(picked)} candidate points (of {len(indices)} with multi-unit d′ {relation} "
                f"{spec.dprime_threshold:g}, {spec.candidate_step_mm:g} mm grid, at least "
                f"{spec.min_separation_mm:g} mm apart) are available for the {wanted} '{group}' sites requested; lower n_{group}, change "
                f"dprime_threshold, candidate_step_mm or min_separation_mm")
        picked = sorted(picked, key=lambda i: -values[i])
        chosen_points.extend(candidates[i] for i in picked)
        groups.extend([group] * len(picked))
    return np.array(chosen_points).reshape(-1, 2), groups


def _draw_separated(candidates, indices, wanted, min_separation_mm, already, rng) -> list[int]:
    """Up to ``wanted`` indices drawn in random order, each at least ``min_separation_mm`` from every
    point already chosen (including ``already``)."""
    picked, taken = [], [np.asarray(p) for p in already]
    for index in rng.permutation(indices):
        point = candidates[index]
        if min_separation_mm > 0 and taken:
            if np.min(np.linalg.norm(np.array(taken) - point, axis=1)) < min_separation_mm:
                continue
        picked.append(int(index))
        taken.append(point)
        if len(picked) == wanted:
            break
    return picked


def _face_patch(spec: SitesFile, sheet, responses, is_positive, peak):
    """Inside = the candidate point where the unit-d′ map smoothed with ``smoothing_sigma_mm`` is
    highest (the face-patch centre, kept ``margin_mm`` from the edge); outside = the candidate at
    least ``outside_min_distance_mm`` from it where that smoothed map is lowest. With σ about the
    stimulation's spread length λ(I), "outside" is where the stimulation reaches the fewest
    face-selective units."""
    candidates = candidate_points_mm(sheet, spec.candidate_step_mm, spec.margin_mm)
    smoothed = smoothed_values_at(unit_dprime(responses, is_positive), sheet, candidates, spec.smoothing_sigma_mm)
    inside = int(np.nanargmax(smoothed))
    far = (np.linalg.norm(candidates - candidates[inside], axis=1) >= spec.outside_min_distance_mm) & np.isfinite(smoothed)
    if not far.any():
        raise ConfigError(f"[sites] no candidate point lies {spec.outside_min_distance_mm:g} mm or more from the face-"
                          f"patch centre ({candidates[inside][0]:.2f}, {candidates[inside][1]:.2f}) mm on sheet "
                          f"{sheet.name!r}; lower outside_min_distance_mm")
    outside = np.flatnonzero(far)[np.nanargmin(smoothed[far])]
    return np.array([candidates[inside], candidates[outside]]), ["inside", "outside"]


def _peak_on_sheet(values: np.ndarray, sheet: CorticalSheet, sigma_mm: float) -> tuple[float, float]:
    """Peak of the smoothed d′ map. The map's grid may run up to half a grid step (0.05 mm) past the
    outermost units; a peak there is moved onto the sheet's bounding box so that it can be stimulated."""
    try:
        x, y = peak_location_mm(_finite_for_map(values), sheet, sigma_mm)
    except ValueError as error:
        raise ConfigError(f"the localizer's d′ map of sheet {sheet.name!r} has no peak to place sites by ({error}); "
                          "the localizer images must differ in how the units respond to them") from error
    x0, x1, y0, y1 = sheet.extent_mm
    return float(np.clip(x, x0, x1)), float(np.clip(y, y0, y1))


def _check_responses(responses, is_positive) -> tuple[np.ndarray, np.ndarray]:
    responses = np.asarray(responses, dtype=np.float64)
    is_positive = np.asarray(is_positive)
    if responses.ndim != 2:
        raise ValueError(f"responses must be (n_images, n_units), got shape {responses.shape}")
    if is_positive.dtype != np.bool_ or is_positive.shape != (responses.shape[0],):
        raise ValueError(f"is_positive must be a boolean array of shape ({responses.shape[0]},)")
    n_positive = int(is_positive.sum())
    if n_positive < 2 or responses.shape[0] - n_positive < 2:
        raise ConfigError(f"the localizer needs at least 2 images of the preferred class and 2 others, got "
                          f"{n_positive} and {responses.shape[0] - n_positive}")
    return responses, is_positive


def _finite_for_map(values: np.ndarray) -> np.ndarray:
    """d′ values for smoothing: perfectly separated units (±inf) would swamp the map, so they are
    refused rather than clipped."""
    if not np.all(np.isfinite(values)):
        n_bad = int(np.sum(~np.isfinite(values)))
        raise ConfigError(f"{n_bad} unit(s) have infinite d′ (constant responses within both classes); the "
                          f"localizer needs more varied images")
    return values


def plot_sites(selection: SiteSelection, sheet: CorticalSheet, path, title: str) -> None:
    """Units coloured by d′, sites marked by group, the smoothed-map peak as a star, on ``sheet`` in cortex mm
    (:meth:`~stimsim.models.topographic.TopographicModel.in_cortex_mm`); PNG at ``path``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    values = selection.unit_dprime
    order = np.argsort(values)
    limit = max(1.0, float(np.nanmax(np.abs(values))))
    points = ax.scatter(sheet.coordinates_mm[order, 0], sheet.coordinates_mm[order, 1], c=values[order],
                        s=max(2.0, 6000 / sheet.n_units), cmap="RdBu_r", vmin=-limit, vmax=limit, linewidths=0)
    fig.colorbar(points, ax=ax, label="unit d′ (preferred class vs rest)")
    groups = list(dict.fromkeys(site.group for site in selection.sites))
    markers = "ovs^Dpx+"
    for index, group in enumerate(groups):
        xy = np.array([site.position_mm for site in selection.sites if site.group == group])
        ax.scatter(xy[:, 0], xy[:, 1], marker=markers[index % len(markers)], facecolors="none", edgecolors="k",
                   s=40, linewidths=1.0, label=group)
    ax.scatter([selection.peak_mm[0]], [selection.peak_mm[1]], marker="*", color="gold", edgecolors="k", s=160,
               label="d′ peak", zorder=5)
    ax.legend(fontsize=7, loc="upper right", framealpha=0.8)
    ax.set(xlabel="x (cortex mm)", ylabel="y (cortex mm)", title=title, aspect="equal")
    fig.tight_layout()
    save_figure(fig, path)
