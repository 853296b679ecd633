"""Search methods: which hyperparameters each trial of a grid runs.

* ``grid``: every point of the arm's grid (the cartesian product of its axes).
* ``random``: ``n`` points drawn independently: log-uniform on a ``logspace`` axis, uniform on a
  ``linspace`` axis, a uniform choice from a list (seeded by ``search.seed``).
* ``tpe``: ``n`` configurations proposed one at a time by Optuna's TPE sampler from the results
  so far (the objective is measured on the public evaluation split); allowed with compose
  accounting only.
* Under ``papernot-steinke`` accounting the *number* of runs is itself random (Papernot &
  Steinke 2022): it is drawn once per grid from the chosen distribution with the planned mean,
  with the operating system's CSPRNG, and each run is an independent draw from the search space
  (a uniform grid point for ``grid``). The count is never released.
"""

from __future__ import annotations

import math
import random
from typing import Any

from dpsweep.errors import ConfigError
from dpsweep.spec import ArmConfig, Axis, SearchDistribution


def random_point(arm: ArmConfig, rng: random.Random) -> dict[str, Any]:
    """One independent draw from the arm's search space."""
    out: dict[str, Any] = {}
    for name, axis in arm.grid.items():
        if isinstance(axis, Axis):
            if axis.logspace is not None:
                lo, hi = axis.logspace
                out[name] = 10.0 ** rng.uniform(lo, hi)
            else:
                assert axis.linspace is not None
                lo, hi = axis.linspace
                out[name] = rng.uniform(lo, hi)
        else:
            if not axis:
                raise ConfigError(
                    f"grid axis {name!r} of arm {arm.label!r} is empty",
                    field=f"arms.{arm.label}.grid.{name}",
                )
            out[name] = rng.choice(list(axis))
    return out


def random_points(arm: ArmConfig, n: int, *, seed: int) -> list[dict[str, Any]]:
    """``n`` independent draws, reproducible from ``seed`` and the arm's name."""
    rng = random.Random(f"{seed}:{arm.label}")
    return [random_point(arm, rng) for _ in range(n)]


def optuna_distributions(arm: ArmConfig) -> dict[str, Any]:
    """The arm's search space as Optuna distributions (for tpe)."""
    # deferred: optuna (0.1 s and more) serves tpe alone, and sweep creation loads this module
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    out: dict[str, Any] = {}
    for name, axis in arm.grid.items():
        if isinstance(axis, Axis):
            if axis.logspace is not None:
                lo, hi = (10.0**v for v in axis.logspace)
                out[name] = FloatDistribution(min(lo, hi), max(lo, hi), log=True)
            else:
                assert axis.linspace is not None
                lo, hi = axis.linspace
                out[name] = FloatDistribution(min(lo, hi), max(lo, hi))
        else:
            out[name] = CategoricalDistribution(list(axis))
    return out


def _tnb_gamma(shape: float, mean: float) -> float:
    """gamma of the truncated negative binomial with this shape and mean (dp_accounting's)."""
    # deferred: dp_accounting takes about a second to import; only finite-shape counts need it
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    return float(rdp._gamma_truncated_negative_binomial(shape, mean))


def draw_run_count(
    distribution: SearchDistribution, *, mean: float, rng: random.Random | None = None
) -> int:
    """Draw the number of runs of a papernot-steinke grid.

    The distributions and their parametrisation by the mean are those of dp_accounting's
    ``RepeatAndSelectDpEvent`` (the accountant the plan used): Poisson(mean) for
    ``shape = inf``; otherwise the truncated negative binomial with that shape (``0``:
    logarithmic, ``1``: geometric), whose support starts at 1.

    Args:
        distribution: The spec's distribution.
        mean: The planned mean number of runs.
        rng: Defaults to :class:`random.SystemRandom` (the count must stay secret, so it is
            drawn from the operating system's CSPRNG, not from a seed).
    """
    rng = rng or random.SystemRandom()
    shape = distribution.shape
    u = rng.random()
    if math.isinf(shape):
        # Poisson by inversion of its CDF.
        k, p = 0, math.exp(-mean)
        cdf = p
        while u > cdf and k < 100_000:
            k += 1
            p *= mean / k
            cdf += p
        return k
    if mean <= 1:
        return 1
    gamma = _tnb_gamma(shape, mean)
    k = 1
    if shape == 0:
        norm = math.log(1 / gamma)
        p = (1 - gamma) / norm
    else:
        norm = gamma**-shape - 1
        p = (1 - gamma) * shape / norm
    cdf = p
    while u > cdf and k < 1_000_000:
        # p(k+1)/p(k) = (1-gamma) (k+shape)/(k+1); for shape 0 it is (1-gamma) k/(k+1).
        p *= (1 - gamma) * (k + shape) / (k + 1)
        k += 1
        cdf += p
    return k
