"""The 2AFC sequence task of Mehrer et al. 2025 rehearsed at a plan's sites: per site, P(high) along its
sequences without stimulation and with stimulation at each of its points (the mapped point under the
fitted pose and under every bootstrap pose).

The task itself — the frozen per-sequence readouts, the noisy test copies, P(high) curves, ΔAUC and the
slope-to-noise score — is the paradigm :mod:`stimsim.paradigms.sequence_2afc`; this module sweeps it over
a plan's points with the batched engine (:func:`stimsim.engine.simulate`, one call per site with every
point of that site as a condition; on Dask workers when asked).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from stimsim.engine import simulate
from stimsim.errors import ConfigError
from stimsim.paradigms.sequence_2afc import (EVAL_NOISE_STREAM, SequenceReadouts, TaskSpec, evaluation_images,
                                             p_high_curves, sequence_delta_auc, site_readouts, slope_to_noise)
from stimsim.stimulation import Condition, ElectricalStimulation

__all__ = ["Rehearsal", "stimulation_at", "rehearse"]


@dataclass
class Rehearsal:
    """Results of the task in one model.

    Attributes
    ----------
    p_high : (n_sites, n_conditions, n_sequences, n_steps); condition 0 is without stimulation, the others
        stimulate the site's points in ``points_mm`` order.
    delta_auc : (n_sites, n_conditions - 1, n_sequences).
    slope_to_noise : (n_sites, n_sequences).
    readouts : the frozen decoders (sequence index = site · n_sequences + sequence).
    """

    p_high: np.ndarray
    delta_auc: np.ndarray
    slope_to_noise: np.ndarray
    readouts: SequenceReadouts


def stimulation_at(point_mm, template: dict) -> ElectricalStimulation:
    """An ElectricalStimulation at ``point_mm`` with the parameters of ``template`` (units in the keys); an unknown
    key is a ``ConfigError`` listing the allowed ones."""
    return ElectricalStimulation.from_dict({**template, "sites_mm": (tuple(float(v) for v in point_mm),)})


def rehearse(model, sequence_images: np.ndarray, points_mm: np.ndarray, stimulation: dict, readouts: SequenceReadouts,
             spec: TaskSpec, site_response: np.ndarray | None = None, noise_sd: np.ndarray | None = None,
             seed: int = 0, progress: bool = True, safety_limits=None, safety_override: str | None = None,
             device=None, scheduler=None) -> Rehearsal:
    """P(high) along every sequence without and with stimulation.

    Parameters
    ----------
    sequence_images : (n_sites, n_sequences, n_steps, H, W) in [0, 1].
    points_mm : (n_sites, n_points, 2): where to stimulate for each site, on ``model``'s sheet (e.g. the mapped
        point under the fitted pose and under every bootstrap pose).
    stimulation : ElectricalStimulation keyword arguments other than ``sites_mm`` (current_uA, ...).
    safety_limits, safety_override : passed to the engine's safety gate.
    device : where :func:`stimsim.engine.simulate` computes (None: where the model is).
    scheduler : None (this process) or a Dask scheduler (:mod:`stimsim.distributed`; a ``distributed.Client``
        is used as it is): each site's sweep is one Dask task, the model is sent to every worker once. The
        result is the same.
    """
    n_sites, n_seq, n_steps = sequence_images.shape[:3]
    points = np.asarray(points_mm, dtype=np.float64)
    if points.ndim != 3 or points.shape[0] != n_sites or points.shape[2] != 2:
        raise ConfigError(f"points_mm must be (n_sites={n_sites}, n_points, 2), got {points.shape}")
    p_high = np.empty((n_sites, points.shape[1] + 1, n_seq, n_steps))
    rng = np.random.default_rng([seed, EVAL_NOISE_STREAM])

    def sweeps():  # one site's images, conditions and decoder, drawn in site order (the noise is seeded)
        for site in range(n_sites):
            images = evaluation_images(sequence_images[site], spec, rng)  # (seq, step, copy) in C order
            conditions = [Condition("control")] + [
                Condition(f"stim_{k}", (stimulation_at(point, stimulation),)) for k, point in enumerate(points[site])]
            yield site, (images, conditions, site_readouts(readouts, site, n_seq, n_steps, spec.n_eval))

    settings = {"safety_limits": safety_limits, "safety_override": safety_override, "device": device}
    if scheduler is None:
        results = ((site, _site_sweep(model, sweep, settings)) for site, sweep in sweeps())
    else:
        from stimsim.distributed import run_tasks

        results = run_tasks(scheduler, _site_sweep, model, sweeps(), settings)
    for site, probabilities in tqdm(results, total=n_sites, desc="rehearsal", unit="site", disable=not progress):
        p_high[site] = p_high_curves(probabilities, n_seq, n_steps, spec.n_eval)
    effects = sequence_delta_auc(p_high[:, 1:], np.broadcast_to(p_high[:, :1], p_high[:, 1:].shape))
    stn = (slope_to_noise(site_response, noise_sd) if site_response is not None and noise_sd is not None
           else np.full((n_sites, n_seq), np.nan))
    return Rehearsal(p_high=p_high, delta_auc=effects, slope_to_noise=stn, readouts=readouts)


def _site_sweep(model, sweep, settings: dict) -> np.ndarray:
    """P(high) of one site's sweep, (n_conditions, n_images), by the engine in this process."""
    images, conditions, decoder = sweep
    result = simulate(model, list(images), conditions, decoder, progress=False, **settings)
    return result.sel(choice="high").values
