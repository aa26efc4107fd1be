"""The command line: help everywhere, data and model listings, exit codes."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stimsim import __version__
from stimsim.cli import build_parser, main

SUBCOMMANDS = [["train"], ["data"], ["data", "list"], ["data", "fetch"], ["data", "verify"], ["models"],
               ["models", "list"], ["models", "check"], ["models", "resting"], ["models", "score"], ["run"], ["plan"],
               ["bench"], ["subject"], ["subject", "make"],
               ["subject", "session"], ["analyze"], ["power"]]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"stimsim {__version__}"


@pytest.mark.parametrize("words", SUBCOMMANDS, ids=" ".join)
def test_every_subcommand_has_help(words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*words, "--help"])
    assert exit_info.value.code == 0
    assert "usage: stimsim" in capsys.readouterr().out


@pytest.mark.parametrize("words, required", [(["data", "verify"], []), (["models", "list"], []),
                                             (["run"], ["e.toml", "--out", "out"]), (["plan"], ["p.toml", "--out", "o"])],
                         ids=lambda value: " ".join(value))
def test_an_unknown_argument_is_named_with_its_commands_usage(words, required, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*words, *required, "--no-such-option"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: stimsim {' '.join(words)} ")
    assert f"stimsim {' '.join(words)}: error: " in err and "--no-such-option" in err


def test_data_list_names_every_entry(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("afraz2006", "moeller2017", "lfw_subset", "fashion_mnist", "tdann", "stimsim_default_models"):
        assert name in out
    lines = out.splitlines()  # the kind column starts at one place on every line, after the longest name
    assert len({len(line) - len(line.split(maxsplit=1)[1]) for line in lines}) == 1


@pytest.mark.skipif(not (Path(__file__).resolve().parents[2] / "shared" / "data").is_dir(),
                    reason="needs the published data mirror")
def test_data_fetch_and_verify(capsys):
    assert main(["data", "fetch", "afraz2006"]) == 0
    assert main(["data", "verify"]) == 0
    out = capsys.readouterr().out
    assert "afraz2006" in out and "mismatch" not in out


def test_data_verify_lines_up_its_counts_after_the_longest_name(capsys):
    main(["data", "verify"])
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert any(line.startswith("efficientnet_lite0_imagenet ") for line in lines)  # a name over 24 characters
    assert len({len(line) - len(line.split(maxsplit=1)[1]) for line in lines}) == 1


def test_data_fetch_of_unknown_entry_is_a_clear_error(capsys):
    assert main(["data", "fetch", "no_such_dataset"]) == 2
    assert "no_such_dataset" in capsys.readouterr().err
    assert main(["data", "fetch", "afraz2006", "--mirror", "no/such/dir"]) == 2  # even where the file is cached
    assert "--mirror no/such/dir: not a directory" in capsys.readouterr().err


def test_models_list(capsys):
    assert main(["models", "list"]) == 0
    assert "stimsim-topo-s0" in capsys.readouterr().out


def test_models_list_names_the_folder_of_a_model_of_ones_own(tmp_path, capsys):
    """A copy of a shipped model keeps its name: the list says where the copy is."""
    import shutil

    from stimsim.models.registry import SHIPPED_DIR

    copy = shutil.copytree(SHIPPED_DIR / "stimsim-topo-s0", tmp_path / "my model")
    assert main(["models", "list", str(copy), "stimsim-topo-s0"]) == 0
    own, shipped = capsys.readouterr().out.splitlines()
    assert own.startswith("stimsim-topo-s0 ") and own.endswith(f"  in {copy}")
    assert shipped.startswith("stimsim-topo-s0 ") and " in " not in shipped


def test_run_reports_a_missing_experiment_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "out")]) == 2
    assert "missing.toml" in capsys.readouterr().err


@pytest.mark.parametrize("words", [["run"], ["plan"], ["train"], ["models", "check"], ["models", "score"],
                                   ["models", "resting"], ["visualize"], ["subject", "make"], ["bench"]],
                         ids=" ".join)
def test_compute_commands_take_a_device(words, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*words, "--help"])
    assert "--device" in capsys.readouterr().out


def test_unavailable_device_and_bad_scheduler_are_user_errors(tmp_path, capsys):
    import torch

    experiment = str(Path(__file__).resolve().parents[1] / "experiments" / "afraz2006.toml")
    assert main(["run", experiment, "--out", str(tmp_path), "--scheduler", "processes=none"]) == 2
    assert "processes=N" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["run", experiment, "--out", str(tmp_path), "--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv, module, function, resumes", [
    (["run", "experiment.toml", "--out", "out"], "stimsim.paradigms.runner", "run_experiment", True),
    (["plan", "plan.toml", "--out", "out"], "stimsim.planning.job", "run_plan", True),
    (["train", str(REPO / "experiments" / "train_stimsim_topo_seed0.toml"), "--out", "out"], "stimsim.training.loop",
     "train", True),
    (["analyze", "session.csv", "--out", "out"], "stimsim.analysis.analyze", "run_analysis", False),
], ids=lambda value: value[0] if isinstance(value, list) else None)
def test_an_interrupt_is_one_line_and_exit_code_130(argv, module, function, resumes, tmp_path, monkeypatch, capsys):
    import importlib

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(importlib.import_module(module), function, interrupted)
    assert main(argv) == 130  # stopped before its --out was made, or before train's first checkpoint there
    assert not (tmp_path / "out").exists()
    assert capsys.readouterr().err == "stimsim: interrupted\n"  # nothing to resume
    (tmp_path / "out").mkdir()  # stopped once work was kept there
    assert main(argv) == 130
    captured = capsys.readouterr()
    expected = "stimsim: interrupted; run the same command again to resume" if resumes else "stimsim: interrupted"
    assert captured.err == expected + "\n" and captured.out == ""


def test_phase_lines_and_warnings_never_share_a_line_with_a_progress_bar(capsys):
    """A bar on stderr is cleared before a phase line or a warning and drawn again after it: the line stands alone
    between carriage returns and newlines (written after the bar, it used to run on: 'poses: 0/2 …stimsim: …')."""
    import sys

    from tqdm import tqdm

    from stimsim.cli import _show_warning
    from stimsim.utilities.progress import report_phase

    with tqdm(total=2, desc="poses", file=sys.stderr) as bar:
        bar.update(1)
        report_phase("plan: making the virtual subject")
        _show_warning(UserWarning("2 recorded electrode(s) left out"), UserWarning, "x.py", 1)
    pieces = capsys.readouterr().err.replace("\r", "\n").split("\n")
    assert "stimsim: plan: making the virtual subject" in pieces
    assert "stimsim: warning: 2 recorded electrode(s) left out" in pieces
    assert not any("poses" in piece and "stimsim:" in piece for piece in pieces)


#: A command (``data list`` replaced) that is writing its result file through stimsim.utilities.io when the signal comes:
#: it prints ``writing`` once the temporary file exists, then waits.
_WRITING = """
import sys, time
from pathlib import Path
import stimsim.cli as cli
from stimsim.utilities.io import atomic_save

def write_slowly(args):
    def save(tmp):
        Path(tmp).write_text("half")
        print("writing", flush=True)
        time.sleep(120)
    atomic_save(Path(sys.argv[1]) / "results.nc", save)
    return 0

cli._cmd_data_list = write_slowly
sys.exit(cli.main(["data", "list"]))
"""


@pytest.mark.parametrize("signum, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated"),
                                                (signal.SIGHUP, 129, "terminated")], ids=lambda v: getattr(v, "name", None))
def test_a_signal_ends_a_command_with_one_line_its_exit_code_and_no_half_written_file(signum, code, word, tmp_path,
                                                                                      default_ctrl_c):
    """Ctrl-C, `kill` (SIGTERM) and a closed terminal (SIGHUP) in the middle of writing a result: one line on
    stderr, exit code 128 + the signal's number, and the temporary file removed (SIGTERM used to end Python at
    once: no message, exit code -15, the temporary file left in --out)."""
    process = subprocess.Popen([sys.executable, "-c", _WRITING, str(tmp_path)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                               preexec_fn=default_ctrl_c)
    try:
        assert process.stdout.readline() == "writing\n"
        assert len(list(tmp_path.iterdir())) == 1  # the temporary file
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == code
    assert err == f"stimsim: {word}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
def test_a_closed_pipe_ends_quietly(unbuffered):
    """`stimsim data list | head -0`: the reader is gone before stimsim writes; no traceback and no 'Exception
    ignored' from the flush at exit, exit code 141 as for a command that SIGPIPE ends."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; from stimsim.cli import main; sys.exit(main())",
                                "data", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": unbuffered})
    process.stdout.close()
    err = process.stderr.read()
    process.wait(timeout=60)
    assert err == ""
    assert process.returncode == 141


def test_a_broken_pipe_that_is_not_stdout_stays_visible(monkeypatch):
    """A BrokenPipeError of anything but a closed stdout or stderr (a worker's socket, a subprocess) is a bug:
    it is raised, not turned into a quiet exit."""
    import stimsim.cli as cli

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_cmd_data_list", broken)
    with pytest.raises(BrokenPipeError):
        main(["data", "list"])


def test_threads_sets_torch_and_blas_threads(capsys):
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    from stimsim.cli import main

    torch_threads = torch.get_num_threads()
    with threadpool_limits(limits=2, user_api="blas"):  # two to start with; restored afterwards
        try:
            assert main(["models", "check", "no-such-model", "--threads", "1", "--no-progress"]) == 2
            assert torch.get_num_threads() == 1
            blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
            assert blas and set(blas) == {1}
        finally:
            torch.set_num_threads(torch_threads)
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def _lock(directory: Path, pid: int, host: str | None = None) -> Path:
    import json
    import socket

    from stimsim.utilities.locking import LOCK_FILE

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    path.write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(), "command": "plan",
                                "started_utc": "2026-01-01T00:00:00+00:00"}))
    return path


def test_a_second_run_into_a_held_output_directory_is_refused_naming_the_holder(tmp_path, capsys):
    """plan, analyze, power, subject make and run each refuse an --out that a live run holds, naming it, and leave
    it as it was; a lock whose holder is gone (a dead pid on this host) is taken over; an unreadable one refused."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_plan_job import _write_plan

    from stimsim.analysis.synthetic import planted_session

    plan = _write_plan(tmp_path / "config")
    sessions = tmp_path / "s.csv"
    planted_session([0.5, 0.5], trials_per_site=20).to_csv(sessions, index=False)
    commands = {"plan": ["plan", str(plan)], "analyze": ["analyze", str(sessions)],
                "power": ["power", str(tmp_path / "config")],
                "subject": ["subject", "make", str(tmp_path / "config" / "subject.toml")],
                "run": ["run", str(REPO / "experiments" / "afraz2006.toml")]}
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        for name, argv in commands.items():
            lock = _lock(tmp_path / name, holder.pid)
            held = lock.read_bytes()
            assert main([*argv, "--out", str(tmp_path / name)]) == 2, name
            error = capsys.readouterr().err
            assert error.startswith(f"stimsim: error: output directory {tmp_path / name} is in use by another run: "
                                    f"stimsim plan (pid {holder.pid} on host "), (name, error)
            assert [p.name for p in (tmp_path / name).iterdir()] == [lock.name] and lock.read_bytes() == held
        other_host = _lock(tmp_path / "remote", os.getpid(), host="another-host")
        assert main([*commands["analyze"], "--out", str(tmp_path / "remote")]) == 2
        assert "on host another-host" in capsys.readouterr().err and other_host.is_file()
    finally:
        holder.kill()
        holder.wait()
    lock = _lock(tmp_path / "analyze", holder.pid)  # its holder is gone now
    assert main([*commands["analyze"], "--out", str(tmp_path / "analyze"), "--boot", "10", "--perm", "10",
                 "--splits", "2", "--no-progress"]) == 0
    assert (tmp_path / "analyze" / "summary.json").is_file() and not lock.exists()
    lock.write_bytes(b"\xff\x00garbage")
    assert main([*commands["analyze"], "--out", str(tmp_path / "analyze"), "--boot", "10"]) == 2
    assert f"locked by {lock}, which cannot be read" in capsys.readouterr().err


def test_a_model_name_is_the_shipped_model_even_beside_a_folder_of_that_name(tmp_path, monkeypatch, capsys):
    """A folder ./stimsim-topo-s0 holding another model does not replace the shipped model of that name; a model
    directory is read only when given as a path (./NAME, /path, DIR/NAME), and a bare folder name says so."""
    import shutil

    from stimsim.models.registry import SHIPPED_DIR, model_path
    from stimsim.paradigms import load_experiment
    from stimsim.utilities.errors import DataError

    monkeypatch.chdir(tmp_path)
    shutil.copytree(SHIPPED_DIR / "stimsim-topo-s2", tmp_path / "stimsim-topo-s0")
    shutil.copytree(SHIPPED_DIR / "stimsim-topo-s2", tmp_path / "mine")
    assert model_path("stimsim-topo-s0") == SHIPPED_DIR / "stimsim-topo-s0"
    assert model_path("./stimsim-topo-s0") == tmp_path / "stimsim-topo-s0"
    assert model_path(str(tmp_path / "mine")) == model_path(tmp_path / "mine") == tmp_path / "mine"
    with pytest.raises(DataError, match=r"unknown model 'mine': not one of the shipped models .*the folder ./mine "
                                        r"is a model directory: give it as a path"):
        model_path("mine")
    with pytest.raises(DataError, match=r"^model directory ./absent: not found$"):
        model_path("./absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"model directory ./empty: no model.json there \(not a model directory\)$"):
        model_path("./empty")
    (tmp_path / "empty" / "training_config.json").write_text("{}")
    with pytest.raises(DataError, match=r"no model.json there \(not a model directory\); it is the folder of a "
                                        r"training run that has not finished"):
        model_path("./empty")
    monkeypatch.chdir(tmp_path / "empty")
    with pytest.raises(DataError, match=r"^model directory stimsim-topo-s1/: not found; stimsim-topo-s1 "
                                        r"\(without '/'\) is a shipped model$"):
        model_path("stimsim-topo-s1/")
    monkeypatch.chdir(tmp_path)
    experiment = tmp_path / "afraz.toml"
    text = (REPO / "experiments" / "afraz2006.toml").read_text()
    experiment.write_text(text)
    experiment.write_text(text.replace('model = "stimsim-mnv2-s0"', 'model = "stimsim-topo-s0"'))
    assert load_experiment(experiment).model == "stimsim-topo-s0"  # the file's model, beside the folder
    experiment.write_text(text.replace('model = "stimsim-mnv2-s0"', 'model = "mine"'))
    assert load_experiment(experiment).model == str(tmp_path / "mine")  # a folder beside the file


def test_a_diverged_training_names_its_file_and_leaves_no_run_directory_without_a_checkpoint(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_training import small_config

    from stimsim.subject.virtual import to_toml

    config = tmp_path / "diverging.toml"
    raw = small_config(steps=4, learning_rate=1e8, warmup_steps=0, checkpoint_every_steps=100)
    config.write_text(f'name = "{raw.pop("name")}"\n' + to_toml(raw))
    out = tmp_path / "run"
    assert main(["train", str(config), "--out", str(out), "--no-progress", "--threads", "1"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"stimsim: error: {config}: training 'tiny' diverged at step ") and "Traceback" not in error
    assert not out.exists()


def test_models_check_writes_its_figure_only_over_a_png(tmp_path, capsys):
    """--figure names a PNG: a file of another kind (a mistyped path onto a lab's config) is never overwritten."""
    from stimsim.cli import main

    config = tmp_path / "subject.toml"
    config.write_text("[subject]\n")
    disguised = tmp_path / "old.png"
    disguised.write_text("not an image")
    for figure, message in ((config, "--figure writes a PNG image; give a file name ending in .png"),
                            (disguised, "that file exists and is not a PNG image; give another file name")):
        assert main(["models", "check", "stimsim-topo-s0", "--figure", str(figure), "--no-progress"]) == 2
        assert f"--figure {figure}: {message}" in capsys.readouterr().err
    assert config.read_text() == "[subject]\n" and disguised.read_text() == "not an image"


def test_models_check_leaves_a_figure_of_another_commands_output_alone(tmp_path, capsys):
    """--figure onto the percepts.png of a `stimsim visualize` result set is refused: its result set would no longer
    read back."""
    from stimsim.cli import main
    from stimsim.utilities.io import ResultSet

    results = ResultSet(tmp_path / "percepts", "percepts")
    results.write_json("summary.json", {})
    results.finish()
    figure = tmp_path / "percepts" / "percepts.png"
    figure.write_bytes(b"\x89PNG\r\n\x1a\n the percepts")
    assert main(["models", "check", "stimsim-topo-s0", "--figure", str(figure), "--no-progress"]) == 2
    assert f"--figure {figure}: the file belongs to predicted percepts (`stimsim visualize`)" in capsys.readouterr().err
    assert figure.read_bytes() == b"\x89PNG\r\n\x1a\n the percepts"


def test_models_check_notes_images_the_model_sees_only_in_part(tmp_path, capsys, monkeypatch):
    """--stimuli of 60 × 10 px images: over twice as long as wide, so the model sees only their centre square."""
    from PIL import Image

    from stimsim.cli import main

    for category in ("face", "car"):
        (tmp_path / "images" / category).mkdir(parents=True)
        Image.new("L", (60, 10)).save(tmp_path / "images" / category / "wide.png")
    monkeypatch.setattr("stimsim.training.evaluation.check_model", lambda *args, **kwargs: {"model": "checked"})
    assert main(["models", "check", "stimsim-topo-s0", "--stimuli", str(tmp_path / "images"), "--json",
                 "--no-progress"]) == 0
    images = tmp_path / "images"
    assert f"stimsim: warning: --stimuli {images}: 2 of 2 images are over twice as long as wide, and the model sees " \
           "only their centre square (e.g. car/wide.png, 60 × 10 px)" in capsys.readouterr().err


def test_models_check_refusing_its_images_leaves_no_figure_folder(tmp_path, capsys):
    """Two classes of 3 images each, fewer than the 5 its cross-validation needs: an error, and neither --out nor
    --figure's folder is made."""
    from PIL import Image

    from stimsim.cli import main

    for category in ("face", "car"):
        (tmp_path / "images" / category).mkdir(parents=True)
        for index in range(3):
            Image.new("L", (32, 32), color=40 * index).save(tmp_path / "images" / category / f"{index}.png")
    assert main(["models", "check", "stimsim-topo-s0", "--stimuli", str(tmp_path / "images"), "--no-imagenet",
                 "--out", str(tmp_path / "maps"), "--figure", str(tmp_path / "figures" / "face.png"),
                 "--no-progress"]) == 2
    assert "needs >= 5 images" in capsys.readouterr().err
    assert not (tmp_path / "maps").exists() and not (tmp_path / "figures").exists()


def test_a_training_runs_folder_given_as_a_model_points_to_its_model(tmp_path, capsys):
    from stimsim.cli import main

    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "model.json").write_text("{}")
    assert main(["models", "check", str(tmp_path / "run"), "--no-progress"]) == 2
    assert f"no model.json there (not a model directory); {tmp_path / 'run' / 'model'} is one" in capsys.readouterr().err
