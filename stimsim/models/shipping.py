"""Ship a built model with the package: copy its files into ``stimsim/shipped_models/NAME`` and list every shipped
file with its size and sha256 in the ``stimsim_default_models`` data manifest entry (which :func:`load_model` checks).

Run from a source checkout::

    python -m stimsim.models.shipping runs/mnv2-s0/model

The model's name is the ``name`` in its ``model.json``; a shipped model of that name is replaced.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from stimsim.models.registry import SHIPPED_DIR, SHIPPED_MANIFEST_ENTRY
from stimsim.utilities.errors import DataError
from stimsim.utilities.hashing import sha256_of
from stimsim.utilities.io import atomic_write_text

#: Largest total size of one shipped model's files (bytes): the package must stay installable.
MAX_MODEL_BYTES = 40 * 2 ** 20


def model_files(model_dir: Path) -> list[Path]:
    """The files a model directory is made of: ``model.json`` and every file its ``files_sha256`` lists."""
    spec = json.loads((model_dir / "model.json").read_text(encoding="utf-8"))
    files = [model_dir / "model.json"] + [model_dir / rel for rel in sorted(spec.get("files_sha256", {}))]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise DataError(f"model directory {model_dir}: files listed in model.json are missing: {missing}")
    return files


def ship_model(model_dir, shipped_dir: Path = SHIPPED_DIR, manifest_path: Path | None = None) -> Path:
    """Copy the model in ``model_dir`` into ``shipped_dir/NAME`` (NAME from its model.json) and rewrite the
    manifest entry's file list over every shipped model. Refused when its files exceed :data:`MAX_MODEL_BYTES`."""
    model_dir = Path(model_dir)
    if not (model_dir / "model.json").is_file():
        raise DataError(f"{model_dir}: no model.json (not a model directory)")
    name = json.loads((model_dir / "model.json").read_text(encoding="utf-8")).get("name")
    if not name or "/" in name or name.startswith("."):
        raise DataError(f"{model_dir}/model.json: 'name' must be a plain model name, got {name!r}")
    files = model_files(model_dir)
    total = sum(p.stat().st_size for p in files)
    if total > MAX_MODEL_BYTES:
        raise DataError(f"model {name}: its files take {total / 2 ** 20:.1f} MiB, more than the "
                        f"{MAX_MODEL_BYTES / 2 ** 20:.0f} MiB a shipped model may take")
    target = Path(shipped_dir) / name
    staging = target.with_name(f".{name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    for path in files:
        dest = staging / path.relative_to(model_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    write_manifest_files(Path(shipped_dir), manifest_path)
    return target


def write_manifest_files(shipped_dir: Path = SHIPPED_DIR, manifest_path: Path | None = None) -> Path:
    """List every file of every shipped model (path relative to the package, size in bytes, sha256) in the
    ``stimsim_default_models`` manifest entry; its other fields are kept."""
    from stimsim.data.manifest import manifest_dir

    path = manifest_path or manifest_dir() / f"{SHIPPED_MANIFEST_ENTRY}.json"
    entry = json.loads(path.read_text(encoding="utf-8"))
    listed = []
    for model_dir in sorted(p for p in shipped_dir.iterdir() if (p / "model.json").is_file()):
        for file in model_files(model_dir):
            listed.append({"path": file.relative_to(shipped_dir.parent).as_posix(),
                           "size_bytes": file.stat().st_size, "sha256": sha256_of(file)})
    entry["files"] = listed
    atomic_write_text(path, json.dumps(entry, indent=2, ensure_ascii=False) + "\n")
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stimsim.models.shipping", description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dirs", nargs="+", type=Path, help="built model directories (holding model.json)")
    for model_dir in parser.parse_args(argv).model_dirs:
        print(ship_model(model_dir))


if __name__ == "__main__":
    main()
