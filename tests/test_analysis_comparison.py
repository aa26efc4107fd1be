"""Predictions against outcomes, and the whole analysis of planted sessions saved as a result set."""
import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from stimsim.analysis import analyze, compare_predictions, expected_correlation, load_sessions, save_analysis
from stimsim.analysis.synthetic import planted_curves, planted_session
from stimsim.errors import FileFormatError
from stimsim.io import read_result_set


def test_comparison_against_direct_formulas():
    rng = np.random.default_rng(0)
    predicted = rng.normal(0, 0.1, 30)
    observed = 0.5 * predicted + rng.normal(0, 0.03, 30)
    result = compare_predictions(predicted, observed, noise_ceiling=0.64, n_perm=2000, seed=1)
    r = np.corrcoef(predicted, observed)[0, 1]
    slope, intercept = np.polyfit(predicted, observed, 1)
    assert result["predicted_vs_observed_r"] == pytest.approx(r)
    assert result["slope"] == pytest.approx(slope) and result["intercept"] == pytest.approx(intercept)
    assert result["noise_ceiled_r"] == pytest.approx(r / 0.8)
    assert result["predicted_vs_observed_permutation_p"] < 0.01
    low, high = result["predicted_vs_observed_r_null_95"]
    assert low < 0 < high and high < r  # chance interval around 0, below the observed r
    unrelated = compare_predictions(predicted, rng.normal(0, 1, 30), n_perm=2000, seed=1)
    assert unrelated["predicted_vs_observed_permutation_p"] > 0.01


def test_expected_correlation_is_attenuated_by_the_noise_ceiling():
    expected, low, high = expected_correlation(0.8, 0.64, n_sites=40)
    assert expected == pytest.approx(0.64)
    half = 1.959964 / np.sqrt(37)
    assert low == pytest.approx(np.tanh(np.arctanh(0.64) - half), abs=1e-5)
    assert high == pytest.approx(np.tanh(np.arctanh(0.64) + half), abs=1e-5)


def true_delta_auc(stim_logodds, slope_logodds=8.0):
    curves = planted_curves(stim_logodds, slope_logodds)
    area = ((curves[..., 1:] + curves[..., :-1]) / 2 / 6).sum(axis=-1)
    return area[:, 1] - area[:, 0]


def write_plan(directory, electrodes, predicted, predicted_vs_true_r=None):
    directory.mkdir()
    pd.DataFrame({"rank": np.arange(1, len(electrodes) + 1), "electrode_id": electrodes,
                  "predicted_delta_auc": predicted}).to_csv(directory / "sites.csv", index=False)
    summary = {"task": "sequence_2afc", "n_sites": len(electrodes)}
    if predicted_vs_true_r is not None:
        summary["predicted_vs_true_r"] = predicted_vs_true_r
    (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def test_model_that_over_estimates_has_slope_one_half(tmp_path):
    stim_logodds = np.random.default_rng(1).normal(0, 1.0, 30)
    truth = true_delta_auc(stim_logodds)
    electrodes = [str(i + 1) for i in range(30)]
    plan = write_plan(tmp_path / "plan", electrodes, 2 * truth, predicted_vs_true_r=1.0)
    sessions = planted_session(stim_logodds, trials_per_site=800, seed=2)
    sessions.to_csv(tmp_path / "s.csv", index=False)
    loaded = load_sessions(tmp_path / "s.csv", electrodes=electrodes)
    result = analyze(loaded, plan_dir=plan, n_boot=100, n_perm=100, n_splits=20)
    summary = result.summary
    assert summary["slope"] == pytest.approx(0.5, abs=0.08)  # model effects twice the observed ones
    assert summary["predicted_vs_observed_r"] > 0.9
    assert summary["permutation_p"] < 0.01
    assert summary["expected_predicted_vs_observed_r"] == pytest.approx(np.sqrt(summary["noise_ceiling"]))
    low, high = summary["expected_predicted_vs_observed_r_95"]
    assert low <= summary["predicted_vs_observed_r"] <= high
    assert summary["shift_in_predicted_direction"] > 0


def test_expectation_uses_the_plans_truth_on_the_analysed_sites_only(tmp_path):
    # A plan rehearsed 40 sites (its predicted_vs_true_r over all 40); the session holds its 12 top-ranked
    # sites, over which predictions track the truth to another degree (here better: 0.91 against 0.82).
    rng = np.random.default_rng(3)
    true = rng.normal(0, 0.1, 40)
    predicted = true + rng.normal(0, 0.08, 40)
    electrodes = [str(i + 1) for i in range(40)]
    top = np.argsort(-predicted)[:12]
    plan = write_plan(tmp_path / "plan", [electrodes[i] for i in top], predicted[top],
                      predicted_vs_true_r=float(np.corrcoef(predicted, true)[0, 1]))
    summary = json.loads((plan / "summary.json").read_text())
    summary["predicted_delta_auc"] = dict(zip(electrodes, predicted.tolist()))
    summary["true_delta_auc"] = dict(zip(electrodes, true.tolist()))
    (plan / "summary.json").write_text(json.dumps(summary))
    sessions = planted_session(np.linspace(-1, 1, 12), trials_per_site=200, electrodes=[electrodes[i] for i in top])
    result = analyze(sessions, plan_dir=plan, n_boot=20, n_perm=20, n_splits=10).summary
    on_top = np.corrcoef(predicted[top], true[top])[0, 1]
    assert result["plan_predicted_vs_true_r"] == pytest.approx(np.corrcoef(predicted, true)[0, 1])
    assert result["plan_predicted_vs_true_r_these_sites"] == pytest.approx(on_top)
    assert abs(on_top - result["plan_predicted_vs_true_r"]) > 0.05  # the two bases differ here
    assert result["expected_predicted_vs_observed_r"] == pytest.approx(on_top * np.sqrt(result["noise_ceiling"]))


def test_pooled_and_per_subject_summary_and_saved_result_set(tmp_path):
    effects = np.array([1.2, 0.9, 1.5, 0.7, 1.1, 1.3])
    for subject, seed in (("m1", 1), ("m2", 2)):
        planted_session(effects, trials_per_site=300, subject_id=subject, session_id="d1",
                        seed=seed).to_csv(tmp_path / f"{subject}.csv", index=False)
    sessions = load_sessions([tmp_path / "m1.csv", tmp_path / "m2.csv"])
    result = analyze(sessions, n_boot=100, n_perm=200, n_splits=20)
    summary = result.summary
    assert summary["n_sites"] == 12 and summary["n_trials"] == 3600 and summary["n_subjects"] == 2
    # 12 sites × 300 trials: the mean ΔAUC has a standard error of about 0.015
    assert summary["mean_shift"] == pytest.approx(true_delta_auc(effects).mean(), abs=0.045)
    assert summary["wilcoxon_p"] < 0.01 and summary["cohens_d"] > 2
    assert set(summary["per_subject"]) == {"m1", "m2"}
    assert summary["per_subject"]["m1"]["n_sites"] == 6
    out = save_analysis(result, tmp_path / "analysis", report=False)
    assert set(read_result_set(out)) == {"results.nc", "sites.csv", "summary.json"}
    written = json.loads((out / "summary.json").read_text())
    for key in ("n_sites", "n_trials", "mean_shift", "wilcoxon_p", "cohens_d", "noise_ceiling", "provenance"):
        assert key in written
    with xr.open_dataset(out / "results.nc", engine="h5netcdf") as data:
        assert data["n_trials"].sum().item() == 3600
        assert list(data["subject_id"].values[:6]) == ["m1"] * 6
        assert np.allclose(data["delta_auc"].values, result.sites["delta_auc"].values)


def test_plan_without_predictions_is_refused(tmp_path):
    plan = tmp_path / "plan"
    plan.mkdir()
    pd.DataFrame({"electrode_id": ["1"]}).to_csv(plan / "sites.csv", index=False)
    (plan / "summary.json").write_text("{}")
    sessions = planted_session([0.5, 0.2, 0.1], 30)
    with pytest.raises(FileFormatError, match="predicted_delta_auc"):
        analyze(sessions, plan_dir=plan, n_boot=10, n_perm=10, n_splits=2)


def test_top_sites_are_the_plans_top_ranked_given_predictions_else_the_strongest_observed():
    from stimsim.analysis.figures import top_sites

    sites = pd.DataFrame({"delta_auc": [0.01, -0.20, 0.05, 0.10], "predicted_delta_auc": [0.3, 0.0, np.nan, 0.1]})
    order, how = top_sites(sites, n_top=2)
    assert order.tolist() == [0, 3] and "plan" in how
    order, how = top_sites(sites.drop(columns="predicted_delta_auc"), n_top=3)
    assert order.tolist() == [1, 3, 2] and "observed" in how
