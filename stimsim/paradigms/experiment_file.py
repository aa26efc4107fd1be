"""Experiment files: a TOML description of an in-silico stimulation experiment, read strictly.

An experiment file declares what a lab would write in its methods section: the model, the task,
the images, how the behavioural decoder is fitted, where the sites are, what is done at every site,
the safety limits and which published data to compare with. Every key is checked: an unknown key,
a missing required key or a value outside its allowed range is an error that names the key and the
file. Units are part of the key names (``current_uA``, ``radius_mm``, ``volume_uL``, ...).
Examples: ``experiments/afraz2006.toml``, ``experiments/moeller2017.toml``,
``experiments/muscimol_categorization.toml``, ``experiments/sequence2afc.toml``.

Top level
---------
``name`` (text, required), ``description`` (text), ``citation`` (text),
``paradigm`` (the task: a registered paradigm name, required — ``"categorization"``
(:mod:`stimsim.paradigms.categorization`), ``"same_different"`` (:mod:`stimsim.paradigms.same_different`),
``"sequence_2afc"`` (:mod:`stimsim.paradigms.sequence_2afc`) or any other registered one, see :mod:`stimsim.paradigms.base`; a paradigm reads its own keys of
``[stimuli]`` and its own tables, documented in its module),
``model`` (shipped model name or model directory; default ``"stimsim-mnv2-s0"``; ``stimsim run --model``
overrides it), ``layer`` (the layer stimulated, a stage name or an area label; default ``"IT"``),
``cortex_mm_per_model_mm`` (number in (0, 100]; default: the model's own scale, recorded in its
metadata with the anatomical rule that set it, or 1 for a model that records none. How many
millimetres of cortex one millimetre of the model's sheet stands for; the stimulated layer's sheet is
scaled by it before sites are chosen and stimulation spreads, so every length in the file — sites,
radii, margins — is in cortex mm. A file that sets a value other than the model's overrides it:
``summary.json`` then says ``scale_overridden: true`` beside the model's own scale),
``seed`` (integer in [0, 2³² − 1], default 0: every random draw of the run — noise, splits, site draws,
pairs, bootstrap — derives from it, so a run on CPU is reproducible; an image set's own ``seed``
key, e.g. Fashion-MNIST's draw, is that set's).

``[stimuli]``
    ``sets`` (required): a list of tables, each handed to ``stimsim.data.stimuli.load_stimulus_source``
    (``source`` plus that source's own keys, e.g. ``{ source = "fashion_mnist", split = "test",
    n_per_class = 3 }``), plus the optional keys ``heldout_only = true``: keep only the images the
    model's training run held out (the model's ``metadata["holdout_stimulus_ids"]``; every image of a source
    its training took no image from), and ``labels``: text
    labels given to every image of the set (``labels = { domain = "imagenet" }``), so that a label of another
    set in the list (fLoc's ``domain``) is kept when the sets are combined.
    The paradigm's own keys (e.g. categorisation's ``label``, ``positive`` and ``[stimuli.noise]``) are
    documented in its module.

``[pairs]`` and other tables of a paradigm
    Documented in the paradigm's module (``[pairs]``: :mod:`stimsim.paradigms.same_different`;
    ``[sequences]``: :mod:`stimsim.paradigms.sequence_2afc`).

``[decoder]``
    ``C`` (inverse L2 regularisation, default 1e-3 as in Brain-Score), ``fit_fraction`` (default 0.5:
    the share of trials used to fit the decoder, stratified by choice; the rest are the test trials
    that are simulated; the paradigm says what a trial is), ``layer`` (default: the top-level
    ``layer``), ``max_iter`` (default 1000). The decoder is fitted on unperturbed activity and then
    frozen. A paradigm may add keys of its own (``sequence_2afc``: ``n_noise``, ``n_eval``, ``noise_sd``
    instead of ``fit_fraction``).

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
    Sites are in cortex millimetres (the model's sheet scaled by ``cortex_mm_per_model_mm``).
    ``[sites.localizer]``: the images that define selectivity (d′ of ``positive`` against the rest of
    ``label``): ``label``, ``positive``, optional ``sets`` (as in ``[stimuli]``; default: the
    experiment's own clean images). Without this table the paradigm's default is used, if it has
    one (categorisation with ``positive``: ``[stimuli]``'s label and positive class).

``[stimulation]``
    One perturbation template applied at every site: ``kind`` (``"electrical"``, ``"optogenetic"``,
    ``"muscimol"``, ``"ablation"``) and that perturbation's parameters with units (see
    :mod:`stimsim.stimulation`; e.g. ``current_uA``, ``frequency_Hz``,
    ``pulse_width_ms``, ``train_ms`` / ``power_mW`` / ``volume_uL`` / ``radius_mm``). ``sites_mm``
    and ``layer`` come from ``[sites]`` and the top-level ``layer``. A dose of 0 (the kind's
    :attr:`~stimsim.stimulation.Perturbation.doses`), which delivers nothing, is refused.

``[safety]`` (electrical stimulation only)
    ``max_shannon_k`` (> 0, default 1.85), ``electrode_area_um2`` (1 to 1e8 µm², default: a Utah-array
    tip), ``max_charge_per_phase_nC`` (optional, > 0 nC), ``override`` (optional reason to run a protocol that
    violates a limit; it is recorded with the results). A violation without an override refuses
    the file.

``[comparison]`` (optional)
    ``dataset``: published data to set beside the model, a registered dataset name
    (:mod:`stimsim.datasets`: ``"afraz2006"``, ``"moeller2017"``, ...). Each dataset names the
    paradigm it needs and checks that the experiment measures what the paper measured.

``[analysis]`` (optional)
    ``n_boot`` (bootstrap resamples, default 1000), ``n_perm`` (permutations of correlation tests,
    default 1000), each at most 100,000; ``ci`` (confidence level, default 0.95).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Union

from pydantic import Field, TypeAdapter

from stimsim.datasets import DATASETS
from stimsim.paradigms.base import PARADIGMS
from stimsim.paradigms.schema import LocalizerFile, SafetyFile, SitesFile, file_model, validate_file
from stimsim.paradigms.spec import ExperimentSpec
from stimsim.stimulation import SafetyLimits, check_additive_scale, enforce, perturbation_from_dict
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError, SafetyError
from stimsim.utilities.file_kinds import wrong_kind_hint

#: Stimulus sources whose ``path`` names a file or folder.
_PATH_SOURCES = ("table", "folder")


def load_experiment(path) -> ExperimentSpec:
    """Read and validate an experiment file (TOML). Relative paths in it (stimulus tables and
    folders, a model directory) are taken relative to the file's own folder."""
    path = Path(path)
    return parse_experiment(_resolve_paths(load_toml(path), path.parent), where=str(path))


def resolve_set_paths(sets, base: Path) -> None:
    """Make the relative ``path`` of every path-based stimulus set in ``sets`` (a list of set tables, changed in
    place) absolute against ``base``, the folder of the file that gives them."""
    for entry in sets if isinstance(sets, list) else ():
        if (isinstance(entry, dict) and entry.get("source") in _PATH_SOURCES and isinstance(entry.get("path"), str)
                and entry["path"] and not Path(entry["path"]).is_absolute()):
            entry["path"] = str((base / entry["path"]).absolute())


def _resolve_paths(raw: dict, base: Path) -> dict:
    """``raw`` with the relative ``path`` of path-based stimulus sets and a relative model directory
    made absolute against ``base`` (:func:`stimsim.models.registry.resolve_model_path`)."""
    raw = json.loads(json.dumps(raw, default=str))
    for table in (raw.get("stimuli"), (raw.get("sites") or {}).get("localizer") if isinstance(raw.get("sites"), dict)
                  else None):
        if isinstance(table, dict):
            resolve_set_paths(table.get("sets"), base)
    if "model" in raw:
        from stimsim.models.registry import resolve_model_path

        raw["model"] = resolve_model_path(raw["model"], base)
    return raw


def parse_experiment(raw: dict, where: str = "experiment") -> ExperimentSpec:
    """Validate an already-parsed experiment (``where`` names it in error messages): the typed
    models of :mod:`stimsim.paradigms.schema` first, then what depends on several tables."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: an experiment must be a table, got {type(raw).__name__}")
    name = raw.get("paradigm")
    if name not in PARADIGMS.names():
        problem = "missing required key 'paradigm'" if name is None else f"'paradigm' must be one of " \
                  f"{PARADIGMS.names()}, got {name!r}"
        raise ConfigError(f"{where}: {problem}{wrong_kind_hint(raw, 'stimsim run') if name is None else ''}")
    try:
        paradigm = PARADIGMS.get(name)
    except ConfigError as exc:
        raise ConfigError(f"{where}: 'paradigm': {exc}") from None
    checked = validate_file(raw, paradigm, where)
    tables = {table: getattr(checked, table) for table in paradigm.table_models}
    options = paradigm.parse(checked.stimuli, tables, where)
    stimulation, perturbation = _stimulation_template(checked, where)
    spec = ExperimentSpec(
        name=checked.name, description=checked.description, citation=checked.citation, paradigm=name,
        model=checked.model, layer=checked.layer, seed=checked.seed,
        stimuli=checked.stimuli,
        decoder=checked.decoder.model_copy(update={"layer": checked.decoder.layer or checked.layer}),
        sites=_sites(checked.sites, paradigm.default_localizer(options), where),
        stimulation=stimulation, analysis=checked.analysis,
        options=options, perturbation=perturbation, additive_scale=checked.stimulation.additive_scale,
        safety=_safety(checked, stimulation, where), cortex_mm_per_model_mm=checked.cortex_mm_per_model_mm,
        source=where, raw=json.loads(json.dumps(raw, default=str)),
    )
    return dataclasses.replace(spec, comparison=_comparison(checked, spec, where))


# --- checks across tables ---------------------------------------------------------------------
def _sites(sites, default_localizer: LocalizerFile | None, where: str) -> SitesFile:
    """The ``[sites]`` table with its localizer resolved (the paradigm's default when the file gives none) and an
    explicit method's ``groups`` filled (one ``"explicit"`` per site when not given)."""
    update = {}
    if sites.localizer is None:
        if default_localizer is None:
            raise ConfigError(f"{where} [sites.localizer]: site selectivity needs a localizer: give "
                              f"[sites.localizer] with 'label' and 'positive' (the preferred class, e.g. \"face\")")
        update["localizer"] = default_localizer
    if sites.method == "explicit":
        groups = sites.groups if sites.groups is not None else ["explicit"] * len(sites.sites_mm)
        if len(groups) != len(sites.sites_mm):
            raise ConfigError(f"{where} [sites]: 'groups' must hold one non-empty name per site "
                              f"({len(sites.sites_mm)}), got {groups!r}")
        update["groups"] = list(groups)
    if sites.method == "selectivity" and sites.n_selective + sites.n_other < 1:
        raise ConfigError(f"{where} [sites]: n_selective + n_other must be at least 1")
    return sites.model_copy(update=update)


def _stimulation_template(checked, where: str):
    """The perturbation template as given (a dict, recorded) and as a typed perturbation at (0, 0) mm
    on the experiment's layer; its keys are checked by the perturbation class itself."""
    template = checked.stimulation.model_dump(exclude={"additive_scale"})
    for key, origin in (("sites_mm", "[sites]"), ("layer", "the top-level 'layer'")):
        if key in template:
            raise ConfigError(f"{where} [stimulation]: {key!r} is not set here; it comes from {origin}")
    if "combine" in template:
        raise ConfigError(f"{where} [stimulation]: 'combine' joins several electrodes of one perturbation, and an "
                          "experiment stimulates one site of [sites] at a time, so it would change nothing: remove it")
    try:
        perturbation = perturbation_from_dict({**template, "sites_mm": [[0.0, 0.0]], "layer": checked.layer},
                                              supplied=("sites_mm", "layer", "combine"), file_keys=("additive_scale",))
        perturbation.check_delivers()
        if "additive_scale" in checked.stimulation.model_fields_set and not hasattr(perturbation, "form"):
            raise ConfigError(f"additive_scale sets the scale of electrical stimulation's additive form; kind "
                              f"{perturbation.kind!r} has no such form: remove additive_scale")
        check_additive_scale(checked.stimulation.additive_scale, getattr(perturbation, "form", None))
    except ConfigError as exc:
        raise ConfigError(f"{where} [stimulation]: {exc}") from None
    return template, perturbation


def _safety(checked, stimulation: dict, where: str) -> dict | None:
    """The safety report of an electrical protocol (refused without an override if it violates a
    limit); None for other perturbations."""
    if stimulation["kind"] != "electrical":
        if checked.safety is not None:
            raise ConfigError(f"{where} [safety]: safety limits apply to electrical stimulation only; this "
                              f"experiment uses {stimulation['kind']!r} — remove [safety]")
        return None
    section = checked.safety or SafetyFile()
    try:
        limits = SafetyLimits(max_shannon_k=section.max_shannon_k, electrode_area_um2=section.electrode_area_um2,
                              max_charge_per_phase_nC=section.max_charge_per_phase_nC)
    except ConfigError as exc:
        raise ConfigError(f"{where} [safety]: {exc}") from None
    stim = perturbation_from_dict({**stimulation, "sites_mm": [[0.0, 0.0]], "layer": checked.layer})
    try:
        report = enforce(stim, limits, override=section.override)
    except SafetyError as exc:
        raise SafetyError(f"{where}: {exc}") from None
    return report.to_dict()


def _comparison(checked, spec: ExperimentSpec, where: str) -> str | None:
    if checked.comparison is None:
        return None
    name = checked.comparison.dataset
    if name not in DATASETS.names():
        raise ConfigError(f"{where} [comparison]: 'dataset' must be one of {DATASETS.names()}, got {name!r}")
    try:
        dataset = DATASETS.get(name)
    except ConfigError as exc:
        raise ConfigError(f"{where} [comparison]: {exc}") from None
    if dataset.paradigm != spec.paradigm:
        raise ConfigError(f"{where} [comparison]: {name!r} is a {dataset.paradigm} experiment; this file's paradigm "
                          f"is {spec.paradigm!r}")
    try:
        dataset.check(spec.settings())
    except ConfigError as exc:
        raise ConfigError(f"{where} [comparison]: {exc}") from None
    return name


def experiment_schema() -> dict:
    """JSON Schema of experiment files of every registered paradigm (one alternative per
    paradigm, chosen by ``paradigm``)."""
    models = [file_model(paradigm) for _, paradigm in PARADIGMS.items()]
    union = Annotated[Union[tuple(models)], Field(discriminator="paradigm")] if len(models) > 1 else models[0]
    schema = TypeAdapter(union).json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "stimsim experiment file",
            "description": "An in-silico stimulation experiment (TOML); see stimsim.paradigms.experiment_file.", **schema}
