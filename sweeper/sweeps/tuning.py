"""Public pre-tuning: centre an arm's private grid on the best point of a public tuning run.

An arm may name a dataset declared public (``tune_on: NAME``, :mod:`sweeper.datasets.resolution`).
The planner then trains every point of the arm's grid on those public records at the grid's
planned noise multiplier (:mod:`workers.public_tuning`; no private record is read, so no epsilon
is spent) and centres the private grid on the best point (:func:`centre_grid`), per grid (arm and
epsilon level: each has its own sigma). Centring keeps the grid's size, so the number of trials
K and every grid's plan are those of the untuned spec. Pure and torch-free.

The rule, per axis of numbers (``best`` is the tuned point's value of that axis):

- a list of positive numbers: every value times ``best / geometric mean(values)`` (the ratios
  between the values are kept; a one-value axis becomes ``[best]``);
- ``{logspace: [a, b], k}``: shifted by ``log10(best) - (a + b) / 2``;
- ``{linspace: [a, b], k}``: shifted by ``best - (a + b) / 2``;
- anything else (choices, lists with a value <= 0 or not a number, an integer
  hyperparameter's interval, and the axis sizing a strategy's second release, such as
  quantile's ``count_noise``, whose values split the planned sigma) is unchanged.

Every value is then kept inside the strategy descriptor's range for its hyperparameter (``lr``:
``> 0``) by clamping, and the centred arm is validated again exactly as submission validates
arms (:func:`sweeper.sweeps.checks.check_arm`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpsweep.spec import ArmConfig, Axis
from sweeper.sweeps.checks import check_arm
from workers.options import HParam
from workers.strategies import get_descriptor

__all__ = ["centre_axis", "centre_grid", "centred_arm", "grid_json", "tuning_points"]

#: What every trial's learning rate may be (it is no declared hyperparameter).
LR_RANGE = HParam(default=None)


def _number(v: Any) -> float | None:
    """``v`` as a finite float, or None (bools, strings and non-finite values are no numbers)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    x = float(v)
    return x if math.isfinite(x) else None


def _clamp(x: float, hp: HParam | None) -> float:
    """``x`` inside ``hp``'s range (an exclusive bound: the nearest float inside it)."""
    if hp is None or not hp.numeric:
        return x
    lo, hi = hp.low, hp.high
    if lo is not None and (x < lo or (x == lo and not hp.low_inclusive)):
        x = lo if hp.low_inclusive else math.nextafter(lo, math.inf)
    if hi is not None and (x > hi or (x == hi and not hp.high_inclusive)):
        x = hi if hp.high_inclusive else math.nextafter(hi, -math.inf)
    return x


def _clamp_exponent(p: float, hp: HParam | None) -> float:
    """A logspace end ``p`` whose ``10**p`` lies inside ``hp``'s range."""
    if hp is None:
        return p
    v = _clamp(10.0**p, hp)
    if v <= 0:  # the range reaches 0 or below: it sets the exponent no lower limit
        return p
    q = math.log10(v)
    # log10 and 10** round: step inwards until the power is inside the range.
    for _ in range(64):
        x = 10.0**q
        if hp.in_range(x):
            break
        low_side = hp.low is not None and x <= hp.low
        q = math.nextafter(q, math.inf if low_side else -math.inf)
    return q


def centre_axis(axis: list[Any] | Axis, best: Any, hp: HParam | None) -> list[Any] | Axis:
    """One axis centred on ``best`` (the module's rule), clamped to ``hp``'s range.

    Args:
        axis: The spec's axis (a list of values or an :class:`~dpsweep.spec.Axis`).
        best: The tuned point's value of this hyperparameter.
        hp: Its declaration (None: no range is known; ``lr``: :data:`LR_RANGE`).

    Returns:
        An axis of the same kind and size (unchanged where the rule does not apply).
    """
    b = _number(best)
    if b is None or (hp is not None and not hp.numeric):
        return axis
    if isinstance(axis, Axis):
        if hp is not None and hp.kind == "int":
            return axis
        if axis.logspace is not None:
            if b <= 0:
                return axis
            a, c = axis.logspace
            shift = math.log10(b) - (a + c) / 2
            ends = (_clamp_exponent(a + shift, hp), _clamp_exponent(c + shift, hp))
            return Axis(logspace=ends, k=axis.k)
        assert axis.linspace is not None
        a, c = axis.linspace
        shift = b - (a + c) / 2
        return Axis(linspace=(_clamp(a + shift, hp), _clamp(c + shift, hp)), k=axis.k)
    values = [_number(v) for v in axis]
    if not values or b <= 0 or any(v is None or v <= 0 for v in values):
        return list(axis)
    numbers = [float(v) for v in values if v is not None]
    if len(numbers) == 1:
        out = [_clamp(b, hp)]
    else:
        mean = math.exp(sum(math.log(v) for v in numbers) / len(numbers))
        out = [_clamp(v * (b / mean), hp) for v in numbers]
    if hp is not None and hp.kind == "int":
        out = [_clamp(float(round(v)), hp) for v in out]
        return [int(v) for v in out]
    return out


def _declaration(strategy: Any, name: str) -> HParam | None:
    if name == "lr":
        return LR_RANGE
    hp = strategy.hyperparameters.get(name)
    return hp if isinstance(hp, HParam) else None


def centre_grid(arm: ArmConfig, best: Mapping[str, Any]) -> dict[str, list[Any] | Axis]:
    """The arm's grid with every axis centred on ``best`` (see :func:`centre_axis`)."""
    strategy = get_descriptor(arm.strategy)
    # The size of a strategy's second release (quantile's count_noise, online's
    # direction_noise_ratio) splits the planned sigma: the plan's split was made for the
    # spec's values, so that axis is kept as written.
    kept = {strategy.second_release}
    return {
        name: centre_axis(axis, best[name], _declaration(strategy, name))
        if name in best and name not in kept
        else axis
        for name, axis in arm.grid.items()
    }


def centred_arm(arm: ArmConfig, best: Mapping[str, Any]) -> ArmConfig:
    """The arm with its grid centred on ``best``, validated as submission validates arms.

    Raises:
        ConfigError: a centred value the strategy refuses (naming ``arms.<label>.grid.<name>``).
    """
    tuned = arm.model_copy(update={"grid": centre_grid(arm, best)})
    check_arm(tuned)
    return tuned


def tuned_arm(arm: ArmConfig, tuned_grid: Mapping[str, Any] | None) -> ArmConfig:
    """The arm whose trials a stored plan's grid creates: its grid replaced by the plan's
    centred grid (:attr:`dpsweep.plan.GridPlan.tuned_grid`), or the arm itself (not tuned)."""
    if not tuned_grid:
        return arm
    return ArmConfig.model_validate({**arm.model_dump(mode="json"), "grid": dict(tuned_grid)})


def grid_json(grid: Mapping[str, list[Any] | Axis]) -> dict[str, Any]:
    """A grid as JSON (an interval axis as ``{logspace|linspace: [a, b], k: n}``)."""
    return {
        name: axis.model_dump(mode="json", exclude_none=True)
        if isinstance(axis, Axis)
        else list(axis)
        for name, axis in grid.items()
    }


def tuning_points(arm: ArmConfig) -> list[dict[str, Any]]:
    """What the public tuning trains: every grid point with the arm's fixed params under it
    (a point's value overrides a param of the same name), ``lr`` included."""
    return [{**arm.params, **p} for p in arm.points()]
