"""The benchmark's ``jobs`` section: the README's jobs timed and measured as a user runs them."""
import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from stimsim.cli import main
from stimsim.engine.bench import run_benchmark
from stimsim.engine.jobs_bench import _LAUNCHER, JOBS, Job, job_names, time_job, time_jobs
from stimsim.utilities.errors import ConfigError

REPOSITORY = Path(__file__).resolve().parents[1]


def test_quick_jobs_section_measures_a_real_command_and_saves_as_it_goes():
    saved = []
    report = run_benchmark(quick=True, sections=["jobs"], on_partial=lambda partial: saved.append(partial))
    figures = report["jobs"]["models_list"]
    assert figures["exit_status"] == 0 and "error" not in figures
    assert figures["command"] == "stimsim models list --json"
    assert figures["wall_s"] > 0 and figures["cpu_s"] > 0
    assert figures["peak_rss_MB"] > 50  # a Python process that imported torch
    assert set(report) >= {"software", "cpu_count", "load_average_1min_at_start", "jobs_commit", "jobs_threads"}
    assert saved and "models_list" in saved[-1]["jobs"]  # the callback saw the job before the run ended
    assert "jobs" not in run_benchmark(quick=True, sections=["analysis"])  # only run when named


def test_a_failing_job_is_recorded_with_its_error_and_no_verdict(tmp_path):
    job = Job("missing", ("run", "experiments/no_such_file.toml", "--out", "{out}/x"), "a file that is not there",
              {"peak_GB": 8.0})
    cache = tmp_path / "cache"
    cache.mkdir()
    figures = time_job(job, tmp_path / "out", REPOSITORY, cache)
    assert figures["exit_status"] == 2
    assert "no_such_file.toml" in figures["error"]
    assert figures["targets"] == {"peak_GB": {"limit": 8.0, "met": None}}


def test_peak_memory_is_the_jobs_own_not_the_benchmarks(tmp_path):
    """A child that touches 300 MiB is measured at 300 MiB plus an interpreter, though this process is larger."""
    held = bytearray(400 * 2**20)
    held[::4096] = b"x" * len(held[::4096])  # make this process's resident memory exceed the child's
    parent_MB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"
    usage_file = tmp_path / "usage.json"
    subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, str(usage_file), sys.executable, "-S", "-c", child],
                   check=True)
    usage = json.loads(usage_file.read_text())
    child_MB = usage["ru_maxrss"] / 1024
    assert usage["exit_status"] == 0
    assert 300 <= child_MB < 340 < parent_MB


def test_jobs_are_the_readme_commands_and_their_experiment_files_exist():
    readme = (REPOSITORY / "README.md").read_text()
    for job in JOBS:
        for argument in job.arguments:
            if argument.startswith("experiments/"):
                assert (REPOSITORY / argument).is_file(), argument
    for command in ("stimsim run experiments/afraz2006.toml", "stimsim plan experiments/plan_default.toml",
                    "stimsim visualize experiments/visualize_default.toml"):
        assert command in readme
        assert any(("stimsim " + " ".join(job.arguments)).startswith(command) for job in JOBS), command


def test_job_options_are_checked(capsys):
    with pytest.raises(ConfigError, match="unknown job"):
        run_benchmark(quick=True, sections=["jobs"], job_names=["afraz2006"])  # not a quick job
    assert main(["bench", "--quick", "--jobs", "models_list"]) == 2
    assert "add --sections jobs" in capsys.readouterr().err
    assert job_names(quick=True) == ["models_list"]


def _bench_tables():
    sys.path.insert(0, str(REPOSITORY / "docs"))
    try:
        import bench_tables
    finally:
        sys.path.pop(0)
    return bench_tables


def test_the_documented_reports_cover_every_job_and_render_every_figure():
    """docs/bench/*.json are the reports the documentation's tables are read from: a whole run of committed code."""
    bench_tables = _bench_tables()
    jobs = json.loads((REPOSITORY / "docs" / "bench" / "jobs.json").read_text())
    assert list(jobs["jobs"]) == job_names()
    assert all(job["exit_status"] == 0 for job in jobs["jobs"].values())
    assert not jobs["quick"] and "+modified" not in jobs["jobs_commit"]
    table = bench_tables.jobs_table_lines(jobs)
    assert len([line for line in table if line.startswith("| ")]) == 1 + len(JOBS)
    page = (REPOSITORY / "docs" / "engine.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```\{bench-values\} bench/(.*?)\n:header: (.*?)\n(.*?)```", page, re.S)
    assert [name for name, _, _ in blocks] == ["engine.json", "maps_cache.json"]
    for name, header, body in blocks:
        report = json.loads((REPOSITORY / "docs" / "bench" / name).read_text())
        assert not report["quick"] and "+modified" not in report["commit"]
        rows = [row for row in body.splitlines() if row.strip()]
        lines = bench_tables.values_table_lines(report, header, rows)  # every entry the page names exists
        assert len([line for line in lines if line.startswith("| ")]) == 1 + len(rows)


def test_no_page_types_in_a_duration():
    """Times are the benchmark's: a duration typed into a page (outside code) would not follow the code. Targets
    ("under 30 s", "within 5 minutes") are allowed; the development record keeps its one-off measurements."""
    duration = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:s|min|minutes|hours?|h)\b")
    for page in [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]:
        if page.name == "record.md":
            continue
        text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S))
        typed = [match.group() for match in duration.finditer(text)
                 if not re.search(r"(≤|<|under|within)\s*$", text[max(0, match.start() - 12):match.start()])]
        assert not typed, f"{page.name}: {typed}"


def test_jobs_refuse_a_used_output_folder_and_a_folder_without_experiments(tmp_path):
    used = tmp_path / "used"
    (used / "afraz2006").mkdir(parents=True)
    with pytest.raises(ConfigError, match="not empty"):
        time_jobs(quick=True, work_dir=used, progress=False)
    with pytest.raises(ConfigError, match="no experiments/ folder"):
        time_jobs(quick=True, repository=tmp_path, progress=False)


def test_job_options_are_checked_before_any_section_runs(tmp_path, capsys):
    ran = []
    with pytest.raises(ConfigError, match="smoke-test job"):
        run_benchmark(quick=True, sections=["analysis", "jobs"], job_names=["nosuch"],
                      on_partial=lambda partial: ran.append(partial))
    assert not ran  # the analysis section did not run first
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        run_benchmark(quick=True, sections=["jobs"], jobs_out=a_file)
    assert main(["bench", "--quick", "--sections", "jobs", "--jobs", "models_list,"]) == 2
    assert "has an empty name" in capsys.readouterr().err
    assert main(["bench", "--quick", "--sections", " "]) == 2  # not "every section", which takes hours
    assert "--sections is empty" in capsys.readouterr().err
    notes, other_json = tmp_path / "notes.txt", tmp_path / "mine.json"  # never overwritten by a report
    notes.write_text("hello")
    other_json.write_text('{"mine": 1}')
    for path, message in ((notes, "--out writes a benchmark report (JSON); give a file name ending in .json"),
                          (other_json, "that file exists and is not a benchmark report")):
        assert main(["bench", "--quick", "--sections", "load", "--out", str(path)]) == 2
        assert f"--out {path}: {message}" in capsys.readouterr().err
    assert notes.read_text() == "hello" and other_json.read_text() == '{"mine": 1}'


def test_a_quick_bench_judges_no_target_and_names_a_section_it_did_not_measure(capsys):
    """``--quick`` sizes have no targets: no warning of a missed one and ``targets_missed`` null, however slow the
    run; a named section the quick sizes leave out (the Dask sweep) is named in a warning."""
    assert main(["bench", "--quick", "--json", "--no-progress", "--sections", "dask,analysis"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["analysis"]["total_s"] > 0
    assert report["targets_missed"] is None and report["meets_targets"] is None
    assert report["commit"] == report["software"]["commit"]
    assert captured.err.splitlines() == ["stimsim: warning: bench: section 'dask' was not measured: the quick sizes "
                                         "have no Dask sweep (run without --quick)"]


def test_a_failed_job_renders_without_figures_and_a_quick_report_says_so():
    bench_tables = _bench_tables()
    report = json.loads((REPOSITORY / "docs" / "bench" / "jobs.json").read_text())
    report["quick"], report["jobs_commit"] = True, None
    report["jobs"]["afraz2006"].update(exit_status=-9, error="Killed")
    report["jobs"]["power"]["command"] = "stimsim power OUT/plan | head"
    lines = bench_tables.jobs_table_lines(report)
    assert lines[0].startswith("**A quick run") and "outside a git checkout" in lines[0]
    killed = next(line for line in lines if "**afraz2006**" in line)
    assert "killed by signal 9" in killed and killed.count("| — ") == 3 and "not judged" in killed
    assert "OUT/plan \\| head" in next(line for line in lines if "**power**" in line)
