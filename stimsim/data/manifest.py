"""Data manifests, the local cache and mirrors: where every dataset and checkpoint comes from.

Every dataset or checkpoint stimsim can use is described by one JSON file in the repository's
``data_manifests/`` directory (override with the environment variable ``STIMSIM_MANIFEST_DIR``)::

    {"name": "afraz2006", "kind": "dataset" | "checkpoint",
     "description": "...", "citation": "...", "licence": "...",
     "source": {"kind": "url" | "pypi_wheel" | "python_package" | "system" | "manual", ...},
     "alternatives": [{"kind": ..., ...}, ...],
     "mirror_subdir": "optional folder name inside a mirror (default: name)",
     "files": [{"path": "relative/path.csv", "size_bytes": 1234, "sha256": "64 hex digits"}]}

The file is read into the typed models :class:`ManifestEntry`, :class:`ManifestSource` and
:class:`ManifestFile` (pydantic: unknown keys refused, types strict); a problem is a
``FileFormatError`` naming the manifest file, the table and the key.

Source kinds and their keys (``homepage`` is allowed for every kind):

- ``url``: ``{"url": base}``; a file is downloaded from ``base + "/" + path`` (http, https or
  file URLs) into the cache.
- ``python_package``: ``{"package": "skimage", "install_hint": "..."}``; files ship inside an
  installed Python package, ``path`` is relative to the package's directory; used in place.
- ``system``: ``{"directory": "/usr/share/...", "install_hint": "apt-get install ..."}``; files
  installed by the operating system, used in place.
- ``pypi_wheel``: ``{"package": "dist-name", "version": "1.0.1", "member_dir": "pkg/weights"}``;
  files ship inside a wheel on the Python package index: ``pip download --no-deps`` fetches the
  wheel (pip's own settings apply: ``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, pip.conf) into a
  temporary directory, and each file is extracted from the member ``member_dir/path`` into the
  cache. The wheel is never installed, so its own dependency pins do not matter.
- ``manual``: ``{"instructions": "..."}``; nothing can be fetched automatically: the files come
  from a mirror directory (or are put into the cache by hand) as the instructions say.

``alternatives`` (optional) lists further sources of the same files, tried in order after
``source``, e.g. the original download URL of a file whose ``source`` is a PyPI wheel.

A **mirror** is a local directory holding ``<mirror>/<mirror_subdir or name>/<path>`` (for
machines without internet); pass ``mirror=`` or set ``STIMSIM_MIRROR_DIR``. Fetched files land in
the **cache**, ``<cache>/<name>/<path>``, with ``cache`` = ``STIMSIM_CACHE_DIR`` or
``$XDG_CACHE_HOME/stimsim`` or ``~/.cache/stimsim``.

A file is looked for in this order: the cache, the sources' own directories (``python_package``
and ``system``), the mirror (copied into the cache), then each remote source in order (``url``
downloads, ``pypi_wheel`` extractions, into the cache).
Size and sha256 are checked every time a path is handed out; a file whose sha256 is unknown
(``null``, allowed only for files never seen, such as published checkpoints) is handed out after
its size check, if any, and reported as ``"unverified"``.

:func:`verify` reports one status per file without fetching anything: ``"ok"``, ``"mismatch"``
(present but wrong size or checksum), ``"unverified"`` (present, no known checksum) or
``"missing"`` (not fetched yet: neither in the cache nor in the source's own directory).
Only ``"mismatch"`` is a failure: :func:`verification_passed` is true when everything present
verifies, which is what ``stimsim data verify`` turns into its exit status.

Over 500 lines: the manifest format, the cache and every way of getting a file (mirror, wheel, URL) verify
against the same checksums and stay together.
"""
from __future__ import annotations

import hashlib
import http.client
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import warnings
import zipfile
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, model_validator

from stimsim.utilities.errors import ConfigError, DataError, DataUnavailable, FileFormatError
from stimsim.utilities.filemodels import FileModel, Text, validate_file
from stimsim.utilities.hashing import sha256_of
from stimsim.utilities.io import atomic_save, read_json

MANIFEST_DIR_ENV = "STIMSIM_MANIFEST_DIR"
MIRROR_DIR_ENV = "STIMSIM_MIRROR_DIR"
CACHE_DIR_ENV = "STIMSIM_CACHE_DIR"

ENTRY_KINDS = ("dataset", "checkpoint")
SOURCE_KINDS = ("url", "pypi_wheel", "python_package", "system", "manual")
#: Seconds to wait for a server before a download counts as unreachable.
DOWNLOAD_TIMEOUT_S = 10.0
#: Seconds one ``pip download`` of a ``pypi_wheel`` source may take in all before it counts as failed.
WHEEL_DOWNLOAD_LIMIT_S = 600.0

#: Keys of a source of each kind: (required, optional).
_SOURCE_KEYS = {
    "url": ({"url"}, {"homepage"}),
    "pypi_wheel": ({"package", "version"}, {"member_dir", "homepage"}),
    "python_package": ({"package"}, {"install_hint", "homepage"}),
    "system": ({"directory"}, {"install_hint", "homepage"}),
    "manual": ({"instructions"}, {"homepage"}),
}
_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
_VERSION_PATTERN = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")
_URL_SCHEMES = ("http", "https", "file")
_CHUNK_BYTES = 1 << 20


class ManifestFile(FileModel):
    """One file of an entry: ``path`` relative to the entry root (POSIX), its size in bytes and
    sha256 (``None`` when never seen)."""

    path: str
    size_bytes: Annotated[int, Field(ge=0)] | None
    sha256: str | None

    @model_validator(mode="after")
    def _check(self):
        problem = _rel_path_problem(self.path)
        if problem:
            raise ValueError(f"file path {self.path!r} is not a usable relative path: {problem}")
        if self.sha256 is not None and not _SHA256_PATTERN.match(self.sha256):
            raise ValueError(f"sha256 of '{self.path}' must be 64 lower-case hex digits or null, got {self.sha256!r}")
        if self.sha256 is not None and self.size_bytes is None:
            raise ValueError(f"'{self.path}' has a sha256 but no size_bytes: give both when the file is known")
        return self


class ManifestSource(FileModel):
    """Where an entry's files come from; which fields are set depends on ``kind``."""

    kind: str
    url: Text | None = None
    package: Text | None = None
    version: Text | None = None
    member_dir: Text | None = None
    directory: Text | None = None
    instructions: Text | None = None
    install_hint: Text | None = None
    homepage: Text | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"source kind '{self.kind}' is not one of {list(SOURCE_KINDS)}")
        required, optional = _SOURCE_KEYS[self.kind]
        keys = {key for key in type(self).model_fields if key != "kind" and getattr(self, key) is not None}
        if required - keys:
            raise ValueError(f"a '{self.kind}' source needs key(s) {sorted(required - keys)}")
        if keys - required - optional:
            raise ValueError(f"unknown key(s) {sorted(keys - required - optional)} in a '{self.kind}' source; "
                             f"allowed: {sorted(required | optional)}")
        if self.kind == "url" and urllib.parse.urlparse(self.url).scheme not in _URL_SCHEMES:
            raise ValueError(f"source url {self.url!r} must start with one of {[s + '://' for s in _URL_SCHEMES]}")
        if self.kind == "system" and not Path(self.directory).is_absolute():
            raise ValueError(f"a 'system' source directory must be absolute, got {self.directory!r}")
        if self.kind == "pypi_wheel":
            if not _VERSION_PATTERN.match(self.version):
                raise ValueError(f"a 'pypi_wheel' source needs one exact version such as '1.0.1', got {self.version!r}")
            if self.member_dir is not None and _rel_path_problem(self.member_dir):
                raise ValueError(f"member_dir {self.member_dir!r} must be a relative POSIX path inside the wheel")
        return self

    def local_root(self) -> Path | None:
        """Directory holding the files in place (``python_package``, ``system``), or ``None``
        for remote and manual sources and for a package that is not installed."""
        if self.kind == "system":
            return Path(self.directory)
        if self.kind == "python_package":
            try:
                spec = importlib.util.find_spec(self.package)
            except ModuleNotFoundError:  # a dotted name whose parent package is missing
                return None
            if spec is None or not spec.submodule_search_locations:
                return None
            return Path(list(spec.submodule_search_locations)[0])
        return None

    def describe(self) -> str:
        """One line saying where the files come from, for messages and listings."""
        if self.kind == "url":
            return f"download from {self.url}"
        if self.kind == "pypi_wheel":
            return f"inside the PyPI wheel {self.requirement}"
        if self.kind == "python_package":
            return f"inside the installed Python package '{self.package}'"
        if self.kind == "system":
            return f"system directory {self.directory}"
        return "manual download (see the entry's instructions)"

    @property
    def requirement(self) -> str:
        """``package==version`` of a ``pypi_wheel`` source."""
        return f"{self.package}=={self.version}"

    def member(self, rel: str) -> str:
        """The wheel member holding file ``rel`` of a ``pypi_wheel`` source."""
        return f"{self.member_dir}/{rel}" if self.member_dir else rel

    def to_dict(self) -> dict:
        return self.model_dump(exclude_none=True)


class ManifestEntry(FileModel):
    """One dataset or checkpoint: what it is, whom to cite, where it comes from, its files; read
    from its manifest file (``manifest_path``) by :meth:`from_dict`."""

    name: Annotated[str, Field(pattern=_NAME_PATTERN.pattern)]
    kind: Literal[ENTRY_KINDS]
    description: Text
    citation: Text
    licence: Text
    source: ManifestSource
    alternatives: list[ManifestSource] = []
    files: Annotated[list[ManifestFile], Field(min_length=1)]
    mirror_subdir: str | None = None
    _manifest_path: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self):
        if self.mirror_subdir is not None and _rel_path_problem(self.mirror_subdir):
            raise ValueError(f"mirror_subdir {self.mirror_subdir!r} must be a relative path inside the mirror")
        twice = sorted(rel for rel, count in Counter(f.path for f in self.files).items() if count > 1)
        if twice:
            raise ValueError(f"file path '{twice[0]}' is listed twice")
        return self

    @property
    def sources(self) -> list[ManifestSource]:
        """``source`` then the ``alternatives``, in the order they are tried."""
        return [self.source, *self.alternatives]

    def describe_sources(self) -> str:
        """Where the files come from, every source in order, for messages and listings."""
        return "; or ".join(source.describe() for source in self.sources)

    def in_place_path(self, rel: str) -> Path | None:
        """``rel`` inside the first source's own directory that holds it (``python_package``,
        ``system``), or ``None``."""
        for source in self.sources:
            root = source.local_root()
            if root is not None and (root / rel).is_file():
                return root / rel
        return None

    @property
    def manifest_path(self) -> Path | None:
        """The manifest file the entry was read from (None for one built in memory)."""
        return self._manifest_path

    def file(self, rel: str) -> ManifestFile:
        """The file spec of ``rel``; a path the entry does not list raises :class:`DataError`."""
        for spec in self.files:
            if spec.path == rel:
                return spec
        examples = ", ".join(spec.path for spec in self.files[:3])
        raise DataError(
            f"data entry '{self.name}' has no file '{rel}' ({len(self.files)} file(s), e.g. {examples})"
        )

    def cache_path(self, rel: str) -> Path:
        """Where ``rel`` of this entry lives in the cache."""
        return cache_dir() / self.name / rel

    def mirror_path(self, rel: str, mirror) -> Path:
        """Where ``rel`` of this entry lives inside the mirror directory ``mirror``."""
        return Path(mirror) / (self.mirror_subdir or self.name) / rel

    def to_dict(self) -> dict:
        """The entry as its manifest JSON object."""
        out = self.model_dump(exclude={"source", "alternatives", "mirror_subdir"})
        out["source"] = self.source.to_dict()
        if self.alternatives:
            out["alternatives"] = [source.to_dict() for source in self.alternatives]
        if self.mirror_subdir is not None:
            out["mirror_subdir"] = self.mirror_subdir
        return out

    @classmethod
    def from_dict(cls, values: dict, manifest_path=None) -> "ManifestEntry":
        """Build an entry from its JSON object; anything malformed raises :class:`FileFormatError`
        naming the manifest file, the table and the key."""
        entry = validate_file(cls, values, Path(manifest_path) if manifest_path is not None else Path("<manifest>"))
        entry._manifest_path = Path(manifest_path) if manifest_path is not None else None
        return entry


def _rel_path_problem(rel: str) -> str | None:
    if not rel or "\\" in rel:
        return "it must be a non-empty POSIX path"
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute():
        return "it must be relative"
    if any(part in ("..", ".") for part in parts) or rel.endswith("/") or "//" in rel:
        return "it must not contain '.', '..' or empty parts"
    return None


# --------------------------------------------------------------------------- directories


def _env_path(variable: str) -> Path | None:
    value = os.environ.get(variable, "").strip()
    return Path(value).expanduser() if value else None


def manifest_dir() -> Path:
    """The directory of manifest JSON files: ``STIMSIM_MANIFEST_DIR``, or the manifests installed with
    the package (``stimsim/data_manifests``: package data of a wheel; in the repository a link to its
    top-level ``data_manifests/``)."""
    from importlib.resources import files

    return _env_path(MANIFEST_DIR_ENV) or Path(str(files("stimsim") / "data_manifests"))


def cache_dir() -> Path:
    """The cache: ``STIMSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/stimsim``, else ``~/.cache/stimsim``."""
    explicit = _env_path(CACHE_DIR_ENV)
    if explicit is not None:
        return explicit
    xdg = _env_path("XDG_CACHE_HOME")
    return (xdg if xdg is not None else Path.home() / ".cache") / "stimsim"


def mirror_dir(mirror=None) -> Path | None:
    """The mirror directory: ``mirror`` when given, else ``STIMSIM_MIRROR_DIR`` (:func:`env_mirror_dir`), else
    ``None``."""
    if mirror is not None:
        return Path(mirror).expanduser()
    return env_mirror_dir()


def env_mirror_dir() -> Path | None:
    """``STIMSIM_MIRROR_DIR`` as a path, None when it is unset; ConfigError when it names no directory (as
    ``--mirror`` is refused)."""
    path = _env_path(MIRROR_DIR_ENV)
    if path is not None and not path.is_dir():
        raise ConfigError(f"{MIRROR_DIR_ENV}={os.environ[MIRROR_DIR_ENV].strip()}: not a directory; set it to the "
                          "folder of the data mirror, or unset it")
    return path


# --------------------------------------------------------------------------- manifests


def load_manifests(directory=None) -> dict[str, ManifestEntry]:
    """All entries of the manifest directory (default :func:`manifest_dir`), keyed by name.

    Each ``<name>.json`` holds one entry whose ``name`` must equal the file name.
    """
    directory = Path(directory) if directory is not None else manifest_dir()
    if not directory.is_dir():
        raise DataError(f"manifest directory {directory} does not exist (set {MANIFEST_DIR_ENV} "
                        f"to a directory of <name>.json manifests)")
    entries = {}
    for path in sorted(directory.glob("*.json")):
        values = read_json(path)
        entry = ManifestEntry.from_dict(values, manifest_path=path)
        if entry.name != path.stem:
            raise FileFormatError(path, f"entry name '{entry.name}' must match the file name '{path.stem}'")
        entries[entry.name] = entry
    return entries


def get_entry(name: str) -> ManifestEntry:
    """The entry called ``name``; an unknown name raises :class:`DataError` listing known names."""
    entries = load_manifests()
    if name not in entries:
        known = ", ".join(sorted(entries)) or "none"
        raise DataError(f"unknown data entry '{name}'; known entries: {known} (manifests in {manifest_dir()})")
    return entries[name]


# --------------------------------------------------------------------------- checks


def file_status(path, spec: ManifestFile) -> str:
    """``"missing"``, ``"mismatch"``, ``"unverified"`` (no known sha256) or ``"ok"`` for the file at
    ``path`` checked against ``spec``."""
    path = Path(path)
    if not path.is_file():
        return "missing"
    if spec.size_bytes is not None and path.stat().st_size != spec.size_bytes:
        return "mismatch"
    if spec.sha256 is None:
        return "unverified"
    return "ok" if sha256_of(path) == spec.sha256 else "mismatch"


def _checked(path: Path, spec: ManifestFile, entry: ManifestEntry, advice: str) -> Path:
    """Hand out ``path`` after checking its size and sha256; a mismatch raises :class:`DataError`
    that ends with ``advice``."""
    size = path.stat().st_size
    wrong_size = spec.size_bytes is not None and size != spec.size_bytes
    if not wrong_size and spec.sha256 is None:
        return path
    actual = sha256_of(path)
    if wrong_size or actual != spec.sha256:
        raise _mismatch_error(entry, spec, path, size, actual, advice)
    return path


def _mismatch_error(entry, spec, path, actual_size, actual_sha256, advice) -> DataError:
    return DataError(
        f"checksum mismatch for '{spec.path}' of data entry '{entry.name}' at {path}: "
        f"expected sha256 {spec.sha256 or '(unknown)'} and {spec.size_bytes if spec.size_bytes is not None else '?'} "
        f"bytes, found sha256 {actual_sha256} and {actual_size} bytes; {advice}"
    )


def verify(name: str) -> list[tuple[str, str]]:
    """``(path, status)`` for every file of entry ``name``, without fetching anything.

    The file checked is the one :func:`entry_path` would hand out first (cache, then the
    source's own directory); ``"missing"`` means not fetched yet.
    """
    entry = get_entry(name)
    results = []
    for spec in entry.files:
        path = entry.cache_path(spec.path)
        if not path.is_file():
            path = entry.in_place_path(spec.path) or path
        results.append((spec.path, file_status(path, spec)))
    return results


def verify_all() -> dict[str, list[tuple[str, str]]]:
    """:func:`verify` for every entry of the manifest directory, keyed by entry name."""
    return {name: verify(name) for name in load_manifests()}


def verification_passed(results) -> bool:
    """True when nothing present fails its check (no ``"mismatch"``); ``"missing"`` (not fetched
    yet) and ``"unverified"`` (no known checksum) do not fail. Accepts the output of
    :func:`verify` or of :func:`verify_all`."""
    groups = results.values() if isinstance(results, dict) else [results]
    return all(status != "mismatch" for group in groups for _, status in group)


# --------------------------------------------------------------------------- fetching


def _install(dest: Path, spec: ManifestFile, entry: ManifestEntry, origin: str, open_stream) -> Path:
    """Copy the bytes of ``open_stream()`` to ``dest`` atomically, checking size and sha256 on the
    way; a mismatch leaves nothing at ``dest`` and raises :class:`DataError`."""

    def save(tmp):
        digest, size = hashlib.sha256(), 0
        with open_stream() as source, open(tmp, "wb") as out:
            for chunk in iter(lambda: source.read(_CHUNK_BYTES), b""):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
        actual = digest.hexdigest()
        wrong_size = spec.size_bytes is not None and size != spec.size_bytes
        if wrong_size or (spec.sha256 is not None and actual != spec.sha256):
            raise _mismatch_error(entry, spec, origin, size, actual,
                                  advice="the source copy is damaged or a different version; nothing was cached")

    try:
        return atomic_save(dest, save)
    except OSError as error:
        failed = None if error.filename is None else Path(error.filename)
        if failed is None or not (failed.is_relative_to(dest.parent) or dest.parent.is_relative_to(failed)):
            raise  # reading the source failed: the callers say which source
        raise _cache_not_writable(dest, error) from None


def _cache_not_writable(path: Path, error: OSError) -> DataError:
    return DataError(f"the data cache is not writable: {error.filename or path} ({error.strerror or error}); make "
                     f"{cache_dir()} writable, or set {CACHE_DIR_ENV} to a writable directory")


def _download(url: str, timeout_s: float):
    return urllib.request.urlopen(url, timeout=timeout_s)


class _Unavailable(Exception):
    """A remote source could not deliver a file; the message says why (collected into the final error)."""


def _pip_download(source: ManifestSource, directory: Path, timeout_s: float) -> Path:
    """Download the wheel of a ``pypi_wheel`` source into ``directory`` with this Python's pip (no
    dependencies, binary only); its path, or :class:`_Unavailable`."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", "--timeout", f"{timeout_s:g}", "--dest", str(directory),
               source.requirement]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=WHEEL_DOWNLOAD_LIMIT_S,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise _Unavailable(f"pip download {source.requirement} took more than {WHEEL_DOWNLOAD_LIMIT_S:g} s") from None
    if run.returncode != 0:
        lines = [line.strip() for line in run.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {run.returncode}"
        raise _Unavailable(f"pip download {source.requirement} failed ({reason})")
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        raise _Unavailable(f"pip download {source.requirement} left {len(wheels)} wheel file(s), expected one")
    return wheels[0]


def _fetch_from_wheel(entry: ManifestEntry, source: ManifestSource, spec: ManifestFile, timeout_s: float) -> Path:
    """Extract ``spec`` (and every other file of the entry that the cache lacks and the wheel holds) from
    the wheel of ``source`` into the cache, each verified; the cache path of ``spec``."""
    with tempfile.TemporaryDirectory(prefix="stimsim-wheel-") as tmp:
        wheel = _pip_download(source, Path(tmp), timeout_s)
        try:
            with zipfile.ZipFile(wheel) as archive:
                members = set(archive.namelist())
                if source.member(spec.path) not in members:
                    raise _Unavailable(f"the wheel {wheel.name} has no member {source.member(spec.path)}")
                for other in entry.files:
                    member, dest = source.member(other.path), entry.cache_path(other.path)
                    if member in members and (other is spec or not dest.is_file()):
                        _install(dest, other, entry, f"{wheel.name}:{member}", lambda m=member: archive.open(m))
        except zipfile.BadZipFile as exc:
            raise _Unavailable(f"{wheel.name} is not a readable wheel ({exc})") from None
    return entry.cache_path(spec.path)


def _fetch_remote(entry: ManifestEntry, source: ManifestSource, spec: ManifestFile, timeout_s: float) -> Path:
    """``spec`` fetched from a ``url`` or ``pypi_wheel`` source into the cache, or :class:`_Unavailable`."""
    if source.kind == "pypi_wheel":
        return _fetch_from_wheel(entry, source, spec, timeout_s)
    url = source.url.rstrip("/") + "/" + urllib.parse.quote(spec.path)
    try:
        return _install(entry.cache_path(spec.path), spec, entry, url, lambda: _download(url, timeout_s))
    except urllib.error.HTTPError as exc:
        raise _Unavailable(f"download {url} failed (HTTP {exc.code} {exc.reason})") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise _Unavailable(f"download {url} failed ({reason}): the server is unreachable from this machine") from None


def _resolve_file(entry: ManifestEntry, spec: ManifestFile, mirror, timeout_s: float,
                  replace_damaged: bool = False) -> Path:
    """A verified local path of one file, fetching it into the cache when needed; with ``replace_damaged``, a
    cached copy that fails its checksum is set aside (``<file>.damaged``, with a warning) and fetched again."""
    cached = entry.cache_path(spec.path)
    if cached.is_file():
        try:
            return _checked(cached, spec, entry, advice=f"`stimsim data fetch {entry.name}` sets the damaged copy "
                                                        "aside and fetches the file again")
        except DataError as exc:
            if not replace_damaged:
                raise
            aside = cached.with_name(cached.name + ".damaged")
            number = 1
            while aside.exists():  # an earlier damaged copy is kept too
                number += 1
                aside = cached.with_name(f"{cached.name}.damaged.{number}")
            try:
                os.replace(cached, aside)
            except OSError as error:
                raise _cache_not_writable(cached, error) from None
            warnings.warn(f"{str(exc).split('; ')[0]}; set aside as {aside}, fetching it again", stacklevel=3)
    looked = [f"cache {cached} (absent)"]
    in_place = entry.in_place_path(spec.path)
    if in_place is not None:
        hints = [source.install_hint for source in entry.sources if source.install_hint]
        reinstall = f" ({hints[0]})" if hints else ""
        return _checked(in_place, spec, entry,
                        advice=f"the installed copy is damaged or another version; reinstall it{reinstall}")
    for source in entry.sources:
        if source.kind == "python_package":
            root = source.local_root()
            looked.append(f"{source.describe()}: {root / spec.path} (absent)" if root is not None
                          else f"Python package '{source.package}' (not installed)")
        elif source.kind == "system":
            looked.append(f"{source.describe()} (absent)")
    mirror_root = mirror_dir(mirror)
    if mirror_root is not None and not mirror_root.is_dir():  # given as mirror=: the environment's is checked
        looked.append(f"mirror {mirror_root} (the mirror given: not a directory)")
    elif mirror_root is not None:
        mirrored = entry.mirror_path(spec.path, mirror_root)
        if mirrored.is_file():
            return _install(cached, spec, entry, str(mirrored), lambda: open(mirrored, "rb"))
        looked.append(f"mirror {mirrored} (absent)")
    else:
        looked.append(f"no mirror directory (--mirror DIR on the command line, mirror= in Python, or set "
                      f"{MIRROR_DIR_ENV})")
    for source in entry.sources:
        if source.kind in ("url", "pypi_wheel"):
            try:
                return _fetch_remote(entry, source, spec, timeout_s)
            except _Unavailable as exc:
                looked.append(str(exc))
    instructions = [source.instructions for source in entry.sources if source.instructions]
    if instructions:
        advice = instructions[0]
    else:
        advice = (f"A copy placed at <mirror>/{entry.mirror_subdir or entry.name}/{spec.path}, with the mirror "
                  f"given (--mirror DIR on the command line, mirror= in Python) or set in {MIRROR_DIR_ENV}, is "
                  "used and cached.")
        hints = [source.install_hint for source in entry.sources if source.install_hint]
        if hints:
            advice += f" To install the source: {hints[0]}"
    raise DataUnavailable(
        f"file '{spec.path}' of data entry '{entry.name}' is not available. Looked in: "
        + "; ".join(looked) + ". " + advice
    )


def _check_timeout(timeout_s: float) -> float:
    if not timeout_s > 0:
        raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    return float(timeout_s)


def fetch(name: str, mirror=None, timeout_s: float = DOWNLOAD_TIMEOUT_S) -> list[Path]:
    """Make every file of entry ``name`` available locally; returns their verified paths, in
    manifest order (cache paths, or in-place paths for ``python_package``/``system`` sources). A cached copy that
    fails its checksum is set aside as ``<file>.damaged`` (with a warning) and fetched again."""
    timeout_s = _check_timeout(timeout_s)
    entry = get_entry(name)
    return [_resolve_file(entry, spec, mirror, timeout_s, replace_damaged=True) for spec in entry.files]


def entry_paths(name: str, rels, mirror=None, timeout_s: float = DOWNLOAD_TIMEOUT_S) -> list[Path]:
    """Verified local paths of several files ``rels`` of entry ``name`` (one manifest read for all)."""
    timeout_s = _check_timeout(timeout_s)
    entry = get_entry(name)
    return [_resolve_file(entry, entry.file(rel), mirror, timeout_s) for rel in rels]


def entry_path(name: str, rel: str | None = None, mirror=None,
               timeout_s: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Verified local path of file ``rel`` of entry ``name``, fetched if needed.

    With ``rel=None``: the entry's root directory, after every file is fetched and verified —
    the source's own directory when it holds every file, otherwise ``<cache>/<name>`` (files
    found in place are copied there so that the root holds them all).
    """
    timeout_s = _check_timeout(timeout_s)
    entry = get_entry(name)
    if rel is not None:
        return _resolve_file(entry, entry.file(rel), mirror, timeout_s)
    paths = [_resolve_file(entry, spec, mirror, timeout_s) for spec in entry.files]
    for source in entry.sources:
        local_root = source.local_root()
        if local_root is not None and all(p == local_root / s.path for p, s in zip(paths, entry.files)):
            return local_root
    for path, spec in zip(paths, entry.files):
        cached = entry.cache_path(spec.path)
        if path != cached:
            _install(cached, spec, entry, str(path), lambda src=path: open(src, "rb"))
    return cache_dir() / entry.name


def remove_cached(name: str) -> Path:
    """Delete the cached copy of entry ``name`` (``<cache>/<name>``); returns that directory."""
    entry = get_entry(name)
    target = cache_dir() / entry.name
    if target.is_dir():
        shutil.rmtree(target)
    return target
