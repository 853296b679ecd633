"""A second, independent privacy accountant that audits the planner's figures (torch-free).

The planner calibrates with dp_accounting (PLD, or RDP for ``accountant: rdp`` and for
Papernot-Steinke random search). Recomputing with the same library on a finer grid cannot
catch a bug in that library or in how we call it, so this module answers the same questions
with code that shares nothing with it:

* :func:`prv_epsilon`: Gopi, Lee & Wutschitz (2021)'s PRV accountant (Microsoft's
  ``prv-accountant`` package), which returns lower and upper bounds around its estimate. It
  verifies ``compose`` and ``basic`` grids and heterogeneous compositions. One numerical
  step of the library is corrected here (see :func:`_prv_bounds`): as released, it
  over-states epsilon by several percent, or fails, at sample rates of about 0.1-0.2.
* :func:`subsampled_gaussian_rdp`: the Rényi-DP curve of the Poisson-subsampled Gaussian,
  integrated numerically from its definition (no dp_accounting, no Opacus, no TF Privacy
  series), on a dense grid of fractional and integer orders.
* :func:`repeat_and_select_rdp` / :func:`papernot_steinke_epsilon`: Papernot & Steinke
  (ICLR 2022)'s Theorems 2 and 6 for random search with a random number of trials, applied
  to that curve, then converted to (epsilon, delta) with Canonne, Kamath & Steinke (2020)'s
  improved conversion.
* :func:`sweep_epsilon`: the epsilon of releasing every grid of a sweep on one dataset,
  composed tightly rather than summed, with the tight figure verified independently.

DP evaluation (``eval: {mode: dp}``) adds E Gaussian releases per trial (sensitivity 1,
multiplier sigma_e, no subsampling): the PRV accountant takes them as ``(sigma_e, 1.0, n)``
(a plain Gaussian PRV, see :func:`_prv`), the independent RDP adds their exact curve
``n * alpha / (2 sigma_e^2)`` (:func:`gaussian_rdp`).

Libraries are imported lazily; importing this module costs numpy only.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workers.errors import ConfigError, PrivacyError

PRV_CITATION = "Gopi et al. 2021"
# The PRV accountant's epsilon error bar, as a fraction of the expected epsilon. 2 % keeps a
# call at 0.05-0.5 s for typical grids (0.8 s for 140k steps at sigma 1.1; a few seconds only
# for epsilons ~0.1 over 100k+ steps), while a noise multiplier 10 % off moves epsilon by
# more than that and is caught.
PRV_RELATIVE_ERROR = 0.02
# ... and never finer than this in absolute terms: tiny epsilons would otherwise need a mesh
# so fine that the domain has millions of points (8.8 s for epsilon 0.05 at 1e-3).
PRV_MIN_ERROR = 0.01
# The PRV accountant's delta error bar, as a fraction of the target delta: its epsilon bounds
# are computed at delta -/+ this, so it barely widens them.
PRV_DELTA_ERROR = 1e-3

# dp_accounting's pessimistic PLD at the planner's discretisation (PLD_DISCRETIZATION) over-
# states epsilon by this fraction plus an absolute part (see pld_overstatement); beyond both,
# a PLD figure above the PRV's upper bound does not describe the mechanism it claims to.
PLD_STATED_ERROR = 0.01

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

RDP_SOURCE = "independent RDP (numerical integration; Papernot & Steinke 2022 Thms 2 and 6)"


def _prv_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("prv-accountant")
    except PackageNotFoundError:  # pragma: no cover - the package is a declared dependency
        return "unknown"


@functools.lru_cache(maxsize=1)
def prv_accountant_name() -> str:
    """The PRV accountant's name with its version, e.g. ``prv-accountant 0.2.0 (Gopi ...)``."""
    return f"prv-accountant {_prv_version()} ({PRV_CITATION})"


@dataclass(frozen=True)
class EpsilonBounds:
    """An accountant's epsilon with its stated error bars.

    For the PRV accountant ``lower`` and ``upper`` are rigorous bounds on the true epsilon of
    the mechanism. For the independent RDP computations the estimate is itself an upper bound
    on the true epsilon, and ``lower``/``upper`` are that bound minus/plus the tolerance
    within which another RDP implementation of the same theorem must agree with it (they
    differ only in the Rényi orders they optimise over); see :data:`RDP_AGREEMENT`.
    """

    lower: float
    estimate: float
    upper: float
    accountant: str

    def scaled(self, factor: float) -> EpsilonBounds:
        """These bounds multiplied by ``factor`` (``basic``: K trials each of these)."""
        return EpsilonBounds(
            self.lower * factor, self.estimate * factor, self.upper * factor, self.accountant
        )


def _check_mechanism(noise_multiplier: float, sample_rate: float, steps: int) -> None:
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise PrivacyError(
            f"noise multiplier {noise_multiplier} gives no finite privacy guarantee; it must be > 0"
        )
    if not 0.0 < sample_rate <= 1.0:
        raise ConfigError(f"sample rate must be in (0, 1]; got {sample_rate}", field="sample_rate")
    if steps < 1:
        raise ConfigError(f"steps must be >= 1; got {steps}", field="steps")


def _check_delta(target_delta: float) -> None:
    if not 0.0 < target_delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1); got {target_delta}", field="privacy.delta")


# -------------------------------------------------------------------------------------------
# The PRV accountant


def _prv(noise_multiplier: float, sample_rate: float) -> Any:
    from prv_accountant import GaussianMechanism, PoissonSubsampledGaussianMechanism

    if sample_rate >= 1.0:
        # The subsampled PRV's density takes log(1 - q); without subsampling it is Gaussian.
        return GaussianMechanism(noise_multiplier=noise_multiplier)
    return PoissonSubsampledGaussianMechanism(
        noise_multiplier=noise_multiplier, sampling_probability=sample_rate
    )


def pld_overstatement(*, epsilon: float, steps: int) -> float:
    """How far the planner's pessimistic PLD may lie above an epsilon of ``epsilon``.

    ``PLD_STATED_ERROR * epsilon + 2 * PLD_DISCRETIZATION * sqrt(steps)``. The relative part
    is the ~0.3 % seen at moderate noise. The absolute part is empirical: with much noise and
    a small rate, rounding every step's privacy loss up to the 2.5e-4 grid adds up, and the
    PLD lay above the PRV's upper bound by up to 0.79 * 2.5e-4 * sqrt(steps) beyond the 1 %
    (e.g. 0.21 where the PRV says 0.10-0.12, at sigma 19.5, q 1.1e-3, 221k steps) in ~400
    random cases with sigma 0.5-100, q 1e-4-0.5 and up to 300k steps. Twice that is allowed:
    this side only catches figures that over-state, which is not a privacy risk.
    """
    from workers.accounting import PLD_DISCRETIZATION

    return PLD_STATED_ERROR * epsilon + 2 * PLD_DISCRETIZATION * math.sqrt(steps)


def prv_error(expected_epsilon: float) -> float:
    """The PRV ``eps_error`` to ask for when the answer should be near ``expected_epsilon``."""
    if not math.isfinite(expected_epsilon):
        return 0.1
    return max(PRV_RELATIVE_ERROR * expected_epsilon, PRV_MIN_ERROR)


def _prv_bounds(
    mechanisms: Sequence[tuple[float, float, int]],
    target_delta: float,
    eps_error: float,
    delta_error: float,
) -> tuple[float, float, float]:
    """prv-accountant 0.2.0's ``PRVAccountant`` (same steps, same library parts), with one fix.

    Its truncated PRV computes the privacy loss's mean by integrating the CDF between fixed
    breakpoints (-0.1, -0.01, ..., 0.1). The Poisson-subsampled Gaussian's loss starts at
    log(1 - q), where the CDF has a kink that quad does not see: for q of about 0.1-0.3 and
    sigma near 1 the mean comes out up to 70 % too large. The discretiser shifts every step
    by that mean, so T steps move epsilon by T times the error: for sigma 1.17, q 0.136,
    T 276 the library reports bounds 12.97-13.47 where an exact composition (each loss
    rounded up, and down, to a 2.5e-4 grid) brackets the true epsilon in 12.61-12.68; for
    other such settings it fails ("Discrete mean differs from continuous mean"). With
    log(1 - q) as a breakpoint the mean matches KL(P||Q), integrated independently, to
    < 2e-6 relative for sigma 0.6-10 and q 1e-3-0.95, and the bounds bracket the PLD again.
    """
    from prv_accountant import composers, discretisers
    from prv_accountant.accountant import compute_safe_domain_size
    from prv_accountant.domain import Domain
    from prv_accountant.privacy_random_variables import PrivacyRandomVariableTruncated
    from scipy import integrate

    class Truncated(PrivacyRandomVariableTruncated):
        def __init__(self, prv: Any, t_min: float, t_max: float, kinks: Sequence[float]) -> None:
            super().__init__(prv, t_min, t_max)
            self.kinks = [k for k in kinks if t_min < k < t_max]

        def mean(self) -> float:
            fixed = [-1e-1, -1e-2, -1e-3, -1e-4, -1e-5, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1]
            points = sorted({float(self.t_min), float(self.t_max), *fixed, *self.kinks})
            m = 0.0
            for lo, hi in itertools.pairwise(points):
                area, _ = integrate.quad(self.safe_cdf, lo, hi, limit=500)
                m += hi * self.safe_cdf(hi) - lo * self.safe_cdf(lo) - area
            return float(m)

        def safe_cdf(self, t: Any) -> Any:
            # Just above log(1 - q) the library's CDF takes the log of a rounded, slightly
            # negative number (NaN); the CDF is 0 to within 1e-8 there.
            return np.nan_to_num(self.cdf(t), nan=0.0)

    prvs = [_prv(sigma, q) for sigma, q, _ in mechanisms]
    kinks = [[math.log1p(-q)] if q < 1 else [] for _, q, _ in mechanisms]
    counts = [int(t) for _, _, t in mechanisms]
    # The rest is PRVAccountant.__init__ and compute_epsilon of prv-accountant 0.2.0.
    half_width = compute_safe_domain_size(
        prvs, counts, eps_error=eps_error, delta_error=delta_error
    )
    mesh = eps_error / np.sqrt(sum(counts) / 2 * np.log(12 / delta_error))
    domain = Domain.create_aligned(-half_width, half_width, mesh)
    truncated = [
        Truncated(prv, domain.t_min(), domain.t_max(), k)
        for prv, k in zip(prvs, kinks, strict=True)
    ]
    discrete = [discretisers.CellCentred().discretise(t, domain) for t in truncated]
    composed = composers.Heterogeneous(discrete).compute_composition(num_self_compositions=counts)
    lower, estimate, upper = composed.compute_epsilon(target_delta, delta_error, eps_error)
    return float(lower), float(estimate), float(upper)


@functools.lru_cache(maxsize=1024)
def _prv_compose(
    mechanisms: tuple[tuple[float, float, int], ...], target_delta: float, eps_error: float
) -> EpsilonBounds:
    bounds: tuple[float, float, float] | None = None
    error = eps_error
    for _ in range(3):
        try:
            bounds = _prv_bounds(mechanisms, target_delta, error, PRV_DELTA_ERROR * target_delta)
            break
        except RuntimeError as exc:
            # "Discrete mean differs from continuous mean": the mesh is too fine for the
            # mean's quadrature; a coarser one (wider, still rigorous bars) usually works.
            failure: Exception = exc
            error *= 2
        except (ValueError, FloatingPointError) as exc:
            # E.g. "Floating point errors will dominate for such small values of delta".
            failure = exc
            break
    if bounds is None:
        raise PrivacyError(f"{prv_accountant_name()} could not compute epsilon: {failure}")
    if not all(math.isfinite(b) for b in bounds):
        raise PrivacyError(f"{prv_accountant_name()} returned a non-finite epsilon {bounds}")
    # A lower bound below zero says nothing more than zero does.
    return EpsilonBounds(max(bounds[0], 0.0), bounds[1], bounds[2], prv_accountant_name())


def prv_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    target_delta: float,
    eps_error: float = 0.1,
) -> EpsilonBounds:
    """Epsilon of ``steps`` Poisson-subsampled Gaussian steps by the PRV accountant.

    Args:
        noise_multiplier: The Gaussian's standard deviation over the sensitivity (sigma).
        sample_rate: The Poisson sampling rate q.
        steps: The number of steps T.
        target_delta: The delta to report epsilon at.
        eps_error: The accountant's additive error bar on epsilon (``lower`` and ``upper``
            are the estimate -/+ about this). Its cost grows like ``1 / eps_error``; use
            :func:`prv_error` for one relative to the epsilon you expect.

    Raises:
        PrivacyError: the accountant cannot establish epsilon (e.g. delta too small).
    """
    _check_mechanism(noise_multiplier, sample_rate, steps)
    _check_delta(target_delta)
    return _prv_compose(
        ((float(noise_multiplier), float(sample_rate), int(steps)),),
        float(target_delta),
        float(eps_error),
    )


def prv_compose_epsilon(
    mechanisms: Sequence[tuple[float, float, int]], *, target_delta: float, eps_error: float = 0.1
) -> EpsilonBounds:
    """Epsilon of a heterogeneous composition by the PRV accountant.

    Args:
        mechanisms: ``(noise_multiplier, sample_rate, steps)`` per kind of step.
        target_delta: The delta to report epsilon at.
        eps_error: As for :func:`prv_epsilon`.
    """
    _check_delta(target_delta)
    merged: dict[tuple[float, float], int] = {}
    for sigma, q, steps in mechanisms:
        _check_mechanism(sigma, q, steps)
        # Identical mechanisms compose as one PRV with more self-compositions (cheaper).
        merged[(float(sigma), float(q))] = merged.get((float(sigma), float(q)), 0) + int(steps)
    key = tuple(sorted((s, q, t) for (s, q), t in merged.items()))
    return _prv_compose(key, float(target_delta), float(eps_error))


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


def _eval_pair(eval_noise_multiplier: float | None, eval_releases: int) -> tuple[float | None, int]:
    """(sigma_e, E) normalised: (None, 0) when there is nothing to charge."""
    if not eval_releases:
        return None, 0
    if eval_releases < 0 or eval_noise_multiplier is None:
        raise PrivacyError(
            f"{eval_releases} evaluation release(s) without a valid noise multiplier "
            f"({eval_noise_multiplier}) cannot be accounted"
        )
    _check_mechanism(float(eval_noise_multiplier), 1.0, int(eval_releases))
    return float(eval_noise_multiplier), int(eval_releases)


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
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    mean_trials: float,
    shape: float,
    target_delta: float,
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> EpsilonBounds:
    """:func:`papernot_steinke_epsilon` with the agreement tolerance as its error bars."""
    eps = papernot_steinke_epsilon(
        noise_multiplier=noise_multiplier,
        sample_rate=sample_rate,
        steps=steps,
        mean_trials=mean_trials,
        shape=shape,
        target_delta=target_delta,
        eval_noise_multiplier=eval_noise_multiplier,
        eval_releases=eval_releases,
    )
    return EpsilonBounds(eps * (1 - RDP_AGREEMENT), eps, eps * (1 + RDP_AGREEMENT), RDP_SOURCE)


# -------------------------------------------------------------------------------------------
# A whole sweep on one dataset


@dataclass(frozen=True)
class SweepEpsilon:
    """The epsilon of releasing every grid of a sweep, at the sum of their deltas.

    Attributes:
        epsilon: ``min(tight, summed)``: both are valid guarantees at ``delta``.
        delta: The sum of the grids' deltas (what the ledger charges).
        method: How ``epsilon`` was obtained: ``"pld composition"``, ``"rdp composition"``
            or ``"sum of grid epsilons"``.
        tight: The tight composition's epsilon (dp_accounting PLD, or RDP when a grid is a
            random search).
        summed: The sum of the grids' own epsilons (basic composition).
        verifier: The independent accountant that checked ``tight``.
        verifier_bounds: Its figure with error bars.
    """

    epsilon: float
    delta: float
    method: str
    tight: float
    summed: float
    verifier: str
    verifier_bounds: EpsilonBounds


_GRID_FIELDS = ("accounting", "trials", "steps_per_trial", "sample_rate", "noise_multiplier")


def _field(grid: Any, name: str, default: Any = None) -> Any:
    if isinstance(grid, Mapping):
        return grid.get(name, default)
    return getattr(grid, name, default)


@dataclass(frozen=True)
class _Grid:
    accounting: str
    trials: int
    steps: int
    q: float
    sigma: float
    delta: float
    epsilon: float
    mean: float
    shape: float
    # DP evaluation: sigma_e of each release and E, the releases per trial (None, 0: none).
    eval_sigma: float | None = None
    eval_releases: int = 0

    def eval_mechanism(self) -> tuple[float, float, int] | None:
        """All K trials' K*E evaluation releases as ``(sigma_e, 1.0, K*E)``, or None."""
        if self.eval_sigma is None:
            return None
        return (self.eval_sigma, 1.0, self.trials * self.eval_releases)


def _grid(grid: Any) -> _Grid:
    missing = [f for f in (*_GRID_FIELDS, "delta", "epsilon_total") if _field(grid, f) is None]
    if missing:
        raise ConfigError(f"a grid of the sweep lacks {', '.join(missing)}", field="plan")
    accounting = str(_field(grid, "accounting"))
    shape = math.nan
    if accounting == "papernot-steinke":
        raw = _field(grid, "distribution_shape")
        if raw is None:
            raise PrivacyError(
                f"papernot-steinke grid {_field(grid, 'arm', '?')!r} does not record its "
                "distribution's shape; its random search cannot be accounted"
            )
        shape = float(raw)  # float("inf") also reads the "inf" that JSON plans store
    elif accounting not in ("compose", "basic"):
        raise PrivacyError(f"no accounting rule for {accounting!r}")
    trials = int(_field(grid, "trials"))
    raw_e = _field(grid, "eval_noise_multiplier")
    eval_sigma, eval_releases = _eval_pair(
        None if raw_e is None else float(raw_e), int(_field(grid, "eval_releases") or 0)
    )
    return _Grid(
        accounting=accounting,
        trials=trials,
        steps=int(_field(grid, "steps_per_trial")),
        q=float(_field(grid, "sample_rate")),
        sigma=float(_field(grid, "noise_multiplier")),
        delta=float(_field(grid, "delta")),
        epsilon=float(_field(grid, "epsilon_total")),
        mean=float(_field(grid, "mean_trials", None) or trials),
        shape=shape,
        eval_sigma=eval_sigma,
        eval_releases=eval_releases,
    )


def sweep_epsilon(grids: Iterable[Any]) -> SweepEpsilon:
    """The epsilon of releasing ALL the grids of a sweep on one dataset, composed tightly.

    ``compose`` and ``basic`` grids are K*T subsampled-Gaussian steps each (however their
    budget was split): all of them are composed heterogeneously by dp_accounting's PLD
    (pessimistic discretisation) and verified by the PRV accountant's heterogeneous
    composition. When a grid is a ``papernot-steinke`` random search, everything is composed
    in RDP instead (dp_accounting's RdpAccountant with RepeatAndSelect events), verified by
    this module's independent RDP. The result is the smaller of that and the plain sum of the
    grids' epsilons (always valid), at delta = the sum of the grids' deltas.

    A grid with DP evaluation (``eval_noise_multiplier`` sigma_e and ``eval_releases`` E per
    trial) also releases K*E Gaussians of multiplier sigma_e (one of sigma_e / sqrt(K*E));
    in a random search they belong to each run, inside its RepeatAndSelect.

    Args:
        grids: :class:`sweeper.planner.GridPlan` objects, or their ``to_dict()`` (stored
            plans): accounting, trials, steps_per_trial, sample_rate, noise_multiplier,
            delta, epsilon_total, and for random search distribution_shape (a number, or
            "inf" for Poisson) and optionally mean_trials (default: ``trials``); with DP
            evaluation eval_noise_multiplier and eval_releases (absent, None or 0: none).

    Raises:
        PrivacyError: the tight composition disagrees with the independent one beyond their
            error bars (fail closed: one of the two accountants is wrong), or a grid cannot
            be accounted.
    """
    gs = [_grid(g) for g in grids]
    if not gs:
        raise ConfigError("a sweep needs at least one grid", field="plan")
    delta = math.fsum(g.delta for g in gs)
    if not delta < 1:
        raise PrivacyError(f"the grids' deltas sum to {delta:g}: no guarantee remains")
    summed = math.fsum(g.epsilon for g in gs)
    if any(g.accounting == "papernot-steinke" for g in gs):
        tight = _rdp_sweep(gs, delta)
        bounds = _independent_rdp_sweep(gs, delta)
        method = "rdp composition"
        # Both are RDP bounds of the same events. Ours optimises over a superset of
        # dp_accounting's orders with exact moments, so theirs may be higher (it over-states
        # fractional orders near 1), never lower beyond the order-grid tolerance.
        disagree = not tight >= bounds.lower
    else:
        tight = _pld_sweep(gs, delta)
        mechanisms = [(g.sigma, g.q, g.trials * g.steps) for g in gs]
        evals = [m for m in (g.eval_mechanism() for g in gs) if m is not None]
        bounds = prv_compose_epsilon(
            mechanisms + evals, target_delta=delta, eps_error=prv_error(tight)
        )
        method = "pld composition"
        # PLD (pessimistic) is an upper bound: below PRV's lower bound it under-states; far
        # above PRV's upper bound it is not the composition we think it is. (_pld_sweep
        # composes each grid's evaluations as one Gaussian: one more discretised loss each.)
        steps = sum(g.trials * g.steps for g in gs) + len(evals)
        slack = pld_overstatement(epsilon=bounds.upper, steps=steps)
        disagree = not bounds.lower <= tight <= bounds.upper + slack
    if disagree:
        raise PrivacyError(
            f"sweep composition: dp_accounting's {method} gives epsilon {tight:.4f} but "
            f"{bounds.accountant} gives {bounds.estimate:.4f} (bounds {bounds.lower:.4f} to "
            f"{bounds.upper:.4f}) at delta {delta:.3g}; the two accountants disagree beyond "
            "their error bars, so the sweep's epsilon is not trusted"
        )
    if summed <= tight:
        method = "sum of grid epsilons"
    return SweepEpsilon(
        epsilon=min(tight, summed),
        delta=delta,
        method=method,
        tight=tight,
        summed=summed,
        verifier=bounds.accountant,
        verifier_bounds=bounds,
    )


def _pld_sweep(gs: Sequence[_Grid], delta: float) -> float:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    from workers.accounting import PLD_DISCRETIZATION

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    for g in gs:
        acc.compose(
            dp_event.PoissonSampledDpEvent(g.q, dp_event.GaussianDpEvent(g.sigma)),
            g.trials * g.steps,
        )
        ev = g.eval_mechanism()
        if ev is not None:
            # K*E Gaussians of multiplier sigma_e are one of sigma_e / sqrt(K*E) (exact).
            acc.compose(dp_event.GaussianDpEvent(ev[0] / math.sqrt(ev[2])))
    return float(acc.get_epsilon(delta))


def _rdp_sweep(gs: Sequence[_Grid], delta: float) -> float:
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant()
    for g in gs:
        step = dp_event.PoissonSampledDpEvent(g.q, dp_event.GaussianDpEvent(g.sigma))
        if g.accounting == "papernot-steinke":
            run: Any = dp_event.SelfComposedDpEvent(step, g.steps)
            if g.eval_sigma is not None:
                # One run: its steps and its E evaluations (one Gaussian of sigma_e/sqrt(E)).
                ev = dp_event.GaussianDpEvent(g.eval_sigma / math.sqrt(g.eval_releases))
                run = dp_event.ComposedDpEvent([run, ev])
            acc.compose(dp_event.RepeatAndSelectDpEvent(run, g.mean, g.shape))
        else:
            acc.compose(step, g.trials * g.steps)
            ev_all = g.eval_mechanism()
            if ev_all is not None:
                acc.compose(dp_event.GaussianDpEvent(ev_all[0] / math.sqrt(ev_all[2])))
    return float(acc.get_epsilon(delta))


def _independent_rdp_sweep(gs: Sequence[_Grid], delta: float) -> EpsilonBounds:
    total = np.zeros(len(RDP_ORDERS))
    for g in gs:
        if g.accounting == "papernot-steinke":
            total += np.asarray(
                _ps_rdp(g.sigma, g.q, g.steps, g.mean, g.shape, g.eval_sigma, g.eval_releases)
            )
        else:
            total += subsampled_gaussian_rdp(
                noise_multiplier=g.sigma, sample_rate=g.q, steps=g.trials * g.steps
            )
            ev = g.eval_mechanism()
            if ev is not None:
                total += gaussian_rdp(noise_multiplier=ev[0], releases=ev[2])
    eps = rdp_to_epsilon(RDP_ORDERS, total, target_delta=delta)
    return EpsilonBounds(eps * (1 - RDP_AGREEMENT), eps, eps * (1 + RDP_AGREEMENT), RDP_SOURCE)
