"""The command line: help everywhere, data and model listings, exit codes."""
from pathlib import Path

import pytest

from stimsim import __version__
from stimsim.cli import build_parser, main

SUBCOMMANDS = [["train"], ["data"], ["data", "list"], ["data", "fetch"], ["data", "verify"], ["models"],
               ["models", "list"], ["models", "check"], ["run"], ["bench"]]


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


def test_data_list_names_every_entry(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("afraz2006", "moeller2017", "lfw_subset", "fashion_mnist", "tdann", "stimsim_default_models"):
        assert name in out


@pytest.mark.skipif(not (Path(__file__).resolve().parents[2] / "shared" / "data").is_dir(),
                    reason="needs the published data mirror")
def test_data_fetch_and_verify(capsys):
    assert main(["data", "fetch", "afraz2006"]) == 0
    assert main(["data", "verify"]) == 0
    out = capsys.readouterr().out
    assert "afraz2006" in out and "mismatch" not in out


def test_data_fetch_of_unknown_entry_is_a_clear_error(capsys):
    assert main(["data", "fetch", "no_such_dataset"]) == 2
    assert "no_such_dataset" in capsys.readouterr().err


def test_models_list(capsys):
    assert main(["models", "list"]) == 0
    assert "stimsim-topo-s0" in capsys.readouterr().out


def test_run_reports_a_missing_experiment_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "out")]) == 2
    assert "missing.toml" in capsys.readouterr().err


@pytest.mark.parametrize("words", [["run"], ["plan"], ["train"], ["models", "check"], ["bench"]], ids=" ".join)
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
    (["plan", "plan.toml", "--out", "out"], "stimsim.planning.plan", "run_plan", True),
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
    from stimsim.progress import report_phase

    with tqdm(total=2, desc="poses", file=sys.stderr) as bar:
        bar.update(1)
        report_phase("plan: making the virtual subject")
        _show_warning(UserWarning("2 recorded electrode(s) left out"), UserWarning, "x.py", 1)
    pieces = capsys.readouterr().err.replace("\r", "\n").split("\n")
    assert "stimsim: plan: making the virtual subject" in pieces
    assert "stimsim: warning: 2 recorded electrode(s) left out" in pieces
    assert not any("poses" in piece and "stimsim:" in piece for piece in pieces)
