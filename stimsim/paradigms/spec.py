"""Experiment files: a TOML description of an in-silico stimulation experiment, read strictly.

An experiment file declares what a lab would write in its methods section: the model, the task,
the images, how the behavioural decoder is fitted, where the sites are, what is done at every site,
the safety limits and which published data to compare with. Every key is checked: an unknown key,
a missing required key or a value outside its allowed range is an error that names the key and the
file. Units are part of the key names (``current_uA``, ``radius_mm``, ``volume_uL``, ...).
Examples: ``experiments/afraz2006.toml``, ``experiments/moeller2017.toml``,
``experiments/muscimol_categorization.toml``.

Top level
---------
``name`` (text, required), ``description`` (text), ``citation`` (text),
``paradigm`` (the task: a registered paradigm name, required — ``"categorization"``
(:mod:`stimsim.paradigms.categorization`), ``"same_different"`` (:mod:`stimsim.paradigms.same_different`)
or any other registered one, see :mod:`stimsim.paradigms.base`; a paradigm reads its own keys of
``[stimuli]`` and its own tables, documented in its module),
``model`` (shipped model name or model directory; default ``"stimsim-topo-s0"``; ``stimsim run --model``
overrides it), ``layer`` (the layer stimulated, a stage name or an area label; default ``"IT"``),
``cortex_mm_per_model_mm`` (number in (0, 100], default 1: how many millimetres of cortex one
millimetre of the model's sheet stands for; the stimulated layer's sheet is scaled by it before sites
are chosen and stimulation spreads, so every length in the file — sites, radii, margins — is in
cortex mm; recorded with the results),
``seed`` (integer in [0, 2³² − 1], default 0: every random draw of the run — noise, splits, site draws,
pairs, bootstrap — derives from it, so a run on CPU is reproducible; an image set's own ``seed``
key, e.g. Fashion-MNIST's draw, is that set's).

``[stimuli]``
    ``sets`` (required): a list of tables, each handed to ``stimsim.data.stimuli.load_stimulus_source``
    (``source`` plus that source's own keys, e.g. ``{ source = "fashion_mnist", split = "test",
    n_per_class = 3 }``), plus the optional key ``heldout_only = true``: keep only the images the
    model's training run held out (the model's ``metadata["holdout_stimulus_ids"]``).
    The paradigm's own keys (e.g. categorisation's ``label``, ``positive`` and ``[stimuli.noise]``) are
    documented in its module.

``[pairs]`` and other tables of a paradigm
    Documented in the paradigm's module (``[pairs]``: :mod:`stimsim.paradigms.same_different`).

``[decoder]``
    ``C`` (inverse L2 regularisation, default 1e-3 as in Brain-Score), ``fit_fraction`` (default 0.5:
    the share of trials used to fit the decoder, stratified by choice; the rest are the test trials
    that are simulated; the paradigm says what a trial is), ``layer`` (default: the top-level
    ``layer``), ``max_iter`` (default 1000). The decoder is fitted on unperturbed activity and then
    frozen.

``[sites]``
    ``method``: ``"explicit"`` (``sites_mm = [[x, y], ...]``, optional ``groups = [...]``, one name
    per site), ``"selectivity"`` (``n_selective`` sites with multi-unit d′ > ``dprime_threshold`` and
    ``n_other`` sites with d′ <= it, drawn at random among the points of a ``candidate_step_mm`` grid,
    default 0.25 mm, at least ``min_separation_mm`` apart, default 0), ``"face_patch"`` (inside = the
    peak of the smoothed unit-d′ map; outside = the point of the candidate grid with the lowest
    multi-unit d′ at least ``outside_min_distance_mm``, default 3, from it) or ``"grid"`` (a regular
    grid, ``grid_step_mm`` apart, default 2). Keys for every method: ``recording_radius_mm`` (a site's
    multi-unit response is the mean of the units within this radius; default 0.5),
    ``dprime_threshold`` (default 1.0: "selective" = d′ > 1), ``smoothing_sigma_mm`` (σ of the
    Gaussian that smooths the unit-d′ map whose peak is the face-patch centre, from which every
    site's ``distance_to_peak_mm`` is measured; default 0.5). All methods but ``explicit``:
    ``margin_mm`` (grid and candidate points keep this distance from the sheet's edge; default 0.5).
    Sites are in model-sheet millimetres.
    ``[sites.localizer]``: the images that define selectivity (d′ of ``positive`` against the rest of
    ``label``): ``label``, ``positive``, optional ``sets`` (as in ``[stimuli]``; default: the
    experiment's own clean images). Without this table the paradigm's default is used, if it has
    one (categorisation with ``positive``: ``[stimuli]``'s label and positive class).

``[stimulation]``
    One perturbation template applied at every site: ``kind`` (``"electrical"``, ``"optogenetic"``,
    ``"muscimol"``, ``"ablation"``) and that perturbation's parameters with units (see
    :mod:`stimsim.stimulation.perturbations`; e.g. ``current_uA``, ``frequency_Hz``,
    ``pulse_width_ms``, ``train_ms`` / ``power_mW`` / ``volume_uL`` / ``radius_mm``). ``sites_mm``
    and ``layer`` come from ``[sites]`` and the top-level ``layer``.

``[safety]`` (electrical stimulation only)
    ``max_shannon_k`` (default 1.85), ``electrode_area_um2`` (default: a Utah-array tip),
    ``max_charge_per_phase_nC`` (optional), ``override`` (optional reason to run a protocol that
    violates a limit; it is recorded with the results). A violation without an override refuses
    the file.

``[comparison]`` (optional)
    ``dataset``: published data to set beside the model, a registered dataset name
    (:mod:`stimsim.datasets`: ``"afraz2006"``, ``"moeller2017"``, ...). Each dataset names the
    paradigm it needs and checks that the experiment measures what the paper measured.

``[analysis]`` (optional)
    ``n_boot`` (bootstrap resamples, default 1000), ``n_perm`` (permutations of correlation tests,
    default 1000), ``ci`` (confidence level, default 0.95).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stimsim.config import Section, load_toml
from stimsim.datasets import DATASETS
from stimsim.errors import ConfigError, SafetyError
from stimsim.models.registry import DEFAULT_MODEL
from stimsim.paradigms.base import PARADIGMS
from stimsim.stimulation import SafetyLimits, enforce, perturbation_from_dict

#: Largest seed: numpy and scikit-learn take seeds below 2³².
MAX_SEED = 2**32 - 1
SITE_METHODS = ("explicit", "selectivity", "face_patch", "grid")


@dataclass(frozen=True)
class StimuliSpec:
    """The images of an experiment: ``sets``, tables for ``load_stimulus_source`` (optionally with
    ``heldout_only``)."""

    sets: tuple[dict, ...]


@dataclass(frozen=True)
class DecoderSpec:
    """Decoder fitting: regularisation ``C``, share of trials for fitting, readout layer."""

    C: float
    fit_fraction: float
    layer: str
    max_iter: int


@dataclass(frozen=True)
class LocalizerSpec:
    """Images defining site selectivity: d′ of ``positive`` against the rest of ``label``;
    ``sets`` None = the experiment's own clean images."""

    label: str
    positive: str
    sets: tuple[dict, ...] | None


@dataclass(frozen=True)
class SitesSpec:
    """How stimulation sites are chosen on the sheet (mm); see the module docstring."""

    method: str
    localizer: LocalizerSpec
    recording_radius_mm: float = 0.5
    margin_mm: float = 0.5
    dprime_threshold: float = 1.0
    sites_mm: tuple[tuple[float, float], ...] = ()
    groups: tuple[str, ...] = ()
    n_selective: int = 0
    n_other: int = 0
    candidate_step_mm: float = 0.25
    min_separation_mm: float = 0.0
    smoothing_sigma_mm: float = 0.5
    outside_min_distance_mm: float = 3.0
    grid_step_mm: float = 2.0


@dataclass(frozen=True)
class AnalysisSpec:
    """Uncertainty settings: bootstrap resamples, permutations, confidence level."""

    n_boot: int = 1000
    n_perm: int = 1000
    ci: float = 0.95


@dataclass(frozen=True)
class ExperimentSpec:
    """A validated experiment file. ``options`` holds what the paradigm parsed (its own keys and
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
    stimuli: StimuliSpec
    decoder: DecoderSpec
    sites: SitesSpec
    stimulation: dict
    analysis: AnalysisSpec
    options: Any = None
    safety: dict | None = None
    comparison: str | None = None
    cortex_mm_per_model_mm: float = 1.0
    source: str = ""
    raw: dict = dataclasses.field(default_factory=dict)

    @property
    def task(self):
        """The registered :class:`~stimsim.paradigms.base.Paradigm` named by ``paradigm``."""
        return PARADIGMS.get(self.paradigm)

    def perturbation_at(self, site_mm):
        """The ``[stimulation]`` template applied at one site (x, y) mm on ``layer``."""
        record = {**self.stimulation, "sites_mm": [[float(site_mm[0]), float(site_mm[1])]], "layer": self.layer}
        return perturbation_from_dict(record)

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
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


#: Stimulus sources whose ``path`` names a file or folder.
_PATH_SOURCES = ("table", "folder")


def load_experiment(path) -> ExperimentSpec:
    """Read and validate an experiment file (TOML). Relative paths in it (stimulus tables and
    folders, a model directory) are taken relative to the file's own folder."""
    path = Path(path)
    return parse_experiment(_resolve_paths(load_toml(path), path.parent), where=str(path))


def _resolve_paths(raw: dict, base: Path) -> dict:
    """``raw`` with the relative ``path`` of path-based stimulus sets and a relative model directory
    made absolute against ``base`` (a model that names a shipped model stays a name)."""
    raw = json.loads(json.dumps(raw, default=str))

    def resolve(sets):
        for entry in sets if isinstance(sets, list) else ():
            if (isinstance(entry, dict) and entry.get("source") in _PATH_SOURCES and isinstance(entry.get("path"), str)
                    and entry["path"] and not Path(entry["path"]).is_absolute()):
                entry["path"] = str((base / entry["path"]).absolute())

    for table in (raw.get("stimuli"), (raw.get("sites") or {}).get("localizer") if isinstance(raw.get("sites"), dict)
                  else None):
        if isinstance(table, dict):
            resolve(table.get("sets"))
    model = raw.get("model")
    if isinstance(model, str) and model.strip() and not Path(model).is_absolute() and (base / model).is_dir():
        raw["model"] = str((base / model).absolute())
    return raw


def parse_experiment(raw: dict, where: str = "experiment") -> ExperimentSpec:
    """Validate an already-parsed experiment (``where`` names it in error messages)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: an experiment must be a table, got {type(raw).__name__}")
    top = Section(raw, where)
    name = top.text("name")
    description = top.get("description", str, "")
    citation = top.get("citation", str, "")
    paradigm_name = top.get("paradigm", str, choices=PARADIGMS.names())
    paradigm = PARADIGMS.get(paradigm_name)
    model = top.text("model", DEFAULT_MODEL)
    layer = top.text("layer", "IT")
    seed = top.get("seed", int, 0, minimum=0, maximum=MAX_SEED)
    scale = top.get("cortex_mm_per_model_mm", float, 1.0)
    if not 0 < scale <= 100:
        raise ConfigError(f"{where}: 'cortex_mm_per_model_mm' must be in (0, 100], got {scale}")

    stimuli_section = top.section("stimuli", required=True)
    stimuli = StimuliSpec(sets=_source_sets(stimuli_section.get("sets", list), stimuli_section.where))
    options = paradigm.parse(top, stimuli_section)
    stimuli_section.finish()
    decoder = _parse_decoder(top.section("decoder"), layer)
    sites = _parse_sites(top.section("sites", required=True), paradigm.default_localizer(options))
    stimulation = _parse_stimulation(top.section("stimulation", required=True), layer)
    safety = _parse_safety(top, stimulation, layer)
    comparison_section = top.section("comparison")
    analysis = _parse_analysis(top.section("analysis"))
    top.finish()
    spec = ExperimentSpec(
        name=name, description=description, citation=citation, paradigm=paradigm_name, model=model, layer=layer,
        seed=seed, stimuli=stimuli, decoder=decoder, sites=sites, stimulation=stimulation, analysis=analysis,
        options=options, safety=safety, cortex_mm_per_model_mm=scale,
        source=where, raw=json.loads(json.dumps(raw, default=str)),
    )
    return dataclasses.replace(spec, comparison=_parse_comparison(comparison_section, spec))


# --- blocks -----------------------------------------------------------------------------------
def _positive_number(section: Section, key: str, default: float, unit: str, strict: bool = True) -> float:
    value = section.get(key, float, default)
    if not math.isfinite(value) or (value <= 0 if strict else value < 0):
        bound = "> 0" if strict else ">= 0"
        raise ConfigError(f"{section.where}: {key!r} must be a finite number {bound} {unit}, got {value!r}")
    return value


def _source_sets(values, where: str) -> tuple[dict, ...]:
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{where}: 'sets' must be a non-empty list of tables, each with a 'source'")
    sets = []
    for index, entry in enumerate(values):
        if not isinstance(entry, dict) or not isinstance(entry.get("source"), str) or not entry["source"].strip():
            raise ConfigError(f"{where}: sets[{index}] must be a table with a 'source' name, got {entry!r}")
        if "heldout_only" in entry and not isinstance(entry["heldout_only"], bool):
            raise ConfigError(f"{where}: sets[{index}].heldout_only must be true or false, "
                              f"got {entry['heldout_only']!r}")
        sets.append(dict(entry))
    return tuple(sets)


def _parse_decoder(section: Section, layer: str) -> DecoderSpec:
    fit_fraction = section.get("fit_fraction", float, 0.5)
    if not 0 < fit_fraction < 1:
        raise ConfigError(f"{section.where}: 'fit_fraction' must lie strictly between 0 and 1 (the share of "
                          f"trials used to fit the decoder), got {fit_fraction!r}")
    spec = DecoderSpec(C=_positive_number(section, "C", 1e-3, "(inverse regularisation strength)"),
                       fit_fraction=fit_fraction, layer=section.text("layer", layer),
                       max_iter=section.get("max_iter", int, 1000, minimum=1))
    section.finish()
    return spec


def _parse_localizer(section: Section, default: LocalizerSpec | None) -> LocalizerSpec:
    if not section.values:
        if default is None:
            raise ConfigError(f"{section.where}: site selectivity needs a localizer: give [sites.localizer] "
                              f"with 'label' and 'positive' (the preferred class, e.g. \"face\")")
        return default
    sets = section.get("sets", list, None)
    spec = LocalizerSpec(label=section.text("label"), positive=section.text("positive"),
                         sets=None if sets is None else _source_sets(sets, section.where))
    section.finish()
    return spec


def _parse_sites(section: Section, default_localizer: LocalizerSpec | None) -> SitesSpec:
    method = section.get("method", str, choices=SITE_METHODS)
    localizer = _parse_localizer(section.section("localizer"), default_localizer)
    common = dict(
        recording_radius_mm=_positive_number(section, "recording_radius_mm", 0.5, "mm"),
        dprime_threshold=section.get("dprime_threshold", float, 1.0),
        smoothing_sigma_mm=_positive_number(section, "smoothing_sigma_mm", 0.5, "mm"),
    )
    if not math.isfinite(common["dprime_threshold"]):
        raise ConfigError(f"{section.where}: 'dprime_threshold' must be a finite number")
    if method == "explicit":
        sites_mm = _explicit_sites(section.get("sites_mm", list), section.where)
        groups = section.get("groups", list, None)
        if groups is None:
            groups = ["explicit"] * len(sites_mm)
        if len(groups) != len(sites_mm) or not all(isinstance(g, str) and g for g in groups):
            raise ConfigError(f"{section.where}: 'groups' must hold one non-empty name per site "
                              f"({len(sites_mm)}), got {groups!r}")
        spec = SitesSpec(method=method, localizer=localizer, sites_mm=sites_mm, groups=tuple(groups), **common)
    else:
        common["margin_mm"] = _positive_number(section, "margin_mm", 0.5, "mm", strict=False)
        if method == "selectivity":
            spec = SitesSpec(
                method=method, localizer=localizer, **common,
                n_selective=section.get("n_selective", int, minimum=0),
                n_other=section.get("n_other", int, minimum=0),
                candidate_step_mm=_positive_number(section, "candidate_step_mm", 0.25, "mm"),
                min_separation_mm=_positive_number(section, "min_separation_mm", 0.0, "mm", strict=False),
            )
            if spec.n_selective + spec.n_other < 1:
                raise ConfigError(f"{section.where}: n_selective + n_other must be at least 1")
        elif method == "face_patch":
            spec = SitesSpec(
                method=method, localizer=localizer, **common,
                candidate_step_mm=_positive_number(section, "candidate_step_mm", 0.25, "mm"),
                outside_min_distance_mm=_positive_number(section, "outside_min_distance_mm", 3.0, "mm"),
            )
        else:
            spec = SitesSpec(method=method, localizer=localizer, **common,
                             grid_step_mm=_positive_number(section, "grid_step_mm", 2.0, "mm"))
    section.finish()
    return spec


def _explicit_sites(values, where: str) -> tuple[tuple[float, float], ...]:
    problem = f"{where}: 'sites_mm' must be a non-empty list of [x_mm, y_mm] pairs, got {values!r}"
    if not values:
        raise ConfigError(problem)
    sites = []
    for pair in values:
        if (not isinstance(pair, list) or len(pair) != 2
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in pair)):
            raise ConfigError(problem)
        sites.append((float(pair[0]), float(pair[1])))
    return tuple(sites)


def _parse_stimulation(section: Section, layer: str) -> dict:
    """The perturbation template; its keys are checked by the perturbation class itself."""
    template = dict(section.values)
    for key, origin in (("sites_mm", "[sites]"), ("layer", "the top-level 'layer'")):
        if key in template:
            raise ConfigError(f"{section.where}: {key!r} is not set here; it comes from {origin}")
    try:
        perturbation_from_dict({**template, "sites_mm": [[0.0, 0.0]], "layer": layer})
    except ConfigError as exc:
        raise ConfigError(f"{section.where}: {exc}") from None
    return template


def _parse_safety(top: Section, stimulation: dict, layer: str) -> dict | None:
    """The safety report of an electrical protocol (refused without an override if it violates a
    limit); None for other perturbations."""
    section = top.section("safety")
    if stimulation["kind"] != "electrical":
        if section.values:
            raise ConfigError(f"{section.where}: safety limits apply to electrical stimulation only; this "
                              f"experiment uses {stimulation['kind']!r} — remove [safety]")
        return None
    try:
        limits = SafetyLimits(
            max_shannon_k=section.get("max_shannon_k", float, SafetyLimits.max_shannon_k),
            electrode_area_um2=section.get("electrode_area_um2", float, SafetyLimits.electrode_area_um2),
            max_charge_per_phase_nC=section.get("max_charge_per_phase_nC", float, None),
        )
    except ConfigError as exc:
        raise ConfigError(f"{section.where}: {exc}") from None
    override = section.get("override", str, None)
    if override is not None and not override.strip():
        raise ConfigError(f"{section.where}: 'override' must be a reason (non-empty text)")
    section.finish()
    stim = perturbation_from_dict({**stimulation, "sites_mm": [[0.0, 0.0]], "layer": layer})
    try:
        report = enforce(stim, limits, override=override)
    except SafetyError as exc:
        raise SafetyError(f"{top.where}: {exc}") from None
    return report.to_dict()


def _parse_comparison(section: Section, spec: ExperimentSpec) -> str | None:
    if not section.values:
        return None
    name = section.get("dataset", str, choices=DATASETS.names())
    section.finish()
    dataset = DATASETS.get(name)
    if dataset.paradigm != spec.paradigm:
        raise ConfigError(f"{section.where}: {name!r} is a {dataset.paradigm} experiment; this file's paradigm is "
                          f"{spec.paradigm!r}")
    try:
        dataset.check(spec)
    except ConfigError as exc:
        raise ConfigError(f"{section.where}: {exc}") from None
    return name


def _parse_analysis(section: Section) -> AnalysisSpec:
    spec = AnalysisSpec(n_boot=section.get("n_boot", int, 1000, minimum=2),
                        n_perm=section.get("n_perm", int, 1000, minimum=1),
                        ci=section.get("ci", float, 0.95))
    if not 0 < spec.ci < 1:
        raise ConfigError(f"{section.where}: 'ci' must lie strictly between 0 and 1, got {spec.ci!r}")
    section.finish()
    return spec
