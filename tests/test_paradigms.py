"""Tests of experiment files and their runner (stimsim.paradigms): spec parsing, site selection,
the categorisation and same/different paradigms, comparisons with published data."""
import json
import os
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from PIL import Image

from stimsim.cli import main as cli_main
from stimsim.cortex.positions import retinotopic_positions
from stimsim.cortex.sheet import CorticalSheet
from stimsim.data import manifest
from stimsim.data.stimuli import StimulusSet
from stimsim.engine.activation_cache import SAMPLED_ROWS
from stimsim.datasets import afraz2006, moeller2017
from stimsim.models.architectures import build_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.topographic import TopographicModel
from stimsim.paradigms import categorization, load_experiment, parse_experiment, same_different
from stimsim.paradigms.runner import load_results, run_experiment
from stimsim.paradigms.schema import ExplicitSites, FacePatchSites, GridSites, LocalizerFile, SelectivitySites
from stimsim.paradigms.sites import candidate_points_mm, multi_unit_dprime, select_sites
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError, DataError, SafetyError

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
SHARED_DATA = Path(os.environ.get("STIMSIM_MIRROR_DIR") or REPO.parent / "shared" / "data")
IT_UNITS = 256
SHEET_MM = 10.0

needs_shared_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"needs the published data: no mirror at "
                                       f"{SHARED_DATA}; set STIMSIM_MIRROR_DIR")

TINY_CATEGORIZATION = """
name = "tiny_faces"
paradigm = "categorization"
layer = "IT"
seed = 3

[stimuli]
sets = [{ source = "lfw_subset", heldout_only = true }]
label = "category"
positive = "face"
n_per_choice = 10

[stimuli.noise]
signal_percent = [0, 50, 100]

[decoder]
C = 0.01
fit_fraction = 0.5

[sites]
method = "explicit"
sites_mm = [[2.0, 2.0], [5.0, 5.0], [8.0, 3.0]]
groups = ["a", "b", "b"]
recording_radius_mm = 1.5

[stimulation]
kind = "electrical"
current_uA = 100
frequency_Hz = 200
pulse_width_ms = 0.2
train_ms = 50

[analysis]
n_boot = 20
n_perm = 20
"""


# --- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def data_dirs(tmp_path_factory):
    """A private cache, and the shared published data as the mirror."""
    patch = pytest.MonkeyPatch()
    patch.setenv(manifest.CACHE_DIR_ENV, str(tmp_path_factory.mktemp("cache")))
    patch.setenv(manifest.MIRROR_DIR_ENV, str(SHARED_DATA))
    yield
    patch.undo()


@pytest.fixture(scope="module")
def tiny_model():
    """An untrained stimsim_topo network with a 256-unit IT sheet of 10 mm; it lists the first 30
    LFW faces and non-faces as held out by its (notional) training."""
    torch.manual_seed(0)
    kwargs = {"n_classes": 2, "it_units": IT_UNITS}
    network = build_network("stimsim_topo", **kwargs)
    # positions rounded to float32, as a saved model stores them, so a saved copy is the same model
    positions = retinotopic_positions((IT_UNITS, 1, 1), SHEET_MM, seed=2).astype(np.float32).astype(np.float64)
    sheets = {"it": CorticalSheet("it", (IT_UNITS, 1, 1), positions)}
    held = [f"lfw_{kind}_{i:03d}" for kind in ("face", "nonface") for i in range(30)]
    return TopographicModel(network, sheets, Preprocessing(size_px=32, channels=1, mean=(0.45,), std=(0.25,)),
                            {"family": "stimsim_topo", "kwargs": kwargs}, readout_layer="it", areas={"it": "IT"},
                            name="tiny_topo", metadata={"holdout_stimulus_ids": held})


@pytest.fixture(scope="module")
def tiny_toml(tmp_path_factory):
    path = tmp_path_factory.mktemp("experiments") / "tiny_faces.toml"
    path.write_text(TINY_CATEGORIZATION)
    return path


@pytest.fixture(scope="module")
def tiny_run(tiny_toml, tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("run_a")
    summary = run_experiment(tiny_toml, out, model=tiny_model, progress=False)
    return out, summary


def _raw(name: str) -> dict:
    return load_toml(EXPERIMENTS / f"{name}.toml")


def _grid_sheet(step_mm: float = 0.5, size_mm: float = 10.0) -> CorticalSheet:
    axis = np.arange(0.0, size_mm + 1e-9, step_mm)
    xs, ys = np.meshgrid(axis, axis)
    coords = np.stack([xs.ravel(), ys.ravel()], axis=1)
    return CorticalSheet("synthetic", (len(coords), 1, 1), coords)


# --- spec ---------------------------------------------------------------------------------------
def test_shipped_experiment_files_parse():
    afraz = load_experiment(EXPERIMENTS / "afraz2006.toml")
    assert afraz.paradigm == "categorization" and afraz.comparison == "afraz2006"
    assert (afraz.sites.n_selective, afraz.sites.n_other, afraz.sites.dprime_threshold) == (31, 55, 1.0)
    stim = afraz.perturbation_at((1.0, 2.0))
    assert (stim.current_uA, stim.frequency_Hz, stim.pulse_width_ms, stim.train_ms) == (50, 200, 0.2, 50)
    assert stim.sites_mm == ((1.0, 2.0),) and stim.layer == "IT"
    # 50 µA × 0.2 ms = 10 nC on a 2000 µm² tip: D = 500 µC/cm², k = log10(500) + log10(0.01) = 0.699
    assert afraz.safety["passed"] and afraz.safety["shannon_k"] == pytest.approx(0.69897, abs=1e-4)
    muscimol = load_experiment(EXPERIMENTS / "muscimol_categorization.toml")
    assert muscimol.stimulation == {"kind": "muscimol", "volume_uL": 1.0} and muscimol.safety is None


def test_moeller_spec_carries_a_recorded_safety_override():
    spec = load_experiment(EXPERIMENTS / "moeller2017.toml")
    # 300 µA × 0.2 ms = 60 nC: D = 3000 µC/cm², k = log10(3000) + log10(0.06) = 2.255 > 1.85
    assert spec.safety["shannon_k"] == pytest.approx(2.2553, abs=1e-3)
    assert spec.safety["passed"] is False and spec.safety["overridden"] is True
    assert "Moeller et al. 2017" in spec.safety["override_reason"]
    raw = _raw("moeller2017")
    del raw["safety"]["override"]
    with pytest.raises(SafetyError, match="Shannon's k"):
        parse_experiment(raw, where="moeller2017.toml")


@pytest.mark.parametrize("table, key", [
    (None, "stimulus_count"),
    ("stimuli", "labl"),
    ("sites", "n_selectiv"),
    ("decoder", "c"),
    ("stimulation", "current_mA"),
    ("analysis", "n_bootstrap"),
])
def test_unknown_key_refused_and_named(table, key):
    raw = _raw("afraz2006")
    (raw if table is None else raw[table])[key] = 1
    with pytest.raises(ConfigError) as error:
        parse_experiment(raw, where="afraz2006.toml")
    assert key in str(error.value) and "afraz2006.toml" in str(error.value)


@pytest.mark.parametrize("table, key, value, expected", [
    ("stimulation", "current_uA", 5.0, "current_uA"),
    ("stimulation", "pulse_width_ms", -0.2, "pulse_width_ms"),
    ("stimulation", "frequency_Hz", "200 Hz", "frequency_Hz"),
    ("sites", "recording_radius_mm", 0.0, "recording_radius_mm"),
    ("decoder", "fit_fraction", 1.0, "fit_fraction"),
    ("stimuli", "positive", 1, "positive"),
    # a zero too many would fail for memory only after the whole simulation
    ("analysis", "n_boot", 1_000_000, r"\[analysis\]: 'n_boot' must be <= 100000"),
    ("analysis", "n_perm", 100_001, r"\[analysis\]: 'n_perm' must be <= 100000"),
])
def test_bad_values_refused_with_what_is_allowed(table, key, value, expected):
    raw = _raw("afraz2006")
    raw[table][key] = value
    with pytest.raises(ConfigError, match=expected):
        parse_experiment(raw, where="afraz2006.toml")


def test_the_most_resamples_allowed_are_accepted():
    raw = _raw("afraz2006")
    raw["analysis"].update(n_boot=100_000, n_perm=100_000)
    assert parse_experiment(raw, where="afraz2006.toml").raw["analysis"]["n_boot"] == 100_000


def test_bad_values_of_other_blocks_refused():
    raw = _raw("muscimol_categorization")
    raw["stimulation"]["volume_uL"] = -1.0
    with pytest.raises(ConfigError, match=r"volume_uL must be in \[0, 10\] µL"):
        parse_experiment(raw)
    raw = _raw("muscimol_categorization")
    raw["safety"] = {"max_shannon_k": 1.85}
    with pytest.raises(ConfigError, match="electrical stimulation only"):
        parse_experiment(raw)
    raw = _raw("moeller2017")
    raw["pairs"]["stimulated_image"] = "both"
    with pytest.raises(ConfigError, match="stimulated_image"):
        parse_experiment(raw)
    raw = _raw("moeller2017")
    raw["pairs"]["groups"] = ["face", "house"]
    with pytest.raises(ConfigError, match="groups drawn from"):
        parse_experiment(raw)
    raw = _raw("moeller2017")
    raw["stimulation"]["sites_mm"] = [[1.0, 1.0]]
    with pytest.raises(ConfigError, match=r"comes from \[sites\]"):
        parse_experiment(raw)
    raw = _raw("afraz2006")
    del raw["stimuli"]["noise"]
    with pytest.raises(ConfigError, match="afraz2006 comparison needs psychometric shifts"):
        parse_experiment(raw)


# --- sites --------------------------------------------------------------------------------------
def test_multi_unit_dprime_known_value():
    sheet = CorticalSheet("s", (3, 1, 1), [[0.0, 0.0], [0.2, 0.0], [5.0, 5.0]])
    responses = np.array([[1.0, 3.0, 9.0], [3.0, 5.0, 9.0], [0.0, 0.0, 0.0], [2.0, 0.0, 1.0]])
    is_positive = np.array([True, True, False, False])
    values, counts = multi_unit_dprime(responses, is_positive, sheet, [[0.1, 0.0], [9.0, 0.0]], 0.5)
    # mean of units 0 and 1: faces 2 and 4, others 0 and 1 -> d' = (3 - 0.5) / sqrt((2 + 0.5) / 2)
    assert counts.tolist() == [2, 0]
    assert values[0] == pytest.approx(2.5 / np.sqrt(1.25))
    assert np.isnan(values[1])


def _synthetic_face_patch(sheet, centre=(3.0, 3.0), n_images=40, seed=0):
    """Units respond to faces in proportion to a Gaussian bump around ``centre``; noise elsewhere."""
    rng = np.random.default_rng(seed)
    is_face = np.arange(n_images) < n_images // 2
    distance = sheet.distances_mm(centre)
    tuning = 3.0 * np.exp(-distance ** 2 / (2 * 1.0 ** 2)) - 0.5 * (distance > 6)
    responses = rng.normal(0.0, 1.0, (n_images, sheet.n_units)) + np.outer(is_face, tuning)
    return responses, is_face


def test_selectivity_strata_have_requested_sizes_and_d_prime_order():
    sheet = _grid_sheet()
    responses, is_face = _synthetic_face_patch(sheet)
    spec = SelectivitySites(method="selectivity", localizer=LocalizerFile(label="category", positive="face"),
                            n_selective=5, n_other=7, dprime_threshold=1.0, recording_radius_mm=0.6,
                            candidate_step_mm=0.5, min_separation_mm=0.5)
    selection = select_sites(spec, sheet, responses, is_face, seed=1)
    groups = [s.group for s in selection.sites]
    dprimes = np.array([s.dprime for s in selection.sites])
    assert groups == ["selective"] * 5 + ["other"] * 7
    assert np.all(dprimes[:5] > 1.0) and np.all(dprimes[5:] <= 1.0)
    assert np.all(np.diff(dprimes[:5]) <= 0) and np.all(np.diff(dprimes[5:]) <= 0)
    positions = np.array([s.position_mm for s in selection.sites])
    gaps = np.linalg.norm(positions[:, None] - positions[None], axis=-1)[np.triu_indices(12, 1)]
    assert gaps.min() >= 0.5 - 1e-9
    # selective sites sit in the bump around (3, 3)
    assert np.all(np.linalg.norm(positions[:5] - [3.0, 3.0], axis=1) < 2.5)
    assert [s.label for s in selection.sites] == [f"site_{i:03d}" for i in range(12)]
    again = select_sites(spec, sheet, responses, is_face, seed=1)
    assert again.sites == selection.sites
    too_many = spec.model_copy(update={"n_selective": 500})
    with pytest.raises(ConfigError, match="lower n_selective"):
        select_sites(too_many, sheet, responses, is_face, seed=1)
    # a model with no selective patch at all (every unit prefers the other images): said so, with its largest d′
    unselective = np.where(is_face[:, None], 0.0, 1.0) + np.random.default_rng(0).normal(0, 0.3, responses.shape)
    with pytest.raises(ConfigError, match=r"no point of sheet .* has a multi-unit d′ > 1 for the localizer's preferred "
                                          r"class \(the largest is -\d+\.\d\d, on a 0.5 mm grid\): the model has no "
                                          r"patch"):
        select_sites(spec, sheet, unselective, is_face, seed=1)


def test_face_patch_inside_at_peak_and_outside_far_and_unselective():
    sheet = _grid_sheet()
    responses, is_face = _synthetic_face_patch(sheet, centre=(3.0, 6.0))
    spec = FacePatchSites(method="face_patch", localizer=LocalizerFile(label="category", positive="face"),
                          recording_radius_mm=0.6, outside_min_distance_mm=4.0)
    selection = select_sites(spec, sheet, responses, is_face)
    inside, outside = selection.sites
    assert (inside.group, outside.group) == ("inside", "outside")
    assert np.hypot(inside.x_mm - 3.0, inside.y_mm - 6.0) < 0.5
    assert selection.distance_to_peak_mm()[1] >= 4.0
    assert inside.dprime > 2.0 and outside.dprime < 0.0
    # every unit responding alike gives one d′ everywhere: a flat map has no patch centre (not a corner of the sheet)
    alike = np.outer(is_face + np.random.default_rng(1).normal(0.0, 0.5, len(is_face)), np.ones(sheet.n_units))
    with pytest.raises(ConfigError, match=r"d′ map of sheet .* has no peak to place sites by \(every unit has the "
                                          r"value \S+: the map is flat"):
        select_sites(spec, sheet, alike, is_face)


def test_grid_and_explicit_sites(monkeypatch):
    sheet = _grid_sheet()
    points = candidate_points_mm(sheet, step_mm=2.0, margin_mm=1.0)
    assert len(points) == 25 and points.min() == pytest.approx(1.0) and points.max() == pytest.approx(9.0)
    # a margin is named by its key in the files, with the values the sheet allows (its shorter side is 10 mm)
    with pytest.raises(ConfigError, match=r"^\[sites\] 'margin_mm' = 5.2 mm leaves no room on sheet 'synthetic' "
                                          r"\(extent x \[0, 10\], y \[0, 10\] mm\); give 0 to 5 mm$"):
        candidate_points_mm(sheet, step_mm=2.0, margin_mm=5.2)
    with pytest.raises(ConfigError, match=r"^\[sites\] 'margin_mm' must be >= 0 mm .*, got -1; give 0 to 5 mm"):
        candidate_points_mm(sheet, step_mm=2.0, margin_mm=-1.0)
    responses, is_face = _synthetic_face_patch(sheet)
    spec = ExplicitSites(method="explicit", localizer=LocalizerFile(label="category", positive="face"),
                         sites_mm=[[11.0, 2.0]], groups=["x"])
    with pytest.raises(ConfigError, match=r"^\[sites\] 'sites_mm': \(11, 2\) mm lies off sheet .*, which spans x in \["):
        select_sites(spec, sheet, responses, is_face)
    x0, x1, y0, y1 = sheet.extent_mm  # a radius beyond the sheet would give every site the same d′
    wide = ExplicitSites(method="explicit", localizer=LocalizerFile(label="category", positive="face"),
                         sites_mm=[[2.0, 2.0], [8.0, 8.0]], recording_radius_mm=1.01 * max(x1 - x0, y1 - y0))
    with pytest.raises(ConfigError, match=r"^\[sites\] 'recording_radius_mm' = \S+ is larger than sheet .*: every "
                                          r"site would record the whole sheet; give at most"):
        select_sites(wide, sheet, responses, is_face)
    # a grid as wide as the sheet would be one site at the centre; one of millions of sites is refused before any
    # array is laid out, with the memory it would need (the sheet is 10 mm: 10 mm / 1e-5 mm = 1e6 points a side)
    one = GridSites(method="grid", localizer=LocalizerFile(label="category", positive="face"), grid_step_mm=50.0,
                    margin_mm=1.0)
    with pytest.raises(ConfigError, match=r"^\[sites\] 'grid_step_mm' = 50 mm is wider than sheet .* inside its "
                                          r"margin_mm = 1 mm .*: the grid would be one site at the centre; give a step "
                                          r"of at most 8 mm"):
        select_sites(one, sheet, responses, is_face)
    monkeypatch.setattr("stimsim.utilities.limits.available_memory_bytes", lambda: 2**29)
    with pytest.raises(ConfigError, match=r"^a grid of 640,001,600,001 sites 1e-05 mm apart on sheet .* needs about "
                                          rf"{640_001_600_001 * 64 / 2**40:.1f} TiB of memory, more than the 512.0 MiB "
                                          r"this machine has available; "
                                          r"lower the number of sites: widen the grid's step"):
        candidate_points_mm(sheet, step_mm=1e-5, margin_mm=1.0)  # 64 bytes a point
    dense = candidate_points_mm(sheet, step_mm=0.01, margin_mm=1.0)  # 801² points: 41 MB, but each would then
    units = sheet.density_per_mm2 * np.pi  # gather the units within 1 mm and hold its response to every image
    needed = len(dense) * (units * 64 + 16 * len(is_face))
    assert needed > 2**29
    with pytest.raises(ConfigError, match=rf"^the multi-unit responses of 641,601 sites \(about {units:.0f} units "
                                          rf"each\) to {len(is_face)} images needs about {needed / 2**20:.1f} MiB"):
        multi_unit_dprime(responses, is_face, sheet, dense, 1.0)


# --- pairs --------------------------------------------------------------------------------------
def test_sample_pairs_same_and_different_identities():
    identity = np.repeat(["a", "b", "c", "d"], 3)
    group = np.repeat(["face", "face", "object", "object"], 3)
    first, second, pair_group, same = same_different.sample_pairs(identity, group, ("face", "object"), 6, 9, seed=0)
    assert len(first) == 30 and same.sum() == 12
    assert np.all(first != second)
    assert np.all((identity[first] == identity[second]) == same)
    assert np.all(group[first] == pair_group) and np.all(group[second] == pair_group)
    assert len({(a, b) for a, b in zip(first, second)}) == 30
    with pytest.raises(ConfigError, match="offers 12 same pairs"):
        same_different.sample_pairs(identity, group, ("face",), 13, 2, seed=0)


# --- categorisation analysis ----------------------------------------------------------------------
def test_psychometric_shift_recovers_a_known_midpoint_shift():
    levels = np.array([-100.0, -60.0, -30.0, -10.0, 0.0, 10.0, 30.0, 60.0, 100.0])
    truth = np.where(levels >= 0, "face", "nonface")
    ids = [f"s{i}" for i in range(len(levels))]
    test = StimulusSet("synthetic", [np.zeros((4, 4), np.float32)] * len(levels), np.array(ids),
                       {"true_choice": truth, "signed_signal_percent": levels})
    trials = types.SimpleNamespace(test=test, fit=test, choices=("face", "nonface"), positive="face",
                                   psychometric=True)

    def p_face(midpoint):
        return 1.0 / (1.0 + np.exp(-0.08 * (levels - midpoint)))

    curves = np.stack([p_face(5.0), p_face(-7.0), p_face(5.0)])
    probabilities = xr.DataArray(np.stack([curves, 1 - curves], axis=-1), dims=("condition", "stimulus_id", "choice"),
                                 coords={"condition": ["control", "site_000", "site_001"], "stimulus_id": ids,
                                         "choice": ["face", "nonface"]})
    selection = types.SimpleNamespace(
        sites=(types.SimpleNamespace(label="site_000", dprime=2.0),
               types.SimpleNamespace(label="site_001", dprime=0.0)),
        distance_to_peak_mm=lambda: np.array([0.0, 4.0]))
    task = types.SimpleNamespace(analysis=types.SimpleNamespace(n_boot=10, n_perm=10, ci=0.9), seed=0,
                                 sites=types.SimpleNamespace(dprime_threshold=1.0))
    metrics, summary = categorization.analyse(task, trials, probabilities, selection)
    # x50 moves from +5 % to −7 %: 12 % signal towards "face"; the other site changes nothing
    assert metrics["psychometric_shift_percent"].values == pytest.approx([12.0, 0.0], abs=1e-4)
    assert summary["control_midpoint_percent"] == pytest.approx(5.0, abs=1e-4)
    assert summary["model_mean_shift_selective"] == pytest.approx(12.0, abs=1e-4)
    assert summary["model_mean_shift_other"] == pytest.approx(0.0, abs=1e-4)
    assert summary["n_failed_fits"] == 0
    assert metrics["delta_p_positive"].values[0] > 0 and metrics["delta_p_positive"].values[1] == 0


# --- runs ---------------------------------------------------------------------------------------
def test_categorization_run_writes_results_that_reload(tiny_run):
    out, summary = tiny_run
    for name in ("results.nc", "summary.json", "config.json", "decoder.json", "sites.png", "site_effects.png",
                 "psychometric.png"):
        assert (out / name).is_file(), name
    dataset, stored_summary, config = load_results(out)
    assert stored_summary == summary
    assert summary["n_sites"] == 3 and summary["model"] == "tiny_topo"
    # 10 faces + 10 non-faces, half for fitting, 3 signal levels
    assert summary["n_fit_images"] == 30 and summary["n_test_images"] == 30
    for key in ("control_accuracy", "mean_delta_accuracy", "model_r", "model_p", "model_mean_shift_selective",
                "model_mean_shift_other", "n_failed_fits", "control_midpoint_percent"):
        assert key in summary
    probabilities = dataset["choice_probability"]
    assert probabilities.dims == ("condition", "stimulus_id", "choice")
    assert (config["device"], config["scheduler"]) == ("cpu", None) and config["torch_threads"] >= 1
    for name in ("site_x_mm", "unit_y_mm", "distance_to_peak_mm"):  # lengths say which millimetres they are
        assert dataset[name].attrs["units"] == "mm" and dataset[name].attrs["frame"].startswith("cortex mm")
    assert probabilities.sizes == {"condition": 4, "stimulus_id": 30, "choice": 2}
    assert np.allclose(probabilities.sum("choice"), 1.0)
    assert probabilities["current_uA"].values[1:].tolist() == [100.0] * 3
    assert probabilities["condition_site_x_mm"].values[1:].tolist() == [2.0, 5.0, 8.0]
    assert dataset["site_x_mm"].values.tolist() == [2.0, 5.0, 8.0]
    assert dataset["site_group"].values.tolist() == ["a", "b", "b"]
    assert set(np.unique(dataset["signal_percent"].values)) == {0.0, 50.0, 100.0}
    assert dataset["delta_accuracy"].values == pytest.approx(
        dataset["accuracy"].values - float(dataset["control_accuracy"]))
    # only the images the model lists as held out were used
    used = set(config["trials"]["fit_stimulus_ids"] + config["trials"]["test_stimulus_ids"])
    assert all(int(sid.split("_")[2]) < 30 for sid in used)
    assert config["model"]["source"] == "in-memory model" and len(config["model"]["state_sha256"]) == 64
    assert config["experiment"]["name"] == "tiny_faces" and config["experiment"]["seed"] == 3
    assert config["safety"]["passed"] is True
    assert "torch" in config["software"] and config["notes"] == [  # the file gives the train's timing
        "[stimulation] pulse_width_ms, train_ms: a static feed-forward model's responses do not depend on them "
        "(recorded; the pulse width enters the safety gate's charge per phase); runs that differ only there give "
        "the same results"]
    assert json.loads(dataset.attrs["experiment_json"])["stimulation"]["current_uA"] == 100


def test_a_rerun_takes_localizer_responses_and_decoder_features_from_the_activation_cache(
        tiny_model, tiny_toml, tmp_path, monkeypatch):
    monkeypatch.setenv(manifest.CACHE_DIR_ENV, str(tmp_path / "cache"))
    calls = []
    activations = tiny_model.activations
    monkeypatch.setattr(tiny_model, "activations", lambda images, *a, **k: calls.append(len(images))
                        or activations(images, *a, **k))
    first = run_experiment(tiny_toml, tmp_path / "first", model=tiny_model, progress=False, figures=False)
    # the localizer's 60 images (30 held-out faces, 30 non-faces), then the decoder's 30 fit images, once each
    assert calls == [60, 30]
    second = run_experiment(tiny_toml, tmp_path / "second", model=tiny_model, progress=False, figures=False)
    # the re-run computes only the rows the cache checks on reuse: the first, the last and SAMPLED_ROWS others
    assert calls == [60, 30, 2 + SAMPLED_ROWS, 2 + SAMPLED_ROWS]
    assert second == first
    xr.testing.assert_equal(load_results(tmp_path / "first")[0], load_results(tmp_path / "second")[0])


def test_cli_run_with_a_model_directory_reproduces_the_run(tiny_run, tiny_model, tiny_toml, tmp_path, capsys):
    out, summary = tiny_run
    model_dir = tiny_model.save(tmp_path / "model")
    code = cli_main(["run", str(tiny_toml), "--out", str(tmp_path / "out"), "--model", str(model_dir),
                     "--no-progress"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model"]["source"] == str(model_dir)
    assert config["model"]["weights_sha256"] == json.loads((model_dir / "model.json").read_text())[
        "files_sha256"]["weights.pt"]
    # same seed, same weights: the same numbers
    assert printed == summary
    first = xr.load_dataset(out / "results.nc", engine="h5netcdf")
    second = xr.load_dataset(tmp_path / "out" / "results.nc", engine="h5netcdf")
    np.testing.assert_array_equal(first["choice_probability"].values, second["choice_probability"].values)
    np.testing.assert_array_equal(first["psychometric_shift_percent"].values,
                                  second["psychometric_shift_percent"].values)


def test_muscimol_example_runs_at_tiny_size(tiny_model, tmp_path):
    raw = _raw("muscimol_categorization")
    raw["stimuli"].update(sets=[{"source": "lfw_subset", "heldout_only": True}], label="category", n_per_choice=8)
    raw["stimuli"]["noise"]["signal_percent"] = [0, 50, 100]
    raw["sites"].update(grid_step_mm=3.0, recording_radius_mm=1.5)
    raw["analysis"].update(n_boot=20, n_perm=20)
    spec = parse_experiment(raw, where="muscimol_categorization.toml")
    summary = run_experiment(spec, tmp_path, model=tiny_model, progress=False, figures=False)
    dataset, _, config = load_results(tmp_path)
    assert not list(tmp_path.glob("*.png"))
    assert summary["n_sites"] == 9 and summary["site_method"] == "grid"
    assert dataset["kind"].values.tolist() == ["control"] + ["muscimol"] * 9
    assert dataset["volume_uL"].values[1:].tolist() == [1.0] * 9
    assert dataset["volume_uL"].attrs["units"] == "µL"  # a quantity's unit, from its name, in the file too
    assert config["safety"].startswith("not applicable")
    # silencing only removes activity: with 1 µL the site's own units are fully silenced
    assert np.all(np.isfinite(dataset["delta_accuracy"].values))
    assert dataset["distance_to_peak_mm"].sizes == {"site": 9}


def _images_of_any_size() -> StimulusSet:
    """Four face and four non-face textures of 64 × 64 px, a wide face (48 × 96, white with 20 black columns
    on each side) and a non-face of uniform colour (R, G, B) = (0.2, 0.4, 0.6)."""
    rng = np.random.default_rng(7)
    images = [rng.uniform(0, 1, (64, 64)).astype(np.float32) for _ in range(8)]
    wide = np.ones((48, 96), np.float32)
    wide[:, :20] = wide[:, 76:] = 0.0
    colour = np.empty((64, 64, 3), np.float32)
    colour[...] = (0.2, 0.4, 0.6)
    category = ["face"] * 4 + ["nonface"] * 4 + ["face", "nonface"]
    return StimulusSet("any_size", images + [wide, colour], np.asarray([f"img{i}" for i in range(10)]),
                       {"category": np.asarray(category), "source_set": np.full(10, "any_size")})


def test_noise_is_added_at_the_models_input_size(tiny_model):
    """An image shown to the 32 px model at signal level s has exactly round((1 − s/100)·32·32) pixels of its
    network input replaced (0 %: 1024; 15 %: round(870.4) = 870; 50 %: 512; 100 %: 0), whatever its own size
    and colour, because the noise is added after the resize; noise added at 64 px and then resized reaches
    nearly every input pixel. The wide image is centre-cropped before the noise (its black sides never reach
    the network) and the colour one becomes BT.601 luma, 0.299·0.2 + 0.587·0.4 + 0.114·0.6 = 0.363."""
    import tomllib

    from stimsim.data.stimuli import pixel_noise

    raw = tomllib.loads(TINY_CATEGORIZATION)
    del raw["stimuli"]["n_per_choice"]
    raw["stimuli"]["noise"]["signal_percent"] = [0, 15, 50, 100]
    spec = parse_experiment(raw, where="tiny_noise.toml")
    stimuli = _images_of_any_size()
    originals = dict(zip(stimuli.stimulus_id, stimuli.images))
    trials = categorization.categorization_trials(spec.options, spec.decoder, tiny_model, stimuli, spec.seed,
                                                  "tiny_noise.toml")
    replaced = {0.0: 1024, 15.0: 870, 50.0: 512, 100.0: 0}
    clean_input = {}
    for shown in (trials.fit, trials.test):
        for image, level, base in zip(shown.images, shown.labels["signal_percent"], shown.labels["base_stimulus_id"]):
            assert image.shape == (32, 32)
            network_input = tiny_model.preprocess([image])
            resized_clean = tiny_model.preprocess([originals[base]])  # the model's own resize of the clean image
            assert int((network_input != resized_clean).sum()) == replaced[level], (base, level)
            if level == 100.0:
                clean_input[base] = image
    assert len(clean_input) == 10
    assert clean_input["img8"].min() > 0.999
    np.testing.assert_allclose(clean_input["img9"], 0.363, atol=1e-6)
    noise_then_resize = pixel_noise(stimuli.subset([0]), [50], seed=spec.seed)
    changed = (tiny_model.preprocess(noise_then_resize.images) != tiny_model.preprocess([originals["img0"]])).sum()
    assert int(changed) > 0.95 * 1024
    assert trials.record()["pixel_noise"]["size_px"] == 32 and trials.record()["pixel_noise"]["channels"] == 1


def test_colour_non_square_stimulus_tables_as_images_and_localizer(tiny_model, tmp_path):
    """A run on a gray 32 px model whose images are a CSV table of gray and colour images of several sizes
    and whose localizer is an HDF5 table of colour 40 × 56 images: faces bright, non-faces dark."""
    import tomllib

    rng = np.random.default_rng(3)
    rows = ["stimulus_id,path,category"]
    for i in range(12):
        category = "face" if i % 2 else "nonface"
        size = (24 + 8 * (i % 3), 40 - 8 * (i % 4)) + ((3,) if i % 4 < 2 else ())
        level = 0.75 if category == "face" else 0.25
        pixels = np.clip(level + rng.normal(0, 0.1, size), 0, 1)
        Image.fromarray((pixels * 255).astype(np.uint8)).save(tmp_path / f"image{i}.png")
        rows.append(f"image{i},image{i}.png,{category}")
    (tmp_path / "images.csv").write_text("\n".join(rows) + "\n")
    localizer_category = np.asarray(["face", "nonface"] * 8)
    localizer_images = [np.clip(rng.normal(0.75 if c == "face" else 0.25, 0.1, (40, 56, 3)), 0, 1).astype(np.float32)
                        for c in localizer_category]
    StimulusSet("rgb_localizer", localizer_images, np.asarray([f"loc{i}" for i in range(16)]),
                {"category": localizer_category}).to_hdf5(tmp_path / "localizer.h5")
    raw = tomllib.loads(TINY_CATEGORIZATION)
    raw["stimuli"].update(sets=[{"source": "table", "path": str(tmp_path / "images.csv")}], n_per_choice=6)
    raw["sites"]["localizer"] = {"label": "category", "positive": "face",
                                 "sets": [{"source": "table", "path": str(tmp_path / "localizer.h5")}]}
    spec = parse_experiment(raw, where="tiny_tables.toml")
    with pytest.warns(UserWarning, match=r"1 of 12 images are over twice as long as wide.*image11, 16 × 40 px"):
        summary = run_experiment(spec, tmp_path / "out", model=tiny_model, progress=False, figures=False)
    dataset, _, config = load_results(tmp_path / "out")
    assert any("over twice as long as wide" in note for note in config["notes"])
    assert config["site_selection"]["n_localizer_images"] == 16
    assert np.all(np.isfinite(dataset["site_dprime"].values)) and summary["n_sites"] == 3
    # 6 faces + 6 non-faces, half for fitting, 3 signal levels; noise added at the model's 32 px
    assert summary["n_fit_images"] == 18 and summary["n_test_images"] == 18
    assert config["trials"]["pixel_noise"]["size_px"] == 32


def _write_pair_table(directory: Path) -> Path:
    """4 'face' and 4 'object' identities × 3 images (16 px gray) as a stimulus table."""
    rng = np.random.default_rng(0)
    rows = ["stimulus_id,path,identity,category"]
    for category in ("face", "object"):
        for identity in range(4):
            prototype = rng.uniform(0, 1, (16, 16))
            for version in range(3):
                image = np.clip(prototype + rng.normal(0, 0.1, (16, 16)), 0, 1)
                name = f"{category}_{identity}_{version}.png"
                Image.fromarray((image * 255).astype(np.uint8)).save(directory / name)
                rows.append(f"{category}_{identity}_{version},{name},{category}{identity},{category}")
    table = directory / "pairs.csv"
    table.write_text("\n".join(rows) + "\n")
    return table


@needs_shared_data
def test_same_different_run_records_override_and_hit_rates(tiny_model, tmp_path):
    table = _write_pair_table(tmp_path)
    raw = _raw("moeller2017")
    raw["stimuli"]["sets"] = [{"source": "table", "path": str(table)}]
    raw["pairs"].update(n_same_per_group=12, n_different_per_group=12)
    raw["sites"].update(recording_radius_mm=1.5, outside_min_distance_mm=2.0)
    raw["analysis"].update(n_boot=20, n_perm=20)
    spec = parse_experiment(raw, where="moeller2017.toml")
    summary = run_experiment(spec, tmp_path / "out", model=tiny_model, progress=False)
    dataset, _, config = load_results(tmp_path / "out")
    assert config["safety"]["overridden"] is True and "Moeller" in config["safety"]["override_reason"]
    assert "Moeller" in json.loads(dataset.attrs["safety_json"])["override_reason"]
    assert dataset["site_group"].values.tolist() == ["inside", "outside"]
    assert summary["n_test_pairs"] == 24 and summary["stimulated_image"] == "second"
    for key in ("model_same_hit_drop_inside", "model_same_hit_drop_outside", "model_different_hit_drop_inside",
                "model_object_same_hit_drop_inside", "data_same_hit_drop_inside", "data_same_hit_drop_outside"):
        assert key in summary
    drop = summary["model_same_hit_rate_control"] - summary["model_same_hit_rate_inside"]
    assert summary["model_same_hit_drop_inside"] == pytest.approx(drop)
    # the benchmark's score: 1 − mean |model − monkeys' drop| over the 6 published cells of the summary (objects
    # outside the face patches have none)
    cells = [f"{group}{trial}_hit_drop_{location}" for location, groups in (("inside", ("", "object_")),
                                                                           ("outside", ("",)))
             for group in groups for trial in ("same", "different")]
    assert summary["data_object_same_hit_drop_outside"] is None
    assert summary["score"]["metric"] == "hit-drop agreement"
    assert summary["score"]["score"] == pytest.approx(
        1 - np.mean([abs(summary[f"model_{cell}"] - summary[f"data_{cell}"]) for cell in cells]), abs=1e-12)
    assert dataset["hit_rate"].dims == ("site", "pair_group", "trial_type")
    assert dataset["current_uA"].values[1:].tolist() == [300.0, 300.0]
    assert (tmp_path / "out" / "moeller2017_comparison.png").is_file()
    pairs = {p["pair"]: p for p in config["trials"]["pairs"]}
    for pair_id, second, same, category in zip(dataset["stimulus_id"].values, dataset["second_stimulus_id"].values,
                                               dataset["same_identity"].values, dataset["pair_category"].values):
        # every simulated trial is a test pair, stimulated during its second image
        assert not pairs[pair_id]["fit"] and pairs[pair_id]["second"] == second
        assert pairs[pair_id]["same"] == same and pairs[pair_id]["group"] == category
        first_identity, second_identity = pairs[pair_id]["first"].split("_")[1], second.split("_")[1]
        assert (first_identity == second_identity) == same


# --- published data -------------------------------------------------------------------------------
@needs_shared_data
def test_afraz2006_data_known_values():
    data, summary = afraz2006.compare(n_perm=200, n_boot=200, ci=0.95, seed=0)
    assert data.sizes["data_site"] == 86
    selectivity = data["data_face_selectivity"].values
    shift = data["data_psychometric_shift_percent"].values
    assert summary["data_r"] == pytest.approx(np.corrcoef(selectivity, shift)[0, 1])
    assert summary["data_r"] == pytest.approx(0.552, abs=1e-3) and summary["data_p"] < 1e-6
    assert summary["data_n_selective"] == int(np.sum(selectivity > 1))
    assert summary["data_mean_shift_selective"] > summary["data_mean_shift_other"] > 0


@needs_shared_data
def test_moeller2017_pooled_hit_rates_known_values():
    data, summary = moeller2017.compare(["face", "object"], lambda g: "" if g == "face" else f"{g}_")
    # faces inside the patch, monkeys 1 + 2: same hits 613 + 332 of 1084 trials; with stimulation 33 + 36 of 479
    assert summary["data_same_hit_rate_inside_off"] == pytest.approx(945 / 1084)
    assert summary["data_same_hit_rate_inside_on"] == pytest.approx(69 / 479)
    assert summary["data_same_hit_drop_inside"] == pytest.approx(945 / 1084 - 69 / 479)
    assert summary["data_same_hit_drop_outside"] == pytest.approx(57 / 63 - 18 / 21)
    assert summary["data_object_same_hit_drop_outside"] is None
    assert float(data["data_hits"].sel(data_location="inside", pair_group="object", trial_type="same",
                                       stimulation="off")) == 750


# --- shipped model --------------------------------------------------------------------------------
@pytest.mark.slow
def test_muscimol_example_runs_on_the_shipped_model(tmp_path, shared_data):
    shared_data("natural/floc")
    summary = run_experiment(EXPERIMENTS / "muscimol_categorization.toml", tmp_path, progress=False)
    # a 4 mm grid kept 1 mm inside the IT sheet of 13.9 cortex mm (the model's own scale): 3 × 3 sites
    assert summary["model"] == "stimsim-mnv2-s0" and summary["n_sites"] == 9
    assert summary["cortex_mm_per_model_mm"] == summary["model_cortex_mm_per_model_mm"]
    assert summary["control_accuracy"] > 0.6
    # silencing moves choices away from "face" at the face-selective site, more than elsewhere (docs/experiments.md)
    assert summary["model_n_selective"] == 1 and summary["model_r"] < 0  # "at the one face-selective grid site"
    assert summary["model_mean_shift_selective"] < min(0.0, summary["model_mean_shift_other"])
    # the figures docs/experiments.md gives are this run's
    import re

    quoted = re.search(r"shift against d′: r = ([−\d.]+),\s+p = ([\d.]+); ([−+\d.]+) % signal at the one face-selective "
                       r"grid site, ([−+\d.]+) % elsewhere", (REPO / "docs" / "experiments.md").read_text(encoding="utf-8"))
    r, p, selective, other = (float(x.replace("−", "-")) for x in quoted.groups())
    assert summary["model_r"] == pytest.approx(r, abs=0.005) and summary["model_p"] == pytest.approx(p, abs=5e-4)
    assert summary["model_mean_shift_selective"] == pytest.approx(selective, abs=0.05)
    assert summary["model_mean_shift_other"] == pytest.approx(other, abs=0.005)
    quoted = re.search(r"mean Δaccuracy ([−\d.]+); against the distance from the face patch r = ([−\d.]+), p = ([\d.]+)\)",
                       " ".join((REPO / "docs" / "experiments.md").read_text(encoding="utf-8").split()))
    delta, distance_r, distance_p = (float(x.replace("−", "-")) for x in quoted.groups())
    assert summary["mean_delta_accuracy"] == pytest.approx(delta, abs=5e-4)
    assert [summary["delta_accuracy_vs_distance_r"], summary["delta_accuracy_vs_distance_p"]] == pytest.approx(
        [distance_r, distance_p], abs=5e-3)


# --- model-mm ↔ cortex-mm scale -------------------------------------------------------------------
def test_experiment_files_carry_no_scale_and_a_set_scale_is_validated():
    for name in ("afraz2006", "moeller2017", "muscimol_categorization"):
        assert load_experiment(EXPERIMENTS / f"{name}.toml").cortex_mm_per_model_mm is None
    for bad in (0.0, -2.0, 1000.0):
        raw = _raw("afraz2006")
        raw["cortex_mm_per_model_mm"] = bad
        with pytest.raises(ConfigError, match="cortex_mm_per_model_mm"):
            parse_experiment(raw, where="afraz2006.toml")
    raw = _raw("afraz2006")
    raw["cortex_mm_per_model_mm"] = 2.5
    assert parse_experiment(raw).to_dict()["cortex_mm_per_model_mm"] == 2.5


def test_run_uses_the_models_own_scale_and_flags_an_override(tiny_model, tiny_toml, tmp_path):
    import copy

    assert tiny_model.cortex_scale("IT")["cortex_mm_per_model_mm"] == 1.0  # none recorded
    scaled = copy.copy(tiny_model)
    scaled.metadata = {**tiny_model.metadata, "cortex_scale": {
        "layer": "it", "cortex_mm_per_model_mm": 2.0, "rule": "planted rule"}}
    assert scaled.cortex_scale("IT") == {"layer": "it", "cortex_mm_per_model_mm": 2.0,
                                         "sheet_size_cortex_mm": pytest.approx(2 * tiny_model.sheet("it").size_mm, abs=1e-3),
                                         "rule": "planted rule"}
    own = run_experiment(tiny_toml, tmp_path / "own", model=scaled, progress=False, figures=False)
    assert own["cortex_mm_per_model_mm"] == 2.0 and own["scale_overridden"] is False
    assert own["sheet_size_mm"] == pytest.approx(2 * tiny_model.sheet("it").size_mm)
    assert own["scale_rule"] == "planted rule"
    raw = load_toml(tiny_toml)
    raw["cortex_mm_per_model_mm"] = 1.0
    overridden = run_experiment(parse_experiment(raw, where="tiny.toml"), tmp_path / "override", model=scaled,
                                progress=False, figures=False)
    assert overridden["scale_overridden"] is True and overridden["cortex_mm_per_model_mm"] == 1.0
    assert overridden["model_cortex_mm_per_model_mm"] == 2.0
    assert overridden["sheet_size_mm"] == pytest.approx(tiny_model.sheet("it").size_mm)
    config = json.loads((tmp_path / "override" / "config.json").read_text())
    assert any("overriding the model's own 2" in note for note in config["notes"])


def test_scaled_sheet_is_the_same_experiment_in_cortex_millimetres(tiny_model):
    """An ablation of radius r at (x, y) cortex mm on a sheet scaled by k acts on exactly the units an
    ablation of radius r/k at (x/k, y/k) acts on in model mm."""
    from stimsim.behavior import LogisticDecoder
    from stimsim.data.stimuli import lfw_subset
    from stimsim.engine import simulate
    from stimsim.stimulation import Ablation, Condition

    images = lfw_subset().images[::20]
    labels = ["face"] * 5 + ["nonface"] * 5
    decoder = LogisticDecoder.fit(tiny_model.activations(images, "it"), labels, layer="it")
    scaled = tiny_model.with_sheet_scale("IT", 2.0)
    assert scaled.sheet("it").size_mm == pytest.approx(2 * tiny_model.sheet("it").size_mm)
    assert tiny_model.sheet("it").size_mm < SHEET_MM + 1e-9  # the original model is unchanged
    in_cortex = simulate(scaled, images, [Condition("lesion", (Ablation(sites_mm=((8.0, 6.0),), radius_mm=3.0),))],
                         decoder, progress=False)
    in_model = simulate(tiny_model, images, [Condition("lesion", (Ablation(sites_mm=((4.0, 3.0),), radius_mm=1.5),))],
                        decoder, progress=False)
    assert np.array_equal(in_cortex.values, in_model.values)
    unperturbed = simulate(tiny_model, images, [Condition("control")], decoder, progress=False)
    assert not np.allclose(in_model.values, unperturbed.values)


@pytest.mark.slow
def test_afraz_without_the_published_data_names_what_is_missing(tmp_path, monkeypatch, shared_data):
    """On a machine without the data mirror the fLoc images are missing: the error names the entry and how to
    provide it, and no output is left. With the images but without the Afraz 2006 per-site data, the model
    still runs and the summary records that the comparison was skipped."""
    import re

    floc = shared_data("natural/floc")
    trunk_weights = manifest.cache_dir() / "mobilenet_v2_imagenet"
    manifest.entry_path("mobilenet_v2_imagenet")  # the trunk's weights come from PyPI, not the mirror
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "mobilenet_v2_imagenet").symlink_to(trunk_weights)
    monkeypatch.delenv("STIMSIM_MIRROR_DIR", raising=False)
    monkeypatch.setenv("STIMSIM_CACHE_DIR", str(tmp_path / "cache"))
    small = re.sub(r"n_selective = \d+", "n_selective = 3", (EXPERIMENTS / "afraz2006.toml").read_text())
    small = re.sub(r"n_other = \d+", "n_other = 3", small).replace("n_per_choice = 60", "n_per_choice = 20")
    (tmp_path / "small.toml").write_text(re.sub(r"n_(boot|perm) = \d+", r"n_\1 = 50", small))
    with pytest.raises(DataError, match="floc.*STIMSIM_MIRROR_DIR"):
        run_experiment(tmp_path / "small.toml", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    images_only = tmp_path / "mirror"
    (images_only / "natural").mkdir(parents=True)
    (images_only / "natural" / "floc").symlink_to(floc)
    monkeypatch.setenv("STIMSIM_MIRROR_DIR", str(images_only))
    with pytest.warns(UserWarning, match="comparison with 'afraz2006' skipped"):
        summary = run_experiment(tmp_path / "small.toml", tmp_path / "out", progress=False)
    assert summary["model"] == "stimsim-mnv2-s0" and summary["model_n_sites"] == 6
    assert "stimsim data fetch afraz2006" in summary["comparison_skipped"] and "data_r" not in summary
    assert not (tmp_path / "out" / "afraz2006_comparison.png").exists()
    assert (tmp_path / "out" / "results.nc").is_file()


def test_additive_scale_in_sd_of_the_layer_response(tiny_model, tmp_path):
    """``additive_scale = "sd"``: activation_per_Hz is read in SDs of the stimulated layer's response to
    the localizer images and converted to activation units; the conversion is recorded."""
    import tomllib

    from stimsim.data.stimuli import lfw_subset

    raw = tomllib.loads(TINY_CATEGORIZATION)
    raw["stimulation"].update(form="additive", activation_per_Hz=0.01, additive_scale="sd")
    spec = parse_experiment(raw, where="tiny_additive.toml")
    run_experiment(spec, tmp_path, model=tiny_model, progress=False, figures=False)
    dataset, _, config = load_results(tmp_path)
    # the localizer images: the experiment's clean images, i.e. the 60 LFW crops the tiny model lists as held out
    faces = lfw_subset()
    held = np.isin(faces.stimulus_id, tiny_model.metadata["holdout_stimulus_ids"])
    layer_sd = float(np.std(tiny_model.activations([faces.images[i] for i in np.flatnonzero(held)], "it").numpy()))
    scale = config["stimulation_scale"]
    assert scale["additive_scale"] == "sd" and scale["layer_sd"] == pytest.approx(layer_sd, rel=1e-6)
    assert scale["activation_per_Hz"] == pytest.approx(0.01 * layer_sd, rel=1e-6)
    assert dataset["activation_per_Hz"].values[1:] == pytest.approx([0.01 * layer_sd] * 3, rel=1e-6)
    assert any("additive_scale" in note for note in config["notes"])
    raw["stimulation"]["form"] = "multiplicative"
    del raw["stimulation"]["activation_per_Hz"]
    with pytest.raises(ConfigError, match="additive_scale"):
        parse_experiment(raw, where="tiny_additive.toml")


def test_a_run_warns_about_sites_that_reach_no_unit_and_curves_it_cannot_fit(tmp_path, capsys):
    # Tehovnik's law at 1 µA activates a disc 0.03 mm across, which holds no unit of a 32-px model's IT at these
    # points, and 8 images leave the decoder at chance, so no psychometric curve can be fitted
    path = tmp_path / "x.toml"
    path.write_text('name = "x"\nparadigm = "categorization"\nmodel = "stimsim-topo-s0"\nseed = 0\n'
                    '[stimuli]\nsets = [{ source = "lfw_subset" }]\nlabel = "category"\npositive = "face"\n'
                    'n_per_choice = 2\n[stimuli.noise]\nsignal_percent = [0, 25, 50, 100]\n'
                    '[sites]\nmethod = "explicit"\nsites_mm = [[2.0, 2.0], [5.0, 5.0], [8.0, 3.0]]\n'
                    '[stimulation]\nkind = "electrical"\ncurrent_uA = 1\nspread = "tehovnik"\n'
                    '[analysis]\nn_boot = 20\nn_perm = 20\n')
    assert cli_main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "warning: 2 of 3 sites reach no unit of the sheet (site_000, site_001): their perturbation changes " \
           "nothing" in err
    assert "warning: the control's psychometric curve could not be fitted (slope about zero" in err
    results = xr.open_dataset(tmp_path / "out" / "results.nc")
    unreached = results["p_positive_curve"].sel(condition=["site_000", "site_001"]).values
    np.testing.assert_array_equal(unreached, np.broadcast_to(results["p_positive_curve"].sel(condition="control").values,
                                                             unreached.shape))
    results.close()


def test_heldout_only_keeps_every_image_of_a_source_the_model_never_trained_on():
    """A model trained on Fashion-MNIST alone never saw an LFW image: all of them are held out for it (and said
    so); a model trained on LFW keeps only the LFW images its training held out."""
    from types import SimpleNamespace

    from stimsim.data.stimuli import lfw_subset
    from stimsim.paradigms.runner import load_stimuli

    lfw = lfw_subset()
    sets = [{"source": "lfw_subset", "heldout_only": True}]
    for trained_on, held, expected in ((["fashion_mnist"], ["none-of-these"], len(lfw)),
                                       (["lfw_subset", "fashion_mnist"], list(lfw.stimulus_id[:7]), 7)):
        training = {"data": {"sets": [{"source": source} for source in trained_on]}}
        model = SimpleNamespace(name="m", preprocessing=SimpleNamespace(size_px=32),
                                metadata={"holdout_stimulus_ids": held, "training": training})
        notes = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            stimuli = load_stimuli(sets, ["category"], model, notes, "exp.toml [stimuli]")
        assert len(stimuli) == expected
        assert (len(notes) == 1 and "model 'm' was trained on none of source 'lfw_subset'" in notes[0]) == \
            (expected == len(lfw))
    # a split the training took none from is held out whole; the split it took from keeps only what it held out
    fashion = {"data": {"sets": [{"source": "fashion_mnist", "split": "train", "n_per_class": 600}]}}
    model = SimpleNamespace(name="m", preprocessing=SimpleNamespace(size_px=32),
                            metadata={"holdout_stimulus_ids": ["fashion_mnist_train_00000"], "training": fashion})
    for split, expected in (("test", 20), ("train", None)):
        notes = []
        sets = [{"source": "fashion_mnist", "split": split, "n_per_class": 2, "heldout_only": True}]
        if expected is None:
            with pytest.raises(ConfigError, match=r"none of its images is among the 1 the model's training held out"):
                load_stimuli(sets, ["category"], model, notes, "exp.toml [stimuli]")
            continue
        assert len(load_stimuli(sets, ["category"], model, notes, "exp.toml [stimuli]")) == expected
        assert notes == ["exp.toml [stimuli] sets[0] (fashion_mnist_test): heldout_only keeps all 20 images: model 'm' "
                         "was trained on none of source 'fashion_mnist' split 'test' (its training took images from "
                         "['fashion_mnist']; of 'fashion_mnist', from another split)"]


def test_timing_a_static_model_does_not_respond_to_is_noted():
    """A file that sets the train's timing gets a note in config.json that the results do not depend on it (a sweep
    of onset_ms gives the same numbers); a file that leaves it to the defaults gets none."""
    from stimsim.paradigms.runner import _note_timing_without_effect

    notes = []
    _note_timing_without_effect({"kind": "electrical", "current_uA": 50, "train_ms": 100, "onset_ms": 5}, notes)
    assert notes == ["[stimulation] train_ms, onset_ms: a static feed-forward model's responses do not depend on them "
                     "(recorded; the pulse width enters the safety gate's charge per phase); runs that differ only "
                     "there give the same results"]
    quiet = []
    _note_timing_without_effect({"kind": "electrical", "current_uA": 50}, quiet)
    _note_timing_without_effect({"kind": "optogenetic", "onset_ms": 5}, quiet)
    assert quiet == []


def test_the_site_effects_figure_says_which_sites_it_cannot_show(monkeypatch):
    """Sites whose psychometric curve could not be fitted have no shift: the figure counts them in its title, and
    when no site has one its panels say so instead of standing empty."""
    shown = {}
    monkeypatch.setattr(categorization, "save_figure", lambda fig, path: shown.update(figure=fig))
    for shifts, title in (([np.nan, 1.5, np.nan], "2 of 3"), ([np.nan] * 3, "3 of 3")):
        title = f"{title} sites without a fitted curve are not shown"
        dataset = xr.Dataset({"psychometric_shift_percent": ("site", np.array(shifts))},
                             coords={"site": ["a", "b", "c"], "site_group": ("site", ["grid"] * 3),
                                     "site_dprime": ("site", [0.5, 1.5, 2.0]),
                                     "distance_to_peak_mm": ("site", [1.0, 0.5, 0.0])})
        categorization.plot_site_effects(dataset, "unused.png", "effect per site")
        figure = shown.pop("figure")
        assert figure._suptitle.get_text() == f"effect per site\n{title}"
        notes = [text.get_text() for ax in figure.axes for text in ax.texts]
        assert notes == (["no site's curve could be fitted"] * 2 if title.startswith("3") else [])


def test_an_image_without_a_value_of_the_task_label_is_refused(tiny_model, tmp_path):
    """A table row whose class is empty would otherwise count as the negative choice (or a class named '')."""
    import tomllib

    rows = ["stimulus_id,path,category"]
    for i in range(8):
        Image.fromarray(np.full((16, 16), 30 * i, dtype=np.uint8)).save(tmp_path / f"image{i}.png")
        rows.append(f"image{i},image{i}.png,{'face' if i % 2 else ('nonface' if i != 4 else '')}")
    (tmp_path / "images.csv").write_text("\n".join(rows) + "\n")
    raw = tomllib.loads(TINY_CATEGORIZATION)
    raw["stimuli"].update(sets=[{"source": "table", "path": str(tmp_path / "images.csv")}], n_per_choice=3)
    spec = parse_experiment(raw, where="tiny_blank.toml")
    with pytest.raises(ConfigError, match=r"tiny_blank.toml \[stimuli\] sets\[0\].*'category' is empty for 1 of 8 "
                                          r"images \(image4\)"):
        run_experiment(spec, tmp_path / "out", model=tiny_model, progress=False, figures=False)
    assert not (tmp_path / "out").exists()


def test_an_image_repeated_under_another_id_is_noted(tmp_path):
    """The same picture under two stimulus ids could be among both the decoder's fitting images and its test images:
    the run says which ids repeat which."""
    from types import SimpleNamespace

    from stimsim.paradigms.runner import load_stimuli

    rows = ["stimulus_id,path,category"]
    for i in range(4):
        Image.fromarray(np.full((16, 16), 30 * i, dtype=np.uint8)).save(tmp_path / f"image{i}.png")
        rows.append(f"image{i},image{i}.png,{'face' if i % 2 else 'nonface'}")
    rows.append("copy,image1.png,face")
    (tmp_path / "images.csv").write_text("\n".join(rows) + "\n")
    model = SimpleNamespace(name="m", preprocessing=SimpleNamespace(size_px=16), metadata={})
    notes = []
    with pytest.warns(UserWarning, match=r"1 image\(s\) have the same pixels as another image under another "
                                         r"stimulus id \(copy = image1\)"):
        load_stimuli([{"source": "table", "path": str(tmp_path / "images.csv")}], ["category"], model, notes,
                     "exp.toml [stimuli]")
    assert len(notes) == 1 and notes[0].startswith("exp.toml [stimuli]: 1 image(s) have the same pixels")


@pytest.mark.parametrize("decoder_layer, message", [
    ("V9", r"\[decoder\]: 'layer': unknown layer 'V9'"),
    ("pit", r"\[decoder\]: 'layer' = 'pit' \(pit\) comes before the stimulated layer 'IT' \(it\)"),
])
def test_a_decoder_layer_the_run_cannot_use_names_the_decoder_table(tiny_model, tmp_path, monkeypatch, decoder_layer,
                                                                    message):
    import tomllib

    raw = tomllib.loads(TINY_CATEGORIZATION)
    raw["decoder"]["layer"] = decoder_layer
    spec = parse_experiment(raw, where="tiny_decoder.toml")
    # checked before any image is loaded or any activity computed
    monkeypatch.setattr("stimsim.paradigms.runner.load_stimuli", lambda *args: pytest.fail("images were loaded"))
    with pytest.raises(ConfigError, match=r"^tiny_decoder.toml " + message):
        run_experiment(spec, tmp_path / "out", model=tiny_model, progress=False, figures=False)
    assert not (tmp_path / "out").exists()
