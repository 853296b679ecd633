"""Fixed-threshold clipping (Abadi et al. 2016) and the non-private baseline."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from workers.strategies.base import (
    ClippingStrategy,
    ClipResult,
    StepContext,
    group_norms,
    register_strategy,
)
from workers.strategies.descriptors import CLIP_STYLE, FIXED, NONPRIVATE

__all__ = ["CLIP_STYLE", "FixedClipping", "NonPrivate"]


@register_strategy
class FixedClipping(ClippingStrategy):
    """``w_i = min(1, C / ||g_i||)``, sensitivity ``C``.

    Layerwise style clips each of the L parametrised layers to ``C_r = C / sqrt(L)``, so the
    whole per-sample gradient still has norm at most ``sqrt(sum_r C_r^2) = C``.
    """

    descriptor = FIXED

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.clip_norm = self.tensor("clip")
        self.style = self.shared("clip_style")

    def thresholds(self) -> Tensor:
        """Per-group thresholds, ``[K, 1, R]``-broadcastable."""
        c = self.clip_norm.view(-1, 1, 1)
        if self.style == "layerwise":
            return c / math.sqrt(self.n_layers)
        return c

    def clip(self, ctx: StepContext) -> ClipResult:
        assert ctx.sq_norms is not None  # needs_norms is True: the engine always provides them
        norms = group_norms(ctx.sq_norms, self.style)
        # min(1, C/n); a zero norm gives C/0 = inf, clamped to 1.
        w = torch.clamp(self.thresholds() / norms, max=1.0) * ctx.mask.unsqueeze(-1)
        return ClipResult(weights=w, sensitivity=self.clip_norm)

    def state(self) -> dict[str, Tensor]:
        return {"clip": self.clip_norm}


@register_strategy
class NonPrivate(ClippingStrategy):
    """No clipping and no noise: the non-private baseline. Its epsilon is infinite."""

    descriptor = NONPRIVATE  # private = False
    needs_norms = False

    def clip(self, ctx: StepContext) -> ClipResult:
        return ClipResult(
            weights=ctx.mask.unsqueeze(-1),
            sensitivity=torch.zeros(self.k, device=self.device),
        )
