"""Test-wide settings: a private cache directory, and the published data mirror: STIMSIM_MIRROR_DIR
when it is set, else the repository's sibling shared/data."""
import os
import signal
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_configure(config):
    """Under pytest-xdist (``-n 2``) the workers are already one per core, so each computes on one thread (torch
    and the BLAS under numpy, and the processes it starts): two workers of two threads each on two cores ran
    experiments about 1.5 times slower."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        from threadpoolctl import threadpool_limits

        from stimsim.cli import THREAD_VARIABLES

        torch.set_num_threads(1)
        threadpool_limits(1)
        os.environ.update({variable: "1" for variable in THREAD_VARIABLES})


def pytest_collection_modifyitems(config, items):
    """The files that hold end-to-end runs (marked ``slow``) first, each file's tests in their written order: under
    ``-n 2 --dist loadfile --no-loadscope-reorder`` (as .ci/run runs them; without it the files are reordered by
    their number of tests) the long files start early and the short ones fill in, so both workers end together."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(autouse=True)
def _isolated_data_dirs(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("STIMSIM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "stimsim-cache"))
    if not os.environ.get("STIMSIM_MIRROR_DIR") and SHARED_DATA.is_dir():
        monkeypatch.setenv("STIMSIM_MIRROR_DIR", str(SHARED_DATA))


def _absent(message: str):
    """Skip for a missing input, except under continuous integration (``CI=true``), where it fails."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: required)")
    pytest.skip(message)


@pytest.fixture
def default_ctrl_c():
    """A ``preexec_fn`` for a command a test stops with a signal: Ctrl-C (SIGINT) at its default action, and SIGINT,
    SIGTERM and SIGHUP unblocked, as a terminal starts a command, whatever the test runner was started with (one in
    the background ignores SIGINT; one under a supervisor may block signals, and a blocked signal stays pending across
    exec)."""
    def restore():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])

    return restore


@pytest.fixture
def shared_data():
    """``require(rel) -> Path``: ``rel`` inside the published data mirror (STIMSIM_MIRROR_DIR or shared/data);
    absent, it skips the test, except under CI (``CI=true``), where it fails it."""
    def require(rel):
        path = Path(os.environ.get("STIMSIM_MIRROR_DIR") or SHARED_DATA) / rel
        if not path.exists():
            _absent(f"needs the published data: {path} is absent")
        return path

    return require


@pytest.fixture
def base_network():
    """``load(name) -> nn.Module``: base network ``name`` with its ImageNet weights; weights that cannot be
    fetched skip the test, except under CI (``CI=true``), where they fail it."""
    from stimsim.utilities.errors import DataError
    from stimsim.models.base_networks import load_base_network

    def load(name):
        try:
            return load_base_network(name)
        except DataError as exc:
            _absent(f"ImageNet weights of {name} unavailable: {exc}")

    return load


@pytest.fixture
def stop_at_a_table(monkeypatch):
    """``arm(out, module) -> seen``: writing a CSV table (``module.csv_text``) stops the run (Ctrl-C); ``seen`` gets,
    at that moment (one a ``kill -9`` could take), the files of the result set ``out`` holds (name → bytes), or the
    error reading it."""
    from stimsim.utilities.io import read_result_set

    def arm(out, module) -> list:
        seen = []

        def stop(*args, **kwargs):
            try:
                seen.append({name: path.read_bytes() for name, path in read_result_set(out).items()})
            except Exception as exc:
                seen.append(str(exc))
            raise KeyboardInterrupt

        monkeypatch.setattr(module, "csv_text", stop)
        return seen

    return arm


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small tensors on a shared 2-core machine run faster on one intra-op thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


_CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                   "--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr",
                   "--v=0", "--virtual-time-budget=5000")

#: Window width (px) at which reports are opened.
RENDER_WIDTH_PX = 1200

#: Injected into a copy of a report before it is opened: counts the images that decoded to real pixels, and
#: writes the page's scroll width against its visible width (wider: something runs off the right edge).
_RENDER_PROBE = ("<script>window.addEventListener('load', () => { const all = [...document.images];"
                 " const ok = all.filter(i => i.complete && i.naturalWidth > 0).length;"
                 " const page = document.documentElement;"
                 " const width = document.createElement('div'); width.id = 'width-probe';"
                 " width.textContent = page.scrollWidth + '/' + page.clientWidth;"
                 " const div = document.createElement('div'); div.id = 'render-probe';"
                 " div.textContent = ok + '/' + all.length; document.body.append(width, div); });</script>")


@pytest.fixture
def chromium_render(tmp_path):
    """``render(html_path) -> (dom, images_ok, images_total, console_lines)``: the report opened in headless
    Chromium in a RENDER_WIDTH_PX wide window (a copy with a probe script that counts decoded images and puts
    ``<div id="width-probe">scrollWidth/clientWidth</div>`` into ``dom``); ``console_lines`` are the page's
    console messages. ``screenshot=PATH`` also writes a PNG of the page. Skips when Chromium is missing."""
    import re
    import shutil
    import subprocess

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("headless Chromium is not installed (Debian package 'chromium'; .ci/install installs it)")

    def render(html_path, screenshot=None):
        html = Path(html_path).read_text()
        probed = tmp_path / f"probed_{Path(html_path).name}"
        probed.write_text(html.replace("</body>", _RENDER_PROBE + "</body>"))
        profile = tmp_path / "chromium-profile"
        run = subprocess.run([chromium, *_CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                              f"--window-size={RENDER_WIDTH_PX},1600", "--dump-dom",
                              probed.as_uri()], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        if screenshot is not None:
            shot = subprocess.run([chromium, *_CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                   f"--window-size={RENDER_WIDTH_PX},1600", f"--screenshot={screenshot}",
                                   Path(html_path).resolve().as_uri()],
                                  capture_output=True, text=True, timeout=120)
            assert shot.returncode == 0, shot.stderr[-2000:]
        probe = re.search(r'<div id="render-probe">(\d+)/(\d+)</div>', run.stdout)
        assert probe, "the page never finished loading (no probe output)"
        console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
        return run.stdout, int(probe.group(1)), int(probe.group(2)), console

    return render


@pytest.fixture
def pdf_pages(tmp_path):
    """``pages(pdf_path) -> (texts, pngs)``: each page's text (pdftotext) and a PNG per page (pdftoppm).
    Skips when poppler-utils is missing."""
    import shutil
    import subprocess

    if shutil.which("pdftoppm") is None or shutil.which("pdftotext") is None:
        pytest.skip("pdftoppm/pdftotext are not installed (Debian package 'poppler-utils'; .ci/install installs it)")

    def pages(pdf_path):
        prefix = tmp_path / "page"
        subprocess.run(["pdftoppm", "-r", "40", "-png", str(pdf_path), str(prefix)], check=True, timeout=120)
        pngs = sorted(tmp_path.glob("page-*.png"))
        text = subprocess.run(["pdftotext", "-layout", str(pdf_path), "-"], check=True, capture_output=True,
                              text=True, timeout=120).stdout
        return text.split("\f")[:len(pngs)], pngs

    return pages


class OutsidePackage:
    """A package of plug-ins written by a test on ``root``, as a lab's own package would be: its modules (imported in
    this process), then its installed metadata declaring entry points, read by a fresh process."""

    def __init__(self, root: Path, name: str, monkeypatch):
        self.root, self.name = root, name
        (root / name).mkdir()
        (root / name / "__init__.py").write_text("")
        monkeypatch.syspath_prepend(str(root))

    def module(self, module: str, source: str):
        """Write ``<package>/<module>.py`` and import it."""
        import importlib

        (self.root / self.name / f"{module}.py").write_text(source)
        return importlib.import_module(f"{self.name}.{module}")

    def run_installed(self, group: str, entry_point: str, code: str, *args: str):
        """Declare ``entry_point`` (``name = module:attr``) in ``group`` as installed metadata of the package, then run
        ``python -c code args`` in a fresh process that sees the package and this checkout."""
        import subprocess
        import sys

        dist = self.root / f"{self.name}-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {self.name.replace('_', '-')}\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(f"[{group}]\n{entry_point}\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(self.root), str(Path(__file__).resolve().parents[1])])}
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def outside_package(tmp_path, monkeypatch):
    """``outside_package(name)``: an :class:`OutsidePackage` on ``tmp_path``."""
    return lambda name: OutsidePackage(tmp_path, name, monkeypatch)
