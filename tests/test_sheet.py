"""Cortical sheets: geometry on a hand-made grid, neighbourhoods, TDANN position files."""
from __future__ import annotations

import os
import pickle
import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest

from stimsim.cortex.sheet import CorticalSheet
from stimsim.utilities.errors import ConfigError, FileFormatError


def grid_sheet(name="grid") -> CorticalSheet:
    """dims (1, 3, 3): unit i = (h, w) = divmod(i, 3) sits at x = w mm, y = h mm."""
    h, w = np.divmod(np.arange(9), 3)
    return CorticalSheet(name, (1, 3, 3), np.stack([w, h], axis=1).astype(float))


# --- geometry ---------------------------------------------------------------------------------
def test_distances_on_grid_match_pythagoras():
    sheet = grid_sheet()
    expected = np.sqrt([0, 1, 4, 1, 2, 5, 4, 5, 8])
    np.testing.assert_allclose(sheet.distances_mm((0.0, 0.0)), expected)
    np.testing.assert_allclose(sheet.distances_mm((1.0, 1.0)), np.sqrt([2, 1, 2, 1, 0, 1, 2, 1, 2]))


def test_units_within_is_inclusive_and_sorted():
    sheet = grid_sheet()
    np.testing.assert_array_equal(sheet.units_within((1.0, 1.0), 1.0), [1, 3, 4, 5, 7])
    np.testing.assert_array_equal(sheet.units_within((1.0, 1.0), np.sqrt(2)), np.arange(9))
    np.testing.assert_array_equal(sheet.units_within((1.0, 1.0), 0.0), [4])
    np.testing.assert_array_equal(sheet.units_within((5.0, 5.0), 1.0), [])
    for bad in (-0.1, float("nan")):  # a NaN radius would find no unit
        with pytest.raises(ValueError, match="radius_mm must be a number >= 0"):
            sheet.units_within((0, 0), bad)


def test_extent_density_contains_and_channels():
    sheet = grid_sheet()
    assert sheet.n_units == 9
    assert sheet.extent_mm == (0.0, 2.0, 0.0, 2.0)
    assert sheet.size_mm == 2.0
    assert sheet.density_per_mm2 == pytest.approx(9 / 4)
    assert sheet.contains((2.0, 0.0)) and not sheet.contains((2.1, 0.0))
    assert sheet.contains((2.1, 0.0), margin_mm=0.1)
    two_channel = CorticalSheet("c", (2, 1, 2), np.zeros((4, 2)))
    np.testing.assert_array_equal(two_channel.unit_channels(), [0, 0, 1, 1])


def test_flat_dims_become_chw():
    sheet = CorticalSheet("fc", (5,), np.zeros((5, 2)))
    assert sheet.dims == (5, 1, 1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(dims=(1, 3, 3), coordinates_mm=np.zeros((8, 2))), "shape"),
    (dict(dims=(1, 3, 0), coordinates_mm=np.zeros((0, 2))), "positive"),
    (dict(dims=(1, 1, 2), coordinates_mm=[[0, 0], [np.nan, 1]]), "NaN"),
    (dict(dims=(1, 1, 2), coordinates_mm=np.zeros((2, 2)), neighborhood_indices=[[0, 2]]), "neighborhood_indices"),
])
def test_invalid_sheets_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CorticalSheet("bad", **kwargs)


# --- neighbourhoods ---------------------------------------------------------------------------
def test_neighborhoods_on_grid():
    sheet = grid_sheet().with_neighborhoods(width_mm=2.2, n_neighborhoods=6, seed=3)
    nbh = sheet.neighborhood_indices
    # a corner unit has 2 neighbours within 1.1 mm, so every neighbourhood is cut to 3 units
    assert nbh.shape == (6, 3)
    assert sheet.neighborhood_width_mm == 2.2
    for row in nbh:
        assert len(set(row)) == 3 and np.all(np.diff(row) > 0)
        xy = sheet.coordinates_mm[row]
        assert np.max(np.linalg.norm(xy[:, None] - xy[None], axis=-1)) <= 2.2 + 1e-12
    again = grid_sheet().with_neighborhoods(width_mm=2.2, n_neighborhoods=6, seed=3)
    np.testing.assert_array_equal(again.neighborhood_indices, nbh)
    np.testing.assert_array_equal(sheet.coordinates_mm, grid_sheet().coordinates_mm)


def test_neighborhoods_cap_and_errors():
    rng = np.random.default_rng(0)
    sheet = CorticalSheet("big", (400, 1, 1), rng.uniform(0, 2, (400, 2)))
    assert sheet.with_neighborhoods(3.0, 4, max_units=50).neighborhood_indices.shape == (4, 50)
    with pytest.raises(ValueError, match="fewer than 2 units"):
        grid_sheet().with_neighborhoods(width_mm=0.5, n_neighborhoods=3)
    with pytest.raises(ValueError, match="width_mm > 0"):
        grid_sheet().with_neighborhoods(width_mm=0.0, n_neighborhoods=3)


# --- TDANN files --------------------------------------------------------------------------------
@dataclass
class _LayerPositions:
    """The fields of spacetorch.models.positions.LayerPositions (TDANN), in its order."""

    name: str
    dims: tuple
    coordinates: np.ndarray
    neighborhood_indices: np.ndarray
    neighborhood_width: float


def tdann_positions(rng=None) -> _LayerPositions:
    rng = rng or np.random.default_rng(1)
    return _LayerPositions(name="layer4.1", dims=(2, 3, 4), coordinates=rng.uniform(0, 70, (24, 2)),
                           neighborhood_indices=np.stack([rng.permutation(24)[:5] for _ in range(3)]),
                           neighborhood_width=np.float64(3.0))


def dump_as_spacetorch(obj, path, protocol):
    """Pickle ``obj`` as TDANN does, its class living in ``spacetorch.models.positions``; the fake
    module is gone again afterwards."""
    names = ("spacetorch", "spacetorch.models", "spacetorch.models.positions")
    modules = {name: types.ModuleType(name) for name in names}
    modules["spacetorch.models.positions"].LayerPositions = _LayerPositions
    original = (_LayerPositions.__module__, _LayerPositions.__qualname__)
    _LayerPositions.__module__, _LayerPositions.__qualname__ = "spacetorch.models.positions", "LayerPositions"
    sys.modules.update(modules)
    try:
        with open(path, "wb") as handle:
            pickle.dump(obj, handle, protocol=protocol)
    finally:
        for name in names:
            del sys.modules[name]
        _LayerPositions.__module__, _LayerPositions.__qualname__ = original


def assert_same_positions(sheet, positions, atol=0.0):
    assert sheet.name == positions.name
    assert sheet.dims == tuple(positions.dims)
    np.testing.assert_allclose(sheet.coordinates_mm, positions.coordinates, atol=atol)
    np.testing.assert_array_equal(sheet.neighborhood_indices, positions.neighborhood_indices)
    assert sheet.neighborhood_width_mm == positions.neighborhood_width


def test_npz_written_by_tdann_loads(tmp_path):
    positions = tdann_positions()
    np.savez(tmp_path / "layer4.1.npz", **vars(positions))  # TDANN's LayerPositions.save
    assert_same_positions(CorticalSheet.load(tmp_path / "layer4.1.npz", expected_dims=(2, 3, 4)), positions)


def test_npz_round_trip(tmp_path):
    sheet = CorticalSheet("layer4.1", (2, 3, 4), np.random.default_rng(2).uniform(0, 10, (24, 2))
                          ).with_neighborhoods(6.0, 5, seed=1)
    path = sheet.save(tmp_path / "sub" / "layer4.1.npz")
    loaded = CorticalSheet.load(path)
    assert loaded.name == "layer4.1" and loaded.dims == (2, 3, 4)
    np.testing.assert_allclose(loaded.coordinates_mm, sheet.coordinates_mm, rtol=1e-6)  # stored as float32
    np.testing.assert_array_equal(loaded.neighborhood_indices, sheet.neighborhood_indices)
    assert loaded.neighborhood_width_mm == 6.0
    with np.load(path, allow_pickle=False) as archive:  # readable by TDANN's LayerPositions.load
        assert set(archive.files) == {"name", "dims", "coordinates", "neighborhood_indices", "neighborhood_width"}


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_pkl_from_spacetorch_loads_without_spacetorch(tmp_path, protocol):
    positions = tdann_positions()
    path = tmp_path / "layer4.1.pkl"
    dump_as_spacetorch(positions, path, protocol)
    assert b"spacetorch.models.positions" in path.read_bytes()
    assert "spacetorch.models.positions" not in sys.modules
    sheet = CorticalSheet.load(path, expected_dims=(2, 3, 4))
    assert_same_positions(sheet, positions)
    assert "spacetorch.models.positions" not in sys.modules


class _Eval:
    """Unpickling this would call builtins.eval on code that creates a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return eval, (f"open({self.marker!r}, 'w').close()",)


class _System:
    """Unpickling this would call os.system with a command that creates a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


@pytest.mark.parametrize("payload", [_Eval, _System])
@pytest.mark.parametrize("hidden", [False, True])
def test_malicious_pickles_are_refused_without_side_effects(tmp_path, payload, hidden):
    marker = tmp_path / "marker"
    path = tmp_path / "layer4.1.pkl"
    if hidden:  # inside a genuine positions object
        positions = tdann_positions()
        positions.name = payload(marker)
        dump_as_spacetorch(positions, path, protocol=4)
    else:
        path.write_bytes(pickle.dumps(payload(marker)))
    with pytest.raises(FileFormatError, match="refused to unpickle") as info:
        CorticalSheet.load(path)
    assert info.value.path == path
    assert not marker.exists()


def test_wrong_dims_are_refused_with_the_file_named(tmp_path):
    positions = tdann_positions()
    np.savez(tmp_path / "layer4.1.npz", **vars(positions))
    with pytest.raises(FileFormatError, match=r"\(2, 3, 4\).*\(512, 7, 7\)") as info:
        CorticalSheet.load(tmp_path / "layer4.1.npz", expected_dims=(512, 7, 7))
    assert "layer4.1.npz" in str(info.value)


def test_damaged_and_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        CorticalSheet.load(tmp_path / "absent.npz")
    good = tmp_path / "good.npz"
    np.savez(good, **vars(tdann_positions()))
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:100])
    with pytest.raises(FileFormatError, match="not a readable .npz"):
        CorticalSheet.load(truncated)
    fields = vars(tdann_positions())
    np.savez(tmp_path / "nocoords.npz", **{k: v for k, v in fields.items() if k != "coordinates"})
    with pytest.raises(FileFormatError, match="coordinates"):
        CorticalSheet.load(tmp_path / "nocoords.npz")
    np.savez(tmp_path / "short.npz", **{**fields, "coordinates": fields["coordinates"][:20]})
    with pytest.raises(FileFormatError, match=r"\(24, 2\)"):
        CorticalSheet.load(tmp_path / "short.npz")
    pkl = tmp_path / "damaged.pkl"
    dump_as_spacetorch(tdann_positions(), pkl, protocol=4)
    pkl.write_bytes(pkl.read_bytes()[:-40])
    with pytest.raises(FileFormatError, match="not a readable positions pickle"):
        CorticalSheet.load(pkl)
    (tmp_path / "dict.pkl").write_bytes(pickle.dumps({"coordinates": np.zeros((2, 2))}))
    with pytest.raises(FileFormatError, match="expected a pickled spacetorch"):
        CorticalSheet.load(tmp_path / "dict.pkl")
    (tmp_path / "positions.txt").write_text("0 0\n")
    with pytest.raises(FileFormatError, match=".npz or .pkl"):
        CorticalSheet.load(tmp_path / "positions.txt")


def test_scaled_sheet_multiplies_positions_and_neighbourhood_width():
    coords = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    sheet = CorticalSheet("s", (3, 1, 1), coords, np.array([[0, 1, 2]]), 1.5)
    doubled = sheet.scaled(2.0)
    assert np.array_equal(doubled.coordinates_mm, 2 * coords)
    assert doubled.neighborhood_width_mm == 3.0 and np.array_equal(doubled.neighborhood_indices, [[0, 1, 2]])
    assert doubled.distances_mm((0.0, 0.0)).tolist() == [0.0, 2.0, 4.0]
    with pytest.raises(ValueError, match="> 0"):
        sheet.scaled(0.0)


def test_a_scaled_sheet_knows_its_frame_and_converts_back():
    sheet = grid_sheet()
    cortex = sheet.scaled(2.5).scaled(2.0)
    assert cortex.cortex_mm_per_model_mm == 5.0 and sheet.cortex_mm_per_model_mm == 1.0
    np.testing.assert_allclose(cortex.coordinates_mm, 5.0 * sheet.coordinates_mm)
    np.testing.assert_allclose(cortex.to_model_mm(cortex.coordinates_mm), sheet.coordinates_mm, rtol=1e-15)
    assert cortex.neighborhood_width_mm == 5.0 * sheet.neighborhood_width_mm or np.isnan(sheet.neighborhood_width_mm)


def test_the_model_makes_its_cortex_frame_once():
    """``in_cortex_mm`` converts by the model's own scale; a converted view converts no further; an override is
    recorded as one, and the model's own scale beside it; both are per mm of the model's own sheet, also when
    asked of a converted view (an override there replaces the conversion rather than stacking on it)."""
    from stimsim.models.registry import load_model

    model = load_model("stimsim-topo-s0")
    own = model.cortex_scale("IT")["cortex_mm_per_model_mm"]
    view, record = model.in_cortex_mm("IT")
    assert record == {"cortex_mm_per_model_mm": own, "model_cortex_mm_per_model_mm": own, "scale_overridden": False}
    np.testing.assert_allclose(view.sheet("IT").coordinates_mm, own * model.sheet("IT").coordinates_mm)
    again, second = view.in_cortex_mm("IT")
    assert again is view and second == record
    assert view.cortex_scale("IT")["sheet_size_cortex_mm"] == model.cortex_scale("IT")["sheet_size_cortex_mm"]
    overridden, third = model.in_cortex_mm("IT", 3.0)
    assert third == {"cortex_mm_per_model_mm": 3.0, "model_cortex_mm_per_model_mm": own, "scale_overridden": True}
    assert overridden.sheet("IT").to_model_mm([[3.0, 6.0]]).tolist() == [[1.0, 2.0]]
    from_view, fourth = view.in_cortex_mm("IT", 3.0)
    assert fourth == third
    np.testing.assert_allclose(from_view.sheet("IT").coordinates_mm, overridden.sheet("IT").coordinates_mm)
    assert from_view.sheet("IT").to_model_mm([[3.0, 6.0]]).tolist() == [[1.0, 2.0]]
    assert model.in_cortex_mm("IT", np.float32(3.0))[1] == third
    for bad in ("3", True, 0.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match=r"cortex_mm_per_model_mm must be a finite number > 0"):
            model.in_cortex_mm("IT", bad)
