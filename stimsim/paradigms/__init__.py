"""In-silico experiments declared in files: categorisation (Afraz et al. 2006) and same/different
(Moeller et al. 2017) paradigms, site selection, comparison with published data, and the runner
behind ``stimsim run``. The experiment file format is documented in :mod:`stimsim.paradigms.spec`."""
from stimsim.paradigms.runner import load_results, load_stimuli, run_experiment
from stimsim.paradigms.sites import Site, SiteSelection, multi_unit_dprime, select_sites, unit_dprime
from stimsim.paradigms.spec import ExperimentSpec, load_experiment, parse_experiment

__all__ = [
    "ExperimentSpec", "Site", "SiteSelection", "load_experiment", "load_results", "load_stimuli",
    "multi_unit_dprime", "parse_experiment", "run_experiment", "select_sites", "unit_dprime",
]
