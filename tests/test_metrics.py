import csv
import math
from pathlib import Path

import numpy as np
import pytest

from stimsim.behavior.metrics import (
    PearsonResult,
    auc_of_curve,
    bootstrap_ci,
    delta_accuracy,
    delta_auc,
    dprime,
    fit_psychometric,
    pearson_with_permutation,
    psychometric_shift_percent,
)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
AFRAZ_SITES = DATA / "afraz2006" / "sites_stim100-150ms.csv"
MOELLER_SUMMARY = DATA / "moeller2017" / "summary_hits_misses.csv"

#: Signal levels of Afraz et al. 2006 (% signal, signed: negative = non-face images).
SIGNAL_PERCENT = np.array([-50, -40, -25, -15, 0, 15, 25, 40, 50], dtype=float)


def _logistic(x, intercept, slope):
    return 1.0 / (1.0 + np.exp(-(intercept + slope * x)))


# ---------------------------------------------------------------------------------------------
# d'


def test_dprime_known_value_per_unit():
    faces = np.array([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]])  # unit 0: mean 2, var 1; unit 1 constant
    nonfaces = np.array([[-1.0, 5.0], [0.0, 5.0], [1.0, 5.0]])  # unit 0: mean 0, var 1
    np.testing.assert_allclose(dprime(faces, nonfaces), [2.0, 0.0])
    assert dprime(faces[:, 0], nonfaces[:, 0]) == pytest.approx(2.0)
    assert dprime(faces.T, nonfaces.T, axis=1)[0] == pytest.approx(2.0)


def test_dprime_of_two_gaussians():
    rng = np.random.default_rng(0)
    faces = rng.normal(3.0, 2.0, size=(20000, 3))
    nonfaces = rng.normal(1.0, 2.0, size=(20000, 3))
    np.testing.assert_allclose(dprime(faces, nonfaces), 1.0, atol=0.03)
    np.testing.assert_allclose(dprime(nonfaces, faces), -1.0, atol=0.03)


def test_dprime_zero_variance_rule():
    silent = np.zeros((4, 1))
    assert dprime(silent, silent)[0] == 0.0  # no difference, no variance: not selective
    assert dprime(silent + 1.0, silent)[0] == math.inf
    assert dprime(silent, silent + 1.0)[0] == -math.inf


def test_dprime_rejects_bad_input():
    with pytest.raises(ValueError, match="needs at least 2"):
        dprime(np.ones((1, 3)), np.ones((5, 3)))
    with pytest.raises(ValueError, match="must match"):
        dprime(np.ones((4, 3)), np.ones((5, 2)))
    with pytest.raises(ValueError, match="NaN"):
        dprime([1.0, np.nan], [0.0, 1.0])


# ---------------------------------------------------------------------------------------------
# Psychometric fits


def test_fit_recovers_parameters_of_exact_logistic_data():
    fit = fit_psychometric(SIGNAL_PERCENT, _logistic(SIGNAL_PERCENT, 0.4, 0.08))
    assert fit.success and fit.message == "ok"
    assert fit.intercept == pytest.approx(0.4, abs=1e-6)
    assert fit.slope == pytest.approx(0.08, abs=1e-7)
    assert fit.midpoint_percent == pytest.approx(-5.0, abs=1e-5)
    assert fit.signal_range_percent == (-50.0, 50.0)
    np.testing.assert_allclose(fit.predict([-5.0]), 0.5)


def test_fit_with_trial_counts_recovers_midpoint_of_binomial_data():
    rng = np.random.default_rng(3)
    n_trials = np.full(SIGNAL_PERCENT.size, 400)
    p_choice = rng.binomial(n_trials, _logistic(SIGNAL_PERCENT, -0.5, 0.1)) / n_trials
    fit = fit_psychometric(SIGNAL_PERCENT, p_choice, weights=n_trials)
    assert fit.success
    assert fit.midpoint_percent == pytest.approx(5.0, abs=2.0)


def test_shift_towards_face_is_positive_and_exact():
    control = fit_psychometric(SIGNAL_PERCENT, _logistic(SIGNAL_PERCENT - 10.0, 0.0, 0.09))  # x50 = 10 %
    stimulated = fit_psychometric(SIGNAL_PERCENT, _logistic(SIGNAL_PERCENT + 5.0, 0.0, 0.09))  # x50 = -5 %
    assert psychometric_shift_percent(control, stimulated) == pytest.approx(15.0, abs=1e-5)
    assert psychometric_shift_percent(stimulated, control) == pytest.approx(-15.0, abs=1e-5)


def test_flat_curve_is_a_failed_fit_with_nan_not_zero():
    flat = fit_psychometric(SIGNAL_PERCENT, np.full(SIGNAL_PERCENT.size, 0.5))
    assert not flat.success
    assert math.isnan(flat.midpoint_percent)
    assert "slope about zero" in flat.message
    good = fit_psychometric(SIGNAL_PERCENT, _logistic(SIGNAL_PERCENT, 0.0, 0.1))
    assert math.isnan(psychometric_shift_percent(good, flat))
    assert math.isnan(psychometric_shift_percent(flat, good))


@pytest.mark.parametrize(
    "p_choice, reason",
    [
        (_logistic(SIGNAL_PERCENT, 0.0, -0.1), "wrong sign"),
        (_logistic(SIGNAL_PERCENT, -8.0, 0.08), "outside the tested range"),  # x50 = 100 %
        ((SIGNAL_PERCENT > 0).astype(float), "step-like"),  # separated choices
    ],
)
def test_failed_fits_say_why(p_choice, reason):
    fit = fit_psychometric(SIGNAL_PERCENT, p_choice)
    assert not fit.success and math.isnan(fit.midpoint_percent)
    assert reason in fit.message


def test_decreasing_curve_fits_when_allowed():
    fit = fit_psychometric(SIGNAL_PERCENT, _logistic(SIGNAL_PERCENT, 1.0, -0.1), expected_slope_sign=None)
    assert fit.success and fit.midpoint_percent == pytest.approx(10.0, abs=1e-5)


def test_fit_psychometric_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fit_psychometric([0.0, 10.0], [0.2, 1.2])
    with pytest.raises(ValueError, match="at least 2 different signal levels"):
        fit_psychometric([10.0, 10.0], [0.2, 0.4])
    with pytest.raises(ValueError, match="equal length"):
        fit_psychometric([0.0, 10.0, 20.0], [0.2, 0.4])
    with pytest.raises(ValueError, match="expected_slope_sign"):
        fit_psychometric([0.0, 10.0], [0.2, 0.4], expected_slope_sign=2)


# ---------------------------------------------------------------------------------------------
# AUC along a sequence, accuracy


def test_auc_is_normalised_to_the_x_range():
    assert auc_of_curve([0.0, 1.0, 2.0], [0.3, 0.3, 0.3]) == pytest.approx(0.3)
    assert auc_of_curve([-5.0, 5.0], [0.0, 1.0]) == pytest.approx(0.5)
    assert auc_of_curve([0.0, 1.0, 3.0], [0.0, 1.0, 1.0]) == pytest.approx((0.5 + 2.0) / 3.0)


def test_delta_auc_of_identical_and_raised_curves():
    control = _logistic(np.linspace(-3, 3, 7), 0.0, 1.0) * 0.8  # 7-step sequence (Mehrer et al. 2025)
    assert delta_auc(control, control) == 0.0
    assert delta_auc(control + 0.15, control) == pytest.approx(0.15)
    assert delta_auc(control, control + 0.15) == pytest.approx(-0.15)
    sites = np.stack([control, control + 0.1, control + 0.05])  # per-site curves along the last axis
    np.testing.assert_allclose(delta_auc(sites, np.stack([control] * 3)), [0.0, 0.1, 0.05])
    x_sd = np.linspace(-5, 5, 7)  # positions in SD of the site's tuning
    assert delta_auc(control + 0.1, control, x=x_sd) == pytest.approx(0.1)


def test_auc_rejects_bad_input():
    with pytest.raises(ValueError, match="strictly increasing"):
        auc_of_curve([0.0, 0.0, 1.0], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        delta_auc([0.1, 1.5], [0.1, 0.2])
    with pytest.raises(ValueError, match="same shape"):
        delta_auc([0.1, 0.5, 0.6], [0.1, 0.2])


def test_delta_accuracy():
    assert delta_accuracy([True, True, False, False], [True, True, True, False]) == pytest.approx(-0.25)
    assert delta_accuracy([0.9, 0.7], [0.5]) == pytest.approx(0.3)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        delta_accuracy([2.0], [1.0])


@pytest.mark.skipif(not MOELLER_SUMMARY.exists(), reason="shared Moeller 2017 data not available")
def test_moeller_face_patch_stimulation_lowers_same_accuracy():
    with MOELLER_SUMMARY.open() as handle:
        row = next(r for r in csv.DictReader(handle)
                   if r["Stimulus_Class"] == "Faces" and r["Perturbation_Location"] == "within_facepatch"
                   and r["Monkey"] == "1")
    control = np.repeat([True, False], [int(row["Hit_Same"]), int(row["Miss_Same"])])
    stimulated = np.repeat([True, False], [int(row["Hit_Same_MSC"]), int(row["Miss_Same_MSC"])])
    effect = delta_accuracy(stimulated, control)
    assert effect == pytest.approx(33 / 237 - 613 / 670)  # same-hit 91 % -> 14 %
    assert effect < -0.7


# ---------------------------------------------------------------------------------------------
# Uncertainty and correlation


def test_bootstrap_ci_contains_true_mean_and_is_deterministic():
    rng = np.random.default_rng(7)
    sample = rng.normal(0.0, 1.0, size=200)
    sample = (sample - sample.mean()) / sample.std() + 2.0  # mean exactly 2, SD exactly 1
    estimate, low, high = bootstrap_ci(np.mean, sample, n_boot=500, seed=1)
    assert estimate == pytest.approx(2.0)
    assert low < 2.0 < high
    assert high - low == pytest.approx(2 * 1.96 / math.sqrt(200), rel=0.25)  # normal-theory width
    assert bootstrap_ci(np.mean, sample, n_boot=500, seed=1) == (estimate, low, high)
    assert bootstrap_ci(np.mean, sample, n_boot=500, seed=2) != (estimate, low, high)


def test_bootstrap_ci_coverage_is_close_to_nominal():
    rng = np.random.default_rng(11)
    covered = 0
    for _ in range(200):
        sample = rng.exponential(1.0, size=60)  # skewed, true mean 1
        _, low, high = bootstrap_ci(np.mean, sample, n_boot=300, ci=0.9, seed=int(rng.integers(1 << 30)))
        covered += low < 1.0 < high
    assert 0.8 <= covered / 200 <= 0.96


def test_bootstrap_resamples_arrays_jointly():
    x = np.arange(30.0)
    estimate, low, high = bootstrap_ci(lambda a, b: np.mean(a - b), x, x + 1.0, n_boot=200)
    assert (estimate, low, high) == (-1.0, -1.0, -1.0)  # pairs stay together: the difference never varies
    values = bootstrap_ci(lambda a: a.mean(axis=0), np.ones((10, 3)), n_boot=50)
    assert all(v.shape == (3,) for v in values)


def test_bootstrap_rejects_bad_input():
    with pytest.raises(ValueError, match="first axis"):
        bootstrap_ci(np.mean, np.ones(5), np.ones(6))
    with pytest.raises(ValueError, match="ci must"):
        bootstrap_ci(np.mean, np.ones(5), ci=95)
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_ci(np.mean, np.ones(5), n_boot=0)


def test_pearson_with_permutation_known_cases():
    x = np.arange(20.0)
    perfect = pearson_with_permutation(x, 2 * x + 1, n_perm=199)
    assert isinstance(perfect, PearsonResult)
    assert perfect.r == pytest.approx(1.0)
    assert perfect.p_permutation == pytest.approx(1 / 200)  # no shuffle does as well; never 0
    rng = np.random.default_rng(0)
    unrelated = pearson_with_permutation(rng.normal(size=50), rng.normal(size=50), n_perm=500)
    assert unrelated.p_permutation > 0.05 and unrelated.p_parametric > 0.05
    assert abs(unrelated.p_permutation - unrelated.p_parametric) < 0.1
    assert pearson_with_permutation(x, x ** 2, n_perm=100, seed=3) == pearson_with_permutation(
        x, x ** 2, n_perm=100, seed=3)
    with pytest.raises(ValueError, match="vary"):
        pearson_with_permutation(x, np.ones(20))


@pytest.mark.skipif(not AFRAZ_SITES.exists(), reason="shared Afraz 2006 data not available")
def test_afraz_selectivity_predicts_psychometric_shift():
    """Afraz et al. 2006: the more face-selective a site, the larger the shift towards "face"."""
    data = np.genfromtxt(AFRAZ_SITES, delimiter=",", names=True)
    result = pearson_with_permutation(data["face_selectivity"], data["psychometric_shift"], n_perm=999)
    assert result.r == pytest.approx(0.552, abs=0.001)
    assert result.p_parametric < 1e-6
    assert result.p_permutation == pytest.approx(1 / 1000)
    selective = data["face_selectivity"] > 1
    shift_selective, low, high = bootstrap_ci(np.mean, data["psychometric_shift"][selective], n_boot=1000)
    assert low > 0  # face-selective sites shift choices towards "face"


def test_finite_pearson_uses_the_finite_pairs_and_is_undefined_without_spread():
    from stimsim.behavior.metrics import finite_pearson

    # by hand on (1, 2, 3) and (2, 4, 7): Σdx·dy = 5, Σdx² = 2, Σdy² = 38/3, r = 5 / √(76/3)
    assert finite_pearson([1, 2, 3, np.nan], [2, 4, 7, 1]) == pytest.approx(5 / np.sqrt(76 / 3), rel=1e-12)
    assert np.isnan(finite_pearson([1, 2, np.nan], [1, 2, 3]))  # two finite pairs
    assert np.isnan(finite_pearson([1, 2, 3], [5, 5, 5]))  # a constant side
