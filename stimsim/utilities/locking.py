"""One run per output directory: a lock file naming the run that writes there.

``with DirectoryLock(directory, "plan"):`` creates ``directory`` if needed and the file ``.stimsim.lock`` in it,
holding the holder's pid, host, command and start time (UTC); it is created whole or not at all (written
beside it, then hard-linked into place). A second run into a held directory is refused with
:class:`~stimsim.utilities.errors.ConfigError` naming the holder. A lock whose holder is gone — a pid that no longer
runs on this host, e.g. a run killed with SIGKILL — is taken over. On leaving, the lock is removed, and so
are the directories the lock created if nothing else is in them (a run that failed before writing leaves
nothing behind).
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from stimsim.utilities.errors import ConfigError

#: Name of the lock file inside a held output directory.
LOCK_FILE = ".stimsim.lock"

_HELD: set[str] = set()  # lock files this process holds


def checked_output_path(directory) -> Path:
    """``directory`` as a Path; empty text, an existing file or a path through a symbolic link whose target is gone
    (a folder on a disk not mounted) is a ConfigError."""
    if not str(directory).strip():
        raise ConfigError("the output directory is empty text; give a directory path")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"output directory {directory} is a file, not a directory")
    broken = next((path for path in (directory, *directory.parents) if path.is_symlink() and not path.exists()), None)
    if broken is not None:
        raise ConfigError(f"output directory {directory}: {broken} is a symbolic link to {os.readlink(broken)}, which "
                          "does not exist; create that folder or give another directory")
    return directory


def missing_directories(directory: Path) -> list[Path]:
    """``directory`` and those of its parents that do not exist yet, deepest first."""
    missing, path = [], directory.absolute()
    while not path.exists():
        missing.append(path)
        path = path.parent
    return missing


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, under another user
        return True
    return True


class DirectoryLock:
    """The lock of one output directory (see the module docstring); a context manager."""

    def __init__(self, directory, command: str):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.command = command
        self.created: list[Path] = []

    def __enter__(self) -> "DirectoryLock":
        self.acquire()
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        self.release()
        return False

    def acquire(self) -> None:
        checked_output_path(self.directory)
        missing = missing_directories(self.directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot write into output directory {self.directory}: {exc.strerror or exc}") from None
        self.created = missing
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                  "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f"{LOCK_FILE}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
            for _ in range(3):
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    self._remove_stale()
                    continue
                _HELD.add(str(self.path.absolute()))
                return
            raise ConfigError(f"{self.directory}: could not take its lock {self.path} (other runs keep taking it)")
        except BaseException:
            self._remove_created()
            raise
        finally:
            Path(tmp).unlink(missing_ok=True)

    def _remove_stale(self) -> None:
        """Remove the lock if its holder is gone; otherwise refuse, naming the holder."""
        try:
            inode = self.path.stat().st_ino
            holder = json.loads(self.path.read_text(encoding="utf-8"))
            pid, host = int(holder["pid"]), str(holder["host"])
        except FileNotFoundError:
            return  # released meanwhile
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{self.directory} is locked by {self.path}, which cannot be read ({exc}); delete it "
                              "if no stimsim run is writing into that directory") from None
        gone = host == socket.gethostname() and (not _alive(pid) or (pid == os.getpid()
                                                                   and str(self.path.absolute()) not in _HELD))
        if not gone:
            raise ConfigError(
                f"output directory {self.directory} is in use by another run: stimsim "
                f"{holder.get('command', '?')} (pid {pid} on host {host}, started {holder.get('started_utc', '?')}); "
                f"wait for it to end or give another directory (if that run is gone, delete {self.path})")
        try:
            if self.path.stat().st_ino == inode:  # not a lock another run took over meanwhile
                self.path.unlink()
        except FileNotFoundError:
            pass

    def release(self) -> None:
        key = str(self.path.absolute())
        if key in _HELD:
            _HELD.discard(key)
            self.path.unlink(missing_ok=True)
        self._remove_created()

    def _remove_created(self) -> None:
        for directory in self.created:  # deepest first
            try:
                directory.rmdir()
            except FileNotFoundError:
                continue
            except OSError:  # not empty: the run wrote into it
                break
        self.created = []
