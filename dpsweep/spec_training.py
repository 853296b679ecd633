"""The spec's ``training`` section: epochs or steps, batch size, optimiser, learning-rate
schedule and warmup, and the optional moving average of the weights (``training.ema``).

Re-exported by :mod:`dpsweep.spec`.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dpsweep.spec_base import StrictSection

LR_SCHEDULES = ("constant", "cosine", "linear")
# The field a refusal of EMA with DP evaluation names (a check across two sections).
EMA_DP_FIELD = "training.ema"


class EmaConfig(StrictSection):
    """An exponential moving average of the weights, kept beside the raw weights.

    After step t, ``ema = d_t * ema + (1 - d_t) * weights`` from the initial weights, with
    ``d_t = decay``, or with ``warmup`` ``d_t = min(decay, (1 + t) / (10 + t))`` (TensorFlow's
    ExponentialMovingAverage with num_updates: the initial weights are forgotten quickly in a
    short run). At every evaluation point both are measured, and the better one is selected
    exactly as any checkpoint is. It is post-processing of the noisy releases: no epsilon.
    """

    decay: float = Field(
        default=0.99,
        gt=0,
        lt=1,
        description="the weight of the running average at each step (0 < decay < 1)",
    )
    warmup: bool = Field(
        default=True,
        description="use min(decay, (1 + t) / (10 + t)) at step t, so a short run's average "
        "forgets the initial weights",
    )

    @field_validator("decay")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("decay must be a finite number with 0 < decay < 1")
        return v


# Augmentations the worker knows (workers.augment registers them; plug-ins may add more, checked
# by the worker before anything is reserved).
AUGMENT_OPS = ("crop", "flip")


class AugmentConfig(StrictSection):
    """Augmentation multiplicity (De et al. 2022): each sampled image is augmented
    ``multiplicity`` times, its gradient is the mean over the copies, then clipped.

    One example still contributes one clipped vector, so the sensitivity, q and epsilon are
    those of the plain step (docs/privacy.md). Augmentation randomness is public (the trial's
    public seed); sampling and noise stay secret.
    """

    multiplicity: int = Field(
        default=1, ge=1, le=64, description="augmented copies per sampled example (K)"
    )
    ops: list[str] = Field(
        default_factory=lambda: ["crop", "flip"],
        description="augmentations applied in order to each copy: crop (random crop with "
        "zero padding 4), flip (horizontal flip with probability 1/2), or a plug-in's",
    )


#: An arm's grid axis (or fixed param) that sweeps :attr:`TrainingConfig.rows_per_unit`.
ROWS_PER_UNIT_AXIS = "rows_per_unit"
#: How a sampled privacy unit's rows make its one bounded contribution.
UNIT_BOUNDINGS = ("mean", "capped")


class TrainingConfig(StrictSection):
    epochs: float | None = Field(default=5.0, gt=0)
    steps: int | None = Field(default=None, ge=1, description="overrides epochs")
    batch_size: int = Field(
        default=64, ge=1, description="expected logical (Poisson) batch size b = qN"
    )
    physical_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="examples per physical chunk of a logical batch: clipped gradients are "
        "summed over the chunks and noised once per step (default: the whole batch when it "
        "fits the pack's memory budget, else the largest power of two that does)",
    )
    augment: AugmentConfig | None = Field(
        default=None,
        description="augmentation multiplicity for image data, e.g. "
        "{multiplicity: 16, ops: [crop, flip]}",
    )
    tune_batch_scale: int = Field(
        default=1,
        ge=1,
        description="public pre-tuning (tune_on) runs at a logical batch r times smaller with "
        "the noise multiplier divided by r (sigma/B fixed, Sander et al. 2023); the private "
        "grid runs at the full batch",
    )
    unit_bounding: Literal["mean", "capped"] = Field(
        default="mean",
        description="datasets with a privacy unit only: how a sampled unit's rows make its one "
        "contribution of norm <= C. mean: each row clipped, then their mean (Chua et al.'s "
        "user-level sampling); capped: the mean gradient of its rows, clipped once. Either "
        "way at most rows_per_unit rows of a unit are used, chosen at random (secretly)",
    )
    rows_per_unit: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="datasets with a privacy unit only: the most rows of one sampled unit a "
        "step uses (a unit with more has that many chosen at random). An arm's grid may "
        f"sweep it as `{ROWS_PER_UNIT_AXIS}`. It changes no epsilon: a unit contributes "
        "one vector of norm <= C whatever its rows",
    )
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="heavy-ball momentum of sgd, as torch.optim.SGD (0 <= m < 1; 0: none)",
    )
    weight_decay: float = Field(default=0.0, ge=0)
    eval_every: int = Field(default=50, ge=1)
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        default="constant",
        description="how each trial's learning rate decays over the run after the warmup: "
        "constant, cosine (to 0, as CosineAnnealingLR) or linear (to 0, as LinearLR)",
    )
    warmup_steps: int = Field(
        default=0,
        ge=0,
        description="steps whose learning rate rises linearly from lr/warmup to lr",
    )
    warmup_fraction: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="the warmup as a fraction of the run's steps (instead of warmup_steps)",
    )
    ema: EmaConfig | None = Field(
        default=None,
        description="keep an exponential moving average of the weights and select the better "
        "of raw and averaged weights at every evaluation (e.g. ema: {decay: 0.99})",
    )
    average: Literal["none", "ema"] | None = Field(
        default=None,
        description="shorthand: ema is ema: {decay: 0.99}; none is no average",
    )

    @field_validator("momentum", "weight_decay")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @model_validator(mode="after")
    def _warmup_and_average(self) -> TrainingConfig:
        if self.warmup_steps and self.warmup_fraction is not None:
            raise ValueError("give training.warmup_steps or training.warmup_fraction, not both")
        if self.average == "none" and self.ema is not None:
            raise ValueError("training.average is none but training.ema is given; keep one")
        if self.average == "ema" and self.ema is None:
            self.ema = EmaConfig()
        return self

    def warmup_for(self, total_steps: int) -> int:
        """The warmup in steps for a run of ``total_steps`` (a fraction is rounded)."""
        if self.warmup_fraction is not None:
            return round(self.warmup_fraction * total_steps)
        return int(self.warmup_steps)


__all__ = [
    "AUGMENT_OPS",
    "EMA_DP_FIELD",
    "LR_SCHEDULES",
    "ROWS_PER_UNIT_AXIS",
    "UNIT_BOUNDINGS",
    "AugmentConfig",
    "EmaConfig",
    "TrainingConfig",
]
