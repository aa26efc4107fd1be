"""Tests of the batched simulation engine (stimsim.engine) and its benchmark (stimsim.engine.bench)."""
import functools
import json
import math
import shutil
import warnings

import numpy as np
import pytest
import torch
import xarray as xr

from stimsim.behavior import LogisticDecoder
from stimsim.cortex.positions import retinotopic_positions
from stimsim.cortex.sheet import CorticalSheet
from stimsim.data.stimuli import StimulusSet
from stimsim.engine import simulation as engine
from stimsim.engine.activation_cache import SAMPLED_ROWS
from stimsim.engine.bench import run_benchmark
from stimsim.engine.devices import full_float32_on_cuda, resolve_device
from stimsim.models.architectures import build_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.topographic import TopographicModel
from stimsim.stimulation import (Ablation, Condition, ElectricalStimulation, MuscimolInactivation,
                                 OptogeneticSuppression, SafetyLimits)
from stimsim.utilities.errors import ConfigError, SafetyError
from stimsim.utilities.hashing import sha256_of

#: 300 µA exceeds Shannon's limit on a Utah tip; these tests want strong in-silico effects, no protocol.
OVERRIDE = "engine tests: strong in-silico effects, no protocol proposed"
simulate = functools.partial(engine.simulate, safety_override=OVERRIDE)
simulate_plain = functools.partial(engine.simulate_plain, safety_override=OVERRIDE)

N_IMAGES = 12
IT_SHEET_MM = 10.0
V4_SHEET_MM = 20.0


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    kwargs = {"n_classes": 2, "it_units": 64}
    network = build_network("stimsim_topo", **kwargs)
    sheets = {
        "v4": CorticalSheet("v4", (128, 4, 4), retinotopic_positions((128, 4, 4), V4_SHEET_MM, seed=1)),
        "it": CorticalSheet("it", (64, 1, 1), retinotopic_positions((64, 1, 1), IT_SHEET_MM, seed=2)),
    }
    return TopographicModel(network, sheets, Preprocessing(size_px=32, channels=1, mean=(0.5,), std=(0.25,)),
                            {"family": "stimsim_topo", "kwargs": kwargs}, areas={"it": "IT", "v4": "V4"},
                            name="tiny_topo")


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    brightness = np.repeat([0.0, 0.5], N_IMAGES // 2)
    return (rng.uniform(0.0, 0.5, size=(N_IMAGES, 32, 32)) + brightness[:, None, None]).astype(np.float32)


@pytest.fixture(scope="module")
def labels():
    return np.repeat(["dark", "bright"], N_IMAGES // 2)


@pytest.fixture(scope="module")
def decoder(model, images, labels):
    return LogisticDecoder.fit(model.activations(images, "it"), labels, layer="it", C=1.0)


def it_site(label, x_mm, y_mm, **kwargs):
    params = {"current_uA": 300.0, "frequency_Hz": 200.0, **kwargs}
    return Condition(label, (ElectricalStimulation(((x_mm, y_mm),), layer="IT", **params),))


def v4_site(label, x_mm, y_mm):
    return Condition(label, (ElectricalStimulation(((x_mm, y_mm),), current_uA=300.0, frequency_Hz=200.0,
                                                   layer="V4"),))


def it_sites(n):
    return [it_site(f"it_{i}", 1.0 + 8.0 * i / max(n - 1, 1), 5.0) for i in range(n)]


def test_engine_matches_plain_at_it_and_pre_it(model, images, decoder):
    conditions = [Condition("control"), *it_sites(4), v4_site("v4_a", 4.0, 4.0), v4_site("v4_b", 15.0, 12.0),
                  it_site("it_additive", 5.0, 5.0, form="additive", activation_per_Hz=0.01)]
    fast = simulate(model, images, conditions, decoder, progress=False)
    plain = simulate_plain(model, images, conditions, decoder, progress=False)
    assert fast.dims == ("condition", "stimulus_id", "choice")
    assert fast.shape == (len(conditions), N_IMAGES, 2)
    np.testing.assert_allclose(fast.values, plain.values, rtol=0, atol=1e-5)
    xr.testing.assert_identical(fast.copy(data=plain.values), plain)
    # stimulation changes behaviour (so the agreement above is not trivial), at both layers
    control = fast.sel(condition="control").values
    for label in ("it_1", "v4_a", "it_additive"):
        assert np.abs(fast.sel(condition=label).values - control).max() > 1e-3
    np.testing.assert_allclose(fast.sum("choice").values, 1.0, atol=1e-6)
    # labels: condition parameters as coords, NaN / "" where a condition lacks them
    assert list(fast.perturbed_layer.values) == ["", "it", "it", "it", "it", "v4", "v4", "it"]
    assert math.isnan(float(fast.current_uA.sel(condition="control")))
    assert float(fast.current_uA.sel(condition="it_0")) == 300.0
    assert float(fast.site_x_mm.sel(condition="v4_b")) == 15.0
    assert fast.kind.sel(condition="control").item() == "control"
    assert fast.attrs["perturbed_layers"] == "v4,it"
    assert fast.attrs["decoder_layer"] == "it"
    assert fast.attrs["model"] == "tiny_topo"


def test_control_and_identity_reproduce_unperturbed_output_exactly(model, images, decoder):
    conditions = [it_site("it_0", 5.0, 5.0), Condition("control"), it_site("zero_Hz", 5.0, 5.0, frequency_Hz=0.0),
                  v4_site("v4_a", 4.0, 4.0)]
    result = simulate(model, images, conditions, decoder, progress=False)
    unperturbed = decoder.probabilities(model.activations(images, "it")[None])[0].numpy()
    assert np.array_equal(result.sel(condition="control").values, unperturbed.astype(np.float64))
    assert np.array_equal(result.sel(condition="zero_Hz").values, unperturbed.astype(np.float64))


def test_known_effects_at_the_decoder_layer(model, images, decoder):
    sheet = model.sheet("it")
    stim = it_site("stim", 3.0, 7.0)
    lesion = Condition("lesion", (Ablation(((5.0, 5.0),), radius_mm=100.0, layer="IT"),))
    result = simulate(model, images, [stim, lesion], decoder, progress=False)
    # stimulation at the decoder's layer: the decoder sees activity × gain(d)
    activity = model.activations(images, "it")
    gain = torch.tensor(stim.effect(sheet).multiplier, dtype=torch.float32)
    assert gain.max() > 2.0  # 300 µA, 200 Hz: gain = 1 + (200/30)·exp(−d/λ) near the electrode
    expected = decoder.probabilities((activity * gain)[None])[0].numpy()
    np.testing.assert_allclose(result.sel(condition="stim").values, expected, rtol=0, atol=1e-7)
    # lesion of the whole IT sheet: every image gives the decoder's response to silence
    silence = decoder.probabilities(torch.zeros(1, 1, sheet.n_units))[0, 0].numpy()
    np.testing.assert_allclose(result.sel(condition="lesion").values, np.tile(silence, (N_IMAGES, 1)), atol=1e-7)


def test_chunks_stay_within_the_memory_budget(model, images, decoder, monkeypatch):
    conditions = [*it_sites(3), v4_site("v4_a", 4.0, 4.0), v4_site("v4_b", 12.0, 6.0)]
    budget_bytes = 100_000  # a few (condition, image) pairs perturbed at V4 (2048 units)
    perturbed_bytes = []
    real_run_stages = model.run_stages

    def recording_run_stages(x, start=None, stop=None):
        if start is not None:
            perturbed_bytes.append(x.nelement() * x.element_size())
        return real_run_stages(x, start=start, stop=stop)

    monkeypatch.setattr(model, "run_stages", recording_run_stages)
    small = simulate(model, images, conditions, decoder, max_chunk_bytes=budget_bytes, progress=False)
    monkeypatch.undo()
    assert len(perturbed_bytes) > 2  # the V4 conditions ran in several passes over the images
    assert max(perturbed_bytes) <= budget_bytes
    plain = simulate_plain(model, images, conditions, decoder, progress=False)
    np.testing.assert_allclose(small.values, plain.values, rtol=0, atol=1e-5)
    with pytest.raises(ConfigError, match="max_chunk_bytes"):
        simulate(model, images, conditions, decoder, max_chunk_bytes=1000, progress=False)


def test_resume_after_a_killed_run_skips_finished_chunks(model, images, decoder, tmp_path, monkeypatch, capsys):
    conditions = [Condition("control"), *it_sites(5)]
    # two IT conditions per chunk on the fast path: (choices − 1)·N float32 weights, ~6·N float64 effect numbers and
    # 24 bytes per choice and image, for N = 64 IT units
    budget_bytes = 2 * (4 * 64 + 48 * 64 + 24 * 2 * N_IMAGES)
    uninterrupted = simulate(model, images, conditions, decoder, max_chunk_bytes=budget_bytes, progress=False)
    store = tmp_path / "store"

    real_write = engine.write_chunk
    writes = []

    def write_then_die(directory, indices, values, store_id):
        writes.append(indices)
        if len(writes) == 3:
            raise RuntimeError("killed")
        real_write(directory, indices, values, store_id)

    monkeypatch.setattr(engine, "write_chunk", write_then_die)
    with pytest.raises(RuntimeError, match="killed"):
        simulate(model, images, conditions, decoder, store=store, max_chunk_bytes=budget_bytes, progress=False)
    monkeypatch.undo()
    finished = {conditions[i].label for chunk in writes[:2] for i in chunk}
    assert "control" in finished and len(finished) == 3
    assert len(list(store.glob("chunk_*.nc"))) == 2

    computed = []
    real_effects = Condition.batch_effects

    def recording_effects(conditions, sheet, device=None):
        computed.extend(c.label for c in conditions)
        return real_effects(conditions, sheet, device)

    monkeypatch.setattr(Condition, "batch_effects", staticmethod(recording_effects))
    capsys.readouterr()
    resumed = simulate(model, images, conditions, decoder, store=store, max_chunk_bytes=budget_bytes,
                       progress=True)
    xr.testing.assert_identical(resumed, uninterrupted)
    # one line says what is reused, before the bar counts the chunks left
    assert "stimsim: simulate: resuming: 2 of 4 chunks already stored\n" in capsys.readouterr().err
    assert set(computed) == {c.label for c in conditions} - finished
    assert len(list(store.glob("chunk_*.nc"))) == 4

    computed.clear()
    again = simulate(model, images, conditions, decoder, store=store, max_chunk_bytes=budget_bytes, progress=False)
    xr.testing.assert_identical(again, uninterrupted)
    assert computed == []


def _unfinished(store):
    """The store as a run killed before its last chunk leaves it: ``store.json`` without ``finished``."""
    spec = json.loads((store / "store.json").read_text())
    spec.pop("finished")
    (store / "store.json").write_text(json.dumps(spec))


def test_store_refuses_other_inputs_while_its_own_sweep_is_unfinished(model, images, labels, decoder, tmp_path):
    conditions = [Condition("control"), *it_sites(2)]
    store = tmp_path / "store"
    simulate(model, images, conditions, decoder, store=store, progress=False)
    changed = [Condition("control"), it_site("it_0", 1.0, 5.0, current_uA=100.0), it_sites(2)[1]]
    # a finished sweep's store holds no work to resume: other inputs replace it
    xr.testing.assert_identical(simulate(model, images, changed, decoder, store=store, progress=False),
                                simulate(model, images, changed, decoder, progress=False))
    assert json.loads((store / "store.json").read_text())["finished"] is True  # now the store of `changed`
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every chunk verifies as this sweep's
        xr.testing.assert_identical(simulate(model, images, changed, decoder, store=store, progress=False),
                                    simulate(model, images, changed, decoder, progress=False))
    simulate(model, images, conditions, decoder, store=store, progress=False)
    _unfinished(store)
    with pytest.raises(ConfigError, match="holds the unfinished work of a run with different inputs.*conditions"):
        simulate(model, images, changed, decoder, store=store, progress=False)
    with pytest.raises(ConfigError, match="images"):
        simulate(model, images[::-1].copy(), conditions, decoder, store=store, progress=False)
    other_decoder = LogisticDecoder.fit(model.activations(images, "it"), labels, layer="it", C=0.01)
    with pytest.raises(ConfigError, match="decoder"):
        simulate(model, images, conditions, other_decoder, store=store, progress=False)
    with pytest.raises(ConfigError, match="stimulus_ids"):
        simulate(model, images, conditions, decoder, store=store, progress=False,
                 stimulus_ids=[f"s{i}" for i in range(N_IMAGES)])
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    (unrelated / "notes.txt").write_text("field notes")
    with pytest.raises(ConfigError, match="store.json"):
        simulate(model, images, conditions, decoder, store=unrelated, progress=False)
    replaced = simulate(model, images, changed, decoder, store=store, progress=False, replace_stale_store=True)
    xr.testing.assert_identical(replaced, simulate(model, images, changed, decoder, progress=False))


def _alter_chunk(path, change):
    """Change the probabilities stored in a chunk file in place, keeping its shape and attributes."""
    import h5py

    with h5py.File(path, "r+") as handle:
        handle["probability"][...] = change(handle["probability"][...])


def test_a_changed_or_foreign_chunk_is_never_used(model, images, decoder, tmp_path):
    conditions = [Condition("control"), *it_sites(3)]
    budget_bytes = 2 * (4 * 64 + 48 * 64 + 24 * 2 * N_IMAGES)  # two IT conditions per chunk on the fast path
    expected = simulate(model, images, conditions, decoder, max_chunk_bytes=budget_bytes, progress=False)
    store = tmp_path / "store"
    simulate(model, images, conditions, decoder, store=store, max_chunk_bytes=budget_bytes, progress=False)
    chunks = sorted(store.glob("chunk_*.nc"))
    assert len(chunks) == 3
    # one flipped number: same shape, same indices, different value
    _alter_chunk(chunks[1], lambda values: np.where(np.arange(values.size).reshape(values.shape) == 0,
                                                    1.0 - values, values))
    with pytest.warns(UserWarning, match=rf"{chunks[1].name}.*fails its checksum.*recomputed"):
        again = simulate(model, images, conditions, decoder, store=store, max_chunk_bytes=budget_bytes,
                         progress=False)
    xr.testing.assert_identical(again, expected)
    # a valid chunk of a run at another current, copied in under the same name
    other_store = tmp_path / "other"
    stronger = [Condition("control"), *(it_site(c.label, *c.perturbations[0].sites_mm[0], current_uA=400.0)
                                        for c in conditions[1:])]
    simulate(model, images, stronger, decoder, store=other_store, max_chunk_bytes=budget_bytes, progress=False)
    shutil.copy(other_store / chunks[2].name, chunks[2])
    with pytest.warns(UserWarning, match=rf"{chunks[2].name}.*another store"):
        again = simulate(model, images, conditions, decoder, store=store, max_chunk_bytes=budget_bytes,
                         progress=False)
    xr.testing.assert_identical(again, expected)
    # the recomputed chunks were written back and verify now
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        xr.testing.assert_identical(simulate(model, images, conditions, decoder, store=store,
                                             max_chunk_bytes=budget_bytes, progress=False), expected)


def test_a_store_with_a_stray_temporary_file_resumes(model, images, decoder, tmp_path):
    conditions = [Condition("control"), *it_sites(2)]
    store = tmp_path / "store"
    store.mkdir()
    (store / ".store.json.k3j2l.tmp").write_text("{")  # a kill while writing store.json
    first = simulate(model, images, conditions, decoder, store=store, progress=False)
    (store / ".chunk_00000001.nc.x81a.tmp.nc").write_bytes(b"half a chunk")
    xr.testing.assert_identical(simulate(model, images, conditions, decoder, store=store, progress=False), first)


def test_the_engine_enforces_the_safety_limits(model, images, decoder):
    strong = it_sites(2)  # 300 µA: Shannon's k ≈ 2.26 on a Utah tip, above 1.85
    with pytest.raises(SafetyError, match=r"condition 'it_0'.*Shannon's k = 2\.255 exceeds"):
        engine.simulate(model, images, strong, decoder, progress=False)
    with pytest.raises(SafetyError, match="Shannon"):
        engine.simulate_plain(model, images, strong, decoder, progress=False)
    # loosening a limit is an override too, even when the protocol would then pass
    with pytest.raises(SafetyError, match="max_shannon_k = 1000 is above the default limit 1.85"):
        engine.simulate(model, images, strong, decoder, safety_limits=SafetyLimits(max_shannon_k=1000),
                        progress=False)
    with pytest.raises(SafetyError, match="electrode_area_um2 = 1e\\+08"):
        engine.simulate(model, images, strong, decoder, safety_limits=SafetyLimits(electrode_area_um2=1e8),
                        progress=False)
    overridden = engine.simulate(model, images, strong, decoder, safety_override=" approved protocol 7 ",
                                 progress=False)
    assert overridden.attrs["safety_override"] == "approved protocol 7"
    gentle = [it_site("gentle", 5.0, 5.0, current_uA=50.0)]  # k ≈ 0.70
    result = engine.simulate(model, images, gentle, decoder, progress=False)
    assert result.attrs["safety_override"] == ""
    assert '"max_shannon_k": 1.85' in result.attrs["safety_limits_json"]
    # a stricter limit binds even the gentle protocol
    with pytest.raises(SafetyError, match="max_shannon_k = 0.5"):
        engine.simulate(model, images, gentle, decoder, safety_limits=SafetyLimits(max_shannon_k=0.5),
                        progress=False)


def test_the_safety_gate_checks_every_kind_that_carries_charge(model, images, decoder):
    """The gate keys on the ``carries_charge`` capability, not on one class: a new current-carrying kind (here an
    electrical train that also records its own name) is refused above the limits as electrical stimulation is."""
    from dataclasses import dataclass
    from typing import ClassVar

    @dataclass(frozen=True)
    class TaggedTrain(ElectricalStimulation):
        kind: ClassVar[str] = "tagged_train"

    strong = Condition("tagged", (TaggedTrain(((5.0, 5.0),), current_uA=300.0, layer="IT"),))
    with pytest.raises(SafetyError, match=r"condition 'tagged'.*Shannon's k = 2\.255 exceeds"):
        engine.simulate(model, images, [strong], decoder, progress=False)


def test_labels_round_trip_through_netcdf(model, images, labels, decoder, tmp_path):
    ids = [f"img{i:02d}" for i in range(N_IMAGES)]
    result = simulate(model, images, [Condition("control"), *it_sites(2)], decoder, stimulus_ids=ids,
                      stimulus_coords={"brightness": labels}, progress=False)
    assert list(result.stimulus_id.values) == ids
    assert list(result.brightness.values) == list(labels)
    assert list(result.choice.values) == list(decoder.choices)
    path = tmp_path / "result.nc"
    result.to_netcdf(path, engine="h5netcdf")
    with xr.load_dataarray(path, engine="h5netcdf") as loaded:
        np.testing.assert_array_equal(loaded.values, result.values)
        assert list(loaded.condition.values) == list(result.condition.values)
        np.testing.assert_array_equal(loaded.current_uA.values, result.current_uA.values)


def test_invalid_inputs_are_refused(model, images, labels, decoder):
    v4_decoder = LogisticDecoder.fit(model.activations(images, "v4"), labels, layer="v4", C=1.0)
    with pytest.raises(ConfigError, match="after the decoder"):
        simulate(model, images, it_sites(1), v4_decoder, progress=False)
    with pytest.raises(ConfigError, match="unique"):
        simulate(model, images, [it_site("a", 1.0, 1.0), it_site("a", 2.0, 2.0)], decoder, progress=False)
    bare = it_site("a", 1.0, 1.0).perturbations[0]  # a perturbation passed where a condition belongs
    with pytest.raises(ConfigError, match=r"conditions\[1\] is of type ElectricalStimulation, not a Condition; wrap"):
        simulate(model, images, [Condition("control"), bare], decoder, progress=False)
    with pytest.raises(ConfigError, match="one value per image"):
        simulate(model, images, it_sites(1), decoder, stimulus_coords={"x": [1, 2]}, progress=False)
    with pytest.raises(ConfigError, match="clashes"):
        simulate(model, images, it_sites(1), decoder, stimulus_coords={"current_uA": np.zeros(N_IMAGES)},
                 progress=False)
    with pytest.raises(ConfigError, match="batch_size"):
        simulate(model, images, it_sites(1), decoder, batch_size=0, progress=False)
    with pytest.raises(ConfigError, match="no conditions"):
        simulate(model, images, [], decoder, progress=False)
    with pytest.raises(ConfigError, match="conditions is one Condition; give a list"):
        simulate(model, images, Condition("control"), decoder, progress=False)
    with pytest.raises(ConfigError, match=r"model is a name or path \('stimsim-topo-s0'\); load it first"):
        simulate("stimsim-topo-s0", images, it_sites(1), decoder, progress=False)


class OpaqueDecoder:
    """The same decoder without ``linear_weights``: the engine must take its general path."""

    def __init__(self, decoder):
        self.layer, self.choices, self.probabilities = decoder.layer, decoder.choices, decoder.probabilities


def mixed_it_conditions():
    return [Condition("control"), *it_sites(5), it_site("zero_Hz", 5.0, 5.0, frequency_Hz=0.0),
            it_site("additive", 4.0, 6.0, form="additive", activation_per_Hz=0.01),
            it_site("tehovnik", 6.0, 4.0, spread="tehovnik", current_uA=2000.0),
            Condition("light", (OptogeneticSuppression(((3.0, 3.0), (7.0, 7.0)), power_mW=3.0, layer="IT"),)),
            Condition("muscimol", (MuscimolInactivation(((5.0, 5.0),), volume_uL=0.8, layer="IT"),)),
            Condition("stim+lesion", (ElectricalStimulation(((2.0, 8.0),), current_uA=200.0, layer="IT"),
                                      Ablation(((8.0, 2.0),), radius_mm=2.0, layer="IT")))]


@pytest.mark.parametrize("n_classes", [2, 3])
def test_linear_fast_path_equals_general_path(model, images, n_classes, monkeypatch):
    labels = np.array(["a", "b", "c"])[np.arange(N_IMAGES) % n_classes]
    decoder = LogisticDecoder.fit(model.activations(images, "it"), labels, layer="it", C=1.0)
    conditions = mixed_it_conditions()
    calls = []
    real = engine._Runner._linear_readout

    def counting(self, layer, multiplier, additive):
        calls.append(len(multiplier))
        return real(self, layer, multiplier, additive)

    monkeypatch.setattr(engine._Runner, "_linear_readout", counting)
    fast = simulate(model, images, conditions, decoder, progress=False)
    assert sum(calls) == len(conditions) - 2  # every condition but the control and the 0 Hz identity
    general = simulate(model, images, conditions, OpaqueDecoder(decoder), progress=False)
    assert sum(calls) == len(conditions) - 2  # the general path does not use it
    np.testing.assert_allclose(fast.values, general.values, rtol=0, atol=1e-6)
    # the fast path is exact, not merely close: stimulation moves probabilities by far more than the tolerance
    assert np.abs(fast.values - fast.sel(condition="control").values).max() > 0.05
    plain = simulate_plain(model, images, conditions, decoder, progress=False)
    np.testing.assert_allclose(fast.values, plain.values, rtol=0, atol=1e-6)


def test_same_different_decoder_takes_the_general_path(model, images):
    from stimsim.behavior import SameDifferentDecoder

    features = model.activations(images, "it").numpy()
    first, second = np.arange(N_IMAGES), np.roll(np.arange(N_IMAGES), 1)
    same = np.arange(N_IMAGES) % 2 == 0
    second = np.where(same, first, second)
    pair = SameDifferentDecoder.fit(features[first], features[second], same, layer="it", C=1.0)
    bound = pair.bind(features[first])  # each simulated (second) image is compared with its unperturbed first image
    assert not hasattr(bound, "linear_weights")  # |f_a − f_b| is not linear in the perturbed activity
    conditions = mixed_it_conditions()
    result = simulate(model, images[second], conditions, bound, progress=False)
    plain = simulate_plain(model, images[second], conditions, bound, progress=False)
    np.testing.assert_allclose(result.values, plain.values, rtol=0, atol=1e-5)


def test_activations_are_cached_across_runs(model, images, decoder, tmp_path, monkeypatch):
    cache = tmp_path / "activations"
    first = simulate(model, images, it_sites(3), decoder, activation_cache=cache, progress=False)
    entries = sorted(cache.glob("*.pt"))
    assert len(entries) == 1
    below = []
    real_run_stages = model.run_stages

    def recording_run_stages(x, start=None, stop=None):
        if start is None:
            below.append((stop, len(x)))
        return real_run_stages(x, start=start, stop=stop)

    monkeypatch.setattr(model, "run_stages", recording_run_stages)
    # another stimulation block on the same images: the stages below the perturbed layer see only the first,
    # the last and SAMPLED_ROWS random images (the content check of the entry), not all of them
    others = [it_site("s100", 2.0, 2.0, current_uA=100.0), it_site("s50", 7.0, 7.0, current_uA=50.0)]
    again = simulate(model, images, others, decoder, activation_cache=cache, progress=False)
    assert below == [("it", min(N_IMAGES, 2 + SAMPLED_ROWS))] and N_IMAGES > 2 + SAMPLED_ROWS
    uncached = simulate(model, images, others, decoder, progress=False)
    xr.testing.assert_identical(again, uncached)
    below.clear()
    # a damaged entry fails its checksum: it is recomputed (with a warning), and the result does not change
    entries[0].write_bytes(entries[0].read_bytes()[:-8] + b"damaged!")
    with pytest.warns(UserWarning, match="checksum"):
        repaired = simulate(model, images, it_sites(3), decoder, activation_cache=cache, progress=False)
    assert below == [("it", N_IMAGES)]  # computed again, whole
    xr.testing.assert_identical(repaired, first)
    # other numbers under a checksum made to match them: the recomputed first and last rows catch it
    record_path = entries[0].with_suffix(".json")
    for rows, message in ((slice(0, 1), "does not match the model's activity of the images checked"),
                          (slice(1, N_IMAGES - 1), "does not match the model's activity of the images checked"),
                          (slice(0, N_IMAGES - 1), f"not the activity of {N_IMAGES} images")):
        stored = torch.load(entries[0], weights_only=True)
        replaced = stored.clone()
        replaced[rows] += 0.5
        torch.save(replaced[: N_IMAGES - 1] if rows == slice(0, N_IMAGES - 1) else replaced, entries[0])
        record = json.loads(record_path.read_text())
        record_path.write_text(json.dumps({**record, "sha256": sha256_of(entries[0])}))
        with pytest.warns(UserWarning, match=f"{entries[0].name} .*{message}"):
            repaired = simulate(model, images, it_sites(3), decoder, activation_cache=cache, progress=False)
        xr.testing.assert_identical(repaired, first)
    # other images are another entry
    simulate(model, images[::-1].copy(), it_sites(3), decoder, activation_cache=cache, progress=False)
    assert len(list(cache.glob("*.pt"))) == 2


def test_a_cache_that_cannot_be_written_warns_and_the_run_goes_on(model, images, decoder, tmp_path):
    (tmp_path / "not_a_directory").write_text("")
    cache = tmp_path / "not_a_directory" / "activations"
    with pytest.warns(UserWarning, match=r"cannot keep the activations in the cache .*not_a_directory.*continuing"):
        stored_nowhere = simulate(model, images, it_sites(3), decoder, activation_cache=cache, progress=False)
    xr.testing.assert_identical(stored_nowhere, simulate(model, images, it_sites(3), decoder, progress=False))
    # the other entries of the run (other images, as of its next phase) are not stored either, and not said again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulate(model, images[::-1].copy(), it_sites(3), decoder, activation_cache=cache, progress=False)
        simulate(model, images[:2].copy(), it_sites(3), decoder, activation_cache=cache, progress=False)
    assert not [str(w.message) for w in caught if "cannot keep the activations" in str(w.message)]


def test_devices_resolve_and_results_agree_across_devices(model, images, decoder):
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="unknown device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            resolve_device("cuda")
    if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        with pytest.raises(ConfigError, match="MPS is not available"):
            resolve_device("mps")
    conditions = [Condition("control"), *it_sites(3), v4_site("v4_a", 4.0, 4.0)]
    on_cpu = simulate(model, images, conditions, decoder, progress=False, device="cpu")
    auto = resolve_device("auto")  # the GPU where there is one
    try:
        elsewhere = simulate(model, images, conditions, decoder, progress=False, device=auto)
        assert model.device.type == auto.type
    finally:
        model.to("cpu")
    np.testing.assert_allclose(elsewhere.values, on_cpu.values, rtol=0, atol=1e-4)


def test_cuda_computes_in_full_float32():
    """TensorFloat-32 (PyTorch's default for cuDNN convolutions) is off once stimsim resolves a CUDA device; the
    switch itself is checked on any machine."""
    full_float32_on_cuda()
    conv, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    if hasattr(getattr(conv, "conv", None), "fp32_precision"):
        assert (conv.conv.fp32_precision, matmul.fp32_precision) == ("ieee", "ieee")
    else:
        assert not conv.allow_tf32 and not matmul.allow_tf32


def test_every_target_of_the_benchmark_is_judged():
    """A missed target of any section is named with its value (not only the plain section's speedups); on quick
    sizes nothing is judged."""
    from stimsim.engine.bench import judge_targets

    full = {"quick": False, "speedup_it": 240.0, "speedup_pre_it": 10.8, "engine_over_bound_it": 1.06,
            "engine_vs_cached_baseline": 2.25, "dask_2workers_vs_1": 1.01, "dask_max_abs_diff": 6e-9,
            "analysis": {"total_s": 31.0}, "dask_note": "text is not judged", "default_model": {"speedup_it": 1.0}}
    judged = judge_targets(full)
    assert judged["meets_targets"] is False
    assert judged["targets_missed"] == {"dask_2workers_vs_1": {"value": 1.01, "target": ">= 1.6"},
                                        "analysis.total_s": {"value": 31.0, "target": "<= 30"}}
    met = judge_targets({**full, "dask_2workers_vs_1": 1.6, "analysis": {"total_s": 30.0}})
    assert met == {"targets_missed": {}, "meets_targets": True}  # a target reached exactly is met
    assert judge_targets({**full, "quick": True}) == {"targets_missed": None, "meets_targets": None}
    assert judge_targets({"quick": False, "dask_2workers_vs_1": None}) == {"targets_missed": {}, "meets_targets": None}


def test_benchmark_quick_mode(model):
    report = run_benchmark(quick=True, default_model=model)
    for key in ("engine_over_bound_it", "engine_vs_cached_baseline", "engine_over_bound_small",
                "engine_vs_cached_baseline_small", "bound_s_it", "cached_baseline_s_it"):
        assert math.isfinite(report[key]) and report[key] > 0, key
    # the engine and the plain cache-and-batch approach give the same probabilities
    assert report["max_abs_diff_engine_vs_baseline_it"] < 1e-6
    assert report["max_abs_diff_engine_vs_baseline_small"] < 1e-6
    assert report["dask_2workers_vs_1"] is None  # not measured in quick mode
    assert report["meets_targets"] is None and report["targets_missed"] is None  # targets are for the full sizes
    assert "jobs" not in report  # the jobs section runs only when named
    keys = ("speedup_it", "speedup_pre_it", "max_abs_diff_it", "max_abs_diff_pre_it", "engine_pairs_per_s_it",
            "plain_pairs_per_s_it", "engine_pairs_per_s_pre_it", "plain_pairs_per_s_pre_it")
    for key in (*keys, "peak_rss_MB"):
        assert math.isfinite(report[key]) and report[key] >= 0, key
    for key in keys:
        assert math.isfinite(report["default_model"][key]), key
    assert report["max_abs_diff_it"] < 1e-5 and report["max_abs_diff_pre_it"] < 1e-5
    assert report["default_model"]["it_layer"] == "it" and report["default_model"]["pre_it_layer"] == "v4"
    # the smoothed map and the loop over its points give the same values; the activation cache gives back the
    # forward pass's numbers exactly (the same batches on the CPU)
    assert report["maps"]["units"] == model.sheet("it").n_units and report["maps"]["max_abs_diff"] < 1e-12
    assert report["cache"]["max_abs_diff"] == 0 and report["cache"]["entry_MB"] > 0
    for key in ("smoothing_vs_loop", "cache_reuse_vs_forward", "cache_store_over_forward"):
        assert math.isfinite(report[key]) and report[key] > 0, key
    plan = report["plan_phases"]  # the ImageNet plan's phases per site, and the default plan they add up to
    per_site = plan["seconds_per_site"]
    assert set(per_site) == {"sequences", "decoders", "rehearsal"} and all(v > 0 for v in per_site.values())
    assert plan["plan_default_design_and_rehearsal_s"] == pytest.approx(
        75 * (per_site["sequences"] + 3 * (per_site["decoders"] + per_site["rehearsal"])))


def test_a_quick_benchmark_says_why_a_named_section_measured_nothing(model):
    """On quick sizes the Dask sweep is not run: a section named in ``sections`` says so in a warning, one that
    runs by default does not."""
    with pytest.warns(UserWarning, match="bench: section 'dask' was not measured: the quick sizes have no Dask "
                                         r"sweep \(run without --quick\)"):
        report = run_benchmark(quick=True, default_model=model, sections=["dask"])
    assert report["dask_2workers_vs_1"] is None and report["dask_note"].startswith("not measured: the quick sizes")
    with pytest.warns(UserWarning, match="section 'load' was not measured: there is no default model"):
        run_benchmark(quick=True, sections=["load"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_benchmark(quick=True, default_model=model, sections=["analysis"])


def test_only_the_plain_section_needs_a_topographic_layer_before_it(model, monkeypatch):
    """A model whose only sheet is IT's is timed in the sections that need no pre-IT layer (``load``, ``bound``);
    the ``plain`` and ``dask`` sections, whose workloads stimulate such a layer, refuse it and say so before any
    section runs."""
    import stimsim.models.registry as registry

    it_only = TopographicModel(model.network, {"it": model.sheet("it")}, model.preprocessing, model.architecture,
                               areas={"it": "IT"}, name="it_only")
    monkeypatch.setattr(registry, "load_model", lambda name, device="cpu": it_only)
    report = run_benchmark(quick=True, default_model=it_only, sections=["load", "bound"],
                           default_model_source="it_only")
    assert report["default_model_load_and_activations"]["model"] == "it_only"
    assert report["max_abs_diff_engine_vs_baseline_small"] < 1e-6
    ran = []
    with pytest.raises(ConfigError, match="model 'it_only' has no topographic layer before its IT layer 'it'; the "
                                          "pre-IT workload of the plain section needs one"):
        run_benchmark(quick=True, default_model=it_only, sections=["bound", "plain"], on_partial=ran.append)
    # the dask section stimulates the stage two before IT (v4 of stimsim_topo's v1, v2, v4, pit, it), a sheet here
    with pytest.raises(ConfigError, match=r"model 'it_only' has no topographic layer two stages before its IT layer "
                                          r"'it' \(stages: \['v1', 'v2', 'v4', 'pit', 'it', 'head'\]"):
        run_benchmark(default_model=it_only, sections=["dask"], on_partial=ran.append)
    assert not ran  # refused before any section ran, not after the bound section's minutes


def test_a_stimulus_set_is_simulated_under_its_own_ids(model, images, decoder):
    """Images given as a StimulusSet give the same probabilities as the bare arrays, labelled by the set's ids."""
    ids = np.array([f"img{i:02d}" for i in range(N_IMAGES)])
    stimuli = StimulusSet("brightness", list(images), ids)
    from_set = simulate(model, stimuli, it_sites(2), decoder, progress=False)
    from_arrays = simulate(model, images, it_sites(2), decoder, progress=False)
    assert list(from_set["stimulus_id"].values) == list(ids)
    np.testing.assert_array_equal(from_set.values, from_arrays.values)
