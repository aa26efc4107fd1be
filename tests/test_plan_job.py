"""`stimsim plan` end to end on small settings: outputs, ranking and constraints, the rendered report, resuming,
a plan killed mid-run and resumed, refusals, sessions from the virtual subject, and the validation null."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from stimsim.cli import main
from stimsim.planning.config import load_plan_config
from stimsim.planning.job import run_plan
from stimsim.planning.selection import separation_mm
from stimsim.planning.validation import meets_targets, pooled_permutation
from stimsim.utilities.errors import ConfigError, DataError, SafetyError

SUBJECT = """
[subject]
model = "stimsim-topo-s2"
seed = 7
lapse_rate = 0.02

[array]
layout = "layout.csv"
dead_electrodes = ["e16"]

[recording]
radius_mm = 0.25
repeats = 4

[[stimuli]]
source = "lfw_subset"
"""

PLAN = """
name = "small"
seed = 0
[models]
candidates = ["stimsim-topo-s0"]
n_folds = 3
[subject]
config = "subject.toml"
[array]
broken_electrodes = {broken}
[registration]
n_boot = 2
[sequences]
n_sequences = 2
iterations = 8
learning_rate = 0.05
recording_radius_mm = 0.25
[decoder]
n_noise = 6
n_eval = 3
[stimulation]
current_uA = {current}
[selection]
n_sites = 4
min_separation_mm = 0.8
metric = "manhattan"
"""


PERCEPTS = """
name = "plan_view"
model = "stimsim-topo-s2"            # replaced by the plan's chosen model
summary_groups = ["nonface"]
[[images]]
group = "nonface"
source = "lfw_subset"
only = { category = "nonface" }
n = 1
[localizer]
sets = [{ source = "lfw_subset" }]
label = "category"
positive = "face"
[sites]                              # replaced by the plan's sites
method = "explicit"
recording_radius_mm = 0.5
face_site_mm = [0.0, 0.0]
control_site_mm = [0.0, 0.0]
[stimulation]
currents_uA = [50, 150]
[inversion]
steps = 10
[judge]
model = "stimsim-topo-s1"
"""


def _write_plan(directory, current=50, broken='["e1"]'):
    directory.mkdir(parents=True, exist_ok=True)
    xs, ys = np.meshgrid(np.arange(4) * 0.4 - 0.6, np.arange(4) * 0.4 - 0.6)
    rows = [f"e{i + 1},{x:.2f},{y:.2f}" for i, (x, y) in enumerate(zip(xs.ravel(), ys.ravel()))]
    (directory / "layout.csv").write_text("electrode_id,x_mm,y_mm\n" + "\n".join(rows) + "\n")
    (directory / "subject.toml").write_text(SUBJECT)
    path = directory / "plan.toml"
    path.write_text(PLAN.format(current=current, broken=broken))
    return path


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory, one_torch_thread):
    """The small plan, with the report's percept view ([percepts]: :data:`PERCEPTS`)."""
    base = tmp_path_factory.mktemp("plan")
    config = _write_plan(base / "config")
    (base / "config" / "view.toml").write_text(PERCEPTS)
    config.write_text(config.read_text() + '\n[percepts]\nconfig = "view.toml"\n')
    out = base / "out"
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 0
    return config, out


def test_plan_writes_every_output(plan_dir):
    _, out = plan_dir
    for name in ("report.html", "report.pdf", "sites.csv", "plan.nc", "summary.json", "config.json",
                 "truth/subject_p_high.nc", "subject/recordings.nc"):
        assert (out / name).is_file(), name
    sites = pd.read_csv(out / "sites.csv", dtype={"electrode_id": str})
    for column in ("rank", "electrode_id", "array_x_mm", "array_y_mm", "model_x_mm", "model_y_mm",
                   "predicted_delta_auc", "predicted_delta_auc_low", "predicted_delta_auc_high", "current_uA",
                   "frequency_Hz", "pulse_width_ms", "charge_per_phase_nC", "safety_verdict"):
        assert column in sites
    assert sites["rank"].tolist() == list(range(1, len(sites) + 1))
    assert np.all(np.diff(sites["predicted_delta_auc"]) <= 0)  # ranked largest first
    # Numbers are written to 10 significant digits, without binary tails such as -0.6000000000000001.
    for token in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", (out / "sites.csv").read_text()):
        assert len(token.split("e")[0].lstrip("-").replace(".", "").lstrip("0")) <= 10, token
    assert "e1" not in set(sites["electrode_id"])  # broken: not rehearsed
    assert "e16" not in set(sites["electrode_id"])  # dead: its split-half reliability is ~0
    summary = json.loads((out / "summary.json").read_text())  # named as left out, the broken e1 not
    assert summary["left_out_electrodes"] == {"constant_response": [], "reliability_undefined": [],
                                              "below_min_reliability": ["e16"]}
    assert summary["left_out_warning"].endswith("below min_reliability = 0.3: 1 (e16)")
    assert f"Warning: {summary['left_out_warning']}." in (out / "report.html").read_text()
    assert np.allclose(sites["charge_per_phase_nC"], 50 * 0.2)  # 50 µA × 0.2 ms = 10 nC
    chosen = sites[sites["chosen"]]
    assert 1 <= len(chosen) <= 4
    xy = chosen[["array_x_mm", "array_y_mm"]].to_numpy()
    for i in range(len(xy)):
        for j in range(i):
            assert separation_mm(xy[i], xy[j], "manhattan") >= 0.8 - 1e-9
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "sequence_2afc" and summary["n_sites"] == len(chosen)
    assert summary["chosen_electrodes"] == chosen["electrode_id"].tolist()
    assert -1 <= summary["predicted_vs_true_r"] <= 1 and summary["current_uA"] == 50
    assert summary["subject_dir"].endswith("subject")
    # the effects' spread across the subject's living electrodes, planned and true (sample SDs)
    alive = [e for e in summary["true_delta_auc"] if e not in summary["dead_electrodes_rehearsed"]]
    assert summary["true_effect_sd"] == pytest.approx(np.std([summary["true_delta_auc"][e] for e in alive], ddof=1))
    assert summary["predicted_effect_sd"] == pytest.approx(
        np.std([summary["predicted_delta_auc"][e] for e in alive], ddof=1))
    # 32 px networks trained from scratch: the candidates' and the subject's architecture family
    assert summary["candidate_base_networks"] == ["stimsim_topo"] and summary["subject_base_network"] == "stimsim_topo"
    phases = summary["phases"]  # every phase computed in this first run
    assert set(phases) == {"inputs", "mapping", "sequences", "rehearsal_stimsim-topo-s0", "percepts", "truth"}
    assert not any(t["cached"] for t in phases.values())
    assert all(t["seconds"] > 0 for t in phases.values())
    assert summary["phases_seconds_total"] == pytest.approx(sum(t["seconds"] for t in phases.values()), abs=1e-2)
    config = json.loads((out / "config.json").read_text())
    assert set(config["model_checksums"]["stimsim-topo-s0"]) == {"model.json", "weights.pt"}
    from stimsim.models.registry import SHIPPED_DIR

    assert config["model_directories"] == {"stimsim-topo-s0": str(SHIPPED_DIR / "stimsim-topo-s0")}
    assert "software" in config and config["config"]["stimulation"]["current_uA"] == 50
    with xr.open_dataset(out / "plan.nc", engine="h5netcdf") as plan:
        assert plan["sequence_image"].dims == ("electrode", "sequence", "step", "y", "x")
        assert plan["p_high"].sizes["stimulated"] == 2 and plan["p_high"].sizes["step"] == 7
        assert plan.sizes["pose"] == 3  # fitted + 2 bootstrap poses
        assert [name for name in plan.data_vars if "description" not in plan[name].attrs] == []  # each says what it is
        assert plan["cortex_x_mm"].attrs["description"].endswith("in cortex mm (the model's recorded scale)")
        # the ranking's reproducibility over sequences, from one-way ANOVA sums of squares of the pooled effects
        pooled = plan["delta_auc"].sel(pose="fitted").mean("model").to_pandas().dropna()
        k = pooled.shape[1]
        ms_between = k * ((pooled.mean(axis=1) - pooled.values.mean()) ** 2).sum() / (len(pooled) - 1)
        ms_within = ((pooled.sub(pooled.mean(axis=1), axis=0)) ** 2).values.sum() / (len(pooled) * (k - 1))
        assert summary["ranking_reliability"] == pytest.approx((ms_between - ms_within) / ms_between)
        assert summary["ranking_reliability_chance"] == 0


def test_plan_report_renders(plan_dir, chromium_render, pdf_pages, tmp_path):
    _, out = plan_dir
    dom, images_ok, images_total, console = chromium_render(out / "report.html", screenshot=tmp_path / "plan.png")
    assert images_total >= 3 + 7 and images_ok == images_total  # figures + one sequence of thumbnails per row
    assert console == []
    assert re.search(r"<th>rank</th>\s*<th>electrode id</th>", dom)
    scroll_px, visible_px = map(int, re.search(r'<div id="width-probe">(\d+)/(\d+)</div>', dom).groups())
    assert scroll_px <= visible_px  # at a 1200 px window nothing, the ranked table included, runs off the right
    sites = pd.read_csv(out / "sites.csv", dtype={"electrode_id": str})
    assert f"<td>{sites['electrode_id'].iloc[0]}</td>" in dom
    texts, pngs = pdf_pages(out / "report.pdf")
    assert len(pngs) >= 2
    # the map follows the title on page 1: its caption (text after the figure) is on the first page
    assert re.search(r"IT\s+sheet\s+coloured\s+by\s+face\s+selectivity", texts[0])
    table_pages = [text for text in texts if "Ranked sites" in text]
    assert table_pages
    header = table_pages[0]  # header cells wrap over lines in the layout text
    for word in ("rank", "electrode", "predicted", "ΔAUC", "safety"):
        assert word in header
    assert re.search(rf"^\s*1\s+{sites['electrode_id'].iloc[0]}\s", header, flags=re.M)  # the rank-1 row
    # ... down to its last column: the rank-1 site is always chosen
    assert re.search(rf"^\s*1\s+{sites['electrode_id'].iloc[0]}\s.*\schosen\s*$", header, flags=re.M)


def _numbers(text: str) -> list[float]:
    return [float(v.replace("−", "-")) for v in re.findall(r"−?\d+(?:\.\d+)?(?:e[−+]?\d+)?", text)]


def test_plan_report_states_the_drawn_effects_and_how_the_model_was_chosen(plan_dir):
    config, out = plan_dir
    html = (out / "report.html").read_text()
    sites = pd.read_csv(out / "sites.csv", dtype={"electrode_id": str})
    summary = json.loads((out / "summary.json").read_text())
    top = sites.loc[sites["chosen"], "electrode_id"].iloc[:4].tolist()  # the chosen sites whose curves are drawn
    assert top != sites["electrode_id"].iloc[:4].tolist()  # here a site too close to a better one is not drawn
    with xr.open_dataset(out / "plan.nc", engine="h5netcdf") as plan:
        fitted = plan.sel(model=summary["chosen_model"], electrode=top, pose="fitted")
        drawn = fitted["delta_auc"].mean("sequence").values
        curves = fitted["p_high"].mean("sequence").values  # (site, stimulated, step)
    gap = np.abs(curves[:, 1] - curves[:, 0]).max()
    caption = re.search(r"Effect sizes drawn: ([^<]*)</figcaption>", html).group(1)
    curves_auc = _numbers(re.search(r"ΔAUC of these curves ([^,]*),", caption).group(1))
    predicted = _numbers(re.search(r"predicted ΔAUC of these sites \(mean over candidates\) ([^,]*),",
                                   caption).group(1))
    stated_gap = _numbers(re.search(r"differ by at most (\S+) in P\(high\)", caption).group(1))[0]
    assert "chance 0" in caption

    def shown(values, stated):  # "a–b", or one number when both ends round alike; 2 significant digits
        ends = [values.min(), values.max()]
        return np.allclose(stated if len(stated) == 2 else stated * 2, ends, rtol=0.06, atol=5e-5)

    assert shown(drawn, curves_auc)
    assert shown(sites.loc[sites["chosen"], "predicted_delta_auc"].iloc[:4].to_numpy(), predicted)
    assert stated_gap == pytest.approx(gap, rel=0.06, abs=5e-4)
    assert ("overlap at this scale" in caption) == (gap < 0.02)
    for path in (config.parent / "subject.toml", config.parent / "view.toml"):  # the files the plan read
        assert f"<td>{hashlib.sha256(path.read_bytes()).hexdigest()}</td>" in html
    validation = html[html.index("Validation on the virtual subject"):]
    assert "per candidate model" in validation
    assert "chosen by cross-validated predictivity of the recordings only" in validation
    assert "never by the truth" in validation


@pytest.mark.filterwarnings("ignore:.*left out of the plan as not working")  # the subject's dead electrodes
@pytest.mark.filterwarnings("ignore:at the planned .* trials per site")  # the small plan's effects are tiny
def test_the_report_shows_predicted_percepts_of_the_best_chosen_site(plan_dir, capsys):
    """[percepts]: stimsim visualize on the plan's chosen model, stimulating the best-ranked chosen site with the
    lowest-ranked working electrode as the control; its result set in DIR/percepts, its figure in the report."""
    config, out = plan_dir
    summary = json.loads((out / "summary.json").read_text())
    view = summary["percepts"]
    sites = pd.read_csv(out / "sites.csv", dtype={"electrode_id": str})
    assert view["electrode"] == summary["chosen_electrodes"][0] == sites["electrode_id"].iloc[0]
    assert view["control_electrode"] == sites.dropna(subset=["predicted_delta_auc"])["electrode_id"].iloc[-1]
    written = json.loads((out / "percepts" / "summary.json").read_text())
    assert written["model"] == summary["chosen_model"] == "stimsim-topo-s0" and written["judge_model"] == "stimsim-topo-s1"
    best = sites.set_index("electrode_id").loc[view["electrode"]]
    assert written["sites"]["face"]["x_mm"] == pytest.approx(best["cortex_x_mm"])
    assert written["sites"]["face"]["y_mm"] == pytest.approx(best["cortex_y_mm"])
    assert view["judges"] == written["judges"] and len(view["judges"]["own"]["pface_face_site"]) == 2
    html = (out / "report.html").read_text()
    assert "Predicted percepts" in html and f"at electrode {view['electrode']}, the best-ranked chosen site" in html
    assert "percepts" in summary["phases"]
    capsys.readouterr()
    again = run_plan(config, out, progress=True)
    assert again["percepts"] == view and f"reusing cached percepts from {out / 'cache'}" in capsys.readouterr().err
    (out / "percepts" / "percepts.png").unlink()  # the view's files removed: made again
    with pytest.warns(UserWarning, match="describes files that are gone"):
        again = run_plan(config, out, progress=False)
    assert again["percepts"] == view and (out / "percepts" / "percepts.png").is_file()


def test_a_bad_percepts_file_stops_the_plan_before_any_work(tmp_path, capsys):
    config = _write_plan(tmp_path / "config")
    (tmp_path / "config" / "view.toml").write_text(PERCEPTS.replace("currents_uA = [50, 150]", "currents_uA = [50]"))
    config.write_text(config.read_text() + '\n[percepts]\nconfig = "view.toml"\n')
    assert main(["plan", str(config), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{config} [percepts] config (a `stimsim visualize` file): " in err and "view.toml" in err
    assert "currents_uA" in err and not (tmp_path / "out").exists()
    config.write_text(config.read_text().replace('config = "view.toml"', 'config = "plan.toml"'))  # the wrong file
    assert main(["plan", str(config), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stimsim: error: {config} [percepts] config (a `stimsim visualize` file): {config}: ")
    config.write_text(config.read_text().replace('config = "plan.toml"', 'config = "missing.toml"'))
    assert main(["plan", str(config), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    assert "[percepts]: config file" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*left out of the plan as not working")  # the subject's dead electrodes
@pytest.mark.filterwarnings("ignore:at the planned .* trials per site")  # the small plan's effects are tiny
def test_plan_resumes_and_refuses_another_configuration(plan_dir, tmp_path):
    config, out = plan_dir
    before = json.loads((out / "summary.json").read_text())
    again = run_plan(config, out, progress=False)
    assert again["predicted_delta_auc"] == before["predicted_delta_auc"]
    other = _write_plan(tmp_path / "other", current=40)
    with pytest.raises(ConfigError, match="other parameters"):
        run_plan(other, out, progress=False)


def test_plan_prints_only_its_json_on_stdout_and_says_what_it_reuses(plan_dir, capsys):
    config, out = plan_dir
    assert main(["plan", str(config), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    shown = json.loads(captured.out)  # `stimsim plan ... > plan.json` is valid JSON
    assert shown["chosen_electrodes"] == json.loads((out / "summary.json").read_text())["chosen_electrodes"]
    assert f"stimsim: plan: reusing the virtual subject in {out / 'subject'}" in captured.err
    for phase in ("mapping", "sequences", "rehearsal_stimsim-topo-s0", "percepts", "truth"):
        assert f"stimsim: plan: reusing cached {phase} from {out / 'cache'}" in captured.err
    assert f"stimsim: plan written to {out}: " in captured.err
    record = json.loads((out / "cache" / "sequences.npz.sha256").read_text())
    phases = json.loads((out / "summary.json").read_text())["phases"]  # a re-run reads every phase and says how
    # long each took when it was computed
    assert all(t["cached"] for t in phases.values())
    assert phases["sequences"]["compute_seconds"] == pytest.approx(record["compute_seconds"], abs=1e-3)


def test_a_project_folder_moved_whole_resumes_its_plan(plan_dir, tmp_path, capsys):
    """Paths under the plan file's folder enter the cache's digest relative to it: a lab that copies its project
    (plan file, subject file, plan directory) to another machine or folder reuses every phase."""
    config, out = plan_dir
    moved = tmp_path / "elsewhere"
    shutil.copytree(config.parent.parent, moved)
    capsys.readouterr()
    assert main(["plan", str(moved / "config" / "plan.toml"), "--out", str(moved / "out")]) == 0
    phases = json.loads((moved / "out" / "summary.json").read_text())["phases"]
    assert phases and all(t["cached"] for t in phases.values()), phases
    assert "stimsim: plan: reusing cached mapping" in capsys.readouterr().err
    (moved / "config" / "subject.toml").write_text((config.parent / "subject.toml").read_text() + "\n# edited\n")
    assert main(["plan", str(moved / "config" / "plan.toml"), "--out", str(moved / "out")]) == 2
    assert "changed since: input_sha256.subject.toml (" in capsys.readouterr().err


def test_other_constraints_on_the_sites_reuse_every_phase(plan_dir, tmp_path, capsys):
    """[selection] chooses among the ranked sites after every phase: a lab that asks for fewer sites or another
    separation re-runs into the same --out without computing anything again, and the rig package then holds the
    newly chosen sites only (no image of a site chosen before)."""
    config, out = plan_dir
    moved = tmp_path / "project"
    shutil.copytree(config.parent.parent, moved)
    before = json.loads((moved / "out" / "summary.json").read_text())["chosen_electrodes"]
    assert len(before) > 2
    plan = moved / "config" / "plan.toml"
    plan.write_text(plan.read_text().replace("n_sites = 4", "n_sites = 2").replace("min_separation_mm = 0.8",
                                                                                    "min_separation_mm = 1.2"))
    capsys.readouterr()
    assert main(["plan", str(plan), "--out", str(moved / "out"), "--no-progress"]) == 0
    summary = json.loads((moved / "out" / "summary.json").read_text())
    assert all(t["cached"] for t in summary["phases"].values()), summary["phases"]
    chosen = summary["chosen_electrodes"]
    assert len(chosen) == 2 and chosen[0] == before[0]  # the best-ranked site is chosen under any constraint
    sites = pd.read_csv(moved / "out" / "sites.csv", dtype={"electrode_id": str}).set_index("electrode_id")
    first, second = sites.loc[chosen[0]], sites.loc[chosen[1]]
    assert abs(first.array_x_mm - second.array_x_mm) + abs(first.array_y_mm - second.array_y_mm) >= 1.2 - 1e-9
    trials = pd.read_csv(moved / "out" / "rig" / "trials.csv", dtype={"electrode": str})
    assert set(trials["electrode"]) == set(chosen)
    images = {path.name for path in (moved / "out" / "rig" / "images").iterdir()}
    assert images == {Path(name).name for name in trials["image_file"]}


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("stimsim: warning: plan cache file")]


@pytest.mark.filterwarnings("ignore:.*left out of the plan as not working")
def test_a_changed_or_damaged_cache_file_is_computed_again_with_a_warning(plan_dir, tmp_path, capsys):
    """Every cached phase is checked against its sha256 on reuse: numbers scaled, keys reordered, garbage and a
    symbolic link are each named in a warning and recomputed, and the plan is the untampered one; temporary files
    of a killed write are removed."""
    config, reference = plan_dir
    out = tmp_path / "tampered"
    shutil.copytree(reference, out, symlinks=True)
    cache = out / "cache"
    rehearsal = dict(np.load(cache / "rehearsal_stimsim-topo-s0.npz"))
    np.savez(cache / "rehearsal_stimsim-topo-s0.npz",
             **{k: v * -10.0 if v.dtype.kind == "f" else v for k, v in rehearsal.items()})
    mapping = json.loads((cache / "mapping.json").read_text())
    mapping["working"] = mapping["working"][::-1]
    (cache / "mapping.json").write_text(json.dumps(mapping))
    (cache / "sequences.npz").write_bytes(b"PK\x03\x04 not an archive")
    (tmp_path / "notes.txt").write_text("a text file\n")
    (cache / "truth.npz").unlink()
    (cache / "truth.npz").symlink_to(tmp_path / "notes.txt")
    leftovers = [out / ".plan.nc.k1ll.tmp.nc", out / "truth" / ".subject_p_high.nc.k1ll.tmp.nc",
                 cache / ".mapping.json.k1ll.tmp.json"]
    for path in leftovers:
        path.write_bytes(b"half")
    capsys.readouterr()
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 0
    warned = _warnings(capsys.readouterr().err)
    for name, why in (("mapping.json", "fails its checksum"), ("sequences.npz", "fails its checksum"),
                      ("rehearsal_stimsim-topo-s0.npz", "fails its checksum"), ("truth.npz", "is a symbolic link")):
        assert any(f"{cache / name} {why}" in line and line.endswith("it is computed again") for line in warned), name
    assert len(warned) == 4
    assert (out / "sites.csv").read_text() == (reference / "sites.csv").read_text()
    assert not (cache / "truth.npz").is_symlink() and (tmp_path / "notes.txt").read_text() == "a text file\n"
    assert not any(path.exists() for path in leftovers)
    # a record that no longer matches (written for other inputs) is caught too
    record = json.loads((cache / "truth.npz.sha256").read_text())
    (cache / "truth.npz.sha256").write_text(json.dumps({**record, "inputs": "0" * 64}))
    (cache / "mapping.json.sha256").write_text("{not json")
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 0
    warned = _warnings(capsys.readouterr().err)
    assert [Path(line.split()[5]).name for line in warned] == ["mapping.json", "truth.npz"]
    assert "computed from other inputs" in warned[1] and "no readable record" in warned[0]


def test_a_plan_whose_subject_files_changed_is_refused(plan_dir, tmp_path, capsys):
    """The plan's virtual subject is one whole: recordings changed after it was made (here each electrode given
    another's responses) no longer belong to its truth, so the plan stops naming the file, and changes nothing."""
    from stimsim.lab.recordings import load_recordings

    config, reference = plan_dir
    out = tmp_path / "changed"
    shutil.copytree(reference, out)
    recordings = load_recordings(out / "subject" / "recordings.nc")
    recordings.response.values[:] = recordings.response.values[:, ::-1].copy()  # each electrode gets another's
    recordings.save_netcdf(out / "subject" / "recordings.nc")
    before = (out / "summary.json").read_text()
    capsys.readouterr()
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 2
    assert (f"{out / 'subject'}: recordings.nc changed since the virtual subject was made"
            in capsys.readouterr().err)
    assert (out / "summary.json").read_text() == before


def test_a_killed_plan_resumes_from_its_finished_phases(plan_dir, tmp_path):
    """Kill a plan (SIGKILL, nothing flushed) once its mapping phase is cached; the resumed plan keeps that phase's
    file as it was and ends with the same plan as the uninterrupted one."""
    config, reference = plan_dir
    out = tmp_path / "killed"
    mapping = out / "cache" / "mapping.json"
    command = [sys.executable, "-c", "import sys; from stimsim.cli import main; sys.exit(main(sys.argv[1:]))",
               "plan", str(config), "--out", str(out), "--no-progress"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 600
        while not mapping.is_file() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None, "the plan ended before its mapping phase was cached"
        assert mapping.is_file(), "no mapping phase within 600 s"
        process.kill()
    finally:
        process.kill()
        process.wait()
    assert not (out / "plan.nc").exists() and not (out / "summary.json").exists()
    kept = mapping.stat().st_mtime_ns, mapping.read_bytes()
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 0
    assert (mapping.stat().st_mtime_ns, mapping.read_bytes()) == kept  # reused, not recomputed
    with xr.open_dataset(reference / "plan.nc", engine="h5netcdf") as one, \
            xr.open_dataset(out / "plan.nc", engine="h5netcdf") as two:
        xr.testing.assert_identical(two.load(), one.load())
    assert (out / "sites.csv").read_text() == (reference / "sites.csv").read_text()


def test_plan_on_dask_workers_equals_one_process(plan_dir, tmp_path):
    config, out = plan_dir
    spread = tmp_path / "dask"
    # Subject, mapping and sequences do not simulate: start from the single-process plan's, so the phases that
    # run on the workers (every model's rehearsal and the subject's truth) are recomputed there.
    (spread / "cache").mkdir(parents=True)
    shutil.copytree(out / "subject", spread / "subject")
    for name in ("config_digest.txt", "mapping.json", "mapping.json.sha256", "sequences.npz", "sequences.npz.sha256"):
        shutil.copy(out / "cache" / name, spread / "cache" / name)
    assert main(["plan", str(config), "--out", str(spread), "--no-progress", "--device", "cpu",
                 "--scheduler", "processes=2"]) == 0
    assert sorted(p.name for p in (spread / "cache").glob("rehearsal_*.npz")) == ["rehearsal_stimsim-topo-s0.npz"]
    for name in ("plan.nc", "truth/subject_p_high.nc"):
        with xr.open_dataset(out / name, engine="h5netcdf") as one, \
                xr.open_dataset(spread / name, engine="h5netcdf") as two:
            xr.testing.assert_identical(two.load(), one.load())
    assert (spread / "sites.csv").read_text() == (out / "sites.csv").read_text()
    recorded = json.loads((spread / "config.json").read_text())
    assert (recorded["device"], recorded["scheduler"]) == ("cpu", "processes=2")
    assert json.loads((out / "config.json").read_text())["scheduler"] is None


def test_plan_refuses_a_bad_device_or_scheduler_before_any_work(tmp_path, capsys):
    import torch

    config = _write_plan(tmp_path / "config")
    out = tmp_path / "out"
    assert main(["plan", str(config), "--out", str(out), "--device", "tpu"]) == 2
    assert "stimsim: error: unknown device 'tpu'" in capsys.readouterr().err
    assert main(["plan", str(config), "--out", str(out), "--scheduler", "processes=0"]) == 2
    assert "stimsim: error:" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["plan", str(config), "--out", str(out), "--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
    assert not out.exists()


def test_unsafe_protocol_stops_the_plan_naming_the_limit(tmp_path, capsys):
    config = _write_plan(tmp_path / "config", current=300)  # 60 nC per phase on a Utah tip: Shannon k = 2.26
    with pytest.raises(SafetyError, match="max_shannon_k = 1.85"):
        run_plan(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # refused before anything was written
    assert main(["plan", str(config), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"stimsim: error: {config} [stimulation] current_uA = 300, pulse_width_ms = 0.2: ")
    assert "max_shannon_k = 1.85" in error and not (tmp_path / "out").exists()


def test_stimulation_a_model_cannot_take_stops_the_plan_before_any_work(tmp_path):
    """resting_fraction acts on each unit's resting activity, which the 32-px models do not record: refused with the
    model named, before the mapping, and nothing is left behind."""
    config = _write_plan(tmp_path / "config")
    config.write_text(config.read_text().replace("[stimulation]\ncurrent_uA = 50\n",
                                                 "[stimulation]\ncurrent_uA = 50\nresting_fraction = 0.5\n"))
    with pytest.raises(ConfigError, match=r"plan.toml \[stimulation\] in stimsim-topo-s0: resting_fraction > 0 acts "
                                          r"on each unit's resting activity, and the model records none"):
        run_plan(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", ["n_eval", "n_noise"])
def test_noisy_copies_whose_images_cannot_fit_in_memory_stop_the_plan_before_any_work(tmp_path, monkeypatch, key):
    """10**9 noisy copies of 32-px images (4 KiB each as float32): terabytes, refused before the mapping (they were
    drawn in the rehearsal, after the plan's other phases), and nothing is left behind."""
    config = _write_plan(tmp_path / "config")
    config.write_text(config.read_text().replace(f"{key} = ", f"{key} = 1_000_000_000 # "))
    monkeypatch.setattr("stimsim.planning.plan._mapping_phase", lambda *args: pytest.fail("the mapping ran"))
    with pytest.raises(ConfigError, match=r"plan.toml: holding the 2AFC images \(\d+ sites × 2 sequences × 7 steps, "
                                          r".* 32 px\) needs about [\d.]+ TiB of memory, more than the .* this "
                                          r"machine has available; lower \[decoder\] n_eval or n_noise"):
        run_plan(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_current_outside_the_spread_law_names_the_file_and_table(tmp_path):
    config = _write_plan(tmp_path / "config", current=0)
    with pytest.raises(ConfigError, match=r"plan.toml \[stimulation\]: current_uA must be in \(5.26"):
        run_plan(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_the_plan_takes_the_electrical_kinds_own_keys_as_an_experiment_does(tmp_path):
    """[stimulation] is checked by the electrical stimulation itself: its other keys (a spread law, ...) are taken,
    a misspelt key is refused with the allowed ones, and what the plan sets elsewhere is refused with the reason."""
    config = _write_plan(tmp_path / "config", current=300)
    text = config.read_text()
    config.write_text(text.replace("[stimulation]\n", '[stimulation]\nspread = "tehovnik"\n'))
    plan = load_plan_config(config)
    assert plan.stimulation["spread"] == "tehovnik" and plan.stimulation["current_uA"] == 300.0
    config.write_text(text.replace("[stimulation]\n", "[stimulation]\ncurent_uA = 60\n"))
    with pytest.raises(ConfigError, match=r"plan.toml \[stimulation\]: unknown key\(s\) \['curent_uA'\].*allowed keys"):
        load_plan_config(config)
    config.write_text(text.replace("[stimulation]\n", "[stimulation]\nonset_ms = 10\n"))
    with pytest.raises(ConfigError, match=r"plan.toml \[stimulation\]: 'onset_ms' is not set here: .*train_onset_ms"):
        load_plan_config(config)


@pytest.mark.parametrize("out_exists", [False, True])
def test_unknown_broken_electrode_names_the_file_and_leaves_nothing(tmp_path, out_exists):
    """The ids are checked against the virtual subject's layout, so the subject is made first; the error removes it
    again: --out is left absent, or empty when the lab made it beforehand."""
    config = _write_plan(tmp_path / "config", broken='["e1", "e99"]')
    out = tmp_path / "out"
    if out_exists:
        out.mkdir()
    with pytest.raises(ConfigError, match=r"plan.toml \[array\] broken_electrodes: unknown electrode id\(s\) \['e99'\]"):
        run_plan(config, out, progress=False)
    assert (list(out.iterdir()) == []) if out_exists else not out.exists()


def test_an_unknown_candidate_model_names_the_file_and_field(tmp_path):
    config = _write_plan(tmp_path / "config")
    config.write_text(config.read_text().replace('candidates = ["stimsim-topo-s0"]', 'candidates = ["no-such-model"]'))
    with pytest.raises(ConfigError, match=r"plan.toml \[models\] candidates: unknown model 'no-such-model'"):
        run_plan(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_plan_and_subject_refuse_a_folder_of_other_files_unless_forced(tmp_path, capsys):
    config = _write_plan(tmp_path / "config")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "report.html").write_text("a lab's own report")
    for argv, what in ((["plan", str(config)], "a plan"), (["subject", "make", str(config.parent / "subject.toml")],
                                                            "a virtual subject")):
        assert main([*argv, "--out", str(notes), "--no-progress"][:len(argv) + 2]) == 2
        err = capsys.readouterr().err
        assert f"output directory {notes} holds files that are not {what} (report.html)" in err and "--force" in err
        assert [entry.name for entry in notes.iterdir()] == ["report.html"]
        assert (notes / "report.html").read_text() == "a lab's own report"
    assert main(["subject", "make", str(config.parent / "subject.toml"), "--out", str(notes), "--force"]) == 0
    assert (notes / "truth.json").is_file() and (notes / "report.html").read_text() == "a lab's own report"
    assert main(["subject", "make", str(config.parent / "subject.toml"), "--out", str(notes)]) == 0  # now a subject


def test_plan_and_subject_refuse_another_commands_output_even_when_forced(tmp_path, capsys):
    """--force writes beside a lab's own files, never into what another command wrote: a plan into a virtual subject
    or an analysis, a subject into a plan; the error names that command and nothing there changes."""
    from stimsim.utilities.io import ResultSet

    config = _write_plan(tmp_path / "config")
    subject, plan, analysis = tmp_path / "subject", tmp_path / "plan", tmp_path / "analysis"
    subject.mkdir()
    (subject / "truth.json").write_text("{}")
    (plan / "cache").mkdir(parents=True)
    (plan / "cache" / "config_digest.txt").write_text("0\n")
    (plan / "summary.json").write_text("{}")
    with ResultSet(analysis, "analysis") as results:
        results.write_json("summary.json", {"analysis": 1})
        results.finish()
    make = ["subject", "make", str(config.parent / "subject.toml")]
    for argv, out, owner in ((["plan", str(config)], subject, "a virtual subject (`stimsim subject make`)"),
                             (["plan", str(config)], analysis, "an analysis (`stimsim analyze`)"),
                             (make, plan, "a plan (`stimsim plan`)"), (make, analysis, "an analysis (`stimsim analyze`)")):
        before = {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()}
        assert main([*argv, "--out", str(out), "--force", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err == f"stimsim: error: output directory {out} holds {owner}; give another --out directory " \
                      "(--force does not write into another command's output, whose files would be overwritten)\n"
        assert {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()} == before


def test_sessions_and_power_name_a_damaged_or_inconsistent_plan_file(plan_dir, tmp_path, capsys):
    """A summary naming an electrode the truth lacks, a summary or truth file that is not what the plan wrote:
    `subject session` and `power` end with an error naming the file (and field), never a traceback — their own
    checks, as on a plan made before plan_files.json (which would name any change first: the test below), read with
    a warning that its files are not checked."""
    _, reference = plan_dir
    out = tmp_path / "plan"
    shutil.copytree(reference, out)
    (out / "plan_files.json").unlink()
    summary = json.loads((out / "summary.json").read_text())
    truth = out / "truth" / "subject_p_high.nc"
    cases = [
        (lambda: (out / "summary.json").write_text(json.dumps({**summary, "chosen_electrodes": ["e99"]})),
         f"{out / 'summary.json'}: names electrode(s) ['e99']"),
        (lambda: (out / "summary.json").write_bytes(b"\xff\xfe{garbage"), f"{out / 'summary.json'}: "),
        (lambda: (out / "summary.json").write_text(json.dumps({**summary, "subject_lapse_rate": "high"})),
         "field 'subject_lapse_rate' must be a finite number"),
        (lambda: truth.write_bytes(b"\x89HDF\r\n garbage"), f"{truth}: not a readable NetCDF file"),
    ]
    warnings_seen = []
    for damage, message in cases:
        shutil.copy(reference / "summary.json", out / "summary.json")
        shutil.copy(reference / "truth" / "subject_p_high.nc", truth)
        damage()
        for argv in (["subject", "session", str(out), "--trials-per-site", "14", "--csv", str(tmp_path / "s.csv")],
                     ["power", str(out), "--sessions", "10", "--trials-per-site", "14", "--out", str(tmp_path / "power")]):
            assert main(argv) == 2, (argv[0], message)
            *warned, error = capsys.readouterr().err.splitlines()
            warnings_seen += warned  # Python says a warning once per place in one process (a command is one)
            assert error.startswith("stimsim: error: ") and message in error, error
        assert not (tmp_path / "s.csv").exists() and not (tmp_path / "power").exists()
    assert set(warnings_seen) == {f"stimsim: warning: {out} has no plan_files.json, the checksums of its files: they "
                                  "are read unchecked (run the plan again to have them checked)"}


@pytest.mark.parametrize("table, replace, message", [
    ("plan", ("[stimulation]\n", "[stimulation]\nfrequency_Hz = 0\n"),
     r"plan.toml \[stimulation\]: frequency_Hz must be > 0 Hz: electrical stimulation at 0 delivers nothing"),
    ("plan", ("[selection]\n", "[safety]\noverride = \"  \"\n[selection]\n"),
     r"plan.toml \[safety\]: 'override' must be the reason the limits are overridden \(non-empty text\)"),
    ("subject", ("radius_mm = 0.25", "radius_mm = 1e6"),
     r"subject.toml \[recording\]: 'radius_mm' = 1e\+06 is larger than the model's IT sheet \(extent .*\): every "
     r"electrode would record the whole sheet; give at most \d"),
    ("subject", ('dead_electrodes = ["e16"]', "dead_fraction = 1.0"),
     r"subject.toml \[array\]: 'dead_fraction' = 1 leaves no working electrode; give a fraction below 1"),
])
def test_plan_and_subject_values_without_effect_or_meaning_are_refused_naming_the_key(tmp_path, table, replace,
                                                                                      message):
    from stimsim.planning.config import load_plan_config
    from stimsim.subject import VirtualSubject

    config = _write_plan(tmp_path / "config")
    path = config if table == "plan" else tmp_path / "config" / "subject.toml"
    assert replace[0] in path.read_text()
    path.write_text(path.read_text().replace(*replace, 1))
    with pytest.raises(ConfigError, match=message):
        load_plan_config(config) if table == "plan" else VirtualSubject.from_file(path)


@pytest.mark.parametrize("old, new, refusal", [
    ('broken_electrodes = ["e1"]', 'broken_electrodes = ["e1", "e2", "e1"]',
     r"plan.toml \[array\]: 'broken_electrodes' lists electrode\(s\) \['e1'\] more than once"),
    ('broken_electrodes = ["e1"]', 'broken_electrodes = [3, "3"]',
     r"plan.toml \[array\]: 'broken_electrodes' lists electrode\(s\) \['3'\] more than once"),
    ('candidates = ["stimsim-topo-s0"]', 'candidates = ["stimsim-topo-s0", "stimsim-topo-s0"]',
     r"plan.toml \[models\] candidates: 'stimsim-topo-s0' is the same model as 'stimsim-topo-s0'"),
    ('candidates = ["stimsim-topo-s0"]', 'candidates = ["stimsim-topo-s0", "SHIPPED/stimsim-topo-s0"]',
     r"plan.toml \[models\] candidates: '.*/stimsim-topo-s0' is the same model as 'stimsim-topo-s0'"),
])
def test_a_broken_electrode_or_candidate_listed_twice_is_refused(tmp_path, old, new, refusal):
    """A list that names one electrode or one model twice would be read as fewer than it lists (one candidate
    averaged as if two): refused, naming the key and the repeated entry."""
    from stimsim.models.registry import SHIPPED_DIR

    config = _write_plan(tmp_path / "config")
    config.write_text(config.read_text().replace(old, new.replace("SHIPPED", str(SHIPPED_DIR))))
    with pytest.raises(ConfigError, match=refusal):
        load_plan_config(config)


def test_a_subject_dir_that_is_not_a_subject_directory_is_refused_naming_the_key(tmp_path):
    """[subject] dir naming a missing folder, or a plan's folder instead of the subject/ folder in it: refused when
    the plan file is read, naming the file, the key and what the folder lacks (no bare "file not found")."""
    config = _write_plan(tmp_path / "config")
    text = config.read_text().replace('config = "subject.toml"', 'dir = "{}"')
    config.write_text(text.format("typo"))
    with pytest.raises(ConfigError, match=r"plan.toml \[subject\] dir: \S*typo is not a directory"):
        load_plan_config(config)
    plan = tmp_path / "plan"
    (plan / "subject").mkdir(parents=True)
    for name in ("subject.toml", "truth.json", "recordings.nc", "stimuli.npz"):
        (plan / "subject" / name).write_text("")
    config.write_text(text.format(plan))
    with pytest.raises(ConfigError, match=r"plan.toml \[subject\] dir: \S*plan is not a subject directory \(it "
                                          r"lacks subject.toml, truth.json, recordings.nc, stimuli.npz; .*\); "
                                          r"\S*plan/subject is one"):
        load_plan_config(config)


def test_a_subject_of_one_repeat_says_what_plans_on_it_need(tmp_path):
    from stimsim.subject import VirtualSubject

    _write_plan(tmp_path / "config")
    path = tmp_path / "config" / "subject.toml"
    path.write_text(path.read_text().replace("repeats = 4", "repeats = 1"))
    with pytest.warns(UserWarning, match=r"subject.toml \[recording\]: repeats = 1: a plan on this subject needs "
                                         r"\[array\] min_reliability = -1"):
        VirtualSubject.from_file(path)


def test_subject_session_files_are_checked_first_and_replaced_on_a_rerun(plan_dir, tmp_path, capsys):
    _, out = plan_dir
    csv = tmp_path / "session.csv"
    (tmp_path / "folder.nwb").mkdir()
    for argv, message in ((["--out", str(tmp_path / "folder.nwb")], "--out: output file"),
                          (["--csv", str(tmp_path / "f" / "s.csv")], "--csv: output directory"),
                          (["--trials-per-site", "0", "--csv", str(csv)],
                           "(--trials-per-site) must be >= 14 (a ΔAUC needs a trial at each of the 7 steps in both "
                           "conditions), got 0"),
                          (["--out", str(tmp_path / "session.csv")], "give a file name ending in .nwb"),
                          (["--seed", "-1", "--csv", str(csv)], "--seed must be an integer from 0 to 4294967295"),
                          (["--trials-per-site", "1000000000", "--csv", str(csv)],
                           "a session of 1000000000 trials per site × "),
                          (["--session-id", "", "--csv", str(csv)], "--session-id is empty"),
                          (["--trials-per-site", "13", "--csv", str(csv)],
                           "must be >= 14 (a ΔAUC needs a trial at each of the 7 steps in both conditions), got 13"),
                          (["--out", str(tmp_path / "s.nwb"), "--csv", str(tmp_path / "s.nwb")],
                           "--out and --csv name the same file"),
                          ([], "give --out FILE.nwb and/or --csv FILE.csv")):
        (tmp_path / "f").write_text("x")  # a file where a folder would have to be
        assert main(["subject", "session", str(out), *argv]) == 2
        assert message in capsys.readouterr().err and not csv.exists()
    assert main(["subject", "session", str(out), "--trials-per-site", "14", "--csv", str(csv), "--seed", "0"]) == 0
    capsys.readouterr()
    assert main(["subject", "session", str(out), "--trials-per-site", "14", "--csv", str(csv), "--seed", "1"]) == 0
    assert f"stimsim: warning: --csv {csv}: replacing the session written there before" in capsys.readouterr().err
    assert pd.read_csv(csv)["session_id"].iloc[0] == "session-seed1"  # the same command again replaces its files
    nwb = tmp_path / "session.nwb"
    for _ in range(2):
        assert main(["subject", "session", str(out), "--trials-per-site", "14", "--out", str(nwb)]) == 0
    from pynwb import NWBHDF5IO

    with NWBHDF5IO(str(nwb), "r") as io:  # how the session was made, in the file itself
        notes = io.read().notes
    lapse_rate = json.loads((out / "summary.json").read_text())["subject_lapse_rate"]
    digest = __import__("hashlib").sha256((out / "summary.json").read_bytes()).hexdigest()
    assert notes == (f"simulated by stimsim {__import__('stimsim').__version__} from the plan {out.resolve()} "
                     f"(summary.json sha256 {digest}): lapse rate {lapse_rate:g}, seed 0, 14 trials per site at the "
                     "chosen sites")
    for foreign in (tmp_path / "recorded.nwb", tmp_path / "lab.csv"):  # a file that is not a session stimsim wrote
        foreign.write_text("a lab's own data\n")
        option = "--out" if foreign.suffix == ".nwb" else "--csv"
        assert main(["subject", "session", str(out), "--trials-per-site", "14", option, str(foreign)]) == 2
        assert "is not a session stimsim wrote; give --force" in capsys.readouterr().err
        assert foreign.read_text() == "a lab's own data\n"
        assert main(["subject", "session", str(out), "--trials-per-site", "14", option, str(foreign), "--force"]) == 0
        assert foreign.read_bytes() != b"a lab's own data\n"


def test_a_session_never_replaces_a_file_of_the_plan_or_its_subject(plan_dir, capsys):
    """--out or --csv naming a file of the plan (its sites.csv, its rig's trial list) or of its virtual subject (the
    recordings) is refused even with --force, naming what the file belongs to; the file is kept as it was."""
    _, out = plan_dir
    for option, path, owner in (("--csv", out / "sites.csv", "a plan (`stimsim plan`)"),
                                ("--csv", out / "rig" / "trials.csv", "a plan (`stimsim plan`)"),
                                ("--out", out / "subject" / "recordings.nwb",
                                 "a virtual subject (`stimsim subject make`)")):
        before = path.read_bytes()
        assert main(["subject", "session", str(out), "--trials-per-site", "14", option, str(path), "--force"]) == 2
        assert capsys.readouterr().err == (f"stimsim: error: {option} {path}: the file belongs to {owner}, which "
                                           "--force does not replace; give another file name\n")
        assert path.read_bytes() == before


def test_subject_session_warns_of_replacing_a_session_only_when_it_writes(tmp_path, capsys):
    """A session file of an earlier run is named as replaced only when the new session is written: a run that
    stops on an error before (here: a plan directory that does not exist) leaves the file and says nothing of it."""
    csv = tmp_path / "session.csv"
    csv.write_text("start_time,stop_time,electrode,stimulated_electrode,choice,correct,subject_id,session_id\n")
    before = csv.read_bytes()
    assert main(["subject", "session", str(tmp_path / "no_plan"), "--csv", str(csv)]) == 2
    err = capsys.readouterr().err
    assert "is this a directory written by `stimsim plan`?" in err and "replacing" not in err
    assert csv.read_bytes() == before


def test_visualize_at_a_plans_electrodes_runs_on_its_chosen_model_and_checks_its_files(plan_dir, tmp_path, capsys):
    """[sites] method = "plan": the electrodes' cortex points of sites.csv, registered on the plan's chosen model;
    another model, a changed sites.csv or an electrode the plan left out is refused with the reason."""
    _, out = plan_dir
    sites = pd.read_csv(out / "sites.csv", dtype={"electrode_id": str})
    face, control = sites["electrode_id"].iloc[0], sites["electrode_id"].iloc[-1]
    view = PERCEPTS.replace('model = "stimsim-topo-s2"', 'model = "stimsim-topo-s0"').replace(
        'method = "explicit"', f'method = "plan"\nplan = "{out}"\nface_electrode = "{face}"\n'
                               f'control_electrode = "{control}"').replace(
        "face_site_mm = [0.0, 0.0]\ncontrol_site_mm = [0.0, 0.0]\n", "")
    path = tmp_path / "view.toml"
    path.write_text(view)
    assert main(["visualize", str(path), "--out", str(tmp_path / "ok"), "--no-progress"]) == 0
    written = json.loads((tmp_path / "ok" / "summary.json").read_text())["sites"]
    best = sites.set_index("electrode_id").loc[face]
    assert (written["face"]["x_mm"], written["face"]["y_mm"]) == pytest.approx((best["cortex_x_mm"], best["cortex_y_mm"]))
    capsys.readouterr()
    assert main(["visualize", str(path), "--model", "stimsim-topo-s2", "--out", str(tmp_path / "other"),
                 "--no-progress"]) == 2
    assert "the plan's sites were registered on its chosen model 'stimsim-topo-s0', not on 'stimsim-topo-s2'" in \
        capsys.readouterr().err
    path.write_text(view.replace(f'face_electrode = "{face}"', 'face_electrode = "e1"'))  # broken in the plan
    assert main(["visualize", str(path), "--out", str(tmp_path / "broken"), "--no-progress"]) == 2
    assert "face_electrode 'e1' is not a working electrode of" in capsys.readouterr().err
    moved = tmp_path / "moved_plan"
    shutil.copytree(out, moved, ignore=shutil.ignore_patterns("cache", "percepts", "images"))
    table = (moved / "sites.csv").read_text()
    (moved / "sites.csv").write_text(table.replace(f"\n1,{face},", f"\n1,{face},9"))  # a hand-edited position
    path.write_text(view.replace(str(out), str(moved)))
    assert main(["visualize", str(path), "--out", str(tmp_path / "edited"), "--no-progress"]) == 2
    assert f"{moved / 'sites.csv'}: changed since `stimsim plan` wrote it" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in ("other", "broken", "edited"))


def test_a_damaged_plan_directory_is_refused_by_the_commands_that_read_it(plan_dir, tmp_path, capsys):
    """plan_files.json holds the sha256 of the plan's data files; `power`, `subject session` and `analyze --plan`
    name a file that changed (here cut in half) instead of reading it."""
    _, out = plan_dir
    listed = json.loads((out / "plan_files.json").read_text())["files"]
    summary = json.loads((out / "summary.json").read_text())
    assert set(listed) == {"summary.json", "sites.csv", "plan.nc", "config.json", summary["truth_file"],
                           "rig/trials.csv"}
    session = tmp_path / "session.csv"
    assert main(["subject", "session", str(out), "--trials-per-site", "14", "--csv", str(session)]) == 0
    for name in ("plan.nc", "sites.csv", summary["truth_file"]):
        damaged = tmp_path / f"damaged_{Path(name).name}"
        shutil.copytree(out, damaged, ignore=shutil.ignore_patterns("cache", "images"))
        data = (damaged / name).read_bytes()
        (damaged / name).write_bytes(data[: len(data) // 2])
        for argv in (["power", str(damaged), "--sessions", "10", "--trials-per-site", "14", "--out",
                      str(tmp_path / "power")],
                     ["subject", "session", str(damaged), "--trials-per-site", "14", "--csv", str(tmp_path / "s.csv")],
                     ["analyze", str(session), "--plan", str(damaged), "--out", str(tmp_path / "analysis")]):
            assert main(argv) == 2
            error = capsys.readouterr().err
            assert f"{damaged / name}: changed since `stimsim plan` wrote it" in error, (argv, error)
        assert not (tmp_path / "power").exists() and not (tmp_path / "s.csv").exists()


def test_a_plan_stopped_while_rewriting_its_outputs_is_refused_until_run_again(plan_dir, tmp_path, monkeypatch,
                                                                                 capsys):
    """A re-run stopped after some outputs were written again (here while building the report) leaves old and new
    files side by side; the commands that read the plan refuse it until the same plan command finishes."""
    import stimsim.planning.report

    config, reference = plan_dir
    out = tmp_path / "plan"
    shutil.copytree(reference, out)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(stimsim.planning.report, "build_report", stopped)
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 130
    capsys.readouterr()
    readers = (["power", str(out), "--sessions", "10", "--trials-per-site", "14", "--out", str(tmp_path / "power")],
               ["subject", "session", str(out), "--trials-per-site", "14", "--csv", str(tmp_path / "s.csv")])
    for argv in readers:
        assert main(argv) == 2
        assert "plan_files.json: the plan did not finish writing its outputs" in capsys.readouterr().err, argv
    (out / "summary.json").unlink()  # stopped before its summary.json was written again: said the same way
    for argv in readers:
        assert main(argv) == 2
        assert "plan_files.json: the plan did not finish writing its outputs" in capsys.readouterr().err, argv
    monkeypatch.undo()
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 0
    for argv in readers:
        assert main(argv) == 0, argv


def test_subject_session_from_the_plan(plan_dir, tmp_path, capsys):
    from stimsim.lab.sessions import load_sessions

    _, out = plan_dir
    nwb, csv = tmp_path / "session.nwb", tmp_path / "session.csv"
    assert main(["subject", "session", str(out), "--trials-per-site", "42", "--out", str(nwb), "--csv", str(csv)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    shown = json.loads(capsys.readouterr().out)  # stdout is JSON alone
    assert shown["n_trials"] == 42 * summary["n_sites"] and shown["files"] == [str(nwb), str(csv)]
    trials = load_sessions([nwb])  # the analysis side reads it as a lab's file
    assert len(trials) == 42 * summary["n_sites"]
    assert sorted(trials["electrode"].unique()) == sorted(summary["chosen_electrodes"])
    table = pd.read_csv(csv, dtype={"electrode": str, "stimulated_electrode": str})
    assert (table.groupby("electrode")["stimulated_electrode"].apply(lambda s: (s != "sham").sum()) == 21).all()


def test_plan_and_subject_place_the_array_in_cortex_mm(plan_dir):
    _, out = plan_dir
    # both shipped models record 2 cortex mm per model mm; the plan and the subject say so
    truth = json.loads((out / "subject" / "truth.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert truth["cortex_mm_per_model_mm"] == 2.0 and not truth["scale_overridden"]
    assert summary["cortex_scale"]["stimsim-topo-s0"]["cortex_mm_per_model_mm"] == 2.0
    assert config["cortex_scale"] == summary["cortex_scale"]
    sites = pd.read_csv(out / "sites.csv", dtype={"electrode_id": str}).set_index("electrode_id")
    np.testing.assert_allclose(sites["cortex_x_mm"], 2.0 * sites["model_x_mm"])
    np.testing.assert_allclose(sites["cortex_y_mm"], 2.0 * sites["model_y_mm"])
    # a rigid registration keeps the array's own distances (0.4 mm pitch, cortex mm) on the sheet: e2–e3
    # (0.4 mm apart on the array) and e2–e14 (1.2 mm) are as far apart on the sheet in cortex mm, half that in
    # model mm; the subject's true sites keep them too
    def distance(table, a, b, x, y):
        return float(np.hypot(table.loc[a, x] - table.loc[b, x], table.loc[a, y] - table.loc[b, y]))

    assert distance(sites, "e2", "e3", "cortex_x_mm", "cortex_y_mm") == pytest.approx(0.4, abs=1e-6)
    assert distance(sites, "e2", "e14", "cortex_x_mm", "cortex_y_mm") == pytest.approx(1.2, abs=1e-6)
    assert distance(sites, "e2", "e14", "model_x_mm", "model_y_mm") == pytest.approx(0.6, abs=1e-6)
    true_sites = pd.DataFrame(truth["electrode_sites_mm"], index=["x", "y"]).T
    assert distance(true_sites, "e2", "e14", "x", "y") == pytest.approx(1.2, abs=1e-6)
    true_model = pd.DataFrame(truth["electrode_sites_model_mm"], index=["x", "y"]).T
    assert distance(true_model, "e2", "e14", "x", "y") == pytest.approx(0.6, abs=1e-6)


def test_targets_by_hand():
    assert meets_targets([0.6, 0.55, 0.5, 0.7, 0.2], [0.3, 0.3, 0.3, 0.3, 0.3])  # median 0.55, 4 of 5 above
    assert not meets_targets([0.6, 0.55, 0.5, 0.7, 0.2], [0.3, 0.3, 0.6, 0.3, 0.3])  # 3 of 5 above
    assert not meets_targets([0.6, 0.45, 0.4, 0.7, 0.2], [0.1] * 5)  # median 0.45


def test_pooled_permutation_p_is_the_t_tests_for_exchangeable_electrodes():
    """Five poses of 60 electrodes with a weak true association: the within-pose permutation p of the pooled r
    is the one-sided p of Pearson's t test (exact for normal data), to the shuffles' Monte Carlo error."""
    from scipy.stats import pearsonr

    rng = np.random.default_rng(3)
    true = [rng.normal(size=60) for _ in range(5)]
    pairs = [(t + 20.0 * rng.normal(size=60), t) for t in true]
    result = pooled_permutation(pairs, seed=0)
    planned, truth = np.concatenate([p for p, _ in pairs]), np.concatenate(true)
    expected = pearsonr(planned, truth, alternative="greater")
    assert result["pooled_r"] == pytest.approx(expected.statistic)
    assert 0.001 < expected.pvalue < 0.1  # a case where the test's resolution matters
    assert result["pooled_permutation_p"] == pytest.approx(expected.pvalue, abs=4 * np.sqrt(expected.pvalue / 1e4))
    assert result["pooled_n_electrodes"] == 300


def test_pooled_permutation_keeps_what_differs_between_poses():
    """Planned and true effects that agree only in each pose's mean (a pose whose effects are all larger) pool to a
    large r; shuffling within poses keeps that, so it is not counted as evidence for the sites' ranking."""
    rng = np.random.default_rng(4)
    offsets = [0.0, 0.1, 0.2, 0.3, 0.4]
    pairs = [(o + 0.01 * rng.normal(size=40), o + 0.01 * rng.normal(size=40)) for o in offsets]
    result = pooled_permutation(pairs, seed=0)
    assert result["pooled_r"] > 0.9
    assert result["pooled_permutation_p"] > 0.05


def test_a_plan_on_the_subjects_own_model_predicts_its_effects(tmp_path, one_torch_thread):
    """With the subject's own model as the only candidate, prediction and truth share the model, the sequences
    and the stimulation; they differ only by the decoders' fitting noise and the registration error (about
    0.01 mm on the same instance), so the planned ΔAUC must follow the subject's electrode by electrode
    (chance r 0). A mismatch between rehearsed and true electrodes, poses or sequences breaks this."""
    plan = PLAN.replace('candidates = ["stimsim-topo-s0"]', 'candidates = ["stimsim-topo-s2"]').replace(
        "n_noise = 6\nn_eval = 3", "n_noise = 24\nn_eval = 8")
    config = _write_plan(tmp_path / "config", broken="[]")
    config.write_text(plan.format(current=50, broken="[]"))
    out = tmp_path / "out"
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["chosen_model"] == "stimsim-topo-s2"
    assert summary["predicted_vs_true_r"] > 0.8


def test_candidates_in_directories_of_the_same_name_are_rehearsed_each_on_its_own(tmp_path, one_torch_thread):
    """Two candidate model directories that share their last name (seed0/model, seed1/model) must not share a
    cached rehearsal: each candidate's P(high) is its own (they would be equal otherwise)."""
    import stimsim

    shipped = Path(stimsim.__file__).parent / "shipped_models"
    for seed in (0, 1):
        shutil.copytree(shipped / f"stimsim-topo-s{seed}", tmp_path / f"seed{seed}" / "model")
    candidates = [str(tmp_path / f"seed{seed}" / "model") for seed in (0, 1)]
    config = _write_plan(tmp_path / "config", broken="[]")
    config.write_text(config.read_text().replace('candidates = ["stimsim-topo-s0"]', f"candidates = {candidates}"))
    out = tmp_path / "out"
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 0
    with xr.open_dataset(out / "plan.nc", engine="h5netcdf") as plan:
        first, second = (plan["p_high"].sel(model=name, pose="fitted").values for name in candidates)
    assert first.shape == second.shape and not np.allclose(first, second)
    summary = json.loads((out / "summary.json").read_text())
    per_model = summary["predicted_vs_true_r_per_model"]
    assert per_model[candidates[0]] != per_model[candidates[1]]
    # how firmly the recordings chose: each candidate's share of the electrode resamples, stated in the report
    selection = summary["model_selection"]
    first = selection["p_ranked_first"]
    assert set(first) == set(candidates) and sum(first.values()) == pytest.approx(1.0)
    assert max(selection["median_r2"], key=selection["median_r2"].get) == summary["chosen_model"]
    html = (out / "report.html").read_text()
    assert "ranked first (% of resamples)" in html and "chance 50 %" in html


def test_model_selection_resamples_the_working_electrodes_in_their_order_after_a_resume():
    """A cached mapping.json keeps its electrode keys in text order ("1", "10", "2"); a resumed plan must resample
    the same electrodes as the run that computed it, so that p_ranked_first does not change with a resume."""
    from stimsim.mapping import selection_bootstrap
    from stimsim.planning.plan import SELECTION_BOOTSTRAP_RESAMPLES, _selection_summary

    working = [str(e) for e in range(1, 13)]
    rng = np.random.default_rng(0)
    r2 = {name: dict(zip(working, rng.normal(0.3, 0.1, len(working)).tolist())) for name in ("a", "b")}
    mapping = {"working": working, "selection": {"model": ["a", "b"], "median_r2": [0.3, 0.3]}, "predictivity": r2}
    resumed = json.loads(json.dumps(mapping, sort_keys=True))  # as the cache reads it back
    assert list(resumed["predictivity"]["a"]) != working
    expected = selection_bootstrap({name: list(values.values()) for name, values in r2.items()},
                                   SELECTION_BOOTSTRAP_RESAMPLES, 4)
    assert _selection_summary(resumed, 4)["p_ranked_first"] == _selection_summary(mapping, 4)["p_ranked_first"] \
        == expected


def test_the_report_says_when_the_recordings_do_not_settle_the_model():
    from stimsim.planning.report import _selection_note

    assert _selection_note("a", {"a": 1.0}) == []  # one candidate: nothing to settle
    assert _selection_note("a", {"a": 0.95, "b": 0.05}) == []
    note, = _selection_note("a", {"a": 0.9496, "b": 0.0504})  # never rounded up to the 95 % that would settle it
    assert "a ranks first in 94.9 % of the electrode resamples" in note.text


@pytest.mark.filterwarnings("ignore:.*left out of the plan as not working")  # the subject's dead electrodes
@pytest.mark.filterwarnings("ignore:at the planned .* trials per site")  # the small plan's effects are tiny
def test_validate_writes_per_pose_numbers_and_the_null(tmp_path, one_torch_thread, monkeypatch):
    from stimsim.models.registry import model_path

    config = _write_plan(tmp_path / "config")
    shutil.copytree(model_path("stimsim-topo-s2"), tmp_path / "config" / "models" / "s2")
    subject_file = tmp_path / "config" / "subject.toml"  # a model directory relative to the subject file's folder,
    subject_file.write_text(SUBJECT.replace('"stimsim-topo-s2"', '"models/s2"'))  # every pose's subject reads it so
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    summary = run_plan(config, out, progress=False, validate=1)
    validation = json.loads((out / "validation.json").read_text())
    assert validation == summary["validation"]
    assert len(validation["predicted_vs_true_r_per_pose"]) == 1 and len(validation["random_pose_r_p95"]) == 1
    assert validation["predicted_vs_true_r"] == validation["predicted_vs_true_r_per_pose"][0]
    pose = validation["poses"][0]
    assert pose["n_random"] >= 100 and -1 <= pose["predicted_vs_true_r"] <= 1
    assert validation["random_pose_r_p95"][0] == pose["random_pose_r_p95"]
    pose_summary = json.loads((out / "validation" / "pose_0" / "summary.json").read_text())
    null = np.array(pose_summary["random_pose_r"])
    assert len(null) == 100 and np.all(np.abs(null) <= 1)
    assert pose["random_pose_r_p95"] == pytest.approx(np.percentile(null, 95))
    assert pose_summary["predicted_vs_true_r"] == pose["predicted_vs_true_r"]
    assert validation["targets_met"] == meets_targets(validation["predicted_vs_true_r_per_pose"],
                                                      validation["random_pose_r_p95"])
    assert validation["pooled_r"] == pytest.approx(validation["predicted_vs_true_r_per_pose"][0])  # one pose
    assert 1 / (1 + validation["pooled_n_permutations"]) <= validation["pooled_permutation_p"] <= 1
    assert validation["pooled_n_electrodes"] == pose["n_electrodes"]
    assert pose["subject_seed"] == 7 + 101  # another hidden pose than the plan's own subject
    record = validation["provenance"]  # the validation's own parameters, versions and inputs, as config.json
    assert record["config"]["validation"] == {"n_poses": 1, "n_random": 100, "subject_seeds": [7 + 101]}
    assert record["config"]["seed"] == 0 and record["software"]["stimsim"] and record["device"] == "cpu"
    assert record["input_sha256"] == json.loads((out / "config.json").read_text())["input_sha256"]
    truth = json.loads((out / "validation" / "pose_0" / "subject" / "truth.json").read_text())
    assert truth["pose"] == pose["pose"] != json.loads((out / "subject" / "truth.json").read_text())["pose"]


FACE_PLAN = """
name = "face"
seed = 0
task = "face_categorization"
[models]
candidates = ["stimsim-topo-s0"]
n_folds = 3
[subject]
config = "subject.toml"
[registration]
n_boot = 2
[face_task]
n_per_class = 20
signal_percent = [30, 60, 100]
[selection]
n_sites = 6
"""


def test_face_task_ranks_sites_in_the_models_face_patch(tmp_path, one_torch_thread, capsys):
    """With the face task (Afraz et al. 2006) the top-ranked sites lie where the model's IT is face-selective:
    the face d′ of the top sites' mapped points (pooled units within 0.5 cortex mm, computed here from the
    model's activations) exceeds the median d′ over the rehearsed sites far more often than chance (one half)."""
    from stimsim.behavior.metrics import dprime
    from stimsim.data.stimuli import lfw_subset
    from stimsim.models.registry import load_model

    directory = tmp_path / "config"
    directory.mkdir()
    xs, ys = np.meshgrid(np.arange(6) * 2.6 - 6.5, np.arange(6) * 2.6 - 6.5)  # a sparse 13 mm grid: the whole sheet
    rows = [f"g{i + 1},{x:.2f},{y:.2f}" for i, (x, y) in enumerate(zip(xs.ravel(), ys.ravel()))]
    (directory / "layout.csv").write_text("electrode_id,x_mm,y_mm\n" + "\n".join(rows) + "\n")
    (directory / "subject.toml").write_text(SUBJECT.replace('dead_electrodes = ["e16"]', "dead_fraction = 0.0"))
    (directory / "plan.toml").write_text(FACE_PLAN)
    out = tmp_path / "out"
    assert main(["plan", str(directory / "plan.toml"), "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "face_categorization" and summary["effect"] == "delta_p_face"
    assert (out / "report.html").is_file() and (out / "truth" / "subject_p_face.nc").is_file()
    sites = pd.read_csv(out / "sites.csv", dtype={"electrode_id": str})
    assert "predicted_delta_p_face" in sites and "predicted_delta_auc" not in sites
    assert -1 <= summary["predicted_vs_true_r"] <= 1
    # face d′ of every rehearsed site's mapped point, from the model's own activations
    model = load_model("stimsim-topo-s0")
    images = lfw_subset()
    activity = model.activations(images.images, "IT").numpy().astype(np.float64)
    cortex_units = model.sheet("IT").coordinates_mm * 2.0  # 2 cortex mm per model mm
    is_face = images.labels["category"] == "face"
    site_dprime = []
    for x, y in sites[["cortex_x_mm", "cortex_y_mm"]].to_numpy():
        near = np.hypot(cortex_units[:, 0] - x, cortex_units[:, 1] - y) <= 0.5
        pooled = activity[:, near].mean(1)
        site_dprime.append(float(dprime(pooled[is_face, None], pooled[~is_face, None])[0]))
    site_dprime = np.array(site_dprime)
    top = site_dprime[:6]  # sites.csv is in rank order
    above = int((top > np.median(site_dprime)).sum())
    print(f"face task: top-6 sites above the median d′: {above} of 6 (chance 3); top d′ {np.round(top, 2)}, "
          f"median {np.median(site_dprime):.2f}")
    assert above >= 5  # chance: P(>= 5 of 6) = 7/64
    assert np.median(top) > np.percentile(site_dprime, 75)
    _face_plan_closes_the_loop(out, summary, sites, tmp_path, capsys)


def _face_plan_closes_the_loop(out, summary, sites, tmp_path, capsys):
    """A face plan's virtual subject runs a session, which `analyze --plan` and `power` take as a sequence plan's:
    P(face) on the signed visual-signal axis of Afraz et al. 2006 (non-face images at −s %, faces at +s %)."""
    truth_path = out / summary["truth_file"]
    assert summary["truth_file"] == "truth/subject_p_face.nc"
    with xr.open_dataset(truth_path, engine="h5netcdf") as truth:
        truth = truth.load()
    # the face plan's levels are 30, 60 and 100 %: six steps, no 0 % step
    assert truth["signed_signal_percent"].values.tolist() == [-100.0, -60.0, -30.0, 30.0, 60.0, 100.0]
    assert summary["signed_signal_percent"] == truth["signed_signal_percent"].values.tolist()
    curves = truth["subject_p_high"].transpose("electrode", "stimulated", "sequence", "step").values
    # every step holds the same number of test images (10 faces or 10 non-faces), so the subject's ΔP(face) over
    # all test images is the mean over the steps of its change of P(face)
    per_step = curves[:, 1, 0] - curves[:, 0, 0]
    np.testing.assert_allclose(per_step.mean(-1), truth["true_delta_p_face"].values, atol=1e-12)
    sham = curves[0, 0, 0]
    assert sham[-1] > sham[0] and sham[3:].mean() > sham[:3].mean()  # the psychometric curve rises towards faces
    assert summary["power_at_planned_trials"]["trials_per_site"] == 400  # the forecast covers the face task

    session = tmp_path / "session.csv"
    assert main(["subject", "session", str(out), "--trials-per-site", "240", "--csv", str(session)]) == 0
    trials = pd.read_csv(session, dtype={"electrode": str, "stimulated_electrode": str})
    assert len(trials) == 240 * len(summary["chosen_electrodes"]) and set(trials["step"]) == set(range(6))
    shown = trials[trials["stimulated_electrode"] == "sham"]
    face_steps = shown["step"] >= 3
    high = shown["choice"] == "high"
    print(f"face plan session: P('high' = face) on sham trials {high[face_steps].mean():.2f} at face steps, "
          f"{high[~face_steps].mean():.2f} at non-face steps (the subject's own P(face): {sham[3:].mean():.2f}, "
          f"{sham[:3].mean():.2f})")
    assert high[face_steps].mean() > high[~face_steps].mean()

    analysis = tmp_path / "analysis"
    assert main(["analyze", str(session), "--plan", str(out), "--out", str(analysis), "--boot", "20", "--perm", "20",
                 "--splits", "4", "--no-progress"]) == 0
    result = json.loads((analysis / "summary.json").read_text())
    assert result["plan_effect"] == "delta_p_face" and result["plan_effect_label"] == "ΔP(face)"
    assert result["n_steps"] == 6 and -1 <= result["predicted_vs_observed_r"] <= 1
    observed = pd.read_csv(analysis / "sites.csv", dtype={"electrode": str}).set_index("electrode")
    planned = sites.set_index("electrode_id")
    np.testing.assert_allclose(observed["predicted_delta_p_face"],  # the analysis's sites.csv: 6 significant digits
                               planned.loc[observed.index, "predicted_delta_p_face"], rtol=1e-5)

    power = tmp_path / "power"
    assert main(["power", str(out), "--out", str(power), "--trials-per-site", "100", "400", "--sessions", "20",
                 "--no-progress"]) == 0
    forecast = json.loads((power / "summary.json").read_text())
    assert forecast["planned_effect"] == "delta_p_face" and forecast["simulated_from"].startswith("virtual subject")
    assert "planned_delta_p_face" in pd.read_csv(power / "power_sites.csv")

    # the rig package: every site's trials run through the 20 test images at the 3 levels, each at its step
    rig = pd.read_csv(out / "rig" / "trials.csv", dtype={"electrode": str, "stimulated_electrode": str})
    assert summary["rig"]["n_images"] == 60 and len(list((out / "rig" / "images").glob("*.png"))) == 60
    assert len(rig) == 400 * len(summary["chosen_electrodes"]) and set(rig["sequence"]) == {0}
    signal = rig["stimulus_id"].str.extract(r"_signal(\d+)$")[0].astype(float)
    levels = np.array(summary["signed_signal_percent"])
    assert (np.abs(levels[rig["step"]]) == signal).all()
    assert main(["subject", "session", str(out), "--trials", str(out / "rig" / "trials.csv"), "--csv",
                 str(tmp_path / "rig_session.csv")]) == 0
    assert len(pd.read_csv(tmp_path / "rig_session.csv")) == len(rig)
    # a trial list edited by hand is checked by a session's rules, its messages naming no lab-code options
    edited = rig.copy()
    edited.loc[edited["stimulated_electrode"] != "sham", "stimulated_electrode"] = "not-an-electrode"
    edited.to_csv(tmp_path / "edited.csv", index=False)
    capsys.readouterr()
    assert main(["subject", "session", str(out), "--trials", str(tmp_path / "edited.csv"), "--csv",
                 str(tmp_path / "edited_session.csv")]) == 2
    refused = capsys.readouterr().err
    assert re.search(r"'stimulated_electrode', row\(s\) .*: .*'sham' or the electrode's own id\)", refused)
    assert "--values" not in refused and not (tmp_path / "edited_session.csv").exists()


#: A plan task from outside stimsim, in one module: P(non-face) on the face task's trials.
NONFACE_TASK = '''
from types import SimpleNamespace

import numpy as np
import xarray as xr

from stimsim.planning.tasks import PlanTask, register_plan_task
from stimsim.planning.tasks.face_categorization import FaceCategorizationTask, FaceTaskSpec


class NonfaceTask(PlanTask):
    paradigm = "categorization"
    effect = "delta_p_nonface"
    effect_label = "ΔP(non-face)"
    probability = "p_nonface"
    tables = {"nonface_task": FaceTaskSpec}

    def prepare(self, options, images, seed, where):
        return FaceCategorizationTask().prepare(SimpleNamespace(face_task=options.nonface_task), images, seed, where)

    def rehearse(self, model, options, trials, points_mm, stimulation, seed, engine, progress):
        face = FaceCategorizationTask().rehearse(model, SimpleNamespace(face_task=options.nonface_task), trials,
                                                 points_mm, stimulation, seed, engine, progress)
        return {"p_nonface": 1.0 - face["p_face"], "delta_p_nonface": -face["delta_p_face"]}

    def dataset_variables(self, working, trials, rehearsals):
        return {"p_nonface": (("model", "electrode", "condition"), np.stack([r["p_nonface"] for r in rehearsals.values()]))}, {}

    def truth_dataset(self, working, truth, trials):
        return "subject_p_nonface.nc", xr.Dataset({"true_delta_p_nonface": ("electrode", truth["delta_p_nonface"][:, 0])},
                                                  coords={"electrode": list(working)})

    def describe(self, options, summary):
        return "Task: face / non-face categorisation; the effect is the change of P(non-face) (chance 0)."
'''


def test_a_plan_task_from_another_package_is_one_module(tmp_path, outside_package, one_torch_thread, capsys):
    """A task registered from outside (one module, above) plans like a built-in one: on the same trials, the
    predicted change of P(non-face) at every electrode is minus the face task's change of P(face), since the two
    choices' probabilities sum to 1, and so is the subject's true effect (the same r). Declared by an installed
    package's entry point, a fresh process finds it by the plan file's task name."""
    from stimsim.planning.tasks import PLAN_TASKS

    package = outside_package("labtask_t")
    NonfaceTask = package.module("nonface", NONFACE_TASK).NonfaceTask

    config = _write_plan(tmp_path / "config")
    face = config.read_text().replace('name = "small"', 'name = "small"\ntask = "face_categorization"')
    face = face[:face.index("[sequences]")] + "[face_task]\nn_per_class = 10\nsignal_percent = [40, 100]\n" + \
        face[face.index("[stimulation]"):]
    config.write_text(face)
    nonface = tmp_path / "config" / "nonface.toml"
    nonface.write_text(face.replace('task = "face_categorization"', 'task = "nonface"').replace("[face_task]",
                                                                                               "[nonface_task]"))
    PLAN_TASKS.register("nonface", NonfaceTask)
    try:
        assert main(["plan", str(config), "--out", str(tmp_path / "face"), "--no-progress"]) == 0
        assert main(["plan", str(nonface), "--out", str(tmp_path / "nonface"), "--no-progress"]) == 0
    finally:
        PLAN_TASKS.unregister("nonface")
    face_sites = pd.read_csv(tmp_path / "face" / "sites.csv", dtype={"electrode_id": str}).set_index("electrode_id")
    nonface_sites = pd.read_csv(tmp_path / "nonface" / "sites.csv", dtype={"electrode_id": str}).set_index("electrode_id")
    np.testing.assert_allclose(nonface_sites.loc[face_sites.index, "predicted_delta_p_nonface"],
                               -face_sites["predicted_delta_p_face"], rtol=0, atol=1e-12)
    summaries = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("face", "nonface")]
    assert summaries[1]["task"] == "nonface" and summaries[1]["effect"] == "delta_p_nonface"
    assert summaries[1]["predicted_vs_true_r"] == pytest.approx(summaries[0]["predicted_vs_true_r"], abs=1e-9)
    assert (tmp_path / "nonface" / "truth" / "subject_p_nonface.nc").is_file()
    assert "change of P(non-face)" in (tmp_path / "nonface" / "report.html").read_text()
    # its truth has no trial-by-trial P(high), so it cannot run a session: said, not guessed
    capsys.readouterr()
    assert main(["subject", "session", str(tmp_path / "nonface"), "--csv", str(tmp_path / "session.csv")]) != 0
    assert "subject_p_nonface.nc" in (err := capsys.readouterr().err) and "cannot simulate sessions" in err
    assert not (tmp_path / "session.csv").exists()

    run = package.run_installed("stimsim.plan_tasks", "nonface = labtask_t.nonface:NonfaceTask",
                                "import sys; from stimsim.planning.config import load_plan_config; "
                                "c = load_plan_config(sys.argv[1]); print(c.task, c.effect)", str(nonface))
    assert run.returncode == 0 and run.stdout.split() == ["nonface", "delta_p_nonface"], run.stderr

LAB_PLAN = """
name = "lab"
[models]
candidates = ["stimsim-topo-s0"]
n_folds = {n_folds}
[recordings]
path = "recordings.nc"
images = [{{ source = "lfw_subset" }}]
layout = "layout.csv"
[array]
min_reliability = -1.0
"""


def _lab_plan(directory, pitch_mm=0.4, n_images=200, n_folds=3, layout_prefix="e", repeats=2, columns=4):
    """A lab's plan: recordings (random responses, ``repeats`` repeats) of ``n_images`` LFW images on a layout of 16
    electrodes in ``columns`` columns at ``pitch_mm``; the plan's layout file names its electrodes ``layout_prefix``
    1..16."""
    from stimsim.data.stimuli import lfw_subset
    from stimsim.lab.arrays import ArrayLayout
    from stimsim.lab.recordings import Recordings

    directory.mkdir(parents=True)
    xs, ys = np.meshgrid(np.arange(columns) * pitch_mm, np.arange(16 // columns) * pitch_mm)
    positions = np.c_[xs.ravel(), ys.ravel()]
    positions -= (positions.min(0) + positions.max(0)) / 2
    layout = ArrayLayout("lab", tuple(f"e{i + 1}" for i in range(16)), positions)
    ids = np.tile(lfw_subset().stimulus_id[:n_images], repeats)
    values = np.random.default_rng(0).poisson(20.0, (len(ids), 16)).astype(float)
    Recordings.from_arrays(values, ids, layout, {"units": "spikes/s"}).save_netcdf(directory / "recordings.nc")
    (directory / "layout.csv").write_text("electrode_id,x_mm,y_mm\n" + "".join(
        f"{layout_prefix}{i + 1},{x},{y}\n" for i, (x, y) in enumerate(positions)))
    path = directory / "plan.toml"
    path.write_text(LAB_PLAN.format(n_folds=n_folds))
    return path


@pytest.mark.parametrize("case, pattern", [
    ("ids", r"recordings.nc: coordinate 'electrode': 16 recorded electrode\(s\) are not in"),
    ("folds", r"plan.toml \[models\]: the recordings hold 8 images, fewer than the n_folds = 10 ridge folds need \(20:"),
    ("two_per_fold", r"plan.toml \[models\]: the recordings hold 15 images, fewer than the n_folds = 10 ridge folds "
                     r"need \(20: 2 per fold"),
    ("registration", r"plan.toml \[models\]: the recordings hold 8 images, fewer than the n_folds = 3 ridge folds need "
                     r"\(10: 2 per fold, and at least 10 for the registration\)"),
    ("fit", r"plan.toml \[recordings\] layout: array .* does not fit on the IT sheet"),
    ("um_as_mm", r"layout.csv: columns x_mm, y_mm: electrodes are 400 mm from their nearest neighbour .* x_um, y_um"),
])
def test_bad_lab_input_is_named_and_leaves_nothing(tmp_path, capsys, case, pattern, one_torch_thread):
    """Bad input: a layout whose ids do not match the recordings, fewer images than the ridge folds
    need, an array that fits the sheet at no pose (a line of 16 electrodes 2 mm apart is 30 mm long; the sheet is
    19.7 cortex mm square, 27.9 mm across its diagonal), a layout in µm written under x_mm, y_mm."""
    options = {"ids": {"layout_prefix": "x"}, "folds": {"n_images": 8, "n_folds": 10},
               "two_per_fold": {"n_images": 15, "n_folds": 10}, "registration": {"n_images": 8, "n_folds": 3},
               "fit": {"pitch_mm": 2.0, "columns": 16}, "um_as_mm": {"pitch_mm": 400.0}}[case]
    config = _lab_plan(tmp_path / "config", **options)
    out = tmp_path / "out"
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 2
    error = capsys.readouterr().err  # after a warning, where LFW has images the recordings never presented
    assert error.splitlines()[-1].startswith("stimsim: error:") and re.search(pattern, error), error
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize("case, pattern", [
    ("recordings", r"plan.toml \[recordings\] path: file \S*typo.nc not found"),
    ("table", r"plan.toml \[recordings\] images: stimulus table not found: \S*images.csv"),
    ("unreadable", r"plan.toml \[recordings\] images: \S*broken.png: cannot decode image"),
    ("names", r"plan.toml \[recordings\] names: maps stimsim's fields .*; got \{'spikes': 'mua'\}"),
    ("group", r"plan.toml \[recordings\] electrode_group: selects an ElectrodeGroup \(array\) of an NWB file; the "
              r"recordings are recordings.nc"),
    ("no_images", r"plan.toml \[recordings\]: 'images' must hold at least 1 item\(s\), got \[\]"),
    ("grid", r"plan.toml \[recordings\] layout: give \"10x10\" or \"8x8\" \(a Utah array\) or a layout file \(.csv "
             r"or a Blackrock .cmp\), got '12x12'"),
])
@pytest.mark.parametrize("out_exists", [False, True])
def test_bad_lab_files_are_named_with_the_plan_and_leave_nothing(tmp_path, capsys, case, pattern, out_exists):
    """Missing or unreadable files a lab's plan names, a name mapping of unknown fields, an NWB electrode group for a
    NetCDF file, no image set, a layout that is neither a Utah kind nor a layout file: one error naming the plan file
    and its field; --out is left as it was (absent, or empty when the lab
    made it beforehand)."""
    config = _lab_plan(tmp_path / "config")
    text = config.read_text()
    if case == "recordings":
        text = text.replace('path = "recordings.nc"', 'path = "typo.nc"')
    elif case == "table":
        text = text.replace('images = [{ source = "lfw_subset" }]', 'images = [{ source = "table", path = "images.csv" }]')
    elif case == "unreadable":
        (tmp_path / "config" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot an image")
        (tmp_path / "config" / "images.csv").write_text("stimulus_id,path\nim1,broken.png\n")
        text = text.replace('images = [{ source = "lfw_subset" }]', 'images = [{ source = "table", path = "images.csv" }]')
    elif case == "group":
        text = text.replace('layout = "layout.csv"', 'layout = "layout.csv"\nelectrode_group = "aIT"')
    elif case == "no_images":
        text = text.replace('images = [{ source = "lfw_subset" }]', 'images = []')
    elif case == "grid":
        text = text.replace('layout = "layout.csv"', 'layout = "12x12"')
    else:
        text = text.replace('layout = "layout.csv"', 'layout = "layout.csv"\nnames = { spikes = "mua" }')
    config.write_text(text)
    out = tmp_path / "out"
    if out_exists:
        out.mkdir()
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("stimsim: error:") and error.count("\n") == 1 and re.search(pattern, error), error
    assert (list(out.iterdir()) == []) if out_exists else not out.exists()


def test_face_task_without_face_labels_stops_before_any_work(tmp_path, capsys):
    """A lab's face-task plan whose images carry no 'category' label is refused with the inputs, not after the
    models have been fitted and registered; the error names the label the task looked for."""
    config = _face_lab_plan(tmp_path / "config", {})
    out = tmp_path / "out"
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert re.search(r"^stimsim: error: \S*plan.toml \[face_task\]: the images have no label 'category'", error), error
    assert not out.exists()


def test_additive_form_in_sds_is_resolved_in_each_model(tmp_path, one_torch_thread):
    """``additive_scale = "sd"``: ``activation_per_Hz`` counts SDs of each model's own IT response to the plan's
    mapping images (the subject's 200 LFW-subset images), so the candidate and the virtual subject (models of
    different activation scales) get increments of the same relative strength. The SDs are recomputed here from
    the models; the candidate's predictions equal those of a plan giving its resolved value in activation units,
    while the subject's truth differs (its IT varies less, so it gets a smaller increment)."""
    from stimsim.data.stimuli import lfw_subset
    from stimsim.models.registry import load_model

    def plan(name, stimulation):
        config = _write_plan(tmp_path / name)
        config.write_text(config.read_text().replace("[stimulation]\n", "[stimulation]\n" + stimulation))
        assert main(["plan", str(config), "--out", str(tmp_path / name / "out"), "--no-progress"]) == 0
        return (json.loads((tmp_path / name / "out" / file).read_text()) for file in ("summary.json", "config.json"))

    in_sd, record = plan("sd", 'form = "additive"\nadditive_scale = "sd"\nactivation_per_Hz = 0.01\n')
    images = lfw_subset().images
    for key, model in (("stimsim-topo-s0", "stimsim-topo-s0"), ("virtual_subject", "stimsim-topo-s2")):
        sd = load_model(model).activations(images, "IT").numpy().astype(np.float64).std()
        resolved = in_sd["additive_scale"][key]
        assert resolved["layer_sd"] == pytest.approx(sd, rel=1e-5)
        assert resolved["activation_per_Hz"] == pytest.approx(0.01 * sd, rel=1e-5)
    assert record["additive_scale"] == in_sd["additive_scale"]
    assert record["config"]["stimulation"]["additive_scale"] == "sd"
    per_Hz = in_sd["additive_scale"]["stimsim-topo-s0"]["activation_per_Hz"]
    in_units, _ = plan("units", f'form = "additive"\nactivation_per_Hz = {per_Hz!r}\n')
    assert in_units["additive_scale"] == {"additive_scale": "activation"}
    electrodes = list(in_sd["predicted_delta_auc"])
    assert np.allclose([in_sd["predicted_delta_auc"][e] for e in electrodes],
                       [in_units["predicted_delta_auc"][e] for e in electrodes], rtol=1e-9, atol=0)
    assert in_sd["additive_scale"]["virtual_subject"]["layer_sd"] < in_sd["additive_scale"]["stimsim-topo-s0"]["layer_sd"]
    assert not np.allclose(list(in_sd["true_delta_auc"].values()), list(in_units["true_delta_auc"].values()))


def test_additive_scale_needs_the_additive_form(tmp_path, capsys):
    """``additive_scale = "sd"`` with the default multiplicative form is refused with the key and the remedy."""
    config = _write_plan(tmp_path / "config")
    config.write_text(config.read_text().replace("[stimulation]\n", '[stimulation]\nadditive_scale = "sd"\n'))
    assert main(["plan", str(config), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert re.search(r'\[stimulation\].*additive_scale = "sd" sets the scale of the additive form; give form = '
                     r'"additive"', error), error
    assert not (tmp_path / "out").exists()


def test_face_task_refuses_the_other_choice_as_the_face_value(tmp_path, capsys):
    """``positive = "nonface"`` would make the face value the name of the task's other choice (every image then on
    one side): the plan file is refused, naming the field, before any work."""
    config = _face_lab_plan(tmp_path / "config", {})
    config.write_text(config.read_text() + '\n[face_task]\npositive = "nonface"\n')
    out = tmp_path / "out"
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert re.search(r"\[face_task\].*positive.*'nonface' is the name of the task's other choice", error), error
    assert not out.exists()


def test_face_task_reads_faces_from_the_label_the_plan_names(tmp_path):
    """Images whose faces are marked by another label and value (as fLoc's domain = "face", where 'category' is
    adult, child, ...) plan with ``[face_task] label`` and ``positive``: the plan runs, and its test trials are
    the face and non-face images that label marks."""
    from stimsim.data.stimuli import lfw_subset

    marks = np.where(lfw_subset().labels["category"] == "face", "portrait", "other")
    config = _face_lab_plan(tmp_path / "config", {"kind": marks})
    config.write_text(config.read_text() + '\n[face_task]\nlabel = "kind"\npositive = "portrait"\nn_per_class = 20\n'
                                           'signal_percent = [50, 100]\n')
    out = tmp_path / "out"
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "face_categorization" and summary["face_task_images"]["test"] == 40


def _face_lab_plan(directory, labels: dict):
    """A lab's face-task plan (:func:`_lab_plan`) whose images are the LFW images in a table with only ``labels``."""
    import h5py

    from stimsim.data.stimuli import lfw_subset

    config = _lab_plan(directory)
    images = lfw_subset()
    with h5py.File(directory / "images.h5", "w") as handle:
        handle["images"] = np.stack(images.images)
        handle["stimulus_id"] = images.stimulus_id.astype("S")
        for name, values in labels.items():
            handle[name] = values.astype("S")
    config.write_text(config.read_text().replace('name = "lab"', 'name = "lab"\ntask = "face_categorization"').replace(
        'images = [{ source = "lfw_subset" }]', 'images = [{ source = "table", path = "images.h5" }]'))
    return config


@pytest.mark.parametrize("anatomical, pattern", [
    ('{ ap_mm = 12.5, ml_mm = -18.0, hemisphere = "L" }',
     r"plan.toml \[array\] anatomical: hemisphere must be one of \['left', 'right'\], got 'L'"),
    ('{ ap_mm = 12.5, ml_mm = -18.0, hemisphere = "left", reference = "elec1" }',
     r"plan.toml \[array\] anatomical: reference 'elec1' is not an electrode of the array 'layout'"),
    ('{ ap_mm = 12.5, ml_mm = 18.0, hemisphere = "left" }',
     r"plan.toml \[array\] anatomical: .*ml_mm = 18 lies in the other hemisphere than 'left'"),
])
def test_bad_anatomical_pose_stops_the_plan_before_any_work(tmp_path, capsys, anatomical, pattern):
    """A wrong implant pose is found with the inputs, not when the outputs are written after the whole plan."""
    config = _lab_plan(tmp_path / "config")
    config.write_text(config.read_text().replace("[array]\n", f"[array]\nanatomical = {anatomical}\n"))
    out = tmp_path / "out"
    assert main(["plan", str(config), "--out", str(out), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("stimsim: error:") and re.search(pattern, error), error
    assert not out.exists()


def test_a_labs_plan_does_not_depend_on_the_order_of_its_files_rows(tmp_path, one_torch_thread):
    """The same recordings and images with the presentations, the electrodes and the image table's rows in another
    order give the same plan: the folds, split halves and resamples follow the stimulus ids, not the file's rows."""
    import h5py

    from stimsim.lab.recordings import Recordings, load_recordings

    plans = {}
    for name in ("as_recorded", "shuffled"):
        config = _face_lab_plan(tmp_path / name, {"kind": np.array(["face", "object"] * 100)})
        config.write_text(config.read_text().replace('task = "face_categorization"\n', ""))
        if name == "shuffled":
            rng = np.random.default_rng(5)
            recordings = load_recordings(config.parent / "recordings.nc")
            response = recordings.response.isel(presentation=rng.permutation(recordings.response.sizes["presentation"]))
            electrodes = list(rng.permutation(recordings.electrode_ids))
            Recordings(response.sel(electrode=electrodes), recordings.layout.subset(electrodes)).save_netcdf(
                config.parent / "recordings.nc")
            with h5py.File(config.parent / "images.h5", "r+") as handle:
                rows = rng.permutation(len(handle["stimulus_id"]))
                for field in list(handle):
                    values = handle[field][...][rows]
                    del handle[field]
                    handle[field] = values
        assert main(["plan", str(config), "--out", str(tmp_path / f"{name}_out"), "--no-progress"]) == 0
        plans[name] = (pd.read_csv(tmp_path / f"{name}_out" / "sites.csv", dtype={"electrode_id": str}),
                       json.loads((tmp_path / f"{name}_out" / "summary.json").read_text()))
    (sites, summary), (shuffled_sites, shuffled_summary) = plans["as_recorded"], plans["shuffled"]
    pd.testing.assert_frame_equal(shuffled_sites, sites)
    assert shuffled_summary["model_selection"] == summary["model_selection"]
    assert shuffled_summary["chosen_electrodes"] == summary["chosen_electrodes"]


def test_a_broken_electrode_recorded_as_nan_is_left_out_when_listed_as_broken(tmp_path):
    """A channel the lab knows is dead, exported as NaN throughout, does not block the plan once [array]
    broken_electrodes names it; unlisted, the refusal names it and says how to list it."""
    from stimsim.lab.recordings import Recordings, load_recordings
    from stimsim.planning.plan import PlanInputs, _screen

    config_path = _lab_plan(tmp_path / "config")
    recordings = load_recordings(tmp_path / "config" / "recordings.nc")
    response = recordings.response.copy()
    response.loc[{"electrode": "e3"}] = np.nan
    Recordings(response, recordings.layout).save_netcdf(tmp_path / "config" / "recordings.nc")
    with pytest.raises(DataError, match=r"electrode 'e3': response is nan \(400 non-finite value\(s\) in all\); the "
                                        r"electrode has no finite response at all: a plan leaves it out when its "
                                        r"\[array\] broken_electrodes lists it"):
        PlanInputs(load_plan_config(config_path), tmp_path / "out", progress=False)
    config_path.write_text(config_path.read_text().replace("[array]\n", '[array]\nbroken_electrodes = ["e3"]\n'))
    config = load_plan_config(config_path)
    inputs = PlanInputs(config, tmp_path / "out", progress=False)
    assert "e3" not in inputs.recordings.electrode_ids and len(inputs.recordings.electrode_ids) == 15
    assert "e3" in inputs.array_layout.electrode_ids  # still on the array, for the pose and the report
    working, _ = _screen(config, inputs, None)
    assert len(working) == 15 and "e3" not in working
    # a NaN on an electrode that is not listed is still refused
    response.loc[{"electrode": "e5"}] = response.sel(electrode="e5").where(response["presentation"] != 7)
    Recordings(response, recordings.layout).save_netcdf(tmp_path / "config" / "recordings.nc")
    with pytest.raises(DataError, match=r"row 7 .*electrode 'e5': response is nan \(1 non-finite value\(s\) in all\)$"):
        PlanInputs(load_plan_config(config_path), tmp_path / "out", progress=False)


def test_anatomical_reference_may_be_an_electrode_the_recordings_leave_out(tmp_path):
    """The implant's reference (e.g. electrode 1) keeps its place on the array when the lab's recordings omit it (and
    it may be listed as broken): e2, 0.4 mm right of e1 on the 4×4 layout, lies 0.4 mm anterior of e1's AP at
    rotation 0."""
    from stimsim.lab.arrays.anatomy import AnatomicalPose
    from stimsim.lab.recordings import load_recordings
    from stimsim.planning.config import load_plan_config
    from stimsim.planning.plan import PlanInputs

    config_path = _lab_plan(tmp_path / "config")
    recordings = load_recordings(tmp_path / "config" / "recordings.nc").select_electrodes([f"e{i}" for i in range(2, 17)])
    recordings.save_netcdf(tmp_path / "config" / "recordings.nc")
    config_path.write_text(config_path.read_text().replace(
        "[array]\n", '[array]\nanatomical = { ap_mm = 10.0, ml_mm = 20.0, reference = "e1" }\n'))
    config_path.write_text(config_path.read_text().replace("[array]\n", '[array]\nbroken_electrodes = ["e1"]\n'))
    config = load_plan_config(config_path)
    inputs = PlanInputs(config, tmp_path / "out", progress=False)  # e1, broken and left out, is still the array's
    assert "e1" not in inputs.layout.electrode_ids and "e1" in inputs.array_layout.electrode_ids
    pose = AnatomicalPose.from_dict(config.anatomical)
    ap_ml = pose.to_anatomical(inputs.array_layout, [inputs.layout.position_of("e2")])
    np.testing.assert_allclose(ap_ml, [[10.4, 20.0]], atol=1e-12)


def test_a_cmp_maps_labels_onto_the_recorded_electrodes_with_layout_ids_label(tmp_path):
    """Recordings that name electrodes by the Central labels of a .cmp map (here e1..e16) plan on that map with
    layout_ids = "label": e{k+1} at col k % 4, row k // 4 of the map sits at ((col - 1.5), (row - 1.5)) × 0.4 mm."""
    from stimsim.planning.config import load_plan_config
    from stimsim.planning.plan import PlanInputs

    config_path = _lab_plan(tmp_path / "config")
    lines = [f"{k % 4}\t{k // 4}\tA\t{k + 1}\te{k + 1}" for k in range(16)]
    (tmp_path / "config" / "array.cmp").write_text("// map\nCerebus mapping for array 4x4\n" + "\n".join(lines) + "\n")
    config_path.write_text(config_path.read_text().replace('layout = "layout.csv"', 'layout = "array.cmp"'))
    with pytest.raises(DataError, match=r"recordings.nc: coordinate 'electrode': 16 recorded electrode\(s\) are not in .*"
                                        r"the map's labels: .*\[recordings\] layout_ids = \"label\""):
        PlanInputs(load_plan_config(config_path), tmp_path / "out", progress=False)  # channel numbers 1..16
    config_path.write_text(config_path.read_text().replace('layout = "array.cmp"', 'layout = "array.cmp"\nlayout_ids = "label"'))
    inputs = PlanInputs(load_plan_config(config_path), tmp_path / "out", progress=False)
    assert inputs.layout.electrode_ids == tuple(f"e{k + 1}" for k in range(16))
    expected = [((k % 4 - 1.5) * 0.4, (k // 4 - 1.5) * 0.4) for k in range(16)]
    np.testing.assert_allclose(inputs.layout.positions_mm, expected, atol=1e-12)
    config_path.write_text(config_path.read_text().replace('layout = "array.cmp"', 'layout = "layout.csv"'))
    with pytest.raises(ConfigError, match=r"plan.toml \[recordings\] layout_ids: \"label\" takes the ids from a .cmp"):
        load_plan_config(config_path)


def test_a_cmp_layout_takes_its_pitch_from_the_plan(tmp_path):
    """A .cmp map of a 4×4 array at 0.25 mm pitch: with [recordings] pitch_mm = 0.25 channel 6 (col 1, row 1 of
    the map, elec 6 of bank A) sits at ((1 - 1.5), (1 - 1.5)) × 0.25 = (-0.125, -0.125) mm; without it the map
    is read at 0.4 mm and the recordings' positions are refused (corners 1 and 16: 3√2 × 0.25 = 1.061 mm apart in the
    file, 3√2 × 0.4 = 1.697 mm on the map). A pitch out of the range of
    arrays in mm, or one given with a layout that is not a .cmp, is an error naming the plan and key."""
    from stimsim.planning.config import load_plan_config
    from stimsim.planning.plan import PlanInputs

    config_path = _lab_plan(tmp_path / "config", pitch_mm=0.25, layout_prefix="")
    lines = [f"{k % 4} {k // 4} A {k + 1}" for k in range(16)]
    (tmp_path / "config" / "array.cmp").write_text("Cerebus mapping for array 4x4\n" + "\n".join(lines) + "\n")
    recordings = tmp_path / "config" / "recordings.nc"
    data = xr.load_dataset(recordings, engine="h5netcdf")
    data.assign_coords(electrode=[str(k + 1) for k in range(16)]).to_netcdf(recordings, engine="h5netcdf")
    text = config_path.read_text().replace('layout = "layout.csv"', 'layout = "array.cmp"')
    config_path.write_text(text)
    with pytest.raises(DataError, match=r"electrodes '1' and '16' are 1.061 mm apart in the file, 1.697 mm on the "
                                        r"layout; .*; the .cmp map is read at a pitch of 0.4 mm: its pitch_mm "
                                        r"\(a plan's \[recordings\] pitch_mm\) sets the array's spacing"):
        PlanInputs(load_plan_config(config_path), tmp_path / "out", progress=False)
    config_path.write_text(text.replace('layout = "array.cmp"', 'layout = "array.cmp"\npitch_mm = 0.25'))
    config = load_plan_config(config_path)
    assert config.recordings["pitch_mm"] == 0.25
    inputs = PlanInputs(config, tmp_path / "out", progress=False)
    assert inputs.layout.position_of("6") == pytest.approx((-0.125, -0.125), abs=1e-12)
    for value, pattern in (("0", r"pitch_mm: the .cmp map's electrode spacing in mm, from 0.005 to 5 .*got 0$"),
                           ("400", r"pitch_mm: .*got 400$"), ('"0.4"', r"'pitch_mm' must be a number")):
        config_path.write_text(text.replace('layout = "array.cmp"', f'layout = "array.cmp"\npitch_mm = {value}'))
        with pytest.raises(ConfigError, match=r"plan.toml \[recordings\]:? .*" + pattern):
            load_plan_config(config_path)
    config_path.write_text(text.replace('layout = "array.cmp"', 'layout = "layout.csv"\npitch_mm = 0.25'))
    with pytest.raises(ConfigError, match=r"plan.toml \[recordings\] pitch_mm: spaces the grid of a .cmp map"):
        load_plan_config(config_path)


def test_flat_and_unreliable_channels_are_left_out_by_name(tmp_path):
    """Planted channels of a lab's recordings (200 images × 2 repeats; the others carry an image signal of SD 10 over
    noise of SD 1, split-half reliability ≈ 0.99): e3 records 7.0 throughout (constant), e5 records 5.0 but 6.0 once
    (in every split the half without that presentation has constant image means: reliability undefined), e7 is
    noise alone (reliability ≈ 0 < 0.3), e1 is listed as broken (the lab's own list: not reported)."""
    from stimsim.lab.recordings import Recordings, load_recordings
    from stimsim.planning.config import load_plan_config
    from stimsim.planning.plan import PlanInputs, _mapping_phase, _reliability, _screen

    config_path = _lab_plan(tmp_path / "config")
    path = tmp_path / "config" / "recordings.nc"
    recordings = load_recordings(path)
    rng = np.random.default_rng(3)
    ids = recordings.response["stimulus_id"].values
    _, image = np.unique(ids, return_inverse=True)
    values = rng.normal(0, 10, (image.max() + 1, 16))[image] + rng.normal(0, 1, (len(ids), 16))
    values[:, 2] = 7.0
    values[:, 4] = 5.0
    values[0, 4] = 6.0
    values[:, 6] = rng.normal(0, 1, len(ids))
    Recordings.from_arrays(values, ids, recordings.layout).save_netcdf(path)
    config_path.write_text(config_path.read_text().replace(
        "min_reliability = -1.0", 'min_reliability = 0.3\nbroken_electrodes = ["e1"]'))
    config = load_plan_config(config_path)
    inputs = PlanInputs(config, tmp_path / "out", progress=False)
    reliability = _reliability(config, inputs.recordings)
    working, left_out = _screen(config, inputs, dict(zip(map(str, reliability["electrode"].values),
                                                         reliability.values)))
    assert left_out == {"constant_response": ["e3"], "reliability_undefined": ["e5"],
                        "below_min_reliability": ["e7"]}
    assert working == [e for e in inputs.layout.in_array_order(inputs.layout.electrode_ids)
                       if e not in ("e1", "e3", "e5", "e7")]
    config_path.write_text(config_path.read_text().replace("min_reliability = 0.3", "min_reliability = 0.9999"))
    config = load_plan_config(config_path)  # above every channel's reliability: the refusal says what was left out
    with pytest.raises(ConfigError, match=r"only 0 electrode\(s\) are working .*; 15 recorded electrode\(s\) left out "
                                          r".*a constant response .*: 1 \(e3\); .* below min_reliability = 0.9999: 13 "):
        _mapping_phase(config, PlanInputs(config, tmp_path / "out", progress=False), {}, progress=False)


def test_split_half_reliability_is_needed_only_where_it_is_asked_for(tmp_path):
    """Recordings with one presentation per image plan with min_reliability = -1 (every electrode not broken
    works); with a reliability threshold the refusal says how to plan without it."""
    from stimsim.planning.config import load_plan_config
    from stimsim.planning.plan import PlanInputs, _reliability

    config_path = _lab_plan(tmp_path / "config", repeats=1)  # its [array] min_reliability = -1.0
    config = load_plan_config(config_path)
    assert _reliability(config, PlanInputs(config, tmp_path / "out", progress=False).recordings) is None
    config_path.write_text(config_path.read_text().replace("min_reliability = -1.0", "min_reliability = 0.3"))
    config = load_plan_config(config_path)
    with pytest.raises(DataError, match=r"at least 2 repeats of every image; .*\[array\] min_reliability = -1 in "
                                        r"\S*plan.toml plans without it"):
        _reliability(config, PlanInputs(config, tmp_path / "out2", progress=False).recordings)


def test_a_plan_cache_of_recordings_that_changed_since_is_refused(tmp_path):
    """Re-running into the same --out after the lab re-exported its recordings must not reuse the old mapping."""
    from stimsim.lab.recordings import load_recordings
    from stimsim.planning.config import load_plan_config
    from stimsim.planning.plan import PhaseCache

    config_path = _lab_plan(tmp_path / "config")
    before = load_plan_config(config_path).digest()
    assert load_plan_config(config_path).digest() == before  # same files, same digest
    record = load_plan_config(config_path).digest_record()
    recordings_path = tmp_path / "config" / "recordings.nc"
    recordings = load_recordings(recordings_path)
    recordings.select_electrodes(recordings.electrode_ids[:15]).save_netcdf(recordings_path)
    after = load_plan_config(config_path).digest()
    assert after != before
    PhaseCache(tmp_path / "out", before, record=record)
    with pytest.raises(ConfigError, match=r"holds a plan made with other parameters or input files \(cache/"
                                          r"config_digest.txt\): changed since: input_sha256\.\S*recordings.nc "
                                          r"\('[0-9a-f]{64}' → '[0-9a-f]{64}'\); use a new --out directory"):
        PhaseCache(tmp_path / "out", after, record=load_plan_config(config_path).digest_record())
    with pytest.raises(ConfigError, match=r"holds a plan made with other parameters or input files \(cache/"
                                          r"config_digest.txt\): changed since: registration.n_boot \(10 → 7\); use"):
        PhaseCache(tmp_path / "out", before + "x",
                   record={**record, "registration": {**record["registration"], "n_boot": 7}})
    (tmp_path / "out" / "cache" / "config_digest.txt").write_bytes(b"\xff\xfe not a digest")  # damaged: refused too
    with pytest.raises(ConfigError, match="holds a plan made with other parameters or input files"):
        PhaseCache(tmp_path / "out", before)


def test_images_the_recordings_never_presented_are_named_and_left_out(tmp_path):
    """A lab's image table may list a whole stimulus library: the plan works from the recorded images only."""
    from stimsim.data.stimuli import lfw_subset
    from stimsim.planning.config import load_plan_config
    from stimsim.planning.plan import PlanInputs

    config = load_plan_config(_lab_plan(tmp_path / "config", n_images=150))  # LFW's first 150 of its 200 images
    with pytest.warns(UserWarning, match=r"plan.toml \[recordings\] images: 50 of 200 images were not presented in "
                                         r"the recordings \(\S+, \S+, \S+ and 47 more\); the plan uses the 150 "
                                         r"recorded"):
        inputs = PlanInputs(config, tmp_path / "out", False, None)
    assert sorted(inputs.images.stimulus_id) == sorted(lfw_subset().stimulus_id[:150])
    assert set(inputs.per_image["stimulus_id"].values) == set(inputs.images.stimulus_id)


@pytest.mark.parametrize("source", ["table", "folder"])
def test_a_plan_cache_of_images_whose_pixels_changed_since_is_refused(tmp_path, source):
    """An image file changed under the same name (a lab fixing one stimulus) changes the plan's inputs: its cache
    is not reused, and the refusal names the image file."""
    from PIL import Image as PILImage

    from stimsim.planning.config import load_plan_config
    from stimsim.planning.plan import PhaseCache
    from stimsim.utilities.hashing import json_sha256

    config_path = _lab_plan(tmp_path / "config")
    folder = tmp_path / "config" / "images" / "faces"
    folder.mkdir(parents=True)
    for i in range(3):
        PILImage.fromarray(np.full((8, 8), 40 * i, dtype=np.uint8)).save(folder / f"im{i}.png")
    (tmp_path / "config" / "images.csv").write_text("stimulus_id,path\n" + "".join(
        f"im{i},images/faces/im{i}.png\n" for i in range(3)))
    entry = ('{ source = "table", path = "images.csv" }' if source == "table" else
             '{ source = "folder", path = "images" }')
    config_path.write_text(config_path.read_text().replace('{ source = "lfw_subset" }', entry))
    before = load_plan_config(config_path).digest_record()
    assert load_plan_config(config_path).digest_record() == before  # same files, same digest
    assert sum(name.endswith(".png") for name in before["input_sha256"]) == 3
    PILImage.fromarray(np.full((8, 8), 255, dtype=np.uint8)).save(folder / "im1.png")
    after = load_plan_config(config_path).digest_record()
    PhaseCache(tmp_path / "out", json_sha256(before), record=before)
    with pytest.raises(ConfigError, match=r"changed since: input_sha256\.\S*im1\.png \('[0-9a-f]{64}' → "
                                          r"'[0-9a-f]{64}'\); use a new --out directory"):
        PhaseCache(tmp_path / "out", json_sha256(after), record=after)


def test_shipped_plan_files_parse_and_tasks_keep_their_own_tables(tmp_path):
    from stimsim.planning.config import load_plan_config

    experiments = __import__("pathlib").Path(__file__).resolve().parents[1] / "experiments"
    default = load_plan_config(experiments / "plan_default.toml")
    face = load_plan_config(experiments / "plan_face.toml")
    assert default.task == "sequence_2afc" and default.effect == "delta_auc"
    assert face.task == "face_categorization" and face.effect == "delta_p_face"
    assert face.task_options.face_task.signal_percent == (0.0, 15.0, 25.0, 40.0, 50.0, 80.0, 100.0)
    natural = load_plan_config(experiments / "plan_face_imagenet.toml").task_options.face_task
    assert (natural.label, natural.positive) == ("domain", "face")  # fLoc's faces, across the subject's sets
    additive = load_plan_config(experiments / "plan_face_imagenet_additive.toml")
    assert additive.additive_scale == "sd" and additive.stimulation["form"] == "additive"
    assert additive.stimulation["activation_per_Hz"] == pytest.approx(1 / 60)  # SD per Hz, fixed before any run
    assert (face.task_options.face_task.label, face.task_options.face_task.positive) == ("category", "face")
    mixed = tmp_path / "mixed.toml"
    mixed.write_text((experiments / "plan_face.toml").read_text().replace(
        'config = "subject_default.toml"', f'config = "{experiments / "subject_default.toml"}"') + "\n[decoder]\nC = 1.0\n")
    with pytest.raises(ConfigError, match=r"mixed.toml: \[decoder\] belongs to task = \"sequence_2afc\"; task "
                                          r"'face_categorization' takes \[face_task\]"):
        load_plan_config(mixed)
    other = tmp_path / "other.toml"
    other.write_text((experiments / "plan_default.toml").read_text().replace(
        'config = "subject_default.toml"', f'config = "{experiments / "subject_default.toml"}"') + "\n[face_task]\nC = 1.0\n")
    with pytest.raises(ConfigError, match=r"other.toml: \[face_task\] belongs to task = \"face_categorization\""):
        load_plan_config(other)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text(other.read_text().replace('task = "sequence_2afc"', 'task = "oddball"'))
    with pytest.raises(ConfigError, match=r"unknown.toml task: must be one of \['face_categorization', "
                                          r"'sequence_2afc'\], got 'oddball'"):
        load_plan_config(unknown)
    bad = tmp_path / "bad.toml"
    bad.write_text(mixed.read_text().replace("[decoder]\nC = 1.0\n", "").replace("n_per_class = 40", "n_per_class = 1"))
    with pytest.raises(ConfigError, match=r"bad.toml \[face_task\]: 'n_per_class' must be >= 2"):
        load_plan_config(bad)
