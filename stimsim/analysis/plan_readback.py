"""A finished plan's files read back (``summary.json``, ``truth/subject_p_high.nc``) for sessions and power:
a missing, damaged or inconsistent file is a :class:`~stimsim.utilities.errors.FileFormatError` naming it and the field."""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from stimsim.utilities.errors import ConfigError, DataError, FileFormatError
from stimsim.utilities.hashing import sha256_of
from stimsim.utilities.io import atomic_write_json

#: The virtual subject's results when the summary names none (plans made before ``truth_file`` was recorded).
TRUTH_FILE = "truth/subject_p_high.nc"
TRUTH_DIMS = ("electrode", "stimulated", "sequence", "step")

#: The sha256 of a finished plan's data files (paths relative to the plan directory), written last by
#: ``stimsim plan``; its format name.
PLAN_FILES = "plan_files.json"
PLAN_FILES_FORMAT = "stimsim-plan-files-1"


def write_plan_files(plan_dir, names) -> Path:
    """Record the sha256 of the files ``names`` (relative to ``plan_dir``) in ``plan_dir/plan_files.json``: the
    plan is finished."""
    plan_dir = Path(plan_dir)
    return atomic_write_json(plan_dir / PLAN_FILES, {"format": PLAN_FILES_FORMAT, "finished": True, "files": {
        name: sha256_of(plan_dir / name) for name in sorted(names)}})


def mark_plan_unfinished(plan_dir) -> Path:
    """Mark ``plan_dir`` as being written (``"finished": false`` in plan_files.json) until :func:`write_plan_files`
    lists its files again: a plan stopped while rewriting its outputs is refused, not read half old, half new."""
    return atomic_write_json(Path(plan_dir) / PLAN_FILES, {"format": PLAN_FILES_FORMAT, "finished": False})


def check_plan_files(plan_dir) -> None:
    """FileFormatError naming the first file of ``plan_dir/plan_files.json`` that is missing or changed since
    ``stimsim plan`` wrote it, or the list itself when the plan did not finish writing its outputs. A plan
    directory without the list is not checked: one that ``stimsim plan`` wrote (it has a config.json) is read with
    a warning that says so (the list was deleted, or the plan made before the list existed)."""
    plan_dir = Path(plan_dir)
    manifest_path = plan_dir / PLAN_FILES
    if not manifest_path.is_file():
        if (plan_dir / "config.json").is_file():
            warnings.warn(f"{plan_dir} has no {PLAN_FILES}, the checksums of its files: they are read unchecked "
                          "(run the plan again to have them checked)", stacklevel=2)
        return
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FileFormatError(manifest_path, f"invalid JSON ({exc}); run the plan again") from None
    if isinstance(manifest, dict) and manifest.get("format") == PLAN_FILES_FORMAT and manifest.get("finished") is False:
        raise FileFormatError(manifest_path, "the plan did not finish writing its outputs (it was stopped or failed "
                                             "while writing them); run the same `stimsim plan` command again")
    if not isinstance(manifest, dict) or manifest.get("format") != PLAN_FILES_FORMAT or not isinstance(
            manifest.get("files"), dict):
        raise FileFormatError(manifest_path, f"not a plan's file list (format should be {PLAN_FILES_FORMAT!r})")
    for name, expected in manifest["files"].items():
        path = plan_dir / name
        if not path.is_file():
            raise FileFormatError(path, "missing: the plan directory is incomplete; run the plan again")
        if sha256_of(path) != expected:
            changed = f"changed since `stimsim plan` wrote it (its sha256 differs from the one in {PLAN_FILES})"
            if Path(name).parts[0] == "rig":  # the lab's package: edited where it lies, not damaged
                raise FileFormatError(path, f"{changed}: the plan's rig package is what its trial lists and sessions "
                                            "are checked against; edit a copy outside the plan directory and run "
                                            "that (`stimsim subject session --trials COPY`); running the same `stimsim "
                                            "plan` command again writes the plan's own file back, replacing this one")
            raise FileFormatError(path, f"{changed}: the plan directory is damaged or holds another plan's file; run "
                                        "the plan again")


def refuse_output_into_plan(out_dir, plan_dir) -> None:
    """The results of a command that reads a plan go beside it or into a folder inside it, never into the plan's own
    folder, whose summary.json and report they would replace (``--force`` or not)."""
    if Path(out_dir).resolve() == Path(plan_dir).resolve():
        raise ConfigError(f"--out {out_dir} is the plan directory the command reads; its summary.json and report "
                          "would be replaced: give another folder (e.g. one inside the plan's)")


def plan_checksum(plan_dir) -> dict:
    """What a result made from a plan records of it: ``plan_summary_sha256`` (its summary.json, whose checksums cover
    the plan's other files), or nothing without a plan."""
    if plan_dir is None:
        return {}
    return {"plan_summary_sha256": sha256_of(Path(plan_dir) / "summary.json")}


def not_a_plan(directory: Path) -> str:
    """'; ...' naming what ``directory`` is instead of a plan (a folder inside a plan's directory, another command's
    output), else ''."""
    from stimsim.utilities.io import output_owner

    plan = next((folder for folder in Path(os.path.abspath(directory)).parents
                 if (folder / "sites.csv").is_file() and (folder / "plan.nc").is_file()), None)
    if plan is not None:
        return f"; {directory} is a folder inside the plan directory {plan}: give that directory"
    try:
        owner = None if (directory / "plan.nc").is_file() else output_owner(directory)
    except DataError:  # a damaged manifest: nothing to name
        return ""
    return f"; {directory} holds {owner}, not a plan: give the directory `stimsim plan` wrote" if owner else ""


def read_plan_protocol(plan_dir) -> dict:
    """The protocol the plan's trials run, from its ``config.json``: its resolved ``[stimulation]`` (current_uA,
    frequency_Hz, pulse_width_ms, train_ms, ...) with its ``[session]`` train_onset_ms (ms from image onset)."""
    path = Path(plan_dir) / "config.json"
    if not path.is_file():
        raise FileFormatError(path, "not found; is this a directory written by `stimsim plan`?"
                                    f"{not_a_plan(Path(plan_dir))}")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))["config"]
        stimulation, session = config["stimulation"], config["session"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise FileFormatError(path, "holds no plan configuration with [stimulation] and [session] tables "
                                    f"({exc!r})") from None
    for key, table in (("stimulation", stimulation), ("session", session)):
        if not isinstance(table, dict):
            raise FileFormatError(path, f"field 'config.{key}' must be a table")
    if "train_onset_ms" not in session:
        raise FileFormatError(path, "field 'config.session.train_onset_ms' is missing")
    return {**stimulation, "train_onset_ms": session["train_onset_ms"]}


def read_summary(plan_dir) -> tuple[Path, dict]:
    """The path and content of ``plan_dir/summary.json`` (a JSON object), every file of the plan checked first
    (:func:`check_plan_files`)."""
    path = Path(plan_dir) / "summary.json"
    check_plan_files(plan_dir)  # first: a plan stopped while writing its outputs is said to be one
    if not path.is_file():
        raise FileFormatError(path, "not found; is this a directory written by `stimsim plan`?"
                                    f"{not_a_plan(Path(plan_dir))}")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FileFormatError(path, f"not a plan summary: invalid JSON ({exc})") from None
    if not isinstance(summary, dict):
        raise FileFormatError(path, f"not a plan summary: a JSON {type(summary).__name__}, not an object")
    return path, summary


def summary_number(path: Path, summary: dict, key: str, default=None) -> float:
    """The finite number ``summary[key]`` (``default`` when absent and a default is given)."""
    value = summary.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FileFormatError(path, f"field {key!r} must be a finite number, got {value!r}")
    return float(value)


def summary_lapse_rate(path: Path, summary: dict, default=None) -> float:
    """The virtual subject's lapse rate ``summary['subject_lapse_rate']``: the fraction of trials it chooses at
    random, in [0, 1] (``default`` when absent and a default is given)."""
    lapse_rate = summary_number(path, summary, "subject_lapse_rate", default)
    if not 0 <= lapse_rate <= 1:
        raise FileFormatError(path, f"field 'subject_lapse_rate' must lie in [0, 1], got {lapse_rate:g}")
    return lapse_rate


def summary_electrodes(path: Path, summary: dict, key: str = "chosen_electrodes") -> list[str]:
    """The electrode ids listed at ``summary[key]`` (a non-empty list of text or numbers)."""
    value = summary.get(key)
    if not isinstance(value, list) or not all(isinstance(e, (str, int)) and not isinstance(e, bool) for e in value):
        raise FileFormatError(path, f"field {key!r} must be a list of electrode ids, got {value!r}")
    if not value:
        raise FileFormatError(path, f"field {key!r} lists no electrode: the plan chose no site to stimulate")
    return [str(e) for e in value]


def truth_path(plan_dir, summary_path: Path, summary: dict) -> Path | None:
    """The virtual subject's results of a plan (summary.json's ``truth_file``, a path inside ``plan_dir``), or None
    when the plan was made for a real subject (neither the field nor the file)."""
    name = summary.get("truth_file", TRUTH_FILE)
    if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
        raise FileFormatError(summary_path, f"field 'truth_file' must be a path inside the plan directory, "
                                            f"got {name!r}")
    path = Path(plan_dir) / name
    return path if "truth_file" in summary or path.is_file() else None


def read_subject_p_high(path: Path, electrodes: list[str] | None, summary_path: Path) -> xr.DataArray:
    """The virtual subject's P(high) of ``electrodes`` (all when None) from its results ``path``
    (:func:`truth_path`), dims (electrode, stimulated, sequence, step) with stimulated = [False, True];
    ``summary_path`` is named when it lists an electrode the truth lacks."""
    if not path.is_file():
        raise FileFormatError(path, "not found: the plan's summary names it as the virtual subject's results")
    try:
        with xr.open_dataset(path, engine="h5netcdf") as data:
            p_high = data["subject_p_high"].load() if "subject_p_high" in data else None
    except Exception as exc:  # h5py and xarray raise many types for a damaged file
        raise FileFormatError(path, f"not a readable NetCDF file ({type(exc).__name__}: {exc})") from None
    if p_high is None or set(p_high.dims) != set(TRUTH_DIMS):
        raise FileFormatError(path, f"needs a variable 'subject_p_high' with dims {TRUTH_DIMS} (the subject's P(high) "
                                    "trial by trial; a plan task without it cannot simulate sessions)")
    values = p_high.values
    if not np.all((values >= 0) & (values <= 1)):  # NaN fails too
        raise FileFormatError(path, "'subject_p_high' must hold probabilities in [0, 1] (it holds others or NaN)")
    held = [str(e) for e in p_high["electrode"].values]
    p_high = p_high.assign_coords(electrode=held).transpose(*TRUTH_DIMS)
    flags = sorted(bool(v) for v in p_high["stimulated"].values)
    if flags != [False, True]:
        raise FileFormatError(path, f"'stimulated' must be [False, True], got {flags}")
    if electrodes is None:
        return p_high
    missing = [e for e in electrodes if e not in set(held)]
    if missing:
        raise FileFormatError(summary_path, f"names electrode(s) {missing} that {path} does not hold (it holds "
                                            f"{held[:8]}{' ...' if len(held) > 8 else ''}); the files are not "
                                            "of one plan")
    return p_high.sel(electrode=electrodes)
