"""Behavioural readout: frozen decoders (activity -> choice probabilities) and behavioural metrics."""
from stimsim.behavior.decoders import (
    SAME_DIFFERENT_CHOICES,
    BoundSameDifferentDecoder,
    Decoder,
    LinearReadout,
    LogisticDecoder,
    SameDifferentDecoder,
    decoder_from_dict,
    stratified_fit_mask,
)
from stimsim.behavior.metrics import (
    PearsonResult,
    PsychometricFit,
    auc_of_curve,
    bootstrap_ci,
    delta_accuracy,
    delta_auc,
    dprime,
    fit_psychometric,
    pearson_with_permutation,
    psychometric_shift_percent,
)

__all__ = [
    "SAME_DIFFERENT_CHOICES",
    "BoundSameDifferentDecoder",
    "Decoder",
    "LinearReadout",
    "LogisticDecoder",
    "PearsonResult",
    "PsychometricFit",
    "SameDifferentDecoder",
    "auc_of_curve",
    "bootstrap_ci",
    "decoder_from_dict",
    "delta_accuracy",
    "delta_auc",
    "dprime",
    "fit_psychometric",
    "pearson_with_permutation",
    "psychometric_shift_percent",
    "stratified_fit_mask",
]
