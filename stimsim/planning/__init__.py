"""Site planning for a stimulation session (Mehrer et al. 2025): sequences along each mapped site's tuning
(:mod:`stimsim.sequences`), the 2AFC rehearsal with and without stimulation (the task of
:mod:`stimsim.paradigms.sequence_2afc`), ranking under the lab's constraints, the plan report,
virtual-subject sessions and closed-loop validation. Entry points: :func:`run_plan`,
:func:`session_from_plan`, :func:`simulate_trials`."""
from stimsim.planning.job import run_plan
from stimsim.planning.session import session_from_plan, simulate_trials, write_session_csv, write_session_nwb

__all__ = ["run_plan", "session_from_plan", "simulate_trials", "write_session_csv", "write_session_nwb"]
