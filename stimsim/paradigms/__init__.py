"""In-silico experiments declared in files: tasks as plug-ins (:mod:`stimsim.paradigms.base`; built in:
categorisation, Afraz et al. 2006; same/different, Moeller et al. 2017; the 2AFC sequence task, Mehrer
et al. 2025), site selection and the
runner behind ``stimsim run``. The experiment file format is documented in :mod:`stimsim.paradigms.experiment_file`;
published data to compare with are in :mod:`stimsim.datasets`."""
from stimsim.paradigms.base import PARADIGMS, Paradigm, Trials, get_paradigm, register_paradigm
from stimsim.paradigms.runner import load_results, load_stimuli, run_experiment
from stimsim.paradigms.sites import Site, SiteSelection, multi_unit_dprime, select_sites, unit_dprime
from stimsim.paradigms.experiment_file import load_experiment, parse_experiment
from stimsim.paradigms.spec import ExperimentSpec

__all__ = [
    "PARADIGMS", "ExperimentSpec", "Paradigm", "Site", "SiteSelection", "Trials", "get_paradigm", "load_experiment",
    "load_results", "load_stimuli", "multi_unit_dprime", "parse_experiment", "register_paradigm", "run_experiment",
    "select_sites", "unit_dprime",
]
