"""The rig package of a plan (``DIR/rig/``): what a lab loads on its stimulus and stimulation computers.

* ``images/`` — every image a chosen site's trials show as a PNG, the plan's own pixels (levels 0–255), to be
  shown ``[display] size_deg`` wide at ``viewing_distance_cm``: for the sequence task every step of every chosen
  site's sequences, for the face task every noisy test image (shared by the sites);
* ``trials.csv`` — the trial list (:data:`TRIAL_COLUMNS`): ``[session] trials_per_site`` trials per chosen site,
  in randomised interleaved blocks drawn from the plan's seed — each block holds every site once sham and once
  stimulated, in random order; a site's sham and stimulated trials each run through its images in a random
  order before any image repeats, and both show each of its images equally often (sham and stimulation are
  compared on the same images);
* ``trials.nwb`` — the same list as an NWB ``trials`` table, with an empty ``choice`` column for the animal's
  choices ("low" / "high"): a session written with these columns is read by ``stimsim analyze`` as it is;
* ``display.json`` — the display geometry the plan assumed.
"""
from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, ClassVar

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from stimsim.lab.sessions.base import PROTOCOL_COLUMNS as SESSION_PROTOCOL_COLUMNS
from stimsim.lab.sessions.base import file_stem, off_protocol, planned_setting
from stimsim.stimulation.safety import charge_per_phase_nC
from stimsim.utilities.filemodels import FileModel
from stimsim.utilities.io import (atomic_save, atomic_write_bytes, atomic_write_json, atomic_write_text, csv_text,
                                  remove_temporaries)

#: Value of ``stimulated_electrode`` (and ``condition``) on sham trials, as the analysis reads it.
SHAM = "sham"
#: The planned trial clock of the NWB template (s): a trial starts every period and lasts the duration.
TRIAL_PERIOD_S, TRIAL_DURATION_S = 1.5, 1.0

#: Columns of ``trials.csv`` and the NWB template (channel, bank and elec for a .cmp layout only).
TRIAL_COLUMNS = {
    "trial": "trial number, 1 = first",
    "block": "block number: every block holds every site once sham and once stimulated",
    "electrode": "site whose images are shown (electrode id of the plan)",
    "channel": "Cerebus channel of the electrode (bank index × 32 + elec)",
    "bank": "Cerebus bank of the electrode (A–D)",
    "elec": "electrode number within its bank (1–32)",
    "condition": "'sham' or 'stimulation'",
    "stimulated_electrode": "electrode id stimulated on this trial, or 'sham'",
    "sequence": "index of the site's sequence",
    "step": "position along the sequence (0 = 'low' end, last = 'high' end; face task: index of the signed "
            "visual-signal level, 0 = the clearest non-face level, the levels in % are summary.json's "
            "signed_signal_percent)",
    "stimulus_id": "image shown: '{electrode}_seq{sequence}_step{step}' (face task: the noisy image's id)",
    "image_file": "the image's PNG, relative to the rig folder",
    "current_uA": "stimulation current, microamperes (0 on sham trials)",
    "frequency_Hz": "pulse frequency of the train, Hz (empty on sham trials)",
    "pulse_width_ms": "width of each phase, ms (empty on sham trials)",
    "train_ms": "train duration, ms (empty on sham trials)",
    "train_onset_ms": "train onset relative to image onset, ms (negative: before; empty on sham trials)",
}
#: Columns of the NWB template beyond the trial list.
NWB_COLUMNS = {"choice": "the animal's choice, 'low' or 'high' (empty in the template: fill in on the rig)"}
#: Columns of a behavioural session beyond start_time and stop_time (s), as the virtual subject writes them and
#: :mod:`stimsim.lab.sessions` reads them.
SESSION_COLUMNS = {
    "stimulus_id": "image shown: '{electrode}_seq{sequence}_step{step}' (face task: the noisy image's id)",
    "electrode": "site whose image sequence is shown (electrode id)",
    "sequence": "index of the site's sequence",
    "step": "position along the sequence (0 = 'low' end, last = 'high' end)",
    "stimulated_electrode": "electrode id stimulated on this trial, or 'sham'",
    "current_uA": "stimulation current, microamperes (0 on sham trials)",
    "choice": "the subject's choice, 'low' or 'high'",
    "correct": "choice matches the nearer end of the sequence (middle step: false)",
}


#: The most trials per site a plan's ``[session]`` may ask for: several days of a lab's sessions pooled (the power
#: forecast simulates each count 100 times, and the rig's trial list holds every trial).
MAX_TRIALS_PER_SITE = 20_000


class SessionTable(FileModel):
    """A plan's ``[session]``: ``trials_per_site`` (even: half sham, half stimulated; at most 20,000) and the train
    onset relative to image onset, ms (negative: before)."""

    table: ClassVar[str] = "session"

    trials_per_site: Annotated[int, Field(ge=2, le=MAX_TRIALS_PER_SITE)] = 400
    train_onset_ms: Annotated[float, Field(ge=-10_000, le=10_000)] = 0.0

    @field_validator("trials_per_site")
    @classmethod
    def _even(cls, trials: int) -> int:
        if trials % 2:
            raise ValueError(f"'trials_per_site' must be even (half sham, half stimulated), got {trials}")
        return trials


#: Eye-to-screen distances accepted, cm: a value outside them is almost surely in other units.
MIN_VIEWING_DISTANCE_CM, MAX_VIEWING_DISTANCE_CM = 10.0, 500.0


class DisplayTable(FileModel):
    """A plan's ``[display]``: images ``size_deg`` wide (degrees of visual angle) at ``viewing_distance_cm``."""

    table: ClassVar[str] = "display"

    size_deg: Annotated[float, Field(gt=0, lt=180)] = 8.0
    viewing_distance_cm: Annotated[float, Field(gt=0)] = 57.0

    @field_validator("viewing_distance_cm")
    @classmethod
    def _in_cm(cls, distance_cm: float) -> float:
        if not MIN_VIEWING_DISTANCE_CM <= distance_cm <= MAX_VIEWING_DISTANCE_CM:
            hint = f" (a distance in metres? {distance_cm:g} m is {100 * distance_cm:g} cm)" if distance_cm < 10 else ""
            raise ValueError(f"'viewing_distance_cm' must lie between {MIN_VIEWING_DISTANCE_CM:g} and "
                             f"{MAX_VIEWING_DISTANCE_CM:g} cm, the eye-to-screen distances of a rig (57 cm puts 1 cm "
                             f"on 1°), got {distance_cm:g}{hint}")
        return distance_cm


@dataclass(frozen=True)
class RigSpec:
    """The session the plan is made for (``[session]``) and the display its images are shown on (``[display]``)."""

    session: SessionTable = SessionTable()
    display_table: DisplayTable = DisplayTable()

    @property
    def trials_per_site(self) -> int:
        return self.session.trials_per_site

    @property
    def train_onset_ms(self) -> float:
        return self.session.train_onset_ms

    @property
    def size_deg(self) -> float:
        return self.display_table.size_deg

    @property
    def viewing_distance_cm(self) -> float:
        return self.display_table.viewing_distance_cm

    @property
    def image_size_cm(self) -> float:
        """Width of an image on the screen, cm: 2 d tan(size / 2)."""
        return 2 * self.viewing_distance_cm * math.tan(math.radians(self.size_deg) / 2)

    def display(self, image_px: int) -> dict:
        """display.json: the geometry for images ``image_px`` pixels wide."""
        return {"size_deg": self.size_deg, "viewing_distance_cm": self.viewing_distance_cm,
                "image_size_cm": self.image_size_cm, "image_px": int(image_px),
                "pixels_per_deg": image_px / self.size_deg,
                "note": "show every image at size_deg × size_deg degrees of visual angle (image_size_cm on the "
                        "screen at viewing_distance_cm), scaled from its image_px pixels"}

    def to_dict(self) -> dict:
        return {"session": self.session.to_dict(), "display": self.display_table.to_dict()}


def image_names(electrodes) -> dict:
    """Electrode id → the stem of its images' file names (:func:`~stimsim.lab.sessions.base.file_stem`), prefixed by
    the site's number where two ids would share a stem."""
    stems = [file_stem(e) for e in electrodes]
    if len(set(stems)) < len(stems):
        stems = [f"site{i + 1}_{stem}" for i, stem in enumerate(stems)]
    return dict(zip(map(str, electrodes), stems))


def sequence_images(electrodes, n_sequences: int, n_steps: int) -> dict[str, list[dict]]:
    """The images of every site's sequences, as :func:`trial_list` takes them: electrode id → one entry per
    (sequence, step) with its ``stimulus_id`` and ``image_file`` (``images/<stem>_seq<j>_step<k>.png``)."""
    stems = image_names(electrodes)
    return {electrode: [{"sequence": j, "step": k, "stimulus_id": f"{electrode}_seq{j}_step{k}",
                         "image_file": f"images/{stems[electrode]}_seq{j}_step{k}.png"}
                        for j in range(n_sequences) for k in range(n_steps)] for electrode in map(str, electrodes)}


def trial_list(electrodes, images: dict[str, list[dict]], spec: RigSpec, stimulation: dict, seed: int,
               layout=None) -> pd.DataFrame:
    """The trial list of :data:`TRIAL_COLUMNS` for ``electrodes`` (the chosen sites); ``images``: electrode id →
    the images its trials run through (entries with sequence, step, stimulus_id, image_file; e.g.
    :func:`sequence_images`), as many for every site. ``layout`` (an :class:`~stimsim.lab.arrays.ArrayLayout`) gives
    the Cerebus channel, bank and elec of a .cmp map."""
    rng = np.random.default_rng([seed, 0x816])
    electrodes = [str(e) for e in electrodes]
    n_images = len(images[electrodes[0]]) if electrodes else 0
    if any(len(images[electrode]) != n_images for electrode in electrodes):
        raise ValueError("every site's trials must run through as many images")
    if electrodes and not n_images:
        raise ValueError("every site's trials must run through at least one image")
    n_blocks = spec.trials_per_site // 2
    full_passes, left_over = divmod(n_blocks, n_images) if n_images else (0, 0)

    def schedules():  # one site's images for sham and for stimulation: each every image once before any repeats
        last_pass = rng.choice(n_images, size=left_over, replace=False)  # shown once more in both conditions
        return [np.concatenate([*(rng.permutation(n_images) for _ in range(full_passes)), rng.permutation(last_pass)])
                for _ in range(2)]

    order = {}
    for site in range(len(electrodes)):
        order[(site, False)], order[(site, True)] = schedules()
    rows = []
    for block in range(n_blocks):
        entries = [(site, stim) for site in range(len(electrodes)) for stim in (False, True)]
        for index in rng.permutation(len(entries)):
            site, stim = entries[index]
            electrode = electrodes[site]
            shown = images[electrode][order[(site, stim)][block]]
            row = {"trial": len(rows) + 1, "block": block + 1, "electrode": electrode}
            numbers = None if layout is None else layout.cerebus_numbers(electrode)
            if numbers is not None:
                row.update(numbers)
            row.update({
                "condition": "stimulation" if stim else SHAM, "stimulated_electrode": electrode if stim else SHAM,
                "sequence": int(shown["sequence"]), "step": int(shown["step"]), "stimulus_id": shown["stimulus_id"],
                "image_file": shown["image_file"],
                "current_uA": float(stimulation["current_uA"]) if stim else 0.0,
                "frequency_Hz": float(stimulation["frequency_Hz"]) if stim else np.nan,
                "pulse_width_ms": float(stimulation["pulse_width_ms"]) if stim else np.nan,
                "train_ms": float(stimulation["train_ms"]) if stim else np.nan,
                "train_onset_ms": spec.train_onset_ms if stim else np.nan})
            rows.append(row)
    return pd.DataFrame(rows)


def write_rig(out_dir: Path, images: dict[str, np.ndarray], spec: RigSpec, trials: pd.DataFrame,
              description: str, stimulation: dict, subject_id: str = "subject") -> Path:
    """Write ``DIR/rig``: ``images`` (file relative to the rig folder → (H, W) grayscale or (H, W, 3) RGB in [0, 1],
    all of one size) as PNGs, the trial list as CSV and NWB template, display.json, and stimulation.json (the
    plan's whole protocol, ``stimulation`` with the train onset: what the stimulator is programmed with). The NWB
    template is of ``subject_id`` (the plan's subject), so that the session filled in from it reads against its
    plan. The temporary files of a write that was killed, and the images of sites an earlier run of the plan chose
    under other constraints, are removed first, so that the folder the lab copies to its rig holds the chosen sites'
    images only. Returns the folder."""
    from stimsim.report.figures import image_png

    rig = Path(out_dir) / "rig"
    (rig / "images").mkdir(parents=True, exist_ok=True)
    remove_temporaries(rig, rig / "images")
    shown = {Path(name).name for name in images}
    for stale in (rig / "images").glob("*.png"):
        if stale.name not in shown:
            stale.unlink()
    for name, image in images.items():
        atomic_write_bytes(rig / name, image_png(image))
    atomic_write_text(rig / "trials.csv", csv_text(trials, significant_digits=10))
    template = trials.assign(start_time=(trials["trial"] - 1) * TRIAL_PERIOD_S,
                             stop_time=(trials["trial"] - 1) * TRIAL_PERIOD_S + TRIAL_DURATION_S, choice="")
    write_trials_nwb(template, rig / "trials.nwb", subject_id=subject_id, session_id="planned", template=True,
                     description=f"stimsim plan {description}: trial list to run (planned times; choices to fill "
                                 "in; give each day's session its own session_id and start time)")
    atomic_write_json(rig / "display.json", spec.display(next(iter(images.values())).shape[1]))
    protocol = {key: stimulation[key] for key in STIMULATOR_KEYS}
    atomic_write_json(rig / "stimulation.json", {**protocol, "train_onset_ms": spec.train_onset_ms,
                                                 "charge_per_phase_nC": charge_per_phase_nC(
                                                     protocol["current_uA"], protocol["pulse_width_ms"])})
    return rig


def write_trials_nwb(trials: pd.DataFrame, path, subject_id: str, session_id: str, description: str,
                     species: str | None = None, subject_description: str | None = None,
                     template: bool = False, notes: str | None = None) -> Path:
    """``trials`` (start_time, stop_time and columns of :data:`TRIAL_COLUMNS`, :data:`SESSION_COLUMNS` and, in the
    rig's ``template`` to fill in, :data:`NWB_COLUMNS`) as the NWB trials table, written atomically; empty numbers
    (sham trials' train) as NaN, empty text (a blank cell of a lab's trial list) as ""; ``notes``: the file's
    notes."""
    from hdmf.common import VectorData
    from pynwb import NWBHDF5IO, NWBFile
    from pynwb.epoch import TimeIntervals
    from pynwb.file import Subject

    described = {**TRIAL_COLUMNS, **(NWB_COLUMNS if template else SESSION_COLUMNS),
                 **{column["name"]: column["description"] for column in TimeIntervals.__columns__}}
    # Whole columns at once (a row at a time took about 20 s for 48,000 trials): numbers as arrays, text as lists.
    # NWB text has no missing value: a blank cell of a lab's trial list (read as NaN) is the empty text.
    columns = [trials[name] for name in ("start_time", "stop_time",
                                         *(name for name in trials.columns if name not in ("start_time", "stop_time")))]
    table = TimeIntervals(name="trials", description="experimental trials", id=np.arange(len(trials)), columns=[
        VectorData(name=column.name, description=described.get(column.name, column.name),
                   data=column.to_numpy() if pd.api.types.is_numeric_dtype(column)
                   else column.fillna("").astype(str).tolist())
        for column in columns])
    nwbfile = NWBFile(session_description=description, identifier=str(uuid.uuid4()),
                      session_start_time=datetime.now(timezone.utc), session_id=session_id, notes=notes,
                      subject=Subject(subject_id=subject_id, species=species, description=subject_description),
                      trials=table)

    def write(tmp):
        with NWBHDF5IO(tmp, "w") as io:
            io.write(nwbfile)

    return atomic_save(path, write)


def read_trial_list(path) -> pd.DataFrame:
    """A plan's ``rig/trials.csv`` (ids as text)."""
    from stimsim.utilities.errors import FileFormatError

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trial list not found: {path} (a plan writes it as rig/trials.csv)")
    try:
        table = pd.read_csv(path, dtype={"electrode": str, "stimulated_electrode": str, "bank": str})
    except pd.errors.EmptyDataError:
        raise FileFormatError(path, "empty: a trial list has a header line and one row per trial") from None
    except (UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise FileFormatError(path, f"not a CSV trial list ({type(exc).__name__}: {exc})") from None
    missing = [name for name in ("trial", "electrode", "stimulated_electrode", "sequence", "step", "current_uA")
               if name not in table]
    if missing:
        raise FileFormatError(path, f"missing column(s) {missing}; a trial list as `stimsim plan` writes it in "
                                    "rig/trials.csv has them")
    number = pd.to_numeric(table["trial"], errors="coerce")
    bad = ~np.isfinite(number) | (number != np.round(number)) | (number < 1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise FileFormatError(path, f"column 'trial': trial numbers are integers from 1; data row {first + 1} has "
                                    f"{str(table['trial'].iloc[first])!r}")
    again = number.duplicated(keep=False).to_numpy()
    if again.any():
        first, second = np.flatnonzero(number.to_numpy() == number[again].iloc[0])[:2] + 1
        raise FileFormatError(path, f"column 'trial': trial {int(number[again].iloc[0])} is listed twice (data rows "
                                    f"{first} and {second}); each trial of a list runs once, so a repeated number "
                                    "means rows given twice")
    return table


#: What the stimulator is set to, of a plan's ``[stimulation]`` (its other keys describe the model's response).
STIMULATOR_KEYS = ("current_uA", "frequency_Hz", "pulse_width_ms", "interphase_ms", "waveform", "train_ms")
#: Trial-list columns that must carry the plan's own protocol on every stimulation trial, and their units.
PROTOCOL_COLUMNS = {"current_uA": "µA", **SESSION_PROTOCOL_COLUMNS}


def stimulation_trials(trials: pd.DataFrame) -> np.ndarray:
    """Which rows of a trial list stimulate: ``stimulated_electrode`` is not 'sham' (in any case, spaces around it
    ignored, as session files are read)."""
    return (trials["stimulated_electrode"].astype(str).str.strip().str.lower() != SHAM).to_numpy()


def _listed(trials: pd.DataFrame, mask, values) -> str:
    """"trial(s) 3, 8, … (e.g. value)": the trial numbers of the rows in ``mask`` and the first row's value."""
    numbers = trials["trial"].astype(str).to_numpy()  # read_trial_list requires the column
    shown = ", ".join(numbers[mask][:5]) + (" …" if mask.sum() > 5 else "")
    example = np.asarray(values)[mask][0]
    return f"trial(s) {shown} (e.g. {example.item() if isinstance(example, np.generic) else example!r})"


def check_trial_protocol(trials: pd.DataFrame, path, stimulation: dict) -> None:
    """Refuse a trial list (read by :func:`read_trial_list`) that another protocol than the plan's would run: a
    ``condition`` that disagrees with ``stimulated_electrode``, or a stimulation trial whose current, frequency,
    pulse width, train or train onset (the columns present of :data:`PROTOCOL_COLUMNS`) differs from
    ``stimulation`` (the plan's protocol, as :func:`~stimsim.analysis.plan_readback.read_plan_protocol` reads it).
    One FileFormatError naming ``path``, the columns and the trials."""
    from stimsim.utilities.errors import FileFormatError

    stimulated = stimulation_trials(trials)
    problems = []
    if "condition" in trials:
        given = trials["condition"].astype(str)
        wrong = given.str.strip().str.lower().to_numpy() != np.where(stimulated, "stimulation", SHAM)
        if wrong.any():
            problems.append(f"column 'condition', {_listed(trials, wrong, given)}: must be 'stimulation' where "
                            "stimulated_electrode names an electrode and 'sham' where it is 'sham'")
    for column, unit in PROTOCOL_COLUMNS.items():
        if column not in trials:
            continue
        wrong = off_protocol(pd.to_numeric(trials[column], errors="coerce"), stimulated, stimulation[column])
        if wrong.any():
            problems.append(f"column '{column}', {_listed(trials, wrong, trials[column])}: "
                            f"{planned_setting(column, stimulation[column], unit)}")
    if problems:
        raise FileFormatError(path, "; ".join(problems) + ". The virtual subject's responses were computed for the "
                                  "plan's protocol; a list for another protocol needs a plan made with it")


def check_trial_images(trials: pd.DataFrame, path, planned: pd.DataFrame, planned_path) -> None:
    """Refuse a trial list (read by :func:`read_trial_list`) that shows other images than the plan's own list
    (``planned``, read from ``planned_path``, its rig/trials.csv) gives its stimuli: a ``stimulus_id`` that list never
    shows, or one given with another sequence, step or image file. The virtual subject answers by site, sequence
    and step, and the rig shows the image file, so the three must name one image. Lists without ``stimulus_id``
    are not checked. One FileFormatError naming ``path``, the columns and the trials."""
    from stimsim.utilities.errors import FileFormatError

    if "stimulus_id" not in trials or "stimulus_id" not in planned:
        return
    known = planned.assign(stimulus_id=planned["stimulus_id"].astype(str)).drop_duplicates("stimulus_id")
    known = known.set_index("stimulus_id")
    ids = trials["stimulus_id"].astype(str)
    unknown = (~ids.isin(known.index)).to_numpy()
    problems = []
    if unknown.any():
        problems.append(f"column 'stimulus_id', {_listed(trials, unknown, ids)}: not an image of the plan's trial "
                        f"list {planned_path}")
    for column in ("sequence", "step", "image_file"):
        if column not in trials or column not in known:
            continue
        expected = ids.map(known[column])
        if column == "image_file":
            wrong = trials[column].astype(str).str.strip() != expected.astype(str)
        else:
            wrong = pd.to_numeric(trials[column], errors="coerce") != pd.to_numeric(expected)
        wrong = wrong.to_numpy() & ~unknown
        if wrong.any():
            first = ids.to_numpy()[wrong][0]
            problems.append(f"column '{column}', {_listed(trials, wrong, trials[column])}: the plan's trial list "
                            f"gives stimulus {first!r} {column} {known.at[first, column]!r}")
    if problems:
        raise FileFormatError(path, "; ".join(problems) + ". A trial must show the image whose responses the plan "
                                  "computed: take stimulus_id, sequence, step and image_file from the plan's "
                                  "rig/trials.csv")
