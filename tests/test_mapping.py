"""Mapping: ridge predictivity and model selection, registration recovery of a planted pose,
bootstrap stability, back-mapping, and bad input."""
import numpy as np
import pytest

from stimsim.lab.arrays import AnatomicalPose, ArrayPose, pose_error, utah_array
from stimsim.mapping import (RegistrationProblem, bootstrap_registration, cross_validated_r2, register, select_model,
                             selection_bootstrap)
from stimsim.models.registry import load_model
from stimsim.subject import VirtualSubject
from stimsim.utilities.errors import ConfigError, DataError

STIMULI = [{"source": "lfw_subset"}, {"source": "fashion_mnist", "split": "test", "n_per_class": 10, "seed": 1}]


@pytest.fixture(scope="module")
def model():
    """The planning model with its IT sheet in cortex mm (the frame of array pitch and poses)."""
    return load_model("stimsim-topo-s2").in_cortex_mm("IT")[0]


@pytest.fixture(scope="module")
def recorded(model, one_torch_thread):
    """Subject = the planning model (same instance), 10×10 array at a hidden pose drawn from the seed,
    Poisson trial noise, 5 % dead electrodes, 300 images × 2 repeats."""
    config = {"subject": {"model": "stimsim-topo-s2", "seed": 21},
              "array": {"layout": "10x10", "dead_fraction": 0.05},
              "recording": {"repeats": 2, "noise": "poisson"}, "stimuli": STIMULI}
    subject = VirtualSubject.create(config, model=model)
    recordings = subject.record()
    problem = RegistrationProblem(recordings.per_image(), model, subject.stimuli(), recordings.layout,
                                  electrodes=subject.working_electrodes)
    return subject, recordings, problem


def test_ridge_predictivity_recovers_a_planted_linear_code():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(300, 40))
    signal = features @ rng.normal(size=(40, 5))
    noise_sd = signal.std(0) / 3            # explainable variance fraction = 9 / (9 + 1) = 0.9
    responses = signal + rng.normal(size=signal.shape) * noise_sd
    r2 = cross_validated_r2(features, responses, n_folds=10, seed=0)
    assert np.all(r2 > 0.8) and np.all(r2 <= 0.92)
    chance = cross_validated_r2(features[rng.permutation(300)], responses, n_folds=10, seed=0)
    assert np.all(chance < 0.05)


def test_same_instance_registration_recovers_the_hidden_pose(recorded, model):
    subject, recordings, problem = recorded
    reliability = recordings.split_half_reliability(seed=0, n_splits=2)
    registration = register(recordings.per_image(), model, subject.stimuli(), recordings.layout,
                            reliability=reliability, problem=problem)
    errors = pose_error(registration.pose, subject.pose)
    assert errors["pose_error_mm"] <= 0.2
    assert errors["pose_error_deg"] <= 5.0
    assert registration.mean_correlation > registration.chance_mean_correlation_p95
    # the fit's per-electrode r: working electrodes well fitted, dead ones at chance
    working = registration.electrode_correlation.sel(electrode=list(subject.working_electrodes))
    dead = registration.electrode_correlation.sel(electrode=list(subject.dead_electrodes))
    assert float(working.median()) > 0.5 and np.all(np.abs(dead.values) < 0.3)
    ceiled = registration.noise_ceiled_correlation.sel(electrode=list(subject.working_electrodes))
    # r / √reliability: never smaller in size (an electrode over silent units can correlate negatively)
    finite = np.isfinite(ceiled.values)
    assert finite.mean() > 0.9
    assert np.all(np.abs(ceiled.values[finite]) >= np.abs(working.values[finite]) - 1e-12)
    true_sites = subject.electrode_sites_mm()
    fitted_sites = registration.electrode_sites_mm()
    assert max(np.hypot(*np.subtract(true_sites[e], fitted_sites[e])) for e in true_sites) < 0.3


def test_bootstrap_spread_is_small_for_a_well_determined_pose(recorded, model):
    subject, recordings, problem = recorded
    boot = bootstrap_registration(recordings.per_image(), model, subject.stimuli(), recordings.layout,
                                  n_boot=3, seed=0, problem=problem)
    assert boot.sd_x_mm < 0.1 and boot.sd_y_mm < 0.1 and boot.sd_rotation_deg < 2.0
    assert float(boot.electrode_consistency.min()) == 1.0
    assert set(boot.to_dict()) >= {"sd_x_mm", "sd_y_mm", "sd_rotation_deg", "electrode_consistency"}


def test_model_selection_ranks_the_subjects_own_instance_first(model, one_torch_thread):
    config = {"subject": {"model": "stimsim-topo-s2", "seed": 5}, "array": {"layout": "8x8"},
              "recording": {"repeats": 2}, "stimuli": [{"source": "lfw_subset"}]}
    subject = VirtualSubject.create(config, model=model)
    per_image = subject.record().per_image()
    table, scores = select_model(per_image, {"stimsim-topo-s2": model, "stimsim-topo-s0": load_model("stimsim-topo-s0")},
                                 subject.stimuli(), n_folds=5)
    assert table["model"].tolist()[0] == "stimsim-topo-s2"
    assert list(table["rank"]) == [1, 2]
    assert np.all(table["median_r2"] > table["chance_median_r2"])
    assert scores["stimsim-topo-s2"].sizes["electrode"] == 64
    first = selection_bootstrap({name: r2.values for name, r2 in scores.items()}, seed=1)
    assert first["stimsim-topo-s2"] >= 0.95 and sum(first.values()) == pytest.approx(1.0)


def test_selection_bootstrap_matches_the_resampling_probability_of_a_median():
    """Three electrodes, R² (1, 0, 0) for A and (0, 1, 1) for B: A's resampled median is 1, and B's then 0, exactly
    when at least two of the three draws are electrode 0 — probability 3·(1/3)²·(2/3) + (1/3)³ = 7/27. A
    candidate better at every electrode is always first; equal candidates tie to the one listed first; NaN
    electrodes are left out of the median."""
    first = selection_bootstrap({"A": [1.0, 0.0, 0.0], "B": [0.0, 1.0, 1.0]}, n_boot=20_000, seed=3)
    assert first["A"] == pytest.approx(7 / 27, abs=0.01) and first["A"] + first["B"] == pytest.approx(1.0)
    assert selection_bootstrap({"A": [0.5, 0.6, 0.7], "B": [0.4, 0.5, 0.6]}, n_boot=200) == {"A": 1.0, "B": 0.0}
    assert selection_bootstrap({"A": [0.5, 0.6], "B": [0.5, 0.6]}, n_boot=200) == {"A": 1.0, "B": 0.0}
    # A's median is 0.5 whatever is drawn (NaN left out; all NaN ranks it last), B's 0.4 when two or more draws
    # are electrodes 0 or 2: 3·(2/3)²·(1/3) + (2/3)³ = 20/27
    first = selection_bootstrap({"A": [0.5, np.nan, 0.5], "B": [0.4, 0.9, 0.4]}, n_boot=20_000)
    assert first["A"] == pytest.approx(20 / 27, abs=0.01)
    with pytest.raises(ConfigError, match="n_boot must be >= 1"):
        selection_bootstrap({"A": [0.5]}, n_boot=0)
    for unusable in ({"A": [0.5, 0.6], "B": [0.5]}, {"A": []}, {}):
        with pytest.raises(ConfigError, match="the R² of the same electrodes"):
            selection_bootstrap(unusable)


def test_back_mapping_to_electrodes_array_mm_and_anatomy(recorded, model):
    subject, recordings, problem = recorded
    registration = register(recordings.per_image(), model, subject.stimuli(), recordings.layout, problem=problem)
    sites = registration.electrode_sites_mm()
    anatomy = AnatomicalPose(ap_mm=12.0, ml_mm=-18.0, rotation_deg=30.0, hemisphere="left", reference="1")
    table = registration.back_map([sites["17"], sites["80"]], anatomical=anatomy)
    assert table["electrode_id"].tolist() == ["17", "80"]
    np.testing.assert_allclose(table["distance_mm"], 0.0, atol=1e-9)
    np.testing.assert_allclose(table.loc[0, ["array_x_mm", "array_y_mm"]].to_numpy(float),
                               utah_array("10x10").position_of("17"))
    np.testing.assert_allclose(table.loc[1, ["ap_mm", "ml_mm"]].to_numpy(float),
                               anatomy.electrode_coordinates(utah_array("10x10"))["80"])
    sites_table = registration.site_table(anatomy)
    assert sites_table["electrode_id"].tolist() == list(recordings.layout.electrode_ids)
    first = sites_table["electrode_id"].iloc[0]  # points in the registered sheet's frame (cortex mm here)
    assert sites_table.loc[0, ["sheet_x_mm", "sheet_y_mm"]].tolist() == list(sites[first])
    with pytest.raises(ConfigError, match=r"back_map takes finite \(x, y\) points in mm.*with NaN or infinity"):
        registration.back_map([(np.nan, 1.0)])
    np.testing.assert_allclose(sites_table.loc[0, ["ap_mm", "ml_mm"]].to_numpy(float), (12.0, -18.0))
    assert registration.to_dict()["pose"] == registration.pose.to_dict()


def test_bad_mapping_input_is_named(recorded, model):
    subject, recordings, _ = recorded
    per_image = recordings.per_image()
    with pytest.raises(DataError, match=r"electrode: 96 recorded electrode\(s\) are not in the array layout"):
        register(per_image, model, subject.stimuli(), utah_array("8x8").subset(["1"]).__class__(
            "other", tuple(f"ch{i}" for i in range(5)), np.zeros((5, 2))))
    with pytest.raises(DataError, match="15 images; 10-fold cross-validation needs at least 20"):
        select_model(per_image.isel(stimulus_id=slice(0, 15)), {"s2": model}, subject.stimuli())
    with pytest.raises(DataError, match="not in the image set"):
        register(per_image, model, subject.stimuli().subset(np.arange(100)), recordings.layout)
    huge = utah_array("10x10", pitch_mm=3.5)  # 31.5 mm across; the 19.7 cortex mm sheet's diagonal is 27.9 mm
    with pytest.raises(ConfigError, match="does not fit on the IT sheet"):
        register(per_image, model, subject.stimuli(), huge)
    with pytest.raises(DataError, match="chosen for registration were not recorded"):
        register(per_image, model, subject.stimuli(), recordings.layout, electrodes=["1", "200"])
    assert ArrayPose(0, 0).scale == 1.0


def test_responses_that_are_not_finite_or_not_a_labelled_table_are_refused(recorded, model):
    """One NaN among 30,000 responses had moved the fitted pose by 6.9 mm without a word."""
    subject, recordings, _ = recorded
    per_image = recordings.per_image()
    working = subject.working_electrodes
    damaged = per_image.copy()
    damaged.loc[{"electrode": working[3], "stimulus_id": per_image["stimulus_id"].values[10]}] = np.nan
    first_image = per_image["stimulus_id"].values[10]
    for call in (lambda: register(damaged, model, subject.stimuli(), recordings.layout, electrodes=working),
                 lambda: select_model(damaged, {"s2": model}, subject.stimuli(), n_folds=3)):
        with pytest.raises(DataError, match=rf"recordings: 1 response\(s\) are NaN or infinite, e.g. electrode "
                                            rf"{working[3]} on image {first_image} \(nan\)"):
            call()
    others = [e for e in working if e != working[3]]
    register(damaged, model, subject.stimuli(), recordings.layout, electrodes=others)  # left out: fitted
    for bad, message in ((per_image.values, "must be an xarray DataArray .* got ndarray"),
                         (per_image.rename(stimulus_id="image"), r"must have the dimensions stimulus_id and "
                                                                 r"electrode, got \('image', 'electrode'\)"),
                         (per_image.drop_vars("stimulus_id"), "need a 'stimulus_id' coordinate")):
        with pytest.raises(ConfigError, match=message):
            register(bad, model, subject.stimuli(), recordings.layout)


def test_optional_scale_recovers_a_stretched_array(model, tmp_path, one_torch_thread):
    # the subject's array is the 10×10 grid at 0.46 mm pitch; the lab's layout says 0.4 mm → scale 1.15
    stretched = utah_array("10x10", pitch_mm=0.46)
    layout_file = tmp_path / "stretched.csv"
    layout_file.write_text("electrode_id,x_mm,y_mm\n" + "".join(
        f"{i},{x},{y}\n" for i, (x, y) in zip(stretched.electrode_ids, stretched.positions_mm)))
    config = {"subject": {"model": "stimsim-topo-s2", "seed": 8},
              "array": {"layout": str(layout_file), "pose": {"x_mm": 5.0, "y_mm": 4.8, "rotation_deg": 200.0}},
              "recording": {"repeats": 2}, "stimuli": STIMULI}
    subject = VirtualSubject.create(config, model=model)
    per_image = subject.record().per_image()
    fit = register(per_image, model, subject.stimuli(), utah_array("10x10"), allow_scale=True)
    assert fit.pose.scale == pytest.approx(1.15, abs=0.05)
    errors = pose_error(fit.pose, subject.pose)
    assert errors["pose_error_mm"] <= 0.2 and errors["pose_error_deg"] <= 5.0


def test_correlation_maps_equal_numpy_pearson_r_also_on_bootstrap_resamples(recorded):
    _, _, problem = recorded
    rows = np.random.default_rng(3).integers(0, len(problem.responses), len(problem.responses))
    maps = problem.pooled.correlation_maps(problem.responses, rows)
    pooled = problem.pooled.pooled
    for electrode, (iy, ix) in [(0, (10, 20)), (40, (50, 61)), (80, (90, 5))]:
        point = iy * len(problem.pooled.grid_x) + ix
        expected = np.corrcoef(problem.responses[rows, electrode], pooled[rows, point])[0, 1]
        assert maps[electrode, iy, ix] == pytest.approx(expected, abs=1e-10)
    # the pooled response at a grid point is the Gaussian-weighted mean of the units around it
    sigma = problem.settings.pooling_sigma_mm
    point_xy = np.array([problem.pooled.grid_x[20], problem.pooled.grid_y[10]])
    d2 = ((problem.sheet.coordinates_mm - point_xy) ** 2).sum(1)
    w = np.where(d2 <= (3 * sigma) ** 2, np.exp(-d2 / (2 * sigma ** 2)), 0.0)
    np.testing.assert_allclose(pooled[:, 10 * len(problem.pooled.grid_x) + 20],
                               problem.pooled.activations @ (w / w.sum()), rtol=1e-10)
