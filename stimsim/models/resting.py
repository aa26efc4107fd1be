"""Resting activity of a model's units: what the multiplicative form of electrical stimulation can act on.

A network unit after a ReLU is silent on an image that does not drive it, so a gain (activity × g) leaves it
silent; a cortical neuron has a resting rate that stimulation raises. A model can record, per unit of a
topographic layer, a resting activity ``s``: its mean response to a fixed set of reference images. With
``resting_fraction = K`` the multiplicative form then changes activity ``a`` to ``g·a + (g − 1)·K·s``
(:class:`~stimsim.stimulation.electrical.ElectricalStimulation`); K = 0 is the plain gain.

The file is ``resting/<layer>.npz`` in the model directory (``activity``: float32 per unit of the layer, in its
order; ``reference``: how it was measured; written and read by the sheet,
:meth:`~stimsim.cortex.sheet.CorticalSheet.save_resting`), listed in ``model.json`` (the layer's
``resting_activity_file``) and covered by ``files_sha256`` like every other file of the model.
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np

from stimsim.models.topographic import TopographicModel
from stimsim.utilities.errors import DataError
from stimsim.utilities.hashing import sha256_of
from stimsim.utilities.io import atomic_write_json
from stimsim.utilities.progress import report_phase

#: fLoc's object categories (all but ``scrambled``) and how many of each, in path order, make the reference set.
REFERENCE_CATEGORIES = ("adult", "child", "body", "limb", "house", "corridor", "word", "number", "car", "instrument")
REFERENCE_PER_CATEGORY = 16


def reference_images(mirror=None):
    """The reference set: the first :data:`REFERENCE_PER_CATEGORY` fLoc images of each of
    :data:`REFERENCE_CATEGORIES` (160 images), and its description."""
    from stimsim.data.stimuli import floc

    stimuli = floc(REFERENCE_CATEGORIES, n_per_category=REFERENCE_PER_CATEGORY, mirror=mirror)
    description = (f"mean response to fLoc's first {REFERENCE_PER_CATEGORY} images (path order) of each of "
                   f"{', '.join(REFERENCE_CATEGORIES)} ({len(stimuli.images)} images; Stigliani et al. 2015)")
    return stimuli.images, description


def resting_activity(model, layer: str, images) -> np.ndarray:
    """Each unit's mean response of ``layer`` to ``images`` (activation units), float64 (N,)."""
    return model.activations(images, layer).double().mean(dim=0).numpy()


def _unlist_damaged_resting(directory: Path) -> list[str]:
    """Unlist from ``model.json`` (layer entry and sha256) every resting-activity file that is missing or does not
    match its sha256, what this module writes again; the files unlisted."""
    spec_path = directory / "model.json"
    if not spec_path.is_file():
        return []
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    damaged = []
    for info in spec["layers"].values():
        rel = info.get("resting_activity_file")
        if rel is not None and not ((directory / rel).is_file()
                                    and sha256_of(directory / rel) == spec["files_sha256"].get(rel)):
            damaged.append(rel)
            del info["resting_activity_file"]
            spec["files_sha256"].pop(rel, None)
    if damaged:
        atomic_write_json(spec_path, spec)
    return damaged


def write_resting_activity(directory, layer: str = "IT", mirror=None, device="cpu", progress: bool = False) -> Path:
    """Measure the resting activity of ``layer`` of the model in ``directory`` on the reference set
    (:func:`reference_images`), computed on ``device``, write ``resting/<layer>.npz`` and list it in ``model.json``
    with its sha256. The model's other files are left as they are. Returns the file written. ``progress``: the
    phases on stderr."""
    directory = Path(directory)
    report_phase(f"models resting: loading the model in {directory} (checksums included)", progress)
    try:
        model = TopographicModel.load(directory, device=device)
    except DataError:
        damaged = _unlist_damaged_resting(directory)
        if not damaged:
            raise
        warnings.warn(f"model {directory}: resting-activity file(s) {damaged} missing or not matching their sha256 "
                      "were unlisted from model.json so that the model loads (measure a layer's again with "
                      "`stimsim models resting DIR --layer LAYER`)")
        model = TopographicModel.load(directory, device=device)
    layer = model.resolve_layer(layer)
    report_phase("models resting: reading the reference images (fLoc)", progress)
    images, reference = reference_images(mirror)
    report_phase(f"models resting: the response of the {model.sheet(layer).n_units:,} units of {layer} to "
                 f"{len(images)} images on {device}", progress)
    rel = f"resting/{layer}.npz"
    sheet = dataclasses.replace(model.sheet(layer), resting_activity=resting_activity(model, layer, images),
                                resting_reference=reference)
    path = sheet.save_resting(directory / rel)
    spec = json.loads((directory / "model.json").read_text(encoding="utf-8"))
    spec["layers"][layer]["resting_activity_file"] = rel
    spec["files_sha256"][rel] = sha256_of(path)
    atomic_write_json(directory / "model.json", spec)
    return path
