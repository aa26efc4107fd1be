"""Stimulation: perturbation kinds with units (one module each), spread laws, conditions and the safety gate."""
from stimsim.stimulation.ablation import Ablation
from stimsim.stimulation.base import (
    PERTURBATION_KINDS,
    Perturbation,
    UnitEffect,
    apply_effect,
    perturbation_from_dict,
    register_perturbation,
    signed_gain_warning,
)
from stimsim.stimulation.conditions import Condition
from stimsim.stimulation.electrical import (
    ADDITIVE_SCALES,
    CHARGE_BALANCED_WAVEFORMS,
    ELECTRODE_COMBINATIONS,
    MAX_CURRENT_UA,
    STIMULATION_FORMS,
    ElectricalStimulation,
    additive_scale_record,
    check_additive_scale,
)
from stimsim.stimulation.safety import (
    ELECTRODE_AREA_RANGE_UM2,
    SHANNON_K_LIMIT,
    UTAH_TIP_AREA_UM2,
    SafetyLimits,
    SafetyReport,
    charge_density_uC_per_cm2,
    charge_per_phase_nC,
    check_protocol,
    enforce,
    shannon_k,
)
from stimsim.stimulation.spread import (
    KUMARAVELU_SLOPE_MM_PER_UA,
    KUMARAVELU_THRESHOLD_UA,
    SPREAD_LAWS,
    TEHOVNIK_K_DEFAULT_UA_PER_MM2,
    SpreadLaw,
    electrical_profile,
    gaussian_profile,
    kumaravelu_length_mm,
    register_spread_law,
    spread_extent_mm,
    tehovnik_radius_mm,
)
from stimsim.stimulation.suppression import (
    ARIKAN2002_VARIANCE_MM2,
    CHOW2010_VARIANCE_MM2,
    GaussianSuppression,
    MuscimolInactivation,
    OptogeneticSuppression,
)

__all__ = [
    "ADDITIVE_SCALES", "additive_scale_record", "check_additive_scale", "ARIKAN2002_VARIANCE_MM2", "CHARGE_BALANCED_WAVEFORMS", "CHOW2010_VARIANCE_MM2", "ELECTRODE_COMBINATIONS",
    "MAX_CURRENT_UA", "PERTURBATION_KINDS", "STIMULATION_FORMS", "Ablation", "Condition", "ElectricalStimulation",
    "GaussianSuppression", "MuscimolInactivation", "OptogeneticSuppression", "Perturbation", "UnitEffect", "apply_effect",
    "perturbation_from_dict", "register_perturbation", "signed_gain_warning",
    "ELECTRODE_AREA_RANGE_UM2", "SHANNON_K_LIMIT", "UTAH_TIP_AREA_UM2", "SafetyLimits", "SafetyReport",
    "charge_density_uC_per_cm2", "charge_per_phase_nC", "check_protocol", "enforce", "shannon_k",
    "KUMARAVELU_SLOPE_MM_PER_UA", "KUMARAVELU_THRESHOLD_UA", "SPREAD_LAWS", "TEHOVNIK_K_DEFAULT_UA_PER_MM2",
    "SpreadLaw", "electrical_profile", "gaussian_profile", "kumaravelu_length_mm", "register_spread_law",
    "spread_extent_mm", "tehovnik_radius_mm",
]
