"""Optimizers over a pack's flat ``[K, P]`` parameters, with a per-trial learning rate ``[K]``.

They follow ``torch.optim.SGD`` (heavy-ball momentum, no dampening) and ``torch.optim.Adam``
exactly, so a pack of one matches the standard optimizers. The gradient they receive is the
already-noised DP release; everything here is post-processing: momentum, the learning-rate
schedule (:func:`lr_factor`) and the weights' moving average (:class:`WeightAverage`) are
functions of the released noisy gradients and of public hyperparameters, so they cost no
epsilon (docs/privacy.md).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from dpsweep.errors import ConfigError

OptimizerName = Literal["sgd", "adam"]
OPTIMIZERS: tuple[str, ...] = ("sgd", "adam")
LR_SCHEDULES: tuple[str, ...] = ("constant", "cosine", "linear")


def lr_factor(schedule: str, step: int, *, total_steps: int, warmup: int = 0) -> float:
    """The learning rate's multiplier at the ``step``-th update (0-based) of ``total_steps``.

    The first ``warmup`` updates rise linearly (``(step + 1) / warmup``); after them
    ``constant`` stays at 1, ``cosine`` follows ``torch.optim.lr_scheduler.CosineAnnealingLR``
    (``T_max`` the steps after the warmup, down to 0) and ``linear`` follows ``LinearLR`` from
    1 to 0 over them. Public numbers only: the schedule depends on no data.

    Raises:
        ConfigError: an unknown schedule (field ``training.lr_schedule``).
    """
    if schedule not in LR_SCHEDULES:
        raise ConfigError(
            f"unknown lr_schedule {schedule!r}; choose one of: {', '.join(LR_SCHEDULES)}",
            field="training.lr_schedule",
        )
    if step < warmup:
        return (step + 1) / warmup
    span = max(total_steps - warmup, 1)
    j = min(step - warmup, span)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * j / span))
    if schedule == "linear":
        return 1.0 - j / span
    return 1.0


class WeightAverage:
    """An exponential moving average of a pack's flat weights ``[K, P]``, one row per trial.

    ``ema <- d_t * ema + (1 - d_t) * weights`` after step t, from the initial weights, with
    ``d_t = decay``, or ``min(decay, (1 + t) / (10 + t))`` with ``warmup`` (TensorFlow's
    num_updates rule). The weights are already a DP release (post-processing of noisy
    gradients), so their average is too; it costs no epsilon.
    """

    def __init__(self, params: Tensor, decay: float, *, warmup: bool = False) -> None:
        if not (0.0 < decay < 1.0 and math.isfinite(decay)):
            raise ConfigError(
                f"ema decay must be in (0, 1); got {decay}", field="training.ema.decay"
            )
        self.decay = float(decay)
        self.warmup = warmup
        self.t = 0
        self.flat = params.detach().clone()

    def decay_at(self, t: int) -> float:
        """The decay used by the ``t``-th update (1-based)."""
        return min(self.decay, (1 + t) / (10 + t)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, params: Tensor) -> None:
        """Fold the weights after a step into the average."""
        self.t += 1
        self.flat.lerp_(params, 1.0 - self.decay_at(self.t))


class PackedOptimizer:
    def __init__(
        self,
        name: str,
        lr: Tensor,
        *,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        adam_eps: float = 1e-8,
        schedule: str = "constant",
        total_steps: int | None = None,
        warmup: int = 0,
    ) -> None:
        if name not in OPTIMIZERS:
            raise ConfigError(
                f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}",
                field="training.optimizer",
            )
        if not 0.0 <= momentum < 1.0:
            raise ConfigError(
                f"momentum must be in [0, 1); got {momentum}", field="training.momentum"
            )
        if weight_decay < 0:
            raise ConfigError("weight_decay must be >= 0", field="training.weight_decay")
        lr_factor(schedule, 0, total_steps=1)  # refuses an unknown schedule
        if warmup < 0:
            raise ConfigError("warmup must be >= 0 steps", field="training.warmup_steps")
        if (schedule != "constant" or warmup) and (total_steps is None or total_steps < 1):
            raise ConfigError(
                "a learning-rate schedule needs the run's total steps", field="training.steps"
            )
        self.schedule = schedule
        self.total_steps = total_steps or 0
        self.warmup = warmup
        self._scheduled = schedule != "constant" or warmup > 0
        # The multiplier the latest update used (for the trajectories the trial records).
        self.last_factor = 1.0
        self.name = name
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.betas = betas
        self.adam_eps = adam_eps
        self.t = 0
        # A pack of one with a fixed learning rate updates with a scalar (one fewer kernel).
        self._lr_scalar = float(lr[0]) if lr.numel() == 1 else None
        self.buf: Tensor | None = None
        self.exp_avg: Tensor | None = None
        self.exp_avg_sq: Tensor | None = None

    def factor(self) -> float:
        """The schedule's multiplier of the next update (1 without a schedule)."""
        if not self._scheduled:
            return 1.0
        return lr_factor(self.schedule, self.t, total_steps=self.total_steps, warmup=self.warmup)

    def step(self, params: Tensor, grad: Tensor, lr_scale: Tensor | None = None) -> None:
        """Update ``params`` ``[K, P]`` in place from ``grad`` ``[K, P]``."""
        factor = self.last_factor = self.factor()
        self.t += 1
        lr = self.lr if lr_scale is None else self.lr * lr_scale
        if self._scheduled:
            lr = lr * factor
        if self.weight_decay:
            grad = grad.add(params, alpha=self.weight_decay)
        if self.name == "sgd":
            if self.momentum:
                if self.buf is None:
                    self.buf = grad.clone()
                else:
                    self.buf.mul_(self.momentum).add_(grad)
                grad = self.buf
            if lr_scale is None and self._lr_scalar is not None:
                params.add_(grad, alpha=-self._lr_scalar * factor)
            else:
                params.addcmul_(grad, lr.unsqueeze(1), value=-1.0)
            return
        lr = lr.unsqueeze(1)
        b1, b2 = self.betas
        if self.exp_avg is None or self.exp_avg_sq is None:
            self.exp_avg = torch.zeros_like(params)
            self.exp_avg_sq = torch.zeros_like(params)
        self.exp_avg.lerp_(grad, 1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        bc1 = 1 - b1**self.t
        bc2 = 1 - b2**self.t
        denom = (self.exp_avg_sq.sqrt() / math.sqrt(bc2)).add_(self.adam_eps)
        params.sub_((lr / bc1) * self.exp_avg / denom)
