"""The paradigm interface: what a task must say and do so that ``stimsim run`` can run it.

An experiment file names its task with ``paradigm = "<name>"``; the name is looked up in
:data:`PARADIGMS`. The runner does the parts every task shares (model, images, sites, conditions,
safety, files) and asks the paradigm for the rest:

1. :attr:`Paradigm.stimuli_model` and :attr:`Paradigm.table_models` declare the paradigm's own keys
   of ``[stimuli]`` and its own tables (e.g. ``[pairs]``) as typed models (pydantic, see
   :mod:`stimsim.paradigms.schema`); a table whose keys all have defaults may be left out of a file,
   and a paradigm may extend a common table (e.g. ``[decoder]``) by naming it with a subclass of its
   model. Once the file is validated, :meth:`Paradigm.parse` checks what depends on several keys and
   returns an options object, stored as ``ExperimentSpec.options``. Every later call receives the
   experiment's :class:`~stimsim.paradigms.spec.TaskSettings` (``task``: the options, decoder, sites, analysis
   settings, seed, layer, name and source), not the whole experiment;
2. :meth:`Paradigm.labels` names the image labels it needs; :meth:`Paradigm.default_localizer`
   says which images define site selectivity when the file has no ``[sites.localizer]``;
3. the runner chooses the sites; :meth:`Paradigm.prepare` then builds the trials from the images and
   the selected sites (a task whose images depend on the sites, such as the 2AFC sequences of
   :mod:`stimsim.paradigms.sequence_2afc`, uses them; the others ignore them): the images to simulate,
   their ids and labels, and the decoder fitted on unperturbed activity, then frozen (see :class:`Trials`);
4. :meth:`Paradigm.simulate` predicts choice probabilities for every condition (by default the
   engine on the trials' images);
5. :meth:`Paradigm.analyse` turns them into per-site metrics (dimension ``site``) and summary numbers;
6. :meth:`Paradigm.figures` draws its figures.

Published data sets that need a paradigm name it (:mod:`stimsim.datasets`); :meth:`Paradigm.comparisons`
lists them. A new task is one module in this package that subclasses :class:`Paradigm` and registers
it (``@register_paradigm("name")``), or a class in another package registered through the entry point
group ``stimsim.paradigms``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import xarray as xr
from pydantic import BaseModel

from stimsim.paradigms.schema import StimuliFile
from stimsim.utilities.plugins import Registry

if TYPE_CHECKING:
    from stimsim.data.stimuli import StimulusSet
    from stimsim.paradigms.schema import LocalizerFile
    from stimsim.paradigms.sites import SiteSelection
    from stimsim.paradigms.spec import TaskSettings



class Trials(Protocol):
    """What :meth:`Paradigm.prepare` returns.

    Attributes
    ----------
    images : the images the engine shows under every condition (one per trial).
    stimulus_ids : (n,) unique id per simulated trial.
    stimulus_coords : label name → (n,) array, stored on the ``stimulus_id`` dimension.
    decoder : the engine's decoder (``layer``, ``choices``, ``probabilities``).
    frozen_decoder : the fitted decoder saved as ``decoder.json`` (has ``to_dict()``).
    record() : JSON-friendly description of the trials stored in ``config.json``.
    """

    images: Any
    stimulus_ids: Any
    stimulus_coords: dict
    decoder: Any
    frozen_decoder: Any

    def record(self) -> dict: ...


class Paradigm(ABC):
    """A behavioural task run in silico (see the module docstring for the order of the calls)."""

    #: Stable name used in experiment files (set by :func:`register_paradigm`).
    name: str = ""
    #: The ``[stimuli]`` table of this paradigm: :class:`~stimsim.paradigms.schema.StimuliFile` (``sets``)
    #: or a subclass with the paradigm's own keys.
    stimuli_model: ClassVar[type[StimuliFile]] = StimuliFile
    #: The paradigm's own tables: table name → pydantic model (required unless every key has a default; a
    #: common table such as ``decoder`` is extended by naming it with a subclass of its model).
    table_models: ClassVar[dict[str, type[BaseModel]]] = {}

    def parse(self, stimuli: StimuliFile, tables: dict[str, BaseModel], where: str) -> Any:
        """Options from the validated ``[stimuli]`` table and the paradigm's own tables; checks that
        involve several keys raise ``ConfigError`` naming ``where`` (the file). Default: a namespace
        with ``stimuli`` and every table."""
        return SimpleNamespace(stimuli=stimuli, **tables)

    @abstractmethod
    def labels(self, task: "TaskSettings") -> set[str]:
        """Image labels the trials need (kept, as text, when the stimulus sets are loaded)."""

    def default_localizer(self, options) -> "LocalizerFile | None":
        """Localizer used when the file has no ``[sites.localizer]``; None = the file must give one."""
        return None

    @abstractmethod
    def prepare(self, task: "TaskSettings", model, stimuli: "StimulusSet", selection: "SiteSelection",
                progress: bool = False) -> Trials:
        """Trials and the frozen decoder, from the experiment's images (``stimuli``) and the selected sites
        (``selection``, on the stimulated layer's sheet of ``model``); ``progress`` shows progress bars of
        long steps."""

    def simulate(self, task: "TaskSettings", model, trials: Trials, conditions: list, store: Path,
                 progress: bool, **engine_options) -> xr.DataArray:
        """Choice probabilities (condition × stimulus_id × choice) of every trial under every condition;
        resumable through ``store``; ``engine_options`` (e.g. the safety limits) go to the engine."""
        from stimsim.engine import simulate

        return simulate(model, trials.images, conditions, trials.decoder, stimulus_ids=trials.stimulus_ids,
                        stimulus_coords=trials.stimulus_coords, store=store, progress=progress, **engine_options)

    @abstractmethod
    def analyse(self, task: "TaskSettings", trials: Trials, probabilities: xr.DataArray,
                selection: "SiteSelection") -> tuple[xr.Dataset, dict]:
        """Per-site metrics (dimension ``site``, labelled by ``site.label``) and summary numbers."""

    def figures(self, task: "TaskSettings", results: xr.Dataset, out_dir: Path) -> None:
        """Write this paradigm's figures (PNG) into ``out_dir``; ``results`` is the ``results.nc`` dataset."""

    def comparisons(self) -> list[str]:
        """Names of the registered published data sets that need this paradigm."""
        from stimsim.datasets import DATASETS

        return [name for name, dataset in DATASETS.items() if dataset.paradigm == self.name]


#: Paradigms by the name experiment files use.
PARADIGMS = Registry("paradigm", entry_point_group="stimsim.paradigms", packages=("stimsim.paradigms",),
                     instance_of=Paradigm)


def register_paradigm(name: str):
    """Class decorator: register a :class:`Paradigm` subclass (an instance of it) as ``name``."""
    return PARADIGMS.register(name)


def get_paradigm(name: str) -> Paradigm:
    """The registered paradigm ``name`` (a ``ConfigError`` lists the known ones)."""
    return PARADIGMS.get(name)
