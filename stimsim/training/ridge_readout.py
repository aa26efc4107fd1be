"""Closed-form readouts of a ``topo_head`` IT: reduced-rank ridge regression, solved in its dual form
(``[training] readout_fit = "ridge"`` of a build, :func:`ridge_readouts`).

A readout ``Linear(units → rank, no bias) → Linear(rank → outputs)`` that reproduces target values ``Y``
(e.g. the base network's ImageNet logits) from IT activity ``Z`` is the ridge regression of ``Y`` on ``Z``
restricted to rank ``rank``: the full ridge solution ``W`` (outputs × units), then its fitted values projected
onto their first ``rank`` principal directions (reduced-rank regression; Izenman 1975, J. Multivariate Anal.
5:248). With many more units than rows the ridge solution is computed in its dual form,
``W = ((K + λI)⁻¹ Yc)ᵀ Zc`` with the rows' Gram matrix ``K = Zc Zcᵀ`` (centred rows; Hastie, Tibshirani &
Friedman 2009, §5.8 / §18.3), so the cost grows with the rows, not the 50,176 units.

The penalty λ is chosen from ``penalties`` (relative to the mean diagonal of ``K``) by how often the readout's
largest output agrees with the target's on rows held back from the fit (``held_back``, scored on ``scored``);
the readout is then fitted again on every row with that penalty.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from stimsim.training.trunk_features import FeatureSampler
from stimsim.utilities.errors import TrainingDiverged

#: Penalties tried, × the mean squared norm of a centred row of IT activity.
RELATIVE_PENALTIES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


@dataclass(frozen=True)
class RidgeReadout:
    """A fitted readout: ``first`` (rank, units), ``second`` (outputs, rank), ``bias`` (outputs,); the
    chosen relative penalty and the validation agreement of every penalty tried (chance: 1 / outputs)."""
    first: torch.Tensor
    second: torch.Tensor
    bias: torch.Tensor
    relative_penalty: float
    validation_agreement: dict[float, float]


def _centred_gram(activity: torch.Tensor, progress: bool, block: int = 2048) -> torch.Tensor:
    """The Gram matrix of the centred rows, ``(Z - mean) @ (Z - mean).T``, in float64, accumulated over blocks
    of units (float32 products) and centred afterwards (``H K H``), so no centred copy of ``Z`` is made."""
    gram = torch.zeros(len(activity), len(activity), dtype=torch.float64)
    for start in tqdm(range(0, activity.shape[1], block), desc="readout Gram matrix", disable=not progress):
        part = activity[:, start:start + block]
        gram += (part @ part.T).double()
    row_means = gram.mean(1)
    return gram - row_means[:, None] - row_means[None, :] + row_means.mean()


def _centred_on_fit_rows(gram: torch.Tensor, fit_rows: torch.Tensor, val_rows: torch.Tensor):
    """(fit × fit, validation × fit) Gram matrices of the rows centred on the fit rows' mean, from ``gram``
    (the rows centred on any one point): a fit that never sees the validation rows."""
    fit, cross = gram[fit_rows][:, fit_rows], gram[val_rows][:, fit_rows]
    fit_means = fit.mean(0)
    return (fit - fit_means[:, None] - fit_means[None, :] + fit_means.mean(),
            cross - cross.mean(1, keepdim=True) - fit_means[None, :] + fit_means.mean())


def _dual_coefficients(gram: torch.Tensor, targets: torch.Tensor, penalty: float) -> torch.Tensor:
    """``(gram + penalty·I)⁻¹ targets`` by Cholesky (the matrix is symmetric positive definite)."""
    factor = torch.linalg.cholesky(gram + penalty * torch.eye(len(gram), dtype=gram.dtype))
    return torch.cholesky_solve(targets, factor)


def fit_ridge_readout(activity: torch.Tensor, targets: torch.Tensor, rank: int, held_back: np.ndarray,
                      scored: np.ndarray | None = None, penalties: tuple[float, ...] = RELATIVE_PENALTIES,
                      progress: bool = False) -> RidgeReadout:
    """Fit a reduced-rank ridge readout of ``targets`` (n, outputs) from IT ``activity`` (n, units).

    ``held_back`` : boolean (n,), the rows left out of the fits that choose the penalty (some, not all);
    ``scored`` : the rows among them that those fits are scored on (default: all of them).
    """
    held_back = np.asarray(held_back, bool)
    if held_back.shape != (len(activity),) or held_back.all() or not held_back.any():
        raise ValueError("held_back must mark some, but not all, of the rows")
    validation = held_back if scored is None else np.asarray(scored, bool)
    if validation.shape != held_back.shape or not validation.any() or (validation & ~held_back).any():
        raise ValueError("scored must mark some of the held-back rows, and only those")
    if not 1 <= rank <= targets.shape[1]:
        raise ValueError(f"rank must be in [1, {targets.shape[1]}], got {rank}")
    z_mean, y_mean = activity.mean(0), targets.double().mean(0)
    yc = targets.double() - y_mean
    fit_rows = torch.from_numpy(np.flatnonzero(~held_back))
    val_rows = torch.from_numpy(np.flatnonzero(validation))
    gram = _centred_gram(activity, progress)
    scale = float(torch.diagonal(gram).mean())
    if not scale > 0:
        raise ValueError("IT activity is the same on every row (a silent or constant IT), so no readout can be "
                         "fitted to it")
    gram_fit, gram_val = _centred_on_fit_rows(gram, fit_rows, val_rows)
    wanted, fit_mean = targets[val_rows].argmax(1), targets[fit_rows].double().mean(0)
    fit_targets = targets[fit_rows].double() - fit_mean
    agreement = {}
    for relative in tqdm(penalties, desc="readout penalties", disable=not progress):
        coefficients = _dual_coefficients(gram_fit, fit_targets, relative * scale)
        predicted = gram_val @ coefficients + fit_mean
        agreement[relative] = float((predicted.argmax(1) == wanted).double().mean())
    best = max(penalties, key=lambda relative: (agreement[relative], relative))
    del gram_fit, gram_val, fit_targets
    coefficients = _dual_coefficients(gram, yc, best * scale)
    fitted = gram @ coefficients
    directions = torch.linalg.svd(fitted, full_matrices=False).Vh[:rank].T          # (outputs, rank)
    dual = coefficients.T.float()
    full = (dual @ activity - dual.sum(1, keepdim=True) * z_mean).double()               # (outputs, units)
    first = (directions.T @ full).float()
    second = directions.float()
    bias = (y_mean - second.double() @ (first.double() @ z_mean.double())).float()
    return RidgeReadout(first, second, bias, best, agreement)


#: Share of the training images (all their views) held back when a ridge readout's penalty is chosen.
RIDGE_VALIDATION_FRACTION = 0.2


def ridge_readouts(config, network, cached: dict, domains: np.ndarray, classifier, progress: bool = True,
                   sampler: FeatureSampler | None = None) -> dict:
    """Fit the readouts of a densified :class:`~stimsim.models.topo_head.TopoHeadNet` in closed form (IT fixed)
    for the build ``config`` (a :class:`~stimsim.training.head_config.HeadConfig`), from its cached trunk
    features and the base network's ``classifier`` (pooled features to its ImageNet logits).

    The ImageNet head is the rank-``head_rank`` ridge regression of the base network's logits on IT activity
    over the ``readout_views`` of every training image (every view, or the clean image alone: view 0) and
    ``readout_samples`` features drawn from the Gaussian of those views' features
    (:class:`~stimsim.training.trunk_features.FeatureSampler`, labelled by ``classifier``); the domain
    head that of the localizer images' one-hot domains. Each penalty is chosen by fits that leave out every
    view of a seeded 20 % of the training images, scored on those images as they are (view 0). ``sampler``: the
    build's sampler when it was fitted to these views' features already (else it is fitted here). Returns what
    was chosen, for the metadata."""
    training = config.training
    views = cached["features"][:1] if training.readout_views == "clean" else cached["features"]
    sampler = sampler if sampler is not None else FeatureSampler(views, classifier)
    features = torch.from_numpy(views)
    n_views, n_images = features.shape[:2]
    rng = np.random.default_rng([training.seed, training.steps, 1])
    held_back = np.zeros(n_images, bool)
    held_back[rng.choice(n_images, size=max(1, int(round(RIDGE_VALIDATION_FRACTION * n_images))), replace=False)] = True
    samples, sample_logits = sampler.draw(training.readout_samples, int(rng.integers(2 ** 62)))
    inputs = torch.cat([features.reshape(-1, features.shape[-1]), samples])
    targets = torch.cat([torch.from_numpy(cached["teacher"]).repeat(n_views, 1), sample_logits])
    left_out = np.concatenate([np.tile(held_back, n_views), np.zeros(len(samples), bool)])
    # the penalty is judged on the held-back images as the network receives them (view 0), where the teacher
    # is the base network's output for that very input
    scored = left_out & (np.arange(len(left_out)) < n_images)
    with torch.no_grad():
        activity = torch.cat([network.it(chunk) for chunk in tqdm(
            inputs.split(512), desc="IT activity for the readouts", disable=not progress)])
        imagenet = _ridge_fit(config, "ImageNet", activity, targets, network.head[0].out_features, left_out, scored,
                              RELATIVE_PENALTIES, progress)
        network.head[0].weight.copy_(imagenet.first)
        network.head[1].weight.copy_(imagenet.second)
        network.head[1].bias.copy_(imagenet.bias)
        chosen = {"imagenet": _ridge_record(imagenet)}
        if network.domain_head is not None:
            labelled = np.flatnonzero(np.tile(domains, n_views) >= 0)
            one_hot = F.one_hot(torch.from_numpy(np.tile(domains, n_views)[labelled]),
                                network.domain_head.out_features).float()
            domain = _ridge_fit(config, "domain", activity[labelled], one_hot, one_hot.shape[1], left_out[labelled],
                                scored[labelled])
            network.domain_head.weight.copy_(domain.second @ domain.first)
            network.domain_head.bias.copy_(domain.bias)
            chosen["domain"] = _ridge_record(domain)
    network.eval()
    return chosen


def _ridge_fit(config, what: str, *args):
    try:
        return fit_ridge_readout(*args)
    except ValueError as exc:
        raise TrainingDiverged(f"{config.name}: the {what} readout cannot be fitted: {exc}") from None


def _ridge_record(readout) -> dict:
    return {"relative_penalty": readout.relative_penalty,
            "validation_agreement": {f"{k:g}": round(v, 4) for k, v in readout.validation_agreement.items()}}
