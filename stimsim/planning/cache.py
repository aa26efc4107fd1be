"""The plan's phase cache: finished phases as files in ``DIR/cache`` under the simulation store's rules.

Every cached file ``NAME`` (``mapping.json``, ``sequences.npz``, ``rehearsal_<model>.npz``, ``truth.npz``) has a
record ``NAME.sha256`` (JSON) written before the file is moved into place: the file's sha256 and the digest of
exactly the inputs it was computed from — the plan's parameters and input files (``cache/config_digest.txt``),
the files of the subject directory, the candidate models' weights and the cached files of the phases before it.
The record also holds the seconds the phase took to compute (``compute_seconds``). On resume a file is reused only
when both match; one whose checksum or inputs differ, or that is a symbolic
link, not a regular file, without a readable record or unreadable itself, or whose phase wrote files outside the
cache that are gone (the percept view's ``DIR/percepts/``), is reported with a one-line warning naming it and
computed again. A cache made with other parameters or input files is refused, never mixed in.
"""
from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path

import numpy as np

from stimsim.utilities.errors import ConfigError
from stimsim.utilities.hashing import changed_keys, json_sha256, sha256_of
from stimsim.utilities.io import atomic_save, atomic_write_json, is_temporary_file, remove_temporaries
from stimsim.utilities.jsonable import json_value
from stimsim.utilities.progress import report_phase

#: Format tag of a cached file's record.
RECORD_FORMAT = "stimsim-plan-cache/1"
STAMP = "config_digest.txt"
#: What the stamp's digest was computed from, to name what changed when a re-run is refused.
STAMP_RECORD = "config_record.json"
#: Changes a refusal names at most.
SHOWN_CHANGES = 5


class PhaseCache:
    """Finished phases as files in ``DIR/cache``; a cache of another configuration or other input files is an error.
    :meth:`bind` gives the digest of the inputs beyond the configuration (subject files, model weights) before
    any phase is read. A phase taken from the cache is reported on stderr when ``progress`` is true."""

    def __init__(self, out_dir: Path, digest: str, progress: bool = False, record: dict | None = None):
        """``record``: what ``digest`` was computed from (JSON), kept beside it so that a refusal names what changed."""
        self.dir = Path(out_dir) / "cache"
        self.progress = progress
        self.dir.mkdir(parents=True, exist_ok=True)
        stamp = self.dir / STAMP
        if stamp.exists() or stamp.is_symlink():
            try:
                held = stamp.read_text(encoding="utf-8").strip() if stamp.is_file() and not stamp.is_symlink() else None
            except (OSError, UnicodeDecodeError):
                held = None
            if held != digest:
                raise ConfigError(f"{out_dir} holds a plan made with other parameters or input files "
                                  f"(cache/{STAMP}){_what_changed(self.dir / STAMP_RECORD, record)}; use a new --out "
                                  "directory or delete that one")
        remove_temporaries(self.dir)
        atomic_save(stamp, lambda tmp: Path(tmp).write_text(digest + "\n", encoding="utf-8"))
        if record is not None:
            atomic_write_json(self.dir / STAMP_RECORD, record)
        self.digest = digest
        self.inputs = digest
        self.sha256: dict[str, str] = {}  # cached file → its sha256, for the phases after it
        self.timings: dict[str, dict] = {}  # phase → this run's wall seconds, whether cached, compute seconds

    def bind(self, inputs: dict) -> None:
        """Bind every phase to ``inputs`` (a JSON record of digests of what the configuration digest leaves out)."""
        self.inputs = json_sha256({"config": self.digest, **inputs})

    def json(self, name: str, compute, after: tuple[str, ...] = (), outputs: tuple[Path, ...] = ()):
        """The JSON value of phase ``name``, cached as ``name.json``, computed from the phases ``after`` (files);
        ``outputs``: files outside the cache that the phase writes (one missing, the phase is computed again)."""
        def read(path):
            return json.loads(path.read_text(encoding="utf-8"))

        def write(tmp, value):
            text = json.dumps(value, indent=2, sort_keys=True, default=json_value) + "\n"
            Path(tmp).write_text(text, encoding="utf-8")

        return self._phase(f"{name}.json", compute, read, write, after, outputs)

    def arrays(self, name: str, compute, after: tuple[str, ...] = ()) -> dict:
        """The arrays (name → ndarray) of phase ``name``, cached as ``name.npz``."""
        def read(path):
            with np.load(path, allow_pickle=False) as archive:
                return {key: archive[key] for key in archive.files}

        def write(tmp, value):
            with open(tmp, "wb") as handle:
                np.savez(handle, **value)

        return self._phase(f"{name}.npz", compute, read, write, after)

    def _phase(self, file: str, compute, read, write, after, outputs=()):
        path = self.dir / file
        started = time.perf_counter()
        inputs = json_sha256({"inputs": self.inputs, "file": file, "after": {a: self.sha256[a] for a in after}})
        if path.exists() or path.is_symlink():
            problem = self._problem(path, inputs)
            lost = [str(output) for output in outputs if not Path(output).is_file()]
            if problem is None and lost:
                problem = f"describes files that are gone ({', '.join(lost)})"
            if problem is None:
                try:
                    value = read(path)
                except Exception as exc:  # numpy and json raise many types for a damaged file
                    problem = f"cannot be read ({type(exc).__name__}: {exc})"
                else:
                    report_phase(f"plan: reusing cached {path.stem} from {self.dir}", self.progress)
                    record = self._recorded(path)
                    self.sha256[file] = record["sha256"]
                    self._time(path, started, cached=True, compute_seconds=record.get("compute_seconds"))
                    return value
            warnings.warn(f"plan cache file {path} {problem}; it is computed again", stacklevel=3)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        value = compute()
        compute_seconds = time.perf_counter() - started

        def save(tmp):
            write(tmp, value)
            self.sha256[file] = sha256_of(tmp)
            atomic_save(_record_path(path), lambda record: Path(record).write_text(json.dumps(
                {"format": RECORD_FORMAT, "file": file, "sha256": self.sha256[file], "inputs": inputs,
                 "compute_seconds": compute_seconds}, indent=2) + "\n", encoding="utf-8"))

        atomic_save(path, save)
        self._time(path, started, cached=False, compute_seconds=compute_seconds)
        return value

    def _time(self, path: Path, started: float, cached: bool, compute_seconds) -> None:
        """Record phase ``path``'s wall seconds in this run, whether it came from the cache, and the seconds it
        took when it was computed (None for a file cached before records held them)."""
        known = isinstance(compute_seconds, (int, float)) and not isinstance(compute_seconds, bool)
        self.timings[path.stem] = {"seconds": round(time.perf_counter() - started, 3), "cached": cached,
                                   "compute_seconds": round(float(compute_seconds), 3) if known else None}

    def _problem(self, path: Path, inputs: str) -> str | None:
        """None when ``path`` is the file its record describes, computed from ``inputs``; else what is wrong."""
        if path.is_symlink():
            return "is a symbolic link, not a file the plan wrote"
        if not path.is_file():
            return "is not a regular file"
        record = self._recorded(path)
        if record is None:
            return f"has no readable record {_record_path(path).name} of its sha256 and inputs"
        if sha256_of(path) != record["sha256"]:
            return "fails its checksum (its content changed after it was written)"
        if record["inputs"] != inputs:
            return ("was computed from other inputs (the subject directory's files, the models' weights or an "
                    "earlier phase changed since)")
        return None

    @staticmethod
    def _recorded(path: Path) -> dict | None:
        record_path = _record_path(path)
        try:
            if record_path.is_symlink() or not record_path.is_file():
                return None
            record = json.loads(record_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        if (not isinstance(record, dict) or record.get("format") != RECORD_FORMAT
                or not all(isinstance(record.get(key), str) for key in ("sha256", "inputs"))):
            return None
        return record


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def directory_files_sha256(directory) -> dict:
    """sha256 of every regular file directly in ``directory`` (temporary files of a killed write left out)."""
    directory = Path(directory)
    return {entry.name: sha256_of(entry) for entry in sorted(directory.iterdir())
            if entry.is_file() and not is_temporary_file(entry.name)}


def _what_changed(held_record: Path, record: dict | None) -> str:
    """``": changed since: KEY (OLD → NEW); ..."`` between the record kept in the cache and ``record``, or "" when
    either is missing or unreadable, or when they do not differ (the digest covers more)."""
    if record is None:
        return ""
    try:
        held = json.loads(held_record.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return ""
    changes = changed_keys(held, json.loads(json.dumps(record, default=json_value))) if isinstance(held, dict) else []
    if not changes:
        return ""
    more = f" and {len(changes) - SHOWN_CHANGES} more" if len(changes) > SHOWN_CHANGES else ""
    return ": changed since: " + "; ".join(changes[:SHOWN_CHANGES]) + more
