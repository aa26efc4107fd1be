"""Power of planned sessions against the normal-theory power of the per-site test, and null rates."""
import hashlib
import html as html_module
import json
import re

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats

from stimsim.analysis.power import curves_from_plan, lower_median, power_analysis
from stimsim.analysis.synthetic import planted_curves
from stimsim.cli import main
from stimsim.utilities.errors import ConfigError, FileFormatError
from stimsim.utilities import io
from stimsim.utilities.io import read_result_set


def analytic_site_power(curves, trials_per_site, alpha=0.05):
    """Power of a two-sided z test of ΔAUC: Φ(|δ|/σ − z_{1−α/2}), σ² = Σ w² p (1 − p) / n per cell with
    n = trials / 2 / 7 (balanced steps), w the trapezoid weights of 7 steps on [0, 1]."""
    weights = np.full(7, 1 / 6)
    weights[[0, -1]] = 1 / 12
    delta = (curves @ weights) @ np.array([-1.0, 1.0])
    sigma = np.sqrt((weights**2 * curves * (1 - curves)).sum(axis=(1, 2)) / (trials_per_site / 14))
    return stats.norm.cdf(np.abs(delta) / sigma - stats.norm.ppf(1 - alpha / 2))


def test_site_power_matches_normal_theory_and_null_rate():
    curves = planted_curves([0.4, 0.8, -0.6, 0.0], slope_logodds=8.0)
    curve, sites, summary = power_analysis(curves, trial_counts=(200, 800), n_sessions=2000, seed=1)
    for count in (200, 800):
        expected = analytic_site_power(curves[:3], count)
        assert sites[f"power_{count}"].iloc[:3].to_numpy() == pytest.approx(expected, abs=0.05)
    # no planned effect: nothing to detect in the planned direction (sign 0)
    assert sites["power_800"].iloc[3] == 0.0 and sites["trials_needed"].iloc[3] is None
    assert summary["site_power_chance"] == 0.025
    # each site's effect as simulated: the trapezoid ΔAUC of its curves (the weights above)
    weights = np.full(7, 1 / 6)
    weights[[0, -1]] = 1 / 12
    np.testing.assert_allclose(sites["simulated_delta_auc"], (curves @ weights) @ np.array([-1.0, 1.0]), atol=1e-12)


def test_null_sites_are_detected_at_alpha_over_two_against_a_planned_direction():
    curves = planted_curves(np.zeros(20))
    _, sites, _ = power_analysis(curves, planned_effect=np.ones(20), trial_counts=(400,), n_sessions=500, seed=2)
    assert sites["power_400"].mean() == pytest.approx(0.025, abs=0.01)


def test_the_site_test_keeps_its_error_rate_with_few_trials_per_cell():
    # 50 trials per site: 3 to 4 per cell, where a cell's own P(high) is often 0 or 1 (no variance); the z test's
    # variance comes from both conditions pooled, so a site without effect is detected at about alpha / 2
    curves = planted_curves(np.zeros(20), slope_logodds=8.0)
    _, sites, _ = power_analysis(curves, planned_effect=np.ones(20), trial_counts=(50,), n_sessions=1000, seed=3)
    assert sites["power_50"].mean() == pytest.approx(0.025, abs=0.015)


def test_trial_counts_below_one_trial_per_step_and_condition_are_refused():
    from stimsim.utilities.errors import ConfigError

    curves = planted_curves([0.5, 1.0, -0.5])  # 7 steps × 2 conditions: a ΔAUC needs 14 trials at least
    with pytest.raises(ConfigError, match=r"^--trials-per-site: trial counts must be integers >= 14 .*got \[13, 100\]"):
        power_analysis(curves, trial_counts=(13, 100), n_sessions=20)
    curve, _, _ = power_analysis(curves, trial_counts=(14,), n_sessions=20)
    assert curve["trials_per_site"].tolist() == [14]
    with pytest.raises(ConfigError, match=r"seed must be an integer from 0 to 4294967295 \(2\*\*32 - 1\), got -1"):
        power_analysis(curves, trial_counts=(14,), n_sessions=20, seed=-1)
    with pytest.raises(ConfigError, match=r"seed must be an integer from 0 to 4294967295"):
        power_analysis(curves, trial_counts=(14,), n_sessions=20, seed=2**64)


def test_a_session_count_beyond_the_memory_available_is_refused_with_the_estimate():
    from stimsim.utilities.errors import ConfigError
    from stimsim.utilities.limits import available_memory_bytes, format_bytes

    curves = planted_curves([0.5, 1.0, -0.5])  # 3 sites × 7 steps × 2 conditions
    needed = 12 * 8 * 10**9 * 3 * 7 * 2
    assert needed > available_memory_bytes()
    with pytest.raises(ConfigError, match=rf"power: 1000000000 sessions of 3 sites × 7 steps × 2 conditions needs about "
                                          rf"{format_bytes(needed)} of memory, more than the [\d.]+ [KMGT]iB this "
                                          rf"machine has available; lower --sessions"):
        power_analysis(curves, trial_counts=(14,), n_sessions=10**9)


def test_power_curve_without_any_r_is_drawn_without_warnings():
    import warnings

    from stimsim.analysis.figures import plot_power_curve

    table = pd.DataFrame({"trials_per_site": [14, 16], "wilcoxon_power": [0.0, 0.0], "mean_site_power": [0.0, 0.01],
                          "observed_vs_true_r": [np.nan, np.nan]})  # no session had 3 sites with a ΔAUC
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        axes = plot_power_curve(table, 0.8).axes[0]
    assert axes.get_ylim() == pytest.approx((-0.02, 1.02))
    table["observed_vs_true_r"] = [-0.3, 0.1]
    assert plot_power_curve(table, 0.8).axes[0].get_ylim() == pytest.approx((-0.32, 1.02))
    levels = {line.get_label(): line.get_ydata()[0] for line in plot_power_curve(table, 0.8, alpha=0.05).axes[0].lines}
    assert levels["chance across sites (0.05)"] == 0.05 and levels["chance per site (0.025); r: 0"] == 0.025


def test_trials_needed_grow_as_effects_shrink_and_wilcoxon_power_rises():
    strong = planted_curves(np.full(10, 1.0))
    weak = planted_curves(np.full(10, 0.5))
    counts = (50, 100, 200, 400, 800, 1600, 3200, 6400)
    curve, strong_sites, strong_summary = power_analysis(strong, trial_counts=counts, n_sessions=200, seed=3)
    _, weak_sites, weak_summary = power_analysis(weak, trial_counts=counts, n_sessions=200, seed=3)
    assert np.all(np.diff(curve["wilcoxon_power"]) >= -0.05) and curve["wilcoxon_power"].iloc[-1] > 0.95
    assert strong_summary["median_site_trials_needed"] < weak_summary["median_site_trials_needed"]
    assert strong_summary["wilcoxon_trials_needed"] <= weak_summary["wilcoxon_trials_needed"]
    with pytest.raises(ValueError, match="p_high must be"):
        power_analysis(strong[:, 0])
    # each power is a proportion of the 200 simulated sessions; its 95 % Wilson interval, written out here
    z, n, p = 1.959964, 200, curve["wilcoxon_power"].to_numpy()
    centre, half = (p + z ** 2 / (2 * n)) / (1 + z ** 2 / n), z / (1 + z ** 2 / n) * np.sqrt(p * (1 - p) / n
                                                                                          + z ** 2 / (4 * n ** 2))
    np.testing.assert_allclose(curve["wilcoxon_power_ci95_low"], centre - half, atol=1e-6)
    np.testing.assert_allclose(curve["wilcoxon_power_ci95_high"], centre + half, atol=1e-6)
    with pytest.raises(ConfigError, match=r"--trials-per-site: 10000000000000000000000 trials per site is beyond any "
                                          r"session; give at most 1,000,000"):
        power_analysis(strong, trial_counts=(50, 10 ** 22))


def test_median_site_trials_needed_is_a_simulated_count():
    # By normal theory (analytic_site_power) log-odds shifts of ±4 reach 80 % power by 200 trials per site
    # (power ≈ 1) and shifts of ±0.5 only at 6,400 (≈ 0.25 at 200, ≈ 1 at 6,400): the sites need 200, 200,
    # 6,400, 6,400; np.median would say 3,300, never simulated; the lower median is 200.
    curves = planted_curves([4.0, -4.0, 0.5, -0.5])
    assert analytic_site_power(curves[:2], 200) == pytest.approx(1.0, abs=1e-3)
    assert np.all(analytic_site_power(curves[2:], 200) < 0.4)
    assert analytic_site_power(curves[2:], 6400) == pytest.approx(1.0, abs=1e-3)
    _, sites, summary = power_analysis(curves, trial_counts=(200, 6400), n_sessions=200, seed=6)
    assert sites["trials_needed"].tolist() == [200, 200, 6400, 6400]
    assert summary["median_site_trials_needed"] == 200 and type(summary["median_site_trials_needed"]) is int
    assert lower_median([1600, 200, 800, 400, 400]) == 400 and lower_median([800, 50]) == 50


def test_observed_vs_true_r_follows_the_reliability_of_the_per_site_effects():
    # 60 sites with effects spread around 0.5 log-odds: classical test theory expects r = sqrt(ρ),
    # ρ = var(true ΔAUC) / (var(true ΔAUC) + mean binomial variance of ΔAUC) at each trial count.
    curves = planted_curves(np.random.default_rng(4).normal(0.5, 0.4, 60))
    weights = np.full(7, 1 / 6)
    weights[[0, -1]] = 1 / 12
    true = (curves @ weights) @ np.array([-1.0, 1.0])
    counts = (100, 400, 1600)
    curve, _, summary = power_analysis(curves, trial_counts=counts, n_sessions=300, seed=5)
    for count, observed in zip(counts, curve["observed_vs_true_r"]):
        noise = ((weights**2 * curves * (1 - curves)).sum(axis=(1, 2)) / (count / 14)).mean()
        assert observed == pytest.approx(np.sqrt(true.var(ddof=1) / (true.var(ddof=1) + noise)), abs=0.04)
    assert curve["observed_vs_planned_r"].to_numpy() == pytest.approx(curve["observed_vs_true_r"].to_numpy())
    reached = [c for c, r in zip(counts, curve["observed_vs_true_r"]) if r >= 0.8]
    assert summary["observed_vs_true_r_trials_needed"] == (reached[0] if reached else None)
    assert summary["true_delta_auc_sd"] == pytest.approx(true.std(ddof=1))
    # For pure log-odds shifts, trapezoid ΔAUC weights the steps almost as the logistic fit's information
    # does (Cauchy–Schwarz efficiency (Σwv)² / (Σw²v · Σv) ≈ 0.99 for these curves, v = p(1 − p)): the
    # per-site stimulation term tracks its own truth about as well as ΔAUC does.
    assert np.all(np.abs(curve["stim_logodds_observed_vs_true_r"] - curve["observed_vs_true_r"]) < 0.05)


def write_virtual_plan(directory, stim_logodds, lapse_rate=0.1):
    """A plan directory as `stimsim plan` writes it for a virtual subject: sites.csv, summary.json and
    the subject's own P(high) per (electrode, stimulated, sequence, step)."""
    electrodes = [str(10 + i) for i in range(len(stim_logodds))]
    curves = planted_curves(stim_logodds)
    (directory / "truth").mkdir(parents=True)
    xr.Dataset({"subject_p_high": (("electrode", "stimulated", "sequence", "step"),
                                   np.repeat(curves[:, :, None, :], 2, axis=2))},
               coords={"electrode": electrodes, "stimulated": [False, True]}).to_netcdf(
        directory / "truth" / "subject_p_high.nc", engine="h5netcdf")
    weights = np.full(7, 1 / 6)
    weights[[0, -1]] = 1 / 12
    pd.DataFrame({"rank": range(1, len(electrodes) + 1), "electrode_id": electrodes,
                  "predicted_delta_auc": (curves @ weights) @ np.array([-1.0, 1.0])}).to_csv(directory / "sites.csv",
                                                                                           index=False)
    (directory / "summary.json").write_text(json.dumps({"chosen_electrodes": electrodes, "subject_lapse_rate": lapse_rate,
                                                        "predicted_vs_true_r": 1.0, "current_uA": 50.0}))
    return directory


def test_power_command_on_a_virtual_subject_plan(tmp_path, capsys):
    plan = write_virtual_plan(tmp_path / "plan", np.array([1.5, -1.2, 1.0, 0.8, -1.0, 1.3]))
    assert main(["power", str(plan), "--trials-per-site", "50", "200", "800", "--sessions", "100"]) == 0
    out = plan / "power"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["simulated_from"].startswith("virtual subject")
    assert summary["wilcoxon_trials_needed"] in (50, 200, 800)
    assert summary["provenance"]["config"]["plan_summary_sha256"] == hashlib.sha256(
        (plan / "summary.json").read_bytes()).hexdigest()  # the plan it was simulated from
    for name in ("report.html", "report.pdf", "power_curve.csv", "power_sites.csv"):
        assert (out / name).stat().st_size > 0
    captured = capsys.readouterr()
    shown = json.loads(captured.out)  # stdout is the JSON summary alone; the sentence goes to stderr
    assert shown["wilcoxon_trials_needed"] == summary["wilcoxon_trials_needed"]
    assert shown["trial_counts"] == [50, 200, 800]
    assert "across sites (Wilcoxon)" in captured.err
    assert "power: trial counts" in captured.err and "3/3" in captured.err  # the bar over the 3 trial counts
    assert main(["power", str(plan), "--trials", "50", "--sessions", "10", "--out", str(tmp_path / "quiet"),
                 "--no-progress"]) == 0
    assert "power: trial counts" not in capsys.readouterr().err
    assert main(["power", str(tmp_path / "typo")]) == 2  # named as missing, and no folder made for it
    assert f"plan directory not found: {tmp_path / 'typo'}" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()
    before = (plan / "summary.json").read_bytes()  # the plan's own folder is never the output, --force or not
    for command in (["power", str(plan)], ["analyze", str(tmp_path / "s.csv"), "--plan", str(plan)]):
        assert main([*command, "--out", str(plan), "--force", "--no-progress"]) == 2
        assert f"--out {plan} is the plan directory the command reads" in capsys.readouterr().err
    assert (plan / "summary.json").read_bytes() == before


@pytest.mark.parametrize("field, value, message", [
    ("subject_lapse_rate", 1.5, "field 'subject_lapse_rate' must lie in [0, 1], got 1.5"),
    ("subject_lapse_rate", -0.2, "field 'subject_lapse_rate' must lie in [0, 1], got -0.2"),
    ("chosen_electrodes", [], "field 'chosen_electrodes' lists no electrode: the plan chose no site to stimulate"),
])
def test_a_plan_summary_outside_its_range_is_refused_by_power_and_session(tmp_path, capsys, field, value, message):
    plan = write_virtual_plan(tmp_path / "plan", np.array([1.0, -0.8]))
    summary = json.loads((plan / "summary.json").read_text())
    (plan / "summary.json").write_text(json.dumps({**summary, field: value}))
    for command in (["power", str(plan), "--trials", "50", "--sessions", "10", "--out", str(tmp_path / "power"),
                     "--no-progress"],
                    ["subject", "session", str(plan), "--trials-per-site", "20", "--out", str(tmp_path / "s.nwb")]):
        assert main(command) == 2
        assert capsys.readouterr().err == f"stimsim: error: {plan / 'summary.json'}: {message}\n"
    assert not (tmp_path / "power").exists() and not (tmp_path / "s.nwb").exists()


def test_power_report_says_when_no_trial_count_reaches_the_target(tmp_path):
    plan = write_virtual_plan(tmp_path / "plan", np.zeros(5))  # no effect: nothing is ever detected
    assert main(["power", str(plan), "--trials", "50", "100", "--sessions", "20"]) == 0
    html = (plan / "power" / "report.html").read_text()
    for label in ("across sites (Wilcoxon)", "per site, lower median"):
        row = html[html.index(label):]
        assert row[:row.index("</tr>")].count("more than 100") == 1, label
    row = html[html.index("across sites (mean)"):]  # equal true effects: r across sites has nothing to follow
    assert "none: the sites&#39; true ΔAUC do not vary (0), so r across sites is undefined" in row[:row.index("</tr>")]


def test_power_report_of_too_few_sites_for_the_test_across_sites_says_so(tmp_path, capsys):
    """Strong effects at 2 sites: the one-sided Wilcoxon p is at least 1/2^2 > 0.05 at any trial count, so the report
    and the sentence on stderr say that no count reaches the power across sites (not "more than 100"); with one site
    no SD of the effects, and the plan's forecast quoted as its report states it. Below 3 sites r across sites is
    undefined, and the report says so rather than "more than 100"."""
    html = {}
    for n_sites in (1, 2, 3):
        plan = write_virtual_plan(tmp_path / f"plan{n_sites}", np.full(n_sites, 2.0))
        summary = json.loads((plan / "summary.json").read_text())
        forecast = {"across_sites": None, "per_site_median": None, "per_site": {}, "largest_simulated": 6400}
        (plan / "summary.json").write_text(json.dumps({**summary, "trials_per_site_needed": forecast}))
        assert main(["power", str(plan), "--trials", "50", "100", "--sessions", "20"]) == 0
        html[n_sites] = html_module.unescape((plan / "power" / "report.html").read_text())
        row = html[n_sites][html[n_sites].index("across sites (Wilcoxon)"):]
        assert (f"none: with {n_sites} site(s) the test across sites can never reach p < 0.05: it needs at least 5"
                in row[:row.index("</tr>")])
        assert (f"its report's first page: no trial count across sites, with {n_sites} site(s) the test across sites "
                "can never reach p < 0.05: it needs at least 5)") in html[n_sites]
        err = capsys.readouterr().err
        assert (f"across sites (Wilcoxon) no trial count reaches it (with {n_sites} site(s) the test across sites can "
                "never reach p < 0.05: it needs at least 5); per site") in err and "more than 100 trials" not in err
        row = html[n_sites][html[n_sites].index("observed vs true ΔAUC r ≥ 0.8"):]
        undefined = f"with {n_sites} site(s) r across sites is undefined: it needs at least 3"
        assert (f"none: {undefined}" in row[:row.index("</tr>")]) == (n_sites < 3)
        power = json.loads((plan / "power" / "summary.json").read_text())
        assert power["wilcoxon_trials_needed_undefined_reason"] == (f"with {n_sites} site(s) the test across sites "
                                                                    "can never reach p < 0.05: it needs at least 5")
        if n_sites < 3:
            assert power["observed_vs_true_r_trials_needed_undefined_reason"] == undefined
        else:  # three sites with one planted effect: r is undefined for want of spread, not of sites
            assert "true ΔAUC do not vary" in power["observed_vs_true_r_trials_needed_undefined_reason"]
    assert "no SD with one site" in html[1] and "SD nan" not in html[1]
    assert re.search(r"SD \d\.\d{4} across the sites", html[2])


def test_power_with_equal_true_effects_says_r_across_sites_is_undefined(tmp_path):
    """Five sites with the same planted shift have the same true ΔAUC, so r of observed against true ΔAUC across sites
    has no spread to correlate with at any trial count: the summary and report say why, not "more than 100"."""
    plan = write_virtual_plan(tmp_path / "plan", np.full(5, 1.0))
    assert main(["power", str(plan), "--trials", "50", "100", "--sessions", "20"]) == 0
    power = json.loads((plan / "power" / "summary.json").read_text())
    reason = power["observed_vs_true_r_trials_needed_undefined_reason"]
    assert reason.startswith("the sites' true ΔAUC do not vary (") and reason.endswith("), so r across sites is undefined")
    assert power["observed_vs_true_r_trials_needed"] is None and power["true_delta_auc_sd"] == 0
    html = html_module.unescape((plan / "power" / "report.html").read_text())
    row = html[html.index("observed vs true ΔAUC r ≥ 0.8"):]
    assert f"none: {reason}" in row[:row.index("</tr>")]
    different = write_virtual_plan(tmp_path / "different", np.array([1.0, 0.5, 0.0, -0.5, 1.5]))
    assert main(["power", str(different), "--trials", "50", "--sessions", "20"]) == 0
    summary = json.loads((different / "power" / "summary.json").read_text())
    assert summary["observed_vs_true_r_trials_needed_undefined_reason"] is None


def test_power_report_sets_its_answer_beside_the_plans_own_forecast(tmp_path):
    plan = write_virtual_plan(tmp_path / "plan", np.array([1.0, -0.8, 0.9, 0.7, -0.6]))  # 5 sites: p < 0.05 possible
    assert main(["power", str(plan), "--trials", "50", "--sessions", "10", "--out", str(tmp_path / "bare")]) == 0
    assert "plan's own forecast" not in (tmp_path / "bare" / "report.html").read_text()  # a plan without one
    summary = json.loads((plan / "summary.json").read_text())
    for needed, stated in ((800, "800 trials per site"), (None, "more than 6,400 trials per site")):
        forecast = {"across_sites": needed, "per_site_median": None, "per_site": {}, "largest_simulated": 6400}
        (plan / "summary.json").write_text(json.dumps({**summary, "trials_per_site_needed": forecast}))
        out = tmp_path / f"with_{needed}"
        assert main(["power", str(plan), "--trials", "50", "--sessions", "10", "--out", str(out)]) == 0
        html = html_module.unescape((out / "report.html").read_text())
        assert f"The plan's own forecast (its report's first page: {stated} across sites)" in html
        assert "this one simulates the virtual subject (lapse rate" in html


def test_without_a_virtual_subject_the_plan_predictions_are_simulated(tmp_path):
    plan = write_virtual_plan(tmp_path / "plan", np.array([1.0, -0.5]), lapse_rate=0.2)
    virtual = curves_from_plan(plan)
    expected = 0.1 + 0.8 * planted_curves([1.0, -0.5])  # lapses: 0.2 / 2 + 0.8 · P(high)
    assert virtual["p_high"] == pytest.approx(expected)
    predicted = planted_curves([2.0, -1.0])
    (plan / "truth" / "subject_p_high.nc").unlink()
    per_pose = np.stack([predicted, predicted * 0], axis=1)[:, :, :, None, :]  # (electrode, pose, stimulated, seq, step)
    xr.Dataset({"p_high": (("model", "electrode", "pose", "stimulated", "sequence", "step"), per_pose[None])},
               coords={"model": ["m0"], "electrode": ["10", "11"], "pose": ["fitted", "bootstrap_0"],
                       "stimulated": [False, True]}).to_netcdf(plan / "plan.nc", engine="h5netcdf")
    summary = json.loads((plan / "summary.json").read_text())
    (plan / "summary.json").write_text(json.dumps({**summary, "chosen_model": "m0"}))
    from_plan = curves_from_plan(plan)
    assert from_plan["source"] == "plan predictions (m0)"
    assert from_plan["p_high"] == pytest.approx(predicted)
    # the chosen model's fitted pose maps electrode 11 off its sheet (NaN; the plan's pooled prediction, of the
    # other models, chose it): refused naming the file, the model and the electrode
    per_pose[1, 0] = np.nan
    xr.Dataset({"p_high": (("model", "electrode", "pose", "stimulated", "sequence", "step"), per_pose[None])},
               coords={"model": ["m0"], "electrode": ["10", "11"], "pose": ["fitted", "bootstrap_0"],
                       "stimulated": [False, True]}).to_netcdf(plan / "plan.nc", engine="h5netcdf")
    with pytest.raises(FileFormatError, match=r"plan.nc: 'p_high' of the chosen model 'm0' at its fitted pose holds "
                                              r"no probability in \[0, 1\] \(NaN: off its sheet\) at chosen "
                                              r"electrode\(s\) \['11'\]"):
        curves_from_plan(plan)


def test_a_power_analysis_run_again_and_stopped_while_writing_keeps_the_earlier_one(tmp_path, capsys,
                                                                                     stop_at_a_table):
    """Power run again into its --out with other trial counts and stopped (Ctrl-C, or killed) while it writes its
    files (report, tables, summary) leaves the earlier power analysis whole and readable, during the run and after."""
    plan = write_virtual_plan(tmp_path / "plan", np.array([1.0, -0.8]))
    out = tmp_path / "power"
    assert main(["power", str(plan), "--trials", "50", "--sessions", "10", "--out", str(out), "--no-progress"]) == 0
    earlier = {name: path.read_bytes() for name, path in read_result_set(out).items()}
    seen = stop_at_a_table(out, io)
    capsys.readouterr()
    assert main(["power", str(plan), "--trials", "50", "100", "--sessions", "10", "--out", str(out),
                 "--no-progress"]) == 130
    assert seen == [earlier]
    assert capsys.readouterr().err.endswith("stimsim: interrupted\n")  # and no unfinished set to write again
    assert {name: path.read_bytes() for name, path in read_result_set(out).items()} == earlier
    assert sorted(path.name for path in out.iterdir()) == sorted([*earlier, "result_set.json"])  # no temporary file
