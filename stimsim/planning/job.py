"""The ``stimsim plan`` job: one plan into an output directory it holds, then, for a virtual subject, the
closed-loop validation on hidden poses (:mod:`stimsim.planning.validation`)."""
from __future__ import annotations

from pathlib import Path

from stimsim.planning.config import load_plan_config
from stimsim.planning.plan import plan_once
from stimsim.planning.validation import validate_plan
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.locking import DirectoryLock


def run_plan(config_path, out_dir, progress: bool = True, validate: int = 0, device="cpu", scheduler=None) -> dict:
    """Run the plan of ``config_path`` into ``out_dir``; returns the summary (also in summary.json).
    ``validate`` > 0 (virtual subjects only) then repeats the closed loop on that many hidden poses
    (:mod:`stimsim.planning.validation`) and writes ``validation.json``.

    Parameters
    ----------
    device : where the models, sequence optimisation, effects and decoders compute (cpu, cuda, cuda:N, mps,
        auto; :mod:`stimsim.engine.devices`).
    scheduler : None (this process), or a Dask scheduler (``"local"``, ``"processes=N"``, an address or a
        ``distributed.Client``) whose workers run the rehearsal sweeps, one task per site
        (:mod:`stimsim.engine.distributed`); one set of workers serves the whole plan. The results are the same.
    """
    from stimsim.engine.devices import resolve_device
    from stimsim.engine.distributed import check_scheduler, shared_scheduler

    device = resolve_device(device)
    check_scheduler(scheduler)
    config = load_plan_config(config_path)
    if validate and config.subject_config is None:
        raise ConfigError(f"{config.path}: --validate needs a virtual subject made from a file ([subject] config = ...)")
    compute = {"device": device, "scheduler_description": _describe_scheduler(scheduler)}
    with DirectoryLock(out_dir, "plan") as lock, shared_scheduler(scheduler) as client:
        compute["scheduler"] = client
        summary = plan_once(config, Path(out_dir), progress, compute=compute, created=bool(lock.created))
        if validate:
            summary["validation"] = validate_plan(config, Path(out_dir), validate, progress=progress,
                                                  compute=compute)
    return summary


def _describe_scheduler(scheduler) -> str | None:
    """What config.json records for ``scheduler``: its text, or the scheduler address of a Client."""
    if scheduler is None or isinstance(scheduler, str):
        return scheduler
    return str(scheduler.scheduler.address)
