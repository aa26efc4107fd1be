"""Models by name: stimsim's shipped default models, or any model directory by path (a name never reads a folder)."""
from __future__ import annotations

import os
from pathlib import Path

from stimsim.models.topographic import TopographicModel
from stimsim.utilities.errors import DataError

#: Current (µA) whose spread length λ the density figure ``units_within_lambda50`` uses.
DENSITY_CURRENT_UA = 50.0

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "shipped_models"

#: The shipped model used when none is named: a topographic IT on MobileNetV2's ImageNet trunk.
DEFAULT_MODEL = "stimsim-mnv2-s0"

#: The small, fast shipped model (32 px grayscale, 4,096 IT units): the engine benchmark's ``small`` and ``dask``
#: workloads, which need a topographic layer before IT.
SMALL_MODEL = "stimsim-topo-s0"

#: Data manifest entry listing every shipped model file with its sha256.
SHIPPED_MANIFEST_ENTRY = "stimsim_default_models"


def available_models() -> list[str]:
    """Names of the shipped models."""
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(p.name for p in SHIPPED_DIR.iterdir() if (p / "model.json").is_file())


def shipped_folders() -> list[str]:
    """Names of every folder in the shipped model directory, a damaged one without ``model.json`` included (hidden
    folders and ``__pycache__`` left out), so that ``models list`` names what it cannot describe."""
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(p.name for p in SHIPPED_DIR.iterdir()
                  if p.is_dir() and not p.name.startswith((".", "__")))


def looks_like_path(name_or_path) -> bool:
    """Whether a model is given as a directory: a ``Path``, or text that starts with ``.``, ``/`` or ``~`` or holds a
    path separator (``./mine``, ``/models/mine``, ``runs/s0/model``); any other text is a model name."""
    if isinstance(name_or_path, Path):
        return True
    text = str(name_or_path)
    return text.startswith((".", "/", "~")) or any(sep in text for sep in {os.sep, os.altsep or os.sep, "/"})


def resolve_model_path(model, base: Path):
    """``model`` as a file in the folder ``base`` gives it: a relative model directory (:func:`looks_like_path`, or a
    folder beside the file given by its bare name) as the absolute path of the directory it names from ``base``, its
    symbolic links and ``..`` resolved, so that one file names one directory from any working folder or path to it;
    a ``~`` path with the home folder written out (so that a file saved with it reads the same directory for anyone);
    a shipped model's name (even beside a folder of that name), an absolute path and anything else as it is."""
    if not isinstance(model, str) or not model.strip() or Path(model).is_absolute():
        return model
    if model.startswith("~"):
        try:
            return str(Path(model).expanduser())
        except RuntimeError:  # ~user of no such user: model_path names it
            return model
    if looks_like_path(model) or ((base / model).is_dir() and model not in available_models()):
        return str((base / model).resolve())
    return model


def model_path(name_or_path) -> Path:
    """Directory of a shipped model name, or the given model directory (absolute). A name is only ever a shipped
    model's — a folder of that name in the working directory does not replace it; a directory is given as a path
    (:func:`looks_like_path`)."""
    if looks_like_path(name_or_path):
        try:
            path = Path(name_or_path).expanduser()
        except RuntimeError:  # ~user of a user this machine does not know
            raise DataError(f"model directory {name_or_path}: {Path(name_or_path).parts[0]} names the home folder of "
                            "a user this machine does not know") from None
        if (path / "model.json").is_file():
            return path.absolute()
        if not path.exists():
            shipped = str(name_or_path).rstrip("/")
            hint = (f"; {shipped} (without '/') is a shipped model"
                    if shipped != str(name_or_path) and (SHIPPED_DIR / shipped / "model.json").is_file() else "")
            raise DataError(f"model directory {name_or_path}: not found{hint}")
        inner = path / "model"
        if (inner / "model.json").is_file():
            hint = f"; {inner} is one: a training run's folder holds its model in model/"
        elif (path / "training_config.json").is_file():  # written by `stimsim train` before its first step
            hint = ("; it is the folder of a training run that has not finished (its model is written to model/ when "
                    "it does: run the same `stimsim train` command again to resume it)")
        else:
            hint = ""
        raise DataError(f"model directory {name_or_path}: no model.json there (not a model directory){hint}")
    if (SHIPPED_DIR / str(name_or_path) / "model.json").is_file():
        return SHIPPED_DIR / str(name_or_path)
    if str(name_or_path) and (SHIPPED_DIR / str(name_or_path)).is_dir():
        raise DataError(f"model {SHIPPED_DIR / str(name_or_path)}: no model.json there (a damaged shipped model "
                        "folder; install stimsim again to restore it)")
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


def describe_model(name_or_path) -> dict:
    """What ``stimsim models list --json`` says of one model, from its ``model.json`` and positions files
    (the network is not built): ``name``, ``path``, ``family``, ``layers`` (layer → area),
    ``base_network`` and ``base_weights_sha256`` (None for a model not built on an ImageNet network),
    ``it_layer`` (the layer labelled IT, else the readout layer), its ``it_units``,
    ``cortex_mm_per_model_mm`` and ``sheet_size_cortex_mm``, ``files_bytes`` (every file of the model),
    ``it_resting_activity`` (whether IT records its units' resting activity, which ``resting_fraction`` needs)
    and ``units_within_lambda50``: the mean number of IT units within λ(50 µA) cortex mm of a site, over
    sites on a square grid of step λ spanning the IT sheet in cortex mm."""
    import numpy as np
    from scipy.spatial import cKDTree

    from stimsim.cortex.sheet import CorticalSheet
    from stimsim.cortex.topography import sheet_grid
    from stimsim.models.base_networks import BASE_NETWORKS
    from stimsim.models.topographic import ModelFile, declared_base_network
    from stimsim.stimulation.spread import kumaravelu_length_mm
    from stimsim.utilities.filemodels import validate_file
    from stimsim.utilities.io import read_json

    path = model_path(name_or_path)
    spec_path = path / "model.json"
    raw = read_json(spec_path)
    spec = validate_file(ModelFile, raw, spec_path)
    missing = [rel for rel in spec.files_sha256 if not (path / rel).is_file()]
    if missing:  # their checksums are checked when the model is loaded; a missing file is said here already
        raise DataError(f"model {path}: file(s) {missing} listed in model.json are missing")
    areas = {layer: info.area for layer, info in spec.layers.items()}
    it_layer = next((layer for layer, area in areas.items() if area == "IT"), spec.readout_layer)
    metadata = raw.get("metadata", {})
    base = declared_base_network(metadata, spec.architecture.kwargs)
    base_sha256 = metadata.get("base_weights_sha256") or (BASE_NETWORKS[base].weights_sha256
                                                          if base in BASE_NETWORKS else None)
    scale = spec.metadata.cortex_scale
    factor = scale.cortex_mm_per_model_mm if scale is not None and scale.layer == it_layer else 1.0
    description = {"name": spec.name or path.name, "path": str(path), "family": spec.architecture.family,
                   "layers": areas, "base_network": base, "base_weights_sha256": base_sha256, "it_layer": it_layer,
                   "it_units": None, "cortex_mm_per_model_mm": factor, "sheet_size_cortex_mm": None,
                   "files_bytes": spec_path.stat().st_size + sum((path / rel).stat().st_size
                                                                  for rel in spec.files_sha256),
                   "it_resting_activity": it_layer in spec.layers
                                          and spec.layers[it_layer].resting_activity_file is not None,
                   "units_within_lambda50": None}
    if it_layer in spec.layers:
        sheet = CorticalSheet.load(path / spec.layers[it_layer].positions_file).scaled(factor)
        lam = kumaravelu_length_mm(DENSITY_CURRENT_UA)
        sites = sheet_grid(sheet, lam)[2]
        counts = cKDTree(sheet.coordinates_mm).query_ball_point(sites, lam, return_length=True)
        description.update(it_units=sheet.n_units, sheet_size_cortex_mm=round(sheet.size_mm, 3),
                           units_within_lambda50=round(float(np.mean(counts)), 2))
    return description
