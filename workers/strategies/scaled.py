"""Normalising strategies of Bu et al. (000): automatic and global clipping."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from workers.strategies.base import (
    ClippingStrategy,
    ClipResult,
    StepContext,
    group_norms,
    register_strategy,
)
from workers.strategies.descriptors import AUTOMATIC, GLOBAL


@register_strategy
class AutomaticClipping(ClippingStrategy):
    """``w_i = C / (||g_i|| + gamma)`` (automatic clipping, Bu et al. 2022, cited in 000).

    Every example is normalised, so ``w_i ||g_i|| < C`` and the sensitivity is ``C``. With the
    layerwise style each layer r uses ``C_r = C / sqrt(L)``.
    """

    descriptor = AUTOMATIC

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clip_norm = self.tensor("clip")
        self.gamma = self.tensor("stability").view(-1, 1, 1)
        self.style = self.shared("clip_style")

    def clip(self, ctx: StepContext) -> ClipResult:
        assert ctx.sq_norms is not None
        norms = group_norms(ctx.sq_norms, self.style)
        c = self.clip_norm.view(-1, 1, 1)
        if self.style == "layerwise":
            c = c / math.sqrt(self.n_layers)
        w = c / (norms + self.gamma) * ctx.mask.unsqueeze(-1)
        return ClipResult(weights=w, sensitivity=self.clip_norm)

    def state(self) -> dict[str, Tensor]:
        return {"clip": self.clip_norm}


@register_strategy
class GlobalClipping(ClippingStrategy):
    """``w_i = C / Z`` if ``||g_i|| <= Z`` else 0 (global clipping, 000 Appendix D).

    Examples within the threshold Z keep their direction and are scaled by one common factor;
    larger ones are dropped. ``w_i ||g_i|| <= C``, so the sensitivity is ``C``.
    """

    descriptor = GLOBAL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clip_norm = self.tensor("clip")
        self.threshold = self.tensor("global_threshold")

    def clip(self, ctx: StepContext) -> ClipResult:
        assert ctx.sq_norms is not None
        norms = ctx.sq_norms.sum(dim=-1).sqrt()
        z = self.threshold.unsqueeze(1)
        w = torch.where(norms <= z, self.clip_norm.unsqueeze(1) / z, torch.zeros_like(norms))
        return ClipResult(weights=(w * ctx.mask).unsqueeze(-1), sensitivity=self.clip_norm)

    def state(self) -> dict[str, Tensor]:
        return {"clip": self.clip_norm}
