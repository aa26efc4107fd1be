"""Offline analysis of recorded behaviour: sessions in, per-site stimulation effects with their
statistics, comparison with a plan's predictions, and the power of a planned session."""
from stimsim.analysis.analyze import Analysis, analyze, save_analysis
from stimsim.analysis.comparison import compare_predictions, expected_correlation, load_plan_predictions
from stimsim.analysis.effects import (SiteCounts, across_sites, count_trials, site_effects, spearman_brown,
                                      split_half_deltas, split_half_reliability)
from stimsim.lab.sessions import COLUMNS, column_mapping, load_sessions

__all__ = ["COLUMNS", "Analysis", "SiteCounts", "across_sites", "analyze", "column_mapping", "compare_predictions",
           "count_trials", "expected_correlation", "load_plan_predictions", "load_sessions", "save_analysis",
           "site_effects", "spearman_brown", "split_half_deltas", "split_half_reliability"]
