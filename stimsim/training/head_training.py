"""Build a ``topo_head`` model: a topographic IT trained on an ImageNet trunk (frozen, or its
last modules first tuned to see through pixel noise), from a TOML file.

``stimsim train CONFIG.toml --out DIR`` runs :func:`build_topo_head_model` when the file's ``[model]``
names a ``base_network``. The recipe:

1. **Images**: the configured stimulus sets (e.g. the fLoc localizer and the ImageNet samples), a seeded,
   class-stratified ``holdout_fraction`` of each held out for evaluation and experiments.
2. **Trunk features, cached**: every training image is shown in ``views`` versions — view 0 as the
   network receives it, the others randomly cropped (``crop_scale``), flipped, contrast-jittered and with a
   random fraction of pixels replaced by uniform noise (visual signal drawn in [``min_signal_percent``,
   100] %, as in :func:`stimsim.data.stimuli.pixel_noise`) — and the frozen trunk's pooled features of each
   version are computed once and cached; a version depends only on the data seed, the view and the image's
   id. The teacher output of every version is the base network's ImageNet output for view 0, so IT learns
   to see through noise.
   With ``[trunk_tuning]`` the trunk's last modules are first tuned so that their pooled features of noisy
   versions match the base network's of the clean image (:mod:`stimsim.training.trunk_tuning`); the teacher
   output stays the base network's.
3. **Training** IT and its readouts on those features (the trunk does not change): distillation to the base
   network's own ImageNet outputs (KL divergence at temperature ``distill_temperature``; no ImageNet labels),
   cross-entropy of the localizer's domains (``domain_weight``), TDANN's relative spatial loss on IT
   (``spatial_alpha``; Margalit et al. 2024) and an L1 penalty on IT activity (``activity_l1``: a sparse
   code, so that a site outside a cluster leaves the others' code alone). With ``feature_samples_per_step``
   every batch also holds feature vectors drawn from a Gaussian fitted to the cached features, for the
   distillation loss only (:class:`FeatureSampler`). Adam, cosine learning rate.
   Every draw of a step comes from (seed, step), so a run killed and resumed from ``DIR/checkpoint.pt``
   ends with the weights of an uninterrupted run (CPU). IT's first product is trained, or fixed to the
   features' principal components (``it_projection``). Once IT is densified its readouts are fitted again,
   by ``readout_steps`` distillation steps or in closed form (``readout_fit = "ridge"``,
   :mod:`stimsim.training.ridge_readout`), on every view or on the clean images alone (``readout_views``:
   a tuned trunk pulls noisy views only part of the way to the clean image's features, and a readout that
   must also map them to the clean image's output loses ImageNet top-1 on clean images).
4. **The physical scale**, fixed by the rule in ``[cortex_scale]`` before any stimulation experiment:
   with ``face_cluster_cortex_mm`` the largest face cluster of IT on the localizer images (faces against
   the other domains, smoothed d′ > 1, :func:`stimsim.cortex.topography.selective_clusters_mm`) is set to that
   many mm of macaque cortex; or a fixed ``cortex_mm_per_model_mm``.
5. **Storage**: weights rounded to float16 (``storage = "float16"``) before anything is measured, so the
   model that is evaluated is the model that is saved; IT's weights per unit, or as the trained grid's,
   which the network interpolates as it runs (``it_weights = "trained_grid"``).
6. **Resting activity**: each IT unit's mean response to the reference set of :mod:`stimsim.models.resting`,
   stored with the model, for the multiplicative stimulation's ``resting_fraction``.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from stimsim.cortex.sheet import CorticalSheet
from stimsim.models.base_networks import base_network_spec, base_weights_path, load_base_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.resting import reference_images, resting_activity
from stimsim.models.topo_head import FAMILY, TopoHeadNet, densify, grid_positions_mm
from stimsim.models.topographic import TopographicModel
from stimsim.models.weights import read_run_checkpoint
from stimsim.training.head_config import HeadConfig, load_head_config
from stimsim.training.holdout import check_sets_disjoint, kept_after_holdout
from stimsim.training.ridge_readout import ridge_readouts
from stimsim.training.schedule import warmup_cosine_rate
from stimsim.training.spatial_loss import layer_spatial_loss
from stimsim.training.trunk_features import FeatureSampler, principal_projection, trunk_features
from stimsim.training.trunk_tuning import split_trunk, tune_trunk
from stimsim.utilities.errors import ConfigError, TrainingDiverged
from stimsim.utilities.hashing import sha256_of
from stimsim.utilities.io import atomic_save, atomic_write_text, provenance

CHECKPOINT_NAME = "checkpoint.pt"


# --- images ---------------------------------------------------------------------------------------
def load_sets(config: HeadConfig, folder: Path, where: str):
    """The training images (a StimulusSet) and the held-out stimulus ids."""
    from stimsim.data.stimuli import StimulusSet, load_stimulus_source

    kept_sets, holdout, ids, values = [], [], [], set()
    for index, entry in enumerate(config.data.sets):
        entry = dict(entry)
        fraction = entry.pop("holdout_fraction", 0.0)
        stratified = entry.pop("holdout_stratified", True)
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
            raise ConfigError(f"{where} [data] sets[{index}]: 'holdout_fraction' must be a number in [0, 1), "
                              f"got {fraction!r}")
        if "path" in entry and not Path(entry["path"]).is_absolute():
            entry["path"] = str(folder / entry["path"])
        stimuli = load_stimulus_source(entry, f"{where} [data] sets[{index}]")
        ids.append(stimuli.stimulus_id)
        check_sets_disjoint(ids, f"{where} [data]")
        classes = np.asarray(stimuli.labels.get(config.data.label, np.full(len(stimuli), "")), str)
        values.update(map(str, classes))
        strata = classes if stratified is True else np.full(len(stimuli), "")
        keep = kept_after_holdout(strata, fraction, np.random.default_rng([config.data.seed, index]),
                                  f"{where} [data] sets[{index}] ({stimuli.name})")
        holdout += [str(s) for s in stimuli.stimulus_id[~keep]]
        kept = stimuli.subset(np.flatnonzero(keep))
        of_category = {c: d for d, categories in config.data.domains.items() for c in categories}
        labels = {"domain": np.array([of_category.get(str(c), "") for c in classes[keep]], dtype="<U64")}
        kept_sets.append(StimulusSet(kept.name, kept.images, kept.stimulus_id, labels))
    for domain, gathered in config.data.domains.items():
        absent = [value for value in gathered if value not in values]
        if absent:
            shown = sorted(values - {""})
            raise ConfigError(f"{where} [data.domains] {domain}: no image of the sets has {config.data.label} "
                              f"{absent}; a domain gathers values the images have: {shown[:12]}"
                              + (f" and {len(shown) - 12} more" if len(shown) > 12 else ""))
    return StimulusSet.concat(*kept_sets, name="training"), holdout


# --- training -------------------------------------------------------------------------------------
def _distillation_loss(logits, teacher_logits, temperature: float):
    """KL divergence of the student's softened outputs from the teacher's, × T² (Hinton et al. 2015)."""
    return F.kl_div(F.log_softmax(logits / temperature, 1), F.log_softmax(teacher_logits / temperature, 1),
                    reduction="batchmean", log_target=True) * temperature ** 2


def _batch(config: HeadConfig, sampler: FeatureSampler | None, rng: np.random.Generator, x, teacher, domains):
    """The step's batch with ``feature_samples_per_step`` sampled features appended (no domain label)."""
    n = config.training.feature_samples_per_step
    if sampler is None or n == 0:
        return x, teacher, domains
    samples, logits = sampler.draw(n, int(rng.integers(2 ** 62)))
    return torch.cat([x, samples]), torch.cat([teacher, logits]), torch.cat([domains, torch.full((n,), -1)])


def _losses(network: TopoHeadNet, config: HeadConfig, x, teacher, domains, coords, neighborhoods,
            n_images: int) -> dict:
    """The loss terms of one step; the first ``n_images`` rows of ``x`` are images' features (the spatial and
    activity terms are theirs), the others sampled features (distillation only)."""
    training = config.training
    it = network.it(x)
    distill = _distillation_loss(network.head(it), teacher, training.distill_temperature)
    losses = {"distill": distill}
    labelled = domains >= 0
    if network.domain_head is not None and bool(labelled.any()):
        losses["domain"] = F.cross_entropy(network.domain_head(it[labelled]), domains[labelled])
    losses["spatial"] = layer_spatial_loss(it[:n_images], coords, neighborhoods)
    losses["activity"] = it[:n_images].abs().mean()
    total = training.distill_weight * distill + training.spatial_alpha * losses["spatial"] \
        + training.activity_l1 * losses["activity"]
    if "domain" in losses:
        total = total + training.domain_weight * losses["domain"]
    losses["total"] = total
    return losses


def train_head(config: HeadConfig, network: TopoHeadNet, sheet, cached: dict, domains: np.ndarray, out_dir: Path,
               progress: bool = True, stop_after_step: int | None = None,
               sampler: FeatureSampler | None = None) -> list[dict]:
    """Train ``network``'s IT and readouts on cached trunk features (resumable); returns the loss history."""
    training = config.training
    fixed_rows = config.model.principal_rank
    fixed = ("trunk.", "it.0.") if fixed_rows == config.model.it_rank else ("trunk.",)
    params = [p for name, p in network.named_parameters() if not name.startswith(fixed)]
    optimiser = torch.optim.Adam(params, lr=training.learning_rate)
    checkpoint = out_dir / CHECKPOINT_NAME
    history, start = [], 0
    if checkpoint.is_file():
        state = read_run_checkpoint(checkpoint, ("network", "optimiser", "history", "step"))
        network.load_state_dict(state["network"])
        optimiser.load_state_dict(state["optimiser"])
        history, start = list(state["history"]), int(state["step"])
    features = torch.from_numpy(cached["features"])
    teacher = torch.from_numpy(cached["teacher"])
    domain_ids = torch.from_numpy(domains)
    coords = torch.from_numpy(sheet.coordinates_mm).float()
    all_neighborhoods = torch.from_numpy(np.asarray(sheet.neighborhood_indices))
    n_views, n_images = features.shape[:2]
    network.train()
    bar = tqdm(range(start, training.steps), initial=start, total=training.steps, desc="training IT",
               disable=not progress)
    for step in bar:
        rng = np.random.default_rng([training.seed, step])
        index = torch.from_numpy(rng.choice(n_images, size=min(training.batch_size, n_images), replace=False))
        view = torch.from_numpy(rng.integers(n_views, size=len(index)))
        picked = torch.from_numpy(rng.choice(len(all_neighborhoods), size=training.neighborhoods_per_step,
                                             replace=False))
        for group in optimiser.param_groups:
            group["lr"] = warmup_cosine_rate(training, step)
        x, targets, labels = _batch(config, sampler, rng, features[view, index], teacher[index], domain_ids[index])
        losses = _losses(network, config, x, targets, labels, coords, all_neighborhoods[picked], len(index))
        if not torch.isfinite(losses["total"]):
            raise TrainingDiverged(f"{config.name}: the loss became {float(losses['total'])} at step {step}")
        optimiser.zero_grad()
        losses["total"].backward()
        if 0 < fixed_rows < config.model.it_rank:
            # Adam without weight decay leaves an entry whose gradient is always 0 exactly where it is
            network.it[0].weight.grad[:fixed_rows] = 0
        optimiser.step()
        history.append({"step": step, **{k: float(v.detach()) for k, v in losses.items()}})
        bar.set_postfix(loss=f"{history[-1]['total']:.3f}")
        done = step + 1
        if done % training.checkpoint_every_steps == 0 or done == training.steps:
            atomic_save(checkpoint, lambda tmp: torch.save({"network": network.state_dict(), "step": done,
                                                            "optimiser": optimiser.state_dict(),
                                                            "history": history}, tmp))
        if stop_after_step is not None and done >= stop_after_step:
            break
    network.eval()
    return history


def tune_readouts(config: HeadConfig, network: TopoHeadNet, cached: dict, domains: np.ndarray,
                  progress: bool = True, sampler: FeatureSampler | None = None) -> list[dict]:
    """Fit the readouts of a densified network to the base network again (``readout_steps`` steps of the
    distillation and domain losses; IT stays as densified), since resampling their weights only approximates
    what the trained map's readouts computed."""
    training = config.training
    params = list(network.head.parameters()) + (
        list(network.domain_head.parameters()) if network.domain_head is not None else [])
    optimiser = torch.optim.Adam(params, lr=training.learning_rate / 4)
    features, teacher = torch.from_numpy(cached["features"]), torch.from_numpy(cached["teacher"])
    domain_ids = torch.from_numpy(domains)
    n_views, n_images = features.shape[:2]
    history = []
    for step in tqdm(range(training.readout_steps), desc="tuning readouts", disable=not progress):
        rng = np.random.default_rng([training.seed, training.steps + step])
        index = torch.from_numpy(rng.choice(n_images, size=min(training.batch_size, n_images), replace=False))
        view = torch.from_numpy(rng.integers(n_views, size=len(index)))
        x, targets, labels = _batch(config, sampler, rng, features[view, index], teacher[index], domain_ids[index])
        with torch.no_grad():
            it = network.it(x)
        distill = _distillation_loss(network.head(it), targets, training.distill_temperature)
        total = training.distill_weight * distill
        labelled = labels >= 0
        if network.domain_head is not None and bool(labelled.any()):
            total = total + training.domain_weight * F.cross_entropy(network.domain_head(it[labelled]),
                                                                     labels[labelled])
        optimiser.zero_grad()
        total.backward()
        optimiser.step()
        history.append({"step": training.steps + step, "phase": "readouts", "distill": float(distill.detach()),
                        "total": float(total.detach())})
    network.eval()
    return history


# --- the physical scale ---------------------------------------------------------------------------
def face_cluster_scale(model: TopographicModel, localizer, positive_domain: str, layer: str, target_mm: float):
    """(cortex mm per model mm, diameters of the face clusters in model mm): the largest cluster of units with
    smoothed face d′ > 1 on the localizer images is set to ``target_mm`` of cortex."""
    from stimsim.cortex.topography import selective_clusters_mm
    from stimsim.training.evaluation import face_dprime

    responses = model.activations(localizer.images, layer).numpy()
    dprime = face_dprime(responses, np.asarray(localizer.labels["domain"]) == positive_domain)
    sheet = model.sheet(layer)
    sigma = 0.02 * float(np.ptp(sheet.coordinates_mm[:, 0]))
    clusters = selective_clusters_mm(dprime, sheet, threshold=1.0, sigma_mm=sigma, grid_step_mm=sigma / 2)
    if not clusters:
        raise ConfigError(f"{model.name}: no face cluster (smoothed d' > 1) on the localizer, so the "
                          "face-cluster scale rule cannot be applied")
    return target_mm / clusters[0], clusters


def build_topo_head_model(path, out_dir, progress: bool = True, stop_after_step: int | None = None) -> Path:
    """Build the model a ``topo_head`` file describes into ``out_dir/model`` (see the module docstring)."""
    config, raw, folder = load_head_config(path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    where = str(path)
    started = time.process_time()
    spec = base_network_spec(config.model.base_network)
    preprocessing = Preprocessing.from_dict({**spec.preprocessing.to_dict(), **config.model.preprocessing})
    stimuli, holdout = load_sets(config, folder, where)
    domain_names = sorted({d for d in stimuli.labels["domain"] if d})
    domains = np.array([domain_names.index(d) if d else -1 for d in stimuli.labels["domain"]], np.int64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.training.seed)
        network = TopoHeadNet(config.model.base_network, config.model.trained_grid_side ** 2, config.model.it_rank,
                              config.model.head_rank, n_domains=len(domain_names))
    pretrained = config.model.base_weights == "imagenet"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.training.seed)
        base = load_base_network(config.model.base_network, pretrained=pretrained)
    base_sha256 = sha256_of(base_weights_path(config.model.base_network)) if pretrained else None
    trunk, classifier = spec.split(base)
    network.trunk.load_state_dict(trunk.state_dict())
    side, dense_side = config.model.trained_grid_side, config.model.grid_side
    trained_sheet = CorticalSheet("it", (side * side, 1, 1), grid_positions_mm(side, config.model.sheet_size_mm))
    try:  # before the trunk's features: a sheet the neighbourhoods do not fit fails at once
        trained_sheet = trained_sheet.with_neighborhoods(config.model.neighborhood_width_mm,
                                                         config.model.n_neighborhoods,
                                                         config.model.max_neighborhood_units, seed=config.training.seed)
    except ValueError as exc:
        raise ConfigError(f"{where} [model] neighborhood_width_mm: {exc}") from None
    tuning = config.trunk_tuning
    if tuning is not None:
        try:
            split_trunk(network.trunk, tuning.first_module)
        except ConfigError as exc:
            raise ConfigError(f"{where} {exc}") from None
        tuning_history = tune_trunk(tuning, config.data.seed, config.data.crop_scale, stimuli, network.trunk, trunk,
                                    preprocessing, out_dir, progress)
    cached = trunk_features(config, stimuli, network.trunk.eval(), classifier.eval(), preprocessing, base_sha256,
                            progress, teacher_trunk=None if tuning is None else trunk.eval())
    if config.model.principal_rank:
        with torch.no_grad():
            rows = config.model.principal_rank
            network.it[0].weight[:rows].copy_(principal_projection(cached["features"], rows))
    sampler = FeatureSampler(cached["features"], classifier.eval()) if config.training.feature_samples_per_step else None
    history = train_head(config, network, trained_sheet, cached, domains, out_dir, progress, stop_after_step, sampler)
    if stop_after_step is not None and len(history) < config.training.steps:
        return out_dir
    per_unit = config.model.it_weights == "per_unit"
    network = densify(network, side, dense_side, per_unit=per_unit)
    sheet = CorticalSheet("it", (dense_side ** 2, 1, 1), grid_positions_mm(dense_side, config.model.sheet_size_mm))
    architecture = {"family": FAMILY, "kwargs": {"base_network": config.model.base_network,
                                                 "it_units": config.model.grid_side ** 2,
                                                 "it_rank": config.model.it_rank,
                                                 "head_rank": config.model.head_rank,
                                                 "n_domains": len(domain_names),
                                                 **({} if per_unit else {"it_grid_side": side})}}

    def as_model(net, metadata=None):
        return TopographicModel(net, {"it": sheet}, preprocessing, architecture, readout_layer="it",
                                areas={"it": config.model.area}, name=config.name, metadata=metadata)

    rule = config.cortex_scale
    if rule.face_cluster_cortex_mm is not None:
        # the readouts do not change IT, so the scale is measured before they are fitted (a build the rule cannot
        # apply to stops here), on IT as the model file will hold it
        localizer = stimuli.subset(np.flatnonzero(domains >= 0))
        scale, clusters = face_cluster_scale(as_model(_as_stored(copy.deepcopy(network), config.model.storage)),
                                             localizer, config.data.positive_domain, "it", rule.face_cluster_cortex_mm)
        if progress:
            tqdm.write(f"face clusters on the localizer: {', '.join(f'{c:.2f}' for c in clusters[:5])} model mm; the "
                       f"largest spans {rule.face_cluster_cortex_mm:g} cortex mm, so the sheet is "
                       f"{scale * config.model.sheet_size_mm:.1f} cortex mm ({scale:.3f} cortex mm per model mm)")
    else:
        scale, clusters = rule.cortex_mm_per_model_mm, None
    if config.training.readout_fit == "ridge":
        readouts = {"readout_fit": "ridge", "readout_views": config.training.readout_views,
                    **ridge_readouts(config, network, cached, domains, classifier.eval(), progress,
                                     sampler if config.training.readout_views == "all" else None)}
    else:
        history += tune_readouts(config, network, cached, domains, progress, sampler)
        readouts = {"readout_fit": "distill"}
    metadata = {"training": raw, "builder": "stimsim.training.head_training.build_topo_head_model",
                "family": FAMILY, "base_network": config.model.base_network,
                "base_weights_sha256": base_sha256, "domains": domain_names,
                "holdout_stimulus_ids": holdout, "weights_storage": config.model.storage, "readouts": readouts,
                "training_cpu_s": round(time.process_time() - started, 1), "provenance": provenance()}
    if tuning is not None:
        metadata["trunk_tuning"] = {"first_module": tuning.first_module,
                                    "loss_by_epoch": [round(row["loss"], 6) for row in tuning_history]}
    model = as_model(_as_stored(network, config.model.storage), metadata)
    if clusters is not None:
        model.metadata["face_clusters_model_mm"] = [round(c, 4) for c in clusters[:10]]
    model.metadata["cortex_scale"] = {"layer": "it", "cortex_mm_per_model_mm": float(scale),
                                      "sheet_size_cortex_mm": float(scale * config.model.sheet_size_mm),
                                      "rule": rule.rule}
    images, reference = reference_images()
    model.sheets["it"] = dataclasses.replace(sheet, resting_activity=resting_activity(model, "it", images),
                                             resting_reference=reference)
    _write_history(out_dir / "loss_history.csv", history)
    model.save(out_dir / "model")
    return out_dir / "model"


def _as_stored(network: TopoHeadNet, storage: str) -> TopoHeadNet:
    """``network`` with its weights rounded as ``storage`` keeps them (in place; float16 values in float32)."""
    if storage == "float16":
        with torch.no_grad():
            for tensor in network.state_dict().values():
                if tensor.is_floating_point():
                    tensor.copy_(tensor.half().float())
    return network


def _write_history(path: Path, history: list[dict]) -> None:
    keys = list(dict.fromkeys(k for row in history for k in row))
    lines = [",".join(keys)] + [",".join(f"{row.get(k, '')}" for k in keys) for row in history]
    atomic_write_text(path, "\n".join(lines) + "\n")
