"""The validated experiment: what an experiment file says, as the frozen record that the paradigms, the runner
and the published datasets read. Files become an :class:`ExperimentSpec` through
:func:`stimsim.paradigms.experiment_file.load_experiment`, whose module documents every table and key; its tables
are the validated file models themselves (:mod:`stimsim.paradigms.schema`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stimsim.utilities.errors import ConfigError
from stimsim.utilities.hashing import json_sha256

if TYPE_CHECKING:
    from stimsim.paradigms.schema import AnalysisFile, DecoderFile, SitesFile, StimuliFile


@dataclass(frozen=True)
class TaskSettings:
    """What a paradigm's task (and a published dataset set beside it) reads of an experiment: its ``name``, the
    file it came from (``source``, for messages), ``seed``, the stimulated ``layer``, the paradigm's own parsed
    ``options``, the ``decoder``, the ``sites`` and the ``analysis`` settings — not the model, the stimulation or
    the file's other content, so that other jobs (e.g. planning) can set a task up without an experiment file."""

    name: str
    source: str
    seed: int
    layer: str
    options: Any
    decoder: "DecoderFile"
    sites: "SitesFile"
    analysis: "AnalysisFile"


@dataclass(frozen=True)
class ExperimentSpec:
    """A validated experiment file. ``stimuli``, ``decoder`` (its ``layer`` resolved), ``sites`` (its
    ``localizer`` resolved, an explicit method's ``groups`` filled) and ``analysis`` are the file's validated
    tables. ``options`` holds what the paradigm parsed (its own keys and
    tables), ``raw`` the file's content as parsed (stored with results), ``source`` the file it came
    from, ``safety`` the safety report with its limits and any override reason (electrical
    stimulation only)."""

    name: str
    description: str
    citation: str
    paradigm: str
    model: str
    layer: str
    seed: int
    stimuli: "StimuliFile"
    decoder: "DecoderFile"
    sites: "SitesFile"
    stimulation: dict
    analysis: "AnalysisFile"
    options: Any = None
    perturbation: Any = None
    additive_scale: str = "activation"
    safety: dict | None = None
    comparison: str | None = None
    cortex_mm_per_model_mm: float | None = None
    source: str = ""
    raw: dict = dataclasses.field(default_factory=dict)

    def settings(self) -> TaskSettings:
        """The part of the experiment its paradigm and its published dataset read."""
        return TaskSettings(name=self.name, source=self.source, seed=self.seed, layer=self.layer, options=self.options,
                            decoder=self.decoder, sites=self.sites, analysis=self.analysis)

    def perturbation_at(self, site_mm):
        """The ``[stimulation]`` template (:attr:`perturbation`, typed) applied at one site (x, y) mm."""
        return dataclasses.replace(self.perturbation, sites_mm=((float(site_mm[0]), float(site_mm[1])),))

    def with_additive_scale(self, record: dict) -> "ExperimentSpec":
        """With ``additive_scale = "sd"``: a copy whose ``activation_per_Hz`` is the one ``record``
        (:func:`stimsim.stimulation.additive_scale_record`) resolved in activation units; otherwise this spec."""
        if self.additive_scale != "sd":
            return self
        scaled = dataclasses.replace(self.perturbation, activation_per_Hz=record["activation_per_Hz"])
        return dataclasses.replace(self, perturbation=scaled, additive_scale="activation")

    def with_model(self, model: str) -> "ExperimentSpec":
        """A copy that uses ``model`` (a shipped name or a model directory)."""
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"model must be a shipped model name or a model directory, got {model!r}")
        return dataclasses.replace(self, model=model)

    def to_dict(self) -> dict:
        """The experiment as stored with results: the file's content plus the resolved model."""
        return {**self.raw, "model": self.model, "layer": self.layer, "seed": self.seed,
                "cortex_mm_per_model_mm": self.cortex_mm_per_model_mm}

    def sha256(self) -> str:
        """Digest of :meth:`to_dict` (canonical JSON)."""
        return json_sha256(self.to_dict())
