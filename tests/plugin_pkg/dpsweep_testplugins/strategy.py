"""A clipping strategy plug-in (entry-point group ``dpsweep.strategies``).

``w_i = shrink * min(1, C / ||g_i||)``: fixed clipping with the clipped gradient shrunk by
``shrink`` <= 1, so the sensitivity is still ``C`` (a smaller weight never raises it).
"""

from __future__ import annotations

from dpsweep_testplugins import STRATEGY


def register() -> None:
    """Register the descriptor and the torch class (the entry point; imports torch)."""
    # Imported here: the entry point is loaded only when a registry asks for plug-ins.
    import torch

    from workers.strategies.base import (
        ClippingStrategy,
        ClipResult,
        StepContext,
        group_norms,
        register_strategy,
    )
    from workers.strategies.descriptors import HParam, StrategyDescriptor, register_descriptor

    described = register_descriptor(
        StrategyDescriptor(
            name=STRATEGY,
            description="fixed clipping, then the weights shrunk (a test plug-in)",
            hyperparameters={
                "clip": HParam(default=1.0, help="clipping threshold C"),
                "shrink": HParam(default=0.5, low=0.0, high=1.0, help="weight factor <= 1"),
            },
        )
    )

    @register_strategy
    class ShrunkClipping(ClippingStrategy):
        """Fixed (flat) clipping times ``shrink``; sensitivity ``C``."""

        descriptor = described

        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            self.clip_norm = self.tensor("clip")
            self.shrink = self.tensor("shrink")

        def clip(self, ctx: StepContext) -> ClipResult:
            assert ctx.sq_norms is not None  # needs_norms: the engine provides them
            norms = group_norms(ctx.sq_norms, "flat")
            c = self.clip_norm.view(-1, 1, 1)
            w = torch.clamp(c / norms, max=1.0) * self.shrink.view(-1, 1, 1)
            return ClipResult(weights=w * ctx.mask.unsqueeze(-1), sensitivity=self.clip_norm)

        def state(self) -> dict[str, torch.Tensor]:
            return {"clip": self.clip_norm}
