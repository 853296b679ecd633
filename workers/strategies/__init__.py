"""Clipping strategies registry. Importing this package registers every built-in strategy."""

from __future__ import annotations

from workers.strategies import fixed as _fixed  # noqa: F401  (registers fixed, nonprivate)
from workers.strategies.base import (
    STRATEGIES,
    ClippingStrategy,
    ClipResult,
    ExtraRelease,
    HParam,
    NoiseSource,
    StepContext,
    get_strategy,
    register_strategy,
    strategy_names,
)

__all__ = [
    "STRATEGIES",
    "ClipResult",
    "ClippingStrategy",
    "ExtraRelease",
    "HParam",
    "NoiseSource",
    "StepContext",
    "get_strategy",
    "register_strategy",
    "strategy_names",
]
