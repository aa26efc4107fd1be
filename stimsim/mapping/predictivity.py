"""Model selection: how well each candidate model's IT features predict every recorded electrode.

Per electrode, the out-of-fold R² of ridge regression from the model's IT activations to the
electrode's per-image response, over ``n_folds`` cross-validation folds (Mehrer et al. 2025: 10-fold
ridge predictivity for every model × array pair; the best pair is registered). The ridge penalty is
chosen inside each training fold by scikit-learn's efficient leave-one-out ``RidgeCV`` (one penalty
per electrode); features are centred and divided by one common SD (per-unit scaling would blow up
units that are nearly silent on the training images). Chance level: the same procedure with the images' features shuffled against the
responses (R² ≤ 0 expected).
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import xarray as xr
from sklearn.linear_model import RidgeCV
from sklearn.model_selection import KFold

from stimsim.data.stimuli import StimulusSet
from stimsim.utilities.errors import ConfigError, DataError

IT_AREA = "IT"
#: Ridge penalties searched inside every training fold.
DEFAULT_ALPHAS = tuple(np.logspace(-1, 6, 15))


def checked_responses(per_image_responses, source: str = "recordings", electrodes=None) -> xr.DataArray:
    """``per_image_responses`` as (stimulus_id × electrode), after checking that it is a DataArray with those two
    dimensions and their coordinates, and that the responses of ``electrodes`` (all if None, none if empty) are
    finite: a NaN or an infinite response is a DataError naming the electrode and the image."""
    if not isinstance(per_image_responses, xr.DataArray):
        raise ConfigError(f"{source}: per-image responses must be an xarray DataArray (stimulus_id × electrode, as "
                          f"Recording.per_image() gives), got {type(per_image_responses).__name__}")
    if set(per_image_responses.dims) != {"stimulus_id", "electrode"}:
        raise ConfigError(f"{source}: per-image responses must have the dimensions stimulus_id and electrode, got "
                          f"{tuple(per_image_responses.dims)}")
    for name, meaning in (("stimulus_id", "the image ids"), ("electrode", "the electrode ids")):
        if name not in per_image_responses.coords:
            raise ConfigError(f"{source}: per-image responses need a {name!r} coordinate ({meaning})")
    per_image = per_image_responses.transpose("stimulus_id", "electrode")
    checked = per_image if electrodes is None else per_image.sel(electrode=list(electrodes))
    bad = ~np.isfinite(checked.values.astype(np.float64))
    if bad.any():
        image, electrode = (int(i[0]) for i in np.nonzero(bad))
        raise DataError(f"{source}: {int(bad.sum())} response(s) are NaN or infinite, e.g. electrode "
                        f"{checked['electrode'].values[electrode]} on image {checked['stimulus_id'].values[image]} "
                        f"({checked.values[image, electrode]}); leave such electrodes out (electrodes=...) or drop "
                        f"those images")
    return per_image


def aligned_features(per_image: xr.DataArray, model, images: StimulusSet, source: str = "recordings") -> np.ndarray:
    """IT activations (N_images × N_units, float64) of ``images`` in the order of ``per_image``'s
    stimulus ids; every recorded stimulus id must be in ``images``. Kept in the activation cache
    (:mod:`stimsim.engine.activation_cache`): model selection, registration and its bootstrap, and every later
    plan on the same recordings compute them once."""
    from stimsim.engine.activation_cache import cached_activations

    if not isinstance(images, StimulusSet):
        raise ConfigError("images must be a StimulusSet (the images shown during the recordings)")
    position = {stimulus_id: i for i, stimulus_id in enumerate(images.stimulus_id)}
    ids = [str(s) for s in per_image["stimulus_id"].values]
    missing = [s for s in ids if s not in position]
    if missing:
        raise DataError(f"{source}: stimulus_id: {len(missing)} recorded image(s) are not in the image set "
                        f"'{images.name}': {', '.join(missing[:8])}{' …' if len(missing) > 8 else ''}")
    chosen = images.subset(np.array([position[s] for s in ids], dtype=np.int64))
    return cached_activations(model, chosen.images, IT_AREA).numpy().astype(np.float64)


def cross_validated_r2(features: np.ndarray, responses: np.ndarray, n_folds: int = 10, seed: int = 0,
                       alphas=DEFAULT_ALPHAS) -> np.ndarray:
    """Out-of-fold R² of every column of ``responses`` (N × E) predicted from ``features`` (N × F)."""
    n_images = len(responses)
    if n_folds < 2:
        raise ConfigError(f"n_folds must be >= 2, got {n_folds}")
    if n_images < 2 * n_folds:
        raise DataError(f"recordings of {n_images} images; {n_folds}-fold cross-validation needs at least "
                        f"{2 * n_folds} images (2 per fold)")
    predictions = np.empty_like(responses, dtype=np.float64)
    folds = KFold(n_splits=n_folds, shuffle=True, random_state=seed)
    for train, test in folds.split(features):
        mean = features[train].mean(0)
        scale = features[train].std() or 1.0   # one scale for all units: silent units stay silent
        ridge = RidgeCV(alphas=alphas, alpha_per_target=True)
        ridge.fit((features[train] - mean) / scale, responses[train])
        predictions[test] = ridge.predict((features[test] - mean) / scale).reshape(len(test), -1)
    residual = ((responses - predictions) ** 2).sum(0)
    total = ((responses - responses.mean(0)) ** 2).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, 1.0 - residual / total, np.nan)


def model_predictivity(per_image_responses: xr.DataArray, model, images: StimulusSet, n_folds: int = 10,
                       seed: int = 0, alphas=DEFAULT_ALPHAS, source: str = "recordings",
                       chance: bool = True) -> xr.DataArray:
    """Per-electrode cross-validated ridge R² of ``per_image_responses`` (stimulus_id × electrode)
    from ``model``'s IT features; attrs ``chance_median_r2`` from features shuffled across images
    (NaN when ``chance`` is False, which halves the time)."""
    per_image_responses = checked_responses(per_image_responses, source)
    features = aligned_features(per_image_responses, model, images, source)
    responses = per_image_responses.values.astype(np.float64)
    r2 = cross_validated_r2(features, responses, n_folds, seed, alphas)
    chance_r2 = np.nan
    if chance:
        shuffled = features[np.random.default_rng([seed, 0x5F]).permutation(len(features))]
        chance_r2 = float(np.nanmedian(cross_validated_r2(shuffled, responses, n_folds, seed, alphas)))
    return xr.DataArray(r2, dims="electrode", coords={"electrode": per_image_responses["electrode"].values},
                        name="cv_r2", attrs={"model": model.name, "n_folds": n_folds, "seed": seed,
                                             "method": "ridge (RidgeCV per training fold), out-of-fold R²",
                                             "chance_median_r2": chance_r2})


def select_model(per_image_responses: xr.DataArray, candidates, images: StimulusSet, n_folds: int = 10,
                 seed: int = 0, source: str = "recordings", chance: bool = True) -> tuple[pd.DataFrame, dict]:
    """Rank candidate models by the median electrode R².

    candidates : model names/directories or loaded models (a dict name → model is accepted too).
    Returns (table sorted best first: rank, model, median_r2, mean_r2, chance_median_r2, n_electrodes;
    dict model name → per-electrode R² DataArray).
    """
    from stimsim.models.registry import load_model

    if isinstance(candidates, dict):
        models = dict(candidates)
    else:
        models = {}
        for candidate in candidates:
            loaded = load_model(candidate) if isinstance(candidate, str) else candidate
            models[str(candidate) if isinstance(candidate, str) else loaded.name] = loaded
    if not models:
        raise ConfigError("select_model needs at least one candidate model")
    scores, rows = {}, []
    for name, model in models.items():
        r2 = model_predictivity(per_image_responses, model, images, n_folds, seed, source=source, chance=chance)
        scores[name] = r2
        rows.append({"model": name, "median_r2": float(r2.median()), "mean_r2": float(r2.mean()),
                     "chance_median_r2": r2.attrs["chance_median_r2"], "n_electrodes": int(r2.size)})
    table = pd.DataFrame(rows).sort_values("median_r2", ascending=False, kind="stable").reset_index(drop=True)
    table.insert(0, "rank", np.arange(1, len(table) + 1))
    return table, scores


def selection_bootstrap(scores: dict, n_boot: int = 1000, seed: int = 0) -> dict:
    """How often each candidate would rank first on other electrodes like these: the fraction of ``n_boot``
    resamples of the electrodes (with replacement, the same draw for every candidate, so the comparison is paired)
    in which its median R² is the highest (NaN electrodes left out, as in :func:`select_model`; ties, and resamples
    without a finite R² in any candidate, go to the candidate listed first). ``scores``: model name → per-electrode
    R² of the same electrodes (as :func:`select_model` returns). One candidate: 1.0. Chance, for M candidates no
    better than each other: about 1/M each."""
    if n_boot < 1:
        raise ConfigError(f"n_boot must be >= 1, got {n_boot}")
    names = list(scores)
    lengths = {name: len(np.atleast_1d(scores[name])) for name in names}
    if not names or len(set(lengths.values())) != 1 or 0 in lengths.values():
        raise ConfigError(f"selection_bootstrap needs the R² of the same electrodes (at least one) for every "
                          f"candidate, got {lengths}")
    r2 = np.stack([np.asarray(scores[name], dtype=np.float64) for name in names])  # models × electrodes
    draws = np.random.default_rng([seed, 0x5E1]).integers(0, r2.shape[1], size=(n_boot, r2.shape[1]))
    with warnings.catch_warnings():  # a resample of only NaN electrodes ranks that candidate last, silently
        warnings.simplefilter("ignore", RuntimeWarning)
        medians = np.stack([np.nanmedian(r2[:, row], axis=1) for row in draws])  # resamples × models
    medians = np.where(np.isnan(medians), -np.inf, medians)
    first = np.bincount(np.argmax(medians, axis=1), minlength=len(names))
    return {name: float(count / n_boot) for name, count in zip(names, first)}
