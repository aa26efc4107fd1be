"""Safety gate: charge per phase, charge density, Shannon's k, overrides."""
import json
import math
import re

import pytest

from stimsim.stimulation import (ElectricalStimulation, OptogeneticSuppression, SafetyLimits, charge_per_phase_nC,
                                 check_protocol, enforce, shannon_k)
from stimsim.utilities.errors import ConfigError, SafetyError


def protocol(current_uA=50.0, **params):
    return ElectricalStimulation(((0.0, 0.0),), current_uA=current_uA, **params)


def test_charge_per_phase_density_and_shannon_k_known_values():
    assert charge_per_phase_nC(50, 0.2) == pytest.approx(10.0)
    report = check_protocol(protocol(50, pulse_width_ms=0.2), SafetyLimits(electrode_area_um2=2000))
    assert report.charge_per_phase_nC == pytest.approx(10.0)
    # 0.01 µC on 2000 µm² = 2e-5 cm² → 500 µC/cm²; k = log10(500) + log10(0.01)
    assert report.charge_density_uC_per_cm2 == pytest.approx(500.0)
    assert report.shannon_k == pytest.approx(math.log10(500) - 2)
    assert shannon_k(60.0, 2000.0) == pytest.approx(math.log10(3000) + math.log10(0.06))


def test_charge_figures_refuse_a_negative_or_nan_protocol_instead_of_a_negative_charge_or_nan_k():
    # -50 µA gave -10 nC, NaN gave a NaN k (which no limit refuses), 0 nC failed in math.log10
    for call, message in ((lambda: charge_per_phase_nC(-50, 0.2), r"current_uA must be in \[0, inf\) µA, got -50"),
                          (lambda: charge_per_phase_nC(float("nan"), 0.2), "current_uA must be finite in µA, got nan"),
                          (lambda: charge_per_phase_nC(50, 0), r"pulse_width_ms must be in \(0, inf\) ms, got 0"),
                          (lambda: shannon_k(0.0, 2000.0), r"charge_per_phase_nC must be in \(0, inf\) nC, got 0"),
                          (lambda: shannon_k(float("nan"), 2000.0), "charge_per_phase_nC must be finite"),
                          (lambda: shannon_k(10.0, -1.0), r"electrode_area_um2 must be in \(0, inf\) µm², got -1")):
        with pytest.raises(ConfigError, match=message):
            call()
    assert charge_per_phase_nC(0, 0.2) == 0.0


@pytest.mark.parametrize("current_uA", [35.0, 50.0])
@pytest.mark.parametrize("frequency_Hz, train_ms", [(150.0, 200.0), (200.0, 50.0)])
def test_typical_it_protocols_pass(current_uA, frequency_Hz, train_ms):
    stim = protocol(current_uA, frequency_Hz=frequency_Hz, train_ms=train_ms, pulse_width_ms=0.2,
                    interphase_ms=0.1, waveform="biphasic_cathodic_first")
    report = enforce(stim)
    assert report.passed and not report.violations and not report.overridden
    assert report.charge_balanced and report.shannon_k < 1.85


def test_high_current_on_a_utah_tip_is_refused_naming_shannon_k():
    stim = protocol(300.0, frequency_Hz=150, train_ms=200)
    report = check_protocol(stim)
    assert not report.passed
    assert report.shannon_k == pytest.approx(math.log10(3000) + math.log10(0.06))  # ≈ 2.26
    with pytest.raises(SafetyError, match=r"Shannon's k = 2\.255 exceeds the limit max_shannon_k = 1\.85"):
        enforce(stim)


def test_override_runs_the_protocol_and_is_recorded():
    stim = protocol(300.0, frequency_Hz=150, train_ms=200)
    report = enforce(stim, override="  replicating Moeller et al. 2017, approved protocol 12  ")
    assert report.passed is False and report.overridden is True
    assert report.override_reason == "replicating Moeller et al. 2017, approved protocol 12"
    record = json.loads(json.dumps(report.to_dict()))
    assert record["overridden"] is True and record["passed"] is False
    assert "Shannon" in record["violations"][0]
    assert record["limits"] == {"max_shannon_k": 1.85, "electrode_area_um2": 2000.0, "max_charge_per_phase_nC": None}
    assert record["charge_per_phase_nC"] == pytest.approx(60.0)


def test_override_of_a_passing_protocol_overrides_nothing():
    report = enforce(protocol(50.0), override="not needed")
    assert report.passed and not report.overridden and report.override_reason is None


@pytest.mark.parametrize("override", ["", "   ", True, 1])
def test_override_must_be_a_reason(override):
    with pytest.raises(ConfigError, match="the safety override must be None or a non-empty reason"):
        enforce(protocol(300.0), override=override)


def test_limits_depend_on_electrode_area_and_can_be_stricter():
    # a larger electrode lowers the charge density: 300 µA on 20,000 µm² gives k ≈ 1.26
    larger = check_protocol(protocol(300.0), SafetyLimits(electrode_area_um2=20000))
    assert larger.shannon_k == pytest.approx(math.log10(60e-3 / 2e-4) + math.log10(60e-3))
    assert larger.shannon_k < 1.85
    # a smaller electrode than the Utah tip is stricter and needs no override
    assert enforce(protocol(20.0), SafetyLimits(electrode_area_um2=1000)).passed
    with pytest.raises(SafetyError, match="max_shannon_k = 0.5"):
        enforce(protocol(50.0), SafetyLimits(max_shannon_k=0.5))
    with pytest.raises(SafetyError, match="charge per phase 10 nC exceeds the limit max_charge_per_phase_nC = 5 nC"):
        enforce(protocol(50.0), SafetyLimits(max_charge_per_phase_nC=5))
    report = check_protocol(protocol(300.0), SafetyLimits(max_charge_per_phase_nC=5))
    assert len(report.violations) == 2


@pytest.mark.parametrize("params, message", [
    ({"electrode_area_um2": 0}, r"electrode_area_um2 must be in \[1, 1e\+08\] µm²"),
    ({"max_shannon_k": float("nan")}, "max_shannon_k must be a finite number"),
    ({"max_charge_per_phase_nC": -1}, "max_charge_per_phase_nC must be None or a finite number > 0"),
    ({"max_shannon_k": -5}, r"max_shannon_k must be a finite number > 0, got -5"),
    ({"max_shannon_k": 0}, r"max_shannon_k must be a finite number > 0, got 0"),
    ({"electrode_area_um2": 1e-300}, r"electrode_area_um2 must be in \[1, 1e\+08\] µm² .*, got 1e-300"),
    ({"electrode_area_um2": 0.5}, r"electrode_area_um2 must be in \[1, 1e\+08\] µm²"),
    ({"electrode_area_um2": 2e8}, r"electrode_area_um2 must be in \[1, 1e\+08\] µm²"),
])
def test_bad_limits_are_refused(params, message):
    with pytest.raises(ConfigError, match=message):
        SafetyLimits(**params)


@pytest.mark.parametrize("file", ["afraz2006.toml", "plan_default.toml", "visualize_default.toml"])
@pytest.mark.parametrize("old, new, message", [
    ("max_shannon_k = 1.85", "max_shannon_k = -5", "'max_shannon_k' must be > 0.0, got -5"),
    ("max_shannon_k = 1.85", "max_shannon_k = 0", "'max_shannon_k' must be > 0.0, got 0"),
    ("electrode_area_um2 = 2000", "electrode_area_um2 = 1e-300", "'electrode_area_um2' must be >= 1.0, got 1e-300"),
    ("electrode_area_um2 = 2000", "electrode_area_um2 = 1e9", "'electrode_area_um2' must be <= 100000000.0"),
])
def test_experiment_plan_and_visualisation_files_refuse_the_same_bad_limits(tmp_path, capsys, file, old, new, message):
    """Every file with a [safety] table ends in one error line naming the key and its range, never a traceback."""
    from docs_figures import REPO
    from stimsim.cli import main

    text = (REPO / "experiments" / file).read_text()
    assert old in text
    path = tmp_path / file
    path.write_text(text.replace(old, new))
    command = {"afraz2006.toml": "run", "plan_default.toml": "plan", "visualize_default.toml": "visualize"}[file]
    out = tmp_path / "out"
    assert main([command, str(path), "--out", str(out), "--no-progress"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"stimsim: error: {path} [safety]: {message}"), error
    assert not out.exists()


def test_the_largest_safe_current_is_0_where_a_tenth_of_a_microampere_is_already_outside():
    """k = 2 log10(Q / µC) − log10(A / cm²): at k = 0.01 on 1 µm² (1e-8 cm²) Q = 10^((0.01 − 8) / 2) µC = 0.101 nC,
    0.05 µA at 2 ms per phase; a charge limit of 1e-6 nC allows 5e-7 µA. Both round down to 0, without an error."""
    from stimsim.stimulation.safety import largest_safe_current_uA

    assert largest_safe_current_uA(2.0, SafetyLimits(max_shannon_k=0.01, electrode_area_um2=1.0)) == 0.0
    assert largest_safe_current_uA(0.2, SafetyLimits(max_charge_per_phase_nC=1e-6)) == 0.0
    report = check_protocol(protocol(50.0), SafetyLimits(max_charge_per_phase_nC=1e-6))
    assert report.violations[-1].endswith("the largest current within the limits at 0.2 ms per phase is 0 µA")


def test_charge_imbalance_is_a_violation_even_if_the_spec_was_tampered_with():
    stim = protocol(50.0)
    object.__setattr__(stim, "waveform", "monophasic_cathodic")
    report = check_protocol(stim)
    assert not report.charge_balanced and not report.passed
    assert "not charge-balanced" in report.violations[0]


def test_only_perturbations_that_carry_charge_are_checked():
    assert ElectricalStimulation.carries_charge and not OptogeneticSuppression.carries_charge
    with pytest.raises(TypeError, match="carry charge, got OptogeneticSuppression"):
        check_protocol(OptogeneticSuppression(((0.0, 0.0),), power_mW=1.0))


@pytest.mark.parametrize("limits, named", [
    (SafetyLimits(max_shannon_k=1000), "max_shannon_k = 1000 is above the default limit 1.85"),
    (SafetyLimits(electrode_area_um2=1e8), "electrode_area_um2 = 1e+08 µm² is larger than the default"),
    (SafetyLimits(electrode_area_um2=20000), "electrode_area_um2 = 20000 µm² is larger than the default"),
])
def test_limits_looser_than_the_defaults_need_an_override(limits, named):
    stim = protocol(3000.0)
    with pytest.raises(SafetyError, match=re.escape(named)):
        enforce(stim, limits)
    # even a protocol that passes at the defaults: the loosened limit itself is what needs a reason
    with pytest.raises(SafetyError, match=re.escape(named)):
        enforce(protocol(50.0), limits)
    report = enforce(stim, limits, override="bench test of a macroelectrode")
    assert report.overridden and not report.passed
    assert any(named in violation for violation in report.violations)
    assert report.to_dict()["override_reason"] == "bench test of a macroelectrode"


def test_an_unsafe_current_names_the_largest_current_that_passes():
    """k = 2 log10(Q / µC) − log10(A / cm²): at k = 1.85 on 2000 µm² (2e-5 cm²) Q = 10^((1.85 − 4.699) / 2) µC
    = 37.63 nC, i.e. 188.1 µA at 0.2 ms per phase; a 20 nC charge limit caps it at 100 µA."""
    from stimsim.stimulation.safety import largest_safe_current_uA

    expected = math.floor(1e3 * 10 ** ((1.85 + math.log10(2e-5)) / 2) / 0.2 * 10) / 10
    assert largest_safe_current_uA(0.2) == pytest.approx(expected) == pytest.approx(188.1)
    assert check_protocol(ElectricalStimulation(((0.0, 0.0),), current_uA=expected)).passed
    assert not check_protocol(ElectricalStimulation(((0.0, 0.0),), current_uA=expected + 0.1)).passed
    with pytest.raises(SafetyError, match=r"the largest current within the limits at 0.2 ms per phase is 188.1 µA"):
        enforce(ElectricalStimulation(((0.0, 0.0),), current_uA=300.0))
    capped = SafetyLimits(max_charge_per_phase_nC=20.0)
    assert largest_safe_current_uA(0.2, capped) == 100.0
    report = check_protocol(ElectricalStimulation(((0.0, 0.0),), current_uA=120.0), capped)
    assert report.violations[-1].endswith("is 100 µA")


def test_the_docs_quote_shannon_k_of_the_moeller_protocol():
    """docs/experiments.md: 300 µA for 0.2 ms on a Utah tip exceeds Shannon's k (2.26 > 1.85)."""
    from docs_figures import REPO

    page = " ".join((REPO / "docs" / "experiments.md").read_text(encoding="utf-8").split())
    k, limit = (float(x) for x in re.search(r"Shannon's k on a Utah tip \(([\d.]+) > ([\d.]+)\)", page).groups())
    report = check_protocol(protocol(300.0, frequency_Hz=150, train_ms=200))
    assert [k, limit] == pytest.approx([report.shannon_k, 1.85], abs=0.005)
