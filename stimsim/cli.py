"""The ``stimsim`` command line: train models, manage data, check models, run experiments, plan stimulation
sessions, make virtual subjects and their sessions, analyse recorded sessions and their power, benchmark.

Over 500 lines: the parser of every command is built here, one place for the words of the command line (the
commands' work is in the packages)."""
from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import sys
import threading
import warnings
from pathlib import Path

import stimsim
from stimsim.data.manifest import MIRROR_DIR_ENV, env_mirror_dir
from stimsim.engine.devices import add_device_argument, resolve_device
from stimsim.engine.distributed import MAX_PER_CPU, add_compute_arguments
from stimsim.engine.jobs_bench import job_names
from stimsim.utilities.errors import ConfigError, DataError, StimsimError, TrainingDiverged
from stimsim.utilities.io import (RESULT_SET_FILE, atomic_write_json, check_not_another_commands, check_output_dir,
                                  check_output_file, enclosing_output_owner, holds_unfinished_result_set,
                                  output_owner)
from stimsim.utilities.jsonable import json_ready
from stimsim.utilities.limits import check_seed
from stimsim.utilities.locking import LOCK_FILE, DirectoryLock, missing_directories
from stimsim.utilities.ordering import repeated
from stimsim.utilities.progress import report_phase, write_line


def _cmd_train(args) -> int:
    from stimsim.training.head_config import is_head_config, load_head_config
    from stimsim.training.head_training import build_topo_head_model
    from stimsim.training.loop import load_training_config, train
    from stimsim.training.run_directory import (CONFIG_RECORD, check_run_configuration, check_run_directory,
                                                has_checkpoint)
    from stimsim.utilities.config import load_toml

    head = is_head_config(load_toml(args.config))
    if head:
        config, raw, _ = load_head_config(args.config)
        if resolve_device(args.device).type != "cpu":
            raise ConfigError(f"{args.config}: a topo_head build runs on the CPU; --device {args.device} is for "
                              "networks trained from scratch (leave --device out)")
    else:
        config = load_training_config(args.config)
        raw = config.raw
    out = check_run_directory(Path(args.out) if args.out is not None else Path("runs") / config.name, args.force)
    created = missing_directories(out)
    try:
        with DirectoryLock(out, "train"):
            check_run_configuration(out, raw, args.force)
            if (out / "model" / "model.json").is_file() and not args.force:
                _check_finished_model(out / "model")
                print(f"{out} holds the finished run of this configuration; its model {out / 'model'} is kept as it "
                      "is (--force trains it again)")
                return 0
            try:
                if head:
                    model_dir = build_topo_head_model(args.config, out, progress=not args.no_progress)
                else:
                    model_dir = train(config, out, progress=not args.no_progress, device=args.device)
            except BaseException:  # stopped before a checkpoint: the configuration may change before the next try
                if not has_checkpoint(out) and not (out / "training_run.json").exists():
                    (out / CONFIG_RECORD).unlink(missing_ok=True)
                raise
    except BaseException as exc:  # a run stopped before its first checkpoint leaves no directory it made behind
        if created and not has_checkpoint(out):
            shutil.rmtree(created[-1], ignore_errors=True)
        if isinstance(exc, TrainingDiverged):
            raise TrainingDiverged(f"{args.config}: {exc}") from None
        raise
    shown = "losses per step in " + str(out / "loss_history.csv") if head else f"loss curves in {out / 'loss_curves.png'}"
    print(f"model saved to {model_dir}; {shown}")
    return 0


def _check_finished_model(model_dir: Path) -> None:
    """A finished training run's model, checked before it is said to be kept: a damaged one is an error that says
    how to export it again from the run's checkpoint."""
    from stimsim.models.topographic import verified_model_files
    from stimsim.training.run_directory import has_checkpoint

    try:
        verified_model_files(model_dir)
    except StimsimError as exc:
        again = ("delete it and run the same command again to export it again from the run's checkpoint"
                 if has_checkpoint(model_dir.parent) else "--force trains it again")
        raise DataError(f"the finished run's model is damaged ({exc}); {again}") from None


def _cmd_data_list(args) -> int:
    from stimsim.data.manifest import load_manifests

    entries = sorted(load_manifests().items())
    width = max((len(name) for name, _ in entries), default=0)  # columns line up whatever the longest name
    for name, entry in entries:
        size_mb = sum(f.size_bytes or 0 for f in entry.files) / 1e6
        print(f"{name:<{width}}  {entry.kind:<10} {len(entry.files):>4} file(s) {size_mb:9.2f} MB  "
              f"{entry.describe_sources()}")
    return 0


def _cmd_data_fetch(args) -> int:
    from stimsim.data.manifest import fetch

    paths = fetch(args.name, mirror=args.mirror)
    where = Path(os.path.commonpath(paths)) if len(paths) > 1 else (paths[0].parent if paths else "-")
    print(f"{args.name}: {len(paths)} file(s) verified in {where}")
    return 0


def _cmd_data_verify(args) -> int:
    from stimsim.data.manifest import verification_passed, verify_all

    results = verify_all()
    width = max((len(name) for name in results), default=0)  # the counts line up whatever the longest name
    for name, statuses in sorted(results.items()):
        counts = {}
        for _, status in statuses:
            counts[status] = counts.get(status, 0) + 1
        shown = ", ".join(f"{n} {'not fetched' if s == 'missing' else s}" for s, n in sorted(counts.items()))
        print(f"{name:<{width}}  {shown}")
        for rel, status in statuses:
            if status == "mismatch":
                print(f"    checksum mismatch: {rel}")
    return 0 if verification_passed(results) else 1


def _cmd_models_list(args) -> int:
    from stimsim.models.registry import SHIPPED_DIR, describe_model, shipped_folders

    models, damaged = [], []
    for name in args.models or shipped_folders():
        try:
            models.append(describe_model(name))
        except StimsimError as exc:  # a damaged folder is named after the others are listed
            damaged.append(exc)
    if args.json:
        print(json.dumps(json_ready({"models": models}), indent=2))
    else:
        for model in models:
            layers = ", ".join(f"{layer} ({area or '-'})" for layer, area in model["layers"].items())
            own = Path(model["path"]).resolve().parent != SHIPPED_DIR.resolve()  # named as it names itself
            where = f"  in {model['path']}" if own else ""
            print(f"{model['name']:<20} {model['family']:<14} layers: {layers}{where}")
    for exc in damaged:
        print(f"stimsim: error: {exc}", file=sys.stderr)
    return 2 if damaged else 0


def _cmd_models_check(args) -> int:
    from stimsim.models.preprocessing import input_geometry_notes
    from stimsim.models.registry import load_model
    from stimsim.training.evaluation import check_model, check_shuffles, report_lines

    progress = not args.no_progress
    check_shuffles(args.shuffles, "--shuffles")
    if args.stimuli is not None and not Path(args.stimuli).exists():
        raise ConfigError(f"--stimuli {args.stimuli}: no such folder or table file")
    if args.stimuli is not None and args.heldout:
        raise ConfigError("--stimuli and --heldout choose the images both; give one of them")
    if args.stimuli is None and (args.label is not None or args.positive is not None):
        raise ConfigError("--label and --positive apply to --stimuli; the default images (fLoc by domain, positive "
                          "'face') and --heldout (LFW + Fashion-MNIST by category, positive 'face') set their own")
    if args.figure is not None:
        _check_output_path("--figure", args.figure, "png")
        owner = enclosing_output_owner(args.figure) if Path(args.figure).is_file() else None
        if owner is not None:
            raise ConfigError(f"--figure {args.figure}: the file belongs to {owner}; give another file name")
    owner = None if args.out is None or not Path(args.out).is_dir() else output_owner(args.out)
    if owner is not None:
        raise ConfigError(f"--out {args.out} holds {owner}; give the figures a folder of their own")
    report_phase(f"models check: loading {args.name}", progress)
    model = load_model(args.name, device=args.device)
    stimuli = None
    if args.stimuli is not None:
        from stimsim.data.stimuli import from_folder, from_table

        stimuli = from_folder(args.stimuli) if Path(args.stimuli).is_dir() else from_table(args.stimuli)
        for message in input_geometry_notes(stimuli, model.preprocessing.size_px, f"--stimuli {args.stimuli}"):
            warnings.warn(message)
    report = check_model(model, n_shuffles=args.shuffles, figure_path=args.figure, progress=progress, stimuli=stimuli,
                         label=args.label, positive=args.positive, figure_dir=args.out, heldout=args.heldout,
                         imagenet=not args.no_imagenet)
    if "images_note" in report:
        warnings.warn(report["images_note"])
    print(json.dumps(json_ready(report), indent=2) if args.json else "\n".join(report_lines(report, width=26)))
    return 0


def _is_png(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(8) == b"\x89PNG\r\n\x1a\n"


def _is_benchmark_report(path: Path) -> bool:
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(earlier, dict) and {"started_utc", "quick", "torch_threads"} <= set(earlier)


#: Files a command writes at a path the user names: kind → (suffix, what the file is, test that a file there is one
#: of that kind). Such a file is written only new or over one of its kind, never over another file.
OUTPUT_FILES = {"png": (".png", "a PNG image", _is_png),
                "benchmark_report": (".json", "a benchmark report (JSON)", _is_benchmark_report)}


def _check_output_path(option: str, path, kind: str) -> None:
    """Refuse ``path`` (given with ``option``) unless it has the suffix of files of ``kind`` (a key of
    :data:`OUTPUT_FILES`) and is new or such a file already."""
    suffix, description, is_kind = OUTPUT_FILES[kind]
    path = check_output_file(path)
    if path.suffix.lower() != suffix:
        raise ConfigError(f"{option} {path}: {option} writes {description}; give a file name ending in {suffix}")
    if path.exists() and not is_kind(path):
        raise ConfigError(f"{option} {path}: that file exists and is not {description}; give another file name")


def _cmd_models_resting(args) -> int:
    from stimsim.models.registry import SHIPPED_DIR, available_models
    from stimsim.models.resting import write_resting_activity

    directory = Path(args.directory)
    if not directory.exists() and args.directory in available_models():
        directory = SHIPPED_DIR / args.directory  # refused below as a shipped model, not as a missing folder
    if not (directory / "model.json").is_file():
        why = "no model.json" if directory.is_dir() else "no such folder"
        raise ConfigError(f"{directory} is not a model directory ({why}); give the folder of a model")
    if directory.resolve().is_relative_to(SHIPPED_DIR.resolve()):
        raise ConfigError(f"{directory} is a shipped model, whose files the package's manifest verifies; copy its "
                          "folder and give the copy")
    path = write_resting_activity(directory, args.layer, device=args.device, progress=not args.no_progress)
    print(f"wrote {path} and listed it in {directory / 'model.json'}")
    return 0


def _cmd_models_score(args) -> int:
    from stimsim.paradigms.scoring import PRINTED_COLUMNS, benchmark_experiments, score_model, score_table

    experiments = args.experiments or benchmark_experiments()
    scores = score_model(args.name, experiments, args.out, progress=not args.no_progress, force=args.force,
                         device=args.device, scheduler=args.scheduler)
    if args.json:
        print(json.dumps(json_ready(scores), indent=2))
        return 0
    print(score_table(scores).loc[:, list(PRINTED_COLUMNS)].to_string(index=False, na_rep="-",
                                                                      float_format=lambda value: f"{value:.3f}"))
    report_phase(f"scores of {scores['model']} in {args.out}: scores.json, scores.csv, one run per experiment")
    return 0


def _print_report(report: dict, as_json: bool, width: int) -> None:
    """A report as JSON, or one ``key value`` line per entry with keys padded to ``width``."""
    if as_json:
        print(json.dumps(json_ready(report), indent=2))
        return
    for key, value in report.items():
        print(f"{key:<{width}} {value}")


def _cmd_run(args) -> int:
    from stimsim.paradigms.runner import run_experiment

    summary = run_experiment(args.experiment, args.out, model=args.model, progress=not args.no_progress,
                             force=args.force, device=args.device, scheduler=args.scheduler)
    print(json.dumps(summary, indent=2))
    report_phase(f"results written to {args.out}: results.nc, summary.json, config.json and the figures")
    return 0


def _cmd_visualize(args) -> int:
    from stimsim.percepts.visualize import run_visualize

    summary = run_visualize(args.config, args.out, model=args.model, judge=args.judge, progress=not args.no_progress,
                            force=args.force, device=args.device)
    print(json.dumps({key: summary[key] for key in ("model", "judge_model", "currents_uA", "sites", "judges",
                                                    "seconds_per_image")}, indent=2))
    report_phase(f"percepts written to {args.out}: percepts.png, percepts.nc, summary.json, config.json")
    return 0


def _cmd_plan(args) -> int:
    from stimsim.planning.job import run_plan

    if args.validate is not None and args.validate < 1:
        raise ConfigError(f"--validate needs a number of hidden poses >= 1, got {args.validate}")
    _refuse_foreign_directory(args.out, ("cache/config_digest.txt",), "a plan", args.force)
    summary = run_plan(args.config, args.out, progress=not args.no_progress, validate=args.validate or 0,
                       device=args.device, scheduler=args.scheduler)
    shown = {key: summary[key] for key in ("task", "n_sites", "chosen_electrodes", "chosen_model", "current_uA",
                                           "predicted_vs_true_r") if key in summary}
    if "validation" in summary:
        shown["validation"] = {key: summary["validation"][key] for key in
                               ("predicted_vs_true_r", "predicted_vs_true_r_per_pose", "random_pose_r_p95")}
    print(json.dumps(shown, indent=2))
    report_phase(f"plan written to {args.out}: report.html, report.pdf, sites.csv, plan.nc, summary.json, "
                 "config.json")
    return 0


def _cmd_subject_session(args) -> int:
    from stimsim.planning.session import (session_from_plan, session_from_trial_list, session_notes,
                                          write_session_csv, write_session_nwb)

    if args.trials is not None and (args.trials_per_site is not None or args.sites is not None):
        raise ConfigError("--trials runs that trial list as it is; --trials-per-site and --sites apply without it")
    check_seed("--seed", args.seed)
    if args.session_id is not None and not args.session_id.strip():
        raise ConfigError("--session-id is empty; give an id, or leave the option out for session-seedN")
    if args.session_id is not None and not args.session_id.isprintable():
        raise ConfigError(f"--session-id {args.session_id!r} holds a control character (a newline, a tab, ...); give "
                          "an id of printable text")
    trials_per_site = 400 if args.trials_per_site is None else args.trials_per_site
    if args.trials is not None:
        trials = session_from_trial_list(args.plan_dir, args.trials, seed=args.seed, session_id=args.session_id)
    else:
        trials = session_from_plan(args.plan_dir, trials_per_site, seed=args.seed,
                                   session_id=args.session_id, sites=args.sites or "chosen")
    subject_id, session_id = trials["subject_id"].iloc[0], trials["session_id"].iloc[0]
    for option, path in (("--out", args.out), ("--csv", args.csv)):
        if path and Path(path).is_file():  # checked before the session was made; named now that it is written
            warnings.warn(f"{option} {path}: replacing the session written there before", stacklevel=2)
    if args.out:
        notes = session_notes(args.plan_dir, args.seed, trials_per_site, args.sites or "chosen", args.trials)
        write_session_nwb(trials, args.out, subject_id=subject_id, session_id=session_id, trial_list=args.trials,
                          notes=notes)
    if args.csv:
        write_session_csv(trials, args.csv)
    files = [str(p) for p in (args.out, args.csv) if p]
    print(json.dumps({"subject_id": str(subject_id), "session_id": str(session_id), "n_trials": int(len(trials)),
                      "n_sites": int(trials["electrode"].nunique()), "files": files}, indent=2))
    report_phase(f"{len(trials)} trials written to " + " and ".join(files))
    return 0


def _cmd_bench(args) -> int:
    from stimsim.engine.bench import run_benchmark
    from stimsim.models.registry import SMALL_MODEL, available_models, load_model

    name = args.model or (SMALL_MODEL if SMALL_MODEL in available_models() else None)
    if args.sections is not None and not args.sections.strip():
        raise ConfigError("--sections is empty; name the sections to run (e.g. --sections bound,plain) or leave the "
                          "option out for all but jobs")
    sections = args.sections.split(",") if args.sections else None
    jobs = None if args.jobs is None else [job.strip() for job in args.jobs.split(",")]
    if jobs is not None and not all(jobs):
        raise ConfigError(f"--jobs {args.jobs!r} has an empty name; give comma-separated job names: "
                          + ", ".join(job_names()))
    if (jobs is not None or args.jobs_out) and "jobs" not in (sections or ()):
        raise ConfigError("--jobs and --jobs-out are options of the jobs section; add --sections jobs")
    if args.out:
        _check_output_path("--out", args.out, "benchmark_report")
    save = (lambda report: atomic_write_json(args.out, report, sort_keys=False)) if args.out else None
    report = run_benchmark(quick=args.quick, default_model=load_model(name, device=args.device) if name else None,
                           progress=not args.no_progress, device=args.device, sections=sections,
                           default_model_source=name, job_names=jobs, jobs_out=args.jobs_out, on_partial=save)
    if save is not None:
        save(report)
    _print_report(report, args.json, width=28)
    for entry, missed in (report["targets_missed"] or {}).items():
        warnings.warn(f"{entry} = {missed['value']:.3g} misses its target ({missed['target']})")
    failed = sorted(job for job, figures in report.get("jobs", {}).items() if figures["exit_status"] != 0)
    if failed:
        print(f"stimsim: error: job(s) {failed} failed; their exit status and error output are in the report",
              file=sys.stderr)
        return 1
    return 0


def _cmd_subject_make(args) -> int:
    from stimsim.subject import VirtualSubject
    from stimsim.subject.virtual import check_same_subject

    device = resolve_device(args.device)  # a missing accelerator stops the command before anything is written
    _refuse_foreign_directory(args.out, ("truth.json",), "a virtual subject", args.force)
    with DirectoryLock(args.out, "subject make"):
        subject = VirtualSubject.from_file(args.config)
        if not args.force:
            check_same_subject(args.out, subject)
        subject.model.to(device)
        out = subject.save(args.out)
    print(json.dumps({"subject_model": subject.config["subject"]["model"], "n_electrodes": len(subject.layout),
                      "n_dead_electrodes": len(subject.dead_electrodes), "out": str(out),
                      "files": sorted(path.name for path in Path(out).iterdir() if path.is_file())},
                     indent=2))
    report_phase(f"virtual subject written to {out}; truth.json holds the hidden pose (for validation only)",
                 not args.no_progress)
    return 0


def _cmd_analyze(args) -> int:
    from stimsim.analysis.analyze import run_analysis
    from stimsim.lab.sessions import column_mapping, value_mapping

    _check_at_least("--boot", args.boot, 2)
    _check_at_least("--perm", args.perm, 1)
    _check_at_least("--splits", args.splits, 1)
    check_seed("--seed", args.seed)
    analysis = run_analysis(args.sessions, args.out, plan_dir=args.plan, columns=column_mapping(args.columns),
                            values=value_mapping(args.values, args.columns), layout=args.layout, layout_ids=args.layout_ids,
                            n_boot=args.boot,
                            n_perm=args.perm, n_splits=args.splits, seed=args.seed, force=args.force,
                            progress=not args.no_progress, same_subject=args.same_subject)
    keys = ("n_sites_recorded", "n_sites", "n_trials", "mean_shift", "mean_shift_chance", "wilcoxon_p",
            "wilcoxon_p_undefined_reason", "cohens_d", "cohens_d_chance", "n_sites_significant",
            "n_sites_significant_chance", "n_sites_significant_fdr", "n_sites_significant_fdr_chance",
            "split_half_r", "split_half_r_chance",
            "noise_ceiling", "noise_ceiling_undefined_reason", "predicted_vs_observed_r",
            "predicted_vs_observed_r_chance", "predicted_vs_observed_r_null_95", "permutation_p", "slope",
            "slope_ideal")
    print(json.dumps(json_ready({key: analysis.summary[key] for key in keys if key in analysis.summary}), indent=2))
    report_phase(f"report, results.nc, sites.csv and summary.json in {args.out}")
    return 0


def _cmd_power(args) -> int:
    from stimsim.analysis.power import run_power

    for option, value in (("--power", args.power), ("--alpha", args.alpha)):
        if not 0 < value < 1:
            raise ConfigError(f"{option} must lie strictly between 0 and 1, got {value:g}")
    _check_at_least("--sessions", args.sessions, 10)
    check_seed("--seed", args.seed)
    again = sorted(repeated(args.trials))
    if again:
        raise ConfigError(f"--trials-per-site lists {', '.join(map(str, again))} more than once; give each trial count "
                          "once")
    out = args.out or str(Path(args.plan) / "power")
    summary = run_power(args.plan, out, target_power=args.power, alpha=args.alpha, trial_counts=args.trials,
                        n_sessions=args.sessions, seed=args.seed, force=args.force, progress=not args.no_progress)
    shown = ("simulated_from", "target_power", "alpha", "n_sites", "wilcoxon_trials_needed",
             "wilcoxon_trials_needed_undefined_reason", "median_site_trials_needed", "n_sites_detectable",
             "site_power_chance", "true_delta_auc_sd", "observed_vs_true_r_target", "observed_vs_true_r_trials_needed",
             "observed_vs_true_r_trials_needed_undefined_reason", "trial_counts")
    print(json.dumps(json_ready({key: summary[key] for key in shown}), indent=2))
    most = f"more than {max(summary['trial_counts'])}"
    few = summary["wilcoxon_trials_needed_undefined_reason"]
    across = (f"no trial count reaches it ({few})" if few else
              f"{summary['wilcoxon_trials_needed'] or most} trials per site")
    report_phase(f"power {args.power:g} at alpha {args.alpha:g}, simulated from the {summary['simulated_from']}: "
                 f"across sites (Wilcoxon) {across}; per site "
                 f"(lower median) {summary['median_site_trials_needed'] or most} ({summary['n_sites_detectable']} of "
                 f"{summary['n_sites']} sites reach it); table, curve and report in {out}")
    return 0


def _refuse_foreign_directory(out: str, marks: tuple, what: str, force: bool) -> None:
    """An --out that holds files but none of ``marks`` (the files every directory of ``what`` has) is a
    folder of something else: refused unless ``force``, so that nothing there is overwritten by mistake; another
    command's output is refused even then (:func:`~stimsim.utilities.io.check_not_another_commands`)."""
    check_not_another_commands(out, marks)
    directory = Path(out)
    if force or not directory.is_dir() or any((directory / mark).is_file() for mark in marks):
        return
    held = sorted(entry.name for entry in directory.iterdir() if entry.name != LOCK_FILE)
    if held:
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise ConfigError(f"output directory {out} holds files that are not {what} ({shown}); give a new or empty "
                          "directory, or force writing into it (--force)")


def _check_at_least(option: str, value: int, minimum: int) -> None:
    """A numeric command-line option below its minimum is an error naming the option."""
    if value < minimum:
        raise ConfigError(f"{option} must be at least {minimum}, got {value}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stimsim", description=(
        "Model-guided cortical microstimulation: topographic vision models, perturbation modules, "
        "in-silico experiments."))
    parser.add_argument("--version", action="version", version=f"stimsim {stimsim.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    train = commands.add_parser("train", help="train a topographic model from a TOML configuration")
    train.add_argument("config", help="training configuration (TOML), e.g. experiments/train_stimsim_topo_seed0.toml")
    train.add_argument("--out", help="run directory (checkpoints, loss curves, model/; default runs/NAME); "
                                     "re-run the same command to resume")
    train.add_argument("--force", action="store_true",
                       help="write into --out even if it holds files no training run of stimsim wrote, a run "
                            "of another configuration, or a finished run, which is trained again from its first step "
                            "(the other run's checkpoints, model/ and records are removed)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_threads(train)
    add_device_argument(train)
    train.set_defaults(handler=_cmd_train, command_parser=train)

    data = commands.add_parser("data", help="datasets and checkpoints listed in data_manifests/")
    data_commands = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    listing = data_commands.add_parser("list", help="list every manifest entry")
    listing.set_defaults(handler=_cmd_data_list, command_parser=listing)
    fetch = data_commands.add_parser("fetch", help="fetch an entry into the cache and verify its checksums")
    fetch.add_argument("name", help="manifest entry, as `stimsim data list` names it")
    _add_mirror(fetch)
    fetch.set_defaults(handler=_cmd_data_fetch, command_parser=fetch)
    verify = data_commands.add_parser("verify", help="check the sha256 of every file present (cache or in place); "
                                                     "exit 0 only if all present files verify")
    verify.set_defaults(handler=_cmd_data_verify, command_parser=verify)

    models = commands.add_parser("models", help="shipped topographic models")
    model_commands = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    model_list = model_commands.add_parser("list", help="list available models")
    model_list.add_argument("models", nargs="*", metavar="MODEL",
                            help="shipped model names or model directories to describe (default: every shipped model)")
    model_list.add_argument("--json", action="store_true", help="print one JSON object: every model's family, base "
                                                                "network, scale, file size and IT density "
                                                                "(units_within_lambda50)")
    model_list.set_defaults(handler=_cmd_models_list, command_parser=model_list)
    check = model_commands.add_parser("check", help="evaluate a model: accuracy, face selectivity, clustering on IT")
    check.add_argument("name", help="shipped model name or model directory")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.add_argument("--out", help="directory for the IT d′ map of every class (NAME_CLASS_dprime.png); "
                                     "without --out or --figure no figure is written")
    check.add_argument("--figure", help="PNG path of the positive class's d′ map")
    check.add_argument("--shuffles", type=int, default=1000,
                       help="position shuffles for cluster_p (default 1000; 100 to 100,000: p resolves to "
                            "1 / (1 + shuffles), and maps count as clustered at p < 0.01)")
    check.add_argument("--stimuli", help="images to evaluate on instead of the fLoc localizer: a folder (class = "
                                         "subfolder, label 'category') or a CSV/HDF5 table")
    check.add_argument("--heldout", action="store_true", help="evaluate on the LFW + Fashion-MNIST images the "
                                                              "model's training held out instead of fLoc")
    check.add_argument("--label", help="label of --stimuli that holds the class (default category)")
    check.add_argument("--positive", help="class of --stimuli whose d′ map and balanced decoding are reported "
                                          "as face_* (default face)")
    check.add_argument("--no-imagenet", action="store_true", help="skip the ImageNet top-1 of the model and its "
                                                                   "base network")
    check.add_argument("--no-progress", action="store_true", help="hide the phase messages")
    _add_mirror(check)
    _add_threads(check)
    add_device_argument(check)
    check.set_defaults(handler=_cmd_models_check, command_parser=check)

    resting = model_commands.add_parser("resting", help="measure each unit's resting activity of a layer (its mean "
                                                        "response to the reference set of fLoc images) and add it to "
                                                        "a model directory, for resting_fraction")
    resting.add_argument("directory", help="model directory (holding model.json); not a shipped model")
    resting.add_argument("--layer", default="IT", help="topographic layer (default IT)")
    resting.add_argument("--no-progress", action="store_true", help="hide the phase messages")
    _add_mirror(resting)
    _add_threads(resting)
    add_device_argument(resting)
    resting.set_defaults(handler=_cmd_models_resting, command_parser=resting)

    score = model_commands.add_parser("score", help="score a model on the published experiments: each one's "
                                                    "metric beside its ceiling and chance (scores.json, scores.csv)")
    score.add_argument("name", help="shipped model name or model directory")
    score.add_argument("experiments", nargs="*", metavar="EXPERIMENT.toml",
                       help="experiment files with a [comparison] (default: the TOML files in ./experiments whose "
                            "[comparison] names a registered dataset)")
    score.add_argument("--out", required=True, help="output directory: scores.json, scores.csv and one run folder "
                                                    "per experiment (DIR/<file stem>/); re-run the same command to "
                                                    "resume")
    score.add_argument("--json", action="store_true", help="print scores.json instead of the table")
    score.add_argument("--force", action="store_true",
                       help="write into --out even if it holds files stimsim did not write (never into another "
                            "command's output)")
    score.add_argument("--no-progress", action="store_true", help="hide progress bars and phase messages")
    _add_mirror(score)
    _add_threads(score)
    add_compute_arguments(score)
    score.set_defaults(handler=_cmd_models_score, command_parser=score)

    run = commands.add_parser("run", help="run an experiment definition (TOML) and write results to --out")
    run.add_argument("experiment", help="experiment file, e.g. experiments/afraz2006.toml")
    run.add_argument("--out", required=True, help="output directory (results.nc, summary.json, figures)")
    run.add_argument("--model", help="model name or directory (overrides the experiment file)")
    run.add_argument("--force", action="store_true",
                     help="write into --out even if it holds files stimsim did not write (same names are overwritten; "
                          "never into another command's output), or an unfinished run's store for other inputs")
    run.add_argument("--no-progress", action="store_true", help="hide progress bars and phase messages")
    _add_mirror(run)
    _add_threads(run)
    add_compute_arguments(run)
    run.set_defaults(handler=_cmd_run, command_parser=run)

    visualize = commands.add_parser("visualize", help="predicted percepts of stimulation: images synthesised to "
                                                      "match the stimulated IT (percepts.png, percepts.nc, summary.json)")
    visualize.add_argument("config", help="visualisation file (TOML), e.g. experiments/visualize_default.toml")
    visualize.add_argument("--out", required=True, help="output directory")
    visualize.add_argument("--model", help="model name or directory (overrides the file)")
    visualize.add_argument("--judge", help="independent judge model, name or directory (overrides the file)")
    visualize.add_argument("--force", action="store_true",
                           help="write into --out even if it holds files stimsim did not write (never into another "
                                "command's output)")
    visualize.add_argument("--no-progress", action="store_true", help="hide the phase messages")
    _add_mirror(visualize)
    _add_threads(visualize)
    add_device_argument(visualize)
    visualize.set_defaults(handler=_cmd_visualize, command_parser=visualize)

    plan = commands.add_parser("plan", help="plan stimulation sites for a lab session (report.html/pdf, sites.csv, "
                                            "plan.nc, summary.json); re-run the same command to resume")
    plan.add_argument("config", help="plan file (TOML), e.g. experiments/plan_default.toml")
    plan.add_argument("--out", required=True, help="output directory")
    plan.add_argument("--validate", type=int, metavar="N", help="virtual subject only: repeat the closed loop on N "
                                                                "hidden poses and write validation.json")
    plan.add_argument("--force", action="store_true",
                      help="write into --out even if it holds files that are not a plan (same names are overwritten; "
                           "never into another command's output)")
    plan.add_argument("--no-progress", action="store_true", help="hide progress bars and phase messages")
    _add_mirror(plan)
    _add_threads(plan)
    add_compute_arguments(plan)
    plan.set_defaults(handler=_cmd_plan, command_parser=plan)

    bench = commands.add_parser("bench", help="benchmark the simulation engine: exact lower bound, cached baseline, "
                                              "plain approach, Dask workers")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--quick", action="store_true", help="small sizes (a smoke test, not the reported numbers); "
                                                          "the jobs section runs one short job instead of the README's")
    bench.add_argument("--model", help="small model measured besides the ResNet-18 (default: stimsim-topo-s0, the small shipped model)")
    bench.add_argument("--no-progress", action="store_true", help="hide progress bars and phase messages")
    bench.add_argument("--sections", help="comma-separated sections to run (default: all but jobs): bound, plain, "
                                          "dask, load, plan, maps, cache, analysis, jobs (the README's jobs as a user runs them: "
                                          "wall time, CPU time and peak memory of each; by far the longest section)")
    bench.add_argument("--jobs", help="comma-separated jobs of the jobs section (default: all): "
                                      + ", ".join(job_names()))
    bench.add_argument("--jobs-out", metavar="DIR", help="keep the jobs' outputs in DIR (default: a temporary "
                                                         "folder, removed at the end)")
    bench.add_argument("--out", metavar="FILE.json", help="also write the report to this JSON file (written again "
                                                          "after every section and job, so a stopped run keeps "
                                                          "what it measured)")
    _add_threads(bench)
    add_device_argument(bench)
    bench.set_defaults(handler=_cmd_bench, command_parser=bench)
    subject = commands.add_parser("subject", help="virtual subjects: a model with an implanted array")
    subject_commands = subject.add_subparsers(dest="subject_command", metavar="ACTION", required=True)
    subject_make = subject_commands.add_parser("make", help="implant an array at a hidden pose and record passive "
                                                            "viewing (recordings.nc, recordings.nwb, truth.json)")
    subject_make.add_argument("config", help="subject configuration (TOML), e.g. experiments/subject_default.toml")
    subject_make.add_argument("--out", required=True, help="subject directory")
    subject_make.add_argument("--no-progress", action="store_true", help="hide the phase messages")
    subject_make.add_argument("--force", action="store_true", help="write into --out even if it holds files that "
                                                                   "are not a subject, or a subject made from another "
                                                                   "configuration (same names are overwritten)")
    add_device_argument(subject_make)
    subject_make.set_defaults(handler=_cmd_subject_make, command_parser=subject_make)
    session = subject_commands.add_parser("session", help="run a plan's sites and sequences on its virtual subject "
                                                          "(stimulation and sham interleaved 50/50) → NWB trials")
    session.add_argument("plan_dir", help="directory written by `stimsim plan` on a virtual subject")
    session.add_argument("--trials-per-site", type=int, help="trials per site (default 400)")
    session.add_argument("--trials", help="a trial list to run in its order (the plan's rig/trials.csv): the session "
                                          "keeps its columns and adds the subject's choices")
    session.add_argument("--out", help="NWB session file to write")
    session.add_argument("--csv", help="also (or only) write the trials as a CSV table")
    session.add_argument("--seed", type=int, default=0, help="seed of the trial order and the sampled choices (default 0)")
    session.add_argument("--session-id", help="session id (default session-seedN)")
    session.add_argument("--force", action="store_true", help="replace --out or --csv even if the file there is not "
                                                              "a session stimsim wrote (never a file of another "
                                                              "command's output)")
    session.add_argument("--sites", choices=("chosen", "all"),
                         help="the plan's chosen sites (default) or every rehearsed working electrode")
    session.set_defaults(handler=_cmd_subject_session, command_parser=session)

    analyze = commands.add_parser("analyze", help="analyse recorded sessions: per-site effects, statistics, "
                                                  "comparison with a plan's predictions")
    analyze.add_argument("sessions", nargs="+", help="session files: NWB (trials table), CSV or HDF5 trial tables")
    analyze.add_argument("--plan", help="plan directory made by `stimsim plan` (predictions; electrodes checked)")
    analyze.add_argument("--columns", help="lab column names: lab_name=stimsim_name,... or a TOML file with [columns] "
                                           "(and [values.COLUMN] tables of lab codes)")
    analyze.add_argument("--values", action="append", metavar="COLUMN:CODE=VALUE,...",
                         help="lab value codes of one column (repeatable): choice:0=low,1=high; "
                              "stimulated_electrode:-1=sham; current_uA:-1=sham (current_uA:nan=sham: empty cells)")
    analyze.add_argument("--same-subject", action="store_true",
                         help="with --plan: the sessions are of the animal the plan was made for, whatever their "
                              "subject id")
    analyze.add_argument("--layout", help="array layout to check electrode ids against: 10x10, 8x8 or a .csv/.cmp file")
    analyze.add_argument("--layout-ids", choices=("channel", "label"), default="channel",
                         help="a .cmp layout's ids: its channel numbers (default) or its label column")
    analyze.add_argument("--out", required=True,
                         help="output directory (report.html/.pdf, results.nc, sites.csv, summary.json)")
    analyze.add_argument("--boot", type=int, default=1000, help="bootstrap resamples per site (default 1000)")
    analyze.add_argument("--perm", type=int, default=1000, help="label permutations per site (default 1000)")
    analyze.add_argument("--splits", type=int, default=100, help="random split halves for the noise ceiling (default 100)")
    analyze.add_argument("--seed", type=int, default=0, help="seed of every resampling (default 0)")
    analyze.add_argument("--no-progress", action="store_true", help="hide the phase messages")
    analyze.add_argument("--force", action="store_true",
                       help="write into the output directory even if it holds files stimsim did not write "
                            "(never into another command's output)")
    analyze.set_defaults(handler=_cmd_analyze, command_parser=analyze)

    power = commands.add_parser("power", help="trials per site needed to detect a plan's effects (simulated sessions)")
    power.add_argument("plan", help="plan directory made by `stimsim plan`")
    power.add_argument("--power", type=float, default=0.8, help="target power (default 0.8)")
    power.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    power.add_argument("--trials-per-site", dest="trials", type=int, nargs="+", metavar="N",
                       default=[50, 100, 200, 400, 800, 1600],
                       help="trials per site to simulate, one or more counts (default 50 100 200 400 800 1600)")
    power.add_argument("--trials", dest="trials", type=int, nargs="+", help=argparse.SUPPRESS)  # its former name
    power.add_argument("--sessions", type=int, default=200, help="simulated sessions per trial count (default 200)")
    power.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    power.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    power.add_argument("--out", help="output directory (default PLAN_DIR/power)")
    power.add_argument("--force", action="store_true",
                       help="write into the output directory even if it holds files stimsim did not write "
                            "(never into another command's output)")
    power.set_defaults(handler=_cmd_power, command_parser=power)
    return parser


def _add_mirror(command) -> None:
    command.add_argument("--mirror", metavar="DIR", help="local mirror of the published data and image sets "
                                                          "(default: $STIMSIM_MIRROR_DIR)")


#: The environment variables that set the CPU threads of a process's OpenMP and BLAS libraries.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _add_threads(command) -> None:
    command.add_argument("--threads", type=int, metavar="N",
                         help="CPU threads torch and the BLAS under numpy and scikit-learn use, in this process and "
                              "those it starts (default: their "
                              "choice, usually every core; on a shared or busy machine 1 is often faster)")


def _apply_common_options(args) -> None:
    """--out, --mirror and --threads: checked and put into effect before the command runs."""
    out = getattr(args, "out", None)
    if getattr(args, "handler", None) is _cmd_bench and out is not None:  # a file
        check_output_file(out)
    elif getattr(args, "handler", None) is _cmd_subject_session:  # its --out and --csv are files
        if not out and not args.csv:
            raise ConfigError("stimsim subject session: give --out FILE.nwb and/or --csv FILE.csv")
        if out and Path(out).suffix.lower() != ".nwb":
            raise ConfigError(f"--out {out}: the session is written as NWB; give a file name ending in .nwb "
                              "(--csv writes the CSV table)")
        if out and args.csv and Path(out).resolve() == Path(args.csv).resolve():
            raise ConfigError(f"--out and --csv name the same file ({out}); give two files")
        from stimsim.planning.session import is_virtual_session_file

        for option, path in (("--out", out), ("--csv", args.csv)):
            if path is not None:
                try:
                    check_output_file(path)
                except ConfigError as exc:
                    raise ConfigError(f"{option}: {exc}") from None
                if Path(path).is_file() and not is_virtual_session_file(path):
                    owner = enclosing_output_owner(path)
                    if owner is not None:
                        raise ConfigError(f"{option} {path}: the file belongs to {owner}, which --force does not "
                                          "replace; give another file name")
                    if not args.force:
                        raise ConfigError(f"{option} {path}: the file exists and is not a session stimsim wrote; "
                                          "give --force to replace it")
    elif out is not None:
        if not out.strip():
            raise ConfigError("--out is empty; give a directory path")
        check_output_dir(out)
    mirror = getattr(args, "mirror", None)
    if mirror is not None:
        if not Path(mirror).is_dir():
            raise ConfigError(f"--mirror {mirror}: not a directory")
        os.environ[MIRROR_DIR_ENV] = str(Path(mirror).absolute())
    elif hasattr(args, "mirror"):  # a command that reads data: $STIMSIM_MIRROR_DIR checked as --mirror is
        env_mirror_dir()
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {threads}")
        most = MAX_PER_CPU * (os.cpu_count() or 1)
        if threads > most:
            raise ConfigError(f"--threads must be at most {most} ({MAX_PER_CPU} per CPU of this machine), "
                              f"got {threads}")
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(threads)
        threadpool_limits(threads)  # the BLAS under numpy, scipy and scikit-learn's decoders too
        for variable in THREAD_VARIABLES:  # and the processes this one starts (the benchmark's jobs)
            os.environ[variable] = str(threads)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line: ``stimsim: warning: MESSAGE``."""
    text = " ".join(str(message).split())
    write_line(f"stimsim: warning: {text}", file)


#: Commands that resume where an interrupted run of the same command stopped (training checkpoints, the
#: simulation store, the plan's phase cache).
RESUMABLE = (_cmd_train, _cmd_run, _cmd_plan, _cmd_models_score)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (``kill``, a batch system's time limit, a closed terminal), raised like Ctrl-C so that
    the command stops the same way: temporary files removed, a directory it made and left unfinished deleted."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame) -> None:
    raise Terminated(signum)


def _handle_termination() -> dict:
    """Install the SIGTERM and SIGHUP handlers (main thread only); returns the previous ones."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, _raise_terminated) for signum in (signal.SIGTERM, signal.SIGHUP)}


def _reader_gone(stream) -> bool:
    """Whether ``stream`` is a pipe whose reading end was closed (``stimsim ... | head -1`` after ``head`` ended)."""
    try:
        poller = select.poll()
        poller.register(stream.fileno(), 0)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _end_on_closed_pipe() -> bool:
    """When the reader of stdout or stderr went away, point the closed stream(s) at /dev/null (so that Python's
    flush at exit does not fail again) and return True: the command ends quietly, as one that SIGPIPE ends."""
    closed = [stream for stream in (sys.stdout, sys.stderr) if _reader_gone(stream)]
    for stream in closed:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    return bool(closed)


def main(argv=None) -> int:
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # named by the command's own parser, with its usage, not the top level's
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    previous = warnings.showwarning
    warnings.showwarning = _show_warning
    handlers = _handle_termination()
    try:
        _apply_common_options(args)
        code = args.handler(args)
        sys.stdout.flush()
        return code
    except (StimsimError, FileNotFoundError) as exc:
        print(f"stimsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        stopped = "terminated" if isinstance(exc, Terminated) else "interrupted"
        kept = getattr(args, "out", None) is None or Path(args.out).exists()  # an --out removed holds nothing to resume
        advice = "; run the same command again to resume" if args.handler in RESUMABLE and kept else ""
        if not advice and getattr(args, "out", None) is not None and holds_unfinished_result_set(args.out):
            advice = (f"; {args.out} holds an unfinished result set (its {RESULT_SET_FILE} marks it incomplete): run "
                      "the same command again to write it")
        print(f"stimsim: {stopped}{advice}", file=sys.stderr)
        return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)
    except BrokenPipeError:
        if not _end_on_closed_pipe():
            raise
        return 128 + signal.SIGPIPE
    finally:
        warnings.showwarning = previous
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
