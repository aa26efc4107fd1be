"""Behavioural sessions of the virtual subject: the plan's sites and stimuli, trial by trial.

The stimuli are a site's sequences of steps: for the sequence task its image sequences (step 0 the "low" end);
for the face task one "sequence" per site, whose steps are the signed visual-signal levels of
:mod:`stimsim.planning.tasks.face_categorization` (step 0 the clearest non-face level, "high" the choice "face"),
a trial showing a test image of that level drawn at random — as a mixture, the subject's P(face) at a step is the
mean over its images, which is what the plan stores.

Every site gets ``trials_per_site`` trials (at least 2 × its steps): its sequences × steps, stimulated and sham interleaved 50/50
(balanced: the conditions are repeated to fill the trials and shuffled; with an odd count the last trial
is drawn at random). All sites' trials are interleaved in one shuffled session. On a trial the subject
chooses "high" with probability ``lapse_rate / 2 + (1 − lapse_rate) · P(high)``, where P(high) is its
own frozen decoder's output for that image, with stimulation at the electrode's true position on its
sheet (stimulated trials) or without (sham) — the subject's P(high) computed when the plan was made
(``truth/subject_p_high.nc``). Trials last 1 s and start every 1.5 s.

Columns (the contract shared with :mod:`stimsim.lab.sessions`): start_time, stop_time (s),
stimulus_id ("{electrode}_seq{j}_step{k}"), electrode, sequence, step, stimulated_electrode (id or
"sham"), current_uA (0 on sham), choice ("low"/"high"), correct (steps below the middle: low; above:
high; the middle step: false), and in tables subject_id, session_id.
"""
from __future__ import annotations

import math
import numbers
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from stimsim.planning.rig import (SESSION_COLUMNS, SHAM, TRIAL_DURATION_S, TRIAL_PERIOD_S,
                                  check_trial_images, check_trial_protocol, read_trial_list, stimulation_trials,
                                  write_trials_nwb)
from stimsim.subject.virtual import VIRTUAL_SPECIES
from stimsim.utilities.errors import ConfigError, FileFormatError
from stimsim.utilities.io import atomic_write_text
from stimsim.utilities.limits import check_memory, check_seed

#: Peak memory per trial, bytes: its row as simulated and as written into the NWB trials table (measured
#: about 850 + 1150 with tracemalloc).
SESSION_BYTES_PER_TRIAL = 2500


def simulate_trials(p_high: xr.DataArray, trials_per_site: int, lapse_rate: float, current_uA: float,
                    seed: int = 0, subject_id: str = "virtual", session_id: str = "session") -> pd.DataFrame:
    """Sample a session from P(high).

    p_high : DataArray (electrode, stimulated, sequence, step) with ``stimulated`` = [False, True].
    Returns one row per trial, sorted by start time.
    """
    if isinstance(trials_per_site, bool) or not isinstance(trials_per_site, (int, np.integer)):
        raise ConfigError(f"trials_per_site must be an integer, got {trials_per_site!r}")
    if isinstance(lapse_rate, bool) or not (isinstance(lapse_rate, numbers.Real) and 0.0 <= lapse_rate <= 1.0):
        raise ConfigError(f"lapse_rate must be a number in [0, 1], got {lapse_rate!r}")
    check_seed("seed", seed)
    if isinstance(current_uA, bool) or not (isinstance(current_uA, numbers.Real) and 0 < current_uA < math.inf):
        raise ConfigError(f"current_uA must be the stimulation's current, a finite number > 0 µA, got {current_uA!r}")
    dims = ("electrode", "stimulated", "sequence", "step")
    if not isinstance(p_high, xr.DataArray) or set(p_high.dims) != set(dims):
        raise ConfigError(f"p_high must be a DataArray with the dimensions {dims} (a plan's P(high)), got "
                          f"{tuple(p_high.dims) if isinstance(p_high, xr.DataArray) else type(p_high).__name__}")
    p = p_high.transpose(*dims)
    values = p.values
    if not np.all((values >= 0) & (values <= 1)):
        raise ConfigError("p_high must hold probabilities in [0, 1]")
    stimulated_flags = [bool(v) for v in p["stimulated"].values]
    if sorted(stimulated_flags) != [False, True]:
        raise ConfigError("p_high needs stimulated = [False, True]")
    electrodes = [str(e) for e in p["electrode"].values]
    n_seq, n_steps = p.sizes["sequence"], p.sizes["step"]
    if trials_per_site < 2 * n_steps:
        raise ConfigError(f"trials_per_site (--trials-per-site) must be >= {2 * n_steps} (a ΔAUC needs a trial at each "
                          f"of the {n_steps} steps in both conditions), got {trials_per_site}")
    check_memory(f"a session of {trials_per_site} trials per site × {len(electrodes)} sites",
                 SESSION_BYTES_PER_TRIAL * trials_per_site * len(electrodes), "--trials-per-site")
    middle = n_steps // 2
    rng = np.random.default_rng([seed, 0x5E55])
    conditions = np.array([(s, j, k) for s in (0, 1) for j in range(n_seq) for k in range(n_steps)])
    rows = []
    for site, electrode in enumerate(electrodes):
        repeats = -(-trials_per_site // len(conditions))
        pool = np.concatenate([rng.permutation(len(conditions)) for _ in range(repeats)])[:trials_per_site]
        # Exactly half stimulated: rebalance the stim flag over the drawn (sequence, step) pairs (an odd count:
        # half of all but the last trial, the last one at random).
        paired = trials_per_site - trials_per_site % 2
        flags = np.zeros(trials_per_site, dtype=bool)
        flags[rng.permutation(paired)[:paired // 2]] = True
        if trials_per_site % 2:
            flags[-1] = rng.random() < 0.5
        for condition, stim in zip(conditions[pool], flags):
            _, j, k = condition
            rows.append((site, electrode, int(j), int(k), bool(stim)))
    order = rng.permutation(len(rows))
    table = []
    index_of = {flag: i for i, flag in enumerate(stimulated_flags)}
    for trial, row_index in enumerate(order):
        site, electrode, j, k, stim = rows[row_index]
        probability = values[site, index_of[stim], j, k]
        p_choice_high = lapse_rate / 2 + (1 - lapse_rate) * probability
        choice = "high" if rng.random() < p_choice_high else "low"
        correct = (k < middle and choice == "low") or (k > middle and choice == "high")
        start = trial * TRIAL_PERIOD_S
        table.append({
            "start_time": start, "stop_time": start + TRIAL_DURATION_S,
            "stimulus_id": f"{electrode}_seq{j}_step{k}", "electrode": electrode, "sequence": j, "step": k,
            "stimulated_electrode": electrode if stim else SHAM, "current_uA": float(current_uA) if stim else 0.0,
            "choice": choice, "correct": bool(correct), "subject_id": subject_id, "session_id": session_id,
        })
    return pd.DataFrame(table)


#: How a session this module wrote describes itself in its NWB file (the start of its session description).
VIRTUAL_SESSION_DESCRIPTION = "virtual subject"


def write_session_nwb(trials: pd.DataFrame, path, subject_id: str, session_id: str, trial_list=None,
                      notes: str | None = None) -> Path:
    """Write ``trials`` as the NWB trials table (pynwb), atomically; subject and session ids at file level.

    ``trial_list``: the trial list the session ran (:func:`session_from_trial_list`), whose every column is kept;
    without it the session's own columns are written. ``notes``: how the session was made (:func:`session_notes`),
    the file's ``notes``."""
    if trial_list is None:
        trials = trials[["start_time", "stop_time", *SESSION_COLUMNS]]
        description = f"{VIRTUAL_SESSION_DESCRIPTION}: a plan's stimuli with interleaved microstimulation"
    else:
        description = f"{VIRTUAL_SESSION_DESCRIPTION} running the trial list {trial_list}"
    return write_trials_nwb(trials, path, subject_id, session_id, description, species=VIRTUAL_SPECIES,
                            subject_description="stimsim virtual subject", notes=notes)


def session_notes(plan_dir, seed: int, trials_per_site: int | None = None, sites: str | None = None,
                  trial_list=None) -> str:
    """How a virtual session was made, as one line for its NWB file: stimsim's version, the plan directory and the
    sha256 of its summary.json, the subject's lapse rate, the seed, and the trials per site and sites or the trial
    list (with its sha256)."""
    from stimsim import __version__
    from stimsim.analysis.plan_readback import read_summary, summary_lapse_rate
    from stimsim.utilities.hashing import sha256_of

    summary_path, summary = read_summary(plan_dir)
    ran = (f"trial list {trial_list} (sha256 {sha256_of(trial_list)})" if trial_list is not None
           else f"{trials_per_site} trials per site at the {sites} sites")
    return (f"simulated by stimsim {__version__} from the plan {Path(plan_dir).resolve()} (summary.json sha256 "
            f"{sha256_of(summary_path)}): lapse rate {summary_lapse_rate(summary_path, summary):g}, seed {seed}, {ran}")


def write_session_csv(trials: pd.DataFrame, path) -> Path:
    return atomic_write_text(path, trials.to_csv(index=False))


#: The columns by which a CSV file is recognised as a session this module wrote.
_SESSION_CSV_MARKERS = {"start_time", "stop_time", "electrode", "stimulated_electrode", "choice", "correct",
                        "subject_id", "session_id"}


def is_virtual_session_file(path) -> bool:
    """Whether the file ``path`` is a session that :func:`write_session_nwb` or :func:`write_session_csv` wrote
    (an NWB file whose session description names a virtual subject, a CSV table with the session's columns), so
    that a new session may replace it without ``--force``."""
    import h5py

    path = Path(path)
    try:
        if h5py.is_hdf5(path):
            with h5py.File(path, "r") as handle:
                description = handle["session_description"][()] if "session_description" in handle else b""
            return (description.decode() if isinstance(description, bytes) else str(description)).startswith(
                VIRTUAL_SESSION_DESCRIPTION)
        with path.open(encoding="utf-8") as handle:
            header = handle.readline().strip().split(",")
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return _SESSION_CSV_MARKERS <= set(header)


def session_from_trial_list(plan_dir, trial_list, seed: int = 0, session_id: str | None = None) -> pd.DataFrame:
    """The virtual subject of a plan directory running the plan's own trial list (``rig/trials.csv``, or another
    list with its columns), in its order: every column of the list kept, with start_time, stop_time, choice
    (as in :func:`simulate_trials`), correct, subject_id and session_id added."""
    from stimsim.analysis.plan_readback import read_plan_protocol, summary_lapse_rate
    from stimsim.lab.sessions import check_trial_list

    check_seed("seed", seed)
    summary_path, summary, p_high = _plan_truth(plan_dir, chosen_only=False)
    trials = read_trial_list(trial_list)
    check_trial_list(trials, trial_list)
    check_trial_protocol(trials, trial_list, read_plan_protocol(plan_dir))
    planned_path = Path(plan_dir) / "rig" / "trials.csv"
    if planned_path.is_file():
        check_trial_images(trials, trial_list, read_trial_list(planned_path), planned_path)
    p = p_high.transpose("electrode", "stimulated", "sequence", "step")
    unknown = sorted(set(trials["electrode"]) - {str(e) for e in p["electrode"].values})
    if unknown:
        raise FileFormatError(trial_list, f"electrode(s) {unknown[:5]} are not sites of the plan {plan_dir}")
    for column in ("sequence", "step"):
        beyond = np.flatnonzero(trials[column].to_numpy() >= p.sizes[column])
        if beyond.size:
            raise FileFormatError(trial_list, f"column {column!r}, data row(s) {', '.join(map(str, beyond[:5] + 1))}"
                                              f"{' …' if beyond.size > 5 else ''}: {column} "
                                              f"{trials[column].iloc[beyond[0]]} is beyond the plan's (allowed "
                                              f"{column}s 0..{p.sizes[column] - 1})")
    stimulated = stimulation_trials(trials)
    probability = np.array([float(p.sel(electrode=e, stimulated=bool(s), sequence=j, step=k))
                            for e, s, j, k in zip(trials["electrode"], stimulated, trials["sequence"],
                                                  trials["step"])])
    lapse = summary_lapse_rate(summary_path, summary)
    rng = np.random.default_rng([seed, 0x5E55])
    choice = np.where(rng.random(len(trials)) < lapse / 2 + (1 - lapse) * probability, "high", "low")
    middle = p.sizes["step"] // 2
    step = trials["step"].to_numpy()
    start = np.arange(len(trials)) * TRIAL_PERIOD_S
    return trials.assign(start_time=start, stop_time=start + TRIAL_DURATION_S, choice=choice,
                         correct=((step < middle) & (choice == "low")) | ((step > middle) & (choice == "high")),
                         subject_id=str(summary.get("subject_id", "virtual")),
                         session_id=session_id or f"session-seed{seed}")


def _plan_truth(plan_dir, chosen_only: bool) -> tuple[Path, dict, xr.DataArray]:
    """summary.json of a plan directory made on a virtual subject (its path and content), and the subject's
    P(high) of the stimuli of the chosen sites (or of every rehearsed site), every file checked."""
    from stimsim.analysis.plan_readback import read_subject_p_high, read_summary, summary_electrodes, truth_path

    summary_path, summary = read_summary(plan_dir)
    path = truth_path(plan_dir, summary_path, summary)
    if path is None:
        raise FileFormatError(Path(plan_dir) / "truth", "not found: sessions need a plan made on a virtual subject")
    electrodes = summary_electrodes(summary_path, summary) if chosen_only else None
    return summary_path, summary, read_subject_p_high(path, electrodes, summary_path)


def session_from_plan(plan_dir, trials_per_site: int, seed: int = 0, session_id: str | None = None,
                      sites: str = "chosen") -> pd.DataFrame:
    """Simulate a session of the virtual subject of a plan directory (see :func:`simulate_trials`).

    ``sites``: "chosen" (the plan's chosen sites, default) or "all" (every rehearsed working electrode).
    """
    from stimsim.analysis.plan_readback import summary_lapse_rate, summary_number

    if sites not in ("chosen", "all"):
        raise ConfigError(f"sites must be 'chosen' or 'all', got {sites!r}")
    summary_path, summary, p_high = _plan_truth(plan_dir, chosen_only=sites == "chosen")
    lapse_rate = summary_lapse_rate(summary_path, summary)
    return simulate_trials(p_high, trials_per_site, lapse_rate,
                           summary_number(summary_path, summary, "current_uA"), seed=seed,
                           subject_id=str(summary.get("subject_id", "virtual")),
                           session_id=session_id or f"session-seed{seed}")
