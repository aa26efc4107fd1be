"""Batched, cached simulation of (condition × image) → choice probabilities.

The engine follows the data flow of a perturbation experiment (Schrimpf et al. 2024, bioRxiv
2024.01.09.572970; Mehrer et al. 2025, arXiv 2510.03684): images run through the topographic model
up to the perturbed layer L, a condition's effect changes the activity of L's units
(``activity × multiplier + additive``, on the output flattened in C-major order), the later stages run
on the perturbed activity, and a frozen decoder reads its layer and returns choice probabilities.

:func:`simulate` computes the activity of L once per image (or reads it from the activation cache,
:mod:`stimsim.engine.activation_cache`) and reuses it for every condition, and builds the effects of a whole
chunk of conditions at once (:meth:`Condition.batch_effects`). Two paths then give the probabilities:

* exact fast path, when the decoder is linear in its features (``linear_weights``: logistic, N-way) and
  reads L itself: the logits of every (condition, image) pair are ``(A ⊙ m_c + d_c) @ Wᵀ + b``, computed as
  the control logits plus one float32 matrix product per chunk of conditions (see
  :meth:`_Runner._linear_readout`) — nothing of size conditions × images × units is formed;
* general path otherwise (stages after L, or a non-linear decoder such as same/different, whose
  ``|f_a − f_b|`` is not linear in the perturbed activity): the perturbed activity of batched (condition,
  image) pairs runs through the later stages and the decoder.

:func:`simulate_plain` is the reference: one full forward pass per condition with a hook on L, the effect
built by ``condition.effect``. All return the same labelled array. Chunks can run as Dask tasks
(``scheduler=``, :mod:`stimsim.engine.distributed`); everything computes on the chosen ``device``.

Conditions follow the ``stimsim.stimulation.Condition`` protocol (``label``, ``layer()``,
``effect(sheet)`` → an effect with ``multiplier``, ``additive`` and ``is_identity``, ``describe()``);
decoders follow the ``stimsim.behavior`` protocol (``layer``, ``choices``,
``probabilities(features (K, B, F), stimulus_index (B,)) → (K, B, n_choices)``).

Over 500 lines: the exact fast path, the plain path, the chunk plan and the resumable store are one engine
whose fingerprints must agree.
"""
from __future__ import annotations

import hashlib
import json
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from tqdm.auto import tqdm

from stimsim.data.stimuli import StimulusSet
from stimsim.engine.devices import resolve_device
from stimsim.engine.store import mark_finished, open_store, write_chunk
from stimsim.stimulation.base import apply_effect
from stimsim.stimulation.conditions import Condition
from stimsim.utilities.errors import ConfigError, SafetyError
from stimsim.utilities.hashing import canonical_json, json_sha256, tensor_sha256, update_with_tensors
from stimsim.utilities.progress import report_phase

#: Default memory budget for the perturbed activity of one pass (bytes).
DEFAULT_MAX_CHUNK_BYTES = 1 << 30


#: Coordinate names the engine sets itself; condition parameters and stimulus labels may not use them.
RESERVED_COORDS = ("condition", "stimulus_id", "choice", "perturbed_layer")

#: Live tensors of the largest later stage counted per (condition, image) pair when sizing chunks: a
#: residual block holds its input, its shortcut and two intermediate maps at once.
_LIVE_TENSORS_PER_STAGE = 4


def simulate(model, images, conditions, decoder, stimulus_ids=None, stimulus_coords=None, batch_size: int = 64,
             store=None, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES, progress: bool = True,
             safety_limits=None, safety_override: str | None = None, device=None, activation_cache=None,
             scheduler=None, replace_stale_store: bool = False) -> xr.DataArray:
    """Choice probabilities for every (condition, image) pair, computed in batches.

    Parameters
    ----------
    model : a ``TopographicModel``; it is moved to ``device`` when one is given (in place, as
        ``torch.nn.Module.to`` does).
    images : anything ``model.preprocess`` accepts (files, arrays in [0, 1] or uint8, tensors, a
        :class:`~stimsim.data.stimuli.StimulusSet`, whose ids label the images unless ``stimulus_ids`` is given).
    conditions : sequence of conditions with unique labels; a condition perturbs one layer that has a
        cortical sheet and does not come after the decoder's layer, or none (control).
    decoder : frozen decoder (``layer``, ``choices``, ``probabilities``). A decoder with
        ``linear_weights(device)`` (logistic, N-way) that reads the perturbed layer takes the exact fast path.
    stimulus_ids : one unique id per image (default ``image_00000``, ...).
    stimulus_coords : name → array of length n_images, extra labels on the ``stimulus_id`` dimension.
    batch_size : images per pass when computing unperturbed activity.
    store : directory; each finished chunk of conditions is written there atomically with a checksum
        bound to the store's inputs, and calling again with the same inputs resumes from it (finished
        chunks are loaded, not recomputed; a chunk that does not verify is named in a warning, removed
        and recomputed, never used).
    max_chunk_bytes : memory budget (bytes) of one chunk (perturbed activity through the later stages, or
        the weighted effect matrices of the fast path); decides how many conditions (and images) are batched
        together. The unperturbed activity of each perturbed layer (n_images × units, float32) is held besides.
    progress : show a progress bar over chunks.
    safety_limits : :class:`stimsim.stimulation.SafetyLimits` every electrical stimulation is checked
        against (default: the default limits); limits looser than the defaults count as an override.
    safety_override : reason (text) to simulate protocols that violate a limit; without it such a
        condition raises SafetyError. Recorded in the result's attrs.
    device : None (where the model is; the CPU for a freshly loaded model), ``"cpu"``, ``"cuda"``, ``"cuda:N"``,
        ``"mps"`` or ``"auto"``; model, preprocessing, effects and decoder all compute there
        (see :mod:`stimsim.engine.devices`).
    activation_cache : None/False (off), True (``$STIMSIM_CACHE_DIR/activations``) or a directory: the
        unperturbed activity of the perturbed layers is read from / written to it, keyed by model weights,
        layer, preprocessing and images, checksum verified (:mod:`stimsim.engine.activation_cache`).
    scheduler : None (this process), or a Dask scheduler — ``"local"``, ``"processes=N"``, a scheduler
        address or a ``distributed.Client``: chunks become Dask tasks (:mod:`stimsim.engine.distributed`); the result
        is the same.
    replace_stale_store : a ``store`` holding the unfinished sweep of other inputs is emptied and begun again;
        otherwise it is a ConfigError (a finished sweep's store is replaced by other inputs in any case).

    Returns
    -------
    xarray.DataArray
        ``choice_probability`` with dims (condition, stimulus_id, choice); coords: condition labels,
        ``perturbed_layer`` ("" for control), every parameter of ``Condition.describe()`` (NaN or "" where
        a condition lacks it) and the stimulus coords; attrs: model, perturbed layers, decoder layer,
        safety limits and override reason.
    """
    if isinstance(max_chunk_bytes, bool) or not isinstance(max_chunk_bytes, (int, np.integer)) or max_chunk_bytes < 1:
        raise ConfigError(f"max_chunk_bytes must be a positive integer (bytes), got {max_chunk_bytes!r}")
    if device is not None:
        model.to(resolve_device(device))
    setup = _Setup(model, images, conditions, decoder, stimulus_ids, stimulus_coords, batch_size, safety_limits,
                   safety_override)
    pool = None
    if scheduler is not None:
        from stimsim.engine.distributed import ChunkPool

        pool = ChunkPool(scheduler)
    try:
        chunks = _chunk_plan(setup, int(max_chunk_bytes), min_chunks=1 if pool is None else pool.min_chunks)
        probabilities = np.full((len(setup.conditions), setup.n_images, len(setup.choices)), np.nan)
        done = np.zeros(len(setup.conditions), dtype=bool)
        store_dir = store_id = None
        if store is not None:
            store_dir = Path(store)
            store_id = open_store(store_dir, _fingerprint(setup), {"n_conditions": len(setup.conditions),
                                                                    "n_images": setup.n_images,
                                                                    "choices": [str(c) for c in setup.choices]},
                                  probabilities, done, replace_stale=replace_stale_store)
        runner = _Runner(setup, _cache_directory(activation_cache))
        todo = [(layer, indices[~done[indices]], images_per_pass) for layer, indices, images_per_pass in chunks
                if not done[indices].all()]
        if len(todo) < len(chunks):  # a killed run's chunks, read back from the store
            report_phase(f"simulate: resuming: {len(chunks) - len(todo)} of {len(chunks)} chunks already stored",
                         progress)
        bar = tqdm(total=len(todo), desc="simulate", unit="chunk", disable=not progress)
        results = runner.run_all(todo) if pool is None else pool.run(runner, todo)
        for indices, values in results:  # written here only, once per chunk, in the order chunks finish
            probabilities[indices] = values
            done[indices] = True
            if store_dir is not None:
                write_chunk(store_dir, indices, values, store_id)
            bar.update()
        bar.close()
        if store_dir is not None:
            mark_finished(store_dir)
    finally:
        if pool is not None:
            pool.close()
    return _to_dataarray(setup, probabilities)


def chunk_count(model, images, conditions, decoder, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
                min_chunks: int = 1, batch_size: int = 64, safety_override: str | None = None) -> int:
    """How many chunks :func:`simulate` splits this sweep into under ``max_chunk_bytes`` (at least ``min_chunks``,
    as a run on Dask workers asks for)."""
    setup = _Setup(model, images, conditions, decoder, None, None, batch_size, None, safety_override)
    return len(_chunk_plan(setup, max_chunk_bytes, min_chunks))


def serial_work(model, images, conditions, decoder, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
                batch_size: int = 64, safety_override: str | None = None) -> None:
    """Compute what the calling process computes itself in a run of this sweep on Dask workers — the inputs, the
    activity of every perturbed layer and the control probabilities — and nothing more (to time that part)."""
    setup = _Setup(model, images, conditions, decoder, None, None, batch_size, None, safety_override)
    _Runner(setup).portable(_chunk_plan(setup, max_chunk_bytes))


def _cache_directory(activation_cache) -> Path | None:
    if activation_cache is None or activation_cache is False:
        return None
    if activation_cache is True:
        from stimsim.engine.activation_cache import default_directory

        return default_directory()
    if isinstance(activation_cache, (str, Path)):
        return Path(activation_cache)
    raise ConfigError(f"activation_cache must be None, True, False or a directory, got {activation_cache!r}")


def simulate_plain(model, images, conditions, decoder, stimulus_ids=None, stimulus_coords=None,
                   batch_size: int = 64, progress: bool = True, safety_limits=None,
                   safety_override: str | None = None, device=None) -> xr.DataArray:
    """Reference simulation: for each condition, a forward hook on the perturbed layer's stage applies the
    effect (``condition.effect``, one condition at a time) and the whole network runs from the images. Same
    arguments and output as :func:`simulate`."""
    if device is not None:
        model.to(resolve_device(device))
    setup = _Setup(model, images, conditions, decoder, stimulus_ids, stimulus_coords, batch_size, safety_limits,
                   safety_override)
    stage_modules = dict(model.stages)
    probabilities = np.empty((len(setup.conditions), setup.n_images, len(setup.choices)))
    for row, (condition, layer) in enumerate(tqdm(list(zip(setup.conditions, setup.layers)), desc="simulate (plain)",
                                                  unit="condition", disable=not progress)):
        handle = None
        effect = condition.effect(model.sheet(layer)) if layer is not None else None
        if effect is not None and not effect.is_identity:
            as_tensor = lambda values: torch.tensor(values, dtype=torch.float32, device=model.device)  # noqa: E731
            hook = _effect_hook(as_tensor(effect.multiplier), as_tensor(effect.additive))
            handle = stage_modules[layer].register_forward_hook(hook)
        try:
            for start in range(0, setup.n_images, batch_size):
                stop = min(start + batch_size, setup.n_images)
                features = model.run_stages(setup.inputs[start:stop], stop=setup.decoder_layer).flatten(1)
                probabilities[row, start:stop] = _decode(setup, features[None], start, stop)[0]
        finally:
            if handle is not None:
                handle.remove()
    return _to_dataarray(setup, probabilities)


# --- inputs ------------------------------------------------------------------------------------
class _Setup:
    """Validated inputs of one simulation: preprocessed images, resolved layers, labels."""

    def __init__(self, model, images, conditions, decoder, stimulus_ids, stimulus_coords, batch_size,
                 safety_limits=None, safety_override=None):
        if isinstance(model, (str, Path)):
            raise ConfigError(f"model is a name or path ({str(model)!r}); load it first: "
                              "stimsim.models.registry.load_model(name_or_path)")
        if isinstance(conditions, Condition):
            raise ConfigError("conditions is one Condition; give a list of them, e.g. [Condition(\"control\"), "
                              "condition]")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer (images per pass), got {batch_size!r}")
        for attribute in ("layer", "choices", "probabilities"):
            if not hasattr(decoder, attribute):
                raise ConfigError(f"decoder {type(decoder).__name__} has no {attribute!r}; a decoder needs "
                                  "layer, choices and probabilities(features, stimulus_index)")
        self.model = model
        self.decoder = decoder
        self.batch_size = int(batch_size)
        self.decoder_layer = model.resolve_layer(decoder.layer)
        self.choices = tuple(decoder.choices)
        if not self.choices:
            raise ConfigError("decoder.choices is empty; a decoder needs at least one choice label")
        self.conditions = list(conditions)
        if not self.conditions:
            raise ConfigError("no conditions given; pass at least one (an empty Condition is the control)")
        for position, condition in enumerate(self.conditions):
            if not isinstance(condition, Condition):
                raise ConfigError(f"conditions[{position}] is of type {type(condition).__name__}, not a Condition; wrap "
                                  f"perturbations in one, e.g. Condition(\"stim\", (perturbation,))")
        labels = [str(c.label) for c in self.conditions]
        repeated = sorted(label for label, count in Counter(labels).items() if count > 1)
        if repeated:
            raise ConfigError(f"condition labels must be unique; repeated: {repeated}")
        self.labels = labels
        self.safety = _safety_gate(self.conditions, safety_limits, safety_override)
        self.layers = [self._condition_layer(c) for c in self.conditions]
        self.inputs = model.preprocess(images)
        self.n_images = len(self.inputs)
        if stimulus_ids is None and isinstance(images, StimulusSet):
            stimulus_ids = images.stimulus_id
        if stimulus_ids is None:
            stimulus_ids = [f"image_{i:05d}" for i in range(self.n_images)]
        self.stimulus_ids = [str(s) for s in stimulus_ids]
        if len(self.stimulus_ids) != self.n_images:
            raise ConfigError(f"got {len(self.stimulus_ids)} stimulus_ids for {self.n_images} images")
        if len(set(self.stimulus_ids)) != self.n_images:
            raise ConfigError("stimulus_ids must be unique")
        self.descriptions = [dict(c.describe()) for c in self.conditions]
        self.parameter_coords = _parameter_coords(self.descriptions)
        self.stimulus_coords = self._stimulus_coords(stimulus_coords or {})
        self._digests: dict[str, str] = {}

    def fast_path(self, layer: str) -> bool:
        """Whether conditions at ``layer`` take the exact linear-readout fast path: the decoder reads ``layer``
        and is linear in its features (it has ``linear_weights``)."""
        return layer == self.decoder_layer and callable(getattr(self.decoder, "linear_weights", None))

    def weights_sha256(self) -> str:
        """sha256 of what the model's activations depend on besides the input: architecture, stages, weights."""
        if "weights" not in self._digests:
            from stimsim.engine.activation_cache import model_sha256

            self._digests["weights"] = model_sha256(self.model)
        return self._digests["weights"]

    def inputs_sha256(self) -> str:
        if "inputs" not in self._digests:
            self._digests["inputs"] = tensor_sha256(self.inputs)
        return self._digests["inputs"]

    def portable(self) -> "_Setup":
        """A copy without the input images, for worker processes that get the activity they need."""
        copy = object.__new__(_Setup)
        copy.__dict__.update(self.__dict__)
        copy.inputs = None
        return copy

    def _condition_layer(self, condition):
        layer = condition.layer()
        if layer is None:
            return None
        layer = self.model.resolve_layer(layer)
        self.model.sheet(layer)
        names = self.model.stage_names
        if names.index(layer) > names.index(self.decoder_layer):
            raise ConfigError(
                f"condition {condition.label!r} perturbs layer {layer!r}, which comes after the decoder's layer "
                f"{self.decoder_layer!r}; perturb the decoder's layer or an earlier one"
            )
        return layer

    def _stimulus_coords(self, coords: dict) -> dict:
        checked = {}
        for name, values in coords.items():
            if name in RESERVED_COORDS or name in self.parameter_coords:
                raise ConfigError(f"stimulus coord {name!r} clashes with a coordinate the engine sets "
                                  f"({list(RESERVED_COORDS)} and the condition parameters)")
            values = np.asarray(values)
            if values.shape != (self.n_images,):
                raise ConfigError(f"stimulus coord {name!r} must have one value per image ({self.n_images}), "
                                  f"got shape {values.shape}")
            checked[name] = values
        return checked


def _safety_gate(conditions: list, limits, override) -> dict[str, str]:
    """Check every perturbation that carries charge (``carries_charge``) against the safety limits
    (``stimsim.stimulation.enforce``); returns the attrs that record the limits and the override reason."""
    from stimsim.stimulation import SafetyLimits, enforce

    limits = SafetyLimits() if limits is None else limits
    if not isinstance(limits, SafetyLimits):
        raise ConfigError(f"safety_limits must be a SafetyLimits, got {type(limits).__name__}")
    overridden = False
    for condition in conditions:
        for perturbation in getattr(condition, "perturbations", ()):
            if perturbation.carries_charge:
                try:
                    overridden |= enforce(perturbation, limits, override=override).overridden
                except SafetyError as exc:
                    raise SafetyError(f"condition {condition.label!r}: {exc}") from None
    return {"safety_limits_json": json.dumps(limits.to_dict(), sort_keys=True),
            "safety_override": override.strip() if overridden else ""}


def _parameter_coords(descriptions: list[dict]) -> dict[str, np.ndarray]:
    """One array per parameter named by any condition: float (NaN where missing) when every given value is
    a number, bool when every condition gives a bool, else strings ("" where missing)."""
    names = list(dict.fromkeys(name for description in descriptions for name in description))
    coords = {}
    for name in names:
        if name in RESERVED_COORDS:
            raise ConfigError(f"condition parameter {name!r} clashes with a coordinate the engine sets "
                              f"{list(RESERVED_COORDS)}")
        given = [d[name] for d in descriptions if name in d]
        if len(given) == len(descriptions) and all(isinstance(v, (bool, np.bool_)) for v in given):
            coords[name] = np.array(given, dtype=bool)
        elif all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
                 for v in given):
            coords[name] = np.array([float(d[name]) if name in d else np.nan for d in descriptions])
        else:
            coords[name] = np.array([str(d[name]) if name in d else "" for d in descriptions], dtype=object)
    return coords


# --- chunking ----------------------------------------------------------------------------------
def _chunk_plan(setup: _Setup, max_chunk_bytes: int, min_chunks: int = 1) -> list[tuple[str | None, np.ndarray, int]]:
    """Chunks of conditions as (layer, condition indices, images per pass), grouped by layer in order of first
    appearance; the control conditions form one chunk. The perturbed conditions are split into at least
    ``min_chunks`` chunks when there are that many."""
    groups: dict[str | None, list[int]] = {}
    for index, layer in enumerate(setup.layers):
        groups.setdefault(layer, []).append(index)
    perturbed = [layer for layer in groups if layer is not None]
    units = {}
    if perturbed:
        example = setup.inputs[:1]
        dims = setup.model.stage_output_dims(example)
        units = {name: int(np.prod(d)) for name, d in dims.items()}
    n_perturbed = sum(len(groups[layer]) for layer in perturbed)
    names = setup.model.stage_names
    plan = []
    for layer, indices in groups.items():
        indices = np.asarray(indices, dtype=np.int64)
        if layer is None:
            plan.append((None, indices, setup.n_images))
            continue
        n_choices = len(setup.choices)
        if setup.fast_path(layer):
            # the weighted effect matrix (n_choices − 1, N) float32, the effects and their temporaries (about six
            # (N,) float64 rows) and the logits of every image
            condition_bytes = 4 * (n_choices - 1) * units[layer] + 48 * units[layer] + 24 * n_choices * setup.n_images
            per_chunk = max_chunk_bytes // condition_bytes
            if per_chunk < 1:
                raise ConfigError(f"max_chunk_bytes={max_chunk_bytes} is below the memory of one condition at "
                                  f"{layer!r} (about {condition_bytes} bytes); raise it")
            images_per_pass = setup.n_images
        else:
            later = names[names.index(layer):names.index(setup.decoder_layer) + 1]
            element_bytes = setup.inputs.element_size()
            pair_bytes = element_bytes * (units[layer] + _LIVE_TENSORS_PER_STAGE * max(units[name] for name in later))
            pairs = max_chunk_bytes // pair_bytes
            if pairs < 1:
                raise ConfigError(f"max_chunk_bytes={max_chunk_bytes} is below the memory of one (condition, image) "
                                  f"pair perturbed at {layer!r} (about {pair_bytes} bytes); raise it")
            images_per_pass = int(min(setup.n_images, pairs))
            per_chunk = max(1, pairs // setup.n_images)
        if min_chunks > 1:
            share = -(-len(indices) * min_chunks // n_perturbed)  # this layer's share of the chunks, rounded up
            per_chunk = min(per_chunk, max(1, -(-len(indices) // share)))
        per_chunk = int(per_chunk)
        plan.extend((layer, indices[i:i + per_chunk], images_per_pass) for i in range(0, len(indices), per_chunk))
    return plan


# --- computing ---------------------------------------------------------------------------------
class _Runner:
    """Runs chunks, caching unperturbed activity per layer and the control probabilities.

    Everything a chunk needs is here: :meth:`portable` gives a copy without the input images (activity of
    the needed layers precomputed, on the CPU) that :mod:`stimsim.engine.distributed` ships to worker processes."""

    def __init__(self, setup: _Setup, cache_directory: Path | None = None):
        self.setup = setup
        self.cache_directory = cache_directory
        self._activity: dict[str, torch.Tensor] = {}
        self._control: np.ndarray | None = None
        self._control_logits: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.setup.model.device

    def activity(self, layer: str) -> torch.Tensor:
        """Unperturbed output of ``layer`` for every image, (n_images, *layer output shape), on the device."""
        if layer not in self._activity:
            s = self.setup

            def compute():
                return torch.cat([s.model.run_stages(s.inputs[i:i + s.batch_size], stop=layer)
                                  for i in range(0, s.n_images, s.batch_size)])

            if self.cache_directory is None:
                self._activity[layer] = compute()
            else:
                from stimsim.engine.activation_cache import cached_activity, entry_key

                key = entry_key(s.weights_sha256(), layer, s.model.preprocessing.to_dict(), s.inputs_sha256())
                self._activity[layer] = cached_activity(
                    self.cache_directory, key, compute, device=self.device,
                    describe={"model": s.model.name, "layer": layer, "n_images": s.n_images},
                    compute_rows=lambda rows: s.model.run_stages(s.inputs[rows], stop=layer), n_rows=s.n_images)
        return self._activity[layer].to(self.device)

    def control(self) -> np.ndarray:
        """Unperturbed choice probabilities, (n_images, n_choices)."""
        if self._control is None:
            s = self.setup
            features = self.activity(s.decoder_layer).flatten(1)
            self._control = _decode(s, features[None], 0, s.n_images)[0]
        return self._control

    def run_all(self, chunks):
        """(condition indices, probabilities) of every chunk, in order."""
        for chunk in chunks:
            yield self.run(chunk)

    def run(self, chunk) -> tuple[np.ndarray, np.ndarray]:
        """One chunk (layer, condition indices, images per pass) → (indices, probabilities (k, n_images, n_choices))."""
        layer, indices, images_per_pass = chunk
        s = self.setup
        if layer is None:
            return indices, np.broadcast_to(self.control(), (len(indices),) + self.control().shape).copy()
        return indices, self.perturbed(layer, [s.conditions[i] for i in indices], images_per_pass)

    def portable(self, chunks) -> "_Runner":
        """A copy for other processes: the activity of every layer the ``chunks`` need (and the control) computed
        here and held on the CPU, without the input images."""
        layers = {layer for layer, _, _ in chunks if layer is not None}
        self.control()  # conditions whose effect is the identity get the control probabilities
        copy = _Runner(self.setup.portable(), None)
        copy._activity = {layer: self.activity(layer).cpu() for layer in layers}
        copy._control = self._control
        return copy

    def perturbed(self, layer: str, conditions: list, images_per_pass: int) -> np.ndarray:
        """Probabilities (k, n_images, n_choices) for conditions perturbing ``layer``."""
        s = self.setup
        result = np.empty((len(conditions), s.n_images, len(s.choices)))
        multiplier, additive = Condition.batch_effects(conditions, s.model.sheet(layer), self.device)
        scaled = (multiplier != 1.0).any(dim=1)
        shifted = (additive != 0.0).any(dim=1)
        identity = (~(scaled | shifted)).cpu().numpy()
        if identity.any():
            result[identity] = self.control()
        rows = np.flatnonzero(~identity)
        if len(rows) == 0:
            return result
        if len(rows) < len(conditions):
            keep = torch.as_tensor(rows, device=self.device)
            multiplier, additive, shifted = multiplier[keep], additive[keep], shifted[keep]
        if s.fast_path(layer):
            probabilities = self._linear_readout(layer, multiplier, additive if bool(shifted.any()) else None)
            result[rows] = probabilities.cpu().numpy()
            return result
        activity = self.activity(layer)
        shape = activity.shape[1:]
        flat = activity.flatten(1)
        m = multiplier[:, None, :].to(flat.dtype)
        a = additive[:, None, :].to(flat.dtype)
        for start in range(0, s.n_images, images_per_pass):
            stop = min(start + images_per_pass, s.n_images)
            perturbed = apply_effect(flat[None, start:stop], m, a)
            x = perturbed.reshape((len(rows) * (stop - start),) + tuple(shape))
            if layer != s.decoder_layer:
                x = s.model.run_stages(x, start=layer, stop=s.decoder_layer)
            result[rows, start:stop] = _decode(s, x.reshape(len(rows), stop - start, -1), start, stop)
        return result

    def _linear_readout(self, layer: str, multiplier: torch.Tensor, additive: torch.Tensor | None) -> torch.Tensor:
        """Exact fast path for a linear decoder reading the perturbed layer (k conditions, n_images, n_choices).

        The decoder's logits of image i under condition c are ``(a_i ⊙ m_c + d_c) · w_k + b_k`` for activity
        a_i, effect (m_c, d_c) and weights w_k. Softmax ignores a shift common to all choices, so with
        ``r_k = w_k − w_0`` the logits relative to choice 0 are the control logits ``a_i · r_k + b_k − b_0``
        (computed once, in float64) plus ``((m_c − 1) ⊙ r_k) · a_i + d_c · r_k``: the first term for all
        conditions and images is one float32 matrix product per chunk, (k·(n_choices−1), N) @ (N, n_images);
        nothing of size conditions × images × units exists. ``additive`` None means all zero."""
        weight, bias = self.setup.decoder.linear_weights(self.device)
        relative = weight[1:] - weight[0]
        if self._control_logits is None:
            flat = self.activity(layer).flatten(1)
            self._control_logits = flat.to(relative.dtype) @ relative.T + (bias[1:] - bias[0])
        flat32 = self.activity(layer).flatten(1).to(torch.float32)
        k, n_rel = len(multiplier), len(relative)
        excess = (multiplier - 1.0).to(torch.float32)
        if n_rel == 1:
            weighted = excess.mul_(relative.to(torch.float32))
        else:
            weighted = (excess[:, None, :] * relative.to(torch.float32)[None]).reshape(k * n_rel, -1)
        delta = (weighted @ flat32.T).reshape(k, n_rel, -1).transpose(1, 2)
        logits = delta.to(relative.dtype).add_(self._control_logits[None])
        if additive is not None:
            logits.add_((additive.to(relative.dtype) @ relative.T)[:, None, :])
        if n_rel == 1:  # softmax over (0, z): (sigmoid(−z), sigmoid(z))
            return torch.cat([torch.sigmoid(-logits), torch.sigmoid(logits)], dim=-1)
        return torch.softmax(torch.cat([torch.zeros_like(logits[..., :1]), logits], dim=-1), dim=-1)


def _effect_hook(multiplier: torch.Tensor | None, additive: torch.Tensor | None):
    """Forward hook replacing a stage's output by output × multiplier + additive (C-major flattening)."""
    def hook(module, inputs, output):
        if multiplier is None:
            return output
        flat = output.flatten(1)
        perturbed = apply_effect(flat, multiplier.to(flat.dtype), additive.to(flat.dtype))
        return perturbed.reshape(output.shape)

    return hook


def _decode(setup: _Setup, features: torch.Tensor, start: int, stop: int) -> np.ndarray:
    """Decoder probabilities for features (k, stop − start, F) of images start..stop − 1, as float64."""
    with torch.no_grad():
        out = setup.decoder.probabilities(features, torch.arange(start, stop, dtype=torch.long))
    out = torch.as_tensor(out)
    expected = (features.shape[0], stop - start, len(setup.choices))
    if tuple(out.shape) != expected:
        raise ValueError(f"decoder {type(setup.decoder).__name__}.probabilities returned shape {tuple(out.shape)}, "
                         f"expected {expected} (conditions, images, choices)")
    return out.detach().cpu().numpy().astype(np.float64)


# --- output ------------------------------------------------------------------------------------
def _to_dataarray(setup: _Setup, probabilities: np.ndarray) -> xr.DataArray:
    coords = {
        "condition": np.array(setup.labels, dtype=object),
        "stimulus_id": np.array(setup.stimulus_ids, dtype=object),
        "choice": list(setup.choices),
        "perturbed_layer": ("condition", np.array([layer or "" for layer in setup.layers], dtype=object)),
    }
    coords.update({name: ("condition", values) for name, values in setup.parameter_coords.items()})
    coords.update({name: ("stimulus_id", values) for name, values in setup.stimulus_coords.items()})
    names = setup.model.stage_names
    layers = sorted({layer for layer in setup.layers if layer is not None}, key=names.index)
    return xr.DataArray(probabilities, dims=("condition", "stimulus_id", "choice"), coords=coords,
                        name="choice_probability",
                        attrs={"model": setup.model.name, "perturbed_layers": ",".join(layers),
                               "decoder_layer": setup.decoder_layer, "units": "probability", **setup.safety})


def _fingerprint(setup: _Setup) -> dict[str, str]:
    """sha256 digests of what the result depends on: model (name, architecture, preprocessing, weights,
    sheets), preprocessed images, stimulus ids, conditions (label, layer, ``describe()`` and ``to_dict()``
    when they have one) and decoder."""
    model = setup.model
    model_digest = hashlib.sha256(canonical_json({
        "name": model.name, "architecture": model.architecture, "preprocessing": model.preprocessing.to_dict(),
        "stages": model.stage_names,
    }).encode())
    update_with_tensors(model_digest, model.network.state_dict())
    for layer in sorted(model.sheets):
        model_digest.update(layer.encode())
        model_digest.update(np.ascontiguousarray(model.sheets[layer].coordinates_mm).tobytes())
    images_digest = hashlib.sha256(str(tuple(setup.inputs.shape)).encode())
    update_with_tensors(images_digest, {"inputs": setup.inputs})
    conditions = [[label, layer, description, c.to_dict() if callable(getattr(c, "to_dict", None)) else None]
                  for label, layer, description, c in zip(setup.labels, setup.layers, setup.descriptions,
                                                          setup.conditions)]
    return {
        "model": model_digest.hexdigest(),
        "images": images_digest.hexdigest(),
        "stimulus_ids": json_sha256(setup.stimulus_ids),
        "conditions": json_sha256(conditions),
        "decoder": _decoder_fingerprint(setup),
    }


def _decoder_fingerprint(setup: _Setup) -> str:
    """Digest of the decoder's frozen numbers: its ``to_dict()`` when it has one, else its pickled state."""
    decoder = setup.decoder
    if callable(getattr(decoder, "to_dict", None)):
        state = canonical_json(decoder.to_dict())
    else:
        try:
            state = hashlib.sha256(pickle.dumps(decoder, protocol=4)).hexdigest()
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ConfigError(f"store= needs a decoder with to_dict() or one that can be pickled; "
                              f"{type(decoder).__name__} cannot be pickled ({exc})") from None
    return json_sha256([type(decoder).__qualname__, setup.decoder_layer, [str(c) for c in setup.choices], state])

