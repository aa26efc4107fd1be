"""One model on the published benchmarks: ``stimsim models score NAME [EXPERIMENT.toml ...] --out DIR``.

Every experiment file whose ``[comparison]`` names a registered published dataset (:mod:`stimsim.datasets`) runs
on the model (:func:`stimsim.paradigms.runner.run_experiment`, the model overriding the file's) into
``DIR/<file stem>/``, and its score on the dataset's benchmark (its ``summary.json`` ``score``: metric, score,
ceiling, chance, normalized) is tabulated. ``DIR`` then holds one result set (:class:`stimsim.utilities.io.ResultSet`):

``scores.json``
    ``model`` (its name), ``model_source`` (the name or directory given) and ``experiments``: per experiment
    file its ``experiment`` name, ``experiment_file``, ``dataset``, ``citation``, the ``score`` object, the
    ``run_dir`` (relative to ``DIR``) and ``effects``, the dataset's headline raw effect sizes of the model and
    of the animals (:attr:`~stimsim.datasets.base.PublishedDataset.headline_keys`).
``scores.csv``
    one row per experiment: experiment, dataset, metric, score, ceiling, chance, normalized, the score's and the
    ceiling's intervals (``score_ci``, ``ceiling_ci``; the metrics have no unit), why a value is undefined, the run
    directory.
``config.json``
    the model record (name, directory, checksums), each experiment file with its sha256, time and software
    versions (:func:`stimsim.utilities.io.provenance`).

A run into the same ``DIR`` again goes through each experiment's run again, which resumes from its simulation
store (``DIR/<stem>/simulation_store``): the finished simulations are reused, not recomputed.
"""
from __future__ import annotations

import json
from pathlib import Path

from stimsim.datasets import DATASETS
from stimsim.models.registry import model_path
from stimsim.paradigms.experiment_file import load_experiment
from stimsim.paradigms.runner import CONFIG_FILE, run_experiment
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.io import (RESULT_SET_FILE, ResultSet, atomic_write_json, atomic_write_text, csv_text,
                                  provenance, read_result_set)
from stimsim.utilities.jsonable import json_ready
from stimsim.utilities.locking import DirectoryLock
from stimsim.utilities.progress import report_phase

SCORES_JSON, SCORES_CSV = "scores.json", "scores.csv"
#: Columns of the table printed and written as ``scores.csv`` (the first seven are printed).
TABLE_COLUMNS = ("experiment", "dataset", "metric", "score", "ceiling", "chance", "normalized", "score_ci_low",
                 "score_ci_high", "ceiling_ci_low", "ceiling_ci_high", "undefined_reason", "run_dir")
PRINTED_COLUMNS = TABLE_COLUMNS[:7]


def benchmark_experiments(directory=".") -> list[Path]:
    """The experiment files ``experiments/*.toml`` under ``directory`` whose ``[comparison] dataset`` names a
    registered published dataset, sorted by name (other files there, e.g. plan or training files, are left out)."""
    found = []
    for path in sorted(Path(directory, "experiments").glob("*.toml")):
        comparison = load_toml(path).get("comparison")
        if isinstance(comparison, dict) and comparison.get("dataset") in DATASETS.names():
            found.append(path)
    return found


def check_benchmarks(experiments) -> list:
    """The experiment files read and checked, as (path, spec); an empty list, a file without a ``[comparison]``
    or two files with the same stem (their run directory) are refused with ConfigError."""
    if not experiments:
        raise ConfigError(f"no experiment to score: give EXPERIMENT.toml files, or run in a folder whose "
                          f"experiments/*.toml compare with a registered dataset ({', '.join(DATASETS.names())})")
    specs, stems = [], {}
    for path in map(Path, experiments):
        spec = load_experiment(path)
        if spec.comparison is None:
            raise ConfigError(f"{path}: no [comparison] dataset, so there is no score to compute; a scored "
                              f"experiment names one of {DATASETS.names()}")
        if path.stem in stems:
            raise ConfigError(f"{stems[path.stem]} and {path} would both run into {path.stem}/; give files with "
                              "different names")
        stems[path.stem] = path
        specs.append((path, spec))
    return specs


def score_model(model, experiments, out_dir, progress: bool = True, force: bool = False, device="cpu",
                scheduler=None) -> dict:
    """Run every experiment file of ``experiments`` on ``model`` (a shipped name or a model directory) into
    ``out_dir/<file stem>/`` and write the table of their scores into ``out_dir`` (see the module docstring);
    returns what ``scores.json`` holds. Inputs are checked before anything is written; a run that fails leaves
    the runs finished before it (a run into the same ``out_dir`` again resumes them)."""
    model_path(model)  # an unknown model is refused first, before any directory is made
    specs = check_benchmarks(experiments)
    stems = [path.stem for path, _ in specs]
    with DirectoryLock(out_dir, "models score"), \
            ResultSet(out_dir, "model scores", keep=tuple(_kept_runs(Path(out_dir), stems)), force=force) as results:
        entries, records = [], []
        for number, (path, spec) in enumerate(specs, start=1):
            report_phase(f"models score: {path.name} ({number} of {len(specs)}) on {model}", progress)
            run_dir = results.directory / path.stem
            summary = run_experiment(spec, run_dir, model=str(model), progress=progress, force=force, device=device,
                                     scheduler=scheduler)
            config = json.loads(read_result_set(run_dir, required=(CONFIG_FILE,))[CONFIG_FILE].read_text())
            records.append({"experiment_file": str(path), "experiment_sha256": config["experiment_sha256"],
                            "run_dir": path.stem, "model": config["model"]})
            dataset = DATASETS.get(spec.comparison)
            entries.append({"experiment": spec.name, "experiment_file": str(path), "dataset": spec.comparison,
                            "citation": dataset.citation, "score": summary["score"], "run_dir": path.stem,
                            "effects": {key: summary.get(key) for key in dataset.headline_keys}})
        scores = json_ready({"model": summary["model"], "model_source": str(model), "experiments": entries})
        created = provenance()
        config = json_ready({"model": records[0]["model"], "model_source": str(model), "experiments": records,
                             "created_utc": created["created_utc"], "software": created["software"]})
        results.write_together({  # an earlier table of scores stays whole and readable until every new file is made
            SCORES_JSON: lambda tmp: atomic_write_json(tmp, scores, sort_keys=False),
            SCORES_CSV: lambda tmp: atomic_write_text(tmp, csv_text(score_table(scores))),
            CONFIG_FILE: lambda tmp: atomic_write_json(tmp, config)})
        results.finish()
    return scores


def score_table(scores: dict):
    """``scores.json``'s content as a pandas DataFrame, one row per experiment, :data:`TABLE_COLUMNS` (an undefined
    number, or an interval a score has none of, is NaN)."""
    import pandas as pd

    rows = []
    for entry in scores["experiments"]:
        score = entry["score"]
        intervals = {f"{key}_{end}": value for key in ("score_ci", "ceiling_ci")
                     for end, value in zip(("low", "high"), score[key] or [None, None])}
        rows.append({"experiment": entry["experiment"], "dataset": entry["dataset"], "metric": score["metric"],
                     **{key: score[key] for key in ("score", "ceiling", "chance", "normalized")}, **intervals,
                     "undefined_reason": score["undefined_reason"], "run_dir": entry["run_dir"]})
    numbers = ("score", "ceiling", "chance", "normalized", "score_ci_low", "score_ci_high", "ceiling_ci_low",
               "ceiling_ci_high")
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS)).astype({column: float for column in numbers})


def _kept_runs(directory: Path, stems) -> list[str]:
    """The entries of ``directory`` the scores' result set keeps: this call's run directories and the directories
    of earlier experiment runs (a result set stimsim wrote), e.g. those of a call with more experiments."""
    kept = list(stems)
    if directory.is_dir():
        kept += [entry.name for entry in sorted(directory.iterdir())
                 if entry.is_dir() and (entry / RESULT_SET_FILE).is_file() and entry.name not in kept]
    return kept
