"""Papernot & Steinke (ICLR 2022): random search with a random number of trials, independently.

Their Theorems 2 and 6 applied to the independent RDP curve (:mod:`workers.accounting.audit.rdp`),
then converted to (epsilon, delta) with Canonne, Kamath & Steinke (2020)'s improved conversion
(:func:`papernot_steinke_epsilon`, :func:`papernot_steinke_bounds`). With DP evaluation one
run's curve also holds its E Gaussian releases, ``E * alpha / (2 sigma_e^2)``.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.errors import ConfigError
from workers.accounting.audit.bounds import EpsilonBounds, _check_mechanism, _eval_pair
from workers.accounting.audit.rdp import (
    RDP_ORDERS,
    Curve,
    gaussian_rdp,
    rdp_to_delta,
    rdp_to_epsilon,
    subsampled_gaussian_rdp,
)

RDP_SOURCE = "independent RDP (numerical integration; Papernot & Steinke 2022 Thms 2 and 6)"


# -------------------------------------------------------------------------------------------
# Papernot & Steinke (2022): random search with a random number of trials


def truncated_negative_binomial_mean(gamma: float, shape: float) -> float:
    """E[K] of the truncated negative binomial D_{eta, gamma} (P&S Definition 1)."""
    if gamma >= 1.0:
        return 1.0
    if shape == 0:  # logarithmic
        return (1.0 / gamma - 1.0) / math.log(1.0 / gamma)
    # eta (1 - gamma) / (gamma (1 - gamma^eta)); -expm1 keeps it exact for small eta.
    return shape * (1.0 - gamma) / (gamma * -math.expm1(shape * math.log(gamma)))


def truncated_negative_binomial_gamma(shape: float, mean: float) -> float:
    """The gamma whose truncated negative binomial has mean ``mean``.

    E[K] falls from infinity to 1 as gamma rises from 0 to 1; bisection to a relative 1e-12.
    The smaller end of the bracket is returned: a smaller gamma only enlarges the
    log(1/gamma) term of the bound (conservative).
    """
    if mean <= 1.0:
        return 1.0
    if shape == 1:
        return 1.0 / mean  # geometric
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        if truncated_negative_binomial_mean(mid, shape) > mean:
            lo = mid
        else:
            hi = mid
    return lo if lo > 0 else hi / 2


def repeat_and_select_rdp(
    orders: Curve, rdp: Curve, *, mean_trials: float, shape: float
) -> np.ndarray:
    """The RDP curve of running a mechanism K times and releasing only the best run.

    Args:
        orders: Rényi orders (each > 1).
        rdp: The RDP of ONE run at each order.
        mean_trials: E[K].
        shape: The distribution of K: ``inf`` for Poisson(mean_trials) (Theorem 6);
            otherwise the truncated negative binomial of that eta >= 0 (Theorem 2;
            0 is logarithmic, 1 geometric).

    Theorem 2: eps'(l) = eps(l) + (1+eta)(1 - 1/lh) eps(lh) + (1+eta) log(1/gamma)/lh
    + log(E[K])/(l - 1), minimised over lh in {1} and the orders (lh = 1 is allowed and
    makes the second term vanish). Theorem 6: eps'(l) = eps(l) + mu * deltahat +
    log(mu)/(l - 1), with deltahat the run's delta at epshat = log(1 + 1/(l - 1)). Finally
    RDP is non-decreasing in the order, so each order takes the best value of any higher one.
    """
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    if a.shape != r.shape or np.any(a <= 1):
        raise ConfigError("orders and rdp must match, with every order > 1", field="orders")
    if not mean_trials >= 1:
        raise ConfigError(f"the mean number of trials must be >= 1; got {mean_trials}")
    if math.isnan(shape) or shape < 0:
        raise ConfigError(f"the distribution's shape must be >= 0; got {shape}")
    if math.isinf(shape):
        out = np.empty_like(r)
        for i, order in enumerate(a):
            eps_hat = math.log1p(1.0 / (order - 1.0))
            delta_hat = rdp_to_delta(a, r, epsilon=eps_hat)
            out[i] = r[i] + mean_trials * delta_hat + math.log(mean_trials) / (order - 1.0)
    else:
        gamma = truncated_negative_binomial_gamma(shape, mean_trials)
        log_inv_gamma = -math.log(gamma)
        # lh = 1 (second term 0) or any order of the curve.
        cross = min(log_inv_gamma, float(np.min((1.0 - 1.0 / a) * r + log_inv_gamma / a)))
        out = r + (1.0 + shape) * cross + math.log(mean_trials) / (a - 1.0)
    # Monotonicity in the order: a bound at a higher order also holds at a lower one.
    order_idx = np.argsort(a)
    tail_min = np.minimum.accumulate(out[order_idx][::-1])[::-1]
    result = np.empty_like(out)
    result[order_idx] = tail_min
    return result


@functools.lru_cache(maxsize=1024)
def _ps_rdp(
    sigma: float,
    q: float,
    steps: int,
    mean: float,
    shape: float,
    eval_sigma: float | None = None,
    eval_releases: int = 0,
) -> tuple[float, ...]:
    one_run = subsampled_gaussian_rdp(noise_multiplier=sigma, sample_rate=q, steps=steps)
    if eval_sigma is not None and eval_releases > 0:
        # One run also releases its E noisy evaluations: composed with its steps (RDP adds).
        one_run = one_run + gaussian_rdp(noise_multiplier=eval_sigma, releases=eval_releases)
    return tuple(repeat_and_select_rdp(RDP_ORDERS, one_run, mean_trials=mean, shape=shape))


def papernot_steinke_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    mean_trials: float,
    shape: float,
    target_delta: float,
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> float:
    """Epsilon of random search (Papernot & Steinke 2022) computed independently.

    The search runs K trials of ``steps`` subsampled-Gaussian steps (K drawn from the
    distribution of ``shape`` with mean ``mean_trials``; see :func:`repeat_and_select_rdp`)
    and releases only the best one. With DP evaluation each run also makes
    ``eval_releases`` Gaussian releases of multiplier ``eval_noise_multiplier``: one run's
    RDP curve is then the steps' plus ``E * alpha / (2 sigma_e^2)``.
    """
    _check_mechanism(noise_multiplier, sample_rate, steps)
    sigma_e, releases = _eval_pair(eval_noise_multiplier, eval_releases)
    rdp = _ps_rdp(
        float(noise_multiplier),
        float(sample_rate),
        int(steps),
        float(mean_trials),
        float(shape),
        sigma_e,
        releases,
    )
    return rdp_to_epsilon(RDP_ORDERS, rdp, target_delta=target_delta)


# Two implementations of the same RDP bound differ only by the Rényi orders they optimise
# over (epsilon is a minimum over orders, and Theorem 2 adds a minimum over lh) and by how
# exactly they compute each order's RDP. Ours uses exact moments on a superset of
# dp_accounting's default orders, so dp_accounting's figure is never lower (measured: at most
# +7e-12 relative over 960 settings); in realistic plans it is higher by up to ~1 % (its
# series over-states fractional orders near 1). Should dp_accounting's orders ever fall
# between ours, its figure could come out lower by our grid's own discretisation: a 4x denser
# grid lowers ours by < 1.2 % wherever epsilon >= 0.1. A planner figure more than this below
# ours is not explained by the grid, and the plan is refused.
RDP_AGREEMENT = 0.02


def papernot_steinke_bounds(
    run: AccountingInputs, *, mean_trials: float, shape: float
) -> EpsilonBounds:
    """:func:`papernot_steinke_epsilon` of a search repeating ``run`` (its sigma, q, T, delta
    and E evaluations; its accountant is not read: this is the independent one), with the
    agreement tolerance as its error bars."""
    eps = papernot_steinke_epsilon(
        noise_multiplier=run.sigma,
        sample_rate=run.sample_rate,
        steps=run.steps,
        mean_trials=mean_trials,
        shape=shape,
        target_delta=run.delta,
        eval_noise_multiplier=run.eval_noise_multiplier,
        eval_releases=run.evaluations,
    )
    return EpsilonBounds(eps * (1 - RDP_AGREEMENT), eps, eps * (1 + RDP_AGREEMENT), RDP_SOURCE)
