"""The published-dataset interface: data from a paper that an experiment can be set beside.

An experiment file asks for a comparison with ``[comparison] dataset = "<name>"``; the name is
looked up in :data:`DATASETS`. A dataset names the paradigm it needs (:attr:`PublishedDataset.paradigm`),
checks that the experiment measures what the paper measured (:meth:`PublishedDataset.check`), loads its
data through the data manifest, computes the data side of the summary
(:meth:`PublishedDataset.compare`), draws model and animals side by side
(:meth:`PublishedDataset.figure`) and scores the model as a benchmark does (:meth:`PublishedDataset.score`): one
number, the metric, beside its ceiling (what the animals' own data reach on it) and its chance level (what a model
whose stimulation does not do what the paper found reaches), and the score normalised between the two. Every
experimental constant sits beside the sentence of the paper's methods it comes from, with the citation.

A new dataset is one module in :mod:`stimsim.datasets` with a subclass registered by
``@register_dataset("name")``, or a class in another package registered through the entry point
group ``stimsim.datasets``.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from pathlib import Path

import xarray as xr

from stimsim.utilities.plugins import Registry


class PublishedDataset(ABC):
    """Published data an experiment can be compared with. Its methods receive what the experiment's task reads,
    ``task`` (a :class:`stimsim.paradigms.spec.TaskSettings`: options, decoder, sites, analysis settings, seed,
    layer, name, source; this interface sits below the paradigms and does not import them)."""

    #: Stable name used in experiment files (set by :func:`register_dataset`).
    name: str = ""
    #: The paradigm (registered name) whose results this dataset can be compared with.
    paradigm: str = ""
    #: The paper the data come from.
    citation: str = ""
    #: The data manifest entry holding the files.
    manifest_entry: str = ""
    #: Name of the benchmark's metric and one line saying what its score, ceiling and chance are.
    metric: str = ""
    metric_description: str = ""
    #: Summary keys (the model's and the data's) that a table of scores shows beside the score.
    headline_keys: tuple[str, ...] = ()

    def check(self, task) -> None:
        """Refuse (``ConfigError``, without the file name: the caller adds it) an experiment whose
        design cannot be compared with these data; the paradigm is checked already."""

    @abstractmethod
    def compare(self, task, trials, mirror=None) -> tuple[xr.Dataset, dict]:
        """The published data (variables prefixed ``data_``) and the data side of the summary
        (keys prefixed ``data_``), named as the paradigm names the model's. Missing files raise
        ``DataError``."""

    @abstractmethod
    def figure(self, task, results: xr.Dataset, data: xr.Dataset, summary: dict,
               out_dir: Path) -> None:
        """Write the model-beside-animals figure (PNG) into ``out_dir``."""

    @abstractmethod
    def score(self, task, trials, summary: dict, data: xr.Dataset | None) -> dict:
        """The model's score on this benchmark, from the run's summary (the model's and the data's keys) and the
        published data (None when they were not available here), as :meth:`score_record` gives it."""

    def score_record(self, score, ceiling, chance, reasons=(), score_ci=None, ceiling_ci=None) -> dict:
        """A score as every benchmark reports it: ``metric``, ``description``, ``score`` (+ ``score_ci``),
        ``ceiling`` (+ ``ceiling_ci``), ``chance`` and ``normalized`` = (score − chance) / (ceiling − chance), not
        clipped (a model above the ceiling has normalized > 1). A value that cannot be computed is None and
        ``undefined_reason`` (None otherwise) says why, from ``reasons``."""
        values = {"score": score, "ceiling": ceiling, "chance": chance}
        values = {key: None if value is None else float(value) for key, value in values.items()}
        reasons = list(reasons)
        for key, value in values.items():
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{self.name} {key} is {value}; an undefined value is None with its reason")
        normalized = None
        if None not in values.values():
            if values["ceiling"] == values["chance"]:
                reasons.append(f"the ceiling equals chance ({values['chance']:g}): nothing to normalise by")
            else:
                normalized = (values["score"] - values["chance"]) / (values["ceiling"] - values["chance"])
        if normalized is None and not reasons:
            raise ValueError(f"{self.name} score: a value is None without a reason")
        return {"metric": self.metric, "description": self.metric_description, **values,
                "score_ci": _interval(score_ci), "ceiling_ci": _interval(ceiling_ci), "normalized": normalized,
                "undefined_reason": "; ".join(reasons) if reasons else None}


#: Published datasets by the name experiment files use.
DATASETS = Registry("comparison dataset", entry_point_group="stimsim.datasets", packages=("stimsim.datasets",),
                    instance_of=PublishedDataset)


def register_dataset(name: str):
    """Class decorator: register a :class:`PublishedDataset` subclass (an instance of it) as ``name``."""
    return DATASETS.register(name)


def get_dataset(name: str) -> PublishedDataset:
    """The registered dataset ``name`` (a ``ConfigError`` lists the known ones)."""
    return DATASETS.get(name)


def _interval(interval):
    return None if interval is None else [float(interval[0]), float(interval[1])]


def read_csv(path, required: tuple[str, ...]):
    """A published table as text (``pandas.DataFrame`` of str; spaces around names and values
    stripped; numbers are converted by the caller, so they parse exactly as Python's ``float``).
    A missing column or an empty table is a ``FileFormatError`` naming the file."""
    import pandas as pd

    from stimsim.utilities.errors import FileFormatError

    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (ValueError, pd.errors.ParserError) as exc:
        raise FileFormatError(path, f"not a readable CSV table ({exc})") from None
    table.columns = [str(c).strip() for c in table.columns]
    table = table.apply(lambda column: column.str.strip())
    missing = [c for c in required if c not in table.columns]
    if missing:
        raise FileFormatError(path, f"missing column(s) {missing}; found {list(table.columns)}")
    if table.empty:
        raise FileFormatError(path, "the table has no rows")
    return table
