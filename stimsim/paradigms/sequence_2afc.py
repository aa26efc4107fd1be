"""The 2AFC sequence task of Mehrer et al. 2025 (arXiv 2510.03684): does stimulating a site push choices
along the image sequences that move that site's response?

For every selected site, ``n_sequences`` image sequences of ``n_steps`` images move the site's pooled
response along its tuning, from a natural start image (the middle step) to a "low" and a "high" end
(:func:`stimsim.sequences.build_sequences`; the start images are the experiment's ``[stimuli]`` sets).
For every sequence a frozen decoder chooses between its two ends: a logistic readout (C = 1e-3 on
standardised features, as for every stimsim decoder), fitted without stimulation on ``n_noise`` noisy
copies of each end image (Gaussian pixel noise of SD ``noise_sd``, clipped to [0, 1]). P(high) at a
step is the mean over ``n_eval`` other noisy copies of its image (the decoder's trial-to-trial
variability), without stimulation and with stimulation at a site. ΔAUC = AUC of P(high) against the
step position scaled to [0, 1] with stimulation minus without (:func:`stimsim.behavior.metrics.delta_auc`);
a condition without effect has ΔAUC 0 (the control condition's is 0 by construction), so chance is 0.

Slope-to-noise score of a sequence: the least-squares slope of the site's pooled response along the
steps (per step) divided by the SD of that response over the noisy copies of the end images (the
trial-to-trial noise the decoder is fitted on) — how many noise SDs one step moves the site.

Site planning (:mod:`stimsim.planning.tasks.sequence_2afc`) rehearses this task at every mapped electrode with the
pieces defined here. ``stimsim run`` runs it as the paradigm ``"sequence_2afc"``: every site's trials
(its sequences' noisy step images, ids ``<site>_seq<j>_step<k>_copy<c>``) are shown under the control
condition and under stimulation at every selected site, so the run measures both each site's effect on
its own sequences (``own_delta_auc``, the number a plan predicts, identical to the planning rehearsal's
for the same model, sites, images and seed) and on the other sites' sequences (``cross_delta_auc``). The
locality summary compares the mean absolute ΔAUC on a site's own sequences with that on the other
sites' sequences (baseline: equal, difference 0, when stimulation is not specific to the site the
sequences move).

Experiment file keys (besides the common ones of :mod:`stimsim.paradigms.experiment_file`):

``[stimuli]``
    ``sets``: the natural start images (e.g. ``[{ source = "lfw_subset" }]``); each site's sequences start
    from the images whose response at the site lies nearest its median.
``[sequences]`` (optional; the keys of a plan's ``[sequences]``, :class:`stimsim.sequences.SequenceSpec`)
    ``n_sequences`` (3), ``n_steps`` (7, odd), ``max_sd`` (5.0), ``iterations`` (40), ``learning_rate``
    (0.03), ``others_weight`` (1.0), ``tv_weight`` (0.02), ``step_weight`` (0.5), ``batch_images`` (256).
    A site's pooled response is the mean of the units within ``[sites]`` ``recording_radius_mm``.
``[decoder]`` (as a plan's ``[decoder]``)
    ``n_noise`` (24), ``n_eval`` (8), ``noise_sd`` (0.15), ``C`` (1e-3), plus the common ``layer`` and
    ``max_iter``; ``fit_fraction`` does not apply (the readouts are fitted on noisy copies of the end
    images, every step is tested on other noisy copies).

Over 500 lines: the task, its readouts, its sequences' trials and its analysis are one paradigm, which
planning also rehearses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np
import torch
import xarray as xr
from pydantic import ConfigDict, Field, model_validator
from tqdm.auto import tqdm

from stimsim.behavior import LogisticDecoder
from stimsim.behavior.metrics import delta_auc, stratum_mean
from stimsim.paradigms.base import Paradigm, register_paradigm
from stimsim.paradigms.schema import DecoderFile
from stimsim.paradigms.sites import CONTROL_LABEL, SiteSelection
from stimsim.sequences import SequenceSet, SequenceSpec, build_sequences, pooling_matrix
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.figures import pyplot, save_figure
from stimsim.utilities.filemodels import FileModel
from stimsim.utilities.limits import check_memory

#: The two choices of every sequence's decoder ("high" end, "low" end), in the decoders' order.
CHOICES = ("high", "low")
#: Seed stream of the noisy copies that fit the decoders, and of those that test them.
FIT_NOISE_STREAM, EVAL_NOISE_STREAM = 0x2AFC, 0xE7A1


class TaskSpec(FileModel):
    """The 2AFC decoder (a plan's ``[decoder]`` table): ``n_noise`` noisy copies per end image to fit it, ``n_eval``
    noisy copies per step image to read P(high), pixel noise SD ``noise_sd`` (images in [0, 1]), inverse
    regularisation ``C``."""

    table: ClassVar[str] = "decoder"

    n_noise: Annotated[int, Field(ge=2)] = 24
    n_eval: Annotated[int, Field(ge=2)] = 8
    noise_sd: Annotated[float, Field(gt=0)] = 0.15
    C: Annotated[float, Field(gt=0)] = 1e-3


class SequenceReadouts:
    """One frozen two-choice readout per sequence, chosen per image by ``stimulus_sequence``; follows the
    engine's decoder protocol (``layer``, ``choices``, ``probabilities(features, stimulus_index)``).

    weight : (n_sequences, F) on raw features; bias : (n_sequences,); logit of "high" = x·w + b.
    """

    choices = CHOICES
    kind = "sequence_readouts"

    def __init__(self, layer: str, weight: np.ndarray, bias: np.ndarray, stimulus_sequence: np.ndarray):
        self.layer = layer
        self.weight = torch.as_tensor(weight, dtype=torch.float64)
        self.bias = torch.as_tensor(bias, dtype=torch.float64)
        self.stimulus_sequence = torch.as_tensor(stimulus_sequence, dtype=torch.long)

    def subset(self, sequences: np.ndarray, stimulus_sequence: np.ndarray) -> "SequenceReadouts":
        """The readouts of ``sequences`` (indices), for images whose sequence (index into ``sequences``) is
        ``stimulus_sequence``."""
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

    def to_dict(self) -> dict:
        """The frozen numbers (JSON-compatible); :meth:`from_dict` rebuilds the readouts."""
        return {"kind": self.kind, "layer": self.layer, "choices": list(self.choices),
                "weight": self.weight.tolist(), "bias": self.bias.tolist(),
                "stimulus_sequence": self.stimulus_sequence.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> "SequenceReadouts":
        required = {"kind", "layer", "choices", "weight", "bias", "stimulus_sequence"}
        if not isinstance(data, dict) or set(data) != required or data["kind"] != cls.kind:
            found = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"stored sequence readouts must have kind {cls.kind!r} and exactly the keys "
                              f"{sorted(required)}, got {found}")
        if tuple(data["choices"]) != CHOICES:
            raise ConfigError(f"stored sequence readouts must have the choices {list(CHOICES)}, got {data['choices']}")
        return cls(data["layer"], np.asarray(data["weight"], dtype=np.float64),
                   np.asarray(data["bias"], dtype=np.float64), np.asarray(data["stimulus_sequence"], dtype=np.int64))


def noisy_copies(images: np.ndarray, n: int, sd: float, rng) -> np.ndarray:
    """(N, n, ...) float32: ``n`` copies of each of the N images (values in [0, 1]) with Gaussian pixel noise
    of SD ``sd``, clipped to [0, 1]; drawn from ``rng`` in image order."""
    noisy = images[:, None] + rng.normal(0.0, sd, (images.shape[0], n) + images.shape[1:])
    return np.clip(noisy, 0.0, 1.0).astype(np.float32)


def evaluation_images(site_sequences: np.ndarray, spec: TaskSpec, rng) -> np.ndarray:
    """The test images of one site: ``spec.n_eval`` noisy copies of every step of its sequences
    (n_sequences, n_steps, H, W[, 3]), ordered (sequence, step, copy) in C order."""
    noisy = noisy_copies(site_sequences.reshape(-1, *site_sequences.shape[2:]), spec.n_eval, spec.noise_sd, rng)
    return noisy.reshape(-1, *noisy.shape[2:])


def site_readouts(readouts: SequenceReadouts, site: int, n_sequences: int, n_steps: int,
                  n_eval: int) -> SequenceReadouts:
    """The readouts of one site's sequences for its :func:`evaluation_images`."""
    return readouts.subset(np.arange(site * n_sequences, (site + 1) * n_sequences),
                           np.repeat(np.arange(n_sequences), n_steps * n_eval))


def p_high_curves(p_high: np.ndarray, n_sequences: int, n_steps: int, n_eval: int) -> np.ndarray:
    """P(high) of the test images (..., n_sequences · n_steps · n_eval), in :func:`evaluation_images` order →
    (..., n_sequences, n_steps), the mean over the noisy copies."""
    return p_high.reshape(*p_high.shape[:-1], n_sequences, n_steps, n_eval).mean(-1)


def sequence_delta_auc(p_high_stimulated: np.ndarray, p_high_control: np.ndarray) -> np.ndarray:
    """ΔAUC of P(high) curves (..., n_steps): AUC against the step position scaled to [0, 1], stimulated
    minus control."""
    n_steps = p_high_stimulated.shape[-1]
    return np.asarray(delta_auc(p_high_stimulated, p_high_control, x=np.linspace(0.0, 1.0, n_steps), axis=-1))


def fit_readouts(model, sequence_images: np.ndarray, pool: torch.Tensor | None, spec: TaskSpec, seed: int = 0,
                 layer: str = "IT", progress: bool = True, max_iter: int = 1000,
                 response_layer: str | None = None) -> tuple[SequenceReadouts, np.ndarray]:
    """Decoders of ``layer`` for sequences (n_sites, n_sequences, n_steps, H, W); with ``pool`` (n_sites, units
    of ``response_layer``, default ``layer``) also the response noise SD of each site over the noisy end
    copies, (n_sites, n_sequences) (else NaN)."""
    layer = model.resolve_layer(layer)
    response_layer = layer if response_layer is None else model.resolve_layer(response_layer)
    n_sites, n_seq, n_steps = sequence_images.shape[:3]
    rng = np.random.default_rng([seed, FIT_NOISE_STREAM])
    weights, biases = [], []
    noise_sd = np.full((n_sites, n_seq), np.nan)
    labels = np.array(["low"] * spec.n_noise + ["high"] * spec.n_noise)
    for site in tqdm(range(n_sites), desc="decoders", unit="site", disable=not progress):
        ends = sequence_images[site][:, [0, n_steps - 1]]  # (n_seq, 2, H, W)
        noisy = noisy_copies(ends.reshape(-1, *ends.shape[2:]), spec.n_noise, spec.noise_sd, rng)
        flat = list(noisy.reshape(-1, *noisy.shape[2:]))
        features = model.activations(flat, layer, batch_size=256).numpy()
        features = features.reshape(n_seq, 2 * spec.n_noise, -1)
        responses = features
        if pool is not None and response_layer != layer:
            responses = model.activations(flat, response_layer, batch_size=256).numpy().reshape(n_seq, 2 * spec.n_noise, -1)
        for j in range(n_seq):
            decoder = LogisticDecoder.fit(features[j].astype(np.float64), labels, layer=layer, C=spec.C, seed=seed,
                                          max_iter=max_iter)
            readout = decoder.readout
            w = readout.coef / readout.feature_scale  # row 0 is "high" (choices sort as high, low)
            b = readout.intercept - w @ readout.feature_mean
            if readout.choices != CHOICES:
                raise AssertionError(f"unexpected choice order {readout.choices}")
            weights.append(w[0] - w[1])
            biases.append(b[0] - b[1])
            if pool is not None:
                response = responses[j] @ pool[site].numpy().astype(np.float64)
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


# --- the experiment file -------------------------------------------------------------------------------
#: Keys of a plan's ``[sequences]`` that an experiment sets elsewhere or cannot use, and why.
_NOT_IN_SEQUENCES = {
    "recording_radius_mm": "is not set here: a site's pooled response uses [sites] recording_radius_mm",
    "ensemble": "is not set here: an experiment runs one model; ensembles of candidate models belong to `stimsim plan`",
}
#: The common ``[decoder]`` key this task refuses, and why.
_NOT_IN_DECODER = {
    "fit_fraction": "does not apply to sequence_2afc: each sequence's readout is fitted on n_noise noisy copies "
                    "of its two end images and every step is tested on n_eval others",
}


def _refuse_keys(data, reasons: dict[str, str]):
    """A table's raw ``data``, unchanged, unless it holds a key of ``reasons``: then a ValueError with the reason."""
    if isinstance(data, dict):
        for key, why in reasons.items():
            if key in data:
                raise ValueError(f"{key!r} {why}")
    return data


def _without_plan_only_keys(schema: dict) -> None:
    """The JSON Schema of :class:`SequencesFile` leaves out the plan's keys it refuses."""
    for key in _NOT_IN_SEQUENCES:
        schema["properties"].pop(key, None)


class SequencesFile(SequenceSpec):
    """``[sequences]`` of a sequence_2afc experiment: the keys and defaults of a plan's
    (:class:`stimsim.sequences.SequenceSpec`) but for ``recording_radius_mm`` and ``ensemble``, which an
    experiment sets elsewhere or cannot use (refused in files, left out of dumps)."""

    model_config = ConfigDict(json_schema_extra=_without_plan_only_keys)
    recording_radius_mm: Annotated[float, Field(gt=0, exclude=True)] = \
        SequenceSpec.model_fields["recording_radius_mm"].default
    ensemble: Annotated[bool, Field(exclude=True)] = False

    @model_validator(mode="before")
    @classmethod
    def _refuse_plan_only_keys(cls, data):
        return _refuse_keys(data, _NOT_IN_SEQUENCES)


def _without_fit_fraction(schema: dict) -> None:
    """The JSON Schema of :class:`SequenceDecoderFile` leaves out the common ``fit_fraction`` it refuses."""
    schema["properties"].pop("fit_fraction", None)


class SequenceDecoderFile(DecoderFile):
    """``[decoder]`` of a sequence_2afc experiment: the common keys (``C``, ``layer``, ``max_iter``) and the
    noisy copies of :class:`TaskSpec`; ``fit_fraction`` does not apply."""

    model_config = ConfigDict(json_schema_extra=_without_fit_fraction)
    fit_fraction: Annotated[float, Field(gt=0, lt=1, exclude=True)] = 0.5  # refused in files, kept out of dumps
    n_noise: Annotated[int, Field(ge=2)] = TaskSpec.model_fields["n_noise"].default
    n_eval: Annotated[int, Field(ge=2)] = TaskSpec.model_fields["n_eval"].default
    noise_sd: Annotated[float, Field(gt=0)] = TaskSpec.model_fields["noise_sd"].default

    @model_validator(mode="before")
    @classmethod
    def _refuse_fit_fraction(cls, data):
        return _refuse_keys(data, _NOT_IN_DECODER)


@dataclass(frozen=True)
class SequenceOptions:
    """The sequences' keys (``[sequences]``, without the recording radius, which comes from ``[sites]``) and
    the 2AFC decoder (:class:`TaskSpec`)."""

    sequences: dict
    task: TaskSpec

    def sequence_spec(self, recording_radius_mm: float) -> SequenceSpec:
        """The :class:`~stimsim.sequences.SequenceSpec` with a site's pooled response over ``recording_radius_mm``."""
        return SequenceSpec(**self.sequences, recording_radius_mm=recording_radius_mm)


def parse_options(tables: dict, where: str) -> SequenceOptions:
    """Options from the validated ``[sequences]`` and ``[decoder]`` tables; ``where`` names the file."""
    sequences = tables["sequences"].model_dump()
    decoder = tables["decoder"]
    task = TaskSpec(n_noise=decoder.n_noise, n_eval=decoder.n_eval, noise_sd=decoder.noise_sd, C=decoder.C)
    return SequenceOptions(sequences=sequences, task=task)


# --- trials ------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SequenceTrials:
    """Every site's sequences, their frozen readouts and the noisy test images.

    * site_labels : the sites whose tuning the sequences follow, in order.
    * sequences : the :class:`~stimsim.sequences.SequenceSet` (images (n_sites, n_sequences, n_steps, H, W[, 3])).
    * test_images : (n_sites, n_sequences · n_steps · n_eval, H, W[, 3]) in :func:`evaluation_images` order.
    * readouts : one readout per (site, sequence), index ``site · n_sequences + sequence``, bound to every test
      image in order.
    * noise_sd : (n_sites, n_sequences) each site's response SD over the noisy end copies; slope_to_noise likewise.
    """

    site_labels: tuple[str, ...]
    sequences: SequenceSet
    sequence_spec: SequenceSpec
    task: TaskSpec
    test_images: np.ndarray
    readouts: SequenceReadouts
    noise_sd: np.ndarray
    slope_to_noise: np.ndarray
    start_stimulus_id: np.ndarray
    response_layer: str

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(n_sites, n_sequences, n_steps, n_eval)."""
        n_sites, n_seq, n_steps = self.sequences.images.shape[:3]
        return n_sites, n_seq, n_steps, self.task.n_eval

    @property
    def images(self) -> list:
        return list(self.test_images.reshape(-1, *self.test_images.shape[2:]))

    def site_stimulus_ids(self, site: int) -> np.ndarray:
        """Ids of one site's test images: ``<site>_seq<j>_step<k>_copy<c>``."""
        _, n_seq, n_steps, n_eval = self.shape
        label = self.site_labels[site]
        return np.array([f"{label}_seq{j}_step{k}_copy{c}" for j in range(n_seq) for k in range(n_steps)
                         for c in range(n_eval)])

    def site_stimulus_coords(self, site: int) -> dict:
        """Labels of one site's test images: ``stimulus_site``, ``stimulus_sequence``, ``stimulus_step``,
        ``stimulus_copy``."""
        _, n_seq, n_steps, n_eval = self.shape
        j, k, c = np.meshgrid(np.arange(n_seq), np.arange(n_steps), np.arange(n_eval), indexing="ij")
        return {"stimulus_site": np.full(j.size, self.site_labels[site]), "stimulus_sequence": j.ravel(),
                "stimulus_step": k.ravel(), "stimulus_copy": c.ravel()}

    @property
    def stimulus_ids(self) -> np.ndarray:
        return np.concatenate([self.site_stimulus_ids(s) for s in range(len(self.site_labels))])

    @property
    def stimulus_coords(self) -> dict:
        parts = [self.site_stimulus_coords(s) for s in range(len(self.site_labels))]
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def site_decoder(self, site: int) -> SequenceReadouts:
        """The readouts of one site's test images."""
        _, n_seq, n_steps, n_eval = self.shape
        return site_readouts(self.readouts, site, n_seq, n_steps, n_eval)

    @property
    def decoder(self) -> SequenceReadouts:
        _, n_seq, n_steps, n_eval = self.shape
        return self.readouts.subset(np.arange(len(self.site_labels) * n_seq),
                                    np.repeat(np.arange(len(self.site_labels) * n_seq), n_steps * n_eval))

    @property
    def frozen_decoder(self) -> SequenceReadouts:
        return self.decoder

    def record(self) -> dict:
        """What to store about the sequences and the decoders (JSON-friendly)."""
        n_sites, n_seq, n_steps, n_eval = self.shape
        return {
            "n_sites": n_sites, "n_sequences": n_seq, "n_steps": n_steps, "n_eval": n_eval,
            "n_test_images": int(n_sites * n_seq * n_steps * n_eval),
            "sequences": self.sequence_spec.to_dict(), "task": self.task.to_dict(),
            "decoder_layer": self.readouts.layer, "response_layer": self.response_layer,
            "start_stimulus_ids": {label: ids.tolist() for label, ids in zip(self.site_labels, self.start_stimulus_id)},
        }


def prepare(task, model, stimuli, selection: SiteSelection, progress: bool = False) -> SequenceTrials:
    """Sequences along every selected site's tuning from the experiment's images, the frozen readouts, and
    the noisy test images (seeded by the experiment's ``seed`` as a plan seeds its rehearsal)."""
    options = task.options
    layer = model.resolve_layer(task.layer)
    labels = tuple(site.label for site in selection.sites)
    sites = np.array([site.position_mm for site in selection.sites], dtype=np.float64).reshape(-1, 2)
    sequence_spec = options.sequence_spec(task.sites.recording_radius_mm)
    check_image_memory(task.source, options.task, model, len(sites), sequence_spec)
    try:
        sequences = build_sequences(model, sites, stimuli.images, sequence_spec, layer=layer, seed=task.seed,
                                    progress=progress)
    except ConfigError as exc:
        raise ConfigError(f"{task.source} [sequences]: {exc}") from None
    pool = pooling_matrix(model.sheet(layer), sites, sequence_spec.recording_radius_mm)
    readouts, noise_sd = fit_readouts(model, sequences.images, pool, options.task, seed=task.seed,
                                      layer=task.decoder.layer, progress=progress, max_iter=task.decoder.max_iter,
                                      response_layer=layer)
    rng = np.random.default_rng([task.seed, EVAL_NOISE_STREAM])
    test_images = np.stack([evaluation_images(sequences.images[s], options.task, rng) for s in range(len(sites))])
    return SequenceTrials(site_labels=labels, sequences=sequences, sequence_spec=sequence_spec, task=options.task,
                          test_images=test_images, readouts=readouts, noise_sd=noise_sd,
                          slope_to_noise=slope_to_noise(sequences.site_response, noise_sd),
                          start_stimulus_id=np.asarray(stimuli.stimulus_id)[sequences.start_index],
                          response_layer=layer)


def check_image_memory(where: str, spec: TaskSpec, model, n_sites: int, sequence_spec: SequenceSpec,
                       tested_sites: int | None = None) -> None:
    """Refuse (ConfigError naming ``where``), before any work, counts whose images cannot fit in memory: every
    site's sequences and the noisy test images of ``tested_sites`` sites at once (default all; float32 at the
    model's input size), and one site's float64 noise draws."""
    pixels = model.preprocessing.size_px ** 2 * model.preprocessing.channels
    per_site = sequence_spec.n_sequences * sequence_spec.n_steps
    tested = n_sites if tested_sites is None else tested_sites
    stored = 4 * pixels * per_site * (n_sites + tested * spec.n_eval)
    drawn = 3 * 8 * pixels * max(per_site * spec.n_eval, 2 * sequence_spec.n_sequences * spec.n_noise)
    check_memory(f"{where}: holding the 2AFC images ({n_sites} sites × {sequence_spec.n_sequences} sequences × "
                 f"{sequence_spec.n_steps} steps, {spec.n_eval} noisy test copies and {spec.n_noise} fitting copies "
                 f"of each, {model.preprocessing.size_px} px)", stored + drawn,
                 "[decoder] n_eval or n_noise, or [sequences] n_sequences or n_steps")


def simulate(trials: SequenceTrials, model, conditions: list, store, progress: bool,
             **engine_options) -> xr.DataArray:
    """Every site's test images under every condition, one engine call per site (its images, its readouts;
    resumable through ``store/<site>``), concatenated along ``stimulus_id``. Each call is exactly the sweep
    of a plan's rehearsal at that site, so a site's effect on its own sequences equals the plan's."""
    from stimsim.engine import simulate as engine_simulate

    parts = []
    for site, label in enumerate(tqdm(trials.site_labels, desc="sites", unit="site", disable=not progress)):
        parts.append(engine_simulate(
            model, list(trials.test_images[site]), conditions, trials.site_decoder(site),
            stimulus_ids=trials.site_stimulus_ids(site), stimulus_coords=trials.site_stimulus_coords(site),
            store=None if store is None else store / label, progress=False, **engine_options))
    return xr.concat(parts, dim="stimulus_id", coords="minimal", compat="override", join="exact")


# --- analysis ----------------------------------------------------------------------------------------
def step_auc(p_high: np.ndarray, n_steps: int) -> float:
    """How well P(high) of single test images orders the steps: the probability that an image from the high
    half of a sequence (step > middle) has a larger P(high) than one from the low half (Mann–Whitney AUC;
    ties count one half). ``p_high``: (..., n_steps, n_eval). Chance 0.5; 1 = every high-half image above
    every low-half image."""
    from sklearn.metrics import roc_auc_score

    middle = n_steps // 2
    low = p_high[..., :middle, :].ravel()
    high = p_high[..., middle + 1:, :].ravel()
    truth = np.concatenate([np.zeros(low.size), np.ones(high.size)])
    return float(roc_auc_score(truth, np.concatenate([low, high])))


def analyse(task, trials: SequenceTrials, probabilities: xr.DataArray,
            selection: SiteSelection) -> tuple[xr.Dataset, dict]:
    """ΔAUC of every stimulated site on every site's sequences; per site its own effect (the plan's number)
    and its effect elsewhere; the locality summary. ``probabilities``: the control condition and one
    condition per site, labelled as the sites."""
    labels = [site.label for site in selection.sites]
    if tuple(labels) != trials.site_labels:
        raise ValueError(f"the trials were prepared for sites {trials.site_labels}, the analysis got {labels}")
    n_sites, n_seq, n_steps, n_eval = trials.shape
    conditions = [CONTROL_LABEL] + labels
    p = probabilities.sel(condition=conditions, choice="high", stimulus_id=trials.stimulus_ids).values
    per_image = p.reshape(len(conditions), n_sites, n_seq, n_steps, n_eval)
    curves = p_high_curves(p.reshape(len(conditions), n_sites, -1), n_seq, n_steps, n_eval)  # (cond, seq site, seq, step)
    effect = sequence_delta_auc(curves[1:], np.broadcast_to(curves[:1], curves[1:].shape))  # (site, seq site, seq)
    own = effect[np.arange(n_sites), np.arange(n_sites)]  # (site, seq)
    other = ~np.eye(n_sites, dtype=bool)
    with np.errstate(invalid="ignore"):
        cross = np.where(other[:, :, None], effect, np.nan)
        cross_mean = np.nanmean(cross, axis=(1, 2)) if n_sites > 1 else np.full(n_sites, np.nan)
        cross_abs = np.nanmean(np.abs(cross), axis=(1, 2)) if n_sites > 1 else np.full(n_sites, np.nan)
    own_abs = np.abs(own).mean(axis=1)
    control_step_auc = np.array([step_auc(per_image[0, s], n_steps) for s in range(n_sites)])
    image_dims = ("y", "x") if trials.sequences.images.ndim == 5 else ("y", "x", "channel")
    variables = {
        "p_high": (("condition", "sequence_site", "sequence", "step"), curves),
        "delta_auc": (("site", "sequence_site", "sequence"), effect),
        "delta_auc_matrix": (("site", "sequence_site"), effect.mean(axis=2)),
        "own_delta_auc": ("site", own.mean(axis=1)),
        "own_delta_auc_per_sequence": (("site", "sequence"), own),
        "own_abs_delta_auc": ("site", own_abs),
        "cross_delta_auc": ("site", cross_mean),
        "cross_abs_delta_auc": ("site", cross_abs),
        "control_step_auc": ("sequence_site", control_step_auc),
        "slope_to_noise": (("sequence_site", "sequence"), trials.slope_to_noise),
        "response_noise_sd": (("sequence_site", "sequence"), trials.noise_sd),
        "sequence_response": (("sequence_site", "sequence", "step"), trials.sequences.site_response),
        "sequence_response_change_sd": (("sequence_site", "sequence", "step"), trials.sequences.response_change_sd),
        "sequence_others_change_sd": (("sequence_site", "sequence", "step"), trials.sequences.others_change_sd),
        "sequence_image": (("sequence_site", "sequence", "step") + image_dims, trials.sequences.images),
        "start_stimulus_id": (("sequence_site", "sequence"), trials.start_stimulus_id.astype(object)),
    }
    dataset = xr.Dataset(variables, coords={"condition": conditions, "site": labels, "sequence_site": labels,
                                            "sequence": np.arange(n_seq), "step": np.arange(n_steps)})
    for name in ("delta_auc", "delta_auc_matrix", "own_delta_auc", "own_delta_auc_per_sequence", "cross_delta_auc"):
        dataset[name].attrs.update(units="AUC (steps scaled to [0, 1])",
                                   description="stimulated − control; 0 without effect")
    for name in ("own_abs_delta_auc", "cross_abs_delta_auc"):
        dataset[name].attrs.update(units="AUC (steps scaled to [0, 1])",
                                   description="|stimulated − control| averaged over sequences; 0 without effect")
    for name, description in (("sequence_response", "the sequence site's pooled response at every step"),
                              ("response_noise_sd", "SD of the sequence site's response over repeated noisy "
                                                    "presentations")):
        dataset[name].attrs.update(units="model activation", description=description)
    for name in ("sequence_response_change_sd", "sequence_others_change_sd"):
        dataset[name].attrs.update(units="natural SDs", description="change of the site's (others': RMS) response "
                                                                    "from the start image")
    dataset["control_step_auc"].attrs.update(description="P(high) orders the high half of the steps above the low "
                                                          "half, without stimulation; chance 0.5")
    analysis = task.analysis
    summary = {"n_sites": n_sites, "n_sequences": n_seq, "n_steps": n_steps, "n_eval": n_eval,
               "n_test_images": int(n_sites * n_seq * n_steps * n_eval), "delta_auc_chance": 0.0,
               "control_step_auc_mean": float(control_step_auc.mean()), "control_step_auc_chance": 0.5}
    for name, values in (("own_delta_auc", own.mean(axis=1)), ("cross_delta_auc", cross_mean),
                         ("own_abs_delta_auc", own_abs), ("cross_abs_delta_auc", cross_abs),
                         ("locality_abs_delta_auc", own_abs - cross_abs)):
        result = stratum_mean(values, analysis.n_boot, analysis.ci, task.seed)
        summary[f"mean_{name}"], summary[f"mean_{name}_ci"] = result["mean"], result["ci"]
    summary["locality_baseline"] = 0.0
    summary["median_slope_to_noise"] = float(np.nanmedian(trials.slope_to_noise))
    change = trials.sequences.response_change_sd
    summary["sequence_response_change_sd"] = float(np.median(change[:, :, -1] - change[:, :, 0]))
    summary["sequence_others_change_sd"] = float(np.median(trials.sequences.others_change_sd[:, :, [0, -1]]))
    summary["own_delta_auc"] = {label: float(v) for label, v in zip(labels, own.mean(axis=1))}
    summary["cross_abs_delta_auc"] = {label: float(v) for label, v in zip(labels, cross_abs)}
    return dataset, summary


# --- figures -----------------------------------------------------------------------------------------
def plot_delta_auc_matrix(results: xr.Dataset, path, title: str) -> None:
    """ΔAUC (mean over sequences) of every stimulated site (rows) on every site's sequences (columns); the
    diagonal is each site's own effect. PNG at ``path``."""
    plt = pyplot()
    matrix = results["delta_auc_matrix"].values
    labels = [str(v) for v in results["site"].values]
    limit = float(np.nanmax(np.abs(matrix))) or 1.0
    size = 2.2 + 0.45 * len(labels)
    fig, ax = plt.subplots(figsize=(size + 1.2, size))
    image = ax.imshow(matrix, cmap="RdBu_r", vmin=-limit, vmax=limit)
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set(xlabel="sequences of site", ylabel="stimulated site", title=title)
    for i in range(len(labels)):
        for j in range(len(labels)):
            ax.text(j, i, f"{matrix[i, j]:+.3f}", ha="center", va="center", fontsize=6)
    fig.colorbar(image, ax=ax, label="ΔAUC (stimulated − control; 0 = no effect)")
    fig.tight_layout()
    save_figure(fig, path)


def plot_p_high_steps(results: xr.Dataset, path, title: str, n_sites: int = 4) -> None:
    """P(high) along the steps (mean over sequences) without stimulation and with stimulation at the site
    the sequences follow (top), and their difference (bottom; 0 = no effect), for the ``n_sites`` sites
    with the largest absolute own ΔAUC. PNG at ``path``."""
    plt = pyplot()
    own = results["own_delta_auc"].values
    order = np.argsort(-np.abs(own))[:n_sites]
    steps = results["step"].values
    fig, axes = plt.subplots(2, len(order), figsize=(3.0 * len(order), 5.2), squeeze=False, sharex=True,
                             sharey="row", gridspec_kw={"height_ratios": (3, 2)})
    for column, index in enumerate(order):
        label = str(results["site"].values[index])
        curves = results["p_high"].sel(sequence_site=label)
        control = curves.sel(condition=CONTROL_LABEL).mean("sequence").values
        stimulated = curves.sel(condition=label).mean("sequence").values
        top, bottom = axes[0, column], axes[1, column]
        top.plot(steps, control, "o-", color="k", label="no stimulation")
        top.plot(steps, stimulated, "o--", color="tab:red", label=f"stimulated at {label}")
        top.axhline(0.5, color="grey", lw=0.6, ls=":")
        top.set(title=f"{label}: ΔAUC {own[index]:+.4f}", ylim=(-0.02, 1.02))
        top.legend(fontsize=6, loc="upper left")
        bottom.plot(steps, stimulated - control, "o-", color="tab:red")
        bottom.axhline(0.0, color="grey", lw=0.6, ls=":")
        bottom.set(xlabel="step (low → high)")
    axes[0, 0].set_ylabel("P(high)")
    axes[1, 0].set_ylabel("Δ P(high), stimulated − control")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def plot_sequences(results: xr.Dataset, path, title: str, n_sites: int = 4) -> None:
    """The first sequence of the first ``n_sites`` sites, low end to high end. PNG at ``path``."""
    plt = pyplot()
    images = results["sequence_image"].isel(sequence=0)
    labels = [str(v) for v in results["sequence_site"].values[:n_sites]]
    n_steps = images.sizes["step"]
    fig, axes = plt.subplots(len(labels), n_steps, figsize=(1.1 * n_steps, 1.2 * len(labels)), squeeze=False)
    for row, label in enumerate(labels):
        for k in range(n_steps):
            ax = axes[row, k]
            ax.imshow(images.sel(sequence_site=label).isel(step=k).values, cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if k == 0:
                ax.set_ylabel(label, fontsize=7)
            if row == 0:
                ax.set_title(f"step {k}", fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


@register_paradigm("sequence_2afc")
class Sequence2AFC(Paradigm):
    """2AFC between the ends of image sequences along each site's tuning: ΔAUC per site, on its own
    sequences and on the other sites' (Mehrer et al. 2025)."""

    table_models = {"sequences": SequencesFile, "decoder": SequenceDecoderFile}

    def parse(self, stimuli, tables: dict, where: str) -> SequenceOptions:
        return parse_options(tables, where)

    def labels(self, task) -> set[str]:
        return set()

    def prepare(self, task, model, stimuli, selection, progress=False):
        return prepare(task, model, stimuli, selection, progress)

    def simulate(self, task, model, trials, conditions, store, progress, **engine_options):
        return simulate(trials, model, conditions, store, progress, **engine_options)

    def analyse(self, task, trials, probabilities, selection):
        return analyse(task, trials, probabilities, selection)

    def figures(self, task, results, out_dir) -> None:
        plot_delta_auc_matrix(results, out_dir / "delta_auc_matrix.png", f"{task.name}: ΔAUC per site and sequence")
        plot_p_high_steps(results, out_dir / "p_high_steps.png", f"{task.name}: P(high) along the sequences")
        plot_sequences(results, out_dir / "sequences.png", f"{task.name}: first sequence per site (low → high)")
