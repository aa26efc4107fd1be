"""Model-to-cortex mapping (Mehrer et al. 2025): model selection by cross-validated ridge
predictivity, rigid registration of the array on the model's IT sheet, its bootstrap stability,
and back-mapping of model sites to electrodes."""
from stimsim.mapping.predictivity import cross_validated_r2, model_predictivity, select_model, selection_bootstrap
from stimsim.mapping.registration import (BootstrapRegistration, Registration, RegistrationProblem,
                                          RegistrationSettings, bootstrap_registration, register)

__all__ = ["BootstrapRegistration", "Registration", "RegistrationProblem", "RegistrationSettings",
           "bootstrap_registration", "cross_validated_r2", "model_predictivity", "register", "select_model",
           "selection_bootstrap"]
