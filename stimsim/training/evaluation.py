"""Evaluating a topographic model: decoding, selectivity and its clustering on IT.

Images used: by default the fLoc localizer (Stigliani et al. 2015) without its scrambled images,
classed by domain (face, body, place, character, object; 288 images each); where fLoc is not
available (no mirror or cached copy), the LFW crops the training run held out (listed in the model's
metadata; all 200 crops if the model records none) and Fashion-MNIST's test split, and the report
says so (``images_note``); on request (``heldout``) those held-out images; or any labelled stimulus
set (``stimuli``, ``label``, ``positive``: then the ``face_*`` numbers are those of the ``positive``
class). Responses are kept in the activation cache (:mod:`stimsim.engine.activation_cache`).

Clusters of a class's map (``clusters_mm``): the per-unit d′ map on the sheet scaled to cortex mm
(the model's ``cortex_scale``) is smoothed with a Gaussian of σ = ``CLUSTER_SIGMA_CORTEX_MM`` onto a
grid of ``CLUSTER_GRID_CORTEX_MM`` steps; a cluster is a 4-connected region of grid points above
d′ ``CLUSTER_DPRIME``, its size the diameter of the disc of equal area (cortex mm), largest first.

ImageNet top-1 on the ``imagenet_samples`` images, where they are available: ``imagenet_top1`` of the
model's own output when it has the 1,000 ImageNet classes, ``imagenet_top1_base`` of the base network
the model records (``metadata.base_network`` or ``architecture.kwargs.base_network``). A model whose build
trained on the samples is scored on the ones it held out (``metadata.holdout_stimulus_ids``), both networks
on the same images (``imagenet_images`` says which; ``imagenet_top1_trained_images`` is the model's top-1 on
the others, for comparison).

Decoders are the project's: a logistic regression on standardised IT responses with C = 1e-3 (the
regularisation of every experiment's decoder, as in the Brain-Score behavioural benchmarks),
cross-validated with stratified folds. Every score is reported beside its chance level.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score, roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from stimsim.cortex.topography import clustering_test, nearest_pair_mm, plot_sheet_map, selective_clusters_mm
from stimsim.models.topographic import TopographicModel
from stimsim.utilities.errors import ConfigError, DataUnavailable
from stimsim.utilities.progress import report_phase

#: Moran's I neighbourhood radius (mm of the model's sheet) for the selectivity-map clustering statistic.
CLUSTER_RADIUS_MM = 1.0
#: Inverse L2 regularisation of the check's decoders: the experiments' decoder C (Brain-Score's 1e-3).
DECODER_C = 1e-3
#: Cross-validation folds and repeats of the check's decoders.
CV_FOLDS, CV_REPEATS = 5, 4
#: A selectivity map "clusters" when its Moran's I permutation p is below this.
CLUSTER_ALPHA = 0.01
#: Clusters of a d′ map: smoothing σ and grid step (cortex mm), and the d′ a region must exceed.
CLUSTER_SIGMA_CORTEX_MM, CLUSTER_GRID_CORTEX_MM, CLUSTER_DPRIME = 0.5, 0.1, 1.0
#: fLoc domains of the default images (its scrambled images are left out) and the class reported as "face".
FLOC_CHECK_DOMAINS = ("face", "body", "place", "character", "object")
FLOC_POSITIVE = "face"
#: fLoc images per category of the default images (None: all 144).
FLOC_IMAGES_PER_CATEGORY = None


def heldout_images(model: TopographicModel, objects_per_class: int = 50, seed: int = 0):
    """Held-out evaluation images: (StimulusSet, note): the LFW faces the model's training held out (all of them
    when it trained on none, or when it lists no held-out images: then the note says so) and Fashion-MNIST's test
    images."""
    from stimsim.data.stimuli import StimulusSet, fashion_mnist, lfw_subset

    lfw = lfw_subset()
    held = set(model.metadata.get("holdout_stimulus_ids", []))
    note = None
    if "lfw_subset" in (training_sources(model) or {"lfw_subset"}):
        if held:
            lfw = lfw.subset(np.array([sid in held for sid in lfw.stimulus_id]))
        else:
            note = (f"model {model.name!r} lists no held-out images: all {len(lfw)} LFW images are used, and its "
                    "training may have seen some of them")
    objects = fashion_mnist(split="test", n_per_class=objects_per_class, seed=seed)
    stimuli = StimulusSet.concat(*(StimulusSet(s.name, s.images, s.stimulus_id, {"category": s.labels["category"]})
                                   for s in (lfw, objects)))
    return stimuli, note


def default_images(model: TopographicModel, seed: int = 0):
    """The default images: (StimulusSet, label, positive class, note). fLoc by domain without its scrambled
    images; where fLoc is not available, the held-out LFW + Fashion-MNIST images, with a note saying so."""
    from stimsim.data.stimuli import FLOC_DOMAINS, floc

    try:
        stimuli = floc([c for c, domain in FLOC_DOMAINS.items() if domain in FLOC_CHECK_DOMAINS],
                       n_per_category=FLOC_IMAGES_PER_CATEGORY)
    except DataUnavailable:  # a damaged copy is an error naming it, not a reason to evaluate on other images
        stimuli, note = heldout_images(model, seed=seed)
        return stimuli, "category", "face", "; ".join(
            ["the fLoc images are not available (no mirror or cached copy of data entry 'floc'); evaluated on the "
             "held-out LFW and Fashion-MNIST images", *([note] if note else [])])
    return stimuli, "domain", FLOC_POSITIVE, None


def base_network_of(model: TopographicModel) -> str | None:
    """The base network a model records (``metadata.base_network`` or ``architecture.kwargs.base_network``),
    or None."""
    from stimsim.models.base_networks import BASE_NETWORKS

    name = model.metadata.get("base_network") or model.architecture.get("kwargs", {}).get("base_network")
    return name if name in BASE_NETWORKS else None


def training_sources(model: TopographicModel) -> set[str] | None:
    """The image sources (``imagenet_samples``, ``floc``, ``folder``, ...) a model's training or build took images
    from, as its ``metadata.training`` names them; None for a model that records no training."""
    sets = _training_sets(model)
    return None if sets is None else {str(entry["source"]) for entry in sets if "source" in entry}


def training_took_from(model: TopographicModel, source: dict) -> bool | None:
    """Whether a model's training or build took images from the image set ``source`` (a stimulus-set table:
    ``source`` and, for sources with splits, ``split``): a set of the same source counts unless both name their
    split and the splits differ (Fashion-MNIST's test split for a model trained on its train split). None for a
    model that records no training."""
    sets = _training_sets(model)
    return None if sets is None else any(
        str(entry.get("source")) == str(source.get("source"))
        and not ("split" in entry and "split" in source and str(entry["split"]) != str(source["split"]))
        for entry in sets)


def _training_sets(model: TopographicModel) -> list[dict] | None:
    """The image-set tables of a model's ``metadata.training`` (``data.sets``); None for a model that records no
    training."""
    training = model.metadata.get("training")
    if not isinstance(training, dict):
        return None
    data = training.get("data")
    sets = data.get("sets", []) if isinstance(data, dict) else []
    return [entry for entry in sets if isinstance(entry, dict)]


def _imagenet_training_split(model: TopographicModel) -> set[str] | None:
    """File names of the ``imagenet_samples`` images a model's build held out, or None when its build did not
    train on them (``metadata.training`` names its image sets)."""
    if "imagenet_samples" not in (training_sources(model) or set()):
        return None
    return {Path(str(stimulus_id)).name for stimulus_id in model.metadata.get("holdout_stimulus_ids", [])}


def imagenet_scores(model: TopographicModel, progress: bool = False, limit: int | None = None) -> dict:
    """``imagenet_top1`` (the model's own output, when it has 1,000 classes) and ``imagenet_top1_base`` (its
    base network) on the ``imagenet_samples`` images (the first ``limit``; only those the model's build held
    out, when it trained on the samples), each None where it does not apply, with ``imagenet_note`` saying
    why."""
    from stimsim.data.manifest import entry_path
    from stimsim.engine.activation_cache import model_sha256
    from stimsim.training.imagenet import N_IMAGENET_CLASSES, base_network_top1, imagenet_top1

    base = base_network_of(model)
    example = model.preprocess([np.zeros((model.preprocessing.size_px,) * 2, np.float32)])
    own = model.stage_output_dims(example)[model.stage_names[-1]] == (N_IMAGENET_CLASSES, 1, 1)
    result = {"imagenet_top1": None, "imagenet_top1_base": None, "imagenet_n": 0, "base_network": base}
    if not own and base is None:
        return {**result, "imagenet_note": "the model has no ImageNet output and records no base network"}
    try:
        folder = entry_path("imagenet_samples")
    except DataUnavailable:
        return {**result, "imagenet_note": "the ImageNet samples are not available (no mirror or cached copy of "
                                           "data entry 'imagenet_samples')"}
    held_out = _imagenet_training_split(model)
    result["imagenet_images"] = "all" if held_out is None else "held out from the build"

    def scored(score: dict) -> tuple[float | None, int]:
        return (score["top1"], score["n"]) if held_out is None else (score["held_out"]["top1"],
                                                                     score["held_out"]["n"])

    if own:
        report_phase("models check: ImageNet top-1 of the model's output", progress)
        score = imagenet_top1(lambda images: model.run_stages(model.preprocess(images)).cpu().numpy(), folder,
                              limit=limit, cache_as={"model_sha256": model_sha256(model), "layer": model.stage_names[-1],
                                                     "preprocessing": model.preprocessing.to_dict()},
                              held_out=held_out)
        result["imagenet_top1"], result["imagenet_n"] = scored(score)
        if held_out is not None:
            result["imagenet_top1_trained_images"] = score["trained_on"]["top1"]
            result["imagenet_n_trained_images"] = score["trained_on"]["n"]
    if base is not None:
        report_phase(f"models check: ImageNet top-1 of the base network {base}", progress)
        score = base_network_top1(base, folder, limit=limit, held_out=held_out)
        result["imagenet_top1_base"], result["imagenet_n"] = scored(score)
    if held_out is not None and result["imagenet_n"] == 0:
        result["imagenet_note"] = ("the model's build trained on every ImageNet sample scored (it records none "
                                   "held out), so no top-1 on unseen images can be given")
    return result


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


def _file_part(text: str) -> str:
    """``text`` as part of a file name: every run of characters other than letters, digits, '.', '+' and '-'
    becomes '_' (a model named 'TDANN simclr_swap/…' or '../x' writes inside the folder it was given)."""
    return re.sub(r"[^\w.+-]+", "_", str(text)).strip("._") or "_"


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


#: Most position shuffles a check takes: its p resolves to 1 / (1 + shuffles), 1e-5 here, and each shuffle of a
#: 50,000-unit sheet costs milliseconds per map.
MAX_SHUFFLES = 100_000
#: Fewest position shuffles a check takes: the fewest with which the smallest p, 1 / (1 + shuffles), is below
#: :data:`CLUSTER_ALPHA` (with fewer, no map could count as clustered).
MIN_SHUFFLES = int(1 / CLUSTER_ALPHA - 1) + 1


def check_shuffles(n_shuffles: int, name: str = "n_shuffles") -> int:
    """``n_shuffles`` if it is an integer from :data:`MIN_SHUFFLES` to :data:`MAX_SHUFFLES`; otherwise ConfigError
    naming ``name``."""
    if (isinstance(n_shuffles, bool) or not isinstance(n_shuffles, int)
            or not MIN_SHUFFLES <= n_shuffles <= MAX_SHUFFLES):
        raise ConfigError(f"{name} must be an integer from {MIN_SHUFFLES} to {MAX_SHUFFLES:,}, got {n_shuffles!r}: "
                          f"p resolves to 1 / (1 + shuffles), and a map counts as clustered at p < {CLUSTER_ALPHA:g}, "
                          f"which fewer than {MIN_SHUFFLES} shuffles cannot reach")
    return n_shuffles


def check_model(model: TopographicModel, n_shuffles: int = 1000, figure_path=None, seed: int = 0,
                progress: bool = False, stimuli=None, label: str | None = None, positive: str | None = None,
                figure_dir=None, heldout: bool = False, imagenet: bool = True,
                imagenet_limit: int | None = None) -> dict:
    """The model's report card (see ``stimsim models check`` and the module docstring); ``progress`` reports
    each phase on stderr.

    ``face``: ``positive`` vs the rest on a class-balanced set (every image of the smaller side, as many
    drawn from the larger; each side and each class needs ``CV_FOLDS`` images); ``objects``: all classes;
    per class (``domain_maps`` for a ``domain`` label, else ``class_maps``): the Moran's I of its one-vs-rest
    d′ map, its one-sided p against ``n_shuffles`` position shuffles, the fraction of units above d′ 1 and
    its clusters in cortex mm. Images: the default ones (:func:`default_images`), the held-out LFW and
    Fashion-MNIST ones (``heldout``), or ``stimuli`` classed by ``label`` (default ``category``) with
    ``positive`` (default ``face``). ``figure_path``: PNG of the ``positive`` class's map; ``figure_dir``: a
    PNG of every class's map (``<model>_<class>_dprime.png``). ``imagenet``: add :func:`imagenet_scores`.
    """
    check_shuffles(n_shuffles)
    if "IT" not in model.areas.values() and "IT" not in model.sheets:
        raise ConfigError(f"{model.name}: models check measures the layer labelled as area 'IT', and none of this "
                          f"model's layers is (areas: {model.areas or 'none'}); give its IT layer `\"area\": \"IT\"` in "
                          "model.json (or `area = \"IT\"` in its training file)")
    layer = model.resolve_layer("IT")
    sheet = model.sheet(layer)
    nearest_mm = nearest_pair_mm(sheet.coordinates_mm)
    if not nearest_mm < CLUSTER_RADIUS_MM:
        raise ConfigError(f"{model.name}: models check measures clustering among units within {CLUSTER_RADIUS_MM:g} "
                          f"model mm of each other, and no two units of its {layer} sheet are that close (the nearest "
                          f"pair is {nearest_mm:.3g} mm apart); a sheet this sparse has no clustering to measure")
    note = None
    if stimuli is None:
        report_phase("models check: loading the images", progress)
        if heldout:
            (stimuli, note), label, positive = heldout_images(model, seed=seed), "category", "face"
        else:
            stimuli, label, positive, note = default_images(model, seed=seed)
    else:
        label, positive = label or "category", positive or "face"
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
    from stimsim.engine.activation_cache import cached_activations

    report_phase(f"models check: responses of {layer} to {len(stimuli)} images", progress)
    responses = cached_activations(model, stimuli.images, layer).numpy()
    report_phase("models check: cross-validated face and object decoding", progress)
    balanced = balanced_face_indices(is_face, seed)
    face = cv_scores(responses[balanced], is_face[balanced].astype(int), seed)
    objects = cv_scores(responses, categories, seed)
    report_phase(f"models check: clustering of every class's d′ map against {n_shuffles} position shuffles", progress)
    scale = model.cortex_scale(layer)
    cortex_sheet = model.in_cortex_mm(layer)[0].sheet(layer)
    maps, dprimes = {}, {}
    for index, category in enumerate(sorted(set(categories))):
        dprime = dprimes[category] = face_dprime(responses, categories == category)
        infinite = int(np.sum(~np.isfinite(dprime)))
        if infinite:
            raise ConfigError(f"stimulus set {stimuli.name!r}: {infinite} units of {layer} respond the same to every "
                              f"image with {label} = '{category}' and the same to every other image, with another "
                              "value, so their d′ is infinite; the images of a class must differ (identical images?)")
        test = clustering_test(dprime, sheet.coordinates_mm, CLUSTER_RADIUS_MM, n_shuffles, seed + index)
        clusters = selective_clusters_mm(dprime, cortex_sheet, CLUSTER_DPRIME, CLUSTER_SIGMA_CORTEX_MM,
                                         CLUSTER_GRID_CORTEX_MM)
        maps[str(category)] = {"morans_i": test.morans_i, "morans_i_null_mean": test.null_mean, "p": test.p_value,
                               "selective_fraction": float(np.mean(dprime > 1)),
                               "n_clusters": len(clusters), "clusters_mm": [round(c, 3) for c in clusters]}
    face_map = maps[positive]
    report = {
        "model": model.name,
        "layer": layer,
        "stimuli": stimuli.name,
        **({"images_note": note} if note else {}),
        "label": label,
        "positive_class": positive,
        "n_units": sheet.n_units,
        "sheet_model_mm": round(sheet.size_mm, 3),
        "units_per_model_mm2": round(sheet.density_per_mm2, 2),
        "cortex_scale": scale,
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
        "cluster_definition": f"4-connected regions above d' {CLUSTER_DPRIME:g} of the unit d' map smoothed "
                              f"(Gaussian sigma {CLUSTER_SIGMA_CORTEX_MM:g} cortex mm) onto a "
                              f"{CLUSTER_GRID_CORTEX_MM:g} cortex mm grid; size = diameter of the disc of equal area",
        "morans_i": face_map["morans_i"],
        "morans_i_null_mean": face_map["morans_i_null_mean"],
        "cluster_p": face_map["p"],
        "domain_maps" if label == "domain" else "class_maps": maps,
        "n_classes_clustered": int(sum(m["p"] < CLUSTER_ALPHA for m in maps.values())),
        "n_classes": len(maps),
        "cluster_alpha": CLUSTER_ALPHA,
    }
    if imagenet:
        report.update(imagenet_scores(model, progress, limit=imagenet_limit))
    targets = [(positive, Path(figure_path))] if figure_path is not None else []
    if figure_dir is not None:
        targets += [(category, Path(figure_dir) / f"{_file_part(model.name)}_{_file_part(category)}_dprime.png")
                    for category in maps]
    for category, path in targets:
        plot_sheet_map(dprimes[category], cortex_sheet, path,
                       f"{model.name}: {category} d′ on {layer}\nMoran's I {maps[category]['morans_i']:.2f}, "
                       f"p = {maps[category]['p']:.3g}", label=f"{category} d′", frame="cortex")
    if figure_dir is not None:
        report["figures"] = {category: str(path) for category, path in targets[len(targets) - len(maps):]}
    if figure_path is not None or figure_dir is not None:
        report["figure"] = str(figure_path) if figure_path is not None else report["figures"][positive]
    return report


#: Units of the check report's numbers, as :func:`report_lines` prints them after the number.
REPORT_UNITS = {"n_units": "units", "sheet_model_mm": "model mm", "units_per_model_mm2": "units per model mm²",
                "face_selective_fraction": "of the units (d′ > 1)", "imagenet_n": "images",
                "imagenet_n_trained_images": "images"}


def _number(value) -> str:
    """A report's value as text: a float to 4 significant digits, None as '-'."""
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _map_text(record: dict) -> str:
    """One class's map of the report (``domain_maps`` or ``class_maps``) as text, cluster diameters in cortex mm."""
    clusters = ", ".join(_number(size) for size in record["clusters_mm"])
    return (f"Moran's I {_number(record['morans_i'])} (null mean {_number(record['morans_i_null_mean'])}), "
            f"p {_number(record['p'])}, {_number(record['selective_fraction'])} of the units with d′ > 1, "
            + (f"{record['n_clusters']} cluster(s) of {clusters} cortex mm" if clusters else "no cluster"))


def report_lines(report: dict, width: int = 26) -> list[str]:
    """:func:`check_model`'s report as text (``models check`` without ``--json``): one ``key value`` line per entry,
    keys padded to ``width``, numbers with their units; the cortex scale and the image counts on one line each, and
    each class's map and figure on a line of its own under its key."""
    positive, lines = report["positive_class"], []
    for key, value in report.items():
        if key in ("domain_maps", "class_maps", "figures"):
            lines.append(key)
            lines += [f"  {name:<{width - 2}} {_map_text(item) if key != 'figures' else item}"
                      for name, item in value.items()]
            continue
        if key == "cortex_scale":
            text = (f"{_number(value['cortex_mm_per_model_mm'])} cortex mm per model mm on {value['layer']} (sheet "
                    f"{_number(value['sheet_size_cortex_mm'])} cortex mm); rule: {value['rule']}")
        elif key == "n_images":
            balanced = value["face_balanced_set"]
            text = (f"{value['face']} {positive}, {value['other']} other; balanced set {balanced['face']} {positive}, "
                    f"{balanced['other']} other")
        else:
            text = " ".join(filter(None, (_number(value), REPORT_UNITS.get(key) if value is not None else None)))
        lines.append(f"{key:<{width}} {text}")
    return lines

