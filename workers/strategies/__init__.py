"""Clipping strategies registry. Importing this package registers every built-in strategy."""

from __future__ import annotations

from workers.strategies import adaptive as _adaptive  # noqa: F401  (quantile, online)
from workers.strategies import bam as _bam  # noqa: F401  (bam)
from workers.strategies import fixed as _fixed  # noqa: F401  (registers fixed, nonprivate)
from workers.strategies import lipschitz as _lipschitz  # noqa: F401
from workers.strategies import scaled as _scaled  # noqa: F401  (automatic, global)
from workers.strategies.base import (
    STRATEGIES,
    ClippingStrategy,
    ClipResult,
    ExtraRelease,
    HParam,
    NoiseSource,
    ScalarRelease,
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
    "ScalarRelease",
    "StepContext",
    "get_strategy",
    "register_strategy",
    "strategy_names",
]
