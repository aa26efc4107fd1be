"""Virtual-subject files (TOML; ``experiments/subject_default.toml``): the model, the implanted array and how it
records, and the images it is shown. Declared by :class:`SubjectFile`, whose JSON Schema ships as
``subject.schema.json`` beside this module; every length in mm, rate in Hz, time in ms."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from stimsim.utilities.filemodels import FileModel, Text
from stimsim.utilities.limits import MAX_SEED
from stimsim.utilities.ordering import repeated

#: Where the JSON Schema of subject files ships.
SCHEMA_PATH = Path(__file__).with_name("subject.schema.json")
#: Image sets recorded when a file names none (``[[stimuli]]``): the LFW crops and 80 Fashion-MNIST test images
#: per class (1,000 images).
DEFAULT_STIMULI = ({"source": "lfw_subset"},
                   {"source": "fashion_mnist", "split": "test", "n_per_class": 80, "seed": 0})
#: Most presentations of every image a subject records (labs record tens; 1,000 repeats of the default 1,000
#: images on a 10×10 array already hold 96 million responses, 0.8 GB).
MAX_REPEATS = 1000


class SubjectTable(FileModel):
    """``[subject]``: the model (shipped name, or model directory relative to the file), the seed that draws the
    pose, dead electrodes, gains and trial noise, the lapse rate of its choices, and optionally its cortex scale."""

    model: Text
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)]
    lapse_rate: Annotated[float, Field(ge=0, le=1)] = 0.02
    cortex_mm_per_model_mm: Annotated[float, Field(ge=1e-6, le=100)] | None = None


class PoseTable(FileModel):
    """``[array] pose``: where the array's centre sits on the IT sheet (cortex mm) and its rotation (deg,
    counter-clockwise). An implanted array keeps its layout's spacing: ``scale``, when given (truth.json's pose has
    it), is 1."""

    x_mm: float
    y_mm: float
    rotation_deg: Annotated[float, Field(ge=-360, le=360)] = 0.0
    scale: float = 1.0

    @field_validator("scale")
    @classmethod
    def _rigid(cls, scale: float) -> float:
        if scale != 1:
            raise ValueError(f"'scale' = {scale:g}: an implanted array keeps its layout's spacing, so its pose's scale "
                             "is 1; a .cmp map's spacing is [array] pitch_mm, the cortex's scale [subject] "
                             "cortex_mm_per_model_mm")
        return scale


class ArrayTable(FileModel):
    """``[array]``: the layout ("10x10", "8x8", a .csv or .cmp file), a .cmp map's ids and spacing, the hidden
    pose (drawn from the seed when absent) and the dead electrodes (listed, or a fraction drawn)."""

    layout: Text = "10x10"
    layout_ids: Text = "channel"
    pitch_mm: float | None = None  # a .cmp map's spacing, checked against the plausible range
    pose: PoseTable | None = None
    dead_fraction: Annotated[float, Field(ge=0, le=1)] = 0.0
    dead_electrodes: list[Annotated[int, Field(strict=True)] | Text] | None = None

    @field_validator("dead_electrodes", mode="before")
    @classmethod
    def _ids_once(cls, ids):
        if not isinstance(ids, list):
            return ids  # the type check names it
        odd = [i for i in ids if isinstance(i, bool) or not isinstance(i, (int, str))]
        if odd:
            raise ValueError(f"'dead_electrodes' lists {odd[0]!r}; give electrode ids as the layout names them, "
                             'text or integers (e.g. ["3", "17"])')
        names = [str(i) for i in ids]
        twice = sorted(repeated(names), key=names.index)
        if twice:
            raise ValueError(f"'dead_electrodes' lists {', '.join(map(repr, twice))} more than once; give each "
                             "electrode once")
        return ids

    @field_validator("dead_fraction")
    @classmethod
    def _some_working(cls, fraction: float) -> float:
        if fraction == 1:
            raise ValueError("'dead_fraction' = 1 leaves no working electrode; give a fraction below 1")
        return fraction

    @model_validator(mode="after")
    def _one_way_of_dead(self):
        if self.dead_electrodes is not None and "dead_fraction" in self.model_fields_set:
            raise ValueError("give dead_electrodes (which ones) or dead_fraction (how many, drawn from the seed), "
                             "not both")
        return self


#: Bounds of a virtual recording's numbers, far beyond any multi-unit site's (spikes/s; the gains' log-normal SD;
#: the response window's length in ms), so that a value in other units is refused rather than simulated.
MAX_RATE_HZ = 1000.0
MAX_GAIN_LOG_SD = 3.0
WINDOW_LENGTH_MS = (5.0, 10_000.0)


class RecordingTable(FileModel):
    """``[recording]``: units within ``radius_mm`` of an electrode are pooled; ``repeats`` presentations of every
    image, counted over ``window_ms`` after onset; rates in spikes/s."""

    radius_mm: Annotated[float, Field(ge=1e-6)] = 0.25
    repeats: Annotated[int, Field(ge=1, le=MAX_REPEATS)] = 4
    window_ms: Annotated[list[Annotated[float, Field(ge=0)]], Field(min_length=2, max_length=2)] = [70.0, 170.0]
    baseline_rate_Hz: Annotated[float, Field(ge=0, le=MAX_RATE_HZ)] = 20.0
    gain_Hz_per_sd: Annotated[float, Field(ge=0, le=MAX_RATE_HZ)] = 60.0
    gain_log_sd: Annotated[float, Field(ge=0, le=MAX_GAIN_LOG_SD)] = 0.3
    noise: Literal["poisson", "none"] = "poisson"

    @field_validator("window_ms")
    @classmethod
    def _ordered(cls, window: list) -> list:
        if not window[0] < window[1]:
            raise ValueError(f"'window_ms' must be [start, stop] with 0 <= start < stop, got {window!r}")
        shortest, longest = WINDOW_LENGTH_MS
        if not shortest <= window[1] - window[0] <= longest:
            raise ValueError(f"'window_ms' = {window!r} is a window of {window[1] - window[0]:g} ms; give its start "
                             f"and stop in ms after image onset, {shortest:g} to {longest:g} ms apart (e.g. "
                             "[70, 170]; seconds would be 1000 times too short)")
        return window


class SubjectFile(FileModel):
    """A virtual-subject file: the model, the array implanted in its IT, how it records and what it is shown."""

    subject: SubjectTable
    array: ArrayTable
    recording: RecordingTable = RecordingTable()
    stimuli: Annotated[list[dict[str, Any]], Field(min_length=1)] = [dict(entry) for entry in DEFAULT_STIMULI]


def subject_schema() -> dict:
    """JSON Schema of virtual-subject files."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "stimsim virtual-subject file",
            "description": "A virtual subject (TOML); see stimsim.subject.subject_file.",
            **SubjectFile.model_json_schema()}
