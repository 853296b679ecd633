"""Rényi DP of the Poisson-subsampled Gaussian, integrated numerically from its definition.

No dp_accounting, no Opacus, no TF Privacy series: :func:`subsampled_gaussian_rdp` integrates
the Rényi moment on a dense grid of fractional and integer orders (:data:`RDP_ORDERS`), so it
can audit the libraries. :func:`gaussian_rdp` is the exact curve of plain Gaussian releases (DP
evaluation), and :func:`rdp_to_epsilon` converts with Canonne, Kamath & Steinke (2020).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting.audit.bounds import _check_delta, _check_mechanism

# Rényi orders of the independent RDP curves: dense near 1 (where small epsilons and the
# Theorem 6 conversion live), fractional up to 64, then coarser up to 1024 (large orders
# matter only for tiny delta or many compositions). It contains dp_accounting's default
# orders as a subset, so the optimisation over orders is never coarser than the planner's.
RDP_ORDERS: tuple[float, ...] = tuple(
    sorted(
        {round(1 + k / 100, 4) for k in range(1, 10)}
        | {round(1 + k / 20, 4) for k in range(2, 201)}
        | {round(11 + k / 2, 4) for k in range(1, 107)}
        | {float(a) for a in range(11, 64)}
        | {float(a) for a in range(64, 257, 4)}
        | {float(a) for a in range(288, 1025, 32)}
    )
)
# An RDP curve or its orders: a sequence, or a numpy array of the same.
Curve = Sequence[float] | np.ndarray


# -------------------------------------------------------------------------------------------
# Rényi DP of the Poisson-subsampled Gaussian, from its definition


def _log_moment(sigma: float, q: float, alpha: float) -> float:
    """``log E_{z~N(0, sigma^2)}[((1-q) + q exp((2z-1)/(2 sigma^2)))^alpha]``.

    The ratio of N(1, s^2) to N(0, s^2) at z is exp((2z-1)/(2s^2)), so this is the Rényi
    moment of the mixture (1-q) N(0, s^2) + q N(1, s^2) against N(0, s^2): the dominating
    direction for add/remove neighbours (Mironov, Talwar & Zhang 2019 show the reverse
    divergence is never larger).

    Trapezoid rule on a uniform grid over [-16 s, alpha + 16 s], in log space. The integrand
    is at most the sum of two Gaussian bumps of width s centred at 0 (the 1-q part) and at
    alpha (the q part), so nothing outside the range matters (< e^-128). It is analytic in a
    strip of half-width min(s, pi s^2 / 2) around the real line (the base vanishes at
    Im z = pi s^2), where the trapezoid rule converges like exp(-2 pi width / h): h below
    makes that < e^-39, far below float64 rounding.
    """
    h = min(sigma / 16.0, sigma * sigma / 4.0)
    lo, hi = -16.0 * sigma, alpha + 16.0 * sigma
    n = math.ceil((hi - lo) / h) + 1
    z = np.linspace(lo, hi, n)
    step = (hi - lo) / (n - 1)
    log_phi = -0.5 * (z / sigma) ** 2 - math.log(sigma * math.sqrt(2.0 * math.pi))
    u = (2.0 * z - 1.0) / (2.0 * sigma * sigma)
    # log((1 - q) + q e^u); without subsampling it is u itself.
    log_base = u if q >= 1.0 else np.logaddexp(math.log1p(-q), math.log(q) + u)
    log_terms = log_phi + alpha * log_base
    log_w = np.full(n, math.log(step))
    log_w[0] = log_w[-1] = math.log(step / 2)  # the ends contribute < e^-128 anyway
    x = log_terms + log_w
    top = float(np.max(x))
    log_a = top + math.log(float(np.sum(np.exp(x - top))))
    if log_a < 1e-3:
        # A = 1 + O(q^2) and the O(q) terms cancel: summing A - 1 directly, with expm1,
        # keeps the relative precision of tiny per-step RDPs (small q) instead of rounding
        # them against 1.
        lb = alpha * (log_base if q >= 1.0 else np.log1p(q * np.expm1(u)))
        w = np.exp(log_w + log_phi)
        small = lb <= 0.5
        excess = np.where(small, w * np.expm1(np.where(small, lb, 0.0)), 0.0)
        excess += np.where(small, 0.0, np.exp(log_w + log_phi + np.where(small, 0.0, lb)) - w)
        a_minus_1 = float(math.fsum(excess.tolist()))
        # The sum of the weights is 1 to float64 precision (Poisson summation), so the two
        # paths agree; the direct one is just more precise when A is near 1.
        log_a = math.log1p(max(a_minus_1, 0.0))
    return log_a


@functools.lru_cache(maxsize=256)
def _rdp_per_step(sigma: float, q: float, orders: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(_log_moment(sigma, q, a) / (a - 1.0) for a in orders)


def subsampled_gaussian_rdp(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int = 1,
    orders: Sequence[float] = RDP_ORDERS,
) -> np.ndarray:
    """The Rényi DP of ``steps`` Poisson-subsampled Gaussian steps at each of ``orders``.

    Computed by numerical integration of the Rényi moment (see :func:`_log_moment`), not by
    any accounting library, so it can audit them. Each order must be > 1.
    """
    _check_mechanism(noise_multiplier, sample_rate, steps)
    orders_t = tuple(float(a) for a in orders)
    if any(not a > 1 for a in orders_t):
        raise ConfigError("Rényi orders must be > 1", field="orders")
    per = np.asarray(_rdp_per_step(float(noise_multiplier), float(sample_rate), orders_t))
    return per * steps


def gaussian_rdp(
    *, noise_multiplier: float, releases: int = 1, orders: Sequence[float] = RDP_ORDERS
) -> np.ndarray:
    """The Rényi DP of ``releases`` Gaussian mechanisms (sensitivity 1, no subsampling).

    Exact: D_alpha(N(1, s^2) || N(0, s^2)) = alpha / (2 s^2), additive under composition.
    """
    _check_mechanism(noise_multiplier, 1.0, max(int(releases), 1))
    a = np.asarray([float(x) for x in orders])
    return int(releases) * a / (2.0 * float(noise_multiplier) ** 2)


def rdp_to_epsilon(orders: Curve, rdp: Curve, *, target_delta: float) -> float:
    """The smallest epsilon at ``target_delta`` implied by an RDP curve.

    Canonne, Kamath & Steinke (2020), Proposition 12:
    eps = r + log(1 - 1/a) - log(delta * a) / (a - 1), minimised over the orders a; and
    epsilon = 0 whenever the order-1 limit already gives delta (total variation
    <= sqrt(1 - exp(-KL)) <= delta, with KL <= the RDP at any order > 1).
    """
    _check_delta(target_delta)
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    if np.any(np.isnan(r)):
        raise PrivacyError("the RDP curve has NaN values")
    if target_delta**2 + math.expm1(-float(np.min(r))) > 0:
        return 0.0
    eps = r + np.log1p(-1.0 / a) - np.log(target_delta * a) / (a - 1.0)
    return float(max(np.min(eps), 0.0))


def rdp_to_delta(orders: Curve, rdp: Curve, *, epsilon: float) -> float:
    """The smallest delta at ``epsilon`` implied by an RDP curve (the same conversion)."""
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    log_delta = (a - 1.0) * (r - epsilon + np.log1p(-1.0 / a)) - np.log(a)
    tv = 0.5 * math.log1p(-math.exp(-float(np.min(r)))) if np.min(r) > 0 else -math.inf
    return float(min(math.exp(min(float(np.min(log_delta)), tv)), 1.0))
