"""The 2AFC sequence task of Mehrer et al. 2025 as a plan task (``task = "sequence_2afc"``, the default).

Design: on the chosen candidate, image sequences along every working electrode's mapped site
(:func:`stimsim.sequences.build_sequences`; plan table ``[sequences]``). Rehearsal: per site, P(high) along its
sequences without stimulation and with stimulation at each of its points (the mapped point under the fitted
pose and under every bootstrap pose), with frozen per-sequence readouts (plan table ``[decoder]``); the effect is
ΔAUC (chance 0). The task itself — readouts, noisy test copies, P(high) curves, ΔAUC, slope-to-noise — is the
paradigm :mod:`stimsim.paradigms.sequence_2afc`; this module sweeps it over a plan's points with the batched
engine (:func:`stimsim.engine.simulate`, one call per site with every point of that site as a condition; on
Dask workers when asked). Only this task has a rig package (trial list, images, NWB template).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from stimsim.engine import simulate
from stimsim.paradigms.sequence_2afc import (EVAL_NOISE_STREAM, SequenceReadouts, TaskSpec, check_image_memory,
                                             evaluation_images, fit_readouts, p_high_curves, sequence_delta_auc,
                                             site_readouts, slope_to_noise)
from stimsim.planning.detectability import power_forecast
from stimsim.planning.rig import sequence_images, trial_list, write_rig
from stimsim.planning.selection import ranking_reliability
from stimsim.planning.tasks.base import PlanTask, control_and_stimulated, register_plan_task, stimulation_at
from stimsim.report import Image, Paragraph, figure_png, format_value, image_png
from stimsim.sequences import SequenceSpec, build_sequences, excursion_warning, pooling_matrix
from stimsim.stimulation import Condition
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.figures import pyplot

__all__ = ["Rehearsal", "SequenceTask", "rehearse"]

IT = "IT"
#: Top-ranked sites whose P(high) curves the report draws.
N_CURVES = 4
#: Below this largest gap in P(high) (about a marker's width on the figure's 0–1 axis) the curves overlap.
OVERLAP_GAP = 0.02


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
    scheduler : None (this process) or a Dask scheduler (:mod:`stimsim.engine.distributed`; a ``distributed.Client``
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
        from stimsim.engine.distributed import run_tasks

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


def site_responses(model, images: np.ndarray, pool) -> np.ndarray:
    """(n_sites, n_seq, n_steps) each site's pooled response to its own sequences in ``model``."""
    n_sites, n_seq, n_steps = images.shape[:3]
    flat = list(images.reshape(-1, *images.shape[3:]))
    activity = model.activations(flat, IT, batch_size=512).numpy().reshape(n_sites, n_seq * n_steps, -1)
    weights = pool.numpy()
    return np.einsum("sif,sf->si", activity, weights).reshape(n_sites, n_seq, n_steps).astype(np.float64)


@register_plan_task("sequence_2afc")
class SequenceTask(PlanTask):
    """2AFC between the two ends of image sequences along each site's tuning (module docstring)."""

    paradigm = "sequence_2afc"
    effect = "delta_auc"
    effect_label = "ΔAUC"
    probability = "p_high"
    tables = {"sequences": SequenceSpec, "decoder": TaskSpec}
    design_phase = "sequences"
    stimuli_noun = "sequences"

    def record(self, options) -> dict:
        return {"sequences": options.sequences.to_dict(), "task_spec": options.decoder.to_dict()}

    def steps_per_stimulus(self, options) -> int:
        return options.sequences.n_steps

    def check_memory(self, options, models: dict, n_sites: int, where: str) -> None:
        """Every site's sequences, and one site's noisy test images at a time (the rehearsal's), at each model's
        input size."""
        for model in models.values():
            check_image_memory(where, options.decoder, model, n_sites, options.sequences, tested_sites=1)

    def design(self, options, prepared, model, points_mm, seed, progress, companions=()) -> dict:
        sequences = build_sequences(model, points_mm, prepared.images, options.sequences, layer=IT, seed=seed,
                                    progress=progress, companions=companions)
        return {"images": sequences.images, "start_index": sequences.start_index,
                "site_response": sequences.site_response, "others_change_sd": sequences.others_change_sd,
                "natural_mean": sequences.natural_mean, "natural_sd": sequences.natural_sd}

    def rehearse(self, model, options, trials, points_mm, stimulation, seed, engine, progress) -> dict:
        pool = pooling_matrix(model.sheet(IT), points_mm[:, 0], options.sequences.recording_radius_mm)
        readouts, noise_sd = fit_readouts(model, trials["images"], pool, options.decoder, seed=seed,
                                          progress=progress)
        responses = site_responses(model, trials["images"], pool)
        result = rehearse(model, trials["images"], points_mm, stimulation, readouts, options.decoder, responses,
                          noise_sd, seed=seed, progress=progress, **engine)
        return {"p_high": result.p_high, "delta_auc": result.delta_auc, "slope_to_noise": result.slope_to_noise,
                "site_response": responses}

    def truth(self, model, options, trials, points_mm, stimulation, seed, engine, progress) -> dict:
        """The subject's own readouts and noisy copies are drawn with ``seed + 1``, not the plan's."""
        readouts, _ = fit_readouts(model, trials["images"], None, options.decoder, seed=seed + 1, progress=progress)
        result = rehearse(model, trials["images"], points_mm, stimulation, readouts, options.decoder, seed=seed + 1,
                          progress=progress, **engine)
        return {"p_high": result.p_high, "delta_auc": result.delta_auc[:, 0]}

    def dataset_variables(self, working, trials, rehearsals) -> tuple[dict, dict]:
        names = list(rehearsals)
        n_seq, n_steps = trials["images"].shape[1:3]
        first = rehearsals[names[0]]
        variables = {
            "sequence_image": (("electrode", "sequence", "step", "y", "x"), trials["images"],
                               {"description": "the sequences' images, grey levels in [0, 1]"}),
            "p_high": (("model", "electrode", "pose", "stimulated", "sequence", "step"),
                       np.stack([control_and_stimulated(rehearsals[n]["p_high"]) for n in names]),
                       {"description": "each candidate's P('high') at every step, without and with stimulation"}),
            "delta_auc": (("model", "electrode", "pose", "sequence"),
                          np.stack([rehearsals[n]["delta_auc"] for n in names]),
                          {"description": "AUC of P(high) over steps scaled to [0, 1], stimulated - sham"}),
            "slope_to_noise": (("model", "electrode", "sequence"),
                               np.stack([rehearsals[n]["slope_to_noise"] for n in names]),
                               {"description": "least-squares slope of the site's response per step over its noise "
                                               "SD"}),
            "site_response": (("electrode", "sequence", "step"), trials["site_response"],
                              {"units": "model activation", "description": "the site's pooled response at every "
                                                                           "step (the chosen candidate's units)"}),
            "others_change_sd": (("electrode", "sequence", "step"), trials["others_change_sd"],
                                 {"units": "natural SDs", "description": "RMS change of the other sites' responses "
                                                                         "from the start image"})}
        coords = {"sequence": np.arange(n_seq), "step": np.arange(n_steps),
                  "pose": ["fitted"] + [f"bootstrap_{k}" for k in range(first["delta_auc"].shape[1] - 1)]}
        return variables, coords

    def truth_dataset(self, working, truth, trials) -> tuple[str, xr.Dataset]:
        n_seq, n_steps = trials["images"].shape[1:3]
        return "subject_p_high.nc", xr.Dataset(
            {"subject_p_high": (("electrode", "stimulated", "sequence", "step"), truth["p_high"]),
             "true_delta_auc": (("electrode", "sequence"), truth["delta_auc"]),
             "dead": ("electrode", truth["dead"])},
            coords={"electrode": list(working), "stimulated": [False, True], "sequence": np.arange(n_seq),
                    "step": np.arange(n_steps)},
            attrs={"description": "the virtual subject's own P(high) for the plan's sequences (validation only)"})

    def summary(self, options, trials, rehearsals, plan, working, models, rig, seed) -> dict:
        summary = {
            "sequence_response_change_sd": float(np.median(
                (trials["site_response"][:, :, -1] - trials["site_response"][:, :, 0]) / trials["natural_sd"][:, None])),
            "sequence_others_change_sd": float(np.median(trials["others_change_sd"][:, :, [0, -1]])),
            "ranking_reliability": _finite_or_none(ranking_reliability(np.nanmean(
                np.stack([rehearsals[n]["delta_auc"][:, 0] for n in rehearsals]), axis=0))),
            "ranking_reliability_chance": 0.0,
            "sequence_warning": excursion_warning(trials["site_response"], trials["natural_sd"],
                                                  options.sequences.recording_radius_mm)}
        if summary["sequence_warning"] is not None:
            warnings.warn(summary["sequence_warning"], stacklevel=3)
        summary.update(power_forecast(rehearsals, plan, working, rig.trials_per_site, seed))
        return summary

    def write_rig(self, out_dir, options, trials, chosen, working, rig, stimulation, seed, layout, name,
                  model, subject_id) -> dict:
        sites_chosen = [working[i] for i in chosen]
        n_sequences, n_steps = trials["images"].shape[1:3]
        images = sequence_images(sites_chosen, n_sequences, n_steps)
        trial_table = trial_list(sites_chosen, images, rig, stimulation, seed, layout)
        files = {entry["image_file"]: trials["images"][site, entry["sequence"], entry["step"]]
                 for site, electrode in zip(chosen, sites_chosen) for entry in images[electrode]}
        write_rig(out_dir, files, rig, trial_table, name, stimulation, subject_id)
        return {"folder": "rig", "n_trials": int(len(trial_table)), "n_images": len(files)}

    def describe(self, options, summary) -> str:
        return (f"Task: 2AFC between the two ends of {options.sequences.n_steps}-step image sequences along each "
                "site's tuning (chance ΔAUC = 0).")

    def site_columns(self) -> tuple[str, ...]:
        return ("best sequence (low → high)", "slope/noise")

    def site_columns_note(self) -> str:
        return ("slope/noise: the least-squares slope per step of the site's response (in the chosen model) along a "
                "sequence, divided by the response's noise SD; best sequence: the site's sequence where it is largest")

    def site_cells(self, trials, rehearsal, site) -> list:
        stn = rehearsal["slope_to_noise"][site]
        best = int(np.nanargmax(stn)) if np.any(np.isfinite(stn)) else 0
        images = trials["images"]
        return [tuple(Image(image_png(images[site, best, k], scale=1), alt=f"step {k}") for k in range(images.shape[2])),
                float(stn[best])]

    def overview_blocks(self, rehearsals, plan, working, chosen_model) -> list:
        return [Image(curves_figure(rehearsals, plan, working, chosen_model),
                      caption="P(high) along the sequences of the best-ranked chosen sites, mean over sequences, "
                              "without and with stimulation (the chosen model at its fitted registration). "
                              + curves_effects(rehearsals, plan, chosen_model))]

    def method_blocks(self, options, summary) -> list:
        return [Paragraph(
            "Sequence method: pixel-space gradient steps with image priors (smoothness, small steps, pixel range) — "
            "not a generative model; see stimsim.sequences. Median change of the target site across a "
            f"sequence: {summary['sequence_response_change_sd']:.2f} natural SDs; other sites at the ends: "
            f"{summary['sequence_others_change_sd']:.2f} SDs (RMS). " + _reliability_sentence(
                summary["ranking_reliability"], options.sequences.n_sequences, self.effect_label))]


def _finite_or_none(value: float):
    """``value``, or None (JSON null) where it is undefined (NaN)."""
    return value if np.isfinite(value) else None


def _top_chosen(plan, n_top: int) -> np.ndarray:
    """The ``n_top`` best-ranked chosen sites (indices; rank order), the best-ranked sites when none is chosen."""
    chosen = np.asarray(plan["choice"]["chosen"], dtype=int)
    return (chosen if chosen.size else np.asarray(plan["choice"]["order"], dtype=int))[:n_top]


def curves_figure(rehearsals, plan, working, chosen_model: str, n_top: int = N_CURVES) -> bytes:
    """P(high) along the sequences of the best-ranked chosen sites without and with stimulation (PNG)."""
    plt = pyplot()
    top = _top_chosen(plan, n_top)
    fig, axes = plt.subplots(1, len(top), figsize=(3.0 * len(top), 2.8), squeeze=False)
    for ax, site in zip(axes[0], top):
        p = rehearsals[chosen_model]["p_high"][site]  # (conditions, seq, steps)
        steps = np.arange(p.shape[-1])
        ax.plot(steps, p[0].mean(0), "k-o", ms=3, label="no stimulation")
        ax.plot(steps, p[1].mean(0), "r-o", ms=3, label="stimulated")
        drawn = np.nanmean(rehearsals[chosen_model]["delta_auc"][site, 0])
        # one short line each, so that the titles of neighbouring panels keep apart
        ax.set_title(f"electrode {working[site]}\nΔAUC of these curves {drawn:.3f}\nplan (mean over candidates) "
                     f"{plan['predicted'][site]:.3f}", fontsize=8)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel(f"P(high), {chosen_model}")
    axes[0][0].legend(fontsize=7)
    return figure_png(fig)


def _span(values, digits: int = 2) -> str:
    """"a–b" of the finite values (one number when they are all equal)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return "–"
    low, high = format_value(float(values.min()), digits), format_value(float(values.max()), digits)
    return low if low == high else f"{low}–{high}"


def curves_effects(rehearsals, plan, chosen_model: str, n_top: int = N_CURVES) -> str:
    """In words, the size of the effects :func:`curves_figure` draws: the ΔAUC of the drawn curves (the chosen
    model at its fitted registration, mean over sequences), the sites' predicted ΔAUC, and the largest gap
    between the curves without and with stimulation (P(high))."""
    top = _top_chosen(plan, n_top)
    p_high = rehearsals[chosen_model]["p_high"][top]  # (sites, conditions, seq, steps)
    drawn = np.nanmean(rehearsals[chosen_model]["delta_auc"][top, 0], axis=-1)
    gap = float(np.nanmax(np.abs(p_high[:, 1].mean(1) - p_high[:, 0].mean(1))))
    text = (f"Effect sizes drawn: ΔAUC of these curves {_span(drawn)}, predicted ΔAUC of these sites (mean over "
            f"candidates) {_span(plan['predicted'][top])}, chance 0; the curves differ by at most "
            f"{format_value(gap, 2)} in P(high)")
    return text + (", so they overlap at this scale." if gap < OVERLAP_GAP else ".")


def _reliability_sentence(reliability, n_sequences: int, label: str) -> str:
    """The ranking's reproducibility over image sequences, in words."""
    if reliability is None:
        return ("Reproducibility of the ranking over sequences: undefined (it needs at least 2 sequences per site "
                "and 3 sites with a prediction).")
    return (f"Reproducibility of the ranking over sequences: ICC(1,k) = {reliability:.2f} (chance 0), the share of "
            f"the spread of predicted {label} across sites that a fresh set of {n_sequences} sequences per site "
            "would reproduce.")
