import json

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from stimsim.behavior import decoders
from stimsim.behavior.decoders import (BoundSameDifferentDecoder, Decoder, LogisticDecoder, SameDifferentDecoder,
                                       decoder_from_dict)
from stimsim.utilities.errors import ConfigError


def _clusters(n_classes, n_per_class=40, n_features=20, separation=1.5, seed=0):
    """Gaussian clusters with shifted means and unequal feature scales and offsets."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, separation, size=(n_classes, n_features))
    labels = np.repeat(np.array(["face", "body", "object", "scene", "animal"])[:n_classes], n_per_class)
    codes = np.repeat(np.arange(n_classes), n_per_class)
    scales = rng.uniform(0.5, 5.0, size=n_features)
    features = (centres[codes] + rng.normal(size=(codes.size, n_features))) * scales + 10.0
    return features, labels


@pytest.mark.parametrize("n_classes", [2, 4])
def test_logistic_decoder_equals_sklearn_predict_proba(n_classes):
    features, labels = _clusters(n_classes)
    decoder = LogisticDecoder.fit(features, labels, layer="layer4.1", C=1e-3)
    reference = LogisticRegression(C=1e-3, solver="lbfgs", max_iter=1000, random_state=0)
    scaler = StandardScaler().fit(features)
    reference.fit(scaler.transform(features), labels)

    test_features, _ = _clusters(n_classes, n_per_class=15, seed=1)
    batch = torch.from_numpy(test_features.reshape(3, 5 * n_classes, -1)).float()
    probabilities = decoder.probabilities(batch)
    expected = reference.predict_proba(scaler.transform(batch.reshape(-1, batch.shape[-1]).double().numpy()))

    assert decoder.choices == tuple(reference.classes_)
    assert probabilities.shape == (3, 5 * n_classes, n_classes)
    assert probabilities.dtype == torch.float32
    np.testing.assert_allclose(probabilities.reshape(-1, n_classes).numpy(), expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(probabilities.sum(-1).numpy(), 1.0, atol=1e-6)
    assert decoder.readout.fit_params["converged"]


def test_logistic_decoder_without_standardisation_matches_sklearn():
    features, labels = _clusters(3, n_features=5)
    decoder = LogisticDecoder.fit(features, labels, layer="layer4.1", C=0.5, standardize=False)
    reference = LogisticRegression(C=0.5, solver="lbfgs", max_iter=1000).fit(features, labels)
    np.testing.assert_allclose(decoder.predict_proba(features), reference.predict_proba(features), atol=1e-6)


def test_logistic_decoder_is_deterministic_and_accurate():
    features, labels = _clusters(4, n_per_class=60)
    first = LogisticDecoder.fit(features[::2], labels[::2], layer="layer4.1")
    second = LogisticDecoder.fit(features[::2], labels[::2], layer="layer4.1")
    assert first.to_dict() == second.to_dict()
    assert first.accuracy(features[1::2], labels[1::2]) > 0.9  # held-out, chance = 0.25


def test_integer_labels_give_string_choices_and_accuracy():
    features, labels = _clusters(2)
    integer_labels = (labels == "face").astype(int)
    decoder = LogisticDecoder.fit(features, integer_labels, layer="layer4.1")
    assert decoder.choices == ("0", "1")
    assert decoder.accuracy(features, integer_labels) > 0.95


def test_chunked_evaluation_equals_single_block(monkeypatch):
    features, labels = _clusters(3)
    decoder = LogisticDecoder.fit(features, labels, layer="layer4.1")
    batch = torch.from_numpy(features.reshape(4, 30, -1))
    whole = decoder.probabilities(batch)
    monkeypatch.setattr(decoders, "_CHUNK_NUMBERS", 7 * features.shape[1])  # 7 rows per block
    chunked = decoder.probabilities(batch)
    assert whole.dtype == torch.float64
    torch.testing.assert_close(chunked, whole, atol=1e-15, rtol=0)


def test_logistic_round_trip_through_json_gives_identical_probabilities():
    features, labels = _clusters(4)
    decoder = LogisticDecoder.fit(features, labels, layer="layer4.1")
    restored = decoder_from_dict(json.loads(json.dumps(decoder.to_dict())))
    assert isinstance(restored, LogisticDecoder) and restored.layer == "layer4.1"
    assert restored.choices == decoder.choices
    batch = torch.from_numpy(features[:40].reshape(2, 20, -1)).float()
    assert torch.equal(restored.probabilities(batch), decoder.probabilities(batch))
    assert LogisticDecoder.from_dict(decoder.to_dict()).readout.fit_params == decoder.readout.fit_params


def test_frozen_decoder_cannot_be_changed():
    features, labels = _clusters(2)
    decoder = LogisticDecoder.fit(features, labels, layer="layer4.1")
    with pytest.raises(ValueError):
        decoder.readout.coef[0, 0] = 1.0
    with pytest.raises(AttributeError):
        decoder.layer = "layer3.1"


def test_logistic_decoder_rejects_bad_input():
    features, labels = _clusters(2)
    with pytest.raises(ValueError, match="at least 2 different labels"):
        LogisticDecoder.fit(features, np.full(len(labels), "face"), layer="layer4.1")
    with pytest.raises(ValueError, match="C must be"):
        LogisticDecoder.fit(features, labels, layer="layer4.1", C=0.0)
    with pytest.raises(ValueError, match="labels must have shape"):
        LogisticDecoder.fit(features, labels[:-1], layer="layer4.1")
    with pytest.raises(ValueError, match="NaN"):
        LogisticDecoder.fit(np.full_like(features, np.nan), labels, layer="layer4.1")
    with pytest.raises(ValueError, match="layer"):
        LogisticDecoder.fit(features, labels, layer="")
    # a missing label (NaN in a float column, None in a text one) became a choice of its own, "nan" or "None"
    codes = np.where(labels == "face", 1.0, 0.0)
    codes[5] = np.nan
    text = labels.astype(object)
    text[7] = None
    for given, first in ((codes, 5), (text, 7)):
        with pytest.raises(ValueError, match=f"1 are missing \\(None or NaN\\), the first at position {first}"):
            LogisticDecoder.fit(features, given, layer="layer4.1")
    decoder = LogisticDecoder.fit(features, labels, layer="layer4.1")
    with pytest.raises(ValueError, match="K conditions, B stimuli, F features"):
        decoder.probabilities(torch.zeros(5, features.shape[1]))
    with pytest.raises(ValueError, match="fitted on 20"):
        decoder.probabilities(torch.zeros(1, 5, 21))
    stored = decoder.to_dict()
    with pytest.raises(ConfigError, match="unknown keys"):
        LogisticDecoder.from_dict({**stored, "typo": 1})
    with pytest.raises(ConfigError, match="unknown decoder kind"):
        decoder_from_dict({**stored, "kind": "svm"})
    broken = json.loads(json.dumps(stored))
    broken["readout"]["coef"] = broken["readout"]["coef"][:1]
    with pytest.raises(ConfigError, match="coef"):
        LogisticDecoder.from_dict(broken)


# ---------------------------------------------------------------------------------------------
# Same/different identity task


def _identity_images(n_identities, n_per_identity, n_features=30, noise=0.4, seed=0):
    """Images = identity prototype + noise; returns (n_identities, n_per_identity, F)."""
    rng = np.random.default_rng(seed)
    prototypes = rng.normal(size=(n_identities, 1, n_features))
    return prototypes + noise * rng.normal(size=(n_identities, n_per_identity, n_features))


def _pairs(images, rng):
    """Half same-identity pairs (different images of one identity), half different identities."""
    n_identities, n_per_identity, _ = images.shape
    first, second, same = [], [], []
    for identity in range(n_identities):
        for image in range(n_per_identity - 1):
            first.append(images[identity, image])
            second.append(images[identity, image + 1])
            same.append(True)
            other = (identity + 1 + rng.integers(n_identities - 1)) % n_identities
            first.append(images[identity, image])
            second.append(images[other, rng.integers(n_per_identity)])
            same.append(False)
    return np.array(first), np.array(second), np.array(same)


@pytest.fixture(scope="module")
def same_different():
    rng = np.random.default_rng(0)
    images = _identity_images(40, 4)
    decoder = SameDifferentDecoder.fit(*_pairs(images[:20], rng), layer="layer4.1")
    return decoder, images


def test_same_different_decoder_generalises_to_new_identities(same_different):
    decoder, images = same_different
    first, second, same = _pairs(images[20:], np.random.default_rng(1))
    assert decoder.accuracy(first, second, same) > 0.9  # held-out identities, chance = 0.5
    assert decoder.choices == ("same", "different")
    swapped = decoder.pair_probabilities(second, first)
    np.testing.assert_allclose(swapped, decoder.pair_probabilities(first, second))  # order of the pair is irrelevant


def test_bound_decoder_compares_each_column_with_its_reference(same_different):
    decoder, images = same_different
    references = images[20:30, 0]  # first image of each pair, seen unperturbed
    stimulus_index = torch.tensor([3, 0, 7, 7, 9, 1])
    second = images[20:30, 1][stimulus_index.numpy()]  # same identity as the reference
    mismatched = images[20:30, 1][(stimulus_index.numpy() + 1) % 10]  # another identity
    batch = torch.from_numpy(np.stack([second, mismatched])).float()
    bound = decoder.bind(references)

    probabilities = bound.probabilities(batch, stimulus_index)

    assert isinstance(bound, Decoder) and bound.layer == "layer4.1" and bound.choices == ("same", "different")
    assert probabilities.shape == (2, 6, 2)
    assert bool((probabilities[0, :, 0] > 0.5).all())  # same identity -> "same"
    assert bool((probabilities[1, :, 1] > 0.5).all())  # other identity -> "different"
    for k in range(2):
        expected = decoder.pair_probabilities(references[stimulus_index.numpy()], batch[k].double().numpy())
        np.testing.assert_allclose(probabilities[k].numpy(), expected, atol=1e-6)


def test_perturbing_the_second_image_turns_same_into_different(same_different):
    """Moeller et al. 2017: stimulation during the second image makes "same" pairs look different."""
    decoder, images = same_different
    references = images[20:40, 0]
    second = torch.from_numpy(images[20:40, 1]).float()
    gain = torch.ones(second.shape[1])
    gain[:10] = 4.0  # a third of the units strongly driven
    batch = torch.stack([second, second * gain])
    probabilities = decoder.bind(references).probabilities(batch, torch.arange(20))
    p_same_control, p_same_stim = probabilities[..., 0].mean(dim=1)
    # With the default strong regularisation (C = 1e-3) probabilities stay near 0.5, but the
    # majority judgement of same-identity pairs flips from "same" to "different".
    assert p_same_control > 0.55
    assert p_same_stim < 0.45


def test_same_different_round_trip_and_input_checks(same_different):
    decoder, images = same_different
    bound = decoder.bind(images[20:25, 0])
    batch = torch.from_numpy(images[20:25, 1][None]).float()
    index = torch.arange(5)
    restored = decoder_from_dict(json.loads(json.dumps(bound.to_dict())))
    assert isinstance(restored, BoundSameDifferentDecoder)
    assert torch.equal(restored.probabilities(batch, index), bound.probabilities(batch, index))
    pair_restored = SameDifferentDecoder.from_dict(json.loads(json.dumps(decoder.to_dict())))
    np.testing.assert_array_equal(pair_restored.pair_probabilities(images[:5, 0], images[:5, 1]),
                                  decoder.pair_probabilities(images[:5, 0], images[:5, 1]))

    with pytest.raises(ValueError, match="needs stimulus_index"):
        bound.probabilities(batch)
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        bound.probabilities(batch, torch.tensor([0, 1, 2, 3, 5]))
    with pytest.raises(ValueError, match="shape"):
        bound.probabilities(batch, torch.arange(4))
    with pytest.raises(ValueError, match="features"):
        decoder.bind(images[20:25, 0, :10])
    with pytest.raises(ValueError, match="boolean"):
        SameDifferentDecoder.fit(images[:, 0], images[:, 1], np.ones(40), layer="layer4.1")


def test_stratified_fit_mask_takes_the_rounded_share_of_every_stratum_and_is_seeded():
    strata = {"class 'a'": np.array([0, 2, 4, 6, 8]), "class 'b'": np.array([1, 3, 5]), "class 'c'": np.array([7, 9])}
    mask = decoders.stratified_fit_mask(strata, 0.5, np.random.default_rng(4), "x.toml", "images")
    # round half to even: 2.5 -> 2, 1.5 -> 2, 1.0 -> 1
    assert [int(mask[m].sum()) for m in strata.values()] == [2, 2, 1] and mask.shape == (10,)
    again = decoders.stratified_fit_mask(strata, 0.5, np.random.default_rng(4), "x.toml", "images")
    other = [decoders.stratified_fit_mask(strata, 0.5, np.random.default_rng(s), "x.toml", "images") for s in range(20)]
    assert np.array_equal(mask, again) and any(not np.array_equal(mask, o) for o in other)
    with pytest.raises(ConfigError, match=r"x.toml \[decoder\]: fit_fraction = 0.75 leaves class 'c' \(2 images\)"):
        decoders.stratified_fit_mask(strata, 0.75, np.random.default_rng(0), "x.toml", "images")
