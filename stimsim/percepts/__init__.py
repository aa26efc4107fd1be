"""Predicted percepts: feature inversion under stimulation.

For one image and a list of perturbation effects, :func:`synthesize` looks for the images whose
*unperturbed* activity at the perturbed layer (or a chosen later layer) best matches the *perturbed*
activity of the original image: the image the network would have to see to be in the state that
stimulation puts it in (feature inversion, Mahendran & Vedaldi 2015, CVPR; under stimulation as in
Mehrer et al. 2025, arXiv 2510.03684, where a generative decoder of IT showed "facephenes").

The search starts from the image itself and runs gradient descent on its change from it (Adam, or steps
scaled by the gradient's RMS over the whole batch, so that a condition far from its target moves more than
one near it), through every stage up to the matched layer; the change is made per pixel, or as a
1/f-weighted spectrum so that it is mostly of low spatial frequency (Olah et al. 2017), on every colour
channel or as one luminance change. Image priors keep the result an image (Olah, Mordvintsev & Schubert
2017, Distill): pixels stay in [0, 1] (projected after every step), a total-variation penalty favours
smooth images, and every step sees the image shifted by a random jitter of up to ``jitter_px`` pixels,
so that no pattern tied to exact pixel positions can satisfy the match. All conditions of an image are
optimised in one batch; the jitter is drawn from ``seed``, so a run on the CPU is reproducible.

Controls: :func:`scrambled_effects` gives the same per-unit changes to randomly permuted units (the
spatial structure of stimulation removed, its total amount kept); the unperturbed effect (identity)
measures the inversion's own drift. :class:`FaceJudge` scores images by a frozen face decoder.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from stimsim.behavior.decoders import LogisticDecoder
from stimsim.stimulation.base import apply_effect
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.filemodels import FileModel

#: What the inversion matches: the activity, or its pattern over the units (see :class:`InversionSettings`).
MATCHES = ("euclidean", "pattern")
#: How a step is taken (see :class:`InversionSettings`).
OPTIMIZERS = ("adam", "batch_normalized")
#: What the search changes (see :class:`InversionSettings`).
PARAMETRIZATIONS = ("pixels", "fourier")


class InversionSettings(FileModel):
    """How the inversion searches (a visualisation file's ``[inversion]`` table).

    steps : gradient steps per image; learning_rate : step size in pixel units ([0, 1] range; at most 1);
    optimizer : ``"adam"`` (Adam: every pixel's step normalised on its own, so that even a tiny gradient makes a
    full step) or ``"batch_normalized"`` (the gradient divided by its RMS over all pixels of all conditions of
    the batch: a condition moves in proportion to how strongly its mismatch pulls);
    tv_weight : weight of the total-variation prior (mean absolute difference of neighbouring pixels)
    against the activity match (mean squared error over the layer's units, in units of the unperturbed
    activity's mean square); jitter_px : largest random shift (pixels) applied before every step;
    blur_sigma_px : σ (pixels) of a Gaussian blur applied to the change from the original image after every
    step (0: none), a prior against the high spatial frequencies a network's gradient is rich in;
    match : ``"euclidean"`` (the activity itself) or ``"pattern"`` (the activity less its mean over the units:
    a change common to every unit is not matched, only how the change is distributed over the sheet);
    parametrization : what the search changes: ``"pixels"`` (every pixel on its own) or ``"fourier"`` (the
    change's 2-D spectrum, each frequency f (cycles/pixel) weighted by f^−``spectrum_decay``, the weights
    scaled to an RMS of 1: a step of the same size moves mostly low spatial frequencies, as in Olah et al.
    2017's decorrelated image parametrisation; pixels are then clipped to [0, 1] rather than projected, and
    the blur prior does not apply); gray_change : one change for all colour channels (a luminance change:
    gray images stay gray, no colour noise), rather than one per channel.
    """

    table: ClassVar[str] = "inversion"

    steps: Annotated[int, Field(ge=1)] = 100
    learning_rate: Annotated[float, Field(gt=0, le=1)] = 0.02
    tv_weight: Annotated[float, Field(ge=0)] = 0.05
    jitter_px: Annotated[int, Field(ge=0)] = 4
    blur_sigma_px: Annotated[float, Field(ge=0)] = 0.0
    match: Literal[MATCHES] = "euclidean"
    optimizer: Literal[OPTIMIZERS] = "adam"
    parametrization: Literal[PARAMETRIZATIONS] = "pixels"
    spectrum_decay: Annotated[float, Field(ge=0)] = 1.0
    gray_change: bool = False

    @model_validator(mode="after")
    def _one_smoothness_prior(self):
        if self.parametrization == "fourier" and self.blur_sigma_px > 0:
            raise ValueError("blur_sigma_px applies to parametrization = 'pixels'; the 'fourier' parametrization's "
                             "1/f weights are its prior against high spatial frequencies (set blur_sigma_px = 0)")
        return self

    def check_image_size(self, size_px: int) -> None:
        """The priors must fit images of ``size_px`` pixels: the jitter shifts (rolls) them by less than their size,
        the blur reaches 3σ to each side, and the spectrum's weights, up to size_px^``spectrum_decay``, are squared
        in float32."""
        if self.jitter_px >= size_px:
            raise ConfigError(f"jitter_px = {self.jitter_px} px shifts the model's {size_px}-px images by their size "
                              f"or more (a shift wraps them round); give at most {size_px - 1}")
        if self.blur_sigma_px > 0 and _blur_radius(self.blur_sigma_px) >= size_px:
            raise ConfigError(f"blur_sigma_px = {self.blur_sigma_px:g} px reaches 3σ = "
                              f"{_blur_radius(self.blur_sigma_px)} px to each side, beyond the model's {size_px}-px "
                              f"images; give at most {(size_px - 1) / 3:.3g}")
        if self.parametrization == "fourier":
            weight = _spectrum_weights(size_px, size_px, self.spectrum_decay)
            if not (torch.isfinite(weight).all() and weight.abs().max() > 0):
                # the sum of the size_px² squared weights, each at most size_px^(2·decay), within float32
                largest = (math.log10(torch.finfo(torch.float32).max) - 2 * math.log10(size_px)) \
                    / (2 * math.log10(size_px))
                raise ConfigError(f"spectrum_decay = {self.spectrum_decay:g} weights the spectrum of the model's "
                                  f"{size_px}-px images beyond float32's range; give at most "
                                  f"{math.floor(largest * 10) / 10:g}")


def scrambled_effects(multiplier: torch.Tensor, additive: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Effects (K, N) whose per-unit changes are given to randomly permuted units: unit ``perm[i]`` gets
    what unit ``i`` got (one permutation per row, drawn from ``seed``). Every value of a row is kept, so
    the total change is the same; only where it lands differs."""
    generator = torch.Generator().manual_seed(int(seed))
    rows = [torch.randperm(multiplier.shape[1], generator=generator) for _ in range(multiplier.shape[0])]
    m, a = torch.empty_like(multiplier), torch.empty_like(additive)
    for row, perm in enumerate(rows):
        perm = perm.to(multiplier.device)
        m[row, perm] = multiplier[row]
        a[row, perm] = additive[row]
    return m, a


def pixel_images(model, images) -> torch.Tensor:
    """Images at the model's input geometry, not normalised: (N, channels, size_px, size_px) in [0, 1]."""
    arrays = model.preprocessing.geometry(images)
    batch = torch.from_numpy(np.stack(arrays)).to(torch.float32)
    return batch[:, None] if batch.ndim == 3 else batch.permute(0, 3, 1, 2).contiguous()


def _normalise(model, pixels: torch.Tensor) -> torch.Tensor:
    p = model.preprocessing
    mean = torch.tensor(p.mean, dtype=pixels.dtype, device=pixels.device).view(1, -1, 1, 1)
    std = torch.tensor(p.std, dtype=pixels.dtype, device=pixels.device).view(1, -1, 1, 1)
    return (pixels - mean) / std


def _run(model, x: torch.Tensor, stop: str, start: str | None = None) -> torch.Tensor:
    """The stages after ``start`` up to ``stop``, with gradients (``model.run_stages`` runs without)."""
    names = model.stage_names
    first = 0 if start is None else names.index(start) + 1
    for _, module in model.stages[first:names.index(stop) + 1]:
        x = module(x)
    return x


def _matched(activity: torch.Tensor, match: str) -> torch.Tensor:
    """(K, N) activity as matched: itself, or less its mean over the N units."""
    return activity - activity.mean(1, keepdim=True) if match == "pattern" else activity


def _gaussian_blur(sigma_px: float, channels: int, device):
    """A function blurring (K, channels, H, W) images with a Gaussian of σ = ``sigma_px`` (separable, 3σ wide,
    edges reflected)."""
    radius = _blur_radius(sigma_px)
    taps = torch.exp(-torch.arange(-radius, radius + 1, dtype=torch.float32) ** 2 / (2 * sigma_px ** 2))
    taps = (taps / taps.sum()).to(device)
    rows = taps.view(1, 1, 1, -1).repeat(channels, 1, 1, 1)
    columns = taps.view(1, 1, -1, 1).repeat(channels, 1, 1, 1)

    def blur(x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.pad(x, (radius, radius, radius, radius), mode="reflect")
        x = torch.nn.functional.conv2d(x, rows, groups=channels)
        return torch.nn.functional.conv2d(x, columns, groups=channels)

    return blur


def _spectrum_weights(height: int, width: int, decay: float, device="cpu") -> torch.Tensor:
    """Weights (height, width // 2 + 1) of the change's spectrum: each frequency f (cycles/pixel, at least
    1 / max(height, width)) weighted by f^−``decay``, scaled to an RMS of 1."""
    fy = torch.fft.fftfreq(height, device=device)[:, None]
    fx = torch.fft.rfftfreq(width, device=device)[None, :]
    frequency = torch.sqrt(fx ** 2 + fy ** 2).clamp_min(1.0 / max(height, width))
    weight = frequency ** -decay
    return (weight / weight.square().mean().sqrt()).to(torch.float32)


def _blur_radius(sigma_px: float) -> int:
    """Half-width (pixels) of the Gaussian blur of σ = ``sigma_px``: 3σ, at least 1."""
    return max(1, int(np.ceil(3 * sigma_px)))


def _total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of vertically and horizontally neighbouring pixels, per image (K,)."""
    dy = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
    dx = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1)
    return dy + dx


def matched_layer(model, layer: str, match_layer: str | None) -> str:
    """The stage whose activity the inversion matches: ``match_layer`` resolved (default ``layer``), which must not
    come before the perturbed ``layer``."""
    match_layer = layer if match_layer is None else model.resolve_layer(match_layer)
    names = model.stage_names
    if names.index(match_layer) < names.index(layer):
        raise ConfigError(f"match_layer {match_layer!r} comes before the perturbed layer {layer!r}; match the "
                          "perturbed layer or a later one")
    return match_layer


def synthesize(model, image: torch.Tensor, multiplier: torch.Tensor, additive: torch.Tensor, layer: str,
               match_layer: str | None = None, settings: InversionSettings = InversionSettings(),
               seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """The images whose unperturbed activity best matches the perturbed activity of ``image``.

    Parameters
    ----------
    model : a ``TopographicModel`` (its weights are not changed).
    image : (channels, size_px, size_px) pixels in [0, 1] (see :func:`pixel_images`).
    multiplier, additive : (K, N) effects on the N units of ``layer`` (``Condition.batch_effects``), one
        row per condition; all K are optimised in one batch.
    layer : the perturbed layer; match_layer : the layer whose activity is matched (default ``layer``;
        a later stage: the perturbed activity is run through the stages in between first).
    settings : :class:`InversionSettings`; seed : seed of the jitter.

    Returns
    -------
    (images (K, channels, size_px, size_px) in [0, 1] on the CPU, final match loss per condition (K,)).
    """
    layer = model.resolve_layer(layer)
    match_layer = matched_layer(model, layer, match_layer)
    settings.check_image_size(image.shape[-1])
    device = model.device
    k = multiplier.shape[0]
    start = image.to(device=device, dtype=torch.float32)[None]
    parameters = list(model.network.parameters())
    trainable = [p.requires_grad for p in parameters]
    for p in parameters:
        p.requires_grad_(False)
    try:
        with torch.no_grad():
            # computed on K copies, as the search computes: the same batch shape gives the same numbers, so an
            # unperturbed condition starts at a loss of exactly 0 (Adam would turn rounding noise into steps)
            copies = _normalise(model, start.repeat(k, 1, 1, 1))
            activity = _run(model, copies, layer)
            shape = activity.shape[1:]
            perturbed = apply_effect(activity.flatten(1), multiplier.to(device, torch.float32),
                                     additive.to(device, torch.float32)).reshape((k,) + tuple(shape))
            target = perturbed if match_layer == layer else _run(model, perturbed, match_layer, start=layer)
            target = _matched(target.flatten(1), settings.match)
            unperturbed = activity if match_layer == layer else _run(model, activity, match_layer, start=layer)
            unperturbed = _matched(unperturbed.flatten(1), settings.match)
            scale = float(unperturbed.square().mean()) or 1.0
            if not torch.isfinite((unperturbed - target).square().sum(1)).all():
                raise ConfigError(f"[stimulation]: the stimulated activity of {match_layer!r} lies too far from the "
                                  "unstimulated activity to be matched in float32 (their squared distance overflows); "
                                  "lower activation_per_Hz")
        change = _ChangeParametrization(settings, k, start.shape[1:], device)
        optimiser = torch.optim.Adam([change.values], lr=settings.learning_rate) if settings.optimizer == "adam" else None
        generator = torch.Generator().manual_seed(int(seed))
        j = settings.jitter_px
        blur = _gaussian_blur(settings.blur_sigma_px, start.shape[1], device) if settings.blur_sigma_px > 0 else None
        for _ in range(settings.steps):
            shift = torch.randint(-j, j + 1, (2,), generator=generator).tolist() if j else [0, 0]
            pixels = change.images(start)
            seen = torch.roll(pixels, shifts=shift, dims=(2, 3))
            features = _matched(_run(model, _normalise(model, seen), match_layer).flatten(1), settings.match)
            match = (features - target).square().mean(1) / scale
            loss = (match + settings.tv_weight * _total_variation(pixels)).sum()
            change.values.grad = None
            loss.backward()
            with torch.no_grad():
                if optimiser is not None:
                    optimiser.step()
                else:
                    rms = change.values.grad.square().mean().sqrt()
                    if rms > 0:
                        change.values.sub_(settings.learning_rate * change.values.grad / rms)
                if blur is not None:
                    change.values.copy_(blur(change.values))
                change.project(start)
        pixels = change.images(start).detach()
        if not torch.isfinite(pixels).all():
            raise ConfigError("[inversion]: the images hold values that are not finite after the inversion's steps: "
                              "tv_weight or learning_rate is too large for float32")
        with torch.no_grad():
            features = _matched(_run(model, _normalise(model, pixels), match_layer).flatten(1), settings.match)
            final = ((features - target).square().mean(1) / scale).cpu().numpy().astype(np.float64)
    finally:
        for p, flag in zip(parameters, trainable):
            p.requires_grad_(flag)
    return pixels.detach().cpu(), final


class _ChangeParametrization:
    """The change from the start image that the search optimises: per pixel, or as a 1/f-weighted Fourier
    spectrum (Olah et al. 2017: steps favour low spatial frequencies); on every channel, or one luminance
    change shared by all channels."""

    def __init__(self, settings: InversionSettings, k: int, image_shape, device):
        channels, height, width = image_shape
        self.settings = settings
        self.channels = channels
        shared = 1 if settings.gray_change else channels
        if settings.parametrization == "fourier":
            self.weight = _spectrum_weights(height, width, settings.spectrum_decay, device)
            self.size = (height, width)
            self.values = torch.zeros((k, shared, height, width // 2 + 1, 2), device=device, requires_grad=True)
        else:
            self.values = torch.zeros((k, shared, height, width), device=device, requires_grad=True)

    def change(self) -> torch.Tensor:
        """The change (K, channels, H, W) in pixel units."""
        if self.settings.parametrization == "fourier":
            spectrum = torch.view_as_complex(self.values) * self.weight
            delta = torch.fft.irfft2(spectrum, s=self.size, norm="ortho")
        else:
            delta = self.values
        return delta.expand(-1, self.channels, -1, -1) if delta.shape[1] != self.channels else delta

    def images(self, start: torch.Tensor) -> torch.Tensor:
        """The images (K, channels, H, W) in [0, 1]: ``start`` plus the change (clipped, for a spectrum)."""
        pixels = start + self.change()
        if self.settings.parametrization == "fourier":
            return pixels.clamp(0.0, 1.0)
        return pixels

    def project(self, start: torch.Tensor) -> None:
        """Keep per-pixel changes within the pixel range [0, 1]."""
        if self.settings.parametrization == "pixels":
            lo, hi = -start, 1.0 - start
            if self.values.shape[1] != self.channels:
                lo, hi = lo.max(1, keepdim=True).values, hi.min(1, keepdim=True).values
            self.values.copy_(torch.maximum(torch.minimum(self.values, hi), lo))


@dataclass(frozen=True, eq=False)
class FaceJudge:
    """A frozen face / non-face decoder on one model's layer: ``p_face(images)`` scores any images (each
    brought to the model's input geometry)."""

    model: object
    decoder: LogisticDecoder
    positive: str = "face"

    @classmethod
    def fit(cls, model, images, is_face, layer: str = "IT", C: float = 1e-3, seed: int = 0) -> "FaceJudge":
        """Fit the decoder on the unperturbed activity of ``layer`` for ``images`` (``is_face`` (n,) bool)."""
        layer = model.resolve_layer(layer)
        is_face = np.asarray(is_face, dtype=bool)
        if is_face.sum() < 2 or (~is_face).sum() < 2:
            raise ConfigError(f"a face decoder needs at least 2 face and 2 other images, got {int(is_face.sum())} "
                              f"and {int((~is_face).sum())}")
        features = model.activations(images, layer).numpy()
        labels = np.where(is_face, "face", "nonface")
        return cls(model=model, decoder=LogisticDecoder.fit(features, labels, layer=layer, C=C, seed=seed))

    def p_face(self, images) -> np.ndarray:
        """P(face) (n,) for images (anything ``model.preprocess`` takes, e.g. (n, H, W, C) arrays in [0, 1])."""
        features = self.model.activations(images, self.decoder.layer).numpy()
        return self.decoder.predict_proba(features)[:, self.decoder.choices.index(self.positive)]
