"""ImageNet top-1 accuracy of a classifier on a folder of labelled ImageNet photographs.

The folder holds one or more images per class named ``<wnid>_<anything>.<ext>`` (e.g. the
``imagenet_samples`` data entry: one photograph per ImageNet-1k class); an image's class index is
the position of its WordNet id among the 1,000 ImageNet-1k wnids in sorted order, the order of
every ImageNet-1k classifier's outputs. Every wnid must appear at least once so that the order is
known from the folder itself.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Collection
from pathlib import Path

import numpy as np

from stimsim.utilities.errors import DataError

N_IMAGENET_CLASSES = 1000
#: Images per call of the classifier (bounds memory at 224 px: about 30 MB of input per batch).
BATCH_IMAGES = 50
_WNID = re.compile(r"^(n\d{8})_")


def imagenet_files(images_dir) -> tuple[list[Path], np.ndarray]:
    """The image files of ``images_dir`` sorted by name and their class indices (sorted-wnid order)."""
    from stimsim.data.stimuli import IMAGE_SUFFIXES

    root = Path(images_dir)
    files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES) \
        if root.is_dir() else []
    if not files:
        raise DataError(f"no ImageNet images in {root} (expected files named <wnid>_<name>.jpg)")
    wnids = []
    for path in files:
        match = _WNID.match(path.name)
        if match is None:
            raise DataError(f"{path}: an ImageNet image's name must start with its wnid, e.g. n01440764_tench.jpg")
        wnids.append(match.group(1))
    classes = sorted(set(wnids))
    if len(classes) != N_IMAGENET_CLASSES:
        raise DataError(f"{root} holds {len(classes)} distinct wnids; the class order needs all "
                        f"{N_IMAGENET_CLASSES} ImageNet-1k classes")
    index = {wnid: i for i, wnid in enumerate(classes)}
    return files, np.asarray([index[w] for w in wnids], dtype=np.int64)


def imagenet_top1(predict_logits: Callable, images_dir, limit: int | None = None,
                  cache_as: dict | None = None, held_out: Collection[str] | None = None) -> dict:
    """Top-1 accuracy of ``predict_logits`` (list of float images in [0, 1] → (N, 1000) logits) on the
    images of ``images_dir`` (every one, or the first ``limit`` by name), read in batches of
    :data:`BATCH_IMAGES`. Returns ``{"top1", "n", "chance"}`` (chance = 1/1000).

    ``held_out``: file names of images a model was not trained on; the result then also has
    ``"held_out"`` and ``"trained_on"``, each ``{"top1", "n"}`` over those images and over the others
    (``top1`` None where there are none).

    ``cache_as``: ``{"model_sha256", "layer", "preprocessing"}`` naming what ``predict_logits`` computes; the
    logits are then kept in the activation cache (:mod:`stimsim.engine.activation_cache`, keyed also by the image
    files' bytes) and reused."""
    import torch

    from stimsim.data.images import load_image

    files, classes = imagenet_files(images_dir)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or not 1 <= limit <= len(files):
            raise ValueError(f"limit = {limit!r}: the number of ImageNet images to score must be an integer from 1 to "
                             f"the {len(files)} in {images_dir}, or None for all")
        files, classes = files[:limit], classes[:limit]

    def predict(paths):
        logits = np.asarray(predict_logits([load_image(p) for p in paths]), dtype=np.float32)
        if logits.shape != (len(paths), N_IMAGENET_CLASSES):
            raise ValueError(f"predict_logits must return (N, {N_IMAGENET_CLASSES}) logits for N images; got shape "
                             f"{logits.shape} for {len(paths)}")
        return torch.from_numpy(logits)

    def compute():
        return torch.cat([predict(files[start:start + BATCH_IMAGES]) for start in range(0, len(files), BATCH_IMAGES)])

    if cache_as is None:
        logits = compute()
    else:
        from stimsim.engine.activation_cache import cached_activity, default_directory, entry_key
        from stimsim.utilities.hashing import json_sha256, sha256_of

        inputs = json_sha256([[p.name, sha256_of(p)] for p in files])
        key = entry_key(cache_as["model_sha256"], cache_as["layer"], cache_as["preprocessing"], inputs)
        logits = cached_activity(default_directory(), key, compute,
                                 describe={"model": cache_as["model_sha256"], "layer": cache_as["layer"],
                                           "n_images": len(files), "images": str(images_dir)},
                                 compute_rows=lambda rows: predict([files[r] for r in rows]), n_rows=len(files))
    correct = logits.numpy().argmax(axis=1) == classes
    result = {"top1": float(correct.mean()), "n": len(files), "chance": 1.0 / N_IMAGENET_CLASSES}
    if held_out is not None:
        names = set(held_out)
        unseen = np.array([path.name in names for path in files], dtype=bool)
        for key, mask in (("held_out", unseen), ("trained_on", ~unseen)):
            result[key] = {"top1": float(correct[mask].mean()) if mask.any() else None, "n": int(mask.sum())}
    return result


def base_network_top1(name: str, images_dir, limit: int | None = None, mirror=None,
                      held_out: Collection[str] | None = None) -> dict:
    """:func:`imagenet_top1` of base network ``name`` with its ImageNet weights and its own preprocessing;
    the logits are kept in the activation cache."""
    import torch

    from stimsim.models.base_networks import base_network_spec, load_base_network

    spec = base_network_spec(name)
    network = load_base_network(name, mirror=mirror)

    def predict(images):
        with torch.inference_mode():
            return network(spec.preprocessing(images)).numpy()

    return imagenet_top1(predict, images_dir, limit=limit,
                         cache_as={"model_sha256": spec.weights_sha256, "layer": f"{name} ImageNet logits",
                                   "preprocessing": spec.preprocessing.to_dict()}, held_out=held_out)
