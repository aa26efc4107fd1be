"""Perturbation specs, spread laws and unit effects: known values from the calibration papers."""
import csv
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stimsim.cortex.sheet import CorticalSheet
from stimsim.stimulation import (Ablation, Condition, ElectricalStimulation, MuscimolInactivation,
                                 OptogeneticSuppression, Perturbation, UnitEffect, electrical_profile,
                                 kumaravelu_length_mm, perturbation_from_dict, tehovnik_radius_mm)
from stimsim.utilities.errors import ConfigError

KUMARAVELU_CSV = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "calibration" / \
    "kumaravelu2021_fig2C_activation_vs_distance.csv"


def point_sheet(points_mm, name="it"):
    """A sheet whose units sit exactly at ``points_mm`` (dims (N, 1, 1)), plus two corners that
    make the sheet span [-5, 5] mm in x and y."""
    coords = np.vstack([np.asarray(points_mm, dtype=float).reshape(-1, 2), [[-5.0, -5.0], [5.0, 5.0]]])
    return CorticalSheet(name, (len(coords), 1, 1), coords)


def grid_sheet(n_side=21, size_mm=4.0):
    xs = np.linspace(0.0, size_mm, n_side)
    xx, yy = np.meshgrid(xs, xs, indexing="xy")
    return CorticalSheet("grid", (1, n_side, n_side), np.column_stack([xx.ravel(), yy.ravel()]))


# --- spread laws ----------------------------------------------------------------------------
@pytest.mark.parametrize("current_uA, expected_mm", [(50, 0.226), (100, 0.479), (300, 1.49)])
def test_kumaravelu_spread_length_known_values(current_uA, expected_mm):
    assert kumaravelu_length_mm(current_uA) == pytest.approx(expected_mm, abs=0.0015)
    stim = ElectricalStimulation(((0.0, 0.0),), current_uA=current_uA)
    assert stim.spread_extent_mm == pytest.approx(expected_mm, abs=0.0015)
    assert stim.describe()["spread_length_mm"] == pytest.approx(expected_mm, abs=0.0015)


@pytest.mark.parametrize("current_uA", [5.26062, 5.0, 0.0, -10.0])
def test_kumaravelu_law_refuses_currents_at_or_below_its_bound(current_uA):
    with pytest.raises(ConfigError, match="5.26062"):
        kumaravelu_length_mm(current_uA)
    with pytest.raises(ConfigError, match=r"current_uA must be in \(5.26062, 5000\] µA \(the Kumaravelu et al. 2022 "
                                          r"spread length λ\(I\) is <= 0 at or below 5.26062 µA\)"):
        ElectricalStimulation(((0.0, 0.0),), current_uA=current_uA)


def test_current_above_5000_uA_refused_and_tehovnik_accepts_small_currents():
    with pytest.raises(ConfigError, match=r"current_uA must be in \(5.26062, 5000\] µA, got 5001$"):  # no word on λ
        ElectricalStimulation(((0.0, 0.0),), current_uA=5001)
    for bad, message in ((float("nan"), r"current_uA must be finite in µA, got nan$"),
                         ("50", r"current_uA must be a number in µA, got '50'$")):  # nor here
        with pytest.raises(ConfigError, match=message):
            ElectricalStimulation(((0.0, 0.0),), current_uA=bad)
    stim = ElectricalStimulation(((0.0, 0.0),), current_uA=5.0, spread="tehovnik")
    assert stim.spread_extent_mm == pytest.approx(math.sqrt(5.0 / 1292.0))


def test_spread_law_matches_kumaravelu_calibration_data():
    """λ(I) agrees within 20 % with exponential fits to the digitised fig. 2C of Kumaravelu et al. 2022."""
    if not KUMARAVELU_CSV.is_file():
        pytest.skip("calibration data not available")
    from scipy.optimize import curve_fit

    with open(KUMARAVELU_CSV) as handle:
        rows = [{key.strip(): float(value) for key, value in row.items()} for row in csv.DictReader(handle)]
    currents = sorted({row["stimulation_current_microampere"] for row in rows})
    assert currents == [15.0, 30.0, 50.0, 100.0]
    for current_uA in currents:
        distance_mm = np.array([r["distance_micrometer"] for r in rows
                                if r["stimulation_current_microampere"] == current_uA]) / 1000.0
        probability = np.array([r["synapse_probability"] for r in rows
                                if r["stimulation_current_microampere"] == current_uA])
        (fitted_mm,), _ = curve_fit(lambda d, lam: np.exp(-d / lam), distance_mm, probability, p0=[0.1])
        assert kumaravelu_length_mm(current_uA) == pytest.approx(fitted_mm, rel=0.2)


def test_tehovnik_law_is_a_hard_disc_of_radius_sqrt_I_over_K():
    # I = K r²: 323 µA with K = 1292 µA/mm² activates a disc of radius 0.5 mm.
    assert tehovnik_radius_mm(323.0, 1292.0) == pytest.approx(0.5)
    weights = electrical_profile(np.array([0.0, 0.49, 0.5, 0.51, 2.0]), 323.0, "tehovnik", 1292.0)
    np.testing.assert_array_equal(weights, [1, 1, 1, 0, 0])
    sheet = point_sheet([[0.0, 0.0], [0.49, 0.0], [0.51, 0.0]])
    stim = ElectricalStimulation(((0.0, 0.0),), current_uA=323.0, frequency_Hz=60, spread="tehovnik")
    np.testing.assert_allclose(stim.effect(sheet).multiplier[:3], [3.0, 3.0, 1.0])
    with pytest.raises(ConfigError, match=r"\[300, 27000\]"):
        ElectricalStimulation(((0.0, 0.0),), spread="tehovnik", tehovnik_K_uA_per_mm2=100)


# --- electrical effects ---------------------------------------------------------------------
@pytest.mark.parametrize("current_uA", [50.0, 100.0])
@pytest.mark.parametrize("frequency_Hz", [60.0, 200.0])
def test_multiplicative_gain_at_site_and_at_one_spread_length(current_uA, frequency_Hz):
    lam = kumaravelu_length_mm(current_uA)
    sheet = point_sheet([[1.0, 1.0], [1.0 + lam, 1.0], [1.0, 1.0 - 3 * lam]])
    effect = ElectricalStimulation(((1.0, 1.0),), current_uA=current_uA, frequency_Hz=frequency_Hz).effect(sheet)
    ratio = frequency_Hz / 30.0
    assert effect.multiplier[0] == pytest.approx(1 + ratio)
    assert effect.multiplier[1] == pytest.approx(1 + ratio / math.e)
    assert effect.multiplier[2] == pytest.approx(1 + ratio * math.exp(-3))
    np.testing.assert_array_equal(effect.additive, 0.0)


def test_zero_frequency_is_exactly_the_identity():
    sheet = grid_sheet()
    for stim in (ElectricalStimulation(((2.0, 2.0),), frequency_Hz=0.0),
                 ElectricalStimulation(((2.0, 2.0), (1.0, 1.0)), frequency_Hz=0.0, gain_cap=1.5),
                 ElectricalStimulation(((2.0, 2.0),), frequency_Hz=0.0, spread="tehovnik", current_uA=300)):
        effect = stim.effect(sheet)
        assert effect.is_identity
        np.testing.assert_array_equal(effect.multiplier, 1.0)
    assert not ElectricalStimulation(((2.0, 2.0),), frequency_Hz=1.0).effect(sheet).is_identity


def test_site_off_the_sheet_is_refused_with_site_and_extent():
    sheet = grid_sheet(size_mm=4.0)
    perturbations = [ElectricalStimulation(((4.5, 1.0),)), OptogeneticSuppression(((4.5, 1.0),), power_mW=1),
                     MuscimolInactivation(((4.5, 1.0),), volume_uL=1), Ablation(((4.5, 1.0),), radius_mm=0.5),
                     ElectricalStimulation(((1.0, 1.0), (4.5, 1.0)))]
    for perturbation in perturbations:
        with pytest.raises(ConfigError, match=r"\(4.5, 1\) mm is off sheet 'grid'.*x in \[0, 4\] mm and y in \[0, 4\]"):
            perturbation.effect(sheet)


def test_additive_form_drives_silent_units_but_multiplicative_does_not():
    sheet = point_sheet([[0.0, 0.0], [0.3, 0.0]])
    silent = np.zeros((3, sheet.n_units))
    multiplicative = ElectricalStimulation(((0.0, 0.0),), frequency_Hz=200).effect(sheet)
    np.testing.assert_array_equal(multiplicative.apply(silent), 0.0)
    additive_stim = ElectricalStimulation(((0.0, 0.0),), frequency_Hz=200, form="additive",
                                          activation_per_Hz=0.01)
    # min(30 Hz + 1 Hz/Hz × 200 Hz, 200 Hz) = 200 Hz at the site, × 0.01 activation per Hz.
    assert additive_stim.rate_increment_Hz == 200.0
    driven = additive_stim.effect(sheet).apply(silent)
    np.testing.assert_allclose(driven[:, 0], 2.0)
    np.testing.assert_allclose(driven[:, 1], 2.0 * math.exp(-0.3 / kumaravelu_length_mm(50)))
    np.testing.assert_array_equal(additive_stim.effect(sheet).multiplier, 1.0)
    # below saturation the increment grows with the pulse rate: 30 + 0.5 × 100 = 80 Hz
    slow = ElectricalStimulation(((0.0, 0.0),), frequency_Hz=100, form="additive", activation_per_Hz=1.0,
                                 rate_gain_Hz_per_Hz=0.5)
    assert slow.effect(sheet).additive[0] == pytest.approx(80.0)
    assert slow.describe()["rate_increment_Hz"] == pytest.approx(80.0)


def test_additive_form_needs_an_explicit_activation_scale():
    with pytest.raises(ConfigError, match="activation_per_Hz"):
        ElectricalStimulation(((0.0, 0.0),), form="additive")
    with pytest.raises(ConfigError, match="multiplicative"):
        ElectricalStimulation(((0.0, 0.0),), activation_per_Hz=0.1)
    with pytest.raises(ConfigError, match="rate_base_Hz must be in"):
        ElectricalStimulation(((0.0, 0.0),), form="additive", activation_per_Hz=0.1, rate_base_Hz=250)


@pytest.mark.parametrize("given, message", [
    ({"tehovnik_K_uA_per_mm2": 1000}, "tehovnik_K_uA_per_mm2 applies to spread='tehovnik' only, and this stimulation "
                                      "has spread='kumaravelu'; leave it at its default 1292"),
    ({"rate_max_Hz": 150}, "rate_max_Hz applies to form='additive' only"),
    ({"rate_max_Hz": 10}, "rate_max_Hz applies to form='additive' only"),
    ({"rate_gain_Hz_per_Hz": 2}, "rate_gain_Hz_per_Hz applies to form='additive' only"),
    ({"form": "additive", "activation_per_Hz": 0.1, "baseline_frequency_Hz": 50},
     "baseline_frequency_Hz applies to form='multiplicative' only, and this stimulation has form='additive'"),
])
def test_a_parameter_the_form_or_spread_law_ignores_is_refused(given, message):
    """A value that the chosen form or spread law never reads would change nothing in the results: refused, as
    gain_cap and activation_per_Hz are."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        ElectricalStimulation(((0.0, 0.0),), **given)
    additive = {"form": "additive", "activation_per_Hz": 0.1}
    used = {"tehovnik_K_uA_per_mm2": {"spread": "tehovnik"}, "rate_max_Hz": additive, "rate_gain_Hz_per_Hz": additive}
    name = next(iter(given))
    if name in used and given[name] != 10:
        ElectricalStimulation(((0.0, 0.0),), **{**used[name], **given})


def test_gain_cap_is_respected_and_recorded():
    lam = kumaravelu_length_mm(50)
    sheet = point_sheet([[0.0, 0.0], [lam, 0.0], [4 * lam, 0.0]])
    uncapped = ElectricalStimulation(((0.0, 0.0),), frequency_Hz=200).effect(sheet).multiplier
    stim = ElectricalStimulation(((0.0, 0.0),), frequency_Hz=200, gain_cap=2.0)
    capped = stim.effect(sheet).multiplier
    assert capped.max() == 2.0
    assert capped[0] == 2.0 and capped[1] == 2.0  # 1 + 200/30 and 1 + (200/30)/e both exceed 2
    assert capped[2] == pytest.approx(uncapped[2]) and uncapped[2] < 2.0
    assert stim.describe()["gain_cap"] == 2.0
    assert ElectricalStimulation(((0.0, 0.0),)).describe()["gain_cap"] == "none"
    with pytest.raises(ConfigError, match="gain_cap must be in"):
        ElectricalStimulation(((0.0, 0.0),), gain_cap=0.5)
    with pytest.raises(ConfigError, match="form='multiplicative' only"):
        ElectricalStimulation(((0.0, 0.0),), gain_cap=2.0, form="additive", activation_per_Hz=1.0)


def test_two_electrodes_sum_versus_max():
    lam = kumaravelu_length_mm(100)
    a, b = (0.0, 0.0), (2 * lam, 0.0)
    sheet = point_sheet([a, b, (lam, 0.0)])
    ratio = 150.0 / 30.0
    sum_spec = ElectricalStimulation((a, b), current_uA=100, frequency_Hz=150, combine="sum")
    summed = sum_spec.effect(sheet)
    strongest = ElectricalStimulation((a, b), current_uA=100, frequency_Hz=150, combine="max").effect(sheet)
    # midway, each electrode contributes exp(-1): superposed increments vs the stronger one
    assert summed.multiplier[2] == pytest.approx(1 + ratio * 2 / math.e)
    assert strongest.multiplier[2] == pytest.approx(1 + ratio / math.e)
    # on an electrode: its own weight 1 plus the other's exp(-2) for "sum", just 1 for "max"
    assert summed.multiplier[0] == pytest.approx(1 + ratio * (1 + math.exp(-2)))
    assert strongest.multiplier[0] == pytest.approx(1 + ratio)
    record = sum_spec.describe()
    assert (record["n_sites"], record["combine"], record["sites_mm"]) == (2, "sum", f"(0, 0); ({2 * lam:g}, 0)")


# --- suppression ----------------------------------------------------------------------------
def test_optogenetic_suppression_chow2010_calibration():
    sigma_mm = math.sqrt(0.234)
    assert sigma_mm == pytest.approx(0.48, abs=0.01)
    sheet = point_sheet([[0.0, 0.0], [sigma_mm, 0.0], [4.0, 4.0]])
    for power_mW in (1.0, 2.5):
        multiplier = OptogeneticSuppression(((0.0, 0.0),), power_mW=power_mW).effect(sheet).multiplier
        assert multiplier[0] == 0.0
        assert multiplier[2] == pytest.approx(1.0, abs=1e-12)
    one_mW = OptogeneticSuppression(((0.0, 0.0),), power_mW=1.0).effect(sheet)
    assert one_mW.multiplier[1] == pytest.approx(1 - math.exp(-0.5))
    half_mW = OptogeneticSuppression(((0.0, 0.0),), power_mW=0.5).effect(sheet)
    assert half_mW.multiplier[0] == pytest.approx(0.5)
    assert OptogeneticSuppression(((0.0, 0.0),), power_mW=0.0).effect(sheet).is_identity
    with pytest.raises(ConfigError, match=r"power_mW must be in \[0, 100\] mW"):
        OptogeneticSuppression(((0.0, 0.0),), power_mW=-1)


def test_muscimol_inactivation_arikan2002_calibration():
    sigma_mm = math.sqrt(1.17)
    assert sigma_mm == pytest.approx(1.08, abs=0.01)
    sheet = point_sheet([[0.0, 0.0], [sigma_mm, 0.0], [0.0, 2 * sigma_mm]])
    multiplier = MuscimolInactivation(((0.0, 0.0),), volume_uL=1.0).effect(sheet).multiplier
    assert multiplier[0] == 0.0
    assert multiplier[1] == pytest.approx(1 - math.exp(-0.5))
    assert multiplier[2] == pytest.approx(1 - math.exp(-2.0))
    # muscimol spreads further than light: same site, same amount, lower multiplier at 1 mm
    far = point_sheet([[1.0, 0.0]])
    assert (MuscimolInactivation(((0.0, 0.0),), volume_uL=1).effect(far).multiplier[0]
            < OptogeneticSuppression(((0.0, 0.0),), power_mW=1).effect(far).multiplier[0])


def test_several_suppression_sites_multiply():
    sheet = point_sheet([[0.0, 0.0], [0.5, 0.0], [1.0, 0.0]])
    both = OptogeneticSuppression(((0.0, 0.0), (1.0, 0.0)), power_mW=0.5).effect(sheet).multiplier
    first = OptogeneticSuppression(((0.0, 0.0),), power_mW=0.5).effect(sheet).multiplier
    second = OptogeneticSuppression(((1.0, 0.0),), power_mW=0.5).effect(sheet).multiplier
    np.testing.assert_allclose(both, first * second)
    assert both[1] < min(first[1], second[1])


def test_ablation_zeroes_units_within_radius():
    sheet = point_sheet([[0.0, 0.0], [0.4, 0.0], [0.0, -0.4], [0.41, 0.0], [0.3, 0.3], [2.0, 0.0]])
    effect = Ablation(((0.0, 0.0),), radius_mm=0.4).effect(sheet)
    np.testing.assert_array_equal(effect.multiplier[:6], [0, 0, 0, 1, 1, 1])  # boundary (0.4 mm) included
    np.testing.assert_array_equal(effect.additive, 0.0)
    two = Ablation(((0.0, 0.0), (2.0, 0.0)), radius_mm=0.4).effect(sheet)
    np.testing.assert_array_equal(two.multiplier[:6], [0, 0, 0, 1, 1, 0])
    with pytest.raises(ConfigError, match=r"radius_mm must be in \(0, inf\) mm"):
        Ablation(((2.0, 2.0),), radius_mm=0)


# --- validation -----------------------------------------------------------------------------
@pytest.mark.parametrize("params, message", [
    ({"frequency_Hz": 1001}, r"frequency_Hz must be in \[0, 1000\] Hz"),
    ({"frequency_Hz": -1}, r"frequency_Hz must be in \[0, 1000\] Hz"),
    ({"pulse_width_ms": 0}, r"pulse_width_ms must be in \(0, 2\] ms"),
    ({"pulse_width_ms": 2.5}, r"pulse_width_ms must be in \(0, 2\] ms"),
    ({"interphase_ms": -0.1}, r"interphase_ms must be in \[0, 1\] ms"),
    ({"train_ms": 0}, r"train_ms must be in \(0, 10000\] ms"),
    ({"train_ms": 10_001}, r"train_ms must be in \(0, 10000\] ms"),
    ({"train_ms": 0.49}, r"train_ms = 0.49 ms is shorter than one biphasic pulse \(2 × pulse_width_ms \+ interphase_ms = "
                         r"0.5 ms\)"),
    ({"gain_cap": 1.0}, r"gain_cap must be in \(1, inf\)"),
    ({"onset_ms": -5}, r"onset_ms must be in \[0, inf\) ms"),
    ({"current_uA": True}, "current_uA must be a number"),
    ({"current_uA": float("nan")}, "current_uA must be finite"),
    ({"waveform": "monophasic_cathodic"}, "not charge-balanced"),
    ({"waveform": "square"}, "waveform must be one of"),
    ({"spread": "gaussian"}, "spread must be one of 'kumaravelu', 'tehovnik'"),
    ({"form": "divisive"}, "form must be one of"),
    ({"combine": "mean"}, "combine must be one of 'sum', 'max'"),
    ({"baseline_frequency_Hz": 0}, r"baseline_frequency_Hz must be in \(0, 1000\] Hz"),
    ({"frequency_Hz": 1000, "pulse_width_ms": 0.5}, "must fit in the pulse period"),
    ({"layer": ""}, "layer must be a non-empty"),
])
def test_electrical_parameters_are_validated(params, message):
    with pytest.raises(ConfigError, match=message):
        ElectricalStimulation(((0.0, 0.0),), **params)


@pytest.mark.parametrize("sites", [(), "a", ((1.0,),), ((0.0, float("inf")),), [[1, 2, 3]]])
def test_bad_sites_are_refused(sites):
    with pytest.raises(ConfigError, match="sites_mm"):
        Ablation(sites, radius_mm=1.0)


def test_single_site_pair_is_accepted():
    assert Ablation((1.5, -2.0), radius_mm=1).sites_mm == ((1.5, -2.0),)
    assert Ablation(np.array([[1, 2], [3, 4]]), radius_mm=1).sites_mm == ((1.0, 2.0), (3.0, 4.0))


# --- records --------------------------------------------------------------------------------
ROUND_TRIP_SPECS = [
    ElectricalStimulation(((1.0, 2.0), (1.4, 2.0)), current_uA=300, frequency_Hz=150, train_ms=200, combine="max",
                          gain_cap=2.0, layer="layer4.1"),
    ElectricalStimulation(((1.0, 2.0),), spread="tehovnik", tehovnik_K_uA_per_mm2=675, form="additive",
                          activation_per_Hz=0.02, waveform="biphasic_anodic_first"),
    OptogeneticSuppression(((0.5, 0.5),), power_mW=2.0),
    MuscimolInactivation(((0.5, 0.5), (1.0, 1.0)), volume_uL=1.5, variance_mm2=2.0, layer="V4"),
    Ablation(((0.0, 0.0),), radius_mm=0.7),
]


@pytest.mark.parametrize("spec", ROUND_TRIP_SPECS, ids=lambda s: s.kind)
def test_to_dict_from_dict_round_trip_through_json(spec):
    record = json.loads(json.dumps(spec.to_dict()))
    assert None not in record.values()
    assert perturbation_from_dict(record) == spec
    assert Perturbation.from_dict(record) == spec
    assert type(spec).from_dict(record) == spec


def test_describe_is_flat_with_units_in_names():
    stim = ROUND_TRIP_SPECS[0]
    record = stim.describe()
    assert record["kind"] == "electrical"
    assert (record["site_x_mm"], record["site_y_mm"], record["n_sites"]) == (1.0, 2.0, 2)
    assert record["current_uA"] == 300.0 and record["frequency_Hz"] == 150.0 and record["train_ms"] == 200.0
    assert record["spread"] == "kumaravelu" and record["form"] == "multiplicative" and record["combine"] == "max"
    assert all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in record.values())
    tehovnik = ROUND_TRIP_SPECS[1].describe()
    assert tehovnik["spread_radius_mm"] == pytest.approx(math.sqrt(50 / 675))
    assert tehovnik["activation_per_Hz"] == 0.02


def test_unknown_missing_and_mismatched_keys_are_refused():
    record = ElectricalStimulation(((0.0, 0.0),)).to_dict()
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['curent_uA'\].*allowed keys: kind, sites_mm"):
        perturbation_from_dict({**record, "curent_uA": 50})
    with pytest.raises(ConfigError, match=r"needs key\(s\) \['power_mW'\]"):
        perturbation_from_dict({"kind": "optogenetic", "sites_mm": [[0, 0]]})
    with pytest.raises(ConfigError, match="perturbation kind must be one of ablation, electrical, muscimol, optogenetic"):
        perturbation_from_dict({"kind": "ultrasound", "sites_mm": [[0, 0]]})
    with pytest.raises(ConfigError, match="expected 'ablation'"):
        Ablation.from_dict({"kind": "muscimol", "sites_mm": [[0, 0]], "radius_mm": 1})
    with pytest.raises(ConfigError, match="current_uA must be a number"):
        perturbation_from_dict({**record, "current_uA": "fifty"})


# --- unit effects and conditions ------------------------------------------------------------
def test_effect_names_the_sheet_it_needs_when_given_a_model_or_nothing():
    lesion = Ablation(sites_mm=((0.0, 0.0),), radius_mm=1.0)
    for given in (None, SimpleNamespace(sheet=point_sheet([[0.0, 0.0]]))):
        with pytest.raises(TypeError, match=r"ablation effect needs the CorticalSheet of the layer it acts on \(e.g. "
                                            rf"model.sheet\('IT'\)\), got {type(given).__name__}"):
            lesion.effect(given)
    assert lesion.effect(point_sheet([[0.0, 0.0]])).multiplier.tolist() == [0.0, 1.0, 1.0]


def test_unit_effect_combine_and_apply():
    first = UnitEffect([1.0, 2.0, 0.5], [0.0, 1.0, 0.0])
    second = UnitEffect([3.0, 1.0, 2.0], [1.0, 1.0, 0.0])
    both = first.combine(second)
    np.testing.assert_array_equal(both.multiplier, [3.0, 2.0, 1.0])
    np.testing.assert_array_equal(both.additive, [1.0, 2.0, 0.0])
    np.testing.assert_array_equal(first.apply(np.array([[1.0, 1.0, 4.0]])), [[1.0, 3.0, 2.0]])
    with pytest.raises(ValueError, match="cannot combine effects on 3 and 2 units"):
        first.combine(UnitEffect.identity(2))
    with pytest.raises(ValueError):
        first.multiplier[0] = 5.0  # read-only
    with pytest.raises(ValueError, match="finite"):
        UnitEffect([np.nan], [0.0])


def test_unit_effect_applies_to_feature_maps_in_c_major_order():
    sheet = CorticalSheet("maps", (2, 2, 3), np.random.default_rng(0).uniform(0, 1, (12, 2)))
    multiplier = np.ones(sheet.n_units)
    multiplier[7] = 3.0  # channel 1, row 0, column 1
    effect = UnitEffect(multiplier, np.zeros(sheet.n_units))
    maps = torch.ones(4, 2, 2, 3, dtype=torch.float32)
    out = effect.apply(maps)
    assert out.dtype == torch.float32 and out.shape == maps.shape
    assert out[:, 1, 0, 1].tolist() == [3.0] * 4 and float(out.sum()) == 4 * (11 + 3)
    identity = UnitEffect.identity(sheet.n_units)
    assert identity.apply(maps) is maps
    with pytest.raises(ValueError, match="does not hold the 12 units"):
        effect.apply(torch.ones(4, 5))


def test_condition_control_combination_and_layers():
    sheet = point_sheet([[0.0, 0.0], [1.0, 0.0]])
    control = Condition("control")
    assert control.layer() is None and control.is_control
    assert control.effect(sheet).is_identity
    assert control.describe() == {"label": "control", "n_perturbations": 0, "kind": "control"}
    stim = ElectricalStimulation(((0.0, 0.0),), frequency_Hz=60)
    light = OptogeneticSuppression(((0.0, 0.0),), power_mW=0.5)
    both = Condition("stim+light", [stim, light])
    assert both.layer() == "IT"
    np.testing.assert_allclose(both.effect(sheet).multiplier,
                               stim.effect(sheet).multiplier * light.effect(sheet).multiplier)
    record = both.describe()
    assert record["kind"] == "electrical+optogenetic" and record["p0_current_uA"] == 50.0
    assert record["p1_power_mW"] == 0.5
    assert Condition("one", (stim,)).describe()["current_uA"] == 50.0
    with pytest.raises(ConfigError, match=r"several layers \['IT', 'V4'\]"):
        Condition("mixed", (stim, Ablation(((0.0, 0.0),), radius_mm=1, layer="V4")))
    with pytest.raises(ConfigError, match="non-empty label"):
        Condition("", ())
    with pytest.raises(ConfigError, match="is not a Perturbation"):
        Condition("bad", ({"kind": "ablation"},))
    assert Condition.from_dict(json.loads(json.dumps(both.to_dict()))) == both
    with pytest.raises(ConfigError, match="unknown key"):
        Condition.from_dict({"label": "x", "perturbation": []})


def test_apply_effect_is_the_one_perturbation_arithmetic_and_the_engine_uses_it(monkeypatch):
    from stimsim.behavior import LogisticDecoder
    from stimsim.engine import simulation as engine
    from stimsim.stimulation import apply_effect

    activity = torch.tensor([[1.0, -2.0, 3.0]])
    multiplier, additive = torch.tensor([2.0, 2.0, 0.0]), torch.tensor([0.0, 1.0, 5.0])
    # by hand: 1·2 + 0, −2·2 + 1, 3·0 + 5
    assert apply_effect(activity, multiplier, additive).tolist() == [[2.0, -3.0, 5.0]]
    assert activity.tolist() == [[1.0, -2.0, 3.0]]
    # K = 2 conditions against B = 1 image
    both = apply_effect(activity[None], torch.stack([multiplier, torch.ones(3)])[:, None], torch.zeros(2, 1, 3))
    assert both.tolist() == [[[2.0, -4.0, 0.0]], [[1.0, -2.0, 3.0]]]
    np.testing.assert_array_equal(apply_effect(np.array([1.0, 2.0]), np.array([0.5, 0.0]), 1.0), [1.5, 1.0])

    calls = []

    def recording(*args):
        calls.append(args[0].shape)
        return apply_effect(*args)

    monkeypatch.setattr(engine, "apply_effect", recording)
    sheet = CorticalSheet("it", (3, 1, 1), [[0.0, 0.0], [1.0, 0.0], [5.0, 5.0]])
    network = torch.nn.Sequential()
    network.add_module("it", torch.nn.Sequential(torch.nn.Flatten(1), torch.nn.Linear(64, 3)))
    from stimsim.models.preprocessing import Preprocessing
    from stimsim.models.topographic import TopographicModel

    model = TopographicModel(network, {"it": sheet}, Preprocessing(size_px=8, channels=1, mean=(0.5,), std=(0.5,)),
                             {"family": "test", "kwargs": {}})
    images = np.random.default_rng(0).uniform(0, 1, (4, 8, 8))
    decoder = LogisticDecoder.fit(model.activations(images, "it"), ["a", "b", "a", "b"], layer="it")
    lesion = Condition("lesion", (Ablation(sites_mm=((0.0, 0.0),), radius_mm=0.5, layer="it"),))
    # the engine's general path (a decoder not known to be linear; a linear one takes the exact fast path, which
    # never forms the perturbed activity) and the reference both perturb through apply_effect
    general = SimpleNamespace(layer=decoder.layer, choices=decoder.choices, probabilities=decoder.probabilities)
    engine.simulate(model, images, [Condition("control"), lesion], general, progress=False)
    engine.simulate_plain(model, images, [lesion], decoder, progress=False)
    assert len(calls) == 2


def test_a_gain_on_a_signed_layer_is_flagged_and_suppression_or_unsigned_activity_is_not():
    from stimsim.stimulation import signed_gain_warning

    sheet = CorticalSheet("it", (3, 1, 1), [[0.0, 0.0], [0.1, 0.0], [5.0, 5.0]])
    stim = ElectricalStimulation(((0.0, 0.0),), current_uA=50, frequency_Hz=200)
    signed = np.array([[1.0, -1.0, 2.0], [0.5, 0.2, -3.0]])
    message = signed_gain_warning(stim, sheet, signed)
    assert "gain > 1" in message and "33%" in message  # 2 of 6 responses are negative
    assert signed_gain_warning(stim, sheet, np.abs(signed)) is None
    assert signed_gain_warning(MuscimolInactivation(((0.0, 0.0),), volume_uL=1.0), sheet, signed) is None


def test_batch_effects_equal_one_condition_at_a_time():
    sheet = grid_sheet(n_side=15, size_mm=6.0)
    rng = np.random.default_rng(3)

    def site():
        return tuple(rng.uniform(0.5, 5.5, 2))

    conditions = [
        Condition("control"),
        Condition("kumaravelu", (ElectricalStimulation((site(),), current_uA=100, frequency_Hz=150, layer="it"),)),
        Condition("max_capped", (ElectricalStimulation((site(), site()), current_uA=60, frequency_Hz=300, combine="max",
                                                       gain_cap=2.0, layer="it"),)),
        Condition("tehovnik_sum", (ElectricalStimulation((site(), site()), current_uA=600, spread="tehovnik",
                                                         layer="it"),)),
        Condition("additive", (ElectricalStimulation((site(),), current_uA=200, form="additive", activation_per_Hz=0.01,
                                                     layer="it"),)),
        Condition("light", (OptogeneticSuppression((site(), site()), power_mW=2.0, layer="it"),)),
        Condition("muscimol", (MuscimolInactivation((site(),), volume_uL=0.5, layer="it"),)),
        Condition("lesion", (Ablation((site(), site()), radius_mm=1.0, layer="it"),)),
        Condition("together", (ElectricalStimulation((site(),), current_uA=100, layer="it"),
                               Ablation((site(),), radius_mm=2.0, layer="it"),
                               ElectricalStimulation((site(),), current_uA=200, form="additive",
                                                     activation_per_Hz=0.02, layer="it"))),
    ]
    multiplier, additive = Condition.batch_effects(conditions, sheet)
    assert multiplier.shape == additive.shape == (len(conditions), sheet.n_units)
    for row, condition in enumerate(conditions):
        effect = condition.effect(sheet)
        np.testing.assert_allclose(multiplier[row].numpy(), effect.multiplier, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(additive[row].numpy(), effect.additive, rtol=1e-13, atol=1e-15)
    # hand values: the control is exactly the identity; a lesion of radius 1 mm silences exactly the units within it
    assert torch.equal(multiplier[0], torch.ones(sheet.n_units)) and torch.equal(additive[0], torch.zeros(sheet.n_units))
    lesion = conditions[7].perturbations[0]
    inside = np.zeros(sheet.n_units, dtype=bool)
    for point in lesion.sites_mm:
        inside |= np.hypot(*(sheet.coordinates_mm - np.asarray(point)).T) <= 1.0
    np.testing.assert_array_equal(multiplier[7].numpy(), np.where(inside, 0.0, 1.0))
    with pytest.raises(ConfigError, match="off sheet"):
        Condition.batch_effects([Condition("far", (Ablation(((50.0, 1.0),), radius_mm=1.0, layer="it"),))], sheet)


def test_every_kind_gives_its_published_law_at_every_unit():
    """Each kind's one implementation (torch) against the laws written out here in numpy: Kumaravelu et al. 2022
    exp(−d/λ(I)) and Tehovnik et al. 2006 discs combined by sum or max, the multiplicative gain and the additive
    rate increment; Gaussian suppression max(1 − a·exp(−d²/2σ²), 0) multiplied over sites; lesions."""
    sheet = grid_sheet(n_side=17, size_mm=4.0)
    xy = sheet.coordinates_mm
    d = lambda site: np.hypot(xy[:, 0] - site[0], xy[:, 1] - site[1])  # noqa: E731
    a, b = (1.0, 1.5), (2.8, 2.2)
    lam = 0.00505047 * (80.0 - 5.26062)
    summed = np.exp(-d(a) / lam) + np.exp(-d(b) / lam)
    stim = ElectricalStimulation((a, b), current_uA=80.0, frequency_Hz=120.0, layer="it")
    np.testing.assert_allclose(stim.effect(sheet).multiplier, 1 + (120.0 / 30.0) * summed, rtol=1e-12)
    radius = math.sqrt(900.0 / 1292.0)
    disc = np.maximum(d(a) <= radius, d(b) <= radius).astype(float)
    stim = ElectricalStimulation((a, b), current_uA=900.0, spread="tehovnik", combine="max", form="additive",
                                 activation_per_Hz=0.01, frequency_Hz=100.0, layer="it")
    effect = stim.effect(sheet)
    np.testing.assert_array_equal(effect.multiplier, np.ones(sheet.n_units))
    np.testing.assert_allclose(effect.additive, 0.01 * min(30.0 + 100.0, 200.0) * disc, rtol=1e-12)
    light = OptogeneticSuppression((a, b), power_mW=1.5, layer="it").effect(sheet).multiplier
    expected = np.prod([np.maximum(1 - 1.5 * np.exp(-d(s) ** 2 / (2 * 0.234)), 0) for s in (a, b)], axis=0)
    np.testing.assert_allclose(light, expected, rtol=1e-12, atol=1e-15)
    drug = MuscimolInactivation((a,), volume_uL=0.5, layer="it").effect(sheet).multiplier
    np.testing.assert_allclose(drug, np.maximum(1 - 0.5 * np.exp(-d(a) ** 2 / (2 * 1.17)), 0), rtol=1e-12)
    lesion = Ablation((a, b), radius_mm=0.6, layer="it").effect(sheet).multiplier
    np.testing.assert_array_equal(lesion, np.where((d(a) <= 0.6) | (d(b) <= 0.6), 0.0, 1.0))


def test_one_batch_may_mix_spread_laws_forms_and_combinations():
    """Rows of different laws, forms and combinations in one ``batch_effect`` call equal each perturbation alone."""
    sheet = grid_sheet(n_side=11, size_mm=4.0)
    rng = np.random.default_rng(7)
    stims = [ElectricalStimulation(tuple(tuple(rng.uniform(0.5, 3.5, 2)) for _ in range(int(rng.integers(1, 4)))),
                                   current_uA=float(rng.uniform(20, 400)), frequency_Hz=float(rng.uniform(0, 300)),
                                   spread=str(rng.choice(["kumaravelu", "tehovnik"])),
                                   combine=str(rng.choice(["sum", "max"])), layer="it",
                                   **({"form": "additive", "activation_per_Hz": 0.02} if rng.random() < 0.5 else {}))
             for _ in range(12)]
    multiplier, additive = ElectricalStimulation.batch_effect(stims, sheet)
    for row, stim in enumerate(stims):
        alone = stim.effect(sheet)
        np.testing.assert_allclose(multiplier[row].numpy(), alone.multiplier, rtol=1e-13)
        np.testing.assert_allclose(additive[row].numpy(), alone.additive, rtol=1e-13, atol=1e-15)


def test_batch_effect_at_an_electrode_tip_is_one_plus_f_over_baseline():
    sheet = point_sheet([(1.0, 1.0), (1.0, 1.0 + 0.479)])  # 0.479 mm = λ(100 µA)
    stim = ElectricalStimulation(((1.0, 1.0),), current_uA=100.0, frequency_Hz=150.0, layer="it")
    multiplier, additive = ElectricalStimulation.batch_effect([stim], sheet)
    length_mm = 0.00505047 * (100.0 - 5.26062)
    expected = [1.0 + 150.0 / 30.0, 1.0 + (150.0 / 30.0) * math.exp(-0.479 / length_mm)]
    np.testing.assert_allclose(multiplier[0, :2].numpy(), expected, rtol=1e-12)
    assert torch.equal(additive, torch.zeros_like(additive))


def test_the_docs_quote_the_kumaravelu_spread_lengths():
    """docs/perturbations.md's λ(50), λ(100), λ(300) and docs/experiments.md's λ(1000 µA) are the law's."""
    from docs_figures import REPO

    perturbations = " ".join((REPO / "docs" / "perturbations.md").read_text(encoding="utf-8").split())
    quoted = re.search(r"λ\(50 µA\) = ([\d.]+) mm, λ\(100\) = ([\d.]+), λ\(300\) = ([\d.]+)", perturbations).groups()
    assert [float(x) for x in quoted] == pytest.approx([kumaravelu_length_mm(i) for i in (50, 100, 300)], abs=0.0015)
    experiments = " ".join((REPO / "docs" / "experiments.md").read_text(encoding="utf-8").split())
    at_1000 = float(re.search(r"at 1000 µA, whose spread length is ([\d.]+) mm", experiments).group(1))
    assert round(kumaravelu_length_mm(1000)) == at_1000


def test_resting_fraction_lets_the_gain_act_on_each_units_resting_activity():
    """a → g·a + (g − 1)·K·s, K = resting_fraction, s = each unit's resting activity; worked by hand for one unit
    on the electrode (g = 1 + 200/30) and one at λ(50 µA) (g = 1 + (200/30)/e)."""
    import dataclasses

    lam = kumaravelu_length_mm(50)
    sheet = point_sheet([[0.0, 0.0], [lam, 0.0]])
    sheet = dataclasses.replace(sheet, resting_activity=np.array([0.3, 1.2, 0.0, 0.0]))
    stim = ElectricalStimulation(((0.0, 0.0),), frequency_Hz=200, resting_fraction=0.5)
    effect = stim.effect(sheet)
    gain = np.array([1 + 200 / 30, 1 + 200 / 30 / math.e])
    np.testing.assert_allclose(effect.multiplier[:2], gain, rtol=1e-12)
    np.testing.assert_allclose(effect.additive[:2], (gain - 1) * 0.5 * np.array([0.3, 1.2]), rtol=1e-12)
    plain = ElectricalStimulation(((0.0, 0.0),), frequency_Hz=200).effect(sheet)  # K = 0: the plain gain
    assert np.array_equal(plain.multiplier, effect.multiplier) and not plain.additive.any()
    assert ElectricalStimulation(((0.0, 0.0),), frequency_Hz=0, resting_fraction=0.5).effect(sheet).is_identity
    assert stim.describe()["resting_fraction"] == 0.5
    # beside an additive condition in one batch, each row keeps its own form
    additive = ElectricalStimulation(((0.0, 0.0),), form="additive", activation_per_Hz=0.01)
    multiplier, shift = ElectricalStimulation.batch_effect([stim, additive], sheet)
    np.testing.assert_allclose(shift[0, :2].numpy(), effect.additive[:2], rtol=1e-12)
    np.testing.assert_allclose(shift[1].numpy(), additive.effect(sheet).additive, rtol=1e-12)
    assert torch.all(multiplier[1] == 1.0)
    with pytest.raises(ConfigError, match="resting_fraction must be in"):
        ElectricalStimulation(((0.0, 0.0),), resting_fraction=1.5)
    with pytest.raises(ConfigError, match="form='multiplicative' only"):
        ElectricalStimulation(((0.0, 0.0),), resting_fraction=0.5, form="additive", activation_per_Hz=1.0)
    with pytest.raises(ConfigError, match="records none for layer 'it'"):
        stim.effect(point_sheet([[0.0, 0.0]]))
