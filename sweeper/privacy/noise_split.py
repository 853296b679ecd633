"""The strategies' noise split as planning sees it: the gradient's own multiplier sigma_g.

Strategies with a second query (quantile, online) split the planned sigma themselves, so a
step still costs one Gaussian of multiplier sigma. The split is the strategy's torch-free
descriptor's (:mod:`workers.strategies`), the same one the workers use; a grid axis may set a
split's parameter per trial, so the split is checked for every grid point.
"""

from __future__ import annotations

from typing import Any

from dpsweep.errors import ConfigError
from sweeper.privacy.grids import InfeasiblePlan
from workers.strategies import NoiseSplitInfeasible, get_descriptor


def gradient_noise_multiplier(
    strategy: str, params: dict[str, Any], *, noise_multiplier: float, expected_batch_size: float
) -> float:
    """sigma_g after a strategy's noise split: its descriptor's, which the workers use too.

    Raises:
        ConfigError: unknown strategy, or an invalid hyperparameter (``params.<name>``).
        InfeasiblePlan: quantile's count would need the whole budget (sigma >= 2 sigma_b).
    """
    try:
        return get_descriptor(strategy).gradient_multiplier(
            params, noise_multiplier=noise_multiplier, expected_batch_size=expected_batch_size
        )
    except NoiseSplitInfeasible as exc:
        raise InfeasiblePlan(str(exc)) from None


def split_points(arm: Any) -> list[dict[str, Any]]:
    """The arm's distinct trial parameters (grid points over its params, ``lr`` left out)."""
    out: dict[str, dict[str, Any]] = {}
    for point in arm.points() or [{}]:
        params = {k: v for k, v in {**arm.params, **point}.items() if k != "lr"}
        out.setdefault(repr(sorted(params.items(), key=lambda kv: kv[0])), params)
    return list(out.values())


def arm_gradient_noise_multiplier(
    arm: Any, params: dict[str, Any], *, noise_multiplier: float, expected_batch_size: float
) -> float:
    """:func:`gradient_noise_multiplier` for one grid point of a spec's arm.

    Raises:
        ConfigError: the field named as in the spec (``arms.<label>.grid.<name>``...).
        InfeasiblePlan: as :func:`gradient_noise_multiplier`.
    """
    try:
        return gradient_noise_multiplier(
            arm.strategy,
            params,
            noise_multiplier=noise_multiplier,
            expected_batch_size=expected_batch_size,
        )
    except InfeasiblePlan:
        raise
    except ConfigError as exc:  # name the arm's field (sweep submission checks this first)
        where = f"arms.{arm.label}.strategy"
        if (exc.field or "").startswith("params."):
            name = (exc.field or "").removeprefix("params.")
            where = f"arms.{arm.label}.{'grid' if name in arm.grid else 'params'}.{name}"
        raise ConfigError(f"arm {arm.label!r}: {exc}", field=where) from None
