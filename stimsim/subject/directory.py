"""The files of a subject directory besides its recordings: the hidden truth (``truth.json``), the record of every
file's sha256 (:data:`SUBJECT_CHECKSUMS`) and the images shown (``stimuli.npz``), each read back with an error that
names the file and what to do."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from stimsim.data.stimuli import StimulusSet
from stimsim.lab.arrays.layout import ArrayLayout
from stimsim.lab.arrays.pose import ArrayPose
from stimsim.utilities.errors import ConfigError, DataError, FileFormatError, unreadable_reason
from stimsim.utilities.hashing import sha256_of
from stimsim.utilities.io import atomic_write_bytes, read_json

#: The record of a subject directory's files and their sha256, written with them.
SUBJECT_CHECKSUMS = "subject_files.json"
#: What to do about a subject directory whose files are damaged.
REMAKE_SUBJECT = ("make the subject again (`stimsim subject make`; a plan makes its own again when its subject/ is "
                  "deleted)")

def read_truth(path) -> tuple[ArrayLayout, ArrayPose, tuple, dict]:
    """The implant a subject's ``truth.json`` records: its layout, pose (cortex mm, deg), dead electrodes and each
    electrode's gain (spikes/s per SD); a key that is missing or malformed raises FileFormatError naming the file and
    the key."""
    path = Path(path)
    truth = read_json(path)
    if not isinstance(truth, dict):
        raise FileFormatError(path, f"not a virtual subject's truth (a JSON object), got {type(truth).__name__}; "
                                    f"{REMAKE_SUBJECT}")
    gains_key = "gains" if "gains_Hz_per_sd" not in truth and "gains" in truth else "gains_Hz_per_sd"  # earlier name
    missing = [key for key in ("layout", "pose", "dead_electrodes", gains_key) if key not in truth]
    if missing:
        raise FileFormatError(path, f"missing key(s) {', '.join(missing)} of a virtual subject's truth; "
                                    f"{REMAKE_SUBJECT}")

    def read(key, parse):
        try:
            return parse(truth[key])
        except (ConfigError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FileFormatError(path, f"key {key!r} is malformed ({unreadable_reason(exc)}); "
                                        f"{REMAKE_SUBJECT}") from None

    layout = read("layout", ArrayLayout.from_dict)
    pose = read("pose", ArrayPose.from_dict)
    dead = read("dead_electrodes", lambda ids: tuple(_text_items(ids)))
    gains = read(gains_key, lambda values: {str(k): float(v) for k, v in values.items()})
    for key, ids in (("dead_electrodes", set(dead)), (gains_key, set(gains))):
        unknown = sorted(ids - set(layout.electrode_ids))
        if unknown:
            raise FileFormatError(path, f"key {key!r} names electrode(s) {unknown[:5]} that its layout lacks; "
                                        f"{REMAKE_SUBJECT}")
    lacking = [i for i in layout.electrode_ids if i not in gains]
    if lacking:
        raise FileFormatError(path, f"key {gains_key!r} gives no gain for electrode(s) {lacking[:5]} of its layout; "
                                    f"{REMAKE_SUBJECT}")
    return layout, pose, dead, gains


def _text_items(values) -> list[str]:
    """A JSON list of electrode ids as text (a list of anything else raises TypeError)."""
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise TypeError(f"a list of electrode ids (text) is needed, got {values!r:.60}")
    return values


def check_subject_files(directory) -> None:
    """Refuse a subject directory whose files changed since it was made (checked against its
    :data:`SUBJECT_CHECKSUMS`; a directory written before that record existed is not checked)."""
    directory = Path(directory)
    path = directory / SUBJECT_CHECKSUMS
    if not path.is_file():
        return
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))["files_sha256"]
        recorded = {str(name): str(sha) for name, sha in recorded.items()}
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise FileFormatError(path, f"not a subject's record of its files ({exc!r})") from None
    for name, expected in recorded.items():
        file = directory / name
        if not file.is_file():
            raise DataError(f"{directory}: {name} of the virtual subject is missing; {REMAKE_SUBJECT}")
        if sha256_of(file) != expected:
            raise DataError(f"{directory}: {name} changed since the virtual subject was made (its sha256 is not the "
                            f"one {SUBJECT_CHECKSUMS} records); {REMAKE_SUBJECT}")


def write_stimuli_npz(path, stimuli: StimulusSet) -> Path:
    """The images (one array each, any size) with their ids and labels, as one ``.npz``."""
    arrays = {"stimulus_id": stimuli.stimulus_id.astype(str), "name": np.array(stimuli.name)}
    for index, image in enumerate(stimuli.images):
        arrays[f"image_{index:06d}"] = image
    for key, values in stimuli.labels.items():
        arrays[f"label_{key}"] = values
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return atomic_write_bytes(path, buffer.getvalue())


def read_stimuli_npz(path) -> StimulusSet:
    """Read the images written by :func:`write_stimuli_npz`."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            ids = archive["stimulus_id"].astype(str)
            images = [archive[f"image_{i:06d}"] for i in range(len(ids))]
            labels = {key[len("label_"):]: archive[key] for key in archive.files if key.startswith("label_")}
            name = str(archive["name"][()])
    except (OSError, KeyError, ValueError) as exc:
        raise FileFormatError(path, f"not a stimsim stimuli archive ({unreadable_reason(exc)})") from None
    return StimulusSet(name=name, images=images, stimulus_id=ids, labels=labels)
