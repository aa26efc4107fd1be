"""The 2AFC sequence task of Mehrer et al. 2025, rehearsed in a model with and without stimulation.

For every sequence a frozen decoder chooses between its two ends ("low" = step 0, "high" = the last
step): a logistic readout of IT (C = 1e-3 on standardised features, as for every stimsim decoder),
fitted without stimulation on noisy copies of the two end images (``n_noise`` copies each, Gaussian
pixel noise of ``noise_sd``, clipped to [0, 1]). P(high) at a step is the mean over ``n_eval`` noisy copies
of its image (the same noise; the decoder's trial-to-trial variability), once without stimulation and
once with stimulation at the site (the batched engine,
:func:`stimsim.engine.simulate`, one call per site with every stimulation site of that site as a
condition). ΔAUC = AUC of P(high) against the step position scaled to [0, 1] with stimulation minus
without (:func:`stimsim.behavior.metrics.delta_auc`).

Slope-to-noise score of a sequence: the least-squares slope of the site's pooled response along the
steps (per step) divided by the SD of that response over the noisy copies of the end images (the
trial-to-trial noise the decoder is fitted on) — how many noise SDs one step moves the site.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from stimsim.behavior import LogisticDecoder
from stimsim.behavior.metrics import delta_auc
from stimsim.engine import simulate
from stimsim.errors import ConfigError
from stimsim.stimulation import Condition, ElectricalStimulation

CHOICES = ("high", "low")


@dataclass(frozen=True)
class TaskSpec:
    """The 2AFC decoder: ``n_noise`` noisy copies per end image to fit it, ``n_eval`` noisy copies per step
    image to read P(high), pixel noise SD ``noise_sd`` (images in [0, 1]), inverse regularisation ``C``."""

    n_noise: int = 24
    n_eval: int = 8
    noise_sd: float = 0.15
    C: float = 1e-3

    def __post_init__(self):
        for name in ("n_noise", "n_eval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
                raise ConfigError(f"decoder.{name} must be an integer >= 2, got {value!r}")
        for name in ("noise_sd", "C"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
                raise ConfigError(f"decoder.{name} must be a number > 0, got {value!r}")

    def to_dict(self) -> dict:
        return asdict(self)


class SequenceReadouts:
    """One frozen two-choice readout per sequence, chosen per image by ``stimulus_sequence``; follows the
    engine's decoder protocol (``layer``, ``choices``, ``probabilities(features, stimulus_index)``).

    weight : (n_sequences, F) on raw features; bias : (n_sequences,); logit of "high" = x·w + b.
    """

    choices = CHOICES

    def __init__(self, layer: str, weight: np.ndarray, bias: np.ndarray, stimulus_sequence: np.ndarray):
        self.layer = layer
        self.weight = torch.as_tensor(weight, dtype=torch.float64)
        self.bias = torch.as_tensor(bias, dtype=torch.float64)
        self.stimulus_sequence = torch.as_tensor(stimulus_sequence, dtype=torch.long)

    def subset(self, sequences: np.ndarray, stimulus_sequence: np.ndarray) -> "SequenceReadouts":
        return SequenceReadouts(self.layer, self.weight[sequences], self.bias[sequences], stimulus_sequence)

    def probabilities(self, features: torch.Tensor, stimulus_index: torch.Tensor | None = None) -> torch.Tensor:
        if stimulus_index is None:
            raise ValueError("SequenceReadouts needs the stimulus index of every image")
        device = features.device
        dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        sequence = self.stimulus_sequence[stimulus_index.cpu()].to(device)
        weight, bias = self.weight.to(device=device, dtype=dtype), self.bias.to(device=device, dtype=dtype)
        logit = (features.to(dtype) * weight[sequence]).sum(-1) + bias[sequence]
        high = torch.sigmoid(logit)
        return torch.stack([high, 1 - high], dim=-1).to(features.dtype)


@dataclass
class Rehearsal:
    """Results of the task in one model.

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


def _noisy(images: np.ndarray, n: int, sd: float, rng) -> np.ndarray:
    noisy = images[:, None] + rng.normal(0.0, sd, (images.shape[0], n) + images.shape[1:])
    return np.clip(noisy, 0.0, 1.0).astype(np.float32)


def fit_readouts(model, sequence_images: np.ndarray, pool: torch.Tensor | None, spec: TaskSpec, seed: int = 0,
                 layer: str = "IT", progress: bool = True) -> tuple[SequenceReadouts, np.ndarray]:
    """Decoders for sequences (n_sites, n_sequences, n_steps, H, W); with ``pool`` (n_sites, units) also the
    response noise SD of each site over the noisy end copies, (n_sites, n_sequences) (else NaN)."""
    layer = model.resolve_layer(layer)
    n_sites, n_seq, n_steps = sequence_images.shape[:3]
    rng = np.random.default_rng([seed, 0x2AFC])
    weights, biases = [], []
    noise_sd = np.full((n_sites, n_seq), np.nan)
    labels = np.array(["low"] * spec.n_noise + ["high"] * spec.n_noise)
    for site in tqdm(range(n_sites), desc="decoders", unit="site", disable=not progress):
        ends = sequence_images[site][:, [0, n_steps - 1]]  # (n_seq, 2, H, W)
        noisy = _noisy(ends.reshape(-1, *ends.shape[2:]), spec.n_noise, spec.noise_sd, rng)
        features = model.activations(list(noisy.reshape(-1, *noisy.shape[2:])), layer, batch_size=256).numpy()
        features = features.reshape(n_seq, 2 * spec.n_noise, -1)
        for j in range(n_seq):
            decoder = LogisticDecoder.fit(features[j].astype(np.float64), labels, layer=layer, C=spec.C, seed=seed)
            readout = decoder.readout
            w = readout.coef / readout.feature_scale  # row 0 is "high" (choices sort as high, low)
            b = readout.intercept - w @ readout.feature_mean
            if readout.choices != CHOICES:
                raise AssertionError(f"unexpected choice order {readout.choices}")
            weights.append(w[0] - w[1])
            biases.append(b[0] - b[1])
            if pool is not None:
                response = features[j] @ pool[site].numpy().astype(np.float64)
                noise_sd[site, j] = np.sqrt((response[:spec.n_noise].var(ddof=1) + response[spec.n_noise:].var(ddof=1)) / 2)
    readouts = SequenceReadouts(layer, np.array(weights), np.array(biases),
                                np.repeat(np.arange(n_sites * n_seq), n_steps))
    return readouts, noise_sd


def slope_to_noise(site_response: np.ndarray, noise_sd: np.ndarray) -> np.ndarray:
    """Least-squares slope of ``site_response`` (..., n_steps) per step, divided by ``noise_sd`` (...)."""
    steps = np.arange(site_response.shape[-1], dtype=np.float64)
    centred = steps - steps.mean()
    slope = (site_response * centred).sum(-1) / (centred ** 2).sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(noise_sd > 0, slope / noise_sd, np.nan)


def stimulation_at(point_mm, template: dict) -> ElectricalStimulation:
    """An ElectricalStimulation at ``point_mm`` with the parameters of ``template`` (units in the keys)."""
    return ElectricalStimulation(sites_mm=(tuple(float(v) for v in point_mm),), **template)


def rehearse(model, sequence_images: np.ndarray, points_mm: np.ndarray, stimulation: dict, readouts: SequenceReadouts,
             spec: TaskSpec, site_response: np.ndarray | None = None, noise_sd: np.ndarray | None = None,
             seed: int = 0, progress: bool = True, safety_limits=None, safety_override: str | None = None,
             device=None, scheduler=None) -> Rehearsal:
    """P(high) along every sequence without and with stimulation.

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
    x = np.linspace(0.0, 1.0, n_steps)
    rng = np.random.default_rng([seed, 0xE7A1])

    def sweeps():  # one site's images, conditions and decoder, drawn in site order (the noise is seeded)
        for site in range(n_sites):
            noisy = _noisy(sequence_images[site].reshape(-1, *sequence_images.shape[3:]), spec.n_eval, spec.noise_sd,
                           rng)
            images = noisy.reshape(-1, *noisy.shape[2:])  # (seq, step, copy) in C order
            conditions = [Condition("control")] + [
                Condition(f"stim_{k}", (stimulation_at(point, stimulation),)) for k, point in enumerate(points[site])]
            decoder = readouts.subset(np.arange(site * n_seq, (site + 1) * n_seq),
                                      np.repeat(np.arange(n_seq), n_steps * spec.n_eval))
            yield site, (images, conditions, decoder)

    settings = {"safety_limits": safety_limits, "safety_override": safety_override, "device": device}
    if scheduler is None:
        results = ((site, _site_sweep(model, sweep, settings)) for site, sweep in sweeps())
    else:
        from stimsim.distributed import run_tasks

        results = run_tasks(scheduler, _site_sweep, model, sweeps(), settings)
    for site, probabilities in tqdm(results, total=n_sites, desc="rehearsal", unit="site", disable=not progress):
        p_high[site] = probabilities.reshape(-1, n_seq, n_steps, spec.n_eval).mean(-1)
    effects = delta_auc(p_high[:, 1:], np.broadcast_to(p_high[:, :1], p_high[:, 1:].shape), x=x, axis=-1)
    stn = (slope_to_noise(site_response, noise_sd) if site_response is not None and noise_sd is not None
           else np.full((n_sites, n_seq), np.nan))
    return Rehearsal(p_high=p_high, delta_auc=np.asarray(effects), slope_to_noise=stn, readouts=readouts)


def _site_sweep(model, sweep, settings: dict) -> np.ndarray:
    """P(high) of one site's sweep, (n_conditions, n_images), by the engine in this process."""
    images, conditions, decoder = sweep
    result = simulate(model, list(images), conditions, decoder, progress=False, **settings)
    return result.sel(choice="high").values
