"""Training topographic models (task loss + TDANN spatial loss, resumable) and evaluating them
(``stimsim models check``): decoding, selectivity and its clustering on the cortical sheet."""
