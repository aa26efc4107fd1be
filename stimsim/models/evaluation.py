"""Evaluating a topographic model: decoding accuracy, face selectivity and its clustering on IT.

Images used (none seen in training): the LFW crops the training run held out (listed in the model's
metadata; all 200 crops if the model records none) and Fashion-MNIST's test split.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from stimsim.models.topographic import TopographicModel
from stimsim.progress import report_phase
from stimsim.topography import clustering_test, plot_sheet_map

#: Moran's I neighbourhood radius (mm) for the face-d′ clustering statistic.
CLUSTER_RADIUS_MM = 1.0


def heldout_images(model: TopographicModel, objects_per_class: int = 50, seed: int = 0):
    """Held-out evaluation images: (StimulusSet, face mask, object-class labels)."""
    from stimsim.data.stimuli import StimulusSet, fashion_mnist, lfw_subset

    lfw = lfw_subset()
    held = set(model.metadata.get("holdout_stimulus_ids", []))
    if held:
        lfw = lfw.subset(np.array([sid in held for sid in lfw.stimulus_id]))
    objects = fashion_mnist(split="test", n_per_class=objects_per_class, seed=seed)
    stimuli = StimulusSet.concat(*(StimulusSet(s.name, s.images, s.stimulus_id, {"category": s.labels["category"]})
                                   for s in (lfw, objects)))
    categories = np.asarray(stimuli.labels["category"])
    return stimuli, categories == "face", categories


def face_dprime(responses: np.ndarray, is_face: np.ndarray) -> np.ndarray:
    """Per-unit face selectivity d′ = (μ_face − μ_other)/sqrt((σ²_face + σ²_other)/2); 0 for silent units."""
    from stimsim.behavior.metrics import dprime

    return dprime(responses[is_face], responses[~is_face])


def _cv_accuracy(features: np.ndarray, labels: np.ndarray, seed: int) -> float:
    decoder = make_pipeline(StandardScaler(), LogisticRegression(C=1e-2, max_iter=5000))
    folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=seed)
    return float(np.mean(cross_val_score(decoder, features, labels, cv=folds)))


def check_model(model: TopographicModel, n_shuffles: int = 1000, figure_path=None, seed: int = 0,
                progress: bool = False) -> dict:
    """The model's report card (see ``stimsim models check``); writes the face-d′ map if asked;
    ``progress`` reports each phase on stderr."""
    layer = model.resolve_layer("IT")
    sheet = model.sheet(layer)
    report_phase("models check: loading the held-out images", progress)
    stimuli, is_face, categories = heldout_images(model, seed=seed)
    report_phase(f"models check: responses of {layer} to {len(stimuli)} images", progress)
    responses = model.activations(stimuli.images, layer).numpy()
    dprime = face_dprime(responses, is_face)
    report_phase(f"models check: clustering of face d′ against {n_shuffles} position shuffles", progress)
    clustering = clustering_test(dprime, sheet.coordinates_mm, CLUSTER_RADIUS_MM, n_shuffles, seed)
    report_phase("models check: cross-validated face and object accuracy", progress)
    report = {
        "model": model.name,
        "layer": layer,
        "n_units": sheet.n_units,
        "sheet_mm": round(sheet.size_mm, 3),
        "units_per_mm2": round(sheet.density_per_mm2, 2),
        "n_images": {"face": int(is_face.sum()), "other": int((~is_face).sum())},
        "face_accuracy": _cv_accuracy(responses, is_face.astype(int), seed),
        "object_accuracy": _cv_accuracy(responses, categories, seed),
        "face_selective_fraction": float(np.mean(dprime > 1)),
        "cluster_statistic": "Moran's I of the face d' map, binary weights within "
                             f"{CLUSTER_RADIUS_MM} mm, one-sided p against {n_shuffles} position shuffles",
        "morans_i": clustering.morans_i,
        "morans_i_null_mean": clustering.null_mean,
        "cluster_p": clustering.p_value,
    }
    if figure_path is not None:
        plot_sheet_map(dprime, sheet, Path(figure_path),
                       f"{model.name}: face d′ on {layer}\nMoran's I {clustering.morans_i:.2f}, p = {clustering.p_value:.3g}")
        report["figure"] = str(figure_path)
    return report
