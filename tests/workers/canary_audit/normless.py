"""A private strategy that reads no per-example norms (``needs_norms = False``), registered for
one test: the plug-in of issue 49 that clipped nothing and passed its audit with a bound of 0.

It weighs every sampled example 1 whatever its gradient and claims a sensitivity of 1: it
does not clip, and the engine cannot check it (no norms). White-box gradient canaries cannot
enter its releases, so an audit must refuse it before anything is charged.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from workers.strategies import STRATEGIES
from workers.strategies.base import ClippingStrategy, ClipResult, StepContext
from workers.strategies.descriptors import DESCRIPTORS, StrategyDescriptor

NAME = "normless"

DESCRIPTOR = StrategyDescriptor(name=NAME, description="weights 1, no norms read (a test fault)")


class Normless(ClippingStrategy):
    """Weight 1 for every sampled example, sensitivity 1, no norms read."""

    descriptor = DESCRIPTOR
    needs_norms = False

    def clip(self, ctx: StepContext) -> ClipResult:
        return ClipResult(
            weights=ctx.mask.unsqueeze(-1), sensitivity=torch.ones(self.k, device=self.device)
        )


@pytest.fixture
def normless(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The strategy's name, registered (and described) for this test only."""
    monkeypatch.setitem(DESCRIPTORS, NAME, DESCRIPTOR)
    monkeypatch.setitem(STRATEGIES, NAME, Normless)
    yield NAME
