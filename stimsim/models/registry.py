"""Models by name: stimsim's shipped default models, or any model directory by path (a name never reads a folder)."""
from __future__ import annotations

import os
from pathlib import Path

from stimsim.errors import DataError
from stimsim.models.topographic import TopographicModel

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "shipped_models"

#: The shipped model used when none is named.
DEFAULT_MODEL = "stimsim-topo-s0"

#: Data manifest entry listing every shipped model file with its sha256.
SHIPPED_MANIFEST_ENTRY = "stimsim_default_models"


def available_models() -> list[str]:
    """Names of the shipped models."""
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(p.name for p in SHIPPED_DIR.iterdir() if (p / "model.json").is_file())


def looks_like_path(name_or_path) -> bool:
    """Whether a model is given as a directory: a ``Path``, or text that starts with ``.``, ``/`` or ``~`` or holds a
    path separator (``./mine``, ``/models/mine``, ``runs/s0/model``); any other text is a model name."""
    if isinstance(name_or_path, Path):
        return True
    text = str(name_or_path)
    return text.startswith((".", "/", "~")) or any(sep in text for sep in {os.sep, os.altsep or os.sep, "/"})


def model_path(name_or_path) -> Path:
    """Directory of a shipped model name, or the given model directory (absolute). A name is only ever a shipped
    model's — a folder of that name in the working directory does not replace it; a directory is given as a path
    (:func:`looks_like_path`)."""
    if looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if (path / "model.json").is_file():
            return path.absolute()
        raise DataError(f"model directory {name_or_path}: no model.json there (not a model directory)")
    if (SHIPPED_DIR / str(name_or_path) / "model.json").is_file():
        return SHIPPED_DIR / str(name_or_path)
    hint = f"; the folder ./{name_or_path} is a model directory: give it as a path" if (
        Path(str(name_or_path)) / "model.json").is_file() else ""
    raise DataError(f"unknown model {name_or_path!r}: not one of the shipped models {available_models()} (a model "
                    f"directory is given as a path: ./NAME, /path/NAME or DIR/NAME){hint}")


def load_model(name_or_path=DEFAULT_MODEL, device="cpu") -> TopographicModel:
    """Load a shipped model by name or a model directory by path onto ``device`` (cpu, cuda, mps, auto;
    checksums verified; a shipped model's files are also checked against its data manifest entry)."""
    path = model_path(name_or_path)
    if path.parent == SHIPPED_DIR:
        from stimsim.data.manifest import entry_paths, get_entry

        prefix = f"shipped_models/{path.name}/"
        entry_paths(SHIPPED_MANIFEST_ENTRY, [f.path for f in get_entry(SHIPPED_MANIFEST_ENTRY).files
                                             if f.path.startswith(prefix)])
    return TopographicModel.load(path, device=device)
