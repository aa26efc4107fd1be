"""Training topographic models: task loss + α · TDANN relative spatial loss, resumable.

``stimsim train CONFIG.toml --out DIR`` runs :func:`train`. Every random draw of a step (batch,
augmentation, spatial-loss neighbourhoods) is seeded by (seed, step), so a run killed and resumed
from its last checkpoint ends with exactly the weights of an uninterrupted run (on CPU). A step whose
loss or updated weights are not finite stops the run (:class:`~stimsim.utilities.errors.TrainingDiverged`
naming the step); the last good checkpoint stays as it was.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from stimsim.cortex.positions import build_sheet
from stimsim.models.architectures import build_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.topographic import TopographicModel
from stimsim.training.holdout import check_sets_disjoint, kept_after_holdout
from stimsim.training.memory import check_training_memory
from stimsim.training.schedule import warmup_cosine_rate
from stimsim.training.spatial_loss import layer_spatial_loss
from stimsim.training.train_file import TrainFile
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError, FileFormatError, TrainingDiverged
from stimsim.utilities.figures import pyplot, save_figure
from stimsim.utilities.filemodels import validate
from stimsim.utilities.hashing import canonical_json, changed_keys, json_sha256
from stimsim.utilities.io import atomic_save, atomic_write_json, atomic_write_text, provenance
from stimsim.utilities.limits import check_memory

CHECKPOINT_NAME = "checkpoint.pt"
@dataclass
class LayerSheetSpec:
    """Sheet of one topographic layer: side (mm), spatial-loss neighbourhood width (mm), area label."""
    sheet_size_mm: float
    neighborhood_width_mm: float
    area: str | None = None


@dataclass
class TrainingConfig:
    """Everything a training run needs, resolved from a :class:`~stimsim.training.train_file.TrainFile` by
    :func:`load_training_config` (the file model holds the defaults)."""
    name: str
    family: str
    model_kwargs: dict
    preprocessing: Preprocessing
    layers: dict[str, LayerSheetSpec]
    readout_layer: str | None
    data_sets: list[dict]
    label: str
    seed: int
    steps: int
    batch_size: int
    learning_rate: float
    momentum: float
    weight_decay: float
    warmup_steps: int
    task: str
    simclr_temperature: float
    augment: bool
    checkpoint_every_steps: int
    spatial_alpha: float
    spatial_layers: list[str]
    neighborhoods_per_step: int
    activity_l1: float
    activity_layers: list[str]
    cortex_scale: dict | None
    raw: dict
    source: str

    def fingerprint(self) -> str:
        return json_sha256(self.raw)[:16]


def load_training_config(path_or_dict) -> TrainingConfig:
    """Read and validate a training configuration (TOML path or already-parsed dict). A relative ``path``
    of a ``folder`` or ``table`` image set in a file is taken relative to the file's own folder."""
    raw = load_toml(path_or_dict) if isinstance(path_or_dict, (str, Path)) else dict(path_or_dict)
    where = str(path_or_dict) if isinstance(path_or_dict, (str, Path)) else "training config"
    checked = validate(TrainFile, raw, where, "stimsim train")
    pre = checked.model.preprocessing
    try:
        preprocessing = Preprocessing(size_px=pre.size_px, channels=pre.channels, mean=tuple(pre.mean),
                                      std=tuple(pre.std))
    except ConfigError as exc:
        raise ConfigError(f"{where} [model.preprocessing]: {exc}") from None
    layers = {name: LayerSheetSpec(layer.sheet_size_mm, layer.neighborhood_width_mm, layer.area)
              for name, layer in checked.model.layers.items()}
    sets = []  # copies: resolved paths stay out of the recorded configuration
    for entry in checked.data.sets:
        entry = entry.model_dump(exclude_unset=True)
        path = entry.get("path")
        if isinstance(path_or_dict, (str, Path)) and entry["source"] in ("folder", "table") and isinstance(path, str) \
                and path and not Path(path).is_absolute():  # relative to the configuration file, as in experiments
            entry["path"] = str((Path(path_or_dict).parent / path).absolute())
        sets.append(entry)
    cortex_scale = None
    if checked.cortex_scale is not None:
        cortex_scale = checked.cortex_scale.to_dict()
        cortex_scale["sheet_size_cortex_mm"] = round(
            cortex_scale["cortex_mm_per_model_mm"] * layers[cortex_scale["layer"]].sheet_size_mm, 3)
    training, spatial, activity = checked.training, checked.spatial_loss, checked.activity_penalty
    return TrainingConfig(
        name=checked.name, family=checked.model.family, model_kwargs=dict(checked.model.kwargs),
        preprocessing=preprocessing, layers=layers, readout_layer=checked.model.readout_layer, data_sets=sets,
        label=checked.data.label, **training.model_dump(), spatial_alpha=spatial.alpha,
        spatial_layers=list(spatial.layers), neighborhoods_per_step=spatial.neighborhoods_per_step,
        activity_l1=activity.l1, activity_layers=list(activity.layers), cortex_scale=cortex_scale, raw=raw,
        source=where)


def build_untrained_model(config: TrainingConfig) -> TopographicModel:
    """The network (seeded initial weights) with retinotopically initialised sheets."""
    torch.manual_seed(config.seed)
    try:
        network = build_network(config.family, **config.model_kwargs)
    except TypeError as exc:  # an unknown or wrongly typed builder argument
        raise ConfigError(f"{config.source} [model]: kwargs do not fit family {config.family!r} ({exc})") from None
    except ConfigError as exc:
        raise ConfigError(f"{config.source} [model]: {exc}") from None
    modules = dict(network.named_modules())
    wanted_stages = [layer for layer in [*config.layers, config.readout_layer] if layer and layer in modules]
    try:
        probe = TopographicModel(network, {}, config.preprocessing, {"family": config.family, "kwargs": config.model_kwargs},
                                 stage_layers=wanted_stages)
    except ConfigError as exc:
        raise ConfigError(f"{config.source} [model.layers]: {exc}") from None
    size = config.preprocessing.size_px
    dims = probe.stage_output_dims(torch.zeros(2, config.preprocessing.channels, size, size))
    sheets = {}
    for i, (layer, spec) in enumerate(config.layers.items()):
        if layer not in dims:
            raise ConfigError(f"{config.source} [model.layers] {layer!r} is not a stage of {config.family}; "
                              f"stages: {list(dims)}")
        try:
            sheets[layer] = build_sheet(layer, dims[layer], spec.sheet_size_mm, spec.neighborhood_width_mm,
                                        seed=config.seed * 100 + i)
        except (ValueError, ConfigError) as exc:
            raise ConfigError(f"{config.source} [model.layers.{layer}]: {exc}") from None
        available = len(sheets[layer].neighborhood_indices)
        if layer in config.spatial_layers and config.neighborhoods_per_step > available:
            raise ConfigError(f"{config.source} [spatial_loss]: 'neighborhoods_per_step' must be <= {available}, the number "
                              f"of neighbourhoods on the sheet of layer {layer!r}, got {config.neighborhoods_per_step}")
    areas = {layer: spec.area for layer, spec in config.layers.items() if spec.area}
    readout = config.readout_layer
    if readout and readout not in dims and readout not in modules and \
            readout not in areas.values():
        raise ConfigError(f"{config.source} [model] readout_layer {readout!r} is neither a stage of {config.family} "
                          f"nor an area of [model.layers]; stages: {list(dims)}, areas: {sorted(areas.values())}")
    return TopographicModel(network, sheets, config.preprocessing, {"family": config.family, "kwargs": config.model_kwargs},
                            readout_layer=readout, areas=areas, name=config.name)


def _check_output_width(model: TopographicModel, config: TrainingConfig, n_classes: int) -> None:
    """The network's output is one row of scores per image: as many as the data's classes for the supervised
    task (an embedding of any width for SimCLR)."""
    size = config.preprocessing.size_px
    device = next(model.network.parameters(), torch.zeros(())).device
    with torch.no_grad():
        shape = tuple(model.network(torch.zeros(2, config.preprocessing.channels, size, size, device=device)).shape)
    if len(shape) != 2:
        raise ConfigError(f"{config.source} [model]: family {config.family!r} outputs a tensor of shape {shape} for 2 "
                          "images; training needs one row of scores per image, (images, outputs)")
    if config.task == "supervised" and shape[1] != n_classes:
        raise ConfigError(f"{config.source} [model]: family {config.family!r} outputs {shape[1]} scores per image "
                          f"(kwargs {config.model_kwargs}) but the data have {n_classes} classes; the supervised task "
                          "needs one score per class")


def augment_batch(batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random affine (rotation ±15°, scale 0.75–1.25, shift ±15 %), horizontal flip, contrast 0.7–1.3
    and brightness ±0.3 (normalised units) per image; deterministic given ``generator``."""
    n = batch.shape[0]

    def uniform(low, high):
        return low + (high - low) * torch.rand(n, generator=generator)

    angle = uniform(-math.pi / 12, math.pi / 12)
    scale = uniform(0.75, 1.25)
    flip = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0)
    shift = uniform(-0.15, 0.15), uniform(-0.15, 0.15)
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos * flip, -sin, shift[0]], 1), torch.stack([sin * flip, cos, shift[1]], 1)], 1)
    grid = F.affine_grid(theta, list(batch.shape), align_corners=False)
    warped = F.grid_sample(batch, grid, padding_mode="zeros", align_corners=False)
    contrast = uniform(0.7, 1.3).view(-1, 1, 1, 1)
    brightness = uniform(-0.3, 0.3).view(-1, 1, 1, 1)
    return warped * contrast + brightness


def simclr_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent loss of SimCLR (Chen et al. 2020) for two views (B, D) of the same images."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    similarity = z @ z.T / temperature
    similarity.fill_diagonal_(float("-inf"))
    n = z1.shape[0]
    targets = torch.cat([torch.arange(n, 2 * n, device=z.device), torch.arange(0, n, device=z.device)])
    return F.cross_entropy(similarity, targets)


@dataclass
class TrainingData:
    """Training images (preprocessed, normalised) by class, plus the held-out stimulus ids."""
    images: torch.Tensor
    labels: np.ndarray
    classes: list[str]
    holdout_ids: list[str]

    def sample(self, rng: np.random.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A class-balanced batch: classes drawn uniformly, then an image of that class."""
        classes = rng.integers(len(self.classes), size=batch_size)
        index = np.array([rng.choice(self._members[c]) for c in classes])
        return self.images[index], torch.as_tensor(classes)

    def sha256(self) -> str:
        """Checksum of the images, their classes and the held-out ids: a run resumes only on the data it started
        with (an image added to a folder moves the split)."""
        digest = hashlib.sha256(np.ascontiguousarray(self.images.numpy()).tobytes())
        digest.update(np.ascontiguousarray(self.labels).tobytes())
        digest.update(json.dumps([self.classes, sorted(self.holdout_ids)]).encode("utf-8"))
        return digest.hexdigest()

    def __post_init__(self):
        self._members = [np.flatnonzero(self.labels == i) for i in range(len(self.classes))]
        empty = [self.classes[i] for i, m in enumerate(self._members) if len(m) == 0]
        if empty:
            raise ConfigError(f"no training images for class(es) {empty}")


def load_training_data(config: TrainingConfig) -> TrainingData:
    """Build the training images from the configured stimulus sets, holding out a seeded,
    class-stratified fraction of each set (``holdout_fraction``) for evaluation."""
    from stimsim.data.stimuli import load_stimulus_source

    images, labels, holdout, ids = [], [], [], []
    for index, entry in enumerate(config.data_sets):
        entry = dict(entry)
        fraction = float(entry.pop("holdout_fraction", 0.0))
        where = f"{config.source} [data] sets[{index}]"
        stimuli = load_stimulus_source(entry, where)
        if config.label not in stimuli.labels:
            raise ConfigError(f"{where} ({stimuli.name}): no label {config.label!r}; labels: {list(stimuli.labels)}")
        ids.append(stimuli.stimulus_id)
        check_sets_disjoint(ids, f"{config.source} [data]")
        keep = kept_after_holdout(stimuli.labels[config.label], fraction, np.random.default_rng(config.seed),
                                  f"{where} ({stimuli.name})")
        holdout += [sid for sid, k in zip(stimuli.stimulus_id, keep) if not k]
        kept = stimuli.subset(np.flatnonzero(keep))
        pre = config.preprocessing
        held = sum(block.numel() * block.element_size() for block in images)
        # float32 inputs of these images beside those before them, and the copy that joins them at the end
        check_memory(f"{where} ({stimuli.name}): {len(kept)} training images at {pre.size_px} px",
                     2 * (held + len(kept) * pre.channels * pre.size_px ** 2 * 4),
                     "[model.preprocessing] size_px or the number of training images ([data] sets)")
        images.append(pre(kept.images))
        labels += list(kept.labels[config.label])
    classes = sorted(set(labels))
    index = {c: i for i, c in enumerate(classes)}
    return TrainingData(torch.cat(images), np.array([index[c] for c in labels]), classes, holdout)


def _forward_with_layers(model: TopographicModel, x: torch.Tensor, keep: set[str]):
    outputs = {}
    for name, module in model.stages:
        x = module(x)
        if name in keep:
            outputs[name] = x
    return x, outputs


def train(config: TrainingConfig, out_dir, progress: bool = True, stop_after_step: int | None = None,
          data: TrainingData | None = None, device="cpu") -> Path:
    """Train (or resume) into ``out_dir``; returns the saved model directory ``out_dir/model``.

    ``stop_after_step`` ends the run early after that step's checkpoint (used to test resuming).
    ``device`` (cpu, cuda, mps, auto) is where the network trains; batches are drawn and augmented on the
    CPU (seeded), checkpoints and the saved model hold CPU tensors.
    """
    from stimsim.engine.devices import resolve_device

    device = resolve_device(device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    check_training_memory(config, on_cpu=device.type == "cpu")
    model = build_untrained_model(config)  # before the data: a misfit architecture fails at once
    model = model.to(device)
    data = data or load_training_data(config)
    if config.task == "supervised" and len(data.classes) < 2:
        raise ConfigError(f"{config.source} [data]: every training image has the same {config.label!r}, "
                          f"{str(data.classes[0])!r}; the supervised task needs images of at least 2 classes")
    _check_output_width(model, config, len(data.classes))
    network = model.network
    optimizer = torch.optim.SGD(network.parameters(), lr=config.learning_rate, momentum=config.momentum,
                                weight_decay=config.weight_decay, nesterov=config.momentum > 0)
    coords = {layer: torch.as_tensor(model.sheets[layer].coordinates_mm, dtype=torch.float32, device=device)
              for layer in config.spatial_layers}
    neighborhoods = {layer: torch.as_tensor(model.sheets[layer].neighborhood_indices, device=device)
                     for layer in config.spatial_layers}
    start, history, cpu_seconds = 0, [], 0.0
    checkpoint_path = out_dir / CHECKPOINT_NAME
    data_sha256 = data.sha256()
    if checkpoint_path.exists():
        start, history, cpu_seconds = _resume(checkpoint_path, config, network, optimizer, data_sha256)

    network.train()
    clock = time.process_time()
    bar = tqdm(range(start, config.steps), initial=start, total=config.steps, desc=f"train {config.name}",
               disable=not progress)
    for step in bar:
        rng = np.random.default_rng([config.seed, step])
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine_rate(config, step)
        images, targets = data.sample(rng, config.batch_size)
        view = augment_batch(images, generator) if config.augment else images
        logits, layer_out = _forward_with_layers(model, view.to(device), set(config.spatial_layers) | set(config.activity_layers))
        if config.task == "supervised":
            task_loss = F.cross_entropy(logits, targets.to(device))
        else:
            second, _ = _forward_with_layers(model, augment_batch(images, generator).to(device), set())
            task_loss = simclr_loss(logits, second, config.simclr_temperature)
        spatial = {}
        for layer in config.spatial_layers:
            pick = rng.choice(len(neighborhoods[layer]), size=config.neighborhoods_per_step, replace=False)
            spatial[layer] = layer_spatial_loss(layer_out[layer].flatten(1), coords[layer], neighborhoods[layer][pick])
        activity = {layer: layer_out[layer].abs().mean() for layer in config.activity_layers}
        total = (task_loss + config.spatial_alpha * sum(spatial.values(), torch.zeros((), device=device))
                 + config.activity_l1 * sum(activity.values(), torch.zeros((), device=device)))
        if not torch.isfinite(total):
            _diverged(f"the loss is not finite (task loss {task_loss.item()}, total {total.item()})", step, config,
                      history, out_dir, bar)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        bad = [name for name, value in network.state_dict().items()
               if value.is_floating_point() and not torch.isfinite(value).all()]
        if bad:
            _diverged(f"the weights are not finite after the update ({', '.join(bad[:3])})", step, config, history,
                      out_dir, bar)
        record = {"step": step + 1, "lr": optimizer.param_groups[0]["lr"], "task_loss": task_loss.item(),
                  "total_loss": total.item()}
        record.update({f"spatial_loss_{layer}": value.item() for layer, value in spatial.items()})
        record.update({f"mean_activity_{layer}": value.item() for layer, value in activity.items()})
        history.append(record)
        bar.set_postfix(task=f"{record['task_loss']:.3f}",
                        spatial=f"{np.mean([v for k, v in record.items() if k.startswith('spatial')] or [0]):.3f}")
        done = step + 1
        if done % config.checkpoint_every_steps == 0 or done == config.steps or done == stop_after_step:
            cpu_total = cpu_seconds + time.process_time() - clock
            atomic_save(checkpoint_path, lambda tmp: torch.save(_to_cpu({
                "fingerprint": config.fingerprint(), "config_json": canonical_json(config.raw),
                "data_sha256": data_sha256, "step": done,
                "network": network.state_dict(),
                "optimizer": optimizer.state_dict(), "history": history, "cpu_seconds": cpu_total}), tmp))
        if done == stop_after_step:
            break
    bar.close()
    cpu_seconds += time.process_time() - clock
    model.to("cpu")
    network.eval()
    write_history(history, out_dir)
    if len(history) < config.steps:
        return out_dir
    model.metadata = {"training": config.raw, "classes": data.classes, "holdout_stimulus_ids": data.holdout_ids,
                      "training_cpu_seconds": round(cpu_seconds, 1), "provenance": provenance()}
    if config.cortex_scale:
        model.metadata["cortex_scale"] = config.cortex_scale
    model.save(out_dir / "model")
    atomic_write_json(out_dir / "training_run.json", {**provenance(config.raw), "cpu_seconds": round(cpu_seconds, 1),
                                                      "steps": config.steps})
    return out_dir / "model"


def _resume(checkpoint_path: Path, config: TrainingConfig, network, optimizer,
            data_sha256: str) -> tuple[int, list, float]:
    """Load a checkpoint of this configuration and training data (``data_sha256``: :meth:`TrainingData.sha256`)
    into ``network`` and ``optimizer``; returns (step, history, CPU seconds)."""
    from stimsim.models.weights import load_weights, read_run_checkpoint

    state = read_run_checkpoint(checkpoint_path, ("fingerprint", "step", "network", "optimizer", "history",
                                                  "cpu_seconds"))
    if state["fingerprint"] != config.fingerprint():
        changed = ""
        if isinstance(state.get("config_json"), str):  # checkpoints written before it was stored name no key
            keys = changed_keys(json.loads(state["config_json"]), json.loads(canonical_json(config.raw)))
            changed = f" (changed: {', '.join(keys[:5])}{f' and {len(keys) - 5} more' if len(keys) > 5 else ''})"
        raise ConfigError(f"{checkpoint_path} belongs to a different configuration{changed}; a run resumes only "
                          "with the configuration it started with: use another --out directory")
    if state.get("data_sha256", data_sha256) != data_sha256:  # checkpoints written before it was stored: not checked
        raise ConfigError(f"{checkpoint_path} was trained on other images than the configuration's sources give now "
                          "(an image added, removed or changed since: the held-out split would move); a run resumes "
                          "only on the data it started with: restore the images or use another --out directory")
    load_weights(network, state["network"], source=checkpoint_path)
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (ValueError, KeyError, TypeError) as exc:
        raise FileFormatError(checkpoint_path, f"optimizer state does not fit this configuration ({exc})") from None
    return state["step"], state["history"], state["cpu_seconds"]


def _diverged(problem: str, step: int, config: TrainingConfig, history: list, out_dir: Path, bar) -> None:
    """Stop a diverging run: write the loss history so far and raise TrainingDiverged naming the step."""
    bar.close()
    write_history(history, out_dir)
    good = history[-1]["step"] if history else 0
    kept = (f"the last good checkpoint ({out_dir / CHECKPOINT_NAME}) is kept" if (out_dir / CHECKPOINT_NAME).exists()
            else "no checkpoint was written yet")
    raise TrainingDiverged(f"training {config.name!r} diverged at step {step + 1}: {problem}; nothing of this step "
                           f"is saved ({kept}; last finite step {good}). Lower learning_rate (now "
                           f"{config.learning_rate:g}) or spatial_loss alpha (now {config.spatial_alpha:g}).")


def _to_cpu(state):
    """A checkpoint with every tensor on the CPU (it then loads on any machine)."""
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, dict):
        return {key: _to_cpu(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_to_cpu(value) for value in state)
    return state


def write_history(history: list[dict], out_dir: Path):
    """Loss curves as ``loss_history.csv`` and ``loss_curves.png`` (task and per-layer spatial loss)."""
    if not history:
        return
    import io

    plt = pyplot()
    keys = list(history[-1])
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows(history)
    atomic_write_text(out_dir / "loss_history.csv", buffer.getvalue())
    steps = [h["step"] for h in history]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    axes[0].plot(steps, [h["task_loss"] for h in history], lw=0.8)
    axes[0].set(xlabel="step", ylabel="task loss", title="task loss")
    for key in keys:
        if key.startswith("spatial_loss_"):
            axes[1].plot(steps, [h[key] for h in history], lw=0.8, label=key.removeprefix("spatial_loss_"))
    axes[1].set(xlabel="step", ylabel="spatial loss", title="spatial loss per layer")
    if axes[1].lines:
        axes[1].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out_dir / "loss_curves.png", dpi=110)
