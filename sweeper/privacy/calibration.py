"""Calibration: the smallest noise multiplier whose composed steps fit an epsilon budget.

Used by the ``compose`` and ``basic`` methods (:mod:`sweeper.privacy.composition`); the
accountants are the planner's (dp_accounting's PLD or RDP,
:func:`workers.accounting.registry.plan_accountant`), so planning never imports torch.
"""

from __future__ import annotations

import functools
import math

from scipy.stats import norm

from workers.accounting.registry import plan_accountant

# Calibrated grids land within this fraction below their budget (never above).
CALIBRATION_SLACK = 0.01


def _gdp_guess(
    epsilon: float, delta: float, q: float, steps: int, eval_sigma: float | None = None
) -> float:
    """Initial sigma from the CLT limit of subsampled Gaussian composition (mu-GDP).

    With ``eval_sigma`` (the evaluations' one Gaussian, mu_e = 1 / eval_sigma), the steps get
    what is left of the budget's mu: mu_steps^2 = mu^2 - mu_e^2 (mu-GDP composes so).
    """

    def gdp_delta(mu: float) -> float:
        return float(
            norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
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


@functools.lru_cache(maxsize=8192)
def planned_epsilon(
    sigma: float,
    q: float,
    steps: int,
    delta: float,
    accountant: str,
    eval_sigma: float | None = None,
) -> float:
    """Epsilon of ``steps`` steps at noise ``sigma`` and sample rate ``q``, by the planner's
    ``accountant`` (cached: calibration asks for the same figures many times)."""
    # The planner's accountants (pld, dp-rdp) are dp_accounting's: planning never imports
    # torch. ``eval_sigma``: the evaluations composed to one Gaussian (sigma_e / sqrt(number of
    # releases)), or None.
    fn = plan_accountant(accountant).epsilon
    if eval_sigma is None:
        return fn(noise_multiplier=sigma, sample_rate=q, steps=steps, target_delta=delta)
    return fn(
        noise_multiplier=sigma,
        sample_rate=q,
        steps=steps,
        target_delta=delta,
        eval_noise_multiplier=eval_sigma,
        eval_releases=1,
    )


@functools.lru_cache(maxsize=1024)
def calibrate(
    epsilon: float,
    delta: float,
    q: float,
    steps: int,
    accountant: str,
    max_sigma: float,
    eval_sigma: float | None = None,
) -> float:
    """The smallest sigma (to ~0.3 %) with ``eps(sigma) <= epsilon``, landing within
    :data:`CALIBRATION_SLACK` below it; ``inf`` if even ``max_sigma * 8`` is not enough.

    ``eval_sigma``: DP evaluation's releases composed to one Gaussian of this multiplier,
    charged with the steps (None: none).

    Secant steps on ``log eps`` against ``log sigma`` from the mu-GDP guess, then a bracketed
    bisection: a handful of accountant calls instead of a blind binary search.
    """

    def f(log_sigma: float) -> float:
        return math.log(
            planned_epsilon(math.exp(log_sigma), q, steps, delta, accountant, eval_sigma)
        ) - math.log(epsilon)

    target_hi, target_lo = 0.0, math.log1p(-CALIBRATION_SLACK)
    guess = _gdp_guess(epsilon, delta, q, steps, eval_sigma)
    x0 = math.log(min(max(guess, 0.05), max_sigma * 4))
    f0 = f(x0)
    x1 = x0 + (0.05 if f0 > 0 else -0.05)
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
