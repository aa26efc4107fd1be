"""Retinotopic positions, TDANN's spatial loss and swap optimisation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from stimsim.cortex.positions import build_sheet, retinotopic_positions
from stimsim.cortex.sheet import CorticalSheet
from stimsim.models.swap import swap_optimize
from stimsim.training.spatial_loss import layer_spatial_loss, neighborhood_spatial_loss
from stimsim.utilities.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- retinotopic positions --------------------------------------------------------------------
@pytest.mark.parametrize("dims", [(64, 7, 7), (16, 14, 14), (256, 1, 1)])
def test_positions_stay_on_the_sheet_and_fill_it(dims):
    coords = retinotopic_positions(dims, sheet_size_mm=10.0, seed=0)
    assert coords.shape == (np.prod(dims), 2)
    assert coords.min() >= 0.0 and coords.max() <= 10.0
    # scaled back onto the sheet, not clipped: the layout spans it and nothing piles up at a border
    assert coords.min(0).max() < 0.5 and coords.max(0).min() > 9.5
    assert np.unique(coords, axis=0).shape[0] == len(coords)


def test_density_is_uniform_away_from_the_border():
    coords = retinotopic_positions((128, 14, 14), sheet_size_mm=10.0, seed=0)
    counts, _, _ = np.histogram2d(coords[:, 0], coords[:, 1], bins=7, range=[[0, 10], [0, 10]])
    interior = counts[1:-1, 1:-1]
    assert interior.min() > 0.8 * interior.mean() and interior.max() < 1.2 * interior.mean()
    # border bins are covered by fewer (overlapping) patches, but are no holes
    assert counts.min() > 0.5 * interior.mean()


def test_units_of_one_location_sit_in_its_patch():
    # without overlap or jitter, location (h, w) owns exactly the square [w, w+1] x [h, h+1] * 2 mm
    coords = retinotopic_positions((16, 4, 4), sheet_size_mm=8.0, overlap=0.0, jitter=0.0, seed=1)
    per_location = coords.reshape(16, 4, 4, 2)  # C-major: unit index = c*H*W + h*W + w
    for h in range(4):
        for w in range(4):
            xy = per_location[:, h, w]
            assert np.all((xy[:, 0] > 2 * w) & (xy[:, 0] < 2 * w + 2))
            assert np.all((xy[:, 1] > 2 * h) & (xy[:, 1] < 2 * h + 2))
            np.testing.assert_allclose(xy.mean(0), (2 * w + 1, 2 * h + 1), atol=1e-9)


def test_overlapping_patches_keep_retinotopic_order():
    coords = retinotopic_positions((64, 7, 7), sheet_size_mm=7.0, seed=2).reshape(64, 7, 7, 2)
    centres = coords.mean(0)  # (H, W, 2)
    assert np.all(np.diff(centres[..., 0], axis=1) > 0.5)  # x grows with w
    assert np.all(np.diff(centres[..., 1], axis=0) > 0.5)  # y grows with h
    spread = np.abs(coords - centres).max(axis=(0, 1, 2))
    assert np.all(spread < 1.0)  # each location stays within about one patch (1 mm) of its centre


def test_positions_are_deterministic_and_validated():
    a = retinotopic_positions((8, 3, 3), 5.0, seed=4)
    np.testing.assert_array_equal(a, retinotopic_positions((8, 3, 3), 5.0, seed=4))
    assert not np.array_equal(a, retinotopic_positions((8, 3, 3), 5.0, seed=5))
    for kwargs in (dict(sheet_size_mm=0.0), dict(sheet_size_mm=5.0, overlap=-0.1), dict(sheet_size_mm=5.0, jitter=2)):
        with pytest.raises(ConfigError):
            retinotopic_positions((8, 3, 3), **kwargs)


def test_positions_refuse_a_sheet_size_or_dims_that_would_give_nan_or_no_units():
    # a NaN or infinite size gave NaN positions; a layer of 0 channels or locations divided by zero
    for size in (float("nan"), float("inf"), "5", True):
        with pytest.raises(ConfigError, match=f"sheet_size_mm must be a finite number of mm > 0, got {size!r}"):
            retinotopic_positions((8, 3, 3), size)
    for dims in ((0, 1, 1), (8, 0, 3), (8, 3), (8.5, 1, 1), "831"):
        with pytest.raises(ConfigError, match=r"dims must be a layer's \(C, H, W\), three integers >= 1"):
            retinotopic_positions(dims, 5.0)
    with pytest.raises(ConfigError, match="neighborhood_width_mm must be in"):
        build_sheet("it", (8, 1, 1), 5.0, float("nan"))
    assert retinotopic_positions(np.array([4, 1, 1]), np.float32(2.0)).shape == (4, 2)


def test_build_sheet_adds_neighborhoods():
    sheet = build_sheet("layer3.1", (32, 4, 4), sheet_size_mm=5.0, neighborhood_width_mm=2.0, n_neighborhoods=10)
    assert sheet.dims == (32, 4, 4) and sheet.neighborhood_indices.shape[0] == 10
    assert sheet.neighborhood_width_mm == 2.0
    for row in sheet.neighborhood_indices:
        xy = sheet.coordinates_mm[row]
        assert np.linalg.norm(xy[:, None] - xy[None], axis=-1).max() <= 2.0 + 1e-9
    with pytest.raises(ConfigError, match="neighborhood_width_mm"):
        build_sheet("x", (32, 4, 4), sheet_size_mm=5.0, neighborhood_width_mm=6.0)


# --- spatial loss ---------------------------------------------------------------------------------
def responses_with_correlation(target: np.ndarray, extra_images: int = 5, seed: int = 0) -> torch.Tensor:
    """Responses (B, Q) whose Pearson correlation matrix is exactly ``target`` (Q, Q, positive definite)."""
    rng = np.random.default_rng(seed)
    size = len(target)
    noise = rng.standard_normal((size + extra_images, size))
    basis, _ = np.linalg.qr(noise - noise.mean(0))  # orthonormal columns, each with zero mean
    return torch.from_numpy(basis @ np.linalg.cholesky(target).T)


def inverse_distance(coords: np.ndarray) -> np.ndarray:
    return 1.0 / (np.linalg.norm(coords[:, None] - coords[None], axis=-1) + 1.0)


def test_spatial_loss_hand_computed_three_units():
    # units at x = 0, 1, 3 mm; pairs (1,0), (2,0), (2,1): d = 1, 3, 2 mm, s = 1/2, 1/4, 1/3.
    # units 0 and 1 respond identically, unit 2 opposite: r = 1, -1, -1; corr(r, s) = 5/sqrt(28).
    responses = torch.tensor([[1.0, 1.0, -1.0], [2.0, 2.0, -2.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    coords = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    assert neighborhood_spatial_loss(responses, coords).item() == pytest.approx((1 - 5 / np.sqrt(28)) / 2, abs=1e-6)


@pytest.mark.parametrize("weight", [1.0, 0.4])
def test_spatial_loss_is_zero_when_correlation_follows_inverse_distance(weight):
    coords = np.random.default_rng(3).uniform(0, 3, (40, 2))
    similarity = inverse_distance(coords)
    target = weight * similarity + (1 - weight)  # affine in 1/(d+1), still a correlation matrix
    responses = responses_with_correlation(target)
    loss = neighborhood_spatial_loss(responses, torch.from_numpy(coords))
    assert loss.item() == pytest.approx(0.0, abs=1e-6)


def test_spatial_loss_is_one_half_for_unrelated_responses():
    rng = np.random.default_rng(4)
    coords = torch.from_numpy(rng.uniform(0, 3, (200, 2)))
    responses = torch.from_numpy(rng.standard_normal((300, 200)))
    assert neighborhood_spatial_loss(responses, coords).item() == pytest.approx(0.5, abs=0.02)


def test_layer_loss_is_the_mean_over_neighborhoods():
    coords = np.random.default_rng(5).uniform(0, 3, (60, 2))
    ordered = responses_with_correlation(inverse_distance(coords)[:30, :30], extra_images=40)
    unrelated = torch.from_numpy(np.random.default_rng(6).standard_normal((70, 30)))
    responses = torch.cat([ordered, unrelated], dim=1)
    neighborhoods = torch.stack([torch.arange(30), torch.arange(30, 60)])
    loss = layer_spatial_loss(responses, torch.from_numpy(coords), neighborhoods)
    second = neighborhood_spatial_loss(unrelated, torch.from_numpy(coords[30:]))
    assert loss.item() == pytest.approx(second.item() / 2, abs=1e-6)
    with pytest.raises(ValueError, match="at least 2 images"):
        neighborhood_spatial_loss(responses[:1, :30], torch.from_numpy(coords[:30]))


# --- swap optimisation ------------------------------------------------------------------------------
def planted_problem(seed=0):
    """400 units on a 20 x 20 grid (0.5 mm pitch) respond to smooth random fields over their true
    position; the sheet places them at shuffled positions."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(np.arange(20), np.arange(20)), -1).reshape(-1, 2) * 0.5
    bumps = rng.uniform(0, 10, (32, 3, 2))  # 32 images, 3 Gaussian bumps (sigma 1.5 mm) each
    fields = np.exp(-((grid[None, None] - bumps[:, :, None]) ** 2).sum(-1) / (2 * 1.5 ** 2)).sum(1)
    responses = torch.from_numpy(fields + 0.05 * rng.standard_normal(fields.shape))
    shuffled = CorticalSheet("it", (400, 1, 1), grid[rng.permutation(400)])
    return shuffled.with_neighborhoods(4.0, 32, max_units=100, seed=seed), responses


def sheet_loss(sheet, responses):
    return layer_spatial_loss(responses, torch.from_numpy(sheet.coordinates_mm),
                              torch.from_numpy(sheet.neighborhood_indices)).item()


def test_swap_optimisation_lowers_the_loss_on_planted_structure():
    sheet, responses = planted_problem()
    new, history = swap_optimize(sheet, responses, n_steps=200, seed=0)
    assert len(history) == 201
    assert history[0] == pytest.approx(sheet_loss(sheet, responses), abs=1e-6)
    assert history[0] > 0.4  # shuffled: response similarity unrelated to distance
    assert np.all(np.diff(history) <= 0)
    assert history[-1] < history[0] - 0.15
    # the history is the real loss of the returned sheet, recomputed from scratch
    assert sheet_loss(new, responses) == pytest.approx(history[-1], abs=1e-6)
    # only swaps: the same positions, permuted over units, and neighbourhoods stay in place
    np.testing.assert_array_equal(np.sort(new.coordinates_mm, axis=0), np.sort(sheet.coordinates_mm, axis=0))
    assert not np.array_equal(new.coordinates_mm, sheet.coordinates_mm)
    np.testing.assert_array_equal(new.coordinates_mm[new.neighborhood_indices],
                                  sheet.coordinates_mm[sheet.neighborhood_indices])
    assert (new.name, new.dims, new.neighborhood_width_mm) == (sheet.name, sheet.dims, sheet.neighborhood_width_mm)


def test_swap_optimisation_is_deterministic_given_seed():
    sheet, responses = planted_problem(seed=1)
    first, history = swap_optimize(sheet, responses, n_steps=30, seed=7)
    second, history_again = swap_optimize(sheet, responses.numpy(), n_steps=30, seed=7)
    np.testing.assert_array_equal(first.coordinates_mm, second.coordinates_mm)
    np.testing.assert_array_equal(history, history_again)
    third, _ = swap_optimize(sheet, responses, n_steps=30, seed=8)
    assert not np.array_equal(first.coordinates_mm, third.coordinates_mm)
    unchanged, single = swap_optimize(sheet, responses, n_steps=0)
    np.testing.assert_array_equal(unchanged.coordinates_mm, sheet.coordinates_mm)
    assert single.shape == (1,)


def test_swap_optimisation_on_a_retinotopic_layer():
    sheet = build_sheet("layer4.1", (64, 4, 4), sheet_size_mm=10.0, neighborhood_width_mm=3.0, n_neighborhoods=16)
    responses = torch.randn(16, sheet.n_units, generator=torch.Generator().manual_seed(0))
    new, history = swap_optimize(sheet, responses, n_steps=50, seed=0)
    assert np.all(np.diff(history) <= 0) and history[-1] < history[0]
    assert sheet_loss(new, responses.double()) == pytest.approx(history[-1], abs=1e-5)


def test_swap_optimisation_validates_its_input():
    sheet, responses = planted_problem()
    with pytest.raises(ValueError, match=r"\(B, N\)"):
        swap_optimize(sheet, responses[:, :10], n_steps=1)
    with pytest.raises(ValueError, match="B >= 2"):
        swap_optimize(sheet, responses[:1], n_steps=1)
    with pytest.raises(ValueError, match="NaN"):
        swap_optimize(sheet, responses * np.nan, n_steps=1)
    with pytest.raises(ValueError, match="n_steps"):
        swap_optimize(sheet, responses, n_steps=-1)
    with pytest.raises(ValueError, match="swaps_per_step"):
        swap_optimize(sheet, responses, n_steps=1, swaps_per_step=0)
    repeated = sheet.neighborhood_indices.copy()
    repeated[0, 1] = repeated[0, 0]
    with pytest.raises(ValueError, match="same unit twice"):
        swap_optimize(CorticalSheet(sheet.name, sheet.dims, sheet.coordinates_mm, repeated), responses, n_steps=1)
    bare = CorticalSheet(sheet.name, sheet.dims, sheet.coordinates_mm)
    with pytest.raises(ValueError, match="with_neighborhoods"):
        swap_optimize(bare, responses, n_steps=1)
