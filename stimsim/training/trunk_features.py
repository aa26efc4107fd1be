"""The frozen trunk's pooled features of a ``topo_head`` build's training images, cached, and a Gaussian of
those features to draw further feature vectors from (:mod:`stimsim.training.head_training` uses both)."""
from __future__ import annotations

import hashlib
import math
import warnings
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from stimsim.models.base_networks import base_network_spec
from stimsim.models.preprocessing import Preprocessing
from stimsim.utilities.errors import ConfigError, unreadable_reason
from stimsim.utilities.hashing import json_sha256, state_sha256
from stimsim.utilities.io import atomic_save

FEATURES_SUBDIR = "trunk_features"


def augmented_view(image: np.ndarray, rng: np.random.Generator, crop_scale, min_signal_percent: float) -> np.ndarray:
    """One random version of an image at the network's geometry (H, W, 3) in [0, 1]: a crop of a share of its area
    drawn in ``crop_scale`` (two numbers in (0, 1]), a flip, a contrast, and pixel noise at a visual signal drawn in
    [``min_signal_percent``, 100] %."""
    height, width = image.shape[:2]
    scale = rng.uniform(*crop_scale)
    side_h, side_w = max(8, int(round(height * math.sqrt(scale)))), max(8, int(round(width * math.sqrt(scale))))
    top, left = rng.integers(0, height - side_h + 1), rng.integers(0, width - side_w + 1)
    crop = torch.from_numpy(np.ascontiguousarray(image[top:top + side_h, left:left + side_w])).permute(2, 0, 1)
    out = F.interpolate(crop[None].float(), size=(height, width), mode="bilinear", align_corners=False,
                        antialias=True)[0].permute(1, 2, 0).numpy()
    if rng.random() < 0.5:
        out = out[:, ::-1]
    mean = out.mean()
    out = np.clip(mean + rng.uniform(0.6, 1.4) * (out - mean), 0.0, 1.0)
    signal = rng.uniform(min_signal_percent, 100.0) / 100.0
    replaced = rng.random((height, width)) >= signal
    out = out.copy()
    out[replaced] = rng.random((int(replaced.sum()), out.shape[2]))
    return out.astype(np.float32)


def rgb_geometry(images, preprocessing: Preprocessing) -> list[np.ndarray]:
    """Each image at the network's geometry (``preprocessing.geometry``) as (H, W, 3) in [0, 1]: a gray one (a
    build whose preprocessing keeps one channel) repeated on the base network's three channels."""
    return [g if g.ndim == 3 else np.repeat(g[..., None], 3, -1) for g in preprocessing.geometry(images)]


def normalised_batch(images: list, preprocessing: Preprocessing) -> torch.Tensor:
    """(N, 3, H, W) network input of images already at the network's geometry ((H, W, 3) in [0, 1])."""
    mean = torch.tensor(preprocessing.mean).view(1, 3, 1, 1)
    std = torch.tensor(preprocessing.std).view(1, 3, 1, 1)
    return (torch.stack([torch.from_numpy(np.ascontiguousarray(i)).permute(2, 0, 1) for i in images]) - mean) / std


def trunk_features(config, stimuli, trunk, classifier, preprocessing: Preprocessing,
                   base_sha256: str | None, progress: bool = True, teacher_trunk=None) -> dict:
    """Pooled trunk features of every view of every training image of the build ``config`` (a
    :class:`~stimsim.training.head_config.HeadConfig`), and the teacher logits (``classifier`` on
    ``teacher_trunk``'s pooled features of view 0; ``trunk``'s where None); cached in
    ``<stimsim cache>/trunk_features/<digest>.npz`` under the digest of everything they depend on (the data
    table, the images' ids and pixels, the base network and its weights, a tuned trunk's weights, the
    preprocessing), so builds that differ only in their training share them."""
    from stimsim.data.manifest import cache_dir

    pixels = hashlib.sha256()
    for image in stimuli.images:
        pixels.update(np.ascontiguousarray(image, np.float32).tobytes())
    digest = json_sha256({"data": config.data.model_dump(exclude={"domains", "positive_domain"}),
                          "base": config.model.base_network, "base_weights": config.model.base_weights,
                          "base_sha256": base_sha256, "ids": [str(s) for s in stimuli.stimulus_id],
                          "pixels": pixels.hexdigest(), "preprocessing": preprocessing.to_dict(),
                          **({} if teacher_trunk is None else {"tuned_trunk_sha256": state_sha256(trunk.state_dict())})})
    # a random trunk is worth no cache entry
    path = None if config.model.base_weights == "random" else cache_dir() / FEATURES_SUBDIR / f"{digest}.npz"
    if path is not None and path.is_file():
        try:
            with np.load(path, allow_pickle=False) as cached:
                stored = {key: cached[key] for key in ("features", "teacher", "digest", "content_sha256")}
        except (OSError, ValueError, KeyError) as exc:
            stored = {"problem": f"unreadable ({unreadable_reason(exc)})"}
        if "problem" not in stored and str(stored["content_sha256"]) != _content_sha256(stored):
            stored["problem"] = "its numbers do not match their sha256"
        if "problem" not in stored and str(stored["digest"]) == digest:
            return {key: stored[key] for key in ("features", "teacher")}
        warnings.warn(f"trunk feature cache {path} {stored.get('problem', 'was made from other inputs')}; "
                      "computing the features again", stacklevel=2)
    views = config.data.views
    geometry = rgb_geometry(stimuli.images, preprocessing)
    teacher_trunk = trunk if teacher_trunk is None else teacher_trunk
    features = np.zeros((views, len(geometry), base_network_spec(config.model.base_network).feature_channels), np.float32)
    teacher = np.zeros((len(geometry), 1000), np.float32)
    batch = 32
    bar = tqdm(total=views * len(geometry), desc="trunk features", unit="img", disable=not progress)
    with torch.no_grad():
        for view in range(views):
            for start in range(0, len(geometry), batch):
                chunk = []
                for i in range(start, min(start + batch, len(geometry))):
                    image = geometry[i]
                    if view > 0:
                        image = augmented_view(image, np.random.default_rng(
                            [config.data.seed, view, zlib.crc32(str(stimuli.stimulus_id[i]).encode("utf-8"))]),
                            config.data.crop_scale, config.data.min_signal_percent)
                    chunk.append(image)
                x = normalised_batch(chunk, preprocessing)
                pooled = torch.flatten(F.adaptive_avg_pool2d(trunk(x), 1), 1)
                features[view, start:start + len(chunk)] = pooled.numpy()
                if view == 0:
                    clean = pooled if teacher_trunk is trunk else torch.flatten(F.adaptive_avg_pool2d(teacher_trunk(x), 1), 1)
                    teacher[start:start + len(chunk)] = classifier(clean).numpy()
                bar.update(len(chunk))
    bar.close()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        content = _content_sha256({"features": features, "teacher": teacher})
        atomic_save(path, lambda tmp: np.savez(tmp, features=features, teacher=teacher, digest=np.array(digest),
                                               content_sha256=np.array(content)))
    return {"features": features, "teacher": teacher}


def _content_sha256(arrays: dict) -> str:
    digest = hashlib.sha256()
    for key in ("features", "teacher"):
        digest.update(np.ascontiguousarray(arrays[key], np.float32).tobytes())
    return digest.hexdigest()


class FeatureSampler:
    """Feature vectors drawn from a Gaussian with the mean and covariance of the cached trunk features (every
    view of every training image), clipped at 0 as pooled ReLU features are; the teacher is the base
    network's classifier applied to them. They cover directions of feature space that the few training
    images do not, so that distillation carries the base network's function to classes the training images
    lack (distillation from samples of a fitted feature distribution, no images needed)."""

    def __init__(self, features: np.ndarray, classifier):
        flat = torch.from_numpy(features.reshape(-1, features.shape[-1])).double()
        self.mean = flat.mean(0)
        covariance = torch.cov(flat.T)
        ridge = 1e-6 * float(torch.diagonal(covariance).mean())
        self.factor = torch.linalg.cholesky(covariance + ridge * torch.eye(len(covariance), dtype=torch.float64))
        self.classifier = classifier

    def draw(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(n, C) features and their (n, 1000) teacher logits, drawn from ``seed``."""
        generator = torch.Generator().manual_seed(seed)
        normal = torch.randn(n, len(self.mean), generator=generator, dtype=torch.float64)
        samples = (self.mean + normal @ self.factor.T).clamp_min(0).float()
        with torch.no_grad():
            return samples, self.classifier(samples)


def principal_projection(features: np.ndarray, rank: int) -> torch.Tensor:
    """(rank, C) projection onto the first ``rank`` principal components of the cached trunk features (every
    view of every training image): row k is the k-th eigenvector of their covariance, its largest component
    positive, all rows divided by √(mean of the kept eigenvalues), so that projected features have unit
    variance on average and keep the components' relative variances."""
    flat = torch.from_numpy(features.reshape(-1, features.shape[-1])).double()
    if not 1 <= rank <= flat.shape[1]:
        raise ConfigError(f"a principal projection of {flat.shape[1]} features has rank 1 to {flat.shape[1]}, got {rank}")
    variances, vectors = torch.linalg.eigh(torch.cov(flat.T))
    variances, vectors = variances.flip(0)[:rank], vectors.flip(1)[:, :rank]
    if not bool((variances > 0).all()):
        raise ConfigError(f"the trunk features span fewer than {rank} dimensions; lower it_rank")
    signs = torch.sign(vectors.gather(0, vectors.abs().argmax(0, keepdim=True)))
    return ((vectors * signs) / variances.mean().sqrt()).T.float()
