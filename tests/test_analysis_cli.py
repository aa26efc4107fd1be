"""`stimsim analyze` on a lab's own NWB file (plain pynwb, own column names) with a plan directory."""
import hashlib
import json
import re

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from test_analysis_comparison import write_plan
from test_analysis_sessions import LAB_MAPPING, write_lab_nwb

from stimsim.analysis.effects import expected_fdr_discoveries_under_null
from stimsim.analysis.synthetic import planted_curves, planted_session
from stimsim.cli import main
from stimsim.utilities import io
from stimsim.utilities.io import read_result_set


def test_analyze_lab_nwb_with_mapping_and_plan(tmp_path, capsys, chromium_render, pdf_pages):
    stim_logodds = np.array([2.0, -1.5, 1.0, 0.0, -0.5, 1.5, 0.5, -1.0])
    electrodes = [str(e) for e in (12, 3, 45, 7, 80, 21, 9, 33)]
    table = planted_session(stim_logodds, trials_per_site=200, electrodes=electrodes, seed=3)
    session = write_lab_nwb(tmp_path / "monkey_b.nwb", table)
    curves = planted_curves(stim_logodds)
    truth = ((curves[..., 1:] + curves[..., :-1]) / 12).sum(axis=-1) @ np.array([-1.0, 1.0])
    plan = tmp_path / "plan"
    plan.mkdir()
    pd.DataFrame({"rank": range(1, 9), "electrode_id": electrodes, "predicted_delta_auc": 1.5 * truth}).to_csv(
        plan / "sites.csv", index=False)
    (plan / "summary.json").write_text(json.dumps({"task": "sequence_2afc", "predicted_vs_true_r": 1.0}))
    xr.Dataset(coords={"sequence": [0], "step": np.arange(7)}).to_netcdf(plan / "plan.nc", engine="h5netcdf")
    columns = ",".join(f"{lab}={ours}" for lab, ours in LAB_MAPPING.items())
    out = tmp_path / "analysis"
    assert main(["analyze", str(session), "--plan", str(plan), "--columns", columns, "--out", str(out),
                 "--boot", "200", "--perm", "200", "--splits", "20"]) == 0
    printed = json.loads(capsys.readouterr().out)  # stdout is the JSON only, each score beside its chance level
    assert printed["mean_shift_chance"] == 0 and printed["predicted_vs_observed_r_chance"] == 0
    assert printed["cohens_d_chance"] == 0 and printed["split_half_r_chance"] == 0
    assert printed["slope_ideal"] == 1 and printed["predicted_vs_observed_r_null_95"][0] < 0 < \
        printed["predicted_vs_observed_r_null_95"][1] < printed["predicted_vs_observed_r"]
    assert set(read_result_set(out)) == {"report.html", "report.pdf", "results.nc", "summary.json", "sites.csv"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_sites"] == 8 and summary["n_trials"] == 1600
    assert summary["predicted_vs_observed_r"] > 0.8 and summary["slope"] < 1  # the plan over-estimates
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 4 and "Predictions against outcomes" in html
    # the report names the data and the plan it was made from by their checksums, as summary.json does
    for name, path in (("sessions_sha256", session), ("plan_summary_sha256", plan / "summary.json")):
        assert f"<tr><th>{name}</th><td>{hashlib.sha256(path.read_bytes()).hexdigest()}</td></tr>" in html
    _, images_ok, images_total, console = chromium_render(out / "report.html")
    assert images_total >= 4 and images_ok == images_total and not console
    texts, pngs = pdf_pages(out / "report.pdf")
    assert any("Predictions against outcomes" in text for text in texts) and len(pngs) >= 3
    # the figure a scientist looks for first opens the report: per-site effects on page 1, before the scores
    assert "ΔAUC per site with 95 % bootstrap intervals" in texts[0]
    assert "\n".join(texts).index("ΔAUC per site") < "\n".join(texts).index("mean_shift")
    with xr.open_dataset(out / "results.nc", engine="h5netcdf") as data:
        assert sorted(data["electrode"].values.tolist(), key=int) == sorted(electrodes, key=int)


def test_analyze_refuses_a_broken_file_with_exit_code_2(tmp_path, capsys):
    table = planted_session([0.5, 0.5], trials_per_site=20)
    table.loc[3, "choice"] = "face"
    table.to_csv(tmp_path / "s.csv", index=False)
    assert main(["analyze", str(tmp_path / "s.csv"), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("stimsim: error: ") and "s.csv" in error and "row(s) 4" in error
    assert not (tmp_path / "out").exists()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("a lab's own file")
    table.loc[3, "choice"] = "high"
    table.to_csv(tmp_path / "s.csv", index=False)
    assert main(["analyze", str(tmp_path / "s.csv"), "--out", str(tmp_path / "notes"), "--boot", "10"]) == 2
    assert "holds files stimsim did not write" in capsys.readouterr().err
    # checked before any work: the refusal names the directory even when the session would fail later
    assert main(["analyze", str(tmp_path / "absent.csv"), "--out", str(tmp_path / "notes")]) == 2
    assert "holds files stimsim did not write" in capsys.readouterr().err
    assert main(["power", str(tmp_path / "no_plan"), "--out", str(tmp_path / "notes")]) == 2
    assert "holds files stimsim did not write" in capsys.readouterr().err
    assert main(["power", str(tmp_path / "no_plan"), "--out", str(tmp_path / "power")]) == 2
    assert "no_plan" in capsys.readouterr().err and not (tmp_path / "power").exists()
    assert main(["analyze", str(tmp_path / "s.csv"), "--out", str(tmp_path / "seeded"), "--seed", "-1"]) == 2
    assert "--seed must be an integer from 0 to 4294967295 (2**32 - 1), got -1" in capsys.readouterr().err
    assert not (tmp_path / "seeded").exists()
    # counts are bounded by the memory they need, estimated before any work; nothing is left behind
    assert main(["analyze", str(tmp_path / "s.csv"), "--out", str(tmp_path / "many"), "--boot", "2000000000",
                 "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert re.match(r"stimsim: error: analyze: --boot 2000000000 over 2 sites \(40 trials\) needs about [\d.]+ TiB of "
                    r"memory, more than the [\d.]+ [KMGT]iB this machine has available; lower --boot$", error), error
    assert not (tmp_path / "many").exists()


def test_analyze_never_writes_over_a_session_file_it_reads(tmp_path, capsys):
    session = tmp_path / "sites.csv"  # a lab's session export named like the analysis's per-site table
    planted_session([0.5, 0.5], trials_per_site=20).to_csv(session, index=False)
    recorded = session.read_bytes()
    assert main(["analyze", str(session), "--out", str(tmp_path), "--force", "--boot", "10", "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"stimsim: error: --out {tmp_path}: the analysis writes its sites.csv there, "
                                       f"which would replace the session file {session}; give another folder\n")
    assert session.read_bytes() == recorded and sorted(tmp_path.iterdir()) == [session]


def test_an_analysis_folder_given_as_the_plan_is_named_as_one(tmp_path, capsys):
    session = tmp_path / "s.csv"
    planted_session([0.5, 0.5], trials_per_site=20).to_csv(session, index=False)
    quick = ["--boot", "10", "--perm", "10", "--splits", "2", "--no-progress"]
    assert main(["analyze", str(session), "--out", str(tmp_path / "analysis"), *quick]) == 0
    capsys.readouterr()
    analysis = str(tmp_path / "analysis")
    for command in (["analyze", str(session), "--plan", analysis, *quick], ["power", analysis]):
        assert main([*command, "--out", str(tmp_path / "out")]) == 2
        assert capsys.readouterr().err.endswith(f"'predicted_delta_auc']; {tmp_path / 'analysis'} holds an analysis "
                                                "(`stimsim analyze`), not a plan: give the directory `stimsim plan` "
                                                "wrote\n")


def test_a_folder_inside_a_plan_given_as_the_plan_points_to_the_plan(tmp_path, capsys):
    """A plan's rig package or virtual subject given as --plan: the error names the plan directory above it."""
    session = tmp_path / "s.csv"
    planted_session([0.5, 0.5], trials_per_site=20).to_csv(session, index=False)
    plan = write_plan(tmp_path / "plan", ["1", "2"], [0.02, 0.01])
    for inner in ("rig", "subject"):
        (plan / inner).mkdir()
        assert main(["analyze", str(session), "--plan", str(plan / inner), "--out", str(tmp_path / "out"),
                     "--no-progress"]) == 2
        assert capsys.readouterr().err == (f"stimsim: error: plan directory {plan / inner} has no sites.csv (made by "
                                           f"`stimsim plan`); {plan / inner} is a folder inside the plan directory "
                                           f"{plan}: give that directory\n")


def test_a_folder_inside_a_plan_given_to_subject_session_points_to_the_plan(tmp_path, capsys):
    """`subject session` on a plan's rig package or virtual subject: the error names the plan directory above it,
    as `analyze --plan` does."""
    plan = write_plan(tmp_path / "plan", ["1", "2"], [0.02, 0.01])
    for inner in ("rig", "subject"):
        (plan / inner).mkdir()
        assert main(["subject", "session", str(plan / inner), "--out", str(tmp_path / "s.nwb")]) == 2
        assert capsys.readouterr().err.endswith(f"{plan / inner} is a folder inside the plan directory {plan}: give "
                                                "that directory\n")
    assert not (tmp_path / "s.nwb").exists()


@pytest.mark.parametrize("argv, message", [
    (["analyze", "s.csv", "--boot", "1"], "--boot must be at least 2, got 1"),
    (["analyze", "s.csv", "--perm", "0"], "--perm must be at least 1, got 0"),
    (["analyze", "s.csv", "--splits", "-3"], "--splits must be at least 1, got -3"),
    (["power", "plan", "--sessions", "5"], "--sessions must be at least 10, got 5"),
    (["power", "plan", "--power", "1.5"], "--power must lie strictly between 0 and 1, got 1.5"),
    (["power", "plan", "--alpha", "0"], "--alpha must lie strictly between 0 and 1, got 0"),
    (["power", "plan", "--trials-per-site", "400", "50", "400"], "--trials-per-site lists 400 more than once"),
    (["power", "plan", "--trials", "400", "50", "400"], "--trials-per-site lists 400 more than once"),  # former name
    (["power", "plan", "--seed", "-5"], "--seed must be an integer from 0 to 4294967295 (2**32 - 1), got -5"),
    (["analyze", "s.csv", "--seed", "99999999999999999999999"], "--seed must be an integer from 0 to 4294967295"),
])
def test_bad_options_are_named_as_typed(tmp_path, capsys, argv, message):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith(f"stimsim: error: {message}")
    assert not (tmp_path / "out").exists()


def test_analyze_reads_a_lab_file_through_a_toml_column_mapping(tmp_path, capsys):
    table = planted_session([1.0, -1.0, 0.5], trials_per_site=140, seed=2)
    session = write_lab_nwb(tmp_path / "lab.nwb", table)
    mapping = tmp_path / "lab_columns.toml"
    mapping.write_text("[columns]\n" + "".join(f'{lab} = "{ours}"\n' for lab, ours in LAB_MAPPING.items()))
    assert main(["analyze", str(session), "--out", str(tmp_path / "without"), "--boot", "10"]) == 2
    assert "missing column(s)" in capsys.readouterr().err
    out = tmp_path / "analysis"
    assert main(["analyze", str(session), "--columns", str(mapping), "--out", str(out), "--boot", "20", "--perm", "20",
                 "--splits", "5"]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)  # stdout holds only the JSON summary
    assert printed["n_trials"] == 420
    assert printed["n_sites_significant_fdr"] <= printed["n_sites_significant"]
    assert printed["n_sites_significant_fdr_chance"] == pytest.approx(expected_fdr_discoveries_under_null(3, 0.05))
    assert f"stimsim: report, results.nc, sites.csv and summary.json in {out}" in captured.err
    # each phase is named on stderr: 3 sites × 140 trials, with the resampling asked for
    assert "stimsim: analyze: reading 1 session file(s)" in captured.err
    assert "statistics of 3 site(s), 420 trials (20 bootstrap resamples, 20 permutations per site, 5 split halves)" \
        in captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_trials"] == 420 and summary["n_sites"] == 3
    assert main(["analyze", str(session), "--columns", str(mapping), "--out", str(tmp_path / "quiet"), "--boot", "20",
                 "--perm", "20", "--splits", "5", "--no-progress"]) == 0
    assert "analyze:" not in capsys.readouterr().err
    assert summary["n_sites_significant_chance"] == 0.15  # 3 sites × α 0.05, as written (no binary tail)
    assert "0.15000000000000002" not in (out / "summary.json").read_text()
    recorded = json.loads((out / "summary.json").read_text())["provenance"]
    assert recorded["config"]["columns"] == LAB_MAPPING
    # the session file's checksum beside its path: a file rewritten later no longer matches the analysis
    assert recorded["config"]["sessions_sha256"] == [hashlib.sha256(session.read_bytes()).hexdigest()]
    assert {"pandas", "statsmodels", "pynwb"} <= set(recorded["software"])
    assert "n_sites_significant_fdr" in summary and "p_fdr" in pd.read_csv(out / "sites.csv")
    with xr.open_dataset(out / "results.nc", engine="h5netcdf") as data:
        assert np.all(data["p_fdr"].values >= data["permutation_p"].values)
        assert [name for name in data.data_vars if "description" not in data[name].attrs] == []  # each says what it is
        assert (data["shift_steps_low"].attrs["units"], data["current_uA"].attrs["units"]) == ("steps", "uA")


def test_analyze_checks_electrodes_against_an_array_layout(tmp_path, capsys):
    planted_session([0.5, 0.5], trials_per_site=20, electrodes=["7", "97"]).to_csv(tmp_path / "s.csv", index=False)
    assert main(["analyze", str(tmp_path / "s.csv"), "--layout", "10x10", "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "column 'electrode'" in error and "electrode not in the array --layout 10x10 (96 known ids" in error
    assert "'97'" in error and "--layout-ids" not in error  # a Utah layout has no labels to name electrodes by


def test_analyze_reads_a_cmp_layouts_labels_with_layout_ids(tmp_path, capsys):
    """Sessions that name electrodes by a .cmp map's labels (elec1, elec2) pass the layout check only with
    --layout-ids label; by default the map's ids are its channel numbers."""
    (tmp_path / "array.cmp").write_text("Cerebus mapping\n0 0 A 1 elec1\n1 0 A 2 elec2\n")
    planted_session([0.5, 0.5], trials_per_site=20, electrodes=["elec1", "elec2"]).to_csv(tmp_path / "s.csv",
                                                                                         index=False)
    layout = ["--layout", str(tmp_path / "array.cmp")]
    quick = ["--boot", "5", "--perm", "5", "--splits", "2", "--no-progress"]
    assert main(["analyze", str(tmp_path / "s.csv"), *layout, "--out", str(tmp_path / "by_channel"), *quick]) == 2
    assert (f"electrode not in the array --layout {tmp_path / 'array.cmp'} (ids: its channel numbers; its labels need "
            "--layout-ids label) (2 known ids, e.g. '1', '2')") in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "s.csv"), *layout, "--layout-ids", "label", "--out",
                 str(tmp_path / "by_label"), *quick]) == 0
    summary = json.loads((tmp_path / "by_label" / "summary.json").read_text())
    assert summary["n_sites_recorded"] == 2 and summary["provenance"]["config"]["layout_ids"] == "label"
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "s.csv"), "--layout", "10x10", "--layout-ids", "label", "--out",
                 str(tmp_path / "utah"), *quick]) == 2
    assert "--layout-ids: \"label\" takes the ids from a .cmp map's label column" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "s.csv"), "--layout-ids", "label", "--out", str(tmp_path / "none"),
                 *quick]) == 2
    assert "no --layout is given" in capsys.readouterr().err and not (tmp_path / "none").exists()


def test_a_layout_that_does_not_hold_the_plans_sites_is_refused(tmp_path, capsys):
    """A plan that names its sites by a .cmp map's labels, given with the map read by its channel numbers, used to
    report every electrode as unknown ("0 known ids"): the refusal now names the plan's sites and, where they are
    the map's labels, --layout-ids label; another array's layout is named as such."""
    (tmp_path / "array.cmp").write_text("Cerebus mapping\n0 0 A 1 elec1\n1 0 A 2 elec2\n")
    planted_session([0.5, 0.5], trials_per_site=20, electrodes=["elec1", "elec2"]).to_csv(tmp_path / "s.csv",
                                                                                         index=False)
    plan = tmp_path / "plan"
    plan.mkdir()
    pd.DataFrame({"rank": [1, 2], "electrode_id": ["elec1", "elec2"], "predicted_delta_auc": [0.05, 0.02]}).to_csv(
        plan / "sites.csv", index=False)
    (plan / "summary.json").write_text(json.dumps({"task": "sequence_2afc"}))
    xr.Dataset(coords={"sequence": [0], "step": np.arange(7)}).to_netcdf(plan / "plan.nc", engine="h5netcdf")
    common = [str(tmp_path / "s.csv"), "--plan", str(plan), "--boot", "5", "--perm", "5", "--splits", "2",
              "--no-progress"]
    cmp = str(tmp_path / "array.cmp")
    assert main(["analyze", *common, "--layout", cmp, "--out", str(tmp_path / "by_channel")]) == 2
    assert (f"--layout {cmp}: 2 of the plan's 2 sites are not its electrodes: 'elec1', 'elec2' (its ids e.g. '1', "
            "'2'); the plan names them by the map's labels: add --layout-ids label") in capsys.readouterr().err
    assert main(["analyze", *common, "--layout", "10x10", "--out", str(tmp_path / "utah")]) == 2
    assert ("--layout 10x10: 2 of the plan's 2 sites are not its electrodes: 'elec1', 'elec2' (its ids e.g. '1', "
            "'2', '3', '4', '5'); give the layout the plan was made with") in capsys.readouterr().err
    assert not (tmp_path / "by_channel").exists() and not (tmp_path / "utah").exists()
    assert main(["analyze", *common, "--layout", cmp, "--layout-ids", "label", "--out", str(tmp_path / "ok")]) == 0


def test_analysis_benchmark_entry_runs_on_quick_sizes():
    from stimsim.engine.bench import time_analysis

    timing = time_analysis(quick=True)
    assert (timing["n_sites"], timing["trials_per_site"]) == (10, 100)
    assert timing["total_s"] == pytest.approx(timing["load_s"] + timing["statistics_s"])


def test_analyze_refuses_steps_beyond_the_plans_sequences(tmp_path, capsys):
    plan = tmp_path / "plan"
    plan.mkdir()
    pd.DataFrame({"rank": [1, 2], "electrode_id": ["1", "2"], "predicted_delta_auc": [0.05, 0.02]}).to_csv(
        plan / "sites.csv", index=False)
    (plan / "summary.json").write_text(json.dumps({"task": "sequence_2afc"}))
    xr.Dataset(coords={"sequence": [0, 1, 2], "step": np.arange(5)}).to_netcdf(plan / "plan.nc", engine="h5netcdf")
    table = planted_session([0.5, 0.5], trials_per_site=40, n_steps=5, seed=1).drop(columns="stimulus_id")
    table.loc[6, "step"] = 5
    table.to_csv(tmp_path / "s.csv", index=False)
    assert main(["analyze", str(tmp_path / "s.csv"), "--plan", str(plan), "--out", str(tmp_path / "out"),
                 "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("stimsim: error: ") and "s.csv" in error and "column 'step', row(s) 7:" in error
    assert "allowed steps 0..4" in error and not (tmp_path / "out").exists()


def test_analyze_reads_lab_value_codes_given_on_the_command_line(tmp_path, capsys):
    table = planted_session([1.0, -1.0, 0.5], trials_per_site=140, seed=2)
    coded = table.assign(choice=np.where(table["choice"] == "low", 1, 2),
                         stimulated_electrode=np.where(table["stimulated_electrode"] == "sham", "none",
                                                       table["stimulated_electrode"]))
    coded.to_csv(tmp_path / "coded.csv", index=False)
    table.to_csv(tmp_path / "plain.csv", index=False)
    common = ["--boot", "20", "--perm", "20", "--splits", "5"]
    assert main(["analyze", str(tmp_path / "coded.csv"), "--values", "choice:1=low,2=high", "--values",
                 "stimulated_electrode:none=sham", "--out", str(tmp_path / "coded"), *common]) == 0
    assert main(["analyze", str(tmp_path / "plain.csv"), "--out", str(tmp_path / "plain"), *common]) == 0
    capsys.readouterr()
    coded_summary = json.loads((tmp_path / "coded" / "summary.json").read_text())
    plain_summary = json.loads((tmp_path / "plain" / "summary.json").read_text())
    assert coded_summary["mean_shift"] == plain_summary["mean_shift"]  # the same trials, once translated
    assert coded_summary["provenance"]["config"]["values"] == {"choice": {"1": "low", "2": "high"},
                                                              "stimulated_electrode": {"none": "sham"}}
    assert main(["analyze", str(tmp_path / "coded.csv"), "--values", "choice:1=low,2=right",
                 "--out", str(tmp_path / "bad")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("stimsim: error: --values choice: code '2' maps onto 'right'; allowed values: low, high")


def test_analyze_warns_when_the_choice_codes_look_reversed(tmp_path, capsys):
    """Planted curves rise 8 log-odds along the sequence (P('high') about 0.02 at step 0, 0.98 at the last step):
    read with 0/1 mapped the wrong way round, the sham trials' P('high') falls, and the analysis says so; read the
    right way round, it does not."""
    table = planted_session([0.5, -0.5, 0.2], trials_per_site=140, seed=4)
    coded = table.assign(choice=(table["choice"] == "high").astype(int)).drop(columns=["correct"], errors="ignore")
    coded.to_csv(tmp_path / "coded.csv", index=False)  # no 'correct' column, whose check would catch it first
    outputs = {}
    for name, codes in (("reversed", "choice:1=low,0=high"), ("right", "choice:0=low,1=high")):
        assert main(["analyze", str(tmp_path / "coded.csv"), "--values", codes, "--out", str(tmp_path / name),
                     "--boot", "10", "--perm", "10", "--splits", "5", "--no-progress"]) == 0
        outputs[name] = capsys.readouterr().err
    assert "stimsim: warning: without stimulation P('high') falls along the steps" in outputs["reversed"]
    assert "the choice codes are most likely the other way round" in outputs["reversed"]
    assert "falls along the steps" not in outputs["right"]


def test_analyze_refuses_currents_in_mA_or_nA_naming_file_rows_and_the_conversion(tmp_path, capsys):
    """A lab column in mA mapped onto current_uA (0.05 for 50 µA), or in nA (50,000), would be written into the
    results as µA: refused, also where one file of several is in mA (its 'several currents' would pool them)."""
    table = planted_session([1.0, -1.0], trials_per_site=140, seed=2)
    first_stimulated = int(np.flatnonzero(table["stimulated_electrode"] != "sham")[0]) + 1
    table.assign(current_uA=table["current_uA"] / 1000).rename(columns={"current_uA": "amp_mA"}).to_csv(
        tmp_path / "mA.csv", index=False)
    table.assign(session_id="day2").to_csv(tmp_path / "uA.csv", index=False)
    assert main(["analyze", str(tmp_path / "uA.csv"), str(tmp_path / "mA.csv"), "--columns", "amp_mA=current_uA",
                 "--out", str(tmp_path / "a"), "--boot", "10", "--perm", "10", "--splits", "5", "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"stimsim: error: {tmp_path / 'mA.csv'}: refused (nothing loaded): column 'current_uA', "
                            f"row(s) {first_stimulated}, ") and error.count("\n") == 1
    assert ("stimulated trial with a current below 1 µA: microstimulation currents are typically 5–200 µA, so these "
            "are most likely mA; convert them to µA (× 1000) first; e.g. 0.05 (the file's column 'amp_mA')") in error
    assert not (tmp_path / "a").exists()
    table.assign(current_uA=table["current_uA"] * 1000).to_csv(tmp_path / "nA.csv", index=False)
    assert main(["analyze", str(tmp_path / "nA.csv"), "--out", str(tmp_path / "n"), "--boot", "10", "--perm", "10",
                 "--splits", "5", "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert (f"row(s) {first_stimulated}, " in error and "stimulated trial with a current above 5000 µA, the highest "
            "stimsim accepts" in error and "convert them to µA (÷ 1000) first; e.g. 50000.0" in error)
    assert main(["analyze", str(tmp_path / "uA.csv"), "--out", str(tmp_path / "b"), "--boot", "10", "--perm", "10",
                 "--splits", "5", "--no-progress"]) == 0
    error = capsys.readouterr().err
    assert "below 1 µA" not in error and "above 5000 µA" not in error


def test_an_analysis_run_again_and_stopped_while_writing_keeps_the_earlier_one(tmp_path, capsys, stop_at_a_table):
    """An analysis run again into its --out with other sessions and stopped (Ctrl-C, or killed) while it writes its
    files leaves the earlier analysis whole and readable, during the run and after it."""
    first, second = tmp_path / "first.csv", tmp_path / "second.csv"
    planted_session([1.0, -0.5], trials_per_site=100, seed=1).to_csv(first, index=False)
    planted_session([0.5, 0.5, -1.0], trials_per_site=100, seed=2).to_csv(second, index=False)
    out = tmp_path / "analysis"
    options = ["--out", str(out), "--boot", "10", "--perm", "10", "--splits", "4", "--no-progress"]
    assert main(["analyze", str(first), *options]) == 0
    earlier = {name: path.read_bytes() for name, path in read_result_set(out).items()}
    seen = stop_at_a_table(out, io)
    capsys.readouterr()
    assert main(["analyze", str(second), *options]) == 130
    assert seen == [earlier]
    assert capsys.readouterr().err.endswith("stimsim: interrupted\n")  # and no unfinished set to write again
    assert {name: path.read_bytes() for name, path in read_result_set(out).items()} == earlier
    assert sorted(path.name for path in out.iterdir()) == sorted([*earlier, "result_set.json"])  # no temporary file
