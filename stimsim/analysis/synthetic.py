"""Session tables with a planted truth: every site's P("high") curve with and without stimulation is
known, so an analysis can be checked against it (tests, benchmark, rehearsing the pipeline)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from stimsim.lab.sessions import SHAM


def planted_curves(stim_logodds, slope_logodds: float = 8.0, n_steps: int = 7, lapse_rate: float = 0.0):
    """True P(high) per (site, condition, step): logistic in the step position x in [0, 1] centred on
    the middle of the sequence, log-odds slope ``slope_logodds`` over the whole sequence, the
    stimulated curve shifted by ``stim_logodds`` (one value per site); lapses choose at random.
    Returns (n_sites, 2, n_steps), condition 0 = sham, 1 = stimulated."""
    shifts = np.asarray(stim_logodds, dtype=float)
    if shifts.ndim != 1 or not np.all(np.isfinite(shifts)):
        raise ValueError(f"stim_logodds must be finite numbers, one per site, got {stim_logodds!r}")
    if not (isinstance(n_steps, (int, np.integer)) and not isinstance(n_steps, bool) and n_steps >= 2):
        raise ValueError(f"n_steps must be an integer >= 2, got {n_steps!r}")
    if not np.isfinite(slope_logodds):
        raise ValueError(f"slope_logodds must be a finite number, got {slope_logodds!r}")
    if not 0.0 <= lapse_rate < 1.0:
        raise ValueError(f"lapse_rate must lie in [0, 1), the fraction of trials chosen at random, got {lapse_rate!r}")
    x = np.linspace(0.0, 1.0, n_steps)
    log_odds = slope_logodds * (x - 0.5)[None, None, :] + np.stack([np.zeros_like(shifts), shifts], 1)[..., None]
    return lapse_rate / 2 + (1 - lapse_rate) / (1 + np.exp(-log_odds))


def planted_session(stim_logodds, trials_per_site: int, slope_logodds: float = 8.0, n_steps: int = 7,
                    lapse_rate: float = 0.0, current_uA: float = 50.0, subject_id: str = "subject",
                    session_id: str = "planted", electrodes=None, seed: int = 0) -> pd.DataFrame:
    """A session table in the stimsim schema: per site ``trials_per_site`` trials, stimulated and sham
    interleaved 50/50, steps drawn uniformly, choices drawn from :func:`planted_curves`; ``current_uA`` > 0 on the
    stimulated trials."""
    if not (isinstance(trials_per_site, (int, np.integer)) and not isinstance(trials_per_site, bool)
            and trials_per_site >= 2):
        raise ValueError(f"trials_per_site must be an integer >= 2, got {trials_per_site!r}")
    if not (np.isfinite(current_uA) and current_uA > 0):
        raise ValueError(f"current_uA must be a number > 0 µA (sham trials get 0 µA), got {current_uA!r}")
    curves = planted_curves(stim_logodds, slope_logodds, n_steps, lapse_rate)
    n_sites = curves.shape[0]
    ids = [str(i + 1) for i in range(n_sites)] if electrodes is None else [str(e) for e in electrodes]
    rng = np.random.default_rng(seed)
    site = np.repeat(np.arange(n_sites), trials_per_site)
    stimulated = np.concatenate([rng.permutation(np.arange(trials_per_site) % 2) for _ in range(n_sites)])
    step = rng.integers(0, n_steps, size=site.size)
    high = rng.random(site.size) < curves[site, stimulated, step]
    order = rng.permutation(site.size)
    site, stimulated, step, high = site[order], stimulated[order], step[order], high[order]
    electrode = np.asarray(ids, dtype=object)[site]
    middle = (n_steps - 1) / 2
    return pd.DataFrame({
        "start_time": np.arange(site.size) * 2.0, "stop_time": np.arange(site.size) * 2.0 + 1.5,
        "stimulus_id": [f"{e}_seq0_step{s}" for e, s in zip(electrode, step)],
        "electrode": electrode, "sequence": 0, "step": step,
        "stimulated_electrode": np.where(stimulated == 1, electrode, SHAM),
        "current_uA": np.where(stimulated == 1, current_uA, 0.0),
        "choice": np.where(high, "high", "low"),
        "correct": np.where(step > middle, high, np.where(step < middle, ~high, False)),
        "subject_id": subject_id, "session_id": session_id,
    })
