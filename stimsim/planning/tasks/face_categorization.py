"""The face / non-face task of Afraz, Kiani & Esteky 2006 (Nature 442:692) as a plan task
(``task = "face_categorization"``, plan table ``[face_task]``).

The trials are those of the categorisation paradigm (:func:`stimsim.paradigms.categorization.categorization_trials`,
as ``experiments/afraz2006.toml`` makes them): ``n_per_class`` face and ``n_per_class`` non-face images drawn
(seeded) from the plan's images (label ``category``: ``"face"`` against every other value) and split into
fitting and test images (stratified; all noisy copies of an image on the same side); ``label`` and ``positive``
name another label and value that marks faces, e.g. fLoc's ``domain = "face"``. For each model every image
is brought to the model's input size and colour, then degraded to each visual-signal level of
``signal_percent`` (a fraction 1 − s/100 of its pixels replaced by uniform noise), so that the network sees the
stated level. In every model a logistic face / non-face readout of IT is fitted on the fitting images without
stimulation and frozen; on the test images P(face) is the mean choice probability, without stimulation and with
stimulation at a site. The site's effect is ΔP(face) = stimulated − control (chance 0; Afraz et al. 2006 report
a shift towards "face" at face-selective sites).

The rehearsal also keeps the psychometric curve of Afraz et al.'s Fig. 2: P(face) at every signed visual-signal
level (non-face images at −s %, face images at +s %; at 0 % every pixel is noise, so the two classes are one level),
as ``p_high`` on the steps of that axis (one "sequence" per site, ``signed_signal_percent`` on ``step``). This is the
session contract of :mod:`stimsim.planning.session` and :mod:`stimsim.lab.sessions` ("high" is the choice "face",
step 0 the clearest non-face level), so that virtual sessions, ``stimsim analyze --plan`` and ``stimsim power``
take a face plan as they take a sequence plan. Its rig package shows every site the test images as the chosen
candidate saw them, each trial at its image's step.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Annotated, ClassVar

import numpy as np
import xarray as xr
from pydantic import Field, field_validator

from stimsim.engine import simulate
from stimsim.paradigms.categorization import CategorizationOptions, categorization_trials, clean_images, shown_images
from stimsim.paradigms.schema import DecoderFile
from stimsim.planning.detectability import power_forecast
from stimsim.planning.rig import image_names, trial_list, write_rig
from stimsim.planning.tasks.base import PlanTask, control_and_stimulated, register_plan_task, stimulation_at
from stimsim.stimulation import Condition
from stimsim.utilities.filemodels import FileModel, Text

FACE, NONFACE = "face", "nonface"
AFRAZ_SIGNAL_PERCENT = (0.0, 15.0, 25.0, 40.0, 50.0, 80.0, 100.0)
IT = "IT"


def signed_signal_levels(signal_percent) -> np.ndarray:
    """The steps of the psychometric axis, ascending: −s for non-face and +s for face images at every visual-signal
    level s (%), 0 % once (pure noise shows no class)."""
    levels = np.asarray(signal_percent, dtype=np.float64)
    return np.unique(np.concatenate([-levels, levels]) + 0.0)  # + 0.0 turns −0.0 into 0.0


def steps_of(signed_percent, levels: np.ndarray) -> np.ndarray:
    """The step of every image: the index of its signed visual signal (%) in ``levels``
    (:func:`signed_signal_levels`)."""
    signed = np.asarray(signed_percent, dtype=np.float64) + 0.0
    if not np.isin(signed, levels).all():
        raise ValueError(f"an image's signed signal is not one of the steps {levels.tolist()}")
    return np.searchsorted(levels, signed)


def curves_by_step(p_face: np.ndarray, signed_percent, levels: np.ndarray) -> np.ndarray:
    """Mean P(face) over the images of every step: ``p_face`` (..., n_images) → (..., n_steps); ``signed_percent``
    is each image's signed visual signal (%), ``levels`` the steps (:func:`signed_signal_levels`)."""
    step = steps_of(signed_percent, levels)
    counts = np.bincount(step, minlength=len(levels))
    if np.any(counts == 0):
        raise ValueError(f"step(s) {levels[counts == 0].tolist()} % have no image")
    sums = np.stack([p_face[..., step == k].sum(-1) for k in range(len(levels))], axis=-1)
    return sums / counts


class FaceTaskSpec(FileModel):
    """The face task (a plan's ``[face_task]`` table): label, positive : the images' label and its value that marks
    a face (every other value is a non-face; ``label = "domain"`` for fLoc photographs, whose ``category`` is
    adult, child, ...); n_per_class : face and non-face images drawn from the plan's images; signal_percent :
    visual-signal levels (% of pixels kept, distinct); fit_fraction : clean images whose copies fit the decoder;
    C : its inverse regularisation."""

    table: ClassVar[str] = "face_task"

    label: Text = "category"
    positive: Text = FACE
    n_per_class: Annotated[int, Field(ge=2)] = 40
    signal_percent: Annotated[tuple[Annotated[float, Field(ge=0, le=100)], ...], Field(min_length=1)] = \
        AFRAZ_SIGNAL_PERCENT
    fit_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.5
    C: Annotated[float, Field(gt=0)] = 1e-3

    @field_validator("positive")
    @classmethod
    def _not_the_merged_choice(cls, positive: str) -> str:
        if positive == NONFACE:
            raise ValueError(f"'positive' names the value of 'label' that marks a face; {NONFACE!r} is the name of the "
                             "task's other choice (every other value of the label), so it cannot be that value")
        return positive

    @field_validator("signal_percent", mode="before")
    @classmethod
    def _as_tuple(cls, levels):
        return tuple(levels) if isinstance(levels, list) else levels

    @field_validator("signal_percent")
    @classmethod
    def _distinct(cls, levels: tuple) -> tuple:
        if len(set(levels)) != len(levels):
            raise ValueError(f"'signal_percent' must be distinct percentages in [0, 100], got {list(levels)}")
        return levels

    def categorization(self) -> tuple[CategorizationOptions, DecoderFile]:
        """The categorisation paradigm's options and decoder for this task: ``positive`` against every other value of
        ``label``, as the choices "face" and "nonface"."""
        return (CategorizationOptions(label=self.label, positive=self.positive, negative=NONFACE,
                                      n_per_choice=self.n_per_class,
                                      signal_percent=tuple(self.signal_percent)),
                DecoderFile(C=self.C, fit_fraction=self.fit_fraction, layer=IT))


@register_plan_task("face_categorization")
class FaceCategorizationTask(PlanTask):
    """P(face) on noisy face / non-face images without and with stimulation (module docstring)."""

    paradigm = "categorization"
    effect = "delta_p_face"
    effect_label = "ΔP(face)"
    probability = "p_face"
    tables = {"face_task": FaceTaskSpec}

    def prepare(self, options, images, seed, where):
        """The plan's images, once their face and non-face images are checked (label and counts)."""
        choices, _ = options.face_task.categorization()
        clean_images(choices, images, seed, f"{where} [face_task]", count_key="n_per_class")
        return SimpleNamespace(images=images, where=f"{where} [face_task]",
                               levels=signed_signal_levels(options.face_task.signal_percent))

    def rehearse(self, model, options, trials, points_mm, stimulation, seed, engine, progress) -> dict:
        """P(face) on the test images (noisy copies at ``model``'s input geometry) without stimulation and with
        stimulation at every point: ``p_face`` (n_sites, 1 + n_points; column 0 is the control, the same for every
        site), ``delta_p_face`` (n_sites, n_points, 1) and the psychometric curves ``p_high`` (n_sites, 1 + n_points,
        1, n_steps): P(face) at every step of ``trials.levels``."""
        choices, decoder = options.face_task.categorization()
        task = categorization_trials(choices, decoder, model, trials.images, seed, trials.where, "n_per_class")
        points = np.asarray(points_mm, dtype=np.float64)
        n_sites, n_points = points.shape[:2]
        conditions = [Condition("control")] + [
            Condition(f"site{i}_point{k}", (stimulation_at(points[i, k], stimulation),))
            for i in range(n_sites) for k in range(n_points)]
        result = simulate(model, task.test.images, conditions, task.decoder, progress=progress,
                          safety_limits=engine["safety_limits"], safety_override=engine["safety_override"])
        by_image = result.sel(choice=options.face_task.positive).transpose("condition", ...).values
        p_face = by_image.mean(-1)
        stimulated = p_face[1:].reshape(n_sites, n_points)
        curves = curves_by_step(by_image, task.test.labels["signed_signal_percent"], trials.levels)
        curves = np.concatenate([np.broadcast_to(curves[:1], (n_sites, 1, curves.shape[-1])),
                                 curves[1:].reshape(n_sites, n_points, -1)], axis=1)
        return {"p_face": np.column_stack([np.full(n_sites, p_face[0]), stimulated]),
                "delta_p_face": (stimulated - p_face[0])[..., None], "p_high": curves[:, :, None, :]}

    def dataset_variables(self, working, trials, rehearsals) -> tuple[dict, dict]:
        names = list(rehearsals)
        p_face = np.stack([rehearsals[n]["p_face"] for n in names])  # (model, electrode, 1 + poses)
        control = np.broadcast_to(p_face[:, :, :1], p_face[:, :, 1:].shape)
        variables = {
            "p_face": (("model", "electrode", "pose", "stimulated"), np.stack([control, p_face[:, :, 1:]], axis=-1),
                       {"description": "each candidate's P(face) over the test images, without and with "
                                       "stimulation"}),
            "delta_p_face": (("model", "electrode", "pose"),
                             np.stack([rehearsals[n]["delta_p_face"][..., 0] for n in names]),
                             {"description": "P(face) stimulated - without stimulation"}),
            "p_high": (("model", "electrode", "pose", "stimulated", "sequence", "step"),
                       np.stack([control_and_stimulated(rehearsals[n]["p_high"]) for n in names]),
                       {"description": "P(face) at every signed visual-signal level (step), without and with "
                                       "stimulation"})}
        return variables, {"pose": ["fitted"] + [f"bootstrap_{k}" for k in range(p_face.shape[2] - 2)],
                           **_step_coords(trials.levels)}

    def truth_dataset(self, working, truth, trials) -> tuple[str, xr.Dataset]:
        return "subject_p_face.nc", xr.Dataset(
            {"subject_p_face": (("electrode", "stimulated"), truth["p_face"]),
             "true_delta_p_face": (("electrode",), truth["delta_p_face"][:, 0]), "dead": ("electrode", truth["dead"]),
             "subject_p_high": (("electrode", "stimulated", "sequence", "step"), truth["p_high"])},
            coords={"electrode": list(working), "stimulated": [False, True], **_step_coords(trials.levels)},
            attrs={"description": "the virtual subject's own P(face) on the face task's test images (validation "
                                  "only); subject_p_high: P(face) at every signed visual-signal level"})

    def summary(self, options, trials, rehearsals, plan, working, models, rig, seed) -> dict:
        spec = options.face_task
        n_test = 2 * spec.n_per_class - 2 * int(round(spec.fit_fraction * spec.n_per_class))
        return {"face_task_images": {
                    "fit": (2 * spec.n_per_class - n_test) * len(spec.signal_percent),
                    "test": n_test * len(spec.signal_percent),
                    "noise_at_input_size_px": {name: model.preprocessing.size_px for name, model in models.items()}},
                "signed_signal_percent": trials.levels.tolist(),
                **power_forecast(rehearsals, plan, working, rig.trials_per_site, seed)}

    def write_rig(self, out_dir, options, trials, chosen, working, rig, stimulation, seed, layout, name,
                  model, subject_id) -> dict:
        """Every site's trials run through the test images as the chosen candidate saw them (noise added at its
        input size), step = the image's signed signal level; the images are shared by the sites."""
        choices, decoder = options.face_task.categorization()
        _, test, _ = shown_images(choices, decoder, model, trials.images, seed, trials.where, "n_per_class")
        ids = [str(i) for i in test.stimulus_id]
        stems = image_names(ids)
        steps = steps_of(test.labels["signed_signal_percent"], trials.levels)
        shown = [{"sequence": 0, "step": int(step), "stimulus_id": i, "image_file": f"images/{stems[i]}.png"}
                 for i, step in zip(ids, steps)]
        sites_chosen = [working[i] for i in chosen]
        trial_table = trial_list(sites_chosen, {electrode: shown for electrode in sites_chosen}, rig, stimulation,
                                 seed, layout)
        write_rig(out_dir, {entry["image_file"]: image for entry, image in zip(shown, test.images)}, rig,
                  trial_table, name, stimulation, subject_id)
        return {"folder": "rig", "n_trials": int(len(trial_table)), "n_images": len(shown),
                "images_at_input_px": int(model.preprocessing.size_px)}

    def describe(self, options, summary) -> str:
        images = summary["face_task_images"]
        sizes = ", ".join(f"{px} px" for px in sorted(set(images["noise_at_input_size_px"].values())))
        return (f"Task: face / non-face categorisation of noisy images (Afraz et al. 2006; {images['test']} test "
                f"images at {len(options.face_task.signal_percent)} visual-signal levels, the noise added after each "
                f"image is resized to the model's input, {sizes}); the effect is the change of P(face) with "
                "stimulation (chance 0).")


def _step_coords(levels: np.ndarray) -> dict:
    """Coordinates of the psychometric curves: one sequence, the steps with their signed visual signal (%)."""
    return {"sequence": [0], "step": np.arange(len(levels)), "signed_signal_percent": ("step", levels)}
