"""Data manifests: parsing, cache, mirror, downloads and checksum verification."""
import functools
import hashlib
import http.server
import json
import re
import threading
from pathlib import Path

import pytest

from stimsim.data import manifest
from stimsim.utilities.errors import ConfigError, DataError, FileFormatError

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
REPO_MANIFESTS = Path(__file__).resolve().parents[1] / "data_manifests"

FILES = {"a.txt": b"alpha values\n", "sub/b.bin": bytes(range(200))}


def _spec(rel, data):
    return {"path": rel, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _write_manifest(directory, name, source, files, **extra):
    entry = {"name": name, "kind": "dataset", "description": "test data", "citation": "nobody 2024",
             "licence": "CC0", "source": source, "files": files, **extra}
    (directory / f"{name}.json").write_text(json.dumps(entry))
    return entry


@pytest.fixture
def env(tmp_path, monkeypatch):
    """An isolated manifest directory, cache and mirror; the mirror holds entry 'tiny'."""
    manifests, cache, mirror = tmp_path / "manifests", tmp_path / "cache", tmp_path / "mirror"
    manifests.mkdir()
    for rel, data in FILES.items():
        (mirror / "tiny" / rel).parent.mkdir(parents=True, exist_ok=True)
        (mirror / "tiny" / rel).write_bytes(data)
    _write_manifest(manifests, "tiny", {"kind": "manual", "instructions": "ask the lab for a copy"},
                    [_spec(rel, data) for rel, data in FILES.items()])
    monkeypatch.setenv(manifest.MANIFEST_DIR_ENV, str(manifests))
    monkeypatch.setenv(manifest.CACHE_DIR_ENV, str(cache))
    monkeypatch.delenv(manifest.MIRROR_DIR_ENV, raising=False)
    return {"manifests": manifests, "cache": cache, "mirror": mirror, "tmp": tmp_path}


def test_fetch_from_mirror_lands_in_cache_and_verifies(env):
    assert manifest.verify("tiny") == [("a.txt", "missing"), ("sub/b.bin", "missing")]
    paths = manifest.fetch("tiny", mirror=env["mirror"])
    assert paths == [env["cache"] / "tiny" / "a.txt", env["cache"] / "tiny" / "sub" / "b.bin"]
    assert [p.read_bytes() for p in paths] == list(FILES.values())
    statuses = manifest.verify("tiny")
    assert statuses == [("a.txt", "ok"), ("sub/b.bin", "ok")]
    assert manifest.verification_passed(statuses)
    # once cached, no mirror is needed any more
    assert manifest.entry_path("tiny", "a.txt") == paths[0]
    assert manifest.entry_path("tiny") == env["cache"] / "tiny"


def test_mirror_from_environment(env, monkeypatch):
    monkeypatch.setenv(manifest.MIRROR_DIR_ENV, str(env["mirror"]))
    assert manifest.entry_path("tiny", "sub/b.bin").read_bytes() == FILES["sub/b.bin"]


def test_not_fetched_is_missing_and_does_not_fail_verification(env):
    results = manifest.verify_all()
    assert results == {"tiny": [("a.txt", "missing"), ("sub/b.bin", "missing")]}
    assert manifest.verification_passed(results)


@pytest.mark.parametrize("corruption", ["same_size", "truncated"])
def test_corrupted_cache_file_raises_checksum_mismatch(env, corruption):
    path = manifest.entry_path("tiny", "a.txt", mirror=env["mirror"])
    data = path.read_bytes()
    path.write_bytes(data.upper() if corruption == "same_size" else data[:3])
    with pytest.raises(DataError, match="checksum mismatch") as info:
        manifest.entry_path("tiny", "a.txt", mirror=env["mirror"])
    message = str(info.value)
    assert "a.txt" in message and "tiny" in message
    assert hashlib.sha256(FILES["a.txt"]).hexdigest() in message
    assert hashlib.sha256(path.read_bytes()).hexdigest() in message
    statuses = manifest.verify("tiny")
    assert statuses[0] == ("a.txt", "mismatch")
    assert not manifest.verification_passed(statuses)
    assert not manifest.verification_passed(manifest.verify_all())


def test_fetch_sets_a_damaged_cached_copy_aside_and_fetches_it_again(env):
    path = manifest.entry_path("tiny", "a.txt", mirror=env["mirror"])
    path.write_bytes(b"damaged")
    with pytest.raises(DataError, match=r"`stimsim data fetch tiny` sets the damaged copy aside"):
        manifest.entry_path("tiny", "a.txt", mirror=env["mirror"])
    with pytest.warns(UserWarning, match=r"checksum mismatch for 'a.txt' .* set aside as .*a.txt.damaged, fetching"):
        paths = manifest.fetch("tiny", mirror=env["mirror"])
    assert paths[0].read_bytes() == FILES["a.txt"]
    assert path.with_name("a.txt.damaged").read_bytes() == b"damaged"  # kept, not deleted
    assert manifest.verify("tiny") == [("a.txt", "ok"), ("sub/b.bin", "ok")]
    path.write_bytes(b"damaged again")  # a second damaged copy is set aside beside the first
    with pytest.warns(UserWarning, match=r"set aside as .*a.txt.damaged.2, fetching"):
        manifest.fetch("tiny", mirror=env["mirror"])
    assert path.with_name("a.txt.damaged").read_bytes() == b"damaged"
    assert path.with_name("a.txt.damaged.2").read_bytes() == b"damaged again"


def test_a_cache_that_cannot_be_written_is_a_clear_error(env, monkeypatch):
    """A cache under a file (no folder can be made there), and a damaged copy that cannot be set aside: one error
    naming the cache and the way out, no traceback; the damaged copy stays where it was."""
    blocker = env["tmp"] / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(manifest.CACHE_DIR_ENV, str(blocker / "cache"))
    with pytest.raises(DataError, match=rf"the data cache is not writable: .*a_file.*; make .*a_file/cache writable, "
                                        rf"or set {manifest.CACHE_DIR_ENV} to a writable directory"):
        manifest.fetch("tiny", mirror=env["mirror"])
    monkeypatch.setenv(manifest.CACHE_DIR_ENV, str(env["cache"]))
    path = manifest.entry_path("tiny", "a.txt", mirror=env["mirror"])
    path.write_bytes(b"damaged")

    def read_only(source, target):
        raise PermissionError(1, "Operation not permitted", str(source), None, str(target))

    monkeypatch.setattr(manifest.os, "replace", read_only)
    with pytest.raises(DataError, match=r"the data cache is not writable: .*a.txt \(Operation not permitted\)"):
        manifest.fetch("tiny", mirror=env["mirror"])
    assert path.read_bytes() == b"damaged"


def test_damaged_mirror_copy_is_not_cached(env):
    (env["mirror"] / "tiny" / "a.txt").write_bytes(b"alpha valueZ\n")
    with pytest.raises(DataError, match="checksum mismatch"):
        manifest.entry_path("tiny", "a.txt", mirror=env["mirror"])
    assert not (env["cache"] / "tiny" / "a.txt").exists()
    assert list((env["cache"] / "tiny").iterdir()) == []  # no temporary file left behind


def test_missing_file_without_mirror_names_entry_file_and_places(env):
    with pytest.raises(DataError) as info:
        manifest.entry_path("tiny", "a.txt")
    message = str(info.value)
    assert "'a.txt'" in message and "'tiny'" in message
    assert str(env["cache"] / "tiny" / "a.txt") in message
    assert manifest.MIRROR_DIR_ENV in message
    assert "ask the lab for a copy" in message


def test_a_mirror_that_is_not_a_directory_is_named_so(env, monkeypatch, capsys):
    """STIMSIM_MIRROR_DIR naming no folder (nothing there, or a file) is refused when data is looked up and, before
    anything runs, by a command that reads data, as ``--mirror`` is; ``mirror=`` given in Python is named among
    the places looked in."""
    from stimsim.cli import main

    with pytest.raises(DataError, match=r"mirror .*no-such-mirror \(the mirror given: not a directory\)"):
        manifest.entry_path("tiny", "a.txt", mirror=env["tmp"] / "no-such-mirror")
    a_file = env["tmp"] / "a-file"
    a_file.write_text("")
    for value in (env["tmp"] / "no-such-mirror", a_file):
        monkeypatch.setenv(manifest.MIRROR_DIR_ENV, str(value))
        with pytest.raises(ConfigError, match=rf"^{manifest.MIRROR_DIR_ENV}={re.escape(str(value))}: not a "
                                              "directory; set it to the folder of the data mirror, or unset it$"):
            manifest.entry_path("tiny", "a.txt")
        assert main(["data", "fetch", "tiny"]) == 2
        assert capsys.readouterr().err == (f"stimsim: error: {manifest.MIRROR_DIR_ENV}={value}: not a directory; set "
                                           "it to the folder of the data mirror, or unset it\n")


def test_unreachable_url_raises_clear_error(env):
    _write_manifest(env["manifests"], "remote", {"kind": "url", "url": "http://127.0.0.1:9/data"},
                    [_spec("a.txt", FILES["a.txt"])])
    with pytest.raises(DataError) as info:
        manifest.entry_path("remote", "a.txt", timeout_s=2)
    message = str(info.value)
    assert "http://127.0.0.1:9/data/a.txt" in message
    assert "unreachable" in message
    assert "mirror" in message
    assert not (env["cache"] / "remote" / "a.txt").exists()


def test_url_download_is_verified_and_cached(env):
    server = env["tmp"] / "server"
    (server / "sub").mkdir(parents=True)
    for rel, data in FILES.items():
        (server / rel).write_bytes(data)
    _write_manifest(env["manifests"], "remote", {"kind": "url", "url": server.as_uri()},
                    [_spec(rel, data) for rel, data in FILES.items()])
    paths = manifest.fetch("remote")
    assert paths[1] == env["cache"] / "remote" / "sub" / "b.bin"
    assert paths[1].read_bytes() == FILES["sub/b.bin"]
    (server / "a.txt").unlink()  # the cached copy is used from now on
    assert manifest.entry_path("remote", "a.txt").read_bytes() == FILES["a.txt"]


def test_http_download_and_http_error(env):
    server_dir = env["tmp"] / "server"
    server_dir.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(server_dir))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            base = f"http://127.0.0.1:{server.server_address[1]}/files"
            (server_dir / "files").mkdir()
            (server_dir / "files" / "a.txt").write_bytes(FILES["a.txt"])
            _write_manifest(env["manifests"], "web", {"kind": "url", "url": base},
                            [_spec(rel, data) for rel, data in FILES.items()])
            assert manifest.entry_path("web", "a.txt", timeout_s=5).read_bytes() == FILES["a.txt"]
            with pytest.raises(DataError, match=r"HTTP 404"):
                manifest.entry_path("web", "sub/b.bin", timeout_s=5)
        finally:
            server.shutdown()
            thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        """Keep test output clean."""


def test_unknown_entry_lists_known_names(env):
    with pytest.raises(DataError, match=r"unknown data entry 'nope'.*known entries: tiny"):
        manifest.get_entry("nope")
    with pytest.raises(DataError, match="has no file 'c.txt'"):
        manifest.entry_path("tiny", "c.txt", mirror=env["mirror"])


def test_unknown_sha256_is_handed_out_as_unverified(env):
    _write_manifest(env["manifests"], "ckpt", {"kind": "manual", "instructions": "download by hand"},
                    [{"path": "w.torch", "size_bytes": None, "sha256": None}], mirror_subdir="published/ckpt")
    (env["mirror"] / "published" / "ckpt").mkdir(parents=True)
    (env["mirror"] / "published" / "ckpt" / "w.torch").write_bytes(b"weights")
    assert manifest.entry_path("ckpt", "w.torch", mirror=env["mirror"]).read_bytes() == b"weights"
    statuses = manifest.verify("ckpt")
    assert statuses == [("w.torch", "unverified")]
    assert manifest.verification_passed(statuses)


def test_system_source_is_used_in_place_and_hints_at_install(env):
    system = env["tmp"] / "usr_share"
    (system / "sub").mkdir(parents=True)
    for rel, data in FILES.items():
        (system / rel).write_bytes(data)
    source = {"kind": "system", "directory": str(system), "install_hint": "apt-get install dataset-tiny"}
    _write_manifest(env["manifests"], "sys", source, [_spec(rel, data) for rel, data in FILES.items()])
    assert manifest.entry_path("sys") == system
    assert manifest.verify("sys") == [("a.txt", "ok"), ("sub/b.bin", "ok")]
    assert not (env["cache"] / "sys").exists()
    (system / "a.txt").write_bytes(b"changed by an upgrade")
    with pytest.raises(DataError, match="checksum mismatch.*reinstall it \\(apt-get install dataset-tiny\\)"):
        manifest.entry_path("sys", "a.txt")
    assert manifest.verify("sys")[0] == ("a.txt", "mismatch")
    (system / "a.txt").unlink()
    with pytest.raises(DataError, match="apt-get install dataset-tiny"):
        manifest.entry_path("sys", "a.txt")
    # from a mirror, the missing file goes to the cache and the root becomes the cache copy
    (env["mirror"] / "sys").mkdir()
    (env["mirror"] / "sys" / "a.txt").write_bytes(FILES["a.txt"])
    root = manifest.entry_path("sys", mirror=env["mirror"])
    assert root == env["cache"] / "sys"
    assert (root / "sub" / "b.bin").read_bytes() == FILES["sub/b.bin"]


def test_python_package_source_reads_inside_the_package(env):
    package_dir = Path(json.__file__).parent
    data = (package_dir / "decoder.py").read_bytes()
    _write_manifest(env["manifests"], "pkg", {"kind": "python_package", "package": "json"},
                    [_spec("decoder.py", data)])
    assert manifest.entry_path("pkg", "decoder.py") == package_dir / "decoder.py"
    _write_manifest(env["manifests"], "nopkg", {"kind": "python_package", "package": "no_such_package_xyz",
                                                 "install_hint": "pip install no-such-package"},
                    [_spec("decoder.py", data)])
    with pytest.raises(DataError, match="'no_such_package_xyz' \\(not installed\\).*pip install no-such-package"):
        manifest.entry_path("nopkg", "decoder.py")


def _fake_wheel(directory, members, name="stimsim-fake-weights", version="1.0"):
    """A minimal wheel (a zip with dist-info) holding ``members`` (member → bytes) in ``directory``."""
    import zipfile

    module = name.replace("-", "_")
    wheel = directory / f"{module}-{version}-py3-none-any.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
        archive.writestr(f"{module}-{version}.dist-info/METADATA",
                         f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Dist: torch (==1.6.0)\n")
        archive.writestr(f"{module}-{version}.dist-info/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{module}-{version}.dist-info/RECORD", "")
    return wheel


@pytest.fixture
def wheel_index(env, monkeypatch):
    """pip limited to a local folder (no index): ``PIP_NO_INDEX`` and ``PIP_FIND_LINKS``."""
    links = env["tmp"] / "wheels"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    return links


WHEEL_SOURCE = {"kind": "pypi_wheel", "package": "stimsim-fake-weights", "version": "1.0",
                "member_dir": "stimsim_fake_weights/weights"}


def test_pypi_wheel_source_extracts_verified_members_into_the_cache(env, wheel_index):
    _fake_wheel(wheel_index, {f"stimsim_fake_weights/weights/{rel}": data for rel, data in FILES.items()})
    _write_manifest(env["manifests"], "wheel", WHEEL_SOURCE, [_spec(rel, data) for rel, data in FILES.items()])
    assert manifest.verify("wheel") == [("a.txt", "missing"), ("sub/b.bin", "missing")]
    path = manifest.entry_path("wheel", "sub/b.bin")
    assert path == env["cache"] / "wheel" / "sub" / "b.bin" and path.read_bytes() == FILES["sub/b.bin"]
    # one download serves every file of the entry: the other is in the cache already
    assert manifest.verify("wheel") == [("a.txt", "ok"), ("sub/b.bin", "ok")]
    for wheel in wheel_index.iterdir():
        wheel.unlink()
    assert manifest.entry_path("wheel", "a.txt").read_bytes() == FILES["a.txt"]
    assert "inside the PyPI wheel stimsim-fake-weights==1.0" in manifest.get_entry("wheel").describe_sources()


def test_pypi_wheel_with_damaged_member_caches_nothing(env, wheel_index):
    _fake_wheel(wheel_index, {"stimsim_fake_weights/weights/a.txt": FILES["a.txt"].upper()})
    _write_manifest(env["manifests"], "wheel", WHEEL_SOURCE, [_spec("a.txt", FILES["a.txt"])])
    with pytest.raises(DataError, match="checksum mismatch.*stimsim-fake-weights-1.0-py3-none-any.whl|"
                                        "checksum mismatch.*stimsim_fake_weights-1.0-py3-none-any.whl"):
        manifest.entry_path("wheel", "a.txt")
    assert not (env["cache"] / "wheel" / "a.txt").exists()


def test_pypi_wheel_failures_fall_through_to_the_alternatives(env, wheel_index):
    server = env["tmp"] / "server"
    server.mkdir()
    (server / "a.txt").write_bytes(FILES["a.txt"])
    files = [_spec("a.txt", FILES["a.txt"])]
    _write_manifest(env["manifests"], "nowheel", WHEEL_SOURCE, files)
    with pytest.raises(DataError) as info:
        manifest.entry_path("nowheel", "a.txt")
    assert "pip download stimsim-fake-weights==1.0 failed (" in str(info.value)
    _fake_wheel(wheel_index, {"elsewhere/a.txt": FILES["a.txt"]})
    with pytest.raises(DataError, match="has no member stimsim_fake_weights/weights/a.txt"):
        manifest.entry_path("nowheel", "a.txt")
    _write_manifest(env["manifests"], "nowheel", WHEEL_SOURCE, files,
                    alternatives=[{"kind": "url", "url": server.as_uri()}])
    assert manifest.entry_path("nowheel", "a.txt") == env["cache"] / "nowheel" / "a.txt"
    assert manifest.get_entry("nowheel").describe_sources().endswith(f"; or download from {server.as_uri()}")


def test_an_installed_alternative_is_used_in_place_before_any_download(env, wheel_index):
    package_dir = Path(json.__file__).parent
    data = (package_dir / "decoder.py").read_bytes()
    _write_manifest(env["manifests"], "wheel", WHEEL_SOURCE, [_spec("decoder.py", data)],
                    alternatives=[{"kind": "python_package", "package": "json"}])
    assert manifest.verify("wheel") == [("decoder.py", "ok")]
    assert manifest.entry_path("wheel", "decoder.py") == package_dir / "decoder.py"
    assert manifest.entry_path("wheel") == package_dir


def test_remove_cached(env):
    manifest.fetch("tiny", mirror=env["mirror"])
    assert manifest.remove_cached("tiny") == env["cache"] / "tiny"
    assert not (env["cache"] / "tiny").exists()
    assert manifest.verify("tiny")[0] == ("a.txt", "missing")


def test_cache_dir_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv(manifest.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert manifest.cache_dir() == tmp_path / "xdg" / "stimsim"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert manifest.cache_dir() == tmp_path / "home" / ".cache" / "stimsim"
    monkeypatch.setenv(manifest.CACHE_DIR_ENV, str(tmp_path / "explicit"))
    assert manifest.cache_dir() == tmp_path / "explicit"


def test_bad_timeout_is_refused(env):
    with pytest.raises(ConfigError, match="timeout_s"):
        manifest.fetch("tiny", mirror=env["mirror"], timeout_s=0)


@pytest.mark.parametrize("change, problem", [
    ({"colour": "red"}, "unknown key"),
    ({"kind": "model"}, "'kind' must be one of 'dataset' or 'checkpoint', got 'model'"),
    ({"files": [{"path": "../escape.txt", "size_bytes": 1, "sha256": None}]}, "relative path"),
    ({"files": [{"path": "/abs.txt", "size_bytes": 1, "sha256": None}]}, "relative"),
    ({"files": [{"path": "a.txt", "size_bytes": 1, "sha256": "ABC"}]}, "64 lower-case hex"),
    ({"files": [{"path": "a.txt", "size_bytes": None, "sha256": "0" * 64}]}, "no size_bytes"),
    ({"files": [{"path": "a.txt", "size_bytes": 1, "sha256": None}] * 2}, "listed twice"),
    ({"files": []}, "'files' must hold at least 1 item"),
    ({"files": [{"path": "a.txt", "size_bytes": "1", "sha256": None}]}, r"\[files\[0\]\]: 'size_bytes' must be an integer, got '1'"),
    ({"source": {"kind": "manual", "instructions": 7}}, r"\[source\]: 'instructions' must be text, got 7"),
    ({"source": {"kind": "ftp", "url": "ftp://x"}}, "source kind 'ftp'"),
    ({"source": {"kind": "url", "url": "ftp://x"}}, "must start with"),
    ({"source": {"kind": "system", "directory": "relative/dir"}}, "must be absolute"),
    ({"source": {"kind": "manual"}}, "needs key"),
    ({"source": {"kind": "manual", "instructions": "x", "url": "http://x"}}, "unknown key"),
    ({"source": {"kind": "pypi_wheel", "package": "w"}}, r"needs key\(s\) \['version'\]"),
    ({"source": {"kind": "pypi_wheel", "package": "w", "version": ">=1.0"}}, "one exact version"),
    ({"source": {"kind": "pypi_wheel", "package": "w", "version": "1", "member_dir": "../x"}}, "member_dir"),
    ({"alternatives": [{"kind": "url", "url": "ftp://x"}]}, r"\[alternatives\[0\]\].*must start with"),
    ({"name": "other"}, "must match the file name"),
])
def test_malformed_manifests_are_refused(env, change, problem):
    entry = json.loads((env["manifests"] / "tiny.json").read_text())
    entry.update(change)
    (env["manifests"] / "tiny.json").write_text(json.dumps(entry))
    with pytest.raises(FileFormatError, match=problem) as info:
        manifest.load_manifests()
    assert "tiny.json" in str(info.value)


def test_repository_manifests_are_complete():
    entries = manifest.load_manifests(REPO_MANIFESTS)
    assert {"afraz2006", "moeller2017", "calibration", "lfw_subset", "fashion_mnist", "tdann"} <= set(entries)
    assert len(entries["floc"].files) == 11 * 144 and len(entries["imagenet_samples"].files) == 1000
    for name in ("mobilenet_v2_imagenet", "efficientnet_lite0_imagenet"):
        assert entries[name].source.kind == "pypi_wheel" and entries[name].kind == "checkpoint"
    assert len(entries["moeller2017"].files) == 330
    assert len(entries["calibration"].files) == 3
    assert entries["fashion_mnist"].source.install_hint == "apt-get install dataset-fashion-mnist"
    tdann = entries["tdann"]
    assert tdann.kind == "checkpoint" and "64qv3" in tdann.source.homepage
    assert all(f.sha256 is None for f in tdann.files)
    for name, entry in entries.items():
        if name != "tdann":
            assert all(f.sha256 is not None and f.size_bytes > 0 for f in entry.files), name
        assert manifest.ManifestEntry.from_dict(entry.to_dict(), entry.manifest_path) == entry


def test_real_afraz2006_entry_verifies_against_shared_data(tmp_path, monkeypatch):
    if not (SHARED_DATA / "afraz2006").is_dir():
        pytest.skip(f"shared data not present at {SHARED_DATA}")
    monkeypatch.delenv(manifest.MANIFEST_DIR_ENV, raising=False)
    monkeypatch.delenv(manifest.MIRROR_DIR_ENV, raising=False)
    monkeypatch.setenv(manifest.CACHE_DIR_ENV, str(tmp_path / "cache"))
    path = manifest.entry_path("afraz2006", "sites_stim100-150ms.csv", mirror=SHARED_DATA)
    assert path == tmp_path / "cache" / "afraz2006" / "sites_stim100-150ms.csv"
    lines = path.read_text().splitlines()
    assert lines[0] == "face_selectivity,psychometric_shift"
    assert len(lines) == 1 + 86  # 86 stimulation sites (Afraz et al. 2006)
    assert manifest.verify("afraz2006") == [("sites_stim100-150ms.csv", "ok")]


def test_installed_sources_verify_in_place(monkeypatch, tmp_path):
    monkeypatch.delenv(manifest.MANIFEST_DIR_ENV, raising=False)
    monkeypatch.setenv(manifest.CACHE_DIR_ENV, str(tmp_path / "cache"))
    assert manifest.verify("lfw_subset") == [("data/lfw_subset.npy", "ok")]
    if not Path("/usr/share/datasets/fashion-mnist").is_dir():
        pytest.skip("Debian package dataset-fashion-mnist not installed")
    assert {status for _, status in manifest.verify("fashion_mnist")} == {"ok"}
