"""Evaluating a topographic model: decoding, selectivity and its clustering on IT.

Images used (none seen in training): the LFW crops the training run held out (listed in the model's
metadata; all 200 crops if the model records none) and Fashion-MNIST's test split; or any labelled
stimulus set (``stimuli``, ``label``, ``positive``: then the ``face_*`` numbers are those of the
``positive`` class).

Decoders are the project's: a logistic regression on standardised IT responses with C = 1e-3 (the
regularisation of every experiment's decoder, as in the Brain-Score behavioural benchmarks),
cross-validated with stratified folds. Every score is reported beside its chance level.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score, roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from stimsim.errors import ConfigError
from stimsim.models.topographic import TopographicModel
from stimsim.progress import report_phase
from stimsim.topography import clustering_test, plot_sheet_map

#: Moran's I neighbourhood radius (mm of the model's sheet) for the selectivity-map clustering statistic.
CLUSTER_RADIUS_MM = 1.0
#: Inverse L2 regularisation of the check's decoders: the experiments' decoder C (Brain-Score's 1e-3).
DECODER_C = 1e-3
#: Cross-validation folds and repeats of the check's decoders.
CV_FOLDS, CV_REPEATS = 5, 4
#: A selectivity map "clusters" when its Moran's I permutation p is below this.
CLUSTER_ALPHA = 0.01


def heldout_images(model: TopographicModel, objects_per_class: int = 50, seed: int = 0):
    """Held-out evaluation images: (StimulusSet, face mask, class labels)."""
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


def balanced_face_indices(is_face: np.ndarray, seed: int = 0) -> np.ndarray:
    """Indices of a class-balanced face / non-face set: every image of the smaller side and as many of the
    larger side drawn without replacement (seeded); each side needs at least ``CV_FOLDS`` images."""
    faces, others = np.flatnonzero(is_face), np.flatnonzero(~is_face)
    if min(len(faces), len(others)) < CV_FOLDS:
        raise ConfigError(f"a balanced set needs >= {CV_FOLDS} images of the positive class and >= {CV_FOLDS} "
                          f"others (one per cross-validation fold); got {len(faces)} and {len(others)}")
    rng = np.random.default_rng(seed)
    if len(others) >= len(faces):
        drawn = rng.choice(others, size=len(faces), replace=False)
        return np.sort(np.concatenate([faces, drawn]))
    return np.sort(np.concatenate([rng.choice(faces, size=len(others), replace=False), others]))


def face_dprime(responses: np.ndarray, is_face: np.ndarray) -> np.ndarray:
    """Per-unit face selectivity d′ = (μ_face − μ_other)/sqrt((σ²_face + σ²_other)/2); 0 for silent units."""
    from stimsim.behavior.metrics import dprime

    return dprime(responses[is_face], responses[~is_face])


def _decoder():
    return make_pipeline(StandardScaler(), LogisticRegression(C=DECODER_C, max_iter=5000))


def cv_scores(features: np.ndarray, labels: np.ndarray, seed: int = 0) -> dict:
    """Balanced accuracy (and ROC AUC for two classes) of the project decoder, mean over
    ``CV_REPEATS`` repeats of stratified ``CV_FOLDS``-fold cross-validation, with chance beside them."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    balanced, auc = [], []
    for repeat in range(CV_REPEATS):
        folds = StratifiedKFold(n_splits=CV_FOLDS, shuffle=True, random_state=seed + repeat)
        if len(classes) == 2:
            score = cross_val_predict(_decoder(), features, labels, cv=folds, method="decision_function")
            balanced.append(balanced_accuracy_score(labels, np.where(score > 0, classes[1], classes[0])))
            auc.append(roc_auc_score(labels == classes[1], score))
        else:
            balanced.append(balanced_accuracy_score(labels, cross_val_predict(_decoder(), features, labels, cv=folds)))
    result = {"balanced_accuracy": float(np.mean(balanced)), "chance": 1.0 / len(classes)}
    if auc:
        result["roc_auc"] = float(np.mean(auc))
    return result


def check_model(model: TopographicModel, n_shuffles: int = 1000, figure_path=None, seed: int = 0,
                progress: bool = False, stimuli=None, label: str = "category", positive: str = "face") -> dict:
    """The model's report card (see ``stimsim models check``); writes the ``positive`` class's d′ map
    if asked; ``progress`` reports each phase on stderr.

    ``face``: ``positive`` vs the rest on a class-balanced set (every image of the smaller side, as many
    drawn from the larger; each side and each class needs ``CV_FOLDS`` images); ``objects``: all classes;
    ``clustering``: per class, the Moran's I of its one-vs-rest d′ map and its one-sided p against
    ``n_shuffles`` position shuffles. The images are the held-out
    LFW and Fashion-MNIST images, or ``stimuli`` (a StimulusSet of any size and colour) classed by
    its label ``label``.
    """
    layer = model.resolve_layer("IT")
    sheet = model.sheet(layer)
    if stimuli is None:
        report_phase("models check: loading the held-out images", progress)
        stimuli, is_face, categories = heldout_images(model, seed=seed)
    else:
        if label not in stimuli.labels:
            raise ConfigError(f"stimulus set {stimuli.name!r} has no label {label!r}; labels: {sorted(stimuli.labels)}")
        categories = np.asarray(stimuli.labels[label]).astype(str)
        is_face = categories == positive
        if not is_face.any():
            raise ConfigError(f"no image of {stimuli.name!r} has {label} = {positive!r}; values: "
                              f"{sorted(set(categories.tolist()))}")
        values, counts = np.unique(categories, return_counts=True)
        small = {str(value): int(count) for value, count in zip(values, counts) if count < CV_FOLDS}
        if small or len(values) < 2:
            raise ConfigError(f"stimulus set {stimuli.name!r}: every {label} needs >= {CV_FOLDS} images (one per "
                              f"cross-validation fold) and there must be two or more; "
                              f"{f'too few in {small}' if small else f'only {values.tolist()}'}")
    report_phase(f"models check: responses of {layer} to {len(stimuli)} images", progress)
    responses = model.activations(stimuli.images, layer).numpy()
    report_phase("models check: cross-validated face and object decoding", progress)
    balanced = balanced_face_indices(is_face, seed)
    face = cv_scores(responses[balanced], is_face[balanced].astype(int), seed)
    objects = cv_scores(responses, categories, seed)
    report_phase(f"models check: clustering of every class's d′ map against {n_shuffles} position shuffles", progress)
    maps = {}
    for index, category in enumerate(sorted(set(categories))):
        dprime = face_dprime(responses, categories == category)
        test = clustering_test(dprime, sheet.coordinates_mm, CLUSTER_RADIUS_MM, n_shuffles, seed + index)
        maps[str(category)] = {"morans_i": test.morans_i, "morans_i_null_mean": test.null_mean, "p": test.p_value,
                               "selective_fraction": float(np.mean(dprime > 1))}
    face_map = maps[positive]
    report = {
        "model": model.name,
        "layer": layer,
        "stimuli": stimuli.name,
        "positive_class": positive,
        "n_units": sheet.n_units,
        "sheet_mm": round(sheet.size_mm, 3),
        "units_per_mm2": round(sheet.density_per_mm2, 2),
        "cortex_scale": model.cortex_scale(layer),
        "n_images": {"face": int(is_face.sum()), "other": int((~is_face).sum()),
                     "face_balanced_set": {"face": int(is_face[balanced].sum()), "other": int((~is_face[balanced]).sum())}},
        "decoder": f"logistic regression on standardised {layer} responses, C = {DECODER_C:g}, "
                   f"{CV_REPEATS} × stratified {CV_FOLDS}-fold cross-validation",
        "face_balanced_accuracy": face["balanced_accuracy"],
        "face_roc_auc": face["roc_auc"],
        "face_chance": face["chance"],
        "object_balanced_accuracy": objects["balanced_accuracy"],
        "object_chance": objects["chance"],
        "face_selective_fraction": face_map["selective_fraction"],
        "cluster_statistic": "Moran's I of each class's one-vs-rest d' map, binary weights within "
                             f"{CLUSTER_RADIUS_MM} model mm, one-sided p against {n_shuffles} position shuffles",
        "morans_i": face_map["morans_i"],
        "morans_i_null_mean": face_map["morans_i_null_mean"],
        "cluster_p": face_map["p"],
        "class_maps": maps,
        "n_classes_clustered": int(sum(m["p"] < CLUSTER_ALPHA for m in maps.values())),
        "n_classes": len(maps),
        "cluster_alpha": CLUSTER_ALPHA,
    }
    if figure_path is not None:
        plot_sheet_map(face_dprime(responses, is_face), sheet, Path(figure_path),
                       f"{model.name}: {positive} d′ on {layer}\nMoran's I {face_map['morans_i']:.2f}, "
                       f"p = {face_map['p']:.3g}", label=f"{positive} d′")
        report["figure"] = str(figure_path)
    return report
