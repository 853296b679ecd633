"""Clipping strategies: torch-free descriptors, and their torch implementations on first use.

Importing this package imports no torch: it registers the built-in *descriptors*
(:mod:`workers.strategies.descriptors`: names, hyperparameters and their ranges, noise splits),
which is all that submission and planning need. The torch side (``get_strategy``,
``register_strategy``, ``ClippingStrategy``, ...) is loaded, with every built-in strategy
class registered, the first time one of those names is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from workers.plugins import load_plugins
from workers.strategies.descriptors import (
    DESCRIPTORS,
    HParam,
    NoiseSplit,
    NoiseSplitInfeasible,
    StrategyDescriptor,
    descriptor_names,
    get_descriptor,
    register_descriptor,
    split_noise,
)

if TYPE_CHECKING:
    from workers.randomness import NoiseSource
    from workers.strategies.base import (
        STRATEGIES,
        ClippingStrategy,
        ClipResult,
        ExtraRelease,
        ScalarRelease,
        StepContext,
        get_strategy,
        register_strategy,
        strategy_names,
    )

#: The modules of the built-in strategy classes (each registers its classes when imported).
BUILTIN_MODULES = ("fixed", "scaled", "adaptive", "bam", "lipschitz")

# Torch-side names, resolved on first access (module __getattr__, PEP 562).
_LAZY = {
    "STRATEGIES": "workers.strategies.base",
    "ClipResult": "workers.strategies.base",
    "ClippingStrategy": "workers.strategies.base",
    "ExtraRelease": "workers.strategies.base",
    "ScalarRelease": "workers.strategies.base",
    "StepContext": "workers.strategies.base",
    "get_strategy": "workers.strategies.base",
    "register_strategy": "workers.strategies.base",
    "strategy_names": "workers.strategies.base",
    "NoiseSource": "workers.randomness",
}


def load_builtin_strategies() -> None:
    """Import (and so register) every built-in strategy class, then the plug-ins. Imports torch.

    Plug-ins (entry points of the group ``dpsweep.strategies``) are loaded once per process; the
    torch side's lookups (``get_strategy``, ``strategy_names``) call this first.
    """
    for module in BUILTIN_MODULES:
        importlib.import_module(f"workers.strategies.{module}")
    load_plugins("strategies")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        load_builtin_strategies()
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DESCRIPTORS",
    "STRATEGIES",
    "ClipResult",
    "ClippingStrategy",
    "ExtraRelease",
    "HParam",
    "NoiseSource",
    "NoiseSplit",
    "NoiseSplitInfeasible",
    "ScalarRelease",
    "StepContext",
    "StrategyDescriptor",
    "descriptor_names",
    "get_descriptor",
    "get_strategy",
    "load_builtin_strategies",
    "register_descriptor",
    "register_strategy",
    "split_noise",
    "strategy_names",
]
