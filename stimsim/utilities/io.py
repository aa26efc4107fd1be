"""Small file utilities: atomic writes, result sets, provenance of results.

Every file is written through a temporary sibling (``.NAME.<random>.tmp…``) and a rename, with the
permissions the user's umask gives new files (colleagues on a shared server can read results when
the umask allows it). :class:`ResultSet` writes the files of one result (a run's results, summary,
config and figures) as one set: a manifest ``result_set.json`` is written last with the sha256 of
every file, :func:`read_result_set` refuses a set whose files do not match it, and a directory that
holds files stimsim did not write is refused unless the caller forces it.

Over 500 lines: the atomic writes, the result sets and the checks of output directories share one convention of
temporary files (the checks recognise and remove those a killed write left)."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import warnings
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from stimsim.utilities.errors import ConfigError, DataError, FileFormatError
from stimsim.utilities.hashing import changed_keys, sha256_of
from stimsim.utilities.jsonable import json_value
from stimsim.utilities.locking import LOCK_FILE, checked_output_path, missing_directories

#: File of a result set's manifest (written last).
RESULT_SET_FILE = "result_set.json"
RESULT_SET_FORMAT = "stimsim-result-set/1"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temp_file(path: Path) -> str:
    """A new empty temporary file beside ``path`` with the permissions of a new file under the umask."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    return tmp


def is_temporary_file(name: str) -> bool:
    """Whether ``name`` is a temporary file of an atomic write (left behind only by a killed process)."""
    return name.startswith(".") and ".tmp" in name


def remove_temporaries(*directories) -> None:
    """Remove the temporary files a killed write left directly in ``directories`` (only while this run holds
    the output directory, so no other run is writing them)."""
    for directory in directories:
        directory = Path(directory)
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if is_temporary_file(entry.name) and (entry.is_file() or entry.is_symlink()):
                entry.unlink(missing_ok=True)


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename, so a killed process
    leaves either the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_file(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path, obj, sort_keys: bool = True) -> Path:
    """``obj`` as indented JSON; ``sort_keys=False`` keeps the dicts' own key order."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=sort_keys, default=json_value) + "\n")


def csv_text(frame, significant_digits: int = 6) -> str:
    """A pandas DataFrame as CSV text for people, without its index: floats to ``significant_digits``
    significant digits (0.6 for 0.6000000000000001; the full values stay in the netCDF and JSON files)."""
    return frame.to_csv(index=False, float_format=f"%.{significant_digits}g")


def atomic_save(path, save_fn) -> Path:
    """Call ``save_fn(tmp_path)`` and move the result onto ``path`` atomically (for writers
    that need a file name, e.g. ``torch.save`` or ``xarray.Dataset.to_netcdf``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_file(path)
    try:
        save_fn(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_together(directory, savers: dict, before_moves=None) -> list[Path]:
    """Write the files ``savers`` names (name → ``save_fn(temporary path)``) into ``directory`` as one step: every
    file is saved to a temporary sibling, then ``before_moves()`` (when given) runs and all are moved into place, so
    a process stopped while they are saved leaves the earlier files of those names as they were."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    staged = {}
    try:
        for name, save_fn in savers.items():
            staged[name] = _temp_file(directory / name)
            save_fn(staged[name])
        if before_moves is not None:
            before_moves()
        for name, tmp in staged.items():
            os.replace(tmp, directory / name)
    except BaseException:
        for tmp in staged.values():
            Path(tmp).unlink(missing_ok=True)
        raise
    return [directory / name for name in staged]


def software_versions() -> dict:
    """Versions of Python, stimsim and the libraries results depend on, stimsim's ``commit`` (:func:`checkout_commit`
    of the checkout it runs from; None when installed), and ``plugins``: the packages whose plug-ins (paradigms,
    perturbation kinds, model families, ...) this process loaded, name → version (only when it loaded some)."""
    import h5py
    import numpy
    import scipy
    import sklearn
    import torch
    import torchvision
    import xarray

    import stimsim
    from stimsim.utilities.plugins import plugin_packages

    versions = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "stimsim": stimsim.__version__,
        "commit": checkout_commit(Path(stimsim.__file__).resolve().parents[1]),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "scikit-learn": sklearn.__version__,
        "xarray": xarray.__version__,
        "h5py": h5py.__version__,
        # read from their installed metadata, without importing them: the tables, statistics and NWB files
        **{name: metadata.version(name) for name in ("pandas", "statsmodels", "pynwb", "hdmf", "h5netcdf")},
    }
    plugins = plugin_packages()
    return {**versions, "plugins": plugins} if plugins else versions


def checkout_commit(repository: Path) -> str | None:
    """The checkout's commit, ``+modified`` where its tracked files differ from it; None where ``repository`` is
    not the top of a git checkout (an installed package inside some other repository's folder)."""
    if not (repository / ".git").exists():
        return None
    def git(*arguments):
        return subprocess.run(["git", *arguments], cwd=repository, capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        return commit + ("+modified" if git("status", "--porcelain", "--untracked-files=no").strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def provenance(config: dict | None = None) -> dict:
    """What to store beside a result so it can be reproduced: config, versions, time (UTC), and the CPU threads
    torch computed with (``torch_threads``: sums over threads round in another order, so a long optimisation,
    such as a model build, is reproduced bit for bit only with the same count)."""
    import torch

    return {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "software": software_versions(),
        "torch_threads": torch.get_num_threads(),
        "config": config or {},
    }


# --- result sets -----------------------------------------------------------------------------
class ResultSet:
    """The files of one result, written into ``directory`` as one set.

    ``ResultSet(directory, kind, keep=("simulation_store",), force=False)`` checks the directory: it
    may be new or empty, or hold a set of the same kind stimsim wrote before (the files its manifest names, the
    entries in ``keep`` and temporary files of a killed write, which are removed); other files are refused with
    :class:`~stimsim.utilities.errors.ConfigError` unless ``force`` is true, and what another command keeps there (a
    set of another kind, a plan, a virtual subject, a training run) is refused even then. The caller holds the
    directory's
    :class:`~stimsim.utilities.locking.DirectoryLock`. :meth:`claim` (or ``result_set / name``)
    records a file's name before the caller writes it atomically, so a killed run's files stay
    recognisable as stimsim's; :meth:`write` and :meth:`write_json` claim and write in one call;
    :meth:`finish` removes the files of an older set that this one did not write, and writes the
    manifest with the sha256 of every file last. A finished older set stays complete (and readable, even after a
    ``kill -9``) until this set claims its first file; from then until :meth:`finish` the directory holds no complete
    set, so :meth:`write_together` saves all files before it claims any.
    Used as a context manager (``with ResultSet(...) as results:``), a run that fails before it wrote
    any file of the set leaves the directory as it found it (:meth:`abandon`).

    ``inputs`` (a JSON-able dict: the configuration as run) is kept in the manifest; a finished set of the same
    kind made from other inputs is replaced with a warning that names what changed, given before any work, so that
    the older set can still be kept by stopping the run.
    """

    def __init__(self, directory, kind: str, keep: tuple[str, ...] = (), force: bool = False,
                 inputs: dict | None = None):
        directory = checked_output_path(directory)
        self.directory, self.kind, self.keep = directory, kind, tuple(keep)
        self.inputs = None if inputs is None else json.loads(json.dumps(inputs, default=json_value))
        manifest = directory / RESULT_SET_FILE
        previous = _read_manifest(directory) if manifest.is_file() else None
        owner = _other_owner(directory, kind, previous)
        if owner is not None:
            raise _another_commands_directory(directory, owner)
        if previous is not None:
            self._warn_replaced_inputs(previous)
        self._previous_manifest = manifest.read_bytes() if previous else None  # put back if the run fails early
        self._previous = set(previous["files"]) if previous else set()
        self._created = missing_directories(directory)
        if directory.is_dir():
            foreign = sorted(entry.name for entry in directory.iterdir()
                             if entry.name not in self._previous | set(self.keep) | {RESULT_SET_FILE, LOCK_FILE}
                             and not is_temporary_file(entry.name))
            if foreign and not force:
                shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
                raise ConfigError(f"output directory {directory} holds files stimsim did not write ({shown}); "
                                  "give a new or empty directory, or force overwriting (--force)")
            if not foreign:  # only stimsim's set is there: the temporary files are its own
                remove_temporaries(directory)
        ensure_output_dir(directory)
        self._claimed: list[str] = []
        if not (previous or {}).get("complete"):  # a finished set stays readable until a file of this one is claimed
            self._write_manifest(complete=False)

    def claim(self, name: str) -> Path:
        """Record ``name`` (a plain file name) as a file of this set and return its path; the caller
        writes it there atomically. ``result_set / name`` does the same."""
        _check_result_name(name)
        if name not in self._claimed:
            self._claimed.append(name)
            self._write_manifest(complete=False)
        return self.directory / name

    __truediv__ = claim

    def write(self, name: str, save_fn) -> Path:
        """Write the file ``name`` by ``save_fn(temporary path)`` and a rename (see :func:`atomic_save`)."""
        return atomic_save(self.claim(name), save_fn)

    def write_json(self, name: str, obj, sort_keys: bool = True) -> Path:
        return atomic_write_json(self.claim(name), obj, sort_keys=sort_keys)

    def write_together(self, savers: dict) -> list[Path]:
        """Write the files ``savers`` names (name → ``save_fn(temporary path)``) as one step (:func:`save_together`),
        claiming them only once all are saved. A run stopped while they are saved leaves the directory as it found
        it (an older set complete, :meth:`abandon`); only one stopped in the moment of the moves leaves a mixture,
        which the manifest marks incomplete."""
        for name in savers:
            _check_result_name(name)

        def claim_all():
            new = [name for name in savers if name not in self._claimed]
            if new:
                self._claimed += new
                self._write_manifest(complete=False)

        return save_together(self.directory, savers, before_moves=claim_all)

    def write_csv(self, name: str, frame) -> Path:
        """Write a DataFrame as :func:`csv_text` gives it."""
        return atomic_write_text(self.claim(name), csv_text(frame))

    def finish(self) -> Path:
        """Remove the older set's files this set did not rewrite, then write the manifest with the
        sha256 of every file of the set."""
        absent = [name for name in self._claimed if not (self.directory / name).is_file()]
        if absent:
            raise RuntimeError(f"result set in {self.directory}: files {absent} were announced but not written")
        for stale in sorted(self._previous - set(self._claimed)):
            (self.directory / stale).unlink(missing_ok=True)
        self._write_manifest(complete=True)
        return self.directory / RESULT_SET_FILE

    def abandon(self) -> None:
        """Undo what this set did to its directory when the run fails before writing any file of it:
        the older set's manifest is put back (or the new manifest removed), and the directories this set
        created are removed if nothing else is in them (e.g. a resumable store the run began is kept).
        Once a file of the set was claimed, nothing is undone."""
        if self._claimed:
            return
        manifest = self.directory / RESULT_SET_FILE
        if self._previous_manifest is not None:
            atomic_write_bytes(manifest, self._previous_manifest)
        else:
            manifest.unlink(missing_ok=True)
        for directory in self._created:  # deepest first
            try:
                directory.rmdir()
            except OSError:  # not empty: it holds something the run kept
                return

    def __enter__(self) -> "ResultSet":
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if exc_type is not None:
            self.abandon()
        return False

    def _warn_replaced_inputs(self, previous: dict) -> None:
        """Warn when the finished set ``previous`` (its manifest) was made from other inputs than this one's."""
        held = previous.get("inputs")
        if not previous.get("complete") or not isinstance(held, dict) or self.inputs is None or held == self.inputs:
            return
        changes = changed_keys(held, self.inputs)
        shown = "; ".join(changes[:4]) + (f" and {len(changes) - 4} more" if len(changes) > 4 else "")
        warnings.warn(f"output directory {self.directory} holds results ({self.kind}) made from other inputs "
                      f"({shown}); this run replaces them (stop it now and give another directory to keep them)",
                      stacklevel=3)

    def _write_manifest(self, complete: bool) -> None:
        if complete:
            files = {name: sha256_of(self.directory / name) for name in sorted(self._claimed)}
        else:
            files = {name: None for name in sorted(self._previous | set(self._claimed))}
        manifest = {"format": RESULT_SET_FORMAT, "kind": self.kind, "complete": complete, "files": files}
        if self.inputs is not None:
            manifest["inputs"] = self.inputs
        atomic_write_json(self.directory / RESULT_SET_FILE, manifest)


def _check_result_name(name) -> None:
    """A result file's name must be a plain name inside the directory, not the manifest's."""
    if not isinstance(name, str) or Path(name).name != name or name in (RESULT_SET_FILE, ".", ".."):
        raise ValueError(f"result file names are plain names inside the directory, got {name!r}")


def read_json(path):
    """The content of the JSON file ``path``; a file that is not UTF-8 JSON raises FileFormatError naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FileFormatError(path, f"not valid JSON ({exc})") from None


def check_output_dir(directory) -> Path:
    """Check, without creating anything, that the output directory ``directory`` could be written:
    an empty path, a file, a path under a file or an unwritable place raise ConfigError."""
    directory = checked_output_path(directory)
    existing = directory.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"cannot write into output directory {directory}: {existing} is a file")
    try:  # a probe file, not os.access: that says yes to root on read-only and virtual file systems (/proc)
        Path(_temp_file(existing / ".write_probe")).unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write into output directory {directory}: {existing} is not writable "
                          f"({exc.strerror or exc})") from None
    return directory


def check_output_file(path) -> Path:
    """Check, leaving nothing behind, that the file ``path`` could be written (a new file, or one to
    replace): an empty path, a directory, or a folder that cannot be made or written raise ConfigError."""
    if not str(path).strip():
        raise ConfigError("the output file name is empty text; give a file path")
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"output file {path} is a directory; give a file name")
    check_output_dir(path.parent)
    return path


def ensure_output_dir(directory) -> Path:
    """Create the output directory ``directory`` if needed and check that files can be written in it;
    an empty path, a file, a path under a file or an unwritable directory raise ConfigError."""
    directory = checked_output_path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        Path(_temp_file(directory / ".write_probe")).unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write into output directory {directory}: {exc.strerror or exc}") from None
    return directory


def holds_unfinished_result_set(directory) -> bool:
    """Whether ``directory`` holds a result set whose manifest marks it incomplete (a run stopped while writing it)."""
    try:
        return (Path(directory) / RESULT_SET_FILE).is_file() and not _read_manifest(Path(directory)).get("complete")
    except (DataError, OSError):
        return False


def read_result_set(directory, required: tuple[str, ...] = ()) -> dict[str, Path]:
    """The files of the complete result set in ``directory`` (name → path), each checked against
    the manifest's sha256; a missing, incomplete or mismatched set raises DataError."""
    directory = Path(directory)
    if not (directory / RESULT_SET_FILE).is_file():
        raise DataError(f"{directory} holds no finished result set (no {RESULT_SET_FILE}); the run did not finish "
                        "or the directory was not written by stimsim")
    manifest = _read_manifest(directory)
    if not manifest.get("complete"):
        raise DataError(f"{directory}: the result set is incomplete (the run writing it did not finish); run it again")
    missing = [name for name in required if name not in manifest["files"]]
    if missing:
        raise DataError(f"{directory}: the result set has no {missing}")
    paths = {}
    for name, expected in manifest["files"].items():
        path = directory / name
        if Path(name).name != name or not path.is_file():
            raise DataError(f"{directory}: {name} of the result set is missing")
        if sha256_of(path) != expected:
            raise DataError(f"{path} does not belong to the result set in {directory} (its sha256 differs from "
                            f"the one in {RESULT_SET_FILE}: it was changed or written by another run)")
        paths[name] = path
    return paths


#: Files that mark a directory as written by a stimsim command that keeps no result set, and what it holds.
_OWNER_MARKS = ((Path("cache") / "config_digest.txt", "a plan (`stimsim plan`)"),
                (Path("truth.json"), "a virtual subject (`stimsim subject make`)"),
                (Path("training_run.json"), "a training run (`stimsim train`)"),
                (Path("training_config.json"), "a training run (`stimsim train`)"))


def output_owner(directory) -> str | None:
    """What a stimsim command keeps in ``directory`` (a result set, a plan, a virtual subject, a training run, finished
    or to resume), in words, or None: a folder another command writes loose files into refuses it."""
    directory = Path(directory)
    if (directory / RESULT_SET_FILE).is_file():
        return _results_of(_read_manifest(directory))
    return _marked_owner(directory)


def enclosing_output_owner(path) -> str | None:
    """What a stimsim command keeps in the folder of the file ``path`` or the one above it (a plan's
    ``rig/trials.csv`` is a plan's), in words, or None."""
    folders = Path(path).absolute().parents[:2]
    return next((owner for folder in folders if (owner := output_owner(folder)) is not None), None)


def check_not_another_commands(directory, own_marks: tuple[str, ...]) -> None:
    """Refuse, forced or not, an output ``directory`` that holds what another stimsim command keeps there
    (:func:`output_owner`) and none of ``own_marks`` (the files every directory of the calling command holds): its
    files would be overwritten by ones of the same names, and its result set would no longer read back."""
    directory = Path(directory)
    if not directory.is_dir() or any((directory / mark).is_file() for mark in own_marks):
        return
    owner = output_owner(directory)
    if owner is not None:
        raise _another_commands_directory(directory, owner)


def _another_commands_directory(directory: Path, owner: str) -> ConfigError:
    return ConfigError(f"output directory {directory} holds {owner}; give another --out directory (--force does not "
                       "write into another command's output, whose files would be overwritten)")


def _other_owner(directory: Path, kind: str, previous: dict | None) -> str | None:
    """What another stimsim command keeps in ``directory`` (a result set of another kind, a plan, a virtual subject,
    a training run), in words, or None."""
    if previous is not None:
        return None if previous.get("kind") == kind else _results_of(previous)
    return _marked_owner(directory)


#: The command that writes each kind of result set, in words.
_KIND_OWNERS = {"experiment run": "an experiment run (`stimsim run`)",
                "model scores": "a model's scores (`stimsim models score`)",
                "percepts": "predicted percepts (`stimsim visualize`)",
                "analysis": "an analysis (`stimsim analyze`)",
                "power": "a power analysis (`stimsim power`)"}


def _results_of(manifest: dict) -> str:
    kind = manifest.get("kind")
    return _KIND_OWNERS.get(kind, f"the results of another command ({kind})")


#: The folders a plan writes inside its own directory (its cache, rig package, subject and truth): a folder in one of
#: them is the plan's, as the directory is (a plan's other sub-folders, such as ``power``, are free for outputs).
_PLAN_FOLDERS = ("cache", "rig", "subject", "truth")


def _marked_owner(directory: Path) -> str | None:
    """The command whose mark file (:data:`_OWNER_MARKS`) ``directory`` holds, in words, or None; a folder in one of a
    plan's own folders (:data:`_PLAN_FOLDERS`) is the plan's."""
    owner = next((owner for mark, owner in _OWNER_MARKS if (directory / mark).is_file()), None)
    if owner is None:
        path = Path(os.path.abspath(directory))  # "plan/rig/../power" is the plan's power folder
        plan_mark, plan_owner = _OWNER_MARKS[0]
        plan = next((folder for folder in path.parents if (folder / plan_mark).is_file()), None)
        if plan is not None and path.parts[len(plan.parts)] in _PLAN_FOLDERS:
            owner = plan_owner
    return owner


def _read_manifest(directory: Path) -> dict:
    path = directory / RESULT_SET_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a result set manifest ({exc})") from None
    if (not isinstance(manifest, dict) or manifest.get("format") != RESULT_SET_FORMAT
            or not isinstance(manifest.get("files"), dict)):
        raise DataError(f"{path}: not a result set manifest (format should be {RESULT_SET_FORMAT!r})")
    return manifest
