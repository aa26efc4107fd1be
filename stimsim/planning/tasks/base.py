"""The plan-task interface: what a paradigm's task must say and do so that ``stimsim plan`` can rehearse it.

A plan names its task with ``task = "<name>"``; the name is looked up in :data:`PLAN_TASKS`. The plan does
what every task shares — inputs, the safety gate, mapping and registering the array on every candidate,
pooling the candidates' predictions, the constraints, sites.csv, plan.nc, the report, the validation on a
virtual subject — and asks the task for the rest, in this order:

1. :attr:`PlanTask.tables`: the plan tables the task takes (table name → typed model); they are validated
   with the plan file, their defaults apply when a table is left out, and a table of another task is
   refused. :meth:`PlanTask.record` is what the plan stores (and digests) of them;
2. :meth:`PlanTask.prepare`: the task's inputs drawn from the plan's images and checked before any work;
3. :meth:`PlanTask.design` (tasks whose stimuli depend on the sites, :attr:`PlanTask.design_phase` set):
   arrays made once on the chosen model at every site's mapped point, cached as that phase;
4. :meth:`PlanTask.rehearse`: in one candidate, the effect at every site's points (its fitted registration,
   then every bootstrap pose), and :meth:`PlanTask.truth` the same in a virtual subject at the true positions;
5. the outputs: :meth:`PlanTask.dataset_variables` (plan.nc), :meth:`PlanTask.truth_dataset`,
   :meth:`PlanTask.summary`, :meth:`PlanTask.write_rig`, and the report's sentences, columns and figures.

The task's effect is named once (:attr:`PlanTask.effect`, e.g. ``"delta_auc"``): it names the columns of
sites.csv (``predicted_<effect>``), the keys of summary.json and the variables of plan.nc.

A new task is one module: a class registered with ``@register_plan_task("name")`` (next to the
:class:`~stimsim.paradigms.base.Paradigm` that runs the same task in ``stimsim run``), or a class in another
package registered through the entry point group ``stimsim.plan_tasks``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import xarray as xr

from stimsim.stimulation import ElectricalStimulation
from stimsim.utilities.filemodels import FileModel
from stimsim.utilities.plugins import Registry


def stimulation_at(point_mm, template: dict) -> ElectricalStimulation:
    """An ElectricalStimulation at ``point_mm`` with the parameters of ``template`` (units in the keys); an unknown
    key is a ``ConfigError`` listing the allowed ones."""
    return ElectricalStimulation.from_dict({**template, "sites_mm": (tuple(float(v) for v in point_mm),)})


def control_and_stimulated(p_high: np.ndarray) -> np.ndarray:
    """Curves by pose: (sites, 1 + poses, sequences, steps) with condition 0 the control → (sites, poses, 2,
    sequences, steps), ``stimulated`` = [False, True] on axis 2."""
    control = np.broadcast_to(p_high[:, :1], p_high[:, 1:].shape)
    return np.stack([control, p_high[:, 1:]], axis=2)


class PlanTask(ABC):
    """A behavioural task rehearsed at a plan's sites (see the module docstring for the order of the calls).

    ``options`` in every method is a namespace with one attribute per table of :attr:`tables`, validated.
    ``engine`` holds the engine's settings the plan fixes: ``safety_limits``, ``safety_override`` and
    ``scheduler`` (None, or a Dask client for tasks that sweep on workers).
    """

    #: Stable name used in plan files (set by :func:`register_plan_task`).
    name: str = ""
    #: The paradigm (registered name) that runs this task in ``stimsim run``.
    paradigm: ClassVar[str] = ""
    #: The per-site effect the task predicts: names sites.csv columns, summary keys, plan.nc variables.
    effect: ClassVar[str] = ""
    #: The effect as the report writes it (``"ΔAUC"``).
    effect_label: ClassVar[str] = ""
    #: The rehearsal's choice probabilities (``"p_high"``): (n_sites, 1 + n_points, ...), column 0 unstimulated.
    probability: ClassVar[str] = ""
    #: Plan tables this task takes: table name → typed model.
    tables: ClassVar[dict[str, type[FileModel]]] = {}
    #: Name of the cached phase that :meth:`design` fills (None: the task has no design step).
    design_phase: ClassVar[str | None] = None
    #: What the subject is shown in the report's validation ("images", "sequences").
    stimuli_noun: ClassVar[str] = "images"

    def record(self, options) -> dict:
        """The task's parameters as stored in config.json (and in the digest that keys the plan's cache)."""
        return {table: getattr(options, table).to_dict() for table in self.tables}

    def check(self, options, where: str) -> None:
        """Checks that involve several of the task's tables (``ConfigError`` naming ``where``)."""

    def check_memory(self, options, models: dict, n_sites: int, where: str) -> None:
        """Refuse (``ConfigError`` naming ``where``), before any work, counts whose arrays cannot fit in memory for
        ``n_sites`` sites on any of ``models`` (name → model)."""

    def steps_per_stimulus(self, options) -> int:
        """Images per stimulus that every trial list shows once sham and once stimulated (1 by default)."""
        return 1

    def prepare(self, options, images, seed: int, where: str) -> Any:
        """The task's inputs from the plan's images (a StimulusSet), checked before any work (``ConfigError``
        naming ``where``); what :meth:`rehearse` receives as ``trials`` unless the task has a design step."""
        return images

    def design(self, options, prepared, model, points_mm: np.ndarray, seed: int, progress: bool,
               companions=()) -> dict:
        """Arrays made once on the chosen ``model`` at every site's mapped point (``points_mm`` (n_sites, 2), on
        its sheet), e.g. stimuli along each site's tuning; ``companions`` are the other candidates with their
        points. Called only when :attr:`design_phase` is set."""
        raise NotImplementedError(f"the plan task {self.name!r} has no design step")

    @abstractmethod
    def rehearse(self, model, options, trials, points_mm: np.ndarray, stimulation: dict, seed: int, engine: dict,
                 progress: bool) -> dict:
        """The task in ``model`` at every site's points, ``points_mm`` (n_sites, n_points, 2) on its sheet (point
        0: the fitted registration, every one of them on the sheet). Returns arrays: :attr:`effect`
        (n_sites, n_points, n_repeats), :attr:`probability` (n_sites, 1 + n_points, ...) and any other the task
        reads back in its outputs."""

    def truth(self, model, options, trials, points_mm: np.ndarray, stimulation: dict, seed: int, engine: dict,
              progress: bool) -> dict:
        """The same in a virtual subject's ``model`` at its true positions (n_sites, 1, 2), on the same stimuli
        (``seed`` is the plan's), with its own frozen decoders: :attr:`probability`, :attr:`effect` (n_sites,
        n_repeats) and every other array of the rehearsal (e.g. the curves ``p_high`` that sessions are drawn
        from). Default: :meth:`rehearse`."""
        result = self.rehearse(model, options, trials, points_mm, stimulation, seed, engine, progress)
        return {**result, self.effect: result[self.effect][:, 0]}

    @abstractmethod
    def dataset_variables(self, working: list, trials, rehearsals: dict) -> tuple[dict, dict]:
        """The task's variables and coordinates of plan.nc (``rehearsals``: candidate name → :meth:`rehearse`
        result); the plan adds the predictions and the site coordinates on ``electrode``."""

    @abstractmethod
    def truth_dataset(self, working: list, truth: dict, trials) -> tuple[str, xr.Dataset]:
        """The file name and contents of the virtual subject's own results under ``truth/``."""

    def summary(self, options, trials, rehearsals: dict, plan: dict, working: list, models: dict, rig,
                seed: int) -> dict:
        """The task's keys of summary.json (they may warn)."""
        return {}

    def write_rig(self, out_dir: Path, options, trials, chosen: np.ndarray, working: list, rig, stimulation: dict,
                  seed: int, layout, name: str, model, subject_id: str) -> dict | None:
        """Write the rig package for the chosen sites (:mod:`stimsim.planning.rig`; ``model``: the chosen candidate;
        ``subject_id``: the subject the plan is for); its summary entry, or None for a task without one."""
        return None

    @abstractmethod
    def describe(self, options, summary: dict) -> str:
        """One sentence for the report: the task and its chance effect."""

    def site_columns(self) -> tuple[str, ...]:
        """Extra columns of the report's ranked-site table."""
        return ()

    def site_columns_note(self) -> str:
        """What :meth:`site_columns` mean, for the table's caption ("" when there are none)."""
        return ""

    def site_cells(self, trials, rehearsal: dict, site: int) -> list:
        """This site's cells of :meth:`site_columns` (``rehearsal``: the chosen model's)."""
        return []

    def overview_blocks(self, rehearsals: dict, plan: dict, working: list, chosen_model: str) -> list:
        """Report blocks (figures, paragraphs) for its first page, after the sheet figure."""
        return []

    def method_blocks(self, options, summary: dict) -> list:
        """Report blocks on how the task's stimuli were made, after the registration tables."""
        return []


#: Plan tasks by the name plan files use.
PLAN_TASKS = Registry("plan task", entry_point_group="stimsim.plan_tasks", packages=("stimsim.planning.tasks",),
                      instance_of=PlanTask)


def register_plan_task(name: str):
    """Class decorator: register a :class:`PlanTask` subclass (an instance of it) as ``name``."""
    return PLAN_TASKS.register(name)


def get_plan_task(name: str) -> PlanTask:
    """The registered plan task ``name`` (a ``ConfigError`` lists the known ones)."""
    return PLAN_TASKS.get(name)
