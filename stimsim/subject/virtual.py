"""A virtual subject: a topographic model with an array implanted at a hidden pose, recorded while it
views images passively.

Each electrode records the pooled activity of the model units within ``radius_mm`` of its position
on the IT sheet (their mean activation, in units of the standard deviation of IT activations over
the stimulus set), turned into a firing rate ``baseline_rate_Hz + gain_e · pooled`` with a
per-electrode gain (log-normal around ``gain_Hz_per_sd``); a trial's response is a Poisson spike
count in the response window divided by its duration (spikes/s). Dead electrodes record the
baseline's Poisson noise only. Every image is shown ``repeats`` times, each repeat in a new random
order.

Lengths (pose, array pitch, ``radius_mm``) are cortex mm: the model's IT sheet is converted by the
model's own recorded scale (``[subject] cortex_mm_per_model_mm`` overrides it; see
:meth:`stimsim.models.topographic.TopographicModel.in_cortex_mm`),
so a 10×10 Utah array (0.4 mm pitch, 3.6 mm across) spans 1.8 model mm of a 2:1 model's sheet.

A subject directory (``stimsim subject make CONFIG.toml --out DIR``) holds ``subject.toml`` (the
configuration as given), ``recordings.nc`` and ``recordings.nwb`` (the same recordings in both
formats, see :mod:`stimsim.lab.recordings`), ``stimuli.npz`` (the images shown, keyed by stimulus id,
with their labels), ``truth.json`` (model, pose, dead electrodes, gains, seed — for validation
only; a planner never reads it) and, when the configuration's layout is a file, a copy of it (the saved
``subject.toml`` names the copy); :mod:`stimsim.subject.directory` reads and checks those files.
"""
from __future__ import annotations

import glob
import math
import os
import shutil
import tempfile
import tomllib
import warnings
from pathlib import Path

import numpy as np

from stimsim.data.stimuli import StimulusSet, load_stimulus_source
from stimsim.lab.arrays.layout import ArrayLayout, cmp_options, load_layout
from stimsim.lab.arrays.pose import ArrayPose
from stimsim.lab.recordings import Recordings
from stimsim.subject.directory import (SUBJECT_CHECKSUMS, check_subject_files, read_stimuli_npz, read_truth,
                                      write_stimuli_npz)
from stimsim.subject.subject_file import SubjectFile
from stimsim.utilities.config import load_toml, to_toml
from stimsim.utilities.errors import ConfigError, DataError, FileFormatError
from stimsim.utilities.filemodels import validate
from stimsim.utilities.hashing import changed_keys, sha256_of
from stimsim.utilities.io import atomic_write_json, atomic_write_text, provenance
from stimsim.utilities.limits import check_memory

#: IT area label of the models a subject is built from.
IT_AREA = "IT"
#: Peak memory per recorded response (one image presentation at one electrode) while a subject is recorded and
#: written, bytes (measured about 37 recording and 120 writing NetCDF and NWB, with tracemalloc).
RECORDING_BYTES_PER_RESPONSE = 120
#: Changes a refusal to replace a subject names at most.
SHOWN_CHANGES = 5
#: The species NWB files give for a virtual subject.
VIRTUAL_SPECIES = "virtual (stimsim model)"


class VirtualSubject:
    """A model with an implanted array. Build with :meth:`create` (from a configuration dict) or
    :meth:`load` (a subject directory); :meth:`record` simulates passive-viewing recordings."""

    def __init__(self, config: dict, model, layout: ArrayLayout, pose: ArrayPose, dead_electrodes: tuple,
                 gains_Hz_per_sd: dict, recording: dict, seed: int, lapse_rate: float, stimuli_spec: tuple,
                 source: str):
        self.config = config
        self.model = model
        self.layout = layout
        self.pose = pose
        self.dead_electrodes = tuple(dead_electrodes)
        self.gains_Hz_per_sd = dict(gains_Hz_per_sd)
        self.recording = dict(recording)
        self.recording_radius_mm = float(recording["radius_mm"])
        self.seed = int(seed)
        self.lapse_rate = float(lapse_rate)
        self.stimuli_spec = tuple(dict(s) for s in stimuli_spec)
        self.source = source
        self.source_model = model
        self.scale = {"cortex_mm_per_model_mm": 1.0, "model_cortex_mm_per_model_mm": 1.0, "scale_overridden": False}
        self.directory: Path | None = None
        self.config_text: str | None = None
        self.config_dir: Path | None = None
        self._stimuli: StimulusSet | None = None

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def create(cls, config: dict, source: str = "<config>", model=None) -> "VirtualSubject":
        """Build a subject from a configuration (the tables of ``experiments/subject_default.toml``).
        ``source`` names the configuration in error messages; ``model`` replaces the named model
        (an already loaded TopographicModel, e.g. in tests)."""
        from stimsim.models.registry import load_model, model_path

        checked = validate(SubjectFile, config, source, "stimsim subject make")
        seed, lapse_rate = checked.subject.seed, checked.subject.lapse_rate
        if model is None:
            try:
                model_path(checked.subject.model)
            except DataError as exc:
                raise ConfigError(f"{source} [subject]: 'model': {exc}") from None
        source_model = model if model is not None else load_model(checked.subject.model)
        model, scale_record = source_model.in_cortex_mm(IT_AREA, checked.subject.cortex_mm_per_model_mm)
        sheet = model.sheet(IT_AREA)

        array = checked.array
        cmp = cmp_options(array.layout, array.layout_ids, array.pitch_mm, where=f"{source} [array]")
        try:
            layout = load_layout(_resolve(array.layout, source), **cmp)
        except FileNotFoundError as exc:
            raise ConfigError(f"{source} [array] layout: {exc} (a layout file is read relative to the "
                              "configuration file's folder)") from None
        except FileFormatError:  # names the layout file
            raise
        except ConfigError as exc:
            raise ConfigError(f"{source} [array] layout: {exc}") from None
        pose_table, dead_fraction, dead_list = array.pose, array.dead_fraction, array.dead_electrodes

        recording = checked.recording.to_dict()
        x0, x1, y0, y1 = sheet.extent_mm
        span_mm = max(x1 - x0, y1 - y0)
        if recording["radius_mm"] > span_mm:
            scale = scale_record["cortex_mm_per_model_mm"]
            override = (f"; the sheet is this small at [subject] cortex_mm_per_model_mm = {scale:g}, the model's own "
                        f"scale is {scale_record['model_cortex_mm_per_model_mm']:g}"
                        if scale_record["scale_overridden"] else "")
            raise ConfigError(f"{source} [recording]: 'radius_mm' = {recording['radius_mm']:g} is larger than the "
                              f"model's IT sheet (extent {_extent_text(sheet)} mm): every electrode would record the "
                              f"whole sheet; give at most {span_mm:.3g} mm{override}")
        stimuli_spec = [dict(entry) for entry in checked.stimuli]

        rng = np.random.default_rng([seed, 0x5B])
        if pose_table is None:
            try:
                pose = random_pose(layout, sheet, rng, margin_mm=recording["radius_mm"])
            except ConfigError as exc:
                raise ConfigError(f"{source} [array]: {exc}") from None
        else:
            pose = ArrayPose(**pose_table.to_dict())
            off = _electrodes_off_sheet(layout, pose, sheet, 0.0)
            if off:
                more = f" and {len(off) - 8} more" if len(off) > 8 else ""
                raise ConfigError(f"{source} [array] pose: {len(off)} of {len(layout)} electrodes ({', '.join(off[:8])}"
                                  f"{more}) fall off the IT sheet (extent {_extent_text(sheet)} mm) at this pose")
        dead = _dead_electrodes(layout, dead_list, dead_fraction, rng, source)
        gains = np.exp(rng.normal(math.log(max(recording["gain_Hz_per_sd"], 1e-12)), recording["gain_log_sd"],
                                  len(layout))) if recording["gain_Hz_per_sd"] > 0 else np.zeros(len(layout))
        gain_map = {i: (0.0 if i in dead else float(g)) for i, g in zip(layout.electrode_ids, gains)}
        subject = cls(config, model, layout, pose, tuple(i for i in layout.electrode_ids if i in dead), gain_map,
                      recording, seed, lapse_rate, tuple(stimuli_spec), source)
        subject.source_model, subject.scale = source_model, scale_record
        for electrode_id, units in zip(layout.electrode_ids, subject.recorded_units()):
            if len(units) == 0:
                raise ConfigError(f"{source} [recording]: radius_mm = {recording['radius_mm']} reaches no model unit "
                                  f"from electrode {electrode_id!r}; use a larger radius")
        return subject

    @classmethod
    def from_file(cls, path, model=None) -> "VirtualSubject":
        """Build a subject from a configuration file (TOML); a model directory and image folders or tables named by
        relative paths are read from the file's folder."""
        from stimsim.models.registry import resolve_model_path

        path = Path(path)
        config = load_toml(path)
        relative = [entry for entry in config.get("stimuli", ()) if isinstance(entry, dict)
                    and isinstance(entry.get("path"), str) and not Path(entry["path"]).is_absolute()]
        for entry in relative:  # a folder or table of the lab's images, named relative to this file's folder
            entry["path"] = str((path.parent / entry["path"]).resolve())
        table = config.get("subject")
        given = table.get("model") if isinstance(table, dict) else None
        resolved = resolve_model_path(given, path.parent)
        model_dir = resolved != given
        if model_dir:  # a model directory, named relative to this file's folder
            table["model"] = resolved
        subject = cls.create(config, source=str(path), model=model)
        if subject.recording["repeats"] < 2:
            warnings.warn(f"{path} [recording]: repeats = 1: a plan on this subject needs [array] min_reliability "
                          "= -1 (split-half reliability needs 2 or more presentations of every image)", stacklevel=2)
        subject.config_text = None if relative or model_dir else path.read_text()  # saved with the paths resolved
        subject.config_dir = path.parent
        return subject

    @classmethod
    def load(cls, directory, model=None) -> "VirtualSubject":
        """A subject from its directory (made by :meth:`save` or ``stimsim subject make``)."""
        directory = Path(directory)
        missing = [name for name in ("subject.toml", "truth.json") if not (directory / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{directory} is not a subject directory: missing {missing}")
        check_subject_files(directory)
        config = load_toml(directory / "subject.toml")
        layout, pose, dead, gains = read_truth(directory / "truth.json")
        subject = cls.create(config, source=str(directory / "subject.toml"), model=model)
        subject.layout, subject.pose, subject.dead_electrodes, subject.gains_Hz_per_sd = layout, pose, dead, gains
        subject.directory = directory
        return subject

    # --- the implant ----------------------------------------------------------------------
    @property
    def sheet(self):
        return self.model.sheet(IT_AREA)

    @property
    def working_electrodes(self) -> tuple:
        return tuple(i for i in self.layout.electrode_ids if i not in self.dead_electrodes)

    def electrode_sites_mm(self) -> dict:
        """Electrode id → its true position on the IT sheet in cortex mm (the frame of the pose and of
        ``self.model``'s sheet)."""
        sites = self.layout.on_sheet(self.pose)
        return {i: (float(x), float(y)) for i, (x, y) in zip(self.layout.electrode_ids, sites)}

    def electrode_sites_model_mm(self) -> dict:
        """Electrode id → its true position in the model's own sheet mm (cortex mm / cortex_mm_per_model_mm)."""
        sheet = self.model.sheet(IT_AREA)
        return {i: tuple(float(v) for v in sheet.to_model_mm(point)) for i, point in self.electrode_sites_mm().items()}

    def recorded_units(self) -> list:
        """For every electrode (layout order), the indices of the IT units within the recording radius."""
        return [self.sheet.units_within(point, self.recording_radius_mm) for point in self.layout.on_sheet(self.pose)]

    def stimuli(self) -> StimulusSet:
        """The images this subject is shown (from ``stimuli.npz`` in its directory, or built from the
        configuration's [[stimuli]] definition)."""
        if self._stimuli is None:
            if self.directory is not None and (self.directory / "stimuli.npz").is_file():
                self._stimuli = read_stimuli_npz(self.directory / "stimuli.npz")
            else:
                from stimsim.models.preprocessing import input_geometry_notes

                self._stimuli = build_stimuli(self.stimuli_spec, self.source)
                for message in input_geometry_notes(self._stimuli, self.model.preprocessing.size_px,
                                                    f"{self.source} [[stimuli]]"):
                    warnings.warn(message, stacklevel=2)
        return self._stimuli

    # --- recording ------------------------------------------------------------------------
    def expected_rates_Hz(self, images) -> np.ndarray:
        """(N_images, N_electrodes) noise-free firing rates (spikes/s) of every electrode.

        The activation scale (SD of IT activations) is that of the images given."""
        activations = self.model.activations(images, IT_AREA).numpy().astype(np.float64)
        scale = activations.std()
        if not scale > 0:
            raise ConfigError("the model's IT activations do not vary over these images; cannot record")
        pooled = np.column_stack([activations[:, units].mean(1) for units in self.recorded_units()]) / scale
        gains = np.array([self.gains_Hz_per_sd[i] for i in self.layout.electrode_ids])
        return self.recording["baseline_rate_Hz"] + np.maximum(pooled, 0.0) * gains

    def record(self, stimuli: StimulusSet | None = None, repeats: int | None = None,
               seed: int | None = None) -> Recordings:
        """Simulate a passive-viewing session: every image ``repeats`` times, one block per repeat in a
        new random order; Poisson spike counts in the response window (spikes/s)."""
        stimuli = stimuli if stimuli is not None else self.stimuli()
        repeats = int(repeats if repeats is not None else self.recording["repeats"])
        if repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {repeats}")
        rng = np.random.default_rng([self.seed if seed is None else seed, 0x7EC])
        rates = self.expected_rates_Hz(stimuli.images)
        order = np.concatenate([rng.permutation(len(stimuli)) for _ in range(repeats)])
        window_s = (self.recording["window_ms"][1] - self.recording["window_ms"][0]) / 1000.0
        expected = rates[order]
        if self.recording["noise"] == "poisson":
            responses = rng.poisson(expected * window_s) / window_s
        else:
            responses = expected
        attrs = {"units": "spikes/s", "window_ms": f"{self.recording['window_ms'][0]:g}-"
                                                   f"{self.recording['window_ms'][1]:g}",
                 "subject": "virtual"}
        return Recordings.from_arrays(responses, stimuli.stimulus_id[order], self.layout, attrs)

    @property
    def subject_id(self) -> str:
        """The animal's id in sessions and NWB files, from its model and seed: two virtual subjects made from other
        models or seeds have other ids, so that a session of one is not analysed against a plan for the other."""
        return f"virtual-{self.model.name}-seed{self.seed}"

    # --- files ----------------------------------------------------------------------------
    def truth(self) -> dict:
        """What only validation may read: model, pose, dead electrodes, gains, seed."""
        return {"model": self.config["subject"]["model"], "pose": self.pose.to_dict(),
                "dead_electrodes": list(self.dead_electrodes), "array": self.layout.name,
                "layout": self.layout.to_dict(), "recording_radius_mm": self.recording_radius_mm,
                "gains_Hz_per_sd": self.gains_Hz_per_sd, "seed": self.seed, "lapse_rate": self.lapse_rate,
                "electrode_sites_mm": self.electrode_sites_mm(),
                "electrode_sites_model_mm": self.electrode_sites_model_mm(), **self.scale,
                "provenance": provenance()}

    def saved_config(self) -> tuple[str, Path | None]:
        """The text :meth:`save` writes as ``subject.toml``, and the layout file it copies beside it (None for a Utah
        kind), which that text names by the copy's name."""
        text, config, layout_file = self.config_text, self.config, None
        if self.config_dir is not None:
            layout_spec = config.get("array", {}).get("layout", "10x10")
            resolved = _resolve(layout_spec, self.config_dir)
            if _is_layout_file(layout_spec) and Path(resolved).is_file():
                layout_file = Path(resolved)
                config = {**config, "array": {**config["array"], "layout": layout_file.name}}
                text = None
        return (text if text is not None else to_toml(config)), layout_file

    def save(self, directory, recordings: Recordings | None = None) -> Path:
        """Write the subject directory (config, recordings in NetCDF and NWB, images, truth). Every file
        is written into a temporary folder beside it first and moved in only when all of them are complete; the
        temporary folders of a killed save of this directory are removed."""
        directory = Path(directory)
        stimuli = self.stimuli()
        if recordings is None:
            repeats, n_electrodes = self.recording["repeats"], len(self.layout)
            check_memory(f"{self.source} [recording]: recording {len(stimuli)} images × {repeats} repeats × "
                         f"{n_electrodes} electrodes", RECORDING_BYTES_PER_RESPONSE * len(stimuli) * repeats
                         * n_electrodes, "[recording] repeats or the images of [[stimuli]]")
            recordings = self.record(stimuli)
        text, layout_file = self.saved_config()
        directory.parent.mkdir(parents=True, exist_ok=True)
        prefix = f".{directory.name}.staging.tmp"
        for left in directory.parent.glob(f"{glob.escape(prefix)}*"):
            shutil.rmtree(left, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=prefix, dir=directory.parent))
        try:
            if layout_file is not None:
                shutil.copyfile(layout_file, staging / layout_file.name)
            atomic_write_text(staging / "subject.toml", text)
            write_stimuli_npz(staging / "stimuli.npz", stimuli)
            recordings.save_netcdf(staging / "recordings.nc")
            recordings.save_nwb(staging / "recordings.nwb", subject_id=self.subject_id, species=VIRTUAL_SPECIES)
            atomic_write_json(staging / "truth.json", self.truth())
            atomic_write_json(staging / SUBJECT_CHECKSUMS, {"files_sha256": {
                path.name: sha256_of(path) for path in sorted(staging.iterdir())}})
            directory.mkdir(exist_ok=True)
            # truth.json first: a move that was stopped halfway leaves a directory recognisable as a subject's
            for path in sorted(staging.iterdir(), key=lambda path: (path.name != "truth.json", path.name)):
                os.replace(path, directory / path.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.directory = directory
        return directory


def check_same_subject(directory, subject: VirtualSubject) -> None:
    """Refuse to replace the subject ``directory`` holds by ``subject`` when its configuration (``subject.toml``, read
    as TOML: comments and formatting aside) or its copied layout file differ, naming what changed: its hidden truth,
    which plans and sessions may rest on, is not replaced by mistake. A directory without ``subject.toml`` passes."""
    directory = Path(directory)
    held = directory / "subject.toml"
    if not held.is_file():
        return
    text, layout_file = subject.saved_config()
    try:
        saved = load_toml(held)
    except FileFormatError as exc:  # damaged after it was made: what it held cannot be compared
        raise ConfigError(f"output directory {directory} holds a virtual subject whose saved configuration cannot be "
                          f"read ({exc.problem}: {held}); give a new --out directory, or --force to replace it (its "
                          "truth.json and recordings are overwritten)") from None
    changes = changed_keys(saved, tomllib.loads(text))
    if layout_file is not None and (directory / layout_file.name).is_file() \
            and sha256_of(directory / layout_file.name) != sha256_of(layout_file):
        changes.append(f"the layout file {layout_file.name}")
    if changes:
        shown = "; ".join(changes[:SHOWN_CHANGES]) + (f" and {len(changes) - SHOWN_CHANGES} more"
                                                      if len(changes) > SHOWN_CHANGES else "")
        raise ConfigError(f"output directory {directory} holds a virtual subject made from another configuration "
                          f"(changed since: {shown}); give a new --out directory, or --force to replace it (its "
                          "truth.json and recordings are overwritten)")


# --------------------------------------------------------------------------- helpers


def random_pose(layout: ArrayLayout, sheet, rng: np.random.Generator, margin_mm: float = 0.0) -> ArrayPose:
    """A pose drawn uniformly: rotation in [0, 360) deg, then the centre uniformly among the positions
    where every electrode lies at least ``margin_mm`` inside the sheet's bounding box."""
    x0, x1, y0, y1 = sheet.extent_mm
    for _ in range(100):
        rotation = float(rng.uniform(0.0, 360.0))
        rotated = ArrayPose(0.0, 0.0, rotation).apply(layout.positions_mm)
        low = np.array([x0, y0]) + margin_mm - rotated.min(0)
        high = np.array([x1, y1]) - margin_mm - rotated.max(0)
        if np.all(high >= low):
            x, y = rng.uniform(low, high)
            return ArrayPose(float(x), float(y), rotation)
    raise ConfigError(f"array {layout.name!r} ({2 * layout.radius_mm:.2f} mm across) does not fit on the IT sheet "
                      f"(extent {_extent_text(sheet)} mm, margin {margin_mm} mm) at any pose")


def build_stimuli(spec, source: str = "subject configuration", table: str = "[[stimuli]]") -> StimulusSet:
    """The image set of a [[stimuli]] definition: the sets in order, keeping the labels they share (a set given
    ``labels`` gains the ones it lacks). Errors name ``source`` (the configuration file) and ``table`` (where the
    definition sits in it)."""
    try:
        sets = [load_stimulus_source(entry) for entry in spec]
        if len(sets) == 1:
            return sets[0]
        shared = set.intersection(*(set(s.labels) for s in sets))
        sets = [StimulusSet(s.name, s.images, s.stimulus_id, {k: v for k, v in s.labels.items() if k in shared})
                for s in sets]
        return StimulusSet.concat(*sets)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(f"{source} {table}: {exc}") from None


def _electrodes_off_sheet(layout, pose, sheet, margin_mm) -> list:
    return [i for i, point in zip(layout.electrode_ids, layout.on_sheet(pose)) if not sheet.contains(point, margin_mm)]


def _extent_text(sheet) -> str:
    x0, x1, y0, y1 = sheet.extent_mm
    return f"x {x0:.2f}–{x1:.2f}, y {y0:.2f}–{y1:.2f}"


def _dead_electrodes(layout, dead_list, dead_fraction, rng, source) -> set:
    if dead_list is not None:
        ids = [str(i) for i in dead_list]
        unknown = [i for i in ids if i not in layout.electrode_ids]
        if unknown:
            raise ConfigError(f"{source} [array] dead_electrodes: unknown electrode id(s) {unknown}; the layout "
                              f"{layout.name!r} has ids {layout.electrode_ids[0]}…{layout.electrode_ids[-1]}")
        if set(ids) >= set(layout.electrode_ids):
            raise ConfigError(f"{source} [array] dead_electrodes: lists every electrode of the layout "
                              f"{layout.name!r} ({len(layout)}), leaving no working electrode; list fewer")
        return set(ids)
    n_dead = int(round(dead_fraction * len(layout)))
    if n_dead == len(layout):
        raise ConfigError(f"{source} [array] dead_fraction: {dead_fraction:g} of the {len(layout)} electrodes of "
                          f"{layout.name!r} rounds to all of them, leaving no working electrode; give at most "
                          f"{(len(layout) - 1) / len(layout):.4g}")
    return set(rng.choice(np.asarray(layout.electrode_ids), size=n_dead, replace=False).tolist())


def _is_layout_file(spec) -> bool:
    """Whether an ``[array] layout`` names a layout file (.csv, .cmp) rather than a Utah kind."""
    return str(spec).lower().endswith((".csv", ".cmp"))


def _resolve(spec: str, base) -> str:
    """A layout file named relative to the configuration file's folder, or a Utah kind as given."""
    if _is_layout_file(spec):
        base_dir = Path(base) if Path(base).is_dir() else Path(str(base)).parent
        candidate = Path(spec)
        if not candidate.is_absolute() and (base_dir / candidate).is_file():
            return str(base_dir / candidate)
    return str(spec)
