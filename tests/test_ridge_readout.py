"""Closed-form readouts of a topographic IT: reduced-rank ridge regression in its dual form."""
import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

from stimsim.training.ridge_readout import fit_ridge_readout


def _predict(readout, activity):
    return (activity @ readout.first.T) @ readout.second.T + readout.bias


def _data(n=60, units=300, outputs=7, seed=0):
    rng = np.random.default_rng(seed)
    activity = torch.from_numpy(np.maximum(rng.normal(size=(n, units)), 0)).float()
    weights = torch.from_numpy(rng.normal(size=(units, outputs))).float()
    return rng, activity, weights


def test_full_rank_readout_is_the_primal_ridge_solution():
    """With as many rows as outputs in rank, the dual solution equals scikit-learn's primal ridge (with an
    intercept) at the chosen penalty, on rows it was not fitted to."""
    rng, activity, weights = _data()
    targets = activity @ weights + torch.from_numpy(rng.normal(size=(60, 7))).float()
    readout = fit_ridge_readout(activity, targets, rank=7, held_back=np.arange(60) % 5 == 0)
    centred = activity - activity.mean(0)
    penalty = readout.relative_penalty * float((centred ** 2).sum(1).mean())
    primal = Ridge(alpha=penalty, fit_intercept=True, solver="svd").fit(activity.double().numpy(), targets.double().numpy())
    new = torch.from_numpy(np.maximum(rng.normal(size=(10, 300)), 0)).float()
    np.testing.assert_allclose(_predict(readout, new).numpy(), primal.predict(new.double().numpy()), rtol=0, atol=2e-3)


def test_penalty_is_chosen_by_agreement_on_the_held_back_rows():
    """Each penalty's validation agreement is that of scikit-learn's ridge fitted on the rows not held back,
    scored on the scored rows alone."""
    rng, activity, weights = _data(seed=1)
    targets = activity @ weights + 20 * torch.from_numpy(rng.normal(size=(60, 7))).float()
    held_back = np.arange(60) % 3 == 0
    scored = held_back & (np.arange(60) < 40)
    readout = fit_ridge_readout(activity, targets, rank=3, held_back=held_back, scored=scored)
    fit, held = ~held_back, scored
    scale = float(((activity - activity.mean(0)) ** 2).sum(1).mean())
    for relative, agreement in readout.validation_agreement.items():
        model = Ridge(alpha=relative * scale, solver="svd").fit(activity[fit].double().numpy(), targets[fit].double().numpy())
        expected = np.mean(model.predict(activity[held].double().numpy()).argmax(1) == targets[held].numpy().argmax(1))
        assert agreement == pytest.approx(expected)
    best = max(readout.validation_agreement.values())
    assert readout.validation_agreement[readout.relative_penalty] == best


def test_reduced_rank_readout_recovers_low_rank_targets_exactly():
    """Targets of rank 2 are reproduced by a rank-2 readout (tiny penalty), a rank-1 readout cannot."""
    rng, activity, _ = _data(n=80, units=400, outputs=6, seed=2)
    targets = activity @ torch.from_numpy(rng.normal(size=(400, 2)) @ rng.normal(size=(2, 6))).float() + 3.0
    held_back = np.arange(80) % 4 == 0
    two = fit_ridge_readout(activity, targets, rank=2, held_back=held_back, penalties=(1e-6,))
    one = fit_ridge_readout(activity, targets, rank=1, held_back=held_back, penalties=(1e-6,))
    assert two.first.shape == (2, 400) and two.second.shape == (6, 2)
    error = lambda readout: float((_predict(readout, activity) - targets).abs().max() / targets.abs().max())
    assert error(two) < 1e-3 < 0.05 < error(one)


@pytest.mark.parametrize("held_back, scored, rank, match", [
    (np.zeros(60, bool), None, 3, "some, but not all"), (np.ones(60, bool), None, 3, "some, but not all"),
    (np.arange(60) % 2 == 0, None, 0, "rank must be"),
    (np.arange(60) % 2 == 0, np.arange(60) % 3 == 0, 3, "only those"),
    (np.arange(60) % 2 == 0, np.zeros(60, bool), 3, "some of the held-back")])
def test_bad_arguments_are_refused(held_back, scored, rank, match):
    _, activity, weights = _data()
    with pytest.raises(ValueError, match=match):
        fit_ridge_readout(activity, activity @ weights, rank=rank, held_back=held_back, scored=scored)


def test_a_constant_activity_is_refused():
    activity = torch.ones(20, 30)
    with pytest.raises(ValueError, match="same on every row"):
        fit_ridge_readout(activity, torch.randn(20, 4), rank=2, held_back=np.arange(20) < 5)
