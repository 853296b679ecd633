"""The one calibrator: the smallest noise multiplier whose epsilon fits a target.

Generic over an accountant's epsilon function (:class:`workers.accounting.registry.EpsilonFn`):
every accountant, built-in or plug-in, calibrates with :func:`calibrate_sigma` unless its
descriptor brings its own ``calibrate``. Torch-free (the planner calibrates with it), and it
imports no accountant library: the epsilon function does.

The method: the mu-GDP guess, then a Newton step with the mu-GDP model's slope
(:func:`gdp_slope`, no accountant call), then secant steps on ``log eps`` against ``log
sigma`` and a bracketed bisection; two accountant calls for a large grid (issue 41), a handful
for small ones, instead of a blind binary search. The result's epsilon is at most the target
and at least ``target * (1 - slack)``; ``inf`` when even ``8 * max_noise_multiplier`` is not
enough.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# scipy.special's ndtr is the standard normal CDF (what scipy.stats.norm.cdf evaluates), without
# scipy.stats's import (about 0.4 s of every planning process's start).
from scipy.special import ndtr

# Calibrated multipliers land within this fraction below their target epsilon (never above).
CALIBRATION_SLACK = 0.01


def gdp_guess(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    eval_noise_multiplier: float | None = None,
) -> float:
    """Initial sigma from the CLT limit of subsampled Gaussian composition (mu-GDP).

    With ``eval_noise_multiplier`` (the evaluations composed to one Gaussian, mu_e = 1 /
    sigma_e), the steps get what is left of the budget's mu: mu_steps^2 = mu^2 - mu_e^2
    (mu-GDP composes so).
    """
    # Short names for the formulas below.
    epsilon, delta, q, eval_sigma = target_epsilon, target_delta, sample_rate, eval_noise_multiplier

    def gdp_delta(mu: float) -> float:
        return float(
            ndtr(-epsilon / mu + mu / 2) - math.exp(epsilon) * ndtr(-epsilon / mu - mu / 2)
        )

    lo, hi = 1e-6, 50.0
    for _ in range(100):  # delta(mu) grows with mu: bisect for delta(mu) = delta
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if gdp_delta(mid) < delta else (lo, mid)
    mu = lo
    if eval_sigma is not None:
        # Little or nothing left for the steps: start from much noise (the secant corrects).
        mu = math.sqrt(max(mu * mu - eval_sigma**-2, (0.05 * mu) ** 2))
    ratio = mu / (q * math.sqrt(steps))
    return 1.0 / math.sqrt(math.log1p(ratio * ratio)) if ratio > 0 else 1e3


def _gdp_epsilon(mu: float, delta: float) -> float:
    """The epsilon at ``delta`` of mu-GDP (Dong, Roth & Su 2019), by bisection (math only)."""

    def phi(x: float) -> float:
        return 0.5 * math.erfc(-x / math.sqrt(2))

    def gdp_delta(epsilon: float) -> float:  # decreasing in epsilon
        return phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * phi(-epsilon / mu - mu / 2)

    lo, hi = 0.0, 1.0
    while gdp_delta(hi) > delta:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            return math.inf
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gdp_delta(mid) > delta else (lo, mid)
    return hi


def gdp_slope(
    *,
    sigma: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    eval_noise_multiplier: float | None = None,
) -> float:
    """``d log eps / d log sigma`` at ``sigma`` by the model :func:`gdp_guess` inverts.

    The CLT limit of subsampled Gaussian composition is mu-GDP with ``mu^2 = q^2 T
    (exp(1/sigma^2) - 1)`` (plus ``1/sigma_e^2`` for the evaluations); a central difference of
    its epsilon. Only a search direction for the calibrator (every multiplier it returns is
    checked with the accountant): NaN where the model has no finite slope.
    """
    h = 0.01

    def log_eps(log_sigma: float) -> float:
        s = math.exp(log_sigma)
        mu2 = sample_rate**2 * steps * math.expm1(s**-2)
        if eval_noise_multiplier is not None:
            mu2 += eval_noise_multiplier**-2
        return math.log(_gdp_epsilon(math.sqrt(mu2), target_delta))

    try:
        x = math.log(sigma)
        slope = (log_eps(x + h) - log_eps(x - h)) / (2 * h)
    except (OverflowError, ValueError, ZeroDivisionError):
        return math.nan
    return slope if math.isfinite(slope) else math.nan


def calibrate_sigma(
    epsilon_of: Callable[[float], float],
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    max_noise_multiplier: float,
    eval_noise_multiplier: float | None = None,
    slack: float = CALIBRATION_SLACK,
) -> float:
    """The smallest sigma (to ~0.3 %) with ``epsilon_of(sigma) <= target_epsilon``, landing
    within ``slack`` (a fraction) below it; ``inf`` if even ``max_noise_multiplier * 8`` is not
    enough.

    ``epsilon_of``: the accountant's epsilon as a function of the noise multiplier alone (the
    sample rate, steps, delta and any evaluation releases fixed). ``eval_noise_multiplier``:
    the evaluation releases composed to one Gaussian of this multiplier, used for the initial
    guess only (``epsilon_of`` charges them).
    """
    epsilon = target_epsilon
    max_sigma = max_noise_multiplier

    def f(log_sigma: float) -> float:
        return math.log(epsilon_of(math.exp(log_sigma))) - math.log(epsilon)

    target_hi, target_lo = 0.0, math.log1p(-slack)
    guess = gdp_guess(
        target_epsilon=target_epsilon,
        target_delta=target_delta,
        sample_rate=sample_rate,
        steps=steps,
        eval_noise_multiplier=eval_noise_multiplier,
    )
    x0 = math.log(min(max(guess, 0.05), max_sigma * 4))
    f0 = f(x0)
    if target_lo <= f0 <= target_hi:
        return math.exp(x0)
    # The second point: a Newton step with the mu-GDP model's slope (d log eps / d log sigma,
    # free to compute) towards the middle of the target band, which lands in the band for
    # most grids (two accountant calls); a blind 5 % probe where the model has no slope.
    slope = gdp_slope(
        sigma=math.exp(x0),
        target_delta=target_delta,
        sample_rate=sample_rate,
        steps=steps,
        eval_noise_multiplier=eval_noise_multiplier,
    )
    if math.isfinite(f0) and slope < 0:
        step = -(f0 - (target_lo + target_hi) / 2) / slope
        x1 = x0 + max(min(step, 1.0), -1.0)  # at most a factor e from the first point
    else:
        x1 = x0 + (0.05 if f0 > 0 else -0.05)
    x1 = max(min(x1, math.log(max_sigma * 8)), math.log(1e-3))
    f1 = f(x1)
    lo = hi = None  # lo: a log-sigma whose eps is too high; hi: one that fits
    for _ in range(8):
        for x, fx in ((x0, f0), (x1, f1)):
            if fx > target_hi:
                lo = x if lo is None or x > lo else lo
            else:
                hi = x if hi is None or x < hi else hi
                if fx >= target_lo:
                    return math.exp(x)
        if f1 == f0:
            break
        x2 = x1 - (f1 - (target_lo + target_hi) / 2) * (x1 - x0) / (f1 - f0)
        if lo is not None and hi is not None and not lo < x2 < hi:
            x2 = (lo + hi) / 2
        x2 = max(min(x2, math.log(max_sigma * 8)), math.log(1e-3))
        x0, f0, x1, f1 = x1, f1, x2, f(x2)
        if x1 == math.log(max_sigma * 8) and f1 > target_hi:
            return math.inf
    # Bisection fallback inside the bracket (rarely needed).
    if hi is None:
        x = math.log(max_sigma * 8)
        if f(x) > target_hi:
            return math.inf
        hi = x
    if lo is None:
        lo = math.log(1e-3)
    for _ in range(40):
        mid = (lo + hi) / 2
        fm = f(mid)
        if fm > target_hi:
            lo = mid
        else:
            hi = mid
            if fm >= target_lo:
                break
    return math.exp(hi)
