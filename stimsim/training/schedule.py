"""The learning-rate schedule of every training run: linear warm-up, then cosine decay to zero
(Loshchilov & Hutter 2017, SGDR, without restarts)."""
from __future__ import annotations

import math
from typing import Annotated

import torch
from pydantic import Field

#: A peak learning rate as files give it: above 0 and within float32, the precision of the weights it updates (a
#: larger one cannot be applied to them at all).
LearningRate = Annotated[float, Field(gt=0, le=torch.finfo(torch.float32).max)]


def warmup_cosine_rate(training, step: int) -> float:
    """Learning rate at ``step`` (0-based) for ``training`` (anything with ``learning_rate``, ``warmup_steps`` and
    ``steps``): rising linearly to ``learning_rate`` over the first ``warmup_steps`` steps, then
    ``learning_rate`` · ½(1 + cos(π · progress)), progress running from 0 after the warm-up to 1 at ``steps``."""
    if step < training.warmup_steps:
        return training.learning_rate * (step + 1) / training.warmup_steps
    progress = (step - training.warmup_steps) / max(training.steps - training.warmup_steps, 1)
    return training.learning_rate * 0.5 * (1 + math.cos(math.pi * progress))


def check_warmup(training) -> None:
    """A ``[training]`` table whose file sets ``warmup_steps`` above ``steps`` (ValueError): its learning rate would
    never reach ``learning_rate``. The default warm-up is left to short trial runs."""
    if "warmup_steps" in training.model_fields_set and training.warmup_steps > training.steps:
        raise ValueError(f"warmup_steps ({training.warmup_steps}) must be at most steps ({training.steps}): the "
                         f"learning rate rises to learning_rate over the warm-up, which would not end")
