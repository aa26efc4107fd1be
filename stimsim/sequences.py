"""Image sequences along one site's tuning, made by gradient steps on the model's input.

Mehrer et al. 2025 (arXiv 2510.03684) rehearse every mapped electrode with 7-image sequences that move
the site's response along its tuning, up to ±5 SD of its natural range. They used a generative image
model; none is available offline, so stimsim optimises pixels directly, with image priors:

For each site and each start image ``x0`` (a natural image on which the site responds, with a response near
the median of its responses, so there is room both ways), two end images are optimised from ``x0`` by Adam
on the pixels:

    loss(x) = hinge((target − r_site(x)) · sign / SD_site)²                      reach the target level
              + others_weight · mean_j ((r_j(x) − r_j(x0)) / SD_j)²              other sites stay put
              + tv_weight · TV(x) + step_weight · mean((x − x0)²)                smooth, small changes

with ``target = r_site(x0) ± max_sd · SD_site`` (``+`` for the "high" end, ``−`` for "low"; the hinge
stops pushing once the target is passed), pixels kept in [0, 1] by projection after every step.
``r_site`` is the site's pooled response: the mean activity of the units within ``recording_radius_mm``
of its point on the sheet; SDs are over the natural images. The 7 steps are ``x0`` moved along the
straight pixel-space lines to the two ends (step 3 = ``x0``; steps 0 and 6 = the ends).

Limits: pixel-space optimisation finds small, texture-like changes the model responds to, not the
natural-looking morphs of a generative model; whether an animal's neurons follow them as the model's do
is exactly what the rehearsal is meant to be checked against. Levels are placed by first crossing, so responses along a sequence never step back; the achieved
responses are recorded with the sequences. Units silent for an image (ReLU) give no gradient, so the start
images are those on which the site responds (a sparse site is silent for most natural images, and started from
one of those its sequence could not move at all); a site that responds to fewer natural images than it needs
sequences starts the rest from images it is silent for, and those stay near ``x0``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, field_validator
from tqdm.auto import tqdm

from stimsim.utilities.errors import ConfigError
from stimsim.utilities.filemodels import FileModel


class SequenceSpec(FileModel):
    """How sequences are made (a plan's ``[sequences]`` table).

    * n_sequences : sequences per site (they stand in for trials with different images).
    * n_steps : images per sequence (odd; the middle one is the natural start image).
    * max_sd : target excursion of each end, in SDs of the site's response over the natural images.
    * iterations : Adam steps per end image; learning_rate : Adam step size (pixel units, [0, 1] range).
    * others_weight, tv_weight, step_weight : weights of the loss terms above.
    * recording_radius_mm : units within this distance of a site form its pooled response.
    * batch_images : images optimised together (memory and speed trade-off).
    * ensemble : optimise every end image for the site in every candidate model at once (the loss summed over
      the models given as ``companions`` to :func:`build_sequences`), so the sequences follow the tuning the
      instances share rather than one instance's idiosyncrasies.
    * precision : the number format the sequences are computed in. ``"float64"``: the same sequences with AVX2 and
      AVX-512 kernels. ``"float32"``: faster (in float64 a 224 px MobileNetV2 pass with its gradient took 2.4 times
      as long, the default plan's 32 px sequences 1.5 times), but the Adam steps amplify the float rounding of the
      network's products, which differs between processors' kernels, so the sequences, and every figure made from
      them, depend on the processor.
    """

    table: ClassVar[str] = "sequences"

    n_sequences: Annotated[int, Field(ge=1)] = 3
    n_steps: Annotated[int, Field(ge=3)] = 7
    max_sd: Annotated[float, Field(gt=0)] = 5.0
    iterations: Annotated[int, Field(ge=1)] = 40
    learning_rate: Annotated[float, Field(gt=0)] = 0.03
    others_weight: Annotated[float, Field(ge=0)] = 1.0
    tv_weight: Annotated[float, Field(ge=0)] = 0.02
    step_weight: Annotated[float, Field(ge=0)] = 0.5
    recording_radius_mm: Annotated[float, Field(gt=0)] = 0.5
    batch_images: Annotated[int, Field(ge=1)] = 256
    ensemble: bool = False
    precision: Literal["float64", "float32"] = "float64"

    @field_validator("n_steps")
    @classmethod
    def _odd(cls, n_steps: int) -> int:
        if n_steps % 2 == 0:
            raise ValueError(f"'n_steps' must be odd (the middle step is the start image), got {n_steps}")
        return n_steps


@dataclass
class SequenceSet:
    """Sequences for a list of sites.

    * images : (n_sites, n_sequences, n_steps, H, W) float32 in [0, 1].
    * start_index : (n_sites, n_sequences) index of each sequence's start image in the natural set.
    * site_response : (n_sites, n_sequences, n_steps) the site's pooled response at every step (model units).
    * others_change_sd : (n_sites, n_sequences, n_steps) RMS change of the other sites' responses from the
      start image, in their natural SDs.
    * natural_mean, natural_sd : (n_sites,) site responses over the natural images.
    """

    images: np.ndarray
    start_index: np.ndarray
    site_response: np.ndarray
    others_change_sd: np.ndarray
    natural_mean: np.ndarray
    natural_sd: np.ndarray

    @property
    def response_change_sd(self) -> np.ndarray:
        """(n_sites, n_sequences, n_steps) the site's response relative to the start image, in natural SDs."""
        middle = self.images.shape[2] // 2
        return (self.site_response - self.site_response[:, :, middle:middle + 1]) / self.natural_sd[:, None, None]


#: A sequence whose target site moves less than this between its two ends (natural SDs) does not follow the
#: site's tuning: the task then tests images, not the site.
MIN_EXCURSION_SD = 1.0


def excursion_warning(site_response: np.ndarray, natural_sd: np.ndarray, radius_mm: float) -> str | None:
    """A warning when the median sequence moves its site by less than :data:`MIN_EXCURSION_SD` natural SDs
    end to end, else None.

    site_response : (n_sites, n_sequences, n_steps) the site's pooled response along each sequence;
    natural_sd : (n_sites,) its SD over the natural images; radius_mm : the pooling radius used. The usual
    cause is a radius holding a few units that are silent (ReLU) for the start images: they give no gradient.

    >>> flat = np.zeros((2, 3, 7)); excursion_warning(flat, np.ones(2), 0.25)[:42]
    'sequences move their site by 0.00 natural '
    >>> excursion_warning(np.linspace(0, 4, 7) * np.ones((2, 3, 1)), np.ones(2), 0.5) is None
    True
    """
    change = np.abs(site_response[..., -1] - site_response[..., 0]) / np.asarray(natural_sd)[:, None]
    median = float(np.median(change))
    if median >= MIN_EXCURSION_SD:
        return None
    return (f"sequences move their site by {median:.2f} natural SDs end to end (median; expected up to 2 × max_sd, "
            f"at least {MIN_EXCURSION_SD:g}): they do not follow the sites' tuning. The {radius_mm:g} mm pooling radius "
            "probably holds too few units, silent for the start images; increase [sequences] recording_radius_mm")


def pooling_matrix(sheet, sites_mm, radius_mm: float) -> torch.Tensor:
    """(n_sites, n_units) weights: 1/n for the n units within ``radius_mm`` of each site, else 0.
    A site with no unit in reach is an error naming it."""
    sites = np.asarray(sites_mm, dtype=np.float64).reshape(-1, 2)
    members = [sheet.units_within(site, radius_mm) for site in sites]
    empty = [i for i, units in enumerate(members) if len(units) == 0]
    if empty:
        raise ConfigError(f"no unit within recording_radius_mm = {radius_mm} of site(s) "
                          f"{[tuple(np.round(sites[i], 3)) for i in empty]} mm; increase the radius")
    weights = np.zeros((len(sites), sheet.n_units))
    for row, units in zip(weights, members):
        row[units] = 1.0 / len(units)
    return torch.from_numpy(weights.astype(np.float32))


def _features(model, pixels: torch.Tensor, layer: str) -> torch.Tensor:
    """Activity of ``layer`` (flattened) for images in [0, 1] given as (B, C, H, W) on the model's device,
    with gradients."""
    p = model.preprocessing
    mean = torch.tensor(p.mean, dtype=pixels.dtype, device=pixels.device).view(1, -1, 1, 1)
    std = torch.tensor(p.std, dtype=pixels.dtype, device=pixels.device).view(1, -1, 1, 1)
    x = (pixels - mean) / std
    for name, module in model.stages:
        x = module(x)
        if name == layer:
            return x.flatten(1)
    raise ConfigError(f"layer {layer!r} is not a stage of the model")


def _pooled_responses(model, pixels: torch.Tensor, layer: str, pool: torch.Tensor, batch_size: int = 512,
                      desc: str | None = None) -> torch.Tensor:
    """Responses (N, n_pools) of ``pool``'s unit pools to images (N, C, H, W) in [0, 1], without gradients, in
    batches of at most ``batch_size`` images (fewer of large images: ``model.batch_limit``); a progress bar named
    ``desc`` when one is given."""
    step = model.batch_limit(batch_size)
    batches = tqdm(range(0, len(pixels), step), desc=desc, unit="batch", disable=desc is None)
    with torch.no_grad():
        return torch.cat([_features(model, pixels[i:i + step], layer) @ pool.T for i in batches])


def _total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of neighbouring pixels, per image."""
    return ((x[..., 1:, :] - x[..., :-1, :]).abs().mean(dim=(1, 2, 3))
            + (x[..., :, 1:] - x[..., :, :-1]).abs().mean(dim=(1, 2, 3)))


def _place_steps(model, starts, ends, pool, layer, half: int, sign: float, grid: int = 16,
                 progress: bool = False) -> torch.Tensor:
    """``half`` images on the straight pixel line from each start to its end whose site responses step
    evenly towards the best response reached on that line (first crossing of each level on a grid of
    ``grid`` points, so the responses never step back). Returns (sites, seq, half, C, H, W). ``progress``
    shows a bar over the line's images."""
    n_sites, n_seq = starts.shape[:2]
    device = starts.device
    fractions = torch.linspace(0, 1, grid + 1, device=device, dtype=starts.dtype)[1:]
    path = starts[:, :, None] + fractions.view(1, 1, -1, 1, 1, 1) * (ends - starts)[:, :, None]
    r = _pooled_responses(model, path.reshape(-1, *starts.shape[2:]), layer, pool,
                          desc=f"placing steps towards the {'low' if sign < 0 else 'high'} ends" if progress else None)
    r0 = _pooled_responses(model, starts.reshape(-1, *starts.shape[2:]), layer, pool)
    site = torch.arange(n_sites, device=device).repeat_interleave(n_seq)
    rows = torch.arange(n_sites * n_seq, device=device)
    own = sign * r.view(n_sites * n_seq, grid, n_sites)[rows, :, site]  # larger = further
    own0 = sign * r0[rows, site]
    best = torch.cummax(own, dim=1).values
    reach = best[:, -1]
    chosen = torch.empty(n_sites * n_seq, half, dtype=torch.long, device=device)
    for m in range(1, half + 1):
        level = own0 + (reach - own0) * m / half
        crossed = best >= level[:, None] - 1e-12
        chosen[:, m - 1] = crossed.float().argmax(dim=1)
    chosen = torch.cummax(chosen, dim=1).values
    flat_path = path.reshape(n_sites * n_seq, grid, *starts.shape[2:])
    picked = flat_path[rows[:, None], chosen]
    return picked.view(n_sites, n_seq, half, *starts.shape[2:])


#: Responses of a site closer than this fraction of its largest response count as equal when start images are
#: chosen: far below any difference that matters, far above the float rounding of the network's products (which
#: differs between processors' kernels and would otherwise decide near-ties, and a silent site's "floor").
START_RESPONSE_TOLERANCE = 1e-4


def _start_images(responses: np.ndarray, n_sequences: int, rng: np.random.Generator) -> np.ndarray:
    """(n_sites, n_sequences) indices of the start images among the natural images (``responses``:
    (n_images, n_sites) pooled site responses): the images on which the site responds above its floor
    (its lowest response; for a ReLU layer, where it is not silent, since a silent site gives the pixels no
    gradient) whose responses lie closest to the median of those responses, ties broken at random (seeded).
    Responses and distances are compared on a grid of :data:`START_RESPONSE_TOLERANCE` times the site's largest
    response, so that float rounding decides between images only at the edge of a grid step. A site that responds
    above its floor to fewer than ``n_sequences`` images takes the rest from the others.

    >>> responses = np.array([[0.0, 1.0], [0.0, 2.0], [0.0, 4.0], [0.4, 8.0], [0.2, 3.0]])
    >>> # site 0 responds to images 3 and 4 only; site 1 above its floor of 1.0 to 2, 4, 8, 3 (median 3.5)
    >>> np.sort(_start_images(responses, 2, np.random.default_rng(0)), axis=1).tolist()
    [[3, 4], [2, 4]]
    """
    scale = np.abs(responses).max(axis=0)
    quantum = np.where(scale > 0, START_RESPONSE_TOLERANCE * scale, 1.0)
    above_floor = responses > responses.min(axis=0) + quantum
    reference = np.array([np.median(site[above]) if above.any() else site[0]
                          for site, above in zip(responses.T, above_floor.T)])
    distance = np.where(above_floor, np.round(np.abs(responses - reference) / quantum), np.inf)
    order = np.lexsort((rng.random(responses.shape).T, distance.T), axis=-1)
    return order[:, :n_sequences]


def build_sequences(model, sites_mm, natural_images, spec: SequenceSpec = SequenceSpec(), layer: str = "IT",
                    seed: int = 0, progress: bool = True, companions=()) -> SequenceSet:
    """Sequences along the tuning of every site in ``sites_mm`` ((n_sites, 2) mm on ``layer``'s sheet).

    ``natural_images``: the start images (anything ``model.preprocess`` accepts; resized to the model's
    input); every site's other sites are the remaining entries of ``sites_mm``. ``companions``: further
    (model, sites_mm) pairs — the same sites mapped on other instances — whose loss terms are added when
    ``spec.ensemble`` is true. Start images, step placement and the recorded responses use ``model``.
    Everything computes on ``model.device`` (the companions must be on the same device).
    """
    layer = model.resolve_layer(layer)
    sheet = model.sheet(layer)
    sites = np.asarray(sites_mm, dtype=np.float64).reshape(-1, 2)
    n_sites, s = len(sites), spec
    device = model.device
    dtype = getattr(torch, spec.precision)
    if dtype == torch.float64 and device.type == "mps":
        raise ConfigError('Apple GPUs (mps) have no float64: set [sequences] precision = "float32" (its sequences '
                          'depend on the processor) or compute on the CPU')
    pool = pooling_matrix(sheet, sites, spec.recording_radius_mm).to(device, dtype)
    p = model.preprocessing
    natural = model.preprocess(natural_images).to(dtype)  # normalised, on the model's device
    natural = (natural * torch.tensor(p.std, device=device, dtype=dtype).view(1, -1, 1, 1)
               + torch.tensor(p.mean, device=device, dtype=dtype).view(1, -1, 1, 1)).clamp(0, 1)
    model = model.with_dtype(dtype)
    if len(natural) < s.n_sequences:
        raise ConfigError(f"{len(natural)} natural images cannot start {s.n_sequences} sequences per site")
    responses = _pooled_responses(model, natural, layer, pool, batch_size=256).cpu().numpy().astype(np.float64)
    natural_mean, natural_sd = responses.mean(0), responses.std(0)
    natural_sd = np.where(natural_sd > 0, natural_sd, 1.0)
    terms = [(model, pool, torch.from_numpy(natural_sd).to(device, dtype))]
    if spec.ensemble:
        for other, other_sites in companions:
            other = other.with_dtype(dtype)
            other_pool = pooling_matrix(other.sheet(layer), np.asarray(other_sites).reshape(-1, 2),
                                        spec.recording_radius_mm).to(device, dtype)
            other_responses = _pooled_responses(other, natural, layer, other_pool, batch_size=256)
            other_sd = other_responses.std(0, unbiased=False)
            terms.append((other, other_pool, torch.where(other_sd > 0, other_sd, torch.ones_like(other_sd))))
    rng = np.random.default_rng(seed)
    start_index = _start_images(responses, s.n_sequences, rng)  # (n_sites, n_sequences)

    # Jobs: one per (site, sequence, end); end 0 = low (−), end 1 = high (+).
    site_of = np.repeat(np.arange(n_sites), s.n_sequences * 2)
    start_of = np.repeat(start_index.reshape(-1), 2)
    sign_of = np.tile([-1.0, 1.0], n_sites * s.n_sequences)
    ends = torch.empty((len(site_of),) + natural.shape[1:], device=device, dtype=dtype)
    for begin in tqdm(range(0, len(site_of), s.batch_images), desc="sequences", unit="batch", disable=not progress):
        jobs = slice(begin, min(begin + s.batch_images, len(site_of)))
        x0 = natural[torch.from_numpy(start_of[jobs]).to(device)]
        site = torch.from_numpy(site_of[jobs]).to(device)
        sign = torch.from_numpy(sign_of[jobs]).to(device, dtype)
        rows = torch.arange(len(site), device=device)
        others = torch.ones(len(site), n_sites, device=device, dtype=dtype)
        others[rows, site] = 0.0
        n_others = others.sum(1).clamp(min=1)
        starts_r, targets = [], []
        with torch.no_grad():
            for term_model, term_pool, term_sd in terms:
                r0 = _features(term_model, x0, layer) @ term_pool.T
                starts_r.append(r0)
                targets.append(r0[rows, site] + sign * s.max_sd * term_sd[site])
        x = x0.clone().requires_grad_(True)
        optimiser = torch.optim.Adam([x], lr=s.learning_rate)
        for _ in range(s.iterations):
            optimiser.zero_grad()
            loss = s.tv_weight * _total_variation(x) + s.step_weight * ((x - x0) ** 2).mean(dim=(1, 2, 3))
            for (term_model, term_pool, term_sd), r0, target in zip(terms, starts_r, targets):
                r = _features(term_model, x, layer) @ term_pool.T
                reach = torch.relu(sign * (target - r[rows, site]) / term_sd[site]) ** 2
                keep = ((((r - r0) / term_sd) ** 2) * others).sum(1) / n_others
                loss = loss + (reach + s.others_weight * keep) / len(terms)
            loss.sum().backward()
            optimiser.step()
            with torch.no_grad():
                x.clamp_(0, 1)
        ends[jobs] = x.detach()
    ends = ends.view(n_sites, s.n_sequences, 2, *natural.shape[1:])
    starts = natural[torch.from_numpy(start_index.reshape(-1)).to(device)].view(n_sites, s.n_sequences, *natural.shape[1:])
    half = s.n_steps // 2
    sides = [_place_steps(model, starts, ends[:, :, end], pool, layer, half, sign, progress=progress)
             for end, sign in ((0, -1.0), (1, 1.0))]
    images = torch.cat([sides[0].flip(2), starts[:, :, None], sides[1]], dim=2).clamp(0, 1)  # (sites, seq, steps, C, H, W)
    r = _pooled_responses(model, images.reshape(-1, *natural.shape[1:]), layer, pool)
    r = r.cpu().numpy().astype(np.float64).reshape(n_sites, s.n_sequences, s.n_steps, n_sites)
    own = np.take_along_axis(r, np.arange(n_sites)[:, None, None, None], axis=3)[..., 0]
    change = (r - r[:, :, half:half + 1, :]) / natural_sd
    others_mask = ~np.eye(n_sites, dtype=bool)[:, None, None, :]
    n_other = max(n_sites - 1, 1)
    others_change = np.sqrt(np.where(others_mask, change ** 2, 0.0).sum(-1) / n_other)
    array = images.cpu().numpy()
    array = array[:, :, :, 0] if array.shape[3] == 1 else np.moveaxis(array, 3, -1)
    return SequenceSet(images=array.astype(np.float32), start_index=start_index, site_response=own,
                       others_change_sd=others_change, natural_mean=natural_mean, natural_sd=natural_sd)
