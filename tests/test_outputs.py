"""Outputs: result sets written as one, files that follow the umask, --out checks, relative paths."""
import json
import os
import re
import shutil
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stimsim.cortex.positions import retinotopic_positions
from stimsim.cortex.sheet import CorticalSheet
from stimsim.models.architectures import build_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.registry import load_model
from stimsim.models.topographic import TopographicModel
from stimsim.paradigms.runner import load_results, load_stimuli, run_experiment
from stimsim.utilities.errors import ConfigError, DataError
from stimsim.utilities.io import (RESULT_SET_FILE, ResultSet, atomic_write_json, check_output_dir, check_output_file,
                                  read_result_set)

EXPERIMENT = """
name = "bright_dark"
paradigm = "categorization"
model = "model"
seed = {seed}

[stimuli]
sets = [{{ source = "table", path = "images/table.csv" }}]
label = "category"
positive = "bright"

[decoder]
C = 1.0

[sites]
method = "explicit"
sites_mm = [[2.0, 2.0], [6.0, 6.0]]
recording_radius_mm = 2.0

[stimulation]
kind = "electrical"
current_uA = 50
frequency_Hz = 200

[analysis]
n_boot = 10
n_perm = 10
"""


@pytest.fixture(scope="module")
def experiment_dir(tmp_path_factory):
    """An experiment folder: two files (seeds 0 and 1), a model directory and an image table, all named
    by paths relative to the folder."""
    root = tmp_path_factory.mktemp("experiment")
    images = root / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    rows = ["stimulus_id,path,category"]
    for i in range(16):
        category = "bright" if i % 2 else "dark"
        pixels = rng.uniform(0, 0.5, (16, 16)) + (0.5 if category == "bright" else 0.0)
        Image.fromarray((pixels * 255).astype(np.uint8)).save(images / f"im{i:02d}.png")
        rows.append(f"im{i:02d},im{i:02d}.png,{category}")
    (images / "table.csv").write_text("\n".join(rows) + "\n")
    torch.manual_seed(0)
    kwargs = {"n_classes": 2, "it_units": 64}
    positions = retinotopic_positions((64, 1, 1), 8.0, seed=1).astype(np.float32).astype(np.float64)
    TopographicModel(build_network("stimsim_topo", **kwargs), {"it": CorticalSheet("it", (64, 1, 1), positions)},
                     Preprocessing(size_px=16, channels=1, mean=(0.5,), std=(0.25,)),
                     {"family": "stimsim_topo", "kwargs": kwargs}, areas={"it": "IT"}, name="tiny").save(root / "model")
    for seed in (0, 1):
        (root / f"seed{seed}.toml").write_text(EXPERIMENT.format(seed=seed))
    return root


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """Run from a folder that is not the experiment's."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_experiment_given_as_a_dict_is_pointed_to_parse_experiment(elsewhere):
    with pytest.raises(ConfigError, match=r"make one from a dict of the file's tables with "
                                          r"stimsim.paradigms.parse_experiment\(dict\)"):
        run_experiment({"name": "x", "paradigm": "categorization"}, "out", progress=False)
    assert not (elsewhere / "out").exists()


def test_relative_paths_resolve_against_the_experiment_file(experiment_dir, elsewhere):
    summary = run_experiment(experiment_dir / "seed0.toml", "out", progress=False, figures=False)
    assert summary["model"] == "tiny" and summary["n_sites"] == 2
    _, _, config = load_results(elsewhere / "out")
    assert config["model"]["source"] == str(experiment_dir / "model")
    assert config["experiment"]["stimuli"]["sets"][0]["path"] == str(experiment_dir / "images" / "table.csv")


def test_images_the_input_geometry_changes_much_are_noted(experiment_dir, tmp_path):
    """The tiny model's input is 16 px: a 10 × 40 image loses 30 of its 40 px to the centre crop and a 3 × 3 one is
    enlarged 5.3 times; both are said once, with their counts, in the run's notes and as warnings."""
    rows = ["stimulus_id,path,category"]
    for name, (height, width) in {"square": (16, 16), "long": (10, 40), "tiny": (3, 3), "wide": (20, 30)}.items():
        Image.fromarray(np.full((height, width), 128, np.uint8)).save(tmp_path / f"{name}.png")
        rows.append(f"{name},{name}.png,dark")
    (tmp_path / "table.csv").write_text("\n".join(rows) + "\n")
    notes = []
    with pytest.warns(UserWarning) as caught:
        load_stimuli([{"source": "table", "path": str(tmp_path / "table.csv")}], ["category"],
                     load_model(experiment_dir / "model"), notes, "x.toml [stimuli]")
    assert notes == [str(w.message) for w in caught] == [
        "x.toml [stimuli] sets[0] (table): 1 of 4 images are over twice as long as wide, and the model sees only their "
        "centre square (e.g. long, 40 × 10 px)",
        "x.toml [stimuli] sets[0] (table): 1 of 4 images are enlarged over 4 times to the model's 16-px input (e.g. "
        "tiny, 3 × 3 px)"]


def test_stimulation_the_model_cannot_take_is_refused_before_any_work(experiment_dir, elsewhere):
    """resting_fraction needs each unit's resting activity, which this model does not record: one error naming the
    file's table, before the images are run, and no output folder."""
    config = experiment_dir / "resting.toml"
    config.write_text(EXPERIMENT.format(seed=0).replace("frequency_Hz = 200\n",
                                                        "frequency_Hz = 200\nresting_fraction = 0.5\n"))
    with pytest.raises(ConfigError, match=r"resting.toml \[stimulation\]: resting_fraction > 0 acts on each unit's "
                                          r"resting activity, and the model records none for layer 'it'"):
        run_experiment(config, "out", progress=False, figures=False)
    assert not (elsewhere / "out").exists()


def test_a_run_killed_between_its_files_leaves_no_loadable_mix(experiment_dir, elsewhere, monkeypatch):
    out = elsewhere / "out"
    first = run_experiment(experiment_dir / "seed0.toml", out, progress=False, figures=False)
    old_summary = (out / "summary.json").read_text()
    # running it again (resuming from its store) dies after results.nc and before summary.json
    real = ResultSet.write_json

    def die_at_summary(self, name, obj):
        if name == "summary.json":
            raise KeyboardInterrupt
        return real(self, name, obj)

    monkeypatch.setattr(ResultSet, "write_json", die_at_summary)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(experiment_dir / "seed0.toml", out, progress=False, figures=False)
    monkeypatch.undo()
    assert (out / "summary.json").read_text() == old_summary  # the old summary beside new results
    with pytest.raises(DataError, match="incomplete"):
        load_results(out)
    # running again finishes the set
    again = run_experiment(experiment_dir / "seed0.toml", out, progress=False, figures=False)
    assert load_results(out)[1] == again == first


def test_a_file_from_another_run_is_refused(experiment_dir, elsewhere):
    run_experiment(experiment_dir / "seed0.toml", "a", progress=False, figures=False)
    run_experiment(experiment_dir / "seed1.toml", "b", progress=False, figures=False)
    assert (elsewhere / "a" / "results.nc").read_bytes() != (elsewhere / "b" / "results.nc").read_bytes()
    shutil.copy(elsewhere / "b" / "results.nc", elsewhere / "a" / "results.nc")
    with pytest.raises(DataError, match=r"results.nc does not belong to the result set"):
        load_results(elsewhere / "a")
    with pytest.raises(DataError, match="no finished result set"):
        load_results(experiment_dir / "images")


def test_foreign_files_in_out_are_not_overwritten(experiment_dir, elsewhere):
    out = elsewhere / "mine"
    out.mkdir()
    (out / "summary.json").write_text("my notes")
    with pytest.raises(ConfigError, match=r"holds files stimsim did not write \(summary.json\).*--force"):
        run_experiment(experiment_dir / "seed0.toml", out, progress=False, figures=False)
    assert (out / "summary.json").read_text() == "my notes"
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    run_experiment(experiment_dir / "seed0.toml", out, progress=False, figures=False, force=True)
    load_results(out)
    # stimsim's own set, and a killed write's temporary files, are rewritten without --force; the temporary
    # files (of a run killed by SIGKILL, which removes nothing) are gone after the new run
    (out / ".results.nc.abc123.tmp.nc").write_bytes(b"partial")
    (out / ".result_set.json.w1p2_h2h.tmp.json").write_bytes(b"{")
    run_experiment(experiment_dir / "seed0.toml", out, progress=False, figures=False)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".") and ".tmp" in p.name]


def test_a_result_set_removes_temporary_files_only_where_the_directory_is_its_own(tmp_path):
    """A killed write's temporary files in a directory holding only stimsim's set are removed when a new set starts
    there; in a directory written into with force beside someone else's files, nothing of theirs is touched."""
    own, forced = tmp_path / "own", tmp_path / "forced"
    for directory in (own, forced):
        directory.mkdir()
        (directory / ".result_set.json.w1p2_h2h.tmp.json").write_text("{")
    (forced / "notes.txt").write_text("mine")
    ResultSet(own, "test")
    ResultSet(forced, "test", force=True)
    assert sorted(p.name for p in own.iterdir()) == [RESULT_SET_FILE]
    assert sorted(p.name for p in forced.iterdir()) == [".result_set.json.w1p2_h2h.tmp.json", "notes.txt",
                                                        RESULT_SET_FILE]


def test_files_follow_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "a.json", {"x": 1})
        result = ResultSet(tmp_path / "set", "test")
        result.write_json("b.json", {"y": 2})
        result.finish()
        os.umask(0o077)
        atomic_write_json(tmp_path / "c.json", {"x": 1})
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "set" / "b.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "set" / RESULT_SET_FILE).stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "c.json").stat().st_mode) == 0o600


def test_result_set_replaces_an_older_set_whole(tmp_path):
    first = ResultSet(tmp_path, "test")
    first.write_json("summary.json", {"run": 1})
    first.write_json("old_figure.json", {"run": 1})
    first.finish()
    second = ResultSet(tmp_path, "test")
    second.write_json("summary.json", {"run": 2})
    second.finish()
    files = read_result_set(tmp_path, required=("summary.json",))
    assert sorted(files) == ["summary.json"] and not (tmp_path / "old_figure.json").exists()
    manifest = json.loads((tmp_path / RESULT_SET_FILE).read_text())
    assert manifest["complete"] is True and len(manifest["files"]["summary.json"]) == 64
    with pytest.raises(DataError, match="has no"):
        read_result_set(tmp_path, required=("results.nc",))
    with pytest.raises(ValueError, match="plain names"):
        second.claim("../escape.json")


def _stop(tmp):
    raise KeyboardInterrupt


def test_files_written_together_replace_an_older_set_only_once_all_are_made(tmp_path, monkeypatch):
    """Stopped while its files are made, a set written together leaves the older set complete and no temporary file;
    stopped while they are moved in, it leaves a set whose manifest says it is incomplete."""
    first = ResultSet(tmp_path, "test")
    first.write_json("summary.json", {"run": 1})
    first.write_json("figure.json", {"run": 1})
    first.finish()
    with pytest.raises(KeyboardInterrupt), ResultSet(tmp_path, "test") as second:
        second.write_together({"summary.json": lambda tmp: atomic_write_json(tmp, {"run": 2}), "figure.json": _stop})
    assert sorted(os.listdir(tmp_path)) == ["figure.json", RESULT_SET_FILE, "summary.json"]
    files = read_result_set(tmp_path, required=("summary.json", "figure.json"))
    assert [json.loads(files[name].read_text()) for name in sorted(files)] == [{"run": 1}, {"run": 1}]
    real = os.replace

    def stop_at_figure(source, target):
        if Path(target).name == "figure.json":
            raise KeyboardInterrupt
        real(source, target)

    monkeypatch.setattr(os, "replace", stop_at_figure)
    with pytest.raises(KeyboardInterrupt), ResultSet(tmp_path, "test") as third:
        third.write_together({name: lambda tmp: atomic_write_json(tmp, {"run": 3})
                              for name in ("summary.json", "figure.json")})
    monkeypatch.undo()
    assert json.loads((tmp_path / "summary.json").read_text()) == {"run": 3}
    assert json.loads((tmp_path / "figure.json").read_text()) == {"run": 1}
    with pytest.raises(DataError, match="incomplete"):
        read_result_set(tmp_path)
    assert not [name for name in os.listdir(tmp_path) if ".tmp" in name]


def test_a_finished_set_stays_readable_until_a_new_set_claims_a_file(tmp_path):
    """A set under way in the directory of a finished one (what a ``kill -9`` during its work leaves) keeps the
    finished set readable until it claims its first file."""
    first = ResultSet(tmp_path, "test")
    first.write_json("summary.json", {"run": 1})
    first.finish()
    second = ResultSet(tmp_path, "test")
    assert json.loads(read_result_set(tmp_path)["summary.json"].read_text()) == {"run": 1}
    second.write_json("summary.json", {"run": 2})
    with pytest.raises(DataError, match="incomplete"):
        read_result_set(tmp_path)
    second.finish()
    assert json.loads(read_result_set(tmp_path)["summary.json"].read_text()) == {"run": 2}


def test_a_set_of_other_inputs_is_replaced_with_a_warning_and_the_same_inputs_without(tmp_path, recwarn):
    first = ResultSet(tmp_path, "test", inputs={"file": {"current_uA": 50}, "model": "a"})
    first.write_json("summary.json", {"run": 1})
    first.finish()
    ResultSet(tmp_path, "test", inputs={"file": {"current_uA": 50}, "model": "a"}).abandon()
    assert not recwarn.list
    with pytest.warns(UserWarning, match=r"made from other inputs \(file.current_uA \(50 → 80\); model \('a' → "
                                         r"'b'\)\)") as caught:
        later = ResultSet(tmp_path, "test", inputs={"file": {"current_uA": 80}, "model": "b"})
    assert len(caught) == 1
    later.abandon()  # stopped before writing: the older set and its inputs are kept
    assert json.loads((tmp_path / RESULT_SET_FILE).read_text())["inputs"]["model"] == "a"
    assert read_result_set(tmp_path, required=("summary.json",))


def test_another_commands_output_is_refused_even_when_forced(tmp_path):
    """A finished set of one command (an analysis of a recorded session, say) in the --out of another is refused,
    forced or not, naming the command that wrote it: a forced run would replace its manifest and files of the same
    names, and the analysis would no longer read back. A plan, a virtual subject or a training run likewise."""
    analysis = ResultSet(tmp_path, "analysis")
    analysis.write_json("summary.json", {"analysis": 1})
    analysis.write_json("sites.json", {"analysis": 1})
    analysis.finish()
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    for force in (False, True):
        with pytest.raises(ConfigError, match=r"holds an analysis \(`stimsim analyze`\); give another --out "
                                              r"directory \(--force does not"):
            ResultSet(tmp_path, "percepts", force=force)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before
    assert sorted(read_result_set(tmp_path, required=("summary.json",))) == ["sites.json", "summary.json"]
    ResultSet(tmp_path, "analysis", force=True).abandon()  # the same command's own set is taken
    for mark, owner in (("truth.json", r"a virtual subject \(`stimsim subject make`\)"),
                        ("training_run.json", r"a training run \(`stimsim train`\)"),
                        ("training_config.json", r"a training run \(`stimsim train`\)"),  # one to resume
                        ("cache/config_digest.txt", r"a plan \(`stimsim plan`\)")):
        other = tmp_path / mark.split(".")[0].replace("/", "_")
        (other / mark).parent.mkdir(parents=True)
        (other / mark).write_text("{}")
        for force in (False, True):
            with pytest.raises(ConfigError, match=rf"holds {owner}; give another --out"):
                ResultSet(other, "analysis", force=force)
        assert not (other / RESULT_SET_FILE).exists()



def test_a_folder_a_plan_writes_inside_its_directory_is_refused_as_the_plans_even_when_forced(tmp_path):
    """A plan's rig package (the folder copied to the rig), its images, cache or truth take no other command's files;
    a folder of the lab's own inside the plan (its power analysis, say) is free."""
    plan = tmp_path / "plan"
    for path in ("cache/config_digest.txt", "rig/trials.csv", "rig/images/42_seq0_step0.png", "truth/truth.npz"):
        (plan / path).parent.mkdir(parents=True, exist_ok=True)
        (plan / path).write_text("0\n")
    for folder in ("rig", "rig/images", "truth", "cache", "rig/new"):
        before = sorted(path.relative_to(plan) for path in plan.rglob("*"))
        with pytest.raises(ConfigError, match=r"holds a plan \(`stimsim plan`\); give another --out directory"):
            ResultSet(plan / folder, "analysis", force=True)
        assert sorted(path.relative_to(plan) for path in plan.rglob("*")) == before
    for power in (plan / "power", plan / "rig" / ".." / "power"):
        ResultSet(power, "power").abandon()
        assert not (plan / "power").exists()


@pytest.mark.parametrize("make, message", [
    (lambda root: "", "empty text"),
    (lambda root: (root / "file.txt").write_text("x") and root / "file.txt", "is a file"),
    (lambda root: (root / "file.txt").write_text("x") and root / "file.txt" / "sub", "cannot write into"),
    (lambda root: (root / "results").symlink_to(root / "unmounted") or root / "results",
     r"results is a symbolic link to .*unmounted, which does not exist; create that folder or give another"),
    (lambda root: (root / "results").symlink_to(root / "unmounted") or root / "results" / "run1",
     r"results/run1: .*results is a symbolic link to .*unmounted, which does not exist"),
])
def test_unusable_output_directories_are_clear_errors(tmp_path, make, message):
    with pytest.raises(ConfigError, match=message):
        ResultSet(make(tmp_path), "test")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where nobody can create files")
def test_a_place_where_files_cannot_be_created_is_refused_before_any_work(tmp_path):
    # /proc refuses new files even to root, to whom os.access says it is writable
    with pytest.raises(ConfigError, match=r"cannot write into output directory /proc/out: /proc is not writable"):
        check_output_dir("/proc/out")
    with pytest.raises(ConfigError, match=r"cannot write into output directory /proc: /proc is not writable"):
        check_output_file("/proc/session.nwb")
    with pytest.raises(ConfigError, match="is a directory; give a file name"):
        check_output_file(tmp_path)
    assert check_output_file(tmp_path / "new" / "session.nwb") == tmp_path / "new" / "session.nwb"
    assert list(tmp_path.iterdir()) == []  # checking creates nothing


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_output_directory_is_a_clear_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="cannot write into output directory"):
            ResultSet(locked, "test")
    finally:
        locked.chmod(0o755)


# --- the command line -------------------------------------------------------------------------------
def _cli(capsys, *argv):
    from stimsim.cli import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("make, message", [
    (lambda root: "", "--out is empty"),
    (lambda root: (root / "f").write_text("x") and str(root / "f"), "is a file, not a directory"),
    (lambda root: (root / "f").write_text("x") and str(root / "f" / "out"), "cannot write into output directory"),
])
def test_cli_refuses_unusable_out_with_a_message(experiment_dir, elsewhere, capsys, make, message):
    code, _, err = _cli(capsys, "run", str(experiment_dir / "seed0.toml"), "--out", make(elsewhere), "--no-progress")
    assert code == 2 and err.startswith("stimsim: error:") and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", [["train", "experiments/train_stimsim_topo_seed0.toml"],
                                     ["models", "check", "stimsim-topo-s0"]])
def test_every_out_option_is_checked_first(elsewhere, capsys, command):
    (elsewhere / "f").write_text("x")
    repo = Path(__file__).resolve().parents[1]
    argv = [str(repo / part) if part.endswith(".toml") else part for part in command]
    code, _, err = _cli(capsys, *argv, "--out", str(elsewhere / "f" / "out"))
    assert code == 2 and "cannot write into output directory" in err and "is a file" in err
    # a command that fails leaves no --out behind
    code, _, err = _cli(capsys, *argv[:-1], "no-such-model" if argv[0] == "models" else "missing.toml",
                        "--out", "new/out")
    assert code == 2 and not (elsewhere / "new").exists()


def test_cli_keeps_foreign_files_unless_forced(experiment_dir, elsewhere, capsys):
    (elsewhere / "out").mkdir()
    (elsewhere / "out" / "sites.png").write_text("my figure")
    code, _, err = _cli(capsys, "run", str(experiment_dir / "seed0.toml"), "--out", "out", "--no-progress")
    assert code == 2 and "sites.png" in err and "--force" in err
    assert (elsewhere / "out" / "sites.png").read_text() == "my figure"
    code, out, _ = _cli(capsys, "run", str(experiment_dir / "seed0.toml"), "--out", "out", "--no-progress",
                        "--force", "--threads", "1")
    assert code == 0 and json.loads(out)["n_sites"] == 2
    assert (elsewhere / "out" / "sites.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("stimulus_set, message", [
    ('{ source = "folder", path = "no_such_images" }', r"\[stimuli\] sets\[0\] path: stimulus folder not found: "),
    ('{ source = "folder", dir = "images" }', r"\[stimuli\] sets\[0\]: stimulus source 'folder': unknown key"),
])
def test_bad_stimuli_name_the_field_and_leave_no_out_behind(experiment_dir, elsewhere, capsys, stimulus_set,
                                                            message):
    text = (experiment_dir / "seed0.toml").read_text().replace(
        '{ source = "table", path = "images/table.csv" }', stimulus_set)
    bad = experiment_dir / "bad_stimuli.toml"
    bad.write_text(text)
    code, _, err = _cli(capsys, "run", str(bad), "--out", "new/out", "--no-progress")
    assert code == 2 and err.startswith("stimsim: error: ") and "Traceback" not in err
    assert re.search(r"bad_stimuli\.toml " + message, err), err
    assert not any(elsewhere.iterdir())  # neither new/ nor new/out/
    (elsewhere / "mine").mkdir()  # a directory the user made stays, as it was
    code, _, _ = _cli(capsys, "run", str(bad), "--out", "mine", "--no-progress")
    assert code == 2 and (elsewhere / "mine").is_dir() and not any((elsewhere / "mine").iterdir())


def test_a_failed_rerun_keeps_the_finished_set(experiment_dir, elsewhere, capsys):
    first = run_experiment(experiment_dir / "seed0.toml", "out", progress=False, figures=False)
    text = (experiment_dir / "seed0.toml").read_text().replace('path = "images/table.csv"', 'path = "nowhere.csv"')
    bad = experiment_dir / "no_table.toml"
    bad.write_text(text)
    code, _, err = _cli(capsys, "run", str(bad), "--out", "out", "--no-progress")
    assert code == 2 and "no_table.toml [stimuli] sets[0]" in err
    assert load_results(elsewhere / "out")[1] == first  # still complete, still loadable
    assert (elsewhere / "out" / "simulation_store").is_dir()  # the store to resume from is kept


def _interrupted_after_a_chunk(monkeypatch, experiment, out) -> None:
    """Run ``experiment`` into ``out`` and stop it (Ctrl-C) once the engine wrote its first chunk."""
    from stimsim.engine import simulation as engine

    real = engine.write_chunk

    def interrupt_after_a_chunk(*args):
        real(*args)
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(engine, "write_chunk", interrupt_after_a_chunk)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(experiment, out, progress=False, figures=False)


def test_a_run_interrupted_during_its_simulation_keeps_its_store(experiment_dir, elsewhere, monkeypatch):
    _interrupted_after_a_chunk(monkeypatch, experiment_dir / "seed0.toml", "fresh")
    store = elsewhere / "fresh" / "simulation_store"
    assert (store / "store.json").is_file() and len(list(store.glob("chunk*"))) == 1


def test_an_edited_experiment_runs_again_into_its_finished_directory(experiment_dir, elsewhere, monkeypatch):
    """A finished run's store only speeds up the same run again: a file edited since (another current) runs into
    the same --out, with a warning naming what changed, given before the run. A killed run's store is work to
    resume: other inputs are refused there unless forced."""
    def edited(current_uA: int) -> Path:
        path = experiment_dir / f"current_{current_uA}.toml"
        path.write_text((experiment_dir / "seed0.toml").read_text().replace("current_uA = 50",
                                                                            f"current_uA = {current_uA}"))
        return path

    run_experiment(experiment_dir / "seed0.toml", "out", progress=False, figures=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same file again: nothing to say
        run_experiment(experiment_dir / "seed0.toml", "out", progress=False, figures=False)
    with pytest.warns(UserWarning, match=r"holds results \(experiment run\) made from other inputs "
                                         r"\(experiment.stimulation.current_uA \(50 → 80\)\); this run replaces them"):
        run_experiment(edited(80), "out", progress=False, figures=False)
    results = load_results(elsewhere / "out")[0]
    assert set(results["current_uA"].values[np.isfinite(results["current_uA"].values)]) == {80}
    with pytest.warns(UserWarning, match=r"current_uA \(80 → 90\)"):
        _interrupted_after_a_chunk(monkeypatch, edited(90), "out")
    with pytest.raises(ConfigError, match=r"out/simulation_store holds the unfinished work of a run with different "
                                          r"inputs"), pytest.warns(UserWarning, match=r"current_uA \(80 → 100\)"):
        run_experiment(edited(100), "out", progress=False, figures=False)
    with pytest.warns(UserWarning, match=r"current_uA \(80 → 100\)"):
        run_experiment(edited(100), "out", progress=False, figures=False, force=True)
    results = load_results(elsewhere / "out")[0]
    assert set(results["current_uA"].values[np.isfinite(results["current_uA"].values)]) == {100}


def test_cli_warnings_are_one_line_and_phases_are_reported(experiment_dir, elsewhere, capsys):
    text = (experiment_dir / "seed0.toml").read_text().replace('path = "images/table.csv" }',
                                                               'path = "images/table.csv", heldout_only = true }')
    (experiment_dir / "heldout.toml").write_text(text)
    code, _, err = _cli(capsys, "run", str(experiment_dir / "heldout.toml"), "--out", "out")
    assert code == 0
    warning_lines = [line for line in err.splitlines() if "warning" in line]
    assert len(warning_lines) == 1 and warning_lines[0].startswith("stimsim: warning: ")
    assert "lists no held-out stimuli" in warning_lines[0] and "UserWarning" not in err
    assert "stimsim: localizer: responses of it to 16 images" in err
    assert "stimsim: trials: preparing" in err


def test_cli_lets_a_bug_show_as_a_traceback(experiment_dir, elsewhere, capsys, monkeypatch):
    from stimsim.paradigms import runner

    def broken(*args, **kwargs):
        raise ValueError("a bug, not a user error")

    monkeypatch.setattr(runner, "run_experiment", broken)
    with pytest.raises(ValueError, match="a bug"):
        _cli(capsys, "run", str(experiment_dir / "seed0.toml"), "--out", "out")


@pytest.mark.parametrize("argv, message", [
    (["--threads", "0"], "--threads must be at least 1"),
    (["--threads", "99999999999"], f"--threads must be at most {4 * os.cpu_count()} (4 per CPU of this machine)"),
    (["--mirror", "no/such/dir"], "--mirror no/such/dir: not a directory"),
])
def test_cli_common_options_are_checked(experiment_dir, elsewhere, capsys, argv, message):
    code, _, err = _cli(capsys, "run", str(experiment_dir / "seed0.toml"), "--out", "out", *argv)
    assert code == 2 and message in err


SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


MIRROR = Path(os.environ.get("STIMSIM_MIRROR_DIR") or SHARED_DATA)


@pytest.mark.skipif(not MIRROR.is_dir(), reason=f"needs the published LFW crops: no mirror at {MIRROR}; set "
                                                "STIMSIM_MIRROR_DIR to a folder holding them")
def test_models_check_writes_its_figure_where_told_and_takes_a_mirror(elsewhere, capsys, monkeypatch):
    mirror = str(MIRROR)
    monkeypatch.delenv("STIMSIM_MIRROR_DIR", raising=False)
    code, out, err = _cli(capsys, "models", "check", "stimsim-topo-s0", "--heldout", "--shuffles", "100", "--json",
                          "--out", "checks", "--mirror", mirror, "--threads", "1")
    monkeypatch.delenv("STIMSIM_MIRROR_DIR", raising=False)
    assert code == 0, err
    assert json.loads(out)["figure"] == str(Path("checks") / "stimsim-topo-s0_face_dprime.png")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["checks"]
    assert (elsewhere / "checks" / "stimsim-topo-s0_face_dprime.png").stat().st_size > 1000
    assert "stimsim: models check: clustering of every class's d′ map against 100 position shuffles" in err


def test_provenance_records_the_commit_stimsim_runs_from(tmp_path):
    """The software record saved with every result (``config.json`` of ``run`` and ``models score``) holds the
    commit the benchmark reports: the checkout's, ``+modified`` where its tracked files differ; null outside one."""
    import stimsim
    from stimsim.utilities.io import checkout_commit, provenance

    checkout = Path(stimsim.__file__).resolve().parents[1]
    commit = provenance()["software"]["commit"]
    assert commit == checkout_commit(checkout)
    if (checkout / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}(\+modified)?", commit), commit
    assert checkout_commit(tmp_path) is None


def test_provenance_records_the_thread_count_a_result_was_computed_with():
    from stimsim.utilities.io import provenance

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = provenance({"a": 1})
        torch.set_num_threads(2)
        two = provenance()
    finally:
        torch.set_num_threads(before)
    assert (one["torch_threads"], two["torch_threads"]) == (1, 2)
    assert one["config"] == {"a": 1} and two["config"] == {} and "torch" in one["software"]
