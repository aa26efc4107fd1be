"""Wall time, CPU time and peak memory of stimsim's jobs as a user runs them (the benchmark's ``jobs`` section).

Each job is a command line of the README or the documentation (``stimsim run experiments/afraz2006.toml``,
``stimsim plan experiments/plan_default.toml``, ...), run in a child process exactly as typed, on the
experiment files of the checkout. Every job gets an activation cache of its own, empty at its start, beside the
data and weight files the manifests list (fetched once, before any job, into the user's cache, and shared), so
that a figure is what a lab's first run of that job costs once its data are on disk. Jobs that need the files
of an earlier job (the plan run again, the session, analysis and power of a plan) run after it, in the same
output folder.

Per job: ``wall_s``, ``cpu_s`` (user + system of the child and everything it started), ``peak_rss_MB`` (the
largest resident memory of the child or of any process it waited for, from ``wait4``), the machine's
1-minute load average before and after, and the targets that apply (an experiment within ``TARGET_PEAK_GB``,
Afraz 2006 within ``TARGET_AFRAZ_WALL_S`` on 2 cores, the default plan run again within
``TARGET_PLAN_RERUN_WALL_S``). A job that fails is recorded with its exit status and the end of its error output,
and the others still run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from stimsim.data.manifest import CACHE_DIR_ENV, cache_dir, fetch, load_manifests
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.io import checkout_commit
from stimsim.utilities.progress import report_phase

#: Peak resident memory every experiment and plan must stay within on the ImageNet-based models, GB (10⁹ bytes).
TARGET_PEAK_GB = 8.0
#: Wall time of ``stimsim run experiments/afraz2006.toml`` on 2 CPU cores, s.
TARGET_AFRAZ_WALL_S = 300.0
#: Wall time of the default plan run again into its own folder, every phase read from its cache, on 2 CPU cores, s.
TARGET_PLAN_RERUN_WALL_S = 60.0
#: Characters of a failed job's error output kept in the report.
ERROR_TAIL_CHARS = 2000


@dataclass(frozen=True)
class Job:
    """One command line, ``stimsim`` left out; ``{out}`` stands for the run's output folder."""

    name: str
    arguments: tuple[str, ...]
    what: str
    targets: dict = field(default_factory=dict)
    #: Manifest entries the job reads (fetched before any job runs, not timed).
    data: tuple[str, ...] = ()

    def command(self, out: Path) -> list[str]:
        return [argument.replace("{out}", str(out)) for argument in self.arguments]


_EXPERIMENT = {"peak_GB": TARGET_PEAK_GB}
_IMAGENET_WEIGHTS = ("mobilenet_v2_imagenet", "efficientnet_lite0_imagenet")

#: The jobs of the full run, in order.
JOBS: tuple[Job, ...] = (
    Job("afraz2006", ("run", "experiments/afraz2006.toml", "--out", "{out}/afraz2006"),
        "Afraz et al. 2006 on the default model (fLoc images)",
        {"peak_GB": TARGET_PEAK_GB, "wall_s_on_2_cores": TARGET_AFRAZ_WALL_S}, ("floc",) + _IMAGENET_WEIGHTS),
    Job("moeller2017", ("run", "experiments/moeller2017.toml", "--out", "{out}/moeller2017"),
        "Moeller et al. 2017 on the default model (its own images)", _EXPERIMENT,
        ("moeller2017",) + _IMAGENET_WEIGHTS),
    Job("muscimol", ("run", "experiments/muscimol_categorization.toml", "--out", "{out}/muscimol"),
        "muscimol inactivation during categorisation on the default model", _EXPERIMENT, ("floc",) + _IMAGENET_WEIGHTS),
    Job("sequence2afc", ("run", "experiments/sequence2afc.toml", "--out", "{out}/sequence2afc"),
        "the 2AFC sequence task on the default model", _EXPERIMENT, _IMAGENET_WEIGHTS),
    Job("models_check", ("models", "check", "stimsim-mnv2-s0", "--json"),
        "models check of the default model on fLoc, with its ImageNet top-1", {},
        ("floc", "imagenet_samples") + _IMAGENET_WEIGHTS),
    Job("plan_default", ("plan", "experiments/plan_default.toml", "--out", "{out}/plan"),
        "the README's main job: the default plan (32-px models)", _EXPERIMENT),
    Job("plan_default_again", ("plan", "experiments/plan_default.toml", "--out", "{out}/plan"),
        "the default plan run again into its folder: every phase read from the plan's cache",
        {"wall_s_on_2_cores": TARGET_PLAN_RERUN_WALL_S}),
    Job("subject_session", ("subject", "session", "{out}/plan", "--trials-per-site", "400",
                            "--out", "{out}/session.nwb"),
        "400 trials per site of the default plan on its virtual subject"),
    Job("analyze", ("analyze", "{out}/session.nwb", "--plan", "{out}/plan", "--out", "{out}/analysis"),
        "that session analysed against the plan"),
    Job("power", ("power", "{out}/plan"), "trials per site the default plan's effects need"),
    Job("plan_face_imagenet_additive", ("plan", "experiments/plan_face_imagenet_additive.toml",
                                        "--out", "{out}/face_plan"),
        "the face plan on the ImageNet-based models", _EXPERIMENT, ("floc",) + _IMAGENET_WEIGHTS),
    Job("visualize", ("visualize", "experiments/visualize_default.toml", "--out", "{out}/visualize"),
        "predicted percepts on the default model, judged by EfficientNet-Lite0", {},
        ("floc", "moeller2017") + _IMAGENET_WEIGHTS),
    Job("train_small", ("train", "experiments/train_stimsim_topo_seed0.toml", "--out", "{out}/train_small"),
        "stimsim-topo-s0 (the small 32-px model) trained again from its file"),
)

#: The quick run's one job (a smoke test of the section, not a reported figure).
QUICK_JOBS: tuple[Job, ...] = (Job("models_list", ("models", "list", "--json"), "the shipped models listed"),)


def job_names(quick: bool = False) -> list[str]:
    return [job.name for job in (QUICK_JOBS if quick else JOBS)]


def time_jobs(names=None, quick: bool = False, repository=None, work_dir=None, progress: bool = True,
              on_result=None) -> dict:
    """Run the jobs (all, or those in ``names``, in their order) and return ``{"jobs": {name: figures}}``.

    ``repository`` is the folder the commands run in, a checkout of stimsim with its ``experiments/`` (default: the
    working directory if it has one, else the checkout this package is in); ``work_dir`` keeps the jobs' outputs
    (new or empty, so that no job resumes an earlier run; default: a temporary folder, removed at the end);
    ``on_result(report)`` is called after every job, so a long run can save what it has measured so far.
    """
    selected, repository = check_jobs(names, quick, repository, work_dir)
    for entry in sorted({name for job in selected for name in job.data}):
        report_phase(f"bench: fetching {entry} before the jobs (not timed)", progress)
        fetch(entry)
    report = {"jobs": {}, "jobs_repository": str(repository), "jobs_commit": checkout_commit(repository),
              "jobs_threads": os.environ.get("OMP_NUM_THREADS", "default")}
    fetched = [cache_dir() / name for name in load_manifests() if (cache_dir() / name).exists()]
    with tempfile.TemporaryDirectory(prefix="stimsim-jobs-") as scratch:
        out = Path(work_dir) if work_dir is not None else Path(scratch) / "out"
        out.mkdir(parents=True, exist_ok=True)
        for job in selected:
            report_phase(f"bench: job {job.name}: stimsim {' '.join(job.command(out))}", progress)
            cache = _fresh_cache(Path(scratch) / "cache" / job.name, fetched)
            report["jobs"][job.name] = time_job(job, out, repository, cache)
            if on_result is not None:
                on_result(report)
    return report


def check_jobs(names=None, quick: bool = False, repository=None, work_dir=None) -> tuple[list[Job], Path]:
    """The jobs :func:`time_jobs` would run and the checkout it would run them in; a ConfigError for an unknown
    job, a folder without ``experiments/`` or an output folder that is a file or not empty (checked before any
    section of the benchmark runs)."""
    jobs = QUICK_JOBS if quick else JOBS
    known = [job.name for job in jobs]
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        quick_note = " (--quick runs only its smoke-test job)" if quick else ""
        raise ConfigError(f"unknown job(s) {unknown}; jobs{quick_note}: {known}")
    if repository is None:
        checkouts = [Path.cwd(), Path(__file__).resolve().parents[2]]
        repository = next((folder for folder in checkouts if (folder / "experiments").is_dir()), checkouts[0])
    repository = Path(repository)
    if not (repository / "experiments").is_dir():
        raise ConfigError(f"{repository} has no experiments/ folder: the jobs run the experiment files of a checkout "
                          "of stimsim; run the benchmark from the checkout's top folder")
    if work_dir is not None and Path(work_dir).exists():
        if not Path(work_dir).is_dir():
            raise ConfigError(f"the jobs' output folder {work_dir} is a file; give a new or empty folder")
        if any(Path(work_dir).iterdir()):
            raise ConfigError(f"the jobs' output folder {work_dir} is not empty: a job would resume the run it holds "
                              "instead of being timed; give a new or empty folder")
    return [job for job in jobs if names is None or job.name in names], repository


#: Started by the benchmark, this small process starts the job and writes the job's resource use (from
#: ``wait4``) as JSON to the file named first. A process started straight from the benchmark would count the
#: benchmark's own resident memory in its peak (a forked child's high-water mark starts at its parent's).
_LAUNCHER = """import json, os, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as file:
    json.dump({"wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime,
               "ru_maxrss": usage.ru_maxrss, "exit_status": os.waitstatus_to_exitcode(status)}, file)
"""


def time_job(job: Job, out: Path, repository: Path, cache: Path) -> dict:
    """Run one job in a child process with ``cache`` as its stimsim cache; its figures, or its error."""
    command = [sys.executable, "-m", "stimsim.cli", *job.command(out)]
    environment = dict(os.environ, **{CACHE_DIR_ENV: str(cache)})
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        usage_file = Path(scratch) / "usage.json"
        with open(Path(scratch) / "stderr", "w+b") as stderr:
            subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, str(usage_file), *command], cwd=repository,
                           env=environment, stdout=subprocess.DEVNULL, stderr=stderr, check=True)
            stderr.seek(0)
            error_output = stderr.read().decode("utf-8", "replace")
        usage = json.loads(usage_file.read_text())
    figures = {"command": "stimsim " + " ".join(job.command(Path("OUT"))), "what": job.what,
               "wall_s": round(usage["wall_s"], 2), "cpu_s": round(usage["cpu_s"], 2),
               "peak_rss_MB": round(max_rss_MB(usage["ru_maxrss"]), 1),
               "load_average_1min_before": round(load_before, 2),
               "load_average_1min_after": round(os.getloadavg()[0], 2), "exit_status": usage["exit_status"]}
    if usage["exit_status"] != 0:
        figures["error"] = error_output[-ERROR_TAIL_CHARS:]
    figures["targets"] = {name: {"limit": limit, "met": _met(name, limit, figures)}
                          for name, limit in job.targets.items()}
    return figures


def _met(target: str, limit: float, figures: dict) -> bool | None:
    """Whether a job's figures are within a target; None where the job failed or the machine is not the
    target's (a wall time on 2 cores measured on another count of cores)."""
    if figures["exit_status"] != 0:
        return None
    if target == "peak_GB":
        return figures["peak_rss_MB"] * 2**20 <= limit * 1e9
    if target == "wall_s_on_2_cores":
        return figures["wall_s"] <= limit if os.cpu_count() == 2 else None
    raise ValueError(f"unknown target {target!r}")


def _fresh_cache(path: Path, fetched: list[Path]) -> Path:
    """A new stimsim cache at ``path`` holding links to ``fetched`` (the user's cached data entries), nothing
    computed."""
    path.mkdir(parents=True)
    for entry in fetched:
        (path / entry.name).symlink_to(entry.resolve(), target_is_directory=True)
    return path


def max_rss_MB(ru_maxrss: int) -> float:
    """``ru_maxrss`` in MB (2²⁰ bytes): kB on Linux, bytes on macOS."""
    return ru_maxrss / 2**20 if sys.platform == "darwin" else ru_maxrss / 1024

