"""The face / non-face task of Afraz, Kiani & Esteky 2006 (Nature 442:692) as the plan's alternative task.

As in ``experiments/afraz2006.toml``: ``n_per_class`` face and ``n_per_class`` non-face images are drawn
(seeded) from the plan's images (label ``category``: ``"face"`` against every other value) and split in two
halves (stratified; all noisy copies of an image on the same side). For each model every image is brought
to the model's input size and colour (:meth:`stimsim.models.preprocessing.Preprocessing.geometry`), then
degraded to each visual-signal level of ``signal_percent`` (a fraction 1 − s/100 of its pixels replaced by
uniform noise, :func:`stimsim.data.stimuli.pixel_noise`), so that the network sees the stated level. In
every model a logistic face / non-face readout of IT (C = 1e-3 on standardised features) is fitted on one
half without stimulation and frozen; on the other half P(face) is the mean choice probability, without
stimulation and with stimulation at a site. The site's effect is ΔP(face) = stimulated − control (chance 0; Afraz et al. 2006 report a shift
towards "face" at face-selective sites).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field, field_validator

from stimsim.behavior import LogisticDecoder
from stimsim.data.stimuli import StimulusSet, pixel_noise
from stimsim.engine import simulate
from stimsim.errors import ConfigError
from stimsim.filemodels import FileModel
from stimsim.stimulation import Condition

FACE, NONFACE = "face", "nonface"
AFRAZ_SIGNAL_PERCENT = (0.0, 15.0, 25.0, 40.0, 50.0, 80.0, 100.0)


class FaceTaskSpec(FileModel):
    """The face task (a plan's ``[face_task]`` table): n_per_class : face and non-face images drawn from the plan's
    images; signal_percent : visual-signal levels (% of pixels kept, distinct); fit_fraction : clean images whose
    copies fit the decoder; C : its inverse regularisation."""

    table: ClassVar[str] = "face_task"

    n_per_class: Annotated[int, Field(ge=2)] = 40
    signal_percent: Annotated[tuple[Annotated[float, Field(ge=0, le=100)], ...], Field(min_length=1)] = \
        AFRAZ_SIGNAL_PERCENT
    fit_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.5
    C: Annotated[float, Field(gt=0)] = 1e-3

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


@dataclass
class FaceTrials:
    """Clean fitting and test images with their true choices (label ``true_choice``); :meth:`shown`
    makes their noisy copies for a model."""

    fit: StimulusSet
    test: StimulusSet
    signal_percent: tuple
    seed: int

    @property
    def n_fit_images(self) -> int:
        """Noisy fitting images per model (every clean image at every signal level)."""
        return len(self.fit) * len(self.signal_percent)

    @property
    def n_test_images(self) -> int:
        return len(self.test) * len(self.signal_percent)

    def shown(self, preprocessing) -> tuple[StimulusSet, StimulusSet]:
        """Noisy copies (level-major) of the fitting and the test images, the noise added at the input
        geometry of ``preprocessing`` (a model's :class:`~stimsim.models.preprocessing.Preprocessing`)."""
        return tuple(pixel_noise(replace(clean, images=preprocessing.geometry(clean.images)), self.signal_percent,
                                 seed=self.seed) for clean in (self.fit, self.test))


def face_trials(images: StimulusSet, spec: FaceTaskSpec, seed: int = 0, where: str = "plan") -> FaceTrials:
    """Draw and split the face / non-face images (module docstring); the noise comes per model."""
    labels = images.labels.get("category")
    if labels is None:
        raise ConfigError(f"{where}: the face task needs images with a 'category' label (\"face\" and others); "
                          f"labels: {sorted(images.labels)}")
    labels = np.asarray(labels).astype(str)
    choice = np.where(labels == FACE, FACE, NONFACE)
    rng = np.random.default_rng([seed, 0xFACE])
    picks = []
    for value in (FACE, NONFACE):
        members = np.flatnonzero(choice == value)
        if len(members) < spec.n_per_class:
            raise ConfigError(f"{where} [face_task] n_per_class: {spec.n_per_class} {value} images needed, the images "
                              f"hold {len(members)}")
        picks.append(rng.choice(members, size=spec.n_per_class, replace=False))
    selected = np.sort(np.concatenate(picks))
    clean = StimulusSet(name="face_task", images=[images.images[i] for i in selected],
                        stimulus_id=images.stimulus_id[selected], labels={"true_choice": choice[selected]})
    is_fit = np.zeros(len(clean), dtype=bool)
    for value in (FACE, NONFACE):
        members = np.flatnonzero(clean.labels["true_choice"] == value)
        is_fit[rng.choice(members, size=int(round(spec.fit_fraction * len(members))), replace=False)] = True
    return FaceTrials(fit=clean.subset(is_fit, name="face_task_fit"), test=clean.subset(~is_fit, name="face_task_test"),
                      signal_percent=spec.signal_percent, seed=seed)


def face_rehearsal(model, trials: FaceTrials, points_mm: np.ndarray, stimulation: dict, spec: FaceTaskSpec,
                   seed: int = 0, progress: bool = True, safety_limits=None, safety_override: str | None = None,
                   layer: str = "IT") -> dict:
    """P(face) on the test images (noisy copies at ``model``'s input geometry) without stimulation and with
    stimulation at every point.

    points_mm : (n_sites, n_points, 2) on ``model``'s sheet. Returns ``p_face`` (n_sites, 1 + n_points; column 0
    is the control, the same for every site) and ``delta_p_face`` (n_sites, n_points, 1): stimulated − control.
    """
    from stimsim.planning.rehearsal import stimulation_at

    layer = model.resolve_layer(layer)
    points = np.asarray(points_mm, dtype=np.float64)
    n_sites, n_points = points.shape[:2]
    fit, test = trials.shown(model.preprocessing)
    features = model.activations(fit.images, layer, batch_size=256).numpy()
    decoder = LogisticDecoder.fit(features, fit.labels["true_choice"], layer=layer, C=spec.C, seed=seed)
    conditions = [Condition("control")] + [
        Condition(f"site{i}_point{k}", (stimulation_at(points[i, k], stimulation),))
        for i in range(n_sites) for k in range(n_points)]
    result = simulate(model, test.images, conditions, decoder, progress=progress, safety_limits=safety_limits,
                      safety_override=safety_override)
    p_face = result.sel(choice=FACE).transpose("condition", ...).values.mean(-1)
    stimulated = p_face[1:].reshape(n_sites, n_points)
    return {"p_face": np.column_stack([np.full(n_sites, p_face[0]), stimulated]),
            "delta_p_face": (stimulated - p_face[0])[..., None]}
