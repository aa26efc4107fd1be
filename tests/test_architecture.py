"""The package's structure: no import circles between modules, the layers declared in setup.cfg kept
(import-linter), and every module over 500 lines saying at its top why it is one module."""
from __future__ import annotations

import ast
from pathlib import Path

import grimp
import numpy as np
from importlinter.cli import lint_imports
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stimsim"
MAX_LINES = 500
#: How a long module's docstring states its reason.
LONG_MODULE_MARK = "Over 500 lines:"


def _import_circles(graph) -> list[list[str]]:
    """The strongly connected sets of more than one module; a module importing its own parent package
    (the package's ``__init__``) is not counted, since that package exists before its modules."""
    modules = sorted(graph.modules)
    index = {name: i for i, name in enumerate(modules)}
    rows, cols = [], []
    for name in modules:
        for imported in graph.find_modules_directly_imported_by(name):
            if imported in index and not name.startswith(imported + "."):
                rows.append(index[name])
                cols.append(index[imported])
    adjacency = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(modules), len(modules)))
    _, labels = connected_components(adjacency, directed=True, connection="strong")
    groups = [[modules[i] for i in np.flatnonzero(labels == label)] for label in np.unique(labels)]
    return [group for group in groups if len(group) > 1]


def test_circle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg")  # a module importing its own package: no circle
    graph.add_import(importer="pkg", imported="pkg.c")
    assert _import_circles(graph) == [["pkg.a", "pkg.b"]]


def test_no_import_circles():
    circles = _import_circles(grimp.build_graph("stimsim", cache_dir=None))
    assert not circles, "modules that import one another: " + "; ".join(" <-> ".join(c) for c in circles)


def test_layers_declared_in_setup_cfg_are_kept(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert lint_imports(config_filename=str(ROOT / "setup.cfg"), cache_dir=None) == 0, \
        "an import crosses the layers of setup.cfg [importlinter]; run `lint-imports` for the chain"


def test_long_modules_state_why():
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_LINES and LONG_MODULE_MARK not in (ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not unexplained, f"modules over {MAX_LINES} lines whose docstring does not say why " \
                            f"(\"{LONG_MODULE_MARK} ...\"): {unexplained}"


def test_module_paths_from_before_the_re_layout_still_import_with_a_warning():
    """A script written for the earlier layout (``from stimsim.arrays import ArrayLayout``) gets the module at its
    new place — the same objects — and a DeprecationWarning naming it; every old path points at a module."""
    import importlib
    import subprocess
    import sys

    from stimsim.utilities.moved import MOVED

    for new in MOVED.values():
        importlib.import_module(new)
    run = subprocess.run([sys.executable, "-W", "always", "-c",
                          "from stimsim.arrays import ArrayLayout; import stimsim.lab.arrays.layout as layout; "
                          "import stimsim.sheet, stimsim.cortex.sheet; "
                          "print(ArrayLayout is layout.ArrayLayout, stimsim.sheet is stimsim.cortex.sheet)"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.split() == ["True", "True"], run.stderr
    assert "DeprecationWarning: stimsim.arrays is now stimsim.lab.arrays; import it from there" in run.stderr
    assert "DeprecationWarning: stimsim.sheet is now stimsim.cortex.sheet" in run.stderr
