"""Optimizers over a pack's flat ``[K, P]`` parameters, with a per-trial learning rate ``[K]``.

They follow ``torch.optim.SGD`` (heavy-ball momentum, no dampening) and ``torch.optim.Adam``
exactly, so a pack of one matches the standard optimizers. The gradient they receive is the
already-noised DP release; everything here is post-processing.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from dpsweep.errors import ConfigError

OptimizerName = Literal["sgd", "adam"]
OPTIMIZERS: tuple[str, ...] = ("sgd", "adam")


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

    def step(self, params: Tensor, grad: Tensor, lr_scale: Tensor | None = None) -> None:
        """Update ``params`` ``[K, P]`` in place from ``grad`` ``[K, P]``."""
        self.t += 1
        lr = self.lr if lr_scale is None else self.lr * lr_scale
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
                params.add_(grad, alpha=-self._lr_scalar)
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
