"""The Gaussian mechanism in closed form, for the DP evaluation's noisy counts.

n Gaussians of sensitivity 1 and multiplier sigma_e compose exactly to one Gaussian of
multiplier sigma_e / sqrt(n) (mu-GDP with mu = sqrt(n) / sigma_e; Dong, Roth & Su 2019),
whose (epsilon, delta) profile is known exactly (Balle & Wang 2018).
"""

from __future__ import annotations

import math

# scipy.special's ndtr / log_ndtr are the standard normal CDF and its log (what scipy.stats.norm
# evaluates), without scipy.stats's import (about 0.3 s of every planning process's start).
from scipy.special import log_ndtr, ndtr

from dpsweep.errors import ConfigError


def gaussian_delta(*, mu: float, epsilon: float) -> float:
    """The exact delta(epsilon) of a Gaussian mechanism of mu = sensitivity / std.

    Balle & Wang (2018), Theorem 8: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2). n
    composed Gaussians of multiplier sigma_e are one of mu = sqrt(n) / sigma_e.
    """
    if not mu > 0:
        return 0.0
    first = float(ndtr(-epsilon / mu + mu / 2))
    second = math.exp(epsilon + float(log_ndtr(-epsilon / mu - mu / 2)))
    return max(first - second, 0.0)


def gaussian_epsilon(*, mu: float, delta: float) -> float:
    """The smallest epsilon at which a Gaussian mechanism of ``mu`` is (epsilon, delta)-DP.

    Exact (Balle & Wang 2018's analytic Gaussian mechanism), to ~1e-12; never below the
    true value (the root is stepped up until its delta fits).
    """
    if not 0 < delta < 1:
        raise ConfigError(f"delta must be in (0, 1); got {delta}", field="privacy.delta")
    if gaussian_delta(mu=mu, epsilon=0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gaussian_delta(mu=mu, epsilon=hi) > delta:
        hi *= 2
    from scipy.optimize import brentq  # deferred: 0.4 s to import; only DP evaluation needs it

    eps = float(brentq(lambda e: gaussian_delta(mu=mu, epsilon=e) - delta, 0.0, hi, xtol=1e-13))
    while gaussian_delta(mu=mu, epsilon=eps) > delta:
        eps = eps * (1 + 1e-12) + 1e-13
    return eps


def gaussian_mu(*, epsilon: float, delta: float) -> float:
    """The largest mu whose Gaussian mechanism is (epsilon, delta)-DP (never above it)."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ConfigError("a Gaussian mechanism needs epsilon > 0 and delta in (0, 1)")
    lo, hi = 1e-9, 1.0
    while gaussian_delta(mu=hi, epsilon=epsilon) <= delta:
        lo, hi = hi, hi * 2
    from scipy.optimize import brentq  # deferred: 0.4 s to import; only DP evaluation needs it

    mu = float(brentq(lambda m: gaussian_delta(mu=m, epsilon=epsilon) - delta, lo, hi, xtol=1e-14))
    while gaussian_delta(mu=mu, epsilon=epsilon) > delta:
        mu *= 1 - 1e-12
    return mu


def composed_multiplier(*, eval_noise_multiplier: float | None, releases: int) -> float | None:
    """The one Gaussian multiplier ``releases`` Gaussians of ``eval_noise_multiplier`` compose
    to (None without releases)."""
    if eval_noise_multiplier is None or releases <= 0:
        return None
    return eval_noise_multiplier / math.sqrt(releases)
