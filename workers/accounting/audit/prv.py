"""The PRV accountant (Gopi, Lee & Wutschitz 2021; Microsoft's ``prv-accountant``), corrected.

It returns lower and upper bounds around its estimate, and verifies ``compose`` and ``basic``
grids and heterogeneous compositions (:func:`prv_epsilon`, :func:`prv_compose_epsilon`). One
numerical step of the library is corrected here (see :func:`_prv_bounds`): as released, it
over-states epsilon by several percent, or fails, at sample rates of about 0.1-0.2. DP
evaluation's Gaussian releases are ``(sigma_e, 1.0, n)``: a plain Gaussian PRV (:func:`_prv`).
The library is imported when called.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
from scipy import integrate
from scipy.fft import next_fast_len

from dpsweep.errors import PrivacyError
from workers.accounting.audit.bounds import EpsilonBounds, _check_delta, _check_mechanism
from workers.accounting.epsilon import PLD_DISCRETIZATION

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


def _prv_version() -> str:
    try:
        return version("prv-accountant")
    except PackageNotFoundError:  # pragma: no cover - the package is a declared dependency
        return "unknown"


@functools.lru_cache(maxsize=1)
def prv_accountant_name() -> str:
    """The PRV accountant's name with its version, e.g. ``prv-accountant 0.2.0 (Gopi ...)``."""
    return f"prv-accountant {_prv_version()} ({PRV_CITATION})"


# -------------------------------------------------------------------------------------------
# The PRV accountant


def _prv(noise_multiplier: float, sample_rate: float) -> Any:
    # deferred: the PRV library is loaded when a plan is verified, not with this package
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
    # deferred: the PRV library is loaded when a plan is verified, not with this package
    from prv_accountant import composers, discretisers  # deferred: as above
    from prv_accountant.accountant import compute_safe_domain_size  # deferred: as above
    from prv_accountant.domain import Domain  # deferred: as above
    from prv_accountant.privacy_random_variables import (  # deferred: as above
        PrivacyRandomVariableTruncated,
    )

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
    # The rest is PRVAccountant.__init__ and compute_epsilon of prv-accountant 0.2.0 (its
    # domain widened to a fast FFT length, _fast_domain).
    half_width = compute_safe_domain_size(
        prvs, counts, eps_error=eps_error, delta_error=delta_error
    )
    mesh = eps_error / np.sqrt(sum(counts) / 2 * np.log(12 / delta_error))
    domain = _fast_domain(Domain.create_aligned(-half_width, half_width, mesh))
    truncated = [
        Truncated(prv, domain.t_min(), domain.t_max(), k)
        for prv, k in zip(prvs, kinks, strict=True)
    ]
    discrete = [discretisers.CellCentred().discretise(t, domain) for t in truncated]
    composed = composers.Heterogeneous(discrete).compute_composition(num_self_compositions=counts)
    lower, estimate, upper = composed.compute_epsilon(target_delta, delta_error, eps_error)
    return float(lower), float(estimate), float(upper)


def _fast_domain(domain: Any) -> Any:
    """``domain`` widened by whole cells on each side to a length the FFT computes fast.

    The composition is one FFT of the domain's length, and ``create_aligned`` picks that
    length from the error bars alone: 544,954 points (2 x 272,477, a prime) for a
    10,000-trial grid took pocketfft ~1 s where a 5-smooth length takes ~20 ms. A wider
    domain at the same mesh only truncates less of the PRV (the library's safe size is a
    lower bound), and it keeps ``create_aligned``'s form, which the Fourier composer's
    re-centring relies on: nodes at multiples of the mesh from ``-c * dt`` to ``(c + 1) *
    dt``, an even length ``2c + 2``, so ``e`` cells are added on each side.
    """
    # deferred: the PRV library is loaded when a plan is verified, not with this package
    from prv_accountant.domain import Domain

    size = len(domain)
    fast = next_fast_len(size, real=True)
    while fast % 2:  # an even length (the composer's), 5-smooth
        fast = next_fast_len(fast + 1, real=True)
    extra = (fast - size) // 2
    if extra == 0:
        return domain
    dt = domain.dt()
    return Domain(domain.t_min() - extra * dt, domain.t_max() + extra * dt, fast)


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
