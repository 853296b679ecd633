"""The one calibrator: the smallest noise multiplier whose epsilon fits a target.

Generic over an accountant's epsilon function (:class:`workers.accounting.registry.EpsilonFn`):
every accountant, built-in or plug-in, calibrates with :func:`calibrate_noise` unless its
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
from dataclasses import dataclass

# scipy.special's ndtr is the standard normal CDF (what scipy.stats.norm.cdf evaluates), without
# scipy.stats's import (about 0.4 s of every planning process's start).
from scipy.special import ndtr

from dpsweep.accounting_inputs import AccountingInputs

# Calibrated multipliers land within this fraction below their target epsilon (never above).
CALIBRATION_SLACK = 0.01


def gdp_guess(inputs: AccountingInputs, *, target_epsilon: float) -> float:
    """Initial sigma from the CLT limit of subsampled Gaussian composition (mu-GDP).

    With evaluations (their releases composed to one Gaussian, mu_e = 1 / sigma_e), the steps
    get what is left of the budget's mu: mu_steps^2 = mu^2 - mu_e^2 (mu-GDP composes so).
    """
    # Short names for the formulas below.
    epsilon, delta, q = target_epsilon, inputs.delta, inputs.sample_rate
    eval_sigma = inputs.composed_eval_noise

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
    ratio = mu / (q * math.sqrt(inputs.steps))
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
    """:func:`calibrate_noise` with the inputs spelled out (``eval_noise_multiplier``: the
    evaluation releases composed to one Gaussian of this multiplier, or ``None``)."""
    inputs = AccountingInputs(
        noise_multiplier=None,
        sample_rate=sample_rate,
        steps=steps,
        delta=target_delta,
        eval_noise_multiplier=eval_noise_multiplier,
        evaluations=0 if eval_noise_multiplier is None else 1,
    )
    return calibrate_noise(
        epsilon_of,
        inputs,
        target_epsilon=target_epsilon,
        max_noise_multiplier=max_noise_multiplier,
        slack=slack,
    )


def calibrate_noise(
    epsilon_of: Callable[[float], float],
    inputs: AccountingInputs,
    *,
    target_epsilon: float,
    max_noise_multiplier: float,
    slack: float = CALIBRATION_SLACK,
) -> float:
    """The smallest sigma (to ~0.3 %) with ``epsilon_of(sigma) <= target_epsilon``, landing
    within ``slack`` (a fraction) below it; ``inf`` if even ``max_noise_multiplier * 8`` is not
    enough.

    Args:
        epsilon_of: the accountant's epsilon as a function of the noise multiplier alone (the
            rest of ``inputs`` fixed); it charges the evaluation releases.
        inputs: the run (its noise multiplier, the unknown, is not read); its evaluations
            serve the initial guess only.
        target_epsilon: the budget.
        max_noise_multiplier: the search's limit (up to 8 times it, then ``inf``).
        slack: how far below the target (a fraction of it) the result may land.
    """
    band = _Band(epsilon_of, target_epsilon, slack, max_noise_multiplier)
    guess = gdp_guess(inputs, target_epsilon=target_epsilon)
    x0 = math.log(min(max(guess, 0.05), max_noise_multiplier * 4))
    f0 = band.f(x0)
    if band.fits(f0):
        return math.exp(x0)
    x1 = band.clamp(_newton_step(band, inputs, x0, f0))
    found, lo, hi = _secant(band, x0, f0, x1, band.f(x1))
    return found if found is not None else _bisect(band, lo, hi)


@dataclass(frozen=True)
class _Band:
    """The search's target: log epsilon within ``[log(1 - slack), 0]`` of log target."""

    epsilon_of: Callable[[float], float]
    target_epsilon: float
    slack: float
    max_sigma: float

    @property
    def hi(self) -> float:
        return 0.0

    @property
    def lo(self) -> float:
        return math.log1p(-self.slack)

    @property
    def middle(self) -> float:
        return (self.lo + self.hi) / 2

    @property
    def x_max(self) -> float:
        return math.log(self.max_sigma * 8)

    def f(self, log_sigma: float) -> float:
        """log epsilon minus log target at ``log_sigma`` (one accountant call)."""
        return math.log(self.epsilon_of(math.exp(log_sigma))) - math.log(self.target_epsilon)

    def fits(self, fx: float) -> bool:
        return self.lo <= fx <= self.hi

    def clamp(self, x: float) -> float:
        return max(min(x, self.x_max), math.log(1e-3))


def _newton_step(band: _Band, inputs: AccountingInputs, x0: float, f0: float) -> float:
    """The second point: a Newton step with the mu-GDP model's slope (d log eps / d log
    sigma, free to compute) towards the middle of the band, which lands in it for most grids
    (two accountant calls); a blind 5 % probe where the model has no slope."""
    slope = gdp_slope(
        sigma=math.exp(x0),
        target_delta=inputs.delta,
        sample_rate=inputs.sample_rate,
        steps=inputs.steps,
        eval_noise_multiplier=inputs.composed_eval_noise,
    )
    if math.isfinite(f0) and slope < 0:
        step = -(f0 - band.middle) / slope
        return x0 + max(min(step, 1.0), -1.0)  # at most a factor e from the first point
    return x0 + (0.05 if f0 > 0 else -0.05)


def _secant(
    band: _Band, x0: float, f0: float, x1: float, f1: float
) -> tuple[float | None, float | None, float | None]:
    """Secant steps on log eps against log sigma, kept inside the bracket found so far.

    Returns:
        ``(sigma, lo, hi)``: the sigma found (``inf``: none fits) or ``None``, and the bracket:
        ``lo`` a log-sigma whose epsilon is too high, ``hi`` one that fits (``None``: none yet).
    """
    lo: float | None = None
    hi: float | None = None
    for _ in range(8):
        for x, fx in ((x0, f0), (x1, f1)):
            if fx > band.hi:
                lo = x if lo is None or x > lo else lo
            else:
                hi = x if hi is None or x < hi else hi
                if fx >= band.lo:
                    return math.exp(x), lo, hi
        if f1 == f0:
            break
        x2 = x1 - (f1 - band.middle) * (x1 - x0) / (f1 - f0)
        if lo is not None and hi is not None and not lo < x2 < hi:
            x2 = (lo + hi) / 2
        x2 = band.clamp(x2)
        x0, f0, x1, f1 = x1, f1, x2, band.f(x2)
        if x1 == band.x_max and f1 > band.hi:
            return math.inf, lo, hi
    return None, lo, hi


def _bisect(band: _Band, lo: float | None, hi: float | None) -> float:
    """Bisection inside the bracket (rarely needed): the fitting end, or ``inf``."""
    if hi is None:
        x = band.x_max
        if band.f(x) > band.hi:
            return math.inf
        hi = x
    if lo is None:
        lo = math.log(1e-3)
    for _ in range(40):
        mid = (lo + hi) / 2
        fm = band.f(mid)
        if fm > band.hi:
            lo = mid
        else:
            hi = mid
            if fm >= band.lo:
                break
    return math.exp(hi)
