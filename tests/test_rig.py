"""A plan a lab takes to the rig: the power forecast and its warning, both intervals, the rig package (images,
trial list in interleaved blocks, NWB template, display), the array as on its .cmp map, and the round trip from
the trial list through a virtual session to `stimsim analyze` with no mapping."""
import json
import math

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from PIL import Image as PILImage

from stimsim.analysis.effects import delta_auc_of_counts
from stimsim.cli import main
from stimsim.planning.config import load_plan_config
from stimsim.planning.detectability import forecast, subject_error_sd, with_subject_error
from stimsim.planning.rig import RigSpec, SessionTable, sequence_images, trial_list, write_rig, write_trials_nwb
from stimsim.utilities.errors import ConfigError, FileFormatError

#: A 4 × 4 map written by hand: comments, then electrode lines (no description line); banks A and B, labels.
CMP = "// 4x4 test map, no description line\n// col row bank elec label\n" + "".join(
    f"{k % 4}\t{k // 4}\t{'AB'[k // 8]}\t{k % 8 + 1}\telec{k + 1}\n" for k in range(16))

SUBJECT = """
[subject]
model = "stimsim-topo-s2"
seed = 7
lapse_rate = 0.02
[array]
layout = "array.cmp"
layout_ids = "label"
[recording]
radius_mm = 0.25
repeats = 4
[[stimuli]]
source = "lfw_subset"
"""

PLAN = """
name = "rig"
seed = 3
[models]
candidates = ["stimsim-topo-s0"]
n_folds = 3
[subject]
config = "subject.toml"
[array]
min_reliability = -1
[registration]
n_boot = 2
[sequences]
n_sequences = 2
iterations = 8
recording_radius_mm = 0.25
[decoder]
n_noise = 6
n_eval = 3
[stimulation]
current_uA = 150
[selection]
n_sites = 3
min_separation_mm = 0.8
[session]
trials_per_site = {trials}
train_onset_ms = -20
[display]
size_deg = 6
viewing_distance_cm = 50
"""
TRIALS_PER_SITE = 1400


def _write(directory, trials=TRIALS_PER_SITE):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "array.cmp").write_text(CMP)
    (directory / "subject.toml").write_text(SUBJECT)
    (directory / "plan.toml").write_text(PLAN.format(trials=trials))
    return directory / "plan.toml"


@pytest.fixture(scope="module")
def rig_plan(tmp_path_factory, one_torch_thread):
    base = tmp_path_factory.mktemp("rig")
    out = base / "out"
    assert main(["plan", str(_write(base / "config")), "--out", str(out), "--no-progress"]) == 0
    return out


def test_rig_package_holds_every_image_and_the_interleaved_trial_list(rig_plan):
    summary = json.loads((rig_plan / "summary.json").read_text())
    chosen = summary["chosen_electrodes"]
    trials = pd.read_csv(rig_plan / "rig" / "trials.csv", dtype={"electrode": str, "stimulated_electrode": str})
    with xr.open_dataset(rig_plan / "plan.nc", engine="h5netcdf") as plan:
        images = plan["sequence_image"].sel(electrode=chosen).values  # (site, sequence, step, y, x)
    n_sites, n_sequences, n_steps = images.shape[:3]
    pngs = sorted((rig_plan / "rig" / "images").glob("*.png"))
    assert len(pngs) == n_sites * n_sequences * n_steps == summary["rig"]["n_images"]
    # every row's image is the plan's own image of that site, sequence and step (grey levels 0–255)
    for row in trials.drop_duplicates("image_file").itertuples():
        pixels = np.asarray(PILImage.open(rig_plan / "rig" / row.image_file), dtype=float)
        np.testing.assert_allclose(pixels / 255, images[chosen.index(row.electrode), row.sequence, row.step],
                                   atol=0.5 / 255 + 1e-9)
    assert len(trials) == TRIALS_PER_SITE * n_sites and trials["trial"].tolist() == list(range(1, len(trials) + 1))
    # blocks: every site once sham and once stimulated, in an order that changes from block to block
    blocks = trials.groupby("block")
    assert blocks.ngroups == TRIALS_PER_SITE // 2
    assert all(sorted(zip(b["electrode"], b["condition"])) == sorted((e, c) for e in chosen
                                                                     for c in ("sham", "stimulation"))
               for _, b in blocks)
    assert len({tuple(b["electrode"] + b["condition"]) for _, b in blocks}) > 1
    # within a site and condition each of its images is shown equally often (± 1)
    per_image = trials.groupby(["electrode", "condition", "sequence", "step"]).size()
    assert len(per_image) == n_sites * 2 * n_sequences * n_steps and np.ptp(per_image.to_numpy()) <= 1
    stim = trials[trials["condition"] == "stimulation"]
    sham = trials[trials["condition"] == "sham"]
    assert (stim["stimulated_electrode"] == stim["electrode"]).all() and (sham["stimulated_electrode"] == "sham").all()
    assert (stim["current_uA"] == 150).all() and (sham["current_uA"] == 0).all()
    assert (stim["frequency_Hz"] == 200).all() and (stim["pulse_width_ms"] == 0.2).all()
    assert (stim["train_onset_ms"] == -20).all() and sham["train_onset_ms"].isna().all()
    # Cerebus numbers from the map: elec{k+1} is bank A/B, elec k % 8 + 1, channel bank index × 32 + elec
    for row in trials.drop_duplicates("electrode").itertuples():
        k = int(row.electrode.removeprefix("elec")) - 1
        assert (row.bank, row.elec, row.channel) == ("AB"[k // 8], k % 8 + 1, 32 * (k // 8) + k % 8 + 1)
    protocol = json.loads((rig_plan / "rig" / "stimulation.json").read_text())  # what the stimulator is set to
    assert protocol == {"current_uA": 150, "frequency_Hz": 200, "pulse_width_ms": 0.2, "interphase_ms": 0.1,
                        "waveform": "biphasic_cathodic_first", "train_ms": 50, "train_onset_ms": -20,
                        "charge_per_phase_nC": pytest.approx(150 * 0.2)}  # µA × ms = nC
    display = json.loads((rig_plan / "rig" / "display.json").read_text())
    assert display["image_size_cm"] == pytest.approx(2 * 50 * math.tan(math.radians(3)))
    assert display["pixels_per_deg"] == pytest.approx(images.shape[-1] / 6)


def test_sites_csv_and_report_show_the_map_as_the_lab_knows_it(rig_plan, chromium_render, pdf_pages):
    sites = pd.read_csv(rig_plan / "sites.csv", dtype={"electrode_id": str, "bank": str})
    k = sites["electrode_id"].str.removeprefix("elec").astype(int) - 1
    assert (sites["bank"] == ["AB"[i // 8] for i in k]).all() and (sites["elec"] == k % 8 + 1).all()
    assert (sites["channel"] == 32 * (k // 8) + k % 8 + 1).all()
    summary = json.loads((rig_plan / "summary.json").read_text())
    assert summary["layout_description"].startswith("(no description line")
    dom, images_ok, images_total, console = chromium_render(rig_plan / "report.html")
    assert images_ok == images_total and console == []
    assert "the array as on its map and pedestal (col from the left, row from the bottom, not rotated)" in dom
    assert "cells coloured by Cerebus bank" in dom
    texts, _ = pdf_pages(rig_plan / "report.pdf")
    first = " ".join(texts[0].split())
    assert "Power at the planned 1,400 trials per site" in first and "Right: the array as on its map" in first


def test_a_session_run_from_the_trial_list_is_analysed_with_no_mapping(rig_plan, tmp_path, capsys):
    """The virtual subject runs rig/trials.csv; `stimsim analyze` reads the NWB it writes as it is and recovers the
    subject's per-site effects as well as from a `subject session` of as many trials."""
    rig_session, plain_session = tmp_path / "rig.nwb", tmp_path / "plain.nwb"
    assert main(["subject", "session", str(rig_plan), "--trials", str(rig_plan / "rig" / "trials.csv"),
                 "--out", str(rig_session), "--seed", "4"]) == 0
    assert main(["subject", "session", str(rig_plan), "--trials-per-site", str(TRIALS_PER_SITE),
                 "--out", str(plain_session), "--seed", "4"]) == 0
    summary = json.loads((rig_plan / "summary.json").read_text())
    lapse = summary["subject_lapse_rate"]
    with xr.open_dataset(rig_plan / "truth" / "subject_p_high.nc", engine="h5netcdf") as truth:
        p = lapse / 2 + (1 - lapse) * truth["subject_p_high"].sel(electrode=summary["chosen_electrodes"]).mean(
            "sequence").transpose("electrode", "stimulated", "step").values
    steps = np.linspace(0, 1, p.shape[-1])
    expected = dict(zip(summary["chosen_electrodes"], delta_auc_of_counts(p, np.ones_like(p), steps)))
    errors = {}
    for name, session in (("rig", rig_session), ("plain", plain_session)):
        assert main(["analyze", str(session), "--plan", str(rig_plan), "--out", str(tmp_path / name),
                     "--no-progress"]) == 0
        observed = pd.read_csv(tmp_path / name / "sites.csv", dtype={"electrode": str}).set_index("electrode")
        assert sorted(observed.index) == sorted(expected)
        errors[name] = np.array([observed.loc[e, "delta_auc"] - expected[e] for e in expected])
    capsys.readouterr()
    # binomial SE of a site's ΔAUC: ~ sqrt(Σ w² p (1 − p) / n) over both conditions, n trials per cell
    weights = np.full(p.shape[-1], 1.0 / (p.shape[-1] - 1))
    weights[[0, -1]] /= 2
    n_cell = TRIALS_PER_SITE / (2 * p.shape[-1])
    se = np.sqrt((weights ** 2 * p * (1 - p) / n_cell).sum(axis=(1, 2)))
    assert np.all(np.abs(errors["rig"]) < 4 * se)
    assert np.abs(errors["rig"]).mean() < 2 * np.abs(errors["plain"]).mean() + se.mean()


def test_a_trial_list_beyond_the_plans_steps_names_the_row_and_the_range(rig_plan, tmp_path, capsys):
    trials = pd.read_csv(rig_plan / "rig" / "trials.csv", dtype={"electrode": str, "stimulated_electrode": str})
    last_step = int(trials["step"].max())
    beyond = tmp_path / "beyond.csv"
    edited = trials.assign(step=np.where(trials.index == 7, last_step + 2, trials["step"]))
    edited.drop(columns=["stimulus_id"]).to_csv(beyond, index=False)  # an id naming the step is checked before
    assert main(["subject", "session", str(rig_plan), "--trials", str(beyond), "--out", str(tmp_path / "s.nwb")]) == 2
    assert (f"{beyond}: column 'step', data row(s) 8: step {last_step + 2} is beyond the plan's (allowed steps "
            f"0..{last_step})") in capsys.readouterr().err


def test_analyze_warns_when_the_session_ran_another_protocol_than_the_plans(rig_plan, tmp_path, capsys):
    """A session whose stimulation trials ran at 50 Hz and 1 ms phases (five times the plan's charge per phase) is
    analysed against the plan's 200 Hz, 0.2 ms predictions only with a warning naming both settings."""
    session = tmp_path / "session.csv"
    assert main(["subject", "session", str(rig_plan), "--trials", str(rig_plan / "rig" / "trials.csv"),
                 "--csv", str(session), "--out", str(tmp_path / "session.nwb")]) == 0
    table = pd.read_csv(session, dtype={"electrode": str, "stimulated_electrode": str})
    stimulated = table["stimulated_electrode"] != "sham"
    assert main(["analyze", str(session), "--plan", str(rig_plan), "--out", str(tmp_path / "as_planned"),
                 "--boot", "10", "--perm", "10", "--splits", "5", "--no-progress"]) == 0
    assert "stimulation trials give" not in capsys.readouterr().err
    table.loc[stimulated, "frequency_Hz"] = 50.0
    table.loc[stimulated, "pulse_width_ms"] = 1.0
    table.loc[stimulated, "train_onset_ms"] = 0.0  # the plan's trains start 20 ms before the image
    table.loc[stimulated.to_numpy().nonzero()[0][:3], "train_ms"] = np.nan  # three trials that give no train
    table.to_csv(session, index=False)
    assert main(["analyze", str(session), "--plan", str(rig_plan), "--out", str(tmp_path / "other"),
                 "--boot", "10", "--perm", "10", "--splits", "5", "--no-progress"]) == 0
    error = capsys.readouterr().err
    n = int(stimulated.sum())
    for expected in (f"frequency_Hz: {n} of {n} stimulation trials give 50 Hz, where the plan stimulates at 200 Hz",
                     f"pulse_width_ms: {n} of {n} stimulation trials give 1 ms",
                     f"train_ms: 3 of {n} stimulation trials give nan ms (nan: no value), where",
                     f"train_onset_ms: {n} of {n} stimulation trials give 0 ms, where the plan's "
                     "trains start at -20 ms from image onset"):
        assert f"stimsim: warning: {expected}" in error, error
    warned = json.loads((tmp_path / "other" / "summary.json").read_text())["warnings"]
    assert sum("where the plan stimulates at" in message for message in warned) == 3


def test_the_nwb_template_is_of_the_plans_subject(rig_plan):
    """The session a lab fills in from rig/trials.nwb reads against its own plan: the file names the plan's subject
    (it had named 'subject', which `analyze --plan` refuses for a plan of another subject)."""
    from pynwb import NWBHDF5IO

    with NWBHDF5IO(str(rig_plan / "rig" / "trials.nwb"), "r") as io:
        template = io.read()
        assert template.subject.subject_id == json.loads((rig_plan / "summary.json").read_text())["subject_id"]
        assert len(template.trials) == len(pd.read_csv(rig_plan / "rig" / "trials.csv"))


def test_the_nwb_trials_table_reads_back_as_written(tmp_path):
    """Every column comes back with its values and type: text (empty, non-ASCII), integers, booleans, floats with
    the sham trials' NaN, the trial clock; each described as the trial list describes it."""
    from pynwb import NWBHDF5IO

    trials = pd.DataFrame({"start_time": [0.0, 1.5, 3.0], "stop_time": [1.0, 2.5, 4.0], "trial": [1, 2, 3],
                           "electrode": ["07", "elec12", "07"], "stimulated_electrode": ["sham", "elec12", "sham"],
                           "stimulus_id": ["07_seq0_step0", "elec12_seq1_step6", "µ_seq0_step3"],
                           "step": [0, 6, 3], "current_uA": [0.0, 150.0, 0.0],
                           "frequency_Hz": [np.nan, 200.0, np.nan], "correct": [True, False, True],
                           "choice": ["", "", ""]})
    path = write_trials_nwb(trials, tmp_path / "trials.nwb", subject_id="m1", session_id="planned",
                            description="trial list", template=True)
    with NWBHDF5IO(str(path), "r") as io:
        table = io.read().trials
        read = table.to_dataframe().reset_index(drop=True)
        described = {name: table[name].description for name in ("start_time", "frequency_Hz", "choice")}
    pd.testing.assert_frame_equal(read, trials, check_dtype=False)
    assert [str(read[name].dtype) for name in ("trial", "step", "current_uA", "correct")] == \
        ["int64", "int64", "float64", "bool"]
    assert described == {"start_time": "Start time of epoch, in seconds",
                         "frequency_Hz": "pulse frequency of the train, Hz (empty on sham trials)",
                         "choice": "the animal's choice, 'low' or 'high' (empty in the template: fill in on the rig)"}


def test_blank_text_cells_of_a_lab_s_trial_list_are_written_as_empty_text(tmp_path):
    """A trial list with a column of the lab's own notes, or a bank left blank, reads blank cells as NaN among
    text: the session's NWB file holds them as "" (writing it ended in h5py's TypeError)."""
    from pynwb import NWBHDF5IO

    trials = pd.DataFrame({"start_time": [0.0, 1.5, 3.0], "stop_time": [1.0, 2.5, 4.0], "bank": ["A", np.nan, "B"],
                           "note": [np.nan, "blinked", np.nan]})
    path = write_trials_nwb(trials, tmp_path / "session.nwb", subject_id="m1", session_id="s1", description="session")
    with NWBHDF5IO(str(path), "r") as io:
        read = io.read().trials.to_dataframe()
    assert read["bank"].tolist() == ["A", "", "B"] and read["note"].tolist() == ["", "blinked", ""]


def test_a_trial_list_cut_off_mid_row_is_refused_before_any_session_is_written(rig_plan, tmp_path, capsys):
    text = (rig_plan / "rig" / "trials.csv").read_text()
    lines = text.splitlines()
    cut = tmp_path / "trials.csv"
    cut.write_text("\n".join(lines[:5]) + "\n" + lines[5][: lines[5].index(",", lines[5].index(",") + 1)] + "\n")
    session = tmp_path / "session.nwb"
    assert main(["subject", "session", str(rig_plan), "--trials", str(cut), "--out", str(session)]) == 2
    error = capsys.readouterr().err
    assert f"{cut}: refused (nothing loaded): " in error and "row(s) 5" in error, error
    assert not session.exists()


def test_a_trial_list_with_rows_given_twice_or_unnumbered_trials_is_refused(rig_plan, tmp_path, capsys):
    """Rows pasted twice would run (and count) their trials twice; a trial list numbers each trial once, from 1."""
    lines = (rig_plan / "rig" / "trials.csv").read_text().splitlines()
    twice = tmp_path / "twice.csv"
    twice.write_text("\n".join(lines[:4] + lines[2:4] + lines[4:]) + "\n")
    unnumbered = tmp_path / "unnumbered.csv"
    unnumbered.write_text("\n".join(lines[:1] + ["0" + lines[1][lines[1].index(","):]] + lines[2:]) + "\n")
    session = tmp_path / "session.nwb"
    for listed, expected in ((twice, "column 'trial': trial 2 is listed twice (data rows 2 and 4)"),
                             (unnumbered, "column 'trial': trial numbers are integers from 1; data row 1 has '0'")):
        assert main(["subject", "session", str(rig_plan), "--trials", str(listed), "--out", str(session)]) == 2
        assert f"{listed}: {expected}" in capsys.readouterr().err
        assert not session.exists()


def test_a_trial_list_for_another_protocol_or_not_a_csv_is_refused(rig_plan, tmp_path, capsys):
    """The subject's responses were computed at the plan's protocol (150 µA, 200 Hz, 0.2 ms): a list whose
    stimulation trials say otherwise, or whose condition disagrees with the stimulated electrode, would put a
    protocol into the session that the choices never saw."""
    trials = pd.read_csv(rig_plan / "rig" / "trials.csv", dtype={"electrode": str, "stimulated_electrode": str})
    stimulated = trials.index[trials["condition"] == "stimulation"]
    sham = trials.index[trials["condition"] == "sham"]
    first = trials.loc[stimulated[0], "trial"]
    edits = [("current_uA", stimulated, 300.0, "column 'current_uA', trial(s)", "the plan stimulates at 150 µA"),
             ("frequency_Hz", stimulated[:2], 2000.0, "column 'frequency_Hz', trial(s)", "at 200 Hz"),
             ("pulse_width_ms", stimulated[:1], 0.4, f"column 'pulse_width_ms', trial(s) {first} (e.g. 0.4)",
              "at 0.2 ms"),
             ("train_onset_ms", stimulated[:1], 0.0, f"column 'train_onset_ms', trial(s) {first} (e.g. 0.0)",
              "the plan's trains start at -20 ms from image onset"),
             ("condition", stimulated[:1], "Stim", f"column 'condition', trial(s) {first} (e.g. 'Stim')",
              "must be 'stimulation' where"),
             ("condition", sham[:1], "stimulation",
              f"column 'condition', trial(s) {trials.loc[sham[0], 'trial']} (e.g. 'stimulation')",
              "'sham' where it is 'sham'")]
    session = tmp_path / "session.csv"
    for column, rows, value, where, what in edits:
        edited = trials.copy()
        edited[column] = edited[column].astype(object)
        edited.loc[rows, column] = value
        path = tmp_path / f"edited_{column}.csv"
        edited.to_csv(path, index=False)
        assert main(["subject", "session", str(rig_plan), "--trials", str(path), "--csv", str(session)]) == 2
        error = capsys.readouterr().err
        assert f"{path}: {where}" in error and what in error, error
    (tmp_path / "empty.csv").write_bytes(b"")
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe,trial\n")
    for name, message in (("empty.csv", "empty: a trial list has a header line"),
                          ("binary.csv", "not a CSV trial list (UnicodeDecodeError")):
        assert main(["subject", "session", str(rig_plan), "--trials", str(tmp_path / name), "--csv", str(session)]) == 2
        assert f"{tmp_path / name}: {message}" in capsys.readouterr().err
    assert not session.exists()


def test_a_trial_list_showing_other_images_than_the_plans_is_refused(rig_plan, tmp_path, capsys):
    """The subject answers by site, sequence and step; the rig shows the image file: a list whose stimulus is
    given another file or step than the plan gives it, or that names an image the plan never made, would show the
    animal one image and analyse it as another."""
    trials = pd.read_csv(rig_plan / "rig" / "trials.csv", dtype={"electrode": str, "stimulated_electrode": str})
    other = trials.index[(trials["stimulus_id"] != trials.loc[0, "stimulus_id"])][0]
    last_step = int(trials["step"].max())
    edits = [("image_file", trials.loc[other, "image_file"], f"column 'image_file', trial(s) 1 (e.g. "
              f"'{trials.loc[other, 'image_file']}'): the plan's trial list gives stimulus "
              f"'{trials.loc[0, 'stimulus_id']}' image_file '{trials.loc[0, 'image_file']}'. A trial must show the "
              "image whose responses the plan computed"),
             ("step", (trials.loc[0, "step"] + 1) % (last_step + 1),  # caught by the session rules already
              "column 'stimulus_id', row(s) 1: the image id names another step than column 'step'"),
             ("stimulus_id", "not_a_plan_image", "column 'stimulus_id', trial(s) 1 (e.g. 'not_a_plan_image'): not "
              f"an image of the plan's trial list {rig_plan / 'rig' / 'trials.csv'}")]
    session = tmp_path / "session.csv"
    for column, value, expected in edits:
        edited = trials.copy()
        edited[column] = edited[column].astype(object)
        edited.loc[0, column] = value
        path = tmp_path / f"edited_{column}.csv"
        edited.to_csv(path, index=False)
        assert main(["subject", "session", str(rig_plan), "--trials", str(path), "--csv", str(session)]) == 2
        error = capsys.readouterr().err
        assert f"{path}: " in error and expected in error, error
    assert not session.exists()


def test_a_rig_package_written_again_holds_no_half_written_file_of_a_killed_write(tmp_path):
    """A plan killed (SIGKILL) while writing its rig package leaves the hidden temporary file of the image it was
    writing in rig/images; the re-run that writes the package removes it, so that the folder the lab copies to the
    rig (where stimulus software may load every *.png) holds the plan's images only."""
    electrodes = ["a", "b"]
    images = sequence_images(electrodes, 1, 3)
    spec = RigSpec(session=SessionTable(trials_per_site=6))
    stimulation = {"current_uA": 50.0, "frequency_Hz": 200.0, "pulse_width_ms": 0.2, "interphase_ms": 0.1,
                   "waveform": "biphasic_cathodic_first", "train_ms": 50.0}
    trials = trial_list(electrodes, images, spec, stimulation, seed=0)
    pixels = {entry["image_file"]: np.full((8, 8), 0.5) for entries in images.values() for entry in entries}
    rig = tmp_path / "rig"
    (rig / "images").mkdir(parents=True)
    left = [rig / "images" / ".a_seq0_step1.png.k3x9wq.tmp.png", rig / ".trials.csv.q2w8rt.tmp.csv"]
    for path in left:
        path.write_bytes(b"\x89PNG cut off")
    write_rig(tmp_path, pixels, spec, trials, "test", stimulation)
    assert sorted(path.name for path in (rig / "images").iterdir()) == [f"{e}_seq0_step{k}.png" for e in electrodes
                                                                        for k in range(3)]
    assert not any(path.exists() for path in left)


def test_a_trial_list_edited_inside_the_plan_says_to_edit_a_copy(tmp_path):
    """A lab that removes a row of rig/trials.csv where the plan wrote it is told that the plan checks against that
    file and to edit a copy outside the plan directory: not that the plan is damaged, with advice to run the plan
    again, which would write the plan's list back over the lab's edit."""
    from stimsim.analysis.plan_readback import check_plan_files, write_plan_files

    (tmp_path / "rig").mkdir()
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "rig" / "trials.csv").write_text("trial,electrode\n1,5\n2,6\n")
    write_plan_files(tmp_path, ["summary.json", "rig/trials.csv"])
    (tmp_path / "rig" / "trials.csv").write_text("trial,electrode\n1,5\n")
    with pytest.raises(FileFormatError) as refused:
        check_plan_files(tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'rig' / 'trials.csv'}: changed since `stimsim plan` wrote it")
    assert "edit a copy outside the plan directory" in message and "damaged" not in message
    (tmp_path / "rig" / "trials.csv").write_text("trial,electrode\n1,5\n2,6\n")
    (tmp_path / "summary.json").write_text('{"n_sites": 1}')
    with pytest.raises(FileFormatError, match="the plan directory is damaged"):
        check_plan_files(tmp_path)


def test_sham_and_stimulation_show_each_image_equally_often_at_any_trial_count():
    """15 and 20 blocks over a site's 14 images: one full pass and 1 or 6 images more, the same ones in both
    conditions, so that every image is shown as often with stimulation as without."""
    stimulation = {"current_uA": 50, "frequency_Hz": 200, "pulse_width_ms": 0.2, "train_ms": 50}
    images = sequence_images(["a", "b"], 2, 7)
    for trials_per_site, extra in ((30, 1), (40, 6)):
        trials = trial_list(["a", "b"], images, RigSpec(session=SessionTable(trials_per_site=trials_per_site)),
                            stimulation, seed=5)
        counts = trials.groupby(["electrode", "stimulus_id", "condition"]).size().unstack("condition")
        assert len(counts) == 2 * 14 and (counts["sham"] == counts["stimulation"]).all()
        assert sorted(counts["sham"].groupby("electrode").apply(lambda c: int((c == 2).sum()))) == [extra, extra]
        for _, shown in trials.groupby(["electrode", "condition"]):  # every image once before any repeats
            assert shown["stimulus_id"].iloc[:14].nunique() == 14


def test_sham_rows_written_in_another_case_are_simulated_as_sham(rig_plan, tmp_path):
    """The session reader accepts 'Sham' for 'sham'; the subject must then run those trials without stimulation:
    the same seeded choices as the list as written by the plan."""
    trials = pd.read_csv(rig_plan / "rig" / "trials.csv", dtype={"electrode": str, "stimulated_electrode": str})
    edited = tmp_path / "trials_Sham.csv"
    trials.assign(stimulated_electrode=trials["stimulated_electrode"].replace("sham", "Sham")).to_csv(edited, index=False)
    choices = []
    for listed in (rig_plan / "rig" / "trials.csv", edited):
        out = tmp_path / f"{listed.stem}_session.csv"
        assert main(["subject", "session", str(rig_plan), "--trials", str(listed), "--csv", str(out)]) == 0
        choices.append(pd.read_csv(out)["choice"].tolist())
    assert choices[0] == choices[1]


def test_the_protocol_check_reads_sham_as_the_session_files_do():
    from stimsim.planning.rig import check_trial_protocol

    plan = {"current_uA": 50.0, "frequency_Hz": 200.0, "pulse_width_ms": 0.2, "train_ms": 50.0}
    trials = pd.DataFrame({"trial": [1, 2], "stimulated_electrode": [" Sham", "e3"], "condition": ["SHAM", "stimulation"],
                           "current_uA": [0.0, 50.0], "frequency_Hz": [np.nan, 200.0]})
    check_trial_protocol(trials, "trials.csv", plan)  # a sham row in other case is no stimulation trial
    with pytest.raises(FileFormatError, match=r"trials.csv: column 'current_uA', trial\(s\) 2 \(e.g. 5.0\): the plan "
                                              r"stimulates at 50 µA"):
        check_trial_protocol(trials.assign(current_uA=[0.0, 5.0]), "trials.csv", plan)


def test_a_trial_list_session_takes_no_trial_count_or_site_choice(tmp_path, capsys):
    for extra in (["--trials-per-site", "40"], ["--sites", "all"]):
        assert main(["subject", "session", str(tmp_path), "--trials", str(tmp_path / "trials.csv"),
                     "--csv", str(tmp_path / "s.csv"), *extra]) == 2
        assert "--trials runs that trial list as it is; --trials-per-site and --sites apply without it" in \
            capsys.readouterr().err
    assert not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("distance, message", [
    ("0.57", r"'viewing_distance_cm' must lie between 10 and 500 cm, .* got 0.57 \(a distance in metres\? 0.57 m is 57 "
             r"cm\)"),
    ("5700", r"'viewing_distance_cm' must lie between 10 and 500 cm, .* got 5700$"),
])
def test_a_viewing_distance_in_other_units_than_cm_is_refused(tmp_path, distance, message):
    """0.57 (metres for the usual 57 cm) would make every image 100 times smaller on the screen than planned."""
    path = _write(tmp_path)
    path.write_text(path.read_text().replace("viewing_distance_cm = 50", f"viewing_distance_cm = {distance}"))
    with pytest.raises(ConfigError, match=r"plan.toml \[display\]: " + message):
        load_plan_config(path)


def test_trial_list_is_seeded_and_session_table_settings_are_checked(tmp_path):
    stimulation = {"current_uA": 50, "frequency_Hz": 200, "pulse_width_ms": 0.2, "train_ms": 50}
    spec = RigSpec(session=SessionTable(trials_per_site=28))
    images = sequence_images(["a", "b"], 2, 7)
    first = trial_list(["a", "b"], images, spec, stimulation, seed=1)
    assert first.equals(trial_list(["a", "b"], images, spec, stimulation, seed=1))
    assert not first.equals(trial_list(["a", "b"], images, spec, stimulation, seed=2))
    assert "channel" not in first  # no banks without a .cmp map
    path = _write(tmp_path, trials=401)
    with pytest.raises(ConfigError, match=r"plan.toml \[session\]: 'trials_per_site' must be even"):
        load_plan_config(path)
    path.write_text(path.read_text().replace("trials_per_site = 401", "trials_per_site = 10"))
    with pytest.raises(ConfigError, match=r"plan.toml \[session\]: 'trials_per_site' must be >= 14"):
        load_plan_config(path)
    path.write_text(path.read_text().replace("trials_per_site = 10", "trials_per_site = 100000000"))
    with pytest.raises(ConfigError, match=r"plan.toml \[session\]: 'trials_per_site' must be <= 20000"):
        load_plan_config(path)
    path.write_text(path.read_text().replace("trials_per_site = 100000000", "trials_per_site = 400")
                    .replace("size_deg = 6", "size_deg = 0"))
    with pytest.raises(ConfigError, match=r"plan.toml \[display\]: 'size_deg' must be > 0.0, got 0"):
        load_plan_config(path)
    path.write_text(path.read_text().replace("size_deg = 0", "size_deg = 6\nscreen = 1"))
    with pytest.raises(ConfigError, match=r"\[display\].*screen"):
        load_plan_config(path)
    # the session and display change no computed phase: a plan's cache stays valid
    path.write_text(path.read_text().replace("\nscreen = 1", ""))
    config = load_plan_config(path)
    path.write_text(path.read_text().replace("size_deg = 6", "size_deg = 10"))
    assert load_plan_config(path).digest() == config.digest() and load_plan_config(path).rig.size_deg == 10
    unnamed = path.read_text().replace('name = "rig"\n', "")  # its name is then the file's
    path.write_text(unnamed)
    renamed = path.with_name("plan_for_tuesday.toml")  # the same plan under another file name keeps its cache
    renamed.write_text(unnamed)
    assert load_plan_config(renamed).name == "plan_for_tuesday"
    assert load_plan_config(renamed).digest() == load_plan_config(path).digest() == config.digest()


def test_power_forecast_warns_only_when_the_effects_are_too_small():
    """Large planted effects (P(high) up by 0.3 at every step) are detected at 400 trials per site; tiny ones (0.002)
    are not, and say so."""
    base = np.linspace(0.1, 0.8, 7)
    for shift, warned in ((0.2, False), (0.002, True)):
        curves = np.stack([np.stack([base, base + shift]) for _ in range(6)])
        result = forecast(curves, [f"s{i}" for i in range(6)], np.full(6, shift), 400, seed=0)
        power = result["power_at_planned_trials"]
        assert (result["power_warning"] is not None) == warned
        if warned:
            assert power["across_sites"] < 0.8 and "400 trials per site" in result["power_warning"]
            assert result["trials_per_site_needed"]["across_sites"] is None  # more than 6,400
        else:
            assert power["across_sites"] >= 0.8 and power["per_site_mean"] > 0.8
            assert result["trials_per_site_needed"]["across_sites"] <= 400
    # 4 sites: the exact one-sided Wilcoxon p is at least 1/16 > 0.05, however large the effects
    strong = np.stack([np.stack([base, base + 0.2]) for _ in range(4)])
    result = forecast(strong, ["a", "b", "c", "d"], np.full(4, 0.2), 400, seed=0)
    assert result["power_at_planned_trials"]["across_sites"] == 0
    assert ("(mean); no trial count reaches 80% power across sites (with 4 site(s) the test across sites can never "
            "reach p < 0.05: it needs at least 5; its smallest p is 1/2^n), and per site it needs"
            in result["power_warning"])
    assert "trials per site across sites" not in result["power_warning"]  # no "more than 6,400 ... across sites"


def test_the_report_says_when_too_few_sites_make_the_test_across_sites_impossible():
    """With 4 sites the exact one-sided Wilcoxon p is at least 1/2^4 > 0.05: the report's forecast says that no trial
    count reaches the power across sites, rather than "more than 6,400" trials; with 6 sites it gives the count."""
    from stimsim.planning.report import detectability_blocks

    base = np.linspace(0.1, 0.8, 7)
    for n_sites in (4, 6):
        strong = np.stack([np.stack([base, base + 0.2]) for _ in range(n_sites)])
        summary = forecast(strong, [f"s{i}" for i in range(n_sites)], np.full(n_sites, 0.2), 400, seed=0)
        (paragraph,) = detectability_blocks(summary)
        needed = summary["trials_per_site_needed"]["across_sites"]
        if n_sites == 4:
            assert needed is None and ("Trials per site for 80% power: none across sites (fewer than 5 sites)"
                                       in paragraph.text)
            assert "more than 6,400 across sites" not in paragraph.text
        else:
            assert f"Trials per site for 80% power: {needed:,} across sites" in paragraph.text


def test_plan_with_tiny_effects_warns_on_stderr(rig_plan, tmp_path, capsys):
    summary = json.loads((rig_plan / "summary.json").read_text())
    if summary["power_warning"] is None:
        pytest.skip("the fixture's effects are detectable")
    config = rig_plan.parent / "config" / "plan.toml"
    assert main(["plan", str(config), "--out", str(rig_plan), "--no-progress"]) == 0  # cached: only the outputs
    assert f"stimsim: warning: {summary['power_warning']}" in capsys.readouterr().err


def test_model_to_subject_error_from_the_candidates_spread():
    """Two candidates disagreeing by ±d at every site: σ² = var(ddof 1) = 2 d², the mean of 2 lies σ √(3/2) from a
    third instance; the interval grows by 1.96 that in quadrature."""
    d = 0.01
    fitted = np.array([[0.1 + d, 0.2 - d, 0.3 + d], [0.1 - d, 0.2 + d, 0.3 - d]])
    sd = subject_error_sd(fitted)
    assert sd == pytest.approx(math.sqrt(2 * d ** 2 * 1.5))
    low, high = with_subject_error([0.1], [0.09], [0.13], sd)
    assert low[0] == pytest.approx(0.1 - math.hypot(0.01, 1.959964 * sd), rel=1e-6)
    assert high[0] == pytest.approx(0.1 + math.hypot(0.03, 1.959964 * sd), rel=1e-6)
    assert subject_error_sd(fitted[:1]) is None
    assert np.isnan(with_subject_error([0.1], [0.09], [0.13], None)[0]).all()


def test_the_validation_figure_keeps_its_legend_off_the_points(monkeypatch):
    """Planned against true effects: the legend sits beside the axes, so that it hides no electrode's point (in the
    corner a legend placed by matplotlib covered points of a face plan)."""
    import stimsim.planning.report as plan_report

    drawn = []
    monkeypatch.setattr(plan_report, "figure_png", drawn.append)
    rng = np.random.default_rng(0)
    predicted = rng.normal(0, 0.005, 40)
    plan = {"predicted": predicted, "low": predicted - 0.003, "high": predicted + 0.003}
    truth = {"dead": np.zeros(40, dtype=bool), "delta_p_face": rng.normal(0, 0.003, (40, 2))}
    summary = {"chosen_electrodes": ["3", "7"], "predicted_vs_true_r": 0.16}
    plan_report.truth_figure(plan, truth, summary, "delta_p_face", "ΔP(face)", [str(i) for i in range(40)])
    (ax,) = drawn[0].axes
    renderer = drawn[0].canvas.get_renderer()
    legend, axes = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.x0 >= axes.x1  # wholly to the right of the axes
    assert [text.get_text() for text in ax.get_legend().get_texts()] == ["identity", "other working electrodes",
                                                                         "chosen sites"]


def test_the_map_caption_says_grey_when_the_images_have_no_face_labels():
    from types import SimpleNamespace

    from stimsim.planning.report import sheet_caption

    labelled = SimpleNamespace(labels={"category": np.array(["face", "object", "face"])})
    unlabelled = SimpleNamespace(labels={})
    assert "coloured by face selectivity" in sheet_caption(labelled, 0.3, banks=True)
    caption = sheet_caption(unlabelled, 0.3, banks=False)
    assert "coloured by face selectivity" not in caption and "in grey (the images have no 'domain' or 'category' labels" in caption
    assert "cells coloured by Cerebus bank" not in caption


def test_the_registration_caption_gives_one_consistency_radius_or_names_each_candidate():
    from stimsim.planning.report import consistency_radius_text

    same = {"a": {"consistency_radius_mm": 0.2}, "b": {"consistency_radius_mm": 0.2}}
    assert consistency_radius_text(same, ["a", "b"]) == "0.2 mm"
    differing = {"a": {"consistency_radius_mm": 0.2}, "b": {"consistency_radius_mm": 0.3}}
    assert consistency_radius_text(differing, ["a", "b"]) == "0.2 mm (a), 0.3 mm (b)"


def test_the_trial_lists_step_of_a_face_plan_is_described_as_the_index_of_its_signal_level():
    """A face plan's trial list holds the index of each image's signed visual-signal level (an image at -40 % of
    the levels -40, 0, 40 is step 0), and the column's description says so rather than calling it the level."""
    from stimsim.planning.rig import TRIAL_COLUMNS
    from stimsim.planning.tasks.face_categorization import steps_of

    assert steps_of([-40.0, 0.0, 40.0], np.array([-40.0, 0.0, 40.0])).tolist() == [0, 1, 2]
    description = TRIAL_COLUMNS["step"]
    assert "face task: index of the signed visual-signal level" in description
    assert "signed_signal_percent" in description
