"""Moran's I and its position-shuffle test against values derived independently of stimsim's code."""
import numpy as np
import pytest
from scipy.spatial.distance import pdist, squareform

from stimsim.cortex.topography import clustering_test, morans_i

LINE_MM = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])


def test_morans_i_of_a_hand_computed_line():
    # neighbours within 1.5 mm: (0,1), (1,2), (2,3); W = Σ w_ij = 6 (each pair counted both ways)
    # values 1,1,0,0: z = ±0.5, Σ z² = 1, Σ_ij w_ij z_i z_j = 2·(0.25 − 0.25 + 0.25) = 0.5 → I = 4/6 · 0.5 = 1/3
    assert morans_i([1, 1, 0, 0], LINE_MM, radius_mm=1.5) == pytest.approx(1 / 3)
    # alternating values: every neighbour pair is unlike → I = 4/6 · 2·(−0.75) = −1
    assert morans_i([1, 0, 1, 0], LINE_MM, radius_mm=1.5) == pytest.approx(-1.0)


def test_morans_i_refuses_a_map_with_nan_units_and_is_undefined_for_a_flat_one():
    # one unmeasured (NaN) unit made I NaN, silently; the shuffle test already refused it
    for test in (morans_i, clustering_test):
        with pytest.raises(ValueError, match="needs finite values for every unit; 1 of 4 are NaN or infinite"):
            test([1, np.nan, 0, 0], LINE_MM, radius_mm=1.5)
    assert np.isnan(morans_i([2, 2, 2, 2], LINE_MM, radius_mm=1.5))  # Σ z² = 0: I = 0 / 0


def _dense_morans_i(values, coordinates_mm, radius_mm):
    """Textbook Moran (1950): I = N / W · Σ_ij w_ij z_i z_j / Σ_i z_i², from a dense weight matrix."""
    weights = (squareform(pdist(coordinates_mm)) < radius_mm).astype(float)
    np.fill_diagonal(weights, 0.0)
    z = np.asarray(values, float) - np.mean(values)
    return len(z) / weights.sum() * (z @ weights @ z) / (z @ z)


def test_morans_i_matches_the_dense_textbook_formula():
    rng = np.random.default_rng(3)
    coordinates = rng.uniform(0, 5, size=(300, 2))
    values = np.cos(coordinates[:, 0]) + rng.normal(scale=0.5, size=300)
    assert morans_i(values, coordinates, 0.8) == pytest.approx(_dense_morans_i(values, coordinates, 0.8), rel=1e-10)


def _grid(n_side=24, spacing_mm=0.25):
    xs, ys = np.meshgrid(np.arange(n_side) * spacing_mm, np.arange(n_side) * spacing_mm)
    return np.column_stack([xs.ravel(), ys.ravel()])


def test_a_planted_patch_clusters_and_the_same_values_shuffled_do_not():
    rng = np.random.default_rng(0)
    coordinates = _grid()
    centre = coordinates.mean(0)
    planted = (np.linalg.norm(coordinates - centre, axis=1) < 1.5).astype(float) + rng.normal(scale=0.3, size=len(coordinates))
    test = clustering_test(planted, coordinates, radius_mm=0.6, n_shuffles=200, seed=1)
    assert test.morans_i > 0.3
    assert test.p_value == pytest.approx(1 / 201)  # no shuffle reaches a planted patch: the floor
    # the null's mean is Moran's expectation under randomisation, −1/(N − 1)
    assert test.null_mean == pytest.approx(-1 / (len(planted) - 1), abs=3 * test.null_sd / np.sqrt(200))

    shuffled = rng.permutation(planted)
    test = clustering_test(shuffled, coordinates, radius_mm=0.6, n_shuffles=200, seed=1)
    assert abs(test.morans_i) < 4 * test.null_sd
    assert test.p_value > 0.01


def test_clustering_p_is_calibrated_on_maps_without_structure():
    """On maps of independent values, p is roughly uniform: about 10 % of maps fall below 0.1."""
    rng = np.random.default_rng(5)
    coordinates = rng.uniform(0, 4, size=(200, 2))
    p = np.array([clustering_test(rng.normal(size=200), coordinates, 0.5, n_shuffles=99, seed=i).p_value
                  for i in range(60)])
    assert 0.0 <= np.mean(p < 0.1) <= 0.25
    assert 0.35 <= np.median(p) <= 0.65


def test_clustering_test_refuses_bad_input():
    with pytest.raises(ValueError, match="n_shuffles"):
        clustering_test([1, 0, 1, 0], LINE_MM, 1.5, n_shuffles=0)
    with pytest.raises(ValueError, match="finite"):
        clustering_test([1, np.nan, 1, 0], LINE_MM, 1.5)
    with pytest.raises(ValueError, match="radius"):
        morans_i([1, 0, 1, 0], LINE_MM, radius_mm=0.5)
    with pytest.raises(ValueError, match=r"radius_mm must be a finite number of mm > 0, got -1"):
        morans_i([1, 0, 1, 0], LINE_MM, radius_mm=-1)
    for function in (morans_i, clustering_test):  # 4 values at 3 positions (a coordinate table of another sheet)
        with pytest.raises(ValueError, match=r"shapes \(N,\) and \(N, 2\), got \(4,\) and \(3, 2\)"):
            function([1, 0, 1, 0], LINE_MM[:3], 1.5)


@pytest.mark.parametrize("chunk", [1, 7, 10_000_000])
def test_smoothed_values_in_chunks_equal_the_gaussian_mean_of_all_units_within_3_sigma(chunk, monkeypatch):
    """Brute force over every unit: weights exp(−d²/2σ²) within 3σ, NaN where none; the same whatever the
    chunk size that bounds memory on dense sheets."""
    from stimsim.cortex import topography
    from stimsim.cortex.sheet import CorticalSheet

    rng = np.random.default_rng(0)
    sheet = CorticalSheet("it", (300, 1, 1), rng.uniform(0, 4, size=(300, 2)))
    values = rng.normal(size=300)
    points = np.vstack([rng.uniform(0, 4, size=(25, 2)), [[40.0, 40.0]]])  # the last has no unit within 3σ
    monkeypatch.setattr(topography, "SMOOTHING_NEIGHBOURS_PER_CHUNK", chunk)
    got = topography.smoothed_values_at(values, sheet, points, sigma_mm=0.4)
    d2 = ((points[:, None, :] - sheet.coordinates_mm[None]) ** 2).sum(-1)
    weights = np.where(d2 <= (3 * 0.4) ** 2, np.exp(-d2 / (2 * 0.4 ** 2)), 0.0)
    inside = weights.sum(1) > 0
    assert np.allclose(got[inside], (weights @ values)[inside] / weights.sum(1)[inside])
    assert np.isnan(got[~inside]).all() and (~inside).sum() == 1


def test_smoothed_values_leave_nan_units_out_and_refuse_values_of_another_sheet():
    """A unit whose value is NaN (e.g. not measured) is left out of the Gaussian mean, as if it were absent from
    the sheet; a value array of another length or shape is refused before any work."""
    from stimsim.cortex import topography
    from stimsim.cortex.sheet import CorticalSheet

    rng = np.random.default_rng(1)
    coordinates = rng.uniform(0, 4, size=(200, 2))
    values = rng.normal(size=200)
    values[::2] = np.nan
    points = rng.uniform(0, 4, size=(20, 2))
    got = topography.smoothed_values_at(values, CorticalSheet("it", (200, 1, 1), coordinates), points, 0.5)
    without = topography.smoothed_values_at(values[1::2], CorticalSheet("it", (100, 1, 1), coordinates[1::2]),
                                            points, 0.5)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(without))
    np.testing.assert_allclose(got[~np.isnan(got)], without[~np.isnan(without)], rtol=1e-12)
    sheet = CorticalSheet("it", (200, 1, 1), coordinates)
    with pytest.raises(ValueError, match=r"one number per unit of the sheet, shape \(200,\), got shape \(100,\)"):
        topography.peak_location_mm(values[:100], sheet)
    with pytest.raises(ValueError, match=r"shape \(200,\), got shape \(1, 200\)"):
        topography.peak_location_mm(values[None], sheet)
    with pytest.raises(ValueError, match="every value is NaN"):
        topography.peak_location_mm(np.full(200, np.nan), sheet)
    for sigma_mm in (-1.0, 0.0, np.nan):
        with pytest.raises(ValueError, match=r"sigma_mm must be a finite number of mm > 0"):
            topography.peak_location_mm(values, sheet, sigma_mm=sigma_mm)
    with pytest.raises(TypeError, match=r"sheet must be a CorticalSheet \(e.g. model.sheet\('IT'\)\), got str"):
        topography.peak_location_mm(values, "IT")


def test_a_map_grid_beyond_memory_is_refused_before_it_is_allocated():
    """A grid step given in the wrong unit (1e-6 mm on a 4 mm sheet: 1.6e13 points, over 100 TB) is refused, naming
    grid_step_mm, instead of failing in numpy; the same sheet maps at 0.5 mm on a 9 × 9 grid (0 to 4 mm)."""
    from stimsim.cortex import topography
    from stimsim.cortex.sheet import CorticalSheet
    from stimsim.utilities.errors import ConfigError

    coordinates = np.array([[0.0, 0.0], [4.0, 4.0], [0.0, 4.0], [4.0, 0.0]])
    sheet = CorticalSheet("it", (4, 1, 1), coordinates)
    values = np.array([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ConfigError, match=r"grid_step_mm = 1e-06 mm .* more than .* \(a larger grid_step_mm\)"):
        topography.smoothed_map(values, sheet, grid_step_mm=1e-6)
    xs, ys, smooth = topography.smoothed_map(values, sheet, sigma_mm=1.0, grid_step_mm=0.5)
    assert len(xs) == len(ys) == 9 and smooth.shape == (9, 9)
