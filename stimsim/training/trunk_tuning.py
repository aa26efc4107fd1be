"""Tuning a base network's last trunk modules so that they see through pixel noise (``[trunk_tuning]`` of a
``topo_head`` build).

A frozen ImageNet trunk's pooled features of an image whose pixels are partly replaced by noise (the visual-signal
manipulation of Afraz et al. 2006) lie far from those of the clean image, so an IT built on them is nearly silent on
noisy faces and the model's psychometric curve is shallow where a trained monkey's is steep. Before IT is trained,
a build with ``[trunk_tuning]`` tunes the trunk from ``first_module`` on by feature distillation, without labels:
every training image is shown in ``views`` versions (view 0 as the network receives it, the others cropped,
flipped, contrast-jittered and with a share of pixels drawn in [0, 100 − ``min_signal_percent``] % replaced by
uniform noise), and the tuned trunk's pooled features of each version are pulled toward the base network's pooled
features of the clean image (mean squared error over the mean variance of those features). The modules before
``first_module`` stay as they are (their output for every version is computed once per build) and BatchNorm keeps
the base network's statistics. Adam with a cosine schedule; every draw comes from (seed, epoch), so a build killed
and resumed from ``DIR/trunk_checkpoint.pt`` ends with the weights of an uninterrupted one (CPU).
"""
from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from tqdm.auto import tqdm

from stimsim.models.preprocessing import Preprocessing
from stimsim.models.weights import read_run_checkpoint
from stimsim.training.schedule import LearningRate
from stimsim.training.trunk_features import augmented_view, normalised_batch, rgb_geometry
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.filemodels import FileModel, Text
from stimsim.utilities.io import atomic_save

CHECKPOINT_NAME = "trunk_checkpoint.pt"
#: The random stream of the tuning's views, apart from the IT features' views (which use the data seed alone).
_VIEW_STREAM = 1


class TrunkTuningTable(FileModel):
    """``[trunk_tuning]``: which trunk modules are tuned (``first_module`` and every one after it, named by its
    dotted path in the trunk: ``"14"`` is MobileNetV2's ``features.14``, ``"2.5"`` EfficientNet-Lite0's sixth block
    stage), the versions of each image and the optimisation."""
    first_module: Text
    """First trunk module tuned, by its dotted path in the trunk (e.g. ``"14"``); it and every later module are
    tuned, the earlier ones stay as they are."""
    epochs: Annotated[int, Field(ge=1, le=1000)] = 6
    """Passes over every version of every training image."""
    views: Annotated[int, Field(ge=2, le=64)] = 6
    """Versions of each training image: view 0 as the network receives it, the others cropped
    (``[data] crop_scale``), flipped, contrast-jittered and with pixel noise."""
    min_signal_percent: Annotated[float, Field(ge=0, le=100)] = 0.0
    """Lowest visual signal of the noisy versions, in %: each keeps a share of its pixels drawn in
    [``min_signal_percent``, 100] % (default 0: up to every pixel replaced by noise)."""
    learning_rate: LearningRate = 1e-4
    """Peak learning rate of Adam, decayed to 0 on a cosine over all epochs (no warm-up)."""
    batch_size: Annotated[int, Field(ge=2, le=4096)] = 64
    """Image versions per step; at most the number of versions (images × ``views``)."""
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    """Seed of each epoch's order and, with ``[data] seed``, of the versions; independent of ``[training] seed``, so
    builds that differ only in that seed share one tuned trunk."""


def split_trunk(trunk: nn.Sequential, first_module: str) -> tuple[nn.Sequential, nn.Sequential]:
    """(frozen part, tuned part) of ``trunk``: the modules before ``first_module`` (a dotted path through nested
    ``nn.Sequential`` containers) and that module with every one after it, in the order the trunk runs them. The
    parts hold the trunk's own modules, so tuning the second tunes the trunk."""
    head, _, rest = first_module.partition(".")
    names = list(trunk._modules)
    if not isinstance(trunk, nn.Sequential) or head not in names:
        raise ConfigError(f"[trunk_tuning] first_module {first_module!r}: {head!r} is not a module of this part of the "
                          f"trunk; its modules are {', '.join(names)}")
    index = names.index(head)
    before = [trunk._modules[n] for n in names[:index]]
    after = [trunk._modules[n] for n in names[index + 1:]]
    if not rest:
        return nn.Sequential(*before), nn.Sequential(trunk._modules[head], *after)
    inner_before, inner_after = split_trunk(trunk._modules[head], rest)
    return nn.Sequential(*before, inner_before), nn.Sequential(inner_after, *after)


def _pooled(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.flatten(F.adaptive_avg_pool2d(module(x), 1), 1)


def _frozen_outputs(tuning: TrunkTuningTable, data_seed: int, crop_scale, geometry: list, ids, frozen, base_trunk,
                    preprocessing: Preprocessing, progress: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen part's output of every version of every image (float16, (images, views, ...)) and the base
    network's pooled features of each clean image (the targets)."""
    outputs, targets = [], []
    bar = tqdm(total=len(geometry) * tuning.views, desc="trunk tuning: frozen part", unit="img", disable=not progress)
    with torch.no_grad():
        for start in range(0, len(geometry), 32):
            images = geometry[start:start + 32]
            clean = normalised_batch(images, preprocessing)
            targets.append(_pooled(base_trunk, clean))
            versions = [frozen(clean)]
            for view in range(1, tuning.views):
                versions.append(frozen(normalised_batch([
                    augmented_view(image, np.random.default_rng(
                        [data_seed, _VIEW_STREAM, tuning.seed, view, zlib.crc32(str(i).encode("utf-8"))]),
                        crop_scale, tuning.min_signal_percent)
                    for image, i in zip(images, ids[start:start + 32])], preprocessing)))
            outputs.append(torch.stack(versions, 1).half())
            bar.update(len(images) * tuning.views)
    bar.close()
    return torch.cat(outputs), torch.cat(targets)


def tune_trunk(tuning: TrunkTuningTable, data_seed: int, crop_scale, stimuli, trunk: nn.Sequential,
               base_trunk: nn.Module, preprocessing: Preprocessing, out_dir: Path, progress: bool = True,
               stop_after_epoch: int | None = None) -> list[dict]:
    """Tune ``trunk`` (in place; the base network's trunk as it came) so that its pooled features of noisy
    versions of ``stimuli`` match ``base_trunk``'s of the clean images (module docstring); returns the mean loss
    of each epoch. Resumes from ``out_dir/trunk_checkpoint.pt``; ``stop_after_epoch`` stops early (for tests)."""
    frozen, tuned = split_trunk(trunk, tuning.first_module)
    checkpoint = out_dir / CHECKPOINT_NAME
    history, start, state = [], 0, None
    if checkpoint.is_file():
        state = read_run_checkpoint(checkpoint, ("tuned", "history", "epoch"))
        tuned.load_state_dict(state["tuned"])
        history, start = list(state["history"]), int(state["epoch"])
        if start >= tuning.epochs:
            return history
    frozen.eval()
    tuned.eval()  # BatchNorm keeps the base network's statistics
    for parameter in frozen.parameters():
        parameter.requires_grad_(False)
    geometry = rgb_geometry(stimuli.images, preprocessing)
    inputs, targets = _frozen_outputs(tuning, data_seed, crop_scale, geometry, stimuli.stimulus_id, frozen,
                                      base_trunk.eval(), preprocessing, progress)
    variance = float(targets.var(0).mean())
    if not variance > 0:
        raise ConfigError("[trunk_tuning]: the base network's features of the training images do not vary, so there "
                          "is nothing to tune towards")
    optimiser = torch.optim.Adam(tuned.parameters(), lr=tuning.learning_rate)
    n_versions = len(inputs) * tuning.views
    steps_per_epoch = n_versions // tuning.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"[trunk_tuning] batch_size {tuning.batch_size} is larger than the {n_versions} versions "
                          "of the training images")
    total_steps = tuning.epochs * steps_per_epoch
    if state is not None:
        optimiser.load_state_dict(state["optimiser"])
    bar = tqdm(range(start, tuning.epochs), initial=start, total=tuning.epochs, desc="trunk tuning", unit="epoch",
               disable=not progress)
    for epoch in bar:
        order = torch.from_numpy(np.random.default_rng([tuning.seed, epoch]).permutation(n_versions))
        losses = []
        for step in range(steps_per_epoch):
            for group in optimiser.param_groups:
                progress_share = (epoch * steps_per_epoch + step) / total_steps
                group["lr"] = tuning.learning_rate * 0.5 * (1 + math.cos(math.pi * progress_share))
            picked = order[step * tuning.batch_size:(step + 1) * tuning.batch_size]
            image, view = picked // tuning.views, picked % tuning.views
            loss = ((_pooled(tuned, inputs[image, view].float()) - targets[image]) ** 2).mean() / variance
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
        history.append({"epoch": epoch, "loss": float(np.mean(losses))})
        bar.set_postfix(loss=f"{history[-1]['loss']:.3f}")
        done = epoch + 1
        atomic_save(checkpoint, lambda tmp: torch.save({"tuned": tuned.state_dict(), "optimiser": optimiser.state_dict(),
                                                        "history": history, "epoch": done}, tmp))
        if stop_after_epoch is not None and done >= stop_after_epoch:
            break
    for parameter in trunk.parameters():
        parameter.requires_grad_(True)
    trunk.eval()
    return history
