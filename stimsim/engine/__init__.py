"""The simulation engine: batched, resumable (condition × image) → choice probabilities
(:mod:`~stimsim.engine.simulation`, its chunk store :mod:`~stimsim.engine.store`), the activation cache
(:mod:`~stimsim.engine.activation_cache`), Dask execution (:mod:`~stimsim.engine.distributed`), device choice
(:mod:`~stimsim.engine.devices`) and its benchmark on this public API (:mod:`~stimsim.engine.bench`)."""
from stimsim.engine.simulation import DEFAULT_MAX_CHUNK_BYTES, chunk_count, serial_work, simulate, simulate_plain

__all__ = ["DEFAULT_MAX_CHUNK_BYTES", "chunk_count", "serial_work", "simulate", "simulate_plain"]
