"""Closed loop: plan on a virtual subject, simulate a session of 8,000 trials per site (stimulated and sham
50/50), analyse it against the plan. Classical test theory fixes what to expect: observed effects with
reliability ρ (the noise ceiling) correlate with the true effects at sqrt(ρ), and with predictions that
correlate with the truth at r at about r·sqrt(ρ)."""
import json
import math
import shutil
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from stimsim.analysis import analyze, load_sessions
from stimsim.analysis.power import power_analysis
from stimsim.analysis.plan_readback import PLAN_FILES, write_plan_files
from stimsim.cli import main
from stimsim.planning.session import session_from_plan, write_session_nwb
from test_plan_job import _write_plan

#: Current of the small plan: high, within the safety gate (Shannon k ≤ 1.85 allows up to 188 µA at 0.2 ms
#: per phase), so that the virtual subject's effects stand out of the binomial noise.
CURRENT_UA = 150
#: Trials per site: with lengths in cortex mm few units lie within reach of each electrode and the subject's
#: effects are small; at 400 trials the binomial noise hid their spread (noise ceiling about 0). With sequences
#: started where their site responds the true ΔAUC spread less (SD 0.013 across sites): over 60 session seeds
#: the noise ceiling was 0.44 ± 0.16 at 4,000 trials (below 0.1 for 8% of seeds) and 0.63 ± 0.13 at 8,000
#: (5% quantile 0.41 over 40 seeds).
TRIALS_PER_SITE = 8000


@pytest.fixture(scope="module")
def closed_loop(tmp_path_factory, one_torch_thread):
    base = tmp_path_factory.mktemp("closed_loop")
    config = _write_plan(base / "config", current=CURRENT_UA, broken="[]")
    plan = base / "plan"
    assert main(["plan", str(config), "--out", str(plan), "--no-progress"]) == 0
    trials = session_from_plan(plan, trials_per_site=TRIALS_PER_SITE, seed=1, sites="all")
    path = write_session_nwb(trials, base / "session.nwb", subject_id=trials["subject_id"].iloc[0],
                             session_id="closed-loop")
    plan_sites = pd.read_csv(plan / "sites.csv", dtype={"electrode_id": str})
    sessions = load_sessions(path, electrodes=plan_sites["electrode_id"])
    analysis = analyze(sessions, plan_dir=plan, n_boot=200, n_perm=200, n_splits=100, seed=2)
    return json.loads((plan / "summary.json").read_text()), analysis, plan


def fisher_interval(r: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    centre = math.atanh(r)
    return math.tanh(centre - z / math.sqrt(n - 3)), math.tanh(centre + z / math.sqrt(n - 3))


def _plan_that_predicts_the_truth(plan, directory):
    """A copy of ``plan`` whose predicted ΔAUC are the virtual subject's true ones (its predicted vs true r is 1)."""
    shutil.copytree(plan, directory)
    summary = json.loads((directory / "summary.json").read_text())
    summary["predicted_delta_auc"] = summary["true_delta_auc"]
    (directory / "summary.json").write_text(json.dumps(summary))
    sites = pd.read_csv(directory / "sites.csv", dtype={"electrode_id": str})
    sites["predicted_delta_auc"] = sites["electrode_id"].map(summary["true_delta_auc"])
    sites.drop(columns=[c for c in sites if c.startswith("predicted_delta_auc_")]).to_csv(directory / "sites.csv",
                                                                                         index=False)
    write_plan_files(directory, json.loads((directory / PLAN_FILES).read_text())["files"])  # the files as edited
    return directory


@pytest.mark.slow
def test_the_expected_r_holds_the_observed_r_in_most_sessions(closed_loop, tmp_path):
    """Over 40 sessions of the plan (other seeds), the interval `analyze` gives for r(predicted, observed) holds
    it in about 95 % of them: for the plan's predictions, and for predictions that are the truth itself (where the
    expectation is sqrt(noise ceiling): observed effects of reliability ρ correlate with the true ones at sqrt(ρ)).
    One session's r falls outside a 95 % interval one time in twenty, so a single session cannot test it (measured:
    all 36 sessions with a noise ceiling for the plan's predictions, 35 of the 36 for the truth)."""
    _, _, plan = closed_loop
    truth_plan = _plan_that_predicts_the_truth(plan, tmp_path / "truth_plan")
    electrodes = pd.read_csv(plan / "sites.csv", dtype={"electrode_id": str})["electrode_id"]
    inside = {plan: [], truth_plan: []}
    for seed in range(100, 140):
        path = tmp_path / "session.csv"
        session_from_plan(plan, trials_per_site=TRIALS_PER_SITE, seed=seed, sites="all").to_csv(path, index=False)
        sessions = load_sessions(path, electrodes=electrodes)
        for plan_dir, outcomes in inside.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "noise ceiling undefined" in a few sessions: no interval there
                summary = analyze(sessions, plan_dir=plan_dir, n_boot=300, n_perm=10, n_splits=50, seed=seed).summary
            low, high = summary["expected_predicted_vs_observed_r_95"]
            if np.isfinite(low):
                outcomes.append(low <= summary["predicted_vs_observed_r"] <= high)
    for outcomes in inside.values():
        assert len(outcomes) >= 30 and np.mean(outcomes) >= 0.85


@pytest.mark.slow
def test_predicted_vs_observed_r_within_what_the_plan_and_noise_ceiling_imply(closed_loop):
    plan_summary, analysis, _ = closed_loop
    summary = analysis.summary
    assert summary["plan_predicted_vs_true_r"] == pytest.approx(plan_summary["predicted_vs_true_r"])
    low, high = summary["expected_predicted_vs_observed_r_95"]
    assert low <= summary["predicted_vs_observed_r"] <= high


@pytest.mark.slow
def test_power_forecasts_the_observed_vs_true_r_of_the_session(closed_loop):
    # `stimsim power` simulates sessions from the subject's curves before any trial is run; the r it
    # forecasts at TRIALS_PER_SITE trials per site is what the simulated session then shows (within sampling error).
    plan_summary, analysis, plan = closed_loop
    with xr.open_dataset(plan / "truth" / "subject_p_high.nc", engine="h5netcdf") as data:
        p_high = data["subject_p_high"].transpose("electrode", "stimulated", "sequence", "step").load()
    lapse = plan_summary["subject_lapse_rate"]
    sites = analysis.sites.set_index("electrode")
    curves = lapse / 2 + (1 - lapse) * p_high.sel(electrode=list(sites.index)).values.mean(axis=2)
    curve, _, _ = power_analysis(curves, trial_counts=(TRIALS_PER_SITE,), n_sessions=300, seed=3)
    forecast = curve["observed_vs_true_r"].iloc[0]
    truth = pd.Series(plan_summary["true_delta_auc"])[sites.index]
    observed_vs_true = np.corrcoef(truth, sites["delta_auc"])[0, 1]
    low, high = fisher_interval(forecast, len(sites))
    assert low <= observed_vs_true <= high
