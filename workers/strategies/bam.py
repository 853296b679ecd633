"""Bias-Aware Minimisation (Knolle et al., 003, Algorithm 2)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from workers.strategies.base import StepContext, register_strategy
from workers.strategies.descriptors import BAM
from workers.strategies.fixed import FixedClipping


@register_strategy
class BiasAwareMinimisation(FixedClipping):
    """BAM: each example's gradient is taken at ``theta'_i = theta + lambda g_i / ||g_i||``.

    The engine runs a second, per-example perturbed pass (``ascent_scale``) and this strategy
    clips those gradients exactly like ``fixed`` does, so the privacy cost is that of DP-SGD:
    each release still sums one clipped vector per sampled example (003, after Algorithm 2).
    """

    descriptor = BAM  # gradient_passes = 2: the packer's memory estimate counts the second pass

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lam = self.tensor("bam_lambda")

    def ascent_scale(self, ctx: StepContext) -> Tensor | None:
        assert ctx.sq_norms is not None
        norms = ctx.sq_norms.sum(dim=-1).sqrt()
        # A zero gradient has no direction: no ascent for it.
        safe = torch.where(norms > 0, norms, torch.ones_like(norms))
        return torch.where(norms > 0, self.lam.unsqueeze(1) / safe, torch.zeros_like(norms))
