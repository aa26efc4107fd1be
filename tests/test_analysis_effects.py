"""Per-site effects and statistics against hand computations, planted truths and direct formulas."""
import itertools
import re

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats

from stimsim.analysis.analyze import analyze
from stimsim.analysis.effects import across_sites, count_trials, delta_auc_of_counts, \
    expected_fdr_discoveries_under_null, fdr_adjusted, fit_grouped_logistic, noise_ceiling_of, site_effects, \
    spearman_brown, split_half_deltas, split_half_reliability
from stimsim.analysis.synthetic import planted_curves, planted_session


def trials(electrode, stimulated, step_choices):
    """Rows of one site: ``step_choices`` = [(step, 'low'|'high'), ...]."""
    return [{"subject_id": "m", "session_id": "s", "electrode": electrode, "step": step,
             "stimulated_electrode": electrode if stimulated else "sham", "current_uA": 50.0 if stimulated else 0.0,
             "choice": choice} for step, choice in step_choices]


def test_delta_auc_by_hand_on_a_tiny_table():
    # 3 steps at x = 0, 0.5, 1. Sham P(high) = 0, 1/2, 1 → AUC = 0.25·(0 + 0.5) + 0.25·(0.5 + 1) = 0.5.
    # Stimulated P(high) = 1/2, 1, 1 → AUC = 0.25·(0.5 + 1) + 0.25·(1 + 1) = 0.875. ΔAUC = 0.375.
    rows = (trials("7", False, [(0, "low"), (0, "low"), (1, "low"), (1, "high"), (2, "high"), (2, "high")])
            + trials("7", True, [(0, "low"), (0, "high"), (1, "high"), (1, "high"), (2, "high"), (2, "high")]))
    sessions = pd.DataFrame(rows)
    counts = count_trials(sessions)
    assert counts.n.tolist() == [[[2, 2, 2], [2, 2, 2]]]
    effects = site_effects(counts, n_boot=200, sessions=sessions, n_perm=200)
    assert effects["delta_auc"].iloc[0] == pytest.approx(0.375)
    assert effects["n_sham"].iloc[0] == 6 and effects["current_uA"].iloc[0] == 50.0


def test_a_trial_table_the_counts_would_misread_is_refused_naming_column_position_and_value():
    # "High" (or a lab's code) was counted as "low": this site's sham curve 0, 1/2, 1 would have read 0, 0, 0
    rows = (trials("7", False, [(0, "low"), (1, "High"), (2, "high")])
            + trials("7", True, [(0, "low"), (1, "high"), (2, "high")]))
    sessions = pd.DataFrame(rows)
    with pytest.raises(ValueError, match=r"column 'choice' must be one of \['low', 'high'\]; 1 row\(s\) are not, "
                                         r"the first at position 1: 'High'"):
        analyze(sessions, n_boot=10, n_perm=10)
    sessions["choice"] = sessions["choice"].str.lower()
    for column, value, message in (("step", -1, r"column 'step' must be an integer >= 0; 6 row\(s\).*: -1"),
                                   ("step", 0.5, r"column 'step' must be an integer >= 0.*: 0.5")):
        with pytest.raises(ValueError, match=message):
            count_trials(sessions.assign(**{column: value}))
    with pytest.raises(ValueError, match=r"missing column\(s\) \['choice'\]"):
        count_trials(sessions.drop(columns="choice"))
    with pytest.raises(ValueError, match="the trial table has no rows"):
        analyze(sessions.iloc[:0], n_boot=10, n_perm=10)
    assert count_trials(sessions).n_high.tolist() == [[[0, 1, 1], [0, 1, 1]]]


@pytest.fixture(scope="module")
def planted():
    rng = np.random.default_rng(3)
    stim_logodds = rng.normal(0.0, 1.0, 60)
    sessions = planted_session(stim_logodds, trials_per_site=600, slope_logodds=8.0, seed=4)
    counts = count_trials(sessions)
    return stim_logodds, sessions, counts, site_effects(counts, n_boot=500, n_perm=300, sessions=sessions, seed=5)


def true_delta_auc(stim_logodds, slope_logodds=8.0):
    curves = planted_curves(stim_logodds, slope_logodds)
    x = np.linspace(0, 1, 7)
    area = ((curves[..., 1:] + curves[..., :-1]) / 2 * np.diff(x)).sum(axis=-1)
    return area[:, 1] - area[:, 0]


def test_planted_effects_recovered_with_calibrated_intervals(planted):
    stim_logodds, _, _, effects = planted
    truth = true_delta_auc(stim_logodds)
    assert np.corrcoef(truth, effects["delta_auc"])[0, 1] > 0.95
    covered = (effects["delta_auc_low"] <= truth) & (truth <= effects["delta_auc_high"])
    assert 0.85 <= covered.mean() <= 1.0  # nominal 95 %, 60 sites
    # logistic regression: the stimulation term is the planted log-odds shift, within its standard errors
    z = (effects["stim_logodds"] - stim_logodds) / effects["stim_logodds_se"]
    assert np.mean(np.abs(z) < 1.96) >= 0.85
    # psychometric shift: x50 moves by c / b of the sequence, i.e. 6·c/8 steps
    shift_truth = 6 * stim_logodds / 8.0
    assert np.corrcoef(shift_truth, effects["shift_steps"])[0, 1] > 0.95
    inside = (effects["shift_steps_low"] <= shift_truth) & (shift_truth <= effects["shift_steps_high"])
    assert inside.mean() >= 0.85
    assert effects["slope_logodds_per_step"].mean() == pytest.approx(8.0 / 6, rel=0.1)


def test_permutation_p_small_for_strong_sites_and_uniformish_for_null(planted):
    stim_logodds, _, _, effects = planted
    strong = np.abs(stim_logodds) > 1.5
    assert (effects["permutation_p"][strong] < 0.01).all()
    null = planted_session(np.zeros(40), trials_per_site=200, seed=9)
    null_effects = site_effects(count_trials(null), n_boot=50, n_perm=200, sessions=null, seed=1)
    assert 0.0 <= np.mean(null_effects["permutation_p"] < 0.05) <= 0.2


def test_site_permutation_p_agrees_with_scipy_exact_test():
    rows = (trials("1", False, [(0, "low"), (1, "low"), (2, "high"), (0, "low"), (1, "high"), (2, "high")])
            + trials("1", True, [(0, "high"), (1, "high"), (2, "high"), (0, "low"), (1, "high"), (2, "high")]))
    sessions = pd.DataFrame(rows)
    counts = count_trials(sessions)
    ours = site_effects(counts, n_boot=10, n_perm=20000, sessions=sessions)["permutation_p"].iloc[0]
    code = sessions["step"].to_numpy() * 2 + (sessions["choice"] == "high").to_numpy()
    stimulated = (sessions["stimulated_electrode"] != "sham").to_numpy()

    def delta(a, b):
        def auc(codes):
            p = [np.mean(codes[codes // 2 == s] % 2) if np.any(codes // 2 == s) else np.nan for s in range(3)]
            return 0.25 * (p[0] + p[1]) + 0.25 * (p[1] + p[2])
        return auc(a) - auc(b)

    exact = stats.permutation_test((code[stimulated], code[~stimulated]), delta, n_resamples=np.inf,
                                   permutation_type="independent", vectorized=False)
    # scipy counts |null| >= |observed| with NaN (emptied steps) never counting, as ours does.
    null = exact.null_distribution
    exact_p = np.mean(np.abs(null) >= abs(exact.statistic) - 1e-12)
    assert ours == pytest.approx(exact_p, abs=0.01)


def test_batched_logistic_fit_equals_statsmodels():
    rng = np.random.default_rng(0)
    x = np.linspace(0, 1, 7)
    n = rng.integers(5, 40, size=(5, 2, 7))
    curves = planted_curves(rng.normal(0, 1, 5), 6.0)
    n_high = rng.binomial(n, curves)
    ours = fit_grouped_logistic(n_high, n, x)
    for i in range(5):
        design = np.column_stack([np.ones(14), np.tile(x, 2), np.repeat([0.0, 1.0], 7)])
        endog = np.column_stack([n_high[i].ravel(), (n[i] - n_high[i]).ravel()])
        reference = sm.GLM(endog, design, family=sm.families.Binomial()).fit().params
        assert ours[i] == pytest.approx(reference, abs=1e-6)
    separated = fit_grouped_logistic(np.array([[0, 0, 0, 5, 5, 5, 5], [0, 0, 0, 5, 5, 5, 5]]), 5, x)
    assert np.isnan(separated).all()  # step-like choices: no maximum-likelihood fit
    # no sham trials: the intercept and the stimulation term cannot be told apart, so there is no fit at all
    # (a nearly singular Newton step had "converged" to one of the infinitely many equal fits)
    no_sham = n.copy()
    no_sham[:, 0] = 0
    assert np.isnan(fit_grouped_logistic(np.where(no_sham > 0, n_high, 0), no_sham, x)).all()
    assert np.isnan(fit_grouped_logistic(np.where(no_sham > 0, n_high, 0)[None].repeat(3, 0), no_sham, x)).all()


def test_wilcoxon_and_cohens_d_against_direct_formulas():
    values = np.array([0.12, -0.03, 0.25, 0.08, -0.11, 0.31, 0.05, 0.19, -0.02, 0.14])
    result = across_sites(values, n_perm=2000, seed=0)
    ranks = stats.rankdata(np.abs(values))
    w_plus, w_minus = ranks[values > 0].sum(), ranks[values < 0].sum()
    assert result["wilcoxon_statistic"] == min(w_plus, w_minus)
    # exact two-sided p by enumerating all 2^10 sign patterns of the ranks
    signs = np.array(list(itertools.product([0, 1], repeat=values.size)))
    w_all = signs @ ranks
    centre = ranks.sum() / 2
    exact_p = np.mean(np.abs(w_all - centre) >= abs(w_plus - centre))
    assert result["wilcoxon_p"] == pytest.approx(exact_p)
    mean = values.sum() / values.size
    sd = np.sqrt(((values - mean) ** 2).sum() / (values.size - 1))
    assert result["cohens_d"] == pytest.approx(mean / sd)
    assert result["mean_shift"] == pytest.approx(mean)
    # sign-flip permutation of the mean, enumerated
    flipped = np.where(signs == 1, 1, -1) * np.abs(values)
    exact_perm = np.mean(np.abs(flipped.mean(axis=1)) >= abs(mean) - 1e-12)
    assert result["mean_shift_permutation_p"] == pytest.approx(exact_perm, abs=0.02)


def test_nan_sites_are_left_out_and_counted():
    result = across_sites([0.1, np.nan, 0.2, 0.3], n_perm=100)
    assert result["n_sites"] == 3 and result["n_sites_without_effect"] == 1
    assert result["mean_shift"] == pytest.approx(0.2)
    assert result["wilcoxon_p_undefined_reason"] is None


def test_statistics_across_sites_say_why_they_are_undefined():
    one = across_sites([0.1, np.nan], n_perm=10)
    assert np.isnan(one["wilcoxon_p"]) and np.isnan(one["cohens_d"])
    assert one["wilcoxon_p_undefined_reason"].startswith("1 site(s) with an effect")
    same = across_sites([0.05, 0.05, 0.05], n_perm=10)
    assert np.isnan(same["cohens_d"]) and "no spread" in same["cohens_d_undefined_reason"]


def test_spearman_brown_on_known_numbers():
    assert spearman_brown(0.5) == pytest.approx(2 / 3)
    assert spearman_brown(0.6, factor=3) == pytest.approx(1.8 / 2.2)
    assert spearman_brown(np.array([0.0, 1.0])).tolist() == [0.0, 1.0]


def test_spearman_brown_has_no_value_for_a_negative_correlation():
    # 2r/(1+r) would be -2 at r = -0.5 and -inf at r = -1: no reliability, so NaN, never a number.
    assert np.isnan(spearman_brown(-0.5)) and np.isnan(spearman_brown(-1.0))
    assert np.isnan(spearman_brown(np.array([-0.2, 0.5]))).tolist() == [True, False]
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        spearman_brown(1.5)
    assert np.isnan(noise_ceiling_of(0.0)[0]) and "<= 0" in noise_ceiling_of(0.0)[1]
    assert noise_ceiling_of(0.25) == (pytest.approx(0.5 / 1.25), None)


def one_half_each(electrode, stimulated, choices_per_step):
    """Two trials per step of one site: ``choices_per_step`` per step, 'mixed' (one low, one high),
    or 'low' / 'high' (both)."""
    pairs = {"mixed": ("low", "high"), "low": ("low", "low"), "high": ("high", "high")}
    return trials(electrode, stimulated, [(step, choice) for step, kind in enumerate(choices_per_step)
                                          for choice in pairs[kind]])


def test_split_halves_that_disagree_give_an_undefined_noise_ceiling():
    """Every cell holds 2 trials, one "low" and one "high": a split puts one in each half, so every
    P(high) of the second half is 1 minus the first half's, AUC(second) = 1 − AUC(first) in both
    conditions and ΔAUC(second) = −ΔAUC(first) at every site: the split-half r is −1 exactly
    (Spearman–Brown: 2r/(1+r) = −∞). The noise ceiling is undefined, with the reason."""
    rows = []
    for electrode in ("1", "2", "3", "4", "5", "6"):
        rows += one_half_each(electrode, False, ["mixed"] * 7) + one_half_each(electrode, True, ["mixed"] * 7)
    counts = count_trials(pd.DataFrame(rows))
    reliability = split_half_reliability(counts, split_half_deltas(counts, 30, 0))
    assert reliability["split_half_r"] == pytest.approx(-1.0)
    assert np.isnan(reliability["noise_ceiling"])
    assert "split-half r = -1 <= 0" in reliability["noise_ceiling_undefined_reason"]
    assert "not reliable at this trial count" in reliability["noise_ceiling_undefined_reason"]


def test_split_halves_that_agree_give_a_noise_ceiling_of_one():
    """Cells of 2 equal choices: both halves hold the same P(high), so ΔAUC agrees exactly, r = 1,
    and 2·1/(1 + 1) = 1."""
    rows = []
    for electrode, kinds in (("1", ["low"] * 3 + ["high"] * 4), ("2", ["low"] * 4 + ["high"] * 3),
                             ("3", ["low"] * 2 + ["high"] * 5), ("4", ["low"] * 5 + ["high"] * 2)):
        rows += one_half_each(electrode, False, ["low"] * 4 + ["high"] * 3) + one_half_each(electrode, True, kinds)
    counts = count_trials(pd.DataFrame(rows))
    reliability = split_half_reliability(counts, split_half_deltas(counts, 10, 0))
    assert reliability["split_half_r"] == pytest.approx(1.0)
    assert reliability["noise_ceiling"] == pytest.approx(1.0)
    assert reliability["noise_ceiling_undefined_reason"] is None


def test_too_few_sites_for_a_split_half_r_are_named_as_the_reason():
    """Two sites with a ΔAUC: no correlation across sites exists, whatever the trial count."""
    rows = []
    for electrode in ("1", "2"):
        rows += (one_half_each(electrode, False, ["low"] * 4 + ["high"] * 3)
                 + one_half_each(electrode, True, ["high"] * 7))
    counts = count_trials(pd.DataFrame(rows))
    reliability = split_half_reliability(counts, split_half_deltas(counts, 5, 0))
    assert np.isnan(reliability["split_half_r"]) and np.isnan(reliability["noise_ceiling"])
    assert reliability["noise_ceiling_undefined_reason"] == ("no split-half r: 2 site(s) have a ΔAUC, and a "
                                                             "correlation across sites needs 3 or more")


def test_site_with_an_empty_step_has_no_delta_auc_and_says_why():
    full = ["mixed"] * 7
    rows = (one_half_each("1", False, full) + one_half_each("1", True, full)
            + [row for row in one_half_each("2", False, full) if row["step"] != 3]
            + [row for row in one_half_each("2", True, full) if row["step"] not in (0, 6)]
            + one_half_each("3", False, full))
    sessions = pd.DataFrame(rows)
    effects = site_effects(count_trials(sessions), n_boot=20, n_perm=20, sessions=sessions)
    assert effects["delta_auc"].iloc[0] == pytest.approx(0.0) and effects["delta_auc_missing_reason"].iloc[0] == ""
    assert np.isnan(effects["delta_auc"].iloc[1])
    assert effects["delta_auc_missing_reason"].iloc[1] == "no sham trial at step 3; no stimulated trial at steps 0, 6"
    assert effects["delta_auc_missing_reason"].iloc[2] == "no stimulated trials"


def test_noise_ceiling_matches_the_binomial_reliability(planted):
    """Reliability = var(true ΔAUC) / (var(true) + mean sampling variance of ΔAUC): the sampling
    variance of a trapezoid AUC is Σ w_j² p_j (1 − p_j) / n_j over steps and both conditions."""
    stim_logodds, _, counts, _ = planted
    reliability = split_half_reliability(counts, split_half_deltas(counts, 50, 2))
    truth = true_delta_auc(stim_logodds)
    curves = planted_curves(stim_logodds, 8.0)
    weights = np.full(7, 1 / 6)
    weights[[0, -1]] = 1 / 12
    sampling = (weights ** 2 * curves * (1 - curves) / counts.n).sum(axis=(1, 2))
    expected = truth.var() / (truth.var() + sampling.mean())
    assert reliability["noise_ceiling"] == pytest.approx(expected, abs=0.05)
    r = reliability["split_half_r"]
    assert r > 0 and reliability["noise_ceiling"] == pytest.approx(2 * r / (1 + r))


def test_benjamini_hochberg_by_hand_leaves_untested_sites_out():
    # m = 4 tested: sorted 0.01, 0.03, 0.04, 0.2 → p·m/rank = 0.04, 0.06, 0.0533, 0.2; a running minimum
    # from the largest rank down gives 0.04, 0.0533, 0.0533, 0.2. The NaN site (no ΔAUC) is not a test.
    adjusted = fdr_adjusted([0.01, 0.04, 0.03, 0.2, np.nan])
    assert adjusted[:4] == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.2])
    assert np.isnan(adjusted[4])
    assert np.isnan(fdr_adjusted([np.nan, np.nan])).all()


def test_expected_fdr_discoveries_without_any_effect():
    q = 0.05
    assert expected_fdr_discoveries_under_null(0, q) == 0
    assert expected_fdr_discoveries_under_null(1, q) == pytest.approx(q)
    # m = 2: some site is declared when min p < q/2 or max p < q, P = q (Simes 1986); both when both p < q,
    # P = q². E[R] = P(R >= 1) + P(R = 2) = q + q².
    assert expected_fdr_discoveries_under_null(2, q) == pytest.approx(q + q**2)
    uniform = np.random.default_rng(0).random((100_000, 24))
    declared = (stats.false_discovery_control(uniform, axis=1) < q).sum(axis=1)
    assert expected_fdr_discoveries_under_null(24, q) == pytest.approx(declared.mean(),
                                                                      abs=4 * declared.std() / np.sqrt(declared.size))


def test_fdr_count_keeps_the_strong_sites_and_drops_most_chance_ones():
    strong = np.array([3.0, -3.0, 3.5, -3.5, 4.0, 3.0])
    stim_logodds = np.concatenate([strong, np.zeros(30)])
    sessions = planted_session(stim_logodds, trials_per_site=240, seed=12)
    result = analyze(sessions, n_boot=20, n_perm=400, n_splits=5, seed=2)
    sites, summary = result.sites, result.summary
    p = sites["permutation_p"].to_numpy()
    is_strong = sites["electrode"].astype(int).to_numpy() <= strong.size
    assert (p[is_strong] < 0.01).all()
    assert (sites["p_fdr"][is_strong] < 0.05).all()
    assert np.all(sites["p_fdr"] >= p)  # an adjusted p is never below the raw one
    null_declared_raw = int((p[~is_strong] < 0.05).sum())
    null_declared_fdr = int((sites["p_fdr"][~is_strong] < 0.05).sum())
    assert summary["n_sites_significant"] == strong.size + null_declared_raw
    assert summary["n_sites_significant_fdr"] == strong.size + null_declared_fdr
    assert null_declared_raw >= 1  # this seed's chance discoveries (expected 0.05 × 30 = 1.5) ...
    assert null_declared_fdr < null_declared_raw  # ... which the false discovery rate control removes
    assert summary["n_sites_significant_chance"] == pytest.approx(0.05 * 36)
    assert summary["n_sites_significant_fdr_chance"] == pytest.approx(expected_fdr_discoveries_under_null(36, 0.05))


def test_binomial_noise_of_one_sites_delta_auc_at_400_trials_is_the_figure_the_docs_give():
    """docs/analysis.md: at 400 trials per site the per-site ΔAUC has a binomial noise of about 0.04. Derivation:
    AUC is the trapezoid mean of P̂(high) over 7 steps (weights (½, 1, 1, 1, 1, 1, ½) / 6), each step's P̂ from about
    200 / 7 trials, so Var(AUC) = Σ wᵢ² pᵢ(1 − pᵢ) / (200 / 7) and ΔAUC = AUC(stimulated) − AUC(sham) has twice
    that; on the planted curve (log-odds slope 8 over the sequence) SD(ΔAUC) = 0.037."""
    from docs_figures import REPO

    weights = np.array([0.5, 1, 1, 1, 1, 1, 0.5]) / 6
    p = planted_curves([0.0])[0, 0]
    derived = np.sqrt(2 * np.sum(weights ** 2 * p * (1 - p)) / (200 / 7))
    assert derived == pytest.approx(0.037, abs=5e-4)
    sessions = planted_session(np.zeros(3000), trials_per_site=400, seed=4)
    counts = count_trials(sessions)
    simulated = np.nanstd(delta_auc_of_counts(counts.n_high, counts.n, counts.steps), ddof=1)
    assert simulated == pytest.approx(derived, rel=0.08)  # steps drawn at random add a little to the fixed split
    page = " ".join((REPO / "docs" / "analysis.md").read_text(encoding="utf-8").split())
    quoted = re.search(r"binomial noise of one site's ΔAUC at 400 trials \(about ([\d.]+):", page)
    assert quoted and round(simulated, 2) == float(quoted.group(1))

