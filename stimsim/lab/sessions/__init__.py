"""Behavioural sessions in (:mod:`~stimsim.lab.sessions.base`), read by format plug-ins
(:mod:`~stimsim.lab.sessions.formats`: CSV, NWB, HDF5)."""
from stimsim.lab.sessions.base import (CHOICES, COLUMNS, REQUIRED, SHAM, VALUE_TARGETS, check_against_plan,
                                       check_trial_list, column_mapping, did_you_mean, load_column_mapping,
                                       load_sessions, load_value_mapping, parse_column_mapping, parse_value_mapping,
                                       value_mapping)
from stimsim.lab.sessions.formats import SESSION_FORMATS, SessionFormat, register_session_format, session_format_of

__all__ = ["CHOICES", "COLUMNS", "REQUIRED", "SESSION_FORMATS", "SHAM", "SessionFormat", "VALUE_TARGETS",
           "check_against_plan", "check_trial_list", "column_mapping", "did_you_mean", "load_column_mapping", "load_sessions",
           "load_value_mapping", "parse_column_mapping", "parse_value_mapping", "register_session_format",
           "session_format_of", "value_mapping"]
