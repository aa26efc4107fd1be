"""Sphinx configuration: the guide's pages in Markdown (myst-parser), the command-line reference from the
command's parser (sphinx-argparse), the API reference from the docstrings (autodoc + napoleon) and a gallery
of short runnable examples (sphinx-gallery, executed at every build)."""
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_tables, this folder's own extension
os.environ.setdefault("OMP_NUM_THREADS", "1")
# the published data mirror for the examples that need it (as the tests find it): the checkout's sibling
# shared/data unless STIMSIM_MIRROR_DIR is set
if not os.environ.get("STIMSIM_MIRROR_DIR") and (ROOT.parent / "shared" / "data").is_dir():
    os.environ["STIMSIM_MIRROR_DIR"] = str(ROOT.parent / "shared" / "data")

import stimsim  # noqa: E402

project = "stimsim"
author = "stimsim contributors"
copyright = "2026 the stimsim developers (MIT License)"
release = stimsim.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
    "myst_parser",
    "sphinxarg.ext",
    "sphinx-jsonschema",
    "bench_tables",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
# headings get GitHub's anchors, so that links such as models.md#default-models-imagenet-trunks work both
# here and on the repository's pages
myst_heading_anchors = 3
# quotes and ellipses become typographic, but "--" stays two hyphens: the command-line reference writes
# options (--out, --figure) inside the help texts
smartquotes_action = "qe"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "none"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_ivar = True
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py", "auto_examples/*.zip",
                    "auto_examples/*.md5", "auto_examples/*.json"]
suppress_warnings = ["config.cache", "ref.python"]

sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    # the examples run in two processes (one per core of the machines the documentation is built on)
    "parallel": 2,
}

html_theme = "alabaster"
html_static_path = []
# Wide enough for the examples' code lines (up to about 110 characters) to show without scrolling.
html_theme_options = {"page_width": "1240px", "sidebar_width": "220px", "body_max_width": "none"}


# stimsim's docstrings write numpy-style fields as "name : what it is, in words", the text often running
# on to indented lines. Napoleon reads the text after the colon as a type, which would print the first
# line in brackets and the rest after a dash; such a field becomes "name" with its text below, as napoleon
# expects. A real type after the colon ("int", "numpy.ndarray", "str, optional") is left as it is.
_FIELD_SECTIONS = {"Parameters", "Returns", "Yields", "Attributes", "Other Parameters", "Raises"}
_FIELD = re.compile(r"^(?P<indent>\s*)(?P<names>[\w*]+(?:\(\))?(?:, [\w*]+)*|\([\w, ]+\)) : (?P<text>.+)$")
_TYPE = re.compile(r"^[\w.]+(?:\[[\w., ]+\])?(?:, optional)?$")


def _fields_as_descriptions(app, what, name, obj, options, lines):
    section, indent = None, None
    for i, line in enumerate(list(lines)):
        stripped = line.strip()
        if i + 1 < len(lines) and re.fullmatch(r"-{3,}", lines[i + 1].strip() or "x"):
            section = stripped if stripped in _FIELD_SECTIONS else None
            indent = len(line) - len(line.lstrip())
            continue
        match = _FIELD.match(line)
        if section and match and len(match["indent"]) == indent and not _TYPE.match(match["text"]):
            lines[i] = match["indent"] + match["names"] + "\n" + match["indent"] + "    " + match["text"]
    expanded = "\n".join(lines).split("\n")
    lines[:] = expanded


def setup(app):
    app.connect("autodoc-process-docstring", _fields_as_descriptions, priority=100)
