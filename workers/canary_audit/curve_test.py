"""A one-run test of the accountant's whole claimed privacy curve (torch-free).

The accountant claims more than one (epsilon, delta) pair: it claims the run is the
Poisson-subsampled Gaussian of multiplier sigma at rate q over T steps, whose trade-off curve
f (the least type-II error of any test of "canary out" against "canary in" at each type-I
error) is known exactly. This module tests that claim with the audit's canaries, following
Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy in One Run" (ICML 2025,
arXiv:2410.22235).

**The test.** m canaries are each included with probability ½; the auditor guesses "in" for
the ``k_in`` top scores and "out" for the ``k_out`` bottom ones (k = k_in + k_out guesses)
and counts the c correct. If the run is f-DP with respect to each canary, a canary's
correct and wrong guesses are tied by f's *blow-up* ``g(x) = 1 - f(x)`` (the most an event
of probability x without the canary can have with it). Going backwards from c correct
guesses to none, the paper's recursion lower-bounds, per canary, the mass of correct
guesses (r) and of wrong ones (h) that an f-DP run would need to reach c correct with
probability tau: each step, the wrong guesses need at least ``g^-1(r)``, and correct ones
grow with them. If their total exceeds the k/m a run can make, P[correct >= c] >= tau is
impossible for an f-DP run: the claim is refuted at level tau. The p-value is the least such
tau. Nothing is assumed about the scores or the mechanism beyond the claim under test, so
a run that honours the claimed curve is refuted with probability at most the level, whatever
it is.

**Soundness of the numbers.** The curve is never made more private than the claim: at q = 1
the T steps compose to the Gaussian trade-off of mu = sqrt(T)/sigma, exactly; at q < 1 the
curve comes from dp_accounting's *pessimistic* privacy-loss distribution (both neighbouring
directions), through its privacy profile delta(eps) on a finite grid of eps (fewer eps only
weaken the claim), and ``g^-1`` is tabulated and read at the grid point at or below (it is
increasing, so this under-states it, which only makes refutation harder).

**The guesses** are fixed before any score is seen: the pairs of
:data:`workers.canary_audit.bounds.GUESS_PAIRS`, paid for with a union bound (each pair is
tested at level / number of pairs), as the one-run epsilon bound does.

**What it says, and what not.** A refutation says the run is not the claimed mechanism (it
leaks more than the planned noise allows somewhere on its curve), at a false-alarm rate of
at most 1 - confidence. No refutation confirms nothing. It is not an epsilon lower bound: the
one-run (epsilon, delta) bound (:mod:`workers.canary_audit.bounds`) stays the audit's
``epsilon_lower_bound``. :func:`noise_scale_upper_bound` turns the test into a figure: the
smallest factor s for which the curve of sigma * s (same q and T) is refuted.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from workers.canary_audit.bounds import GUESS_PAIRS, correct_counts, guess_pairs, level_of

#: logit(y) grid on which g^-1 is tabulated (y from about 1e-20 to 1 - 1e-20).
_LOGIT_GRID = np.linspace(-46.0, 46.0, 12_001)
#: PLD grid on the privacy-loss axis: coarse, but pessimistic, so it only over-states delta.
CURVE_DISCRETIZATION = 1e-3
#: The eps grid of the privacy profile at q < 1.
_PROFILE_POINTS = 800
#: The noise scale factors searched by :func:`noise_scale_upper_bound`.
SCALE_RANGE = (0.125, 8.0)


@dataclass(frozen=True)
class ClaimedCurve:
    """A claimed trade-off curve, as the tabulated inverse of its blow-up ``g(x) = 1 - f(x)``.

    ``inverse[j]`` is (at most) the least x with ``g(x) >= expit(_LOGIT_GRID[j])``.
    """

    noise_multiplier: float
    sample_rate: float
    steps: int
    inverse: np.ndarray

    def blow_up_inverse(self, y: np.ndarray) -> np.ndarray:
        """A lower bound on the least x with ``g(x) >= y`` (0 below the table, y clipped to 1)."""
        t = special.logit(np.clip(y, 0.0, 1.0))
        j = np.searchsorted(_LOGIT_GRID, t, side="right") - 1
        out = np.where(j < 0, 0.0, self.inverse[np.clip(j, 0, _LOGIT_GRID.size - 1)])
        return np.where(y >= 1.0, self.inverse[-1], out)


@functools.lru_cache(maxsize=64)
def claimed_curve(*, noise_multiplier: float, sample_rate: float, steps: int) -> ClaimedCurve:
    """The trade-off curve of T Poisson-subsampled Gaussian steps (sigma, q), never more
    private than the exact curve.

    Args:
        noise_multiplier: sigma of every step (> 0).
        sample_rate: q in (0, 1].
        steps: T >= 1 (a pack of K trials of T steps each: K T).
    """
    if not noise_multiplier > 0 or not 0 < sample_rate <= 1 or steps < 1:
        raise ValueError("need noise_multiplier > 0, 0 < sample_rate <= 1 and steps >= 1")
    y = special.expit(_LOGIT_GRID)
    if sample_rate >= 1.0:
        # T Gaussians of shift 1/sigma compose to the Gaussian trade-off of sqrt(T)/sigma:
        # g(x) = Phi(Phi^-1(x) + mu), so g^-1(y) = Phi(Phi^-1(y) - mu), exactly.
        mu = math.sqrt(steps) / noise_multiplier
        inverse = stats.norm.cdf(stats.norm.ppf(y) - mu)
    else:
        inverse = _inverse_from_profile(y, *_profile(noise_multiplier, sample_rate, steps))
    return ClaimedCurve(noise_multiplier, sample_rate, steps, np.asarray(inverse, np.float64))


def _profile(sigma: float, q: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The privacy profile delta(eps) of the composition, pessimistic, on a grid of eps."""
    # deferred: dp_accounting is heavy, and q = 1 (the exact Gaussian curve) never needs it
    from workers.accounting.gaussian_pld import composed_pld

    pld = composed_pld([(sigma, q, steps)], value_discretization_interval=CURVE_DISCRETIZATION)
    hi = 1.0
    while float(pld.get_delta_for_epsilon(hi)) > 1e-15 and hi < 256:
        hi *= 2.0
    eps = np.linspace(0.0, hi, _PROFILE_POINTS)
    with np.errstate(over="ignore", invalid="ignore"):
        deltas = np.asarray(pld.get_delta_for_epsilon(eps), dtype=np.float64)
    if not np.isfinite(deltas).all():
        raise ValueError("the privacy profile of the claimed curve is not finite")
    return eps, np.clip(deltas, 0.0, 1.0)


def _inverse_from_profile(y: np.ndarray, eps: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """g^-1(y) for ``g(x) = min_eps min(1, e^eps x + delta, 1 - e^-eps (1 - delta - x))``.

    (eps, delta(eps))-DP in both directions for every eps is f-DP for the curve of that
    profile; g is a minimum of increasing affine maps, so ``g(x) >= y`` exactly when every
    map is, and the inverse is the largest of the maps' inverses.
    """
    out = np.zeros_like(y)
    for e, d in zip(eps.tolist(), deltas.tolist(), strict=True):
        out = np.maximum(out, (y - d) * math.exp(-e))
        out = np.maximum(out, 1.0 - d - math.exp(e) * (1.0 - y))
    return out


def falsified(
    curve: ClaimedCurve, *, m: int, guesses: int, correct: np.ndarray, tau: np.ndarray
) -> np.ndarray:
    """Whether P[correct >= c] >= tau is impossible under the claimed curve (broadcast).

    The recursion of Mahloujifar et al.: from i = c - 1 down to 0, the wrong guesses' mass h
    must reach g^-1 of the correct ones' r, and r grows by i / (k - i) of h's increase; the
    claim falls when r + h exceeds k / m. Vectorised over ``correct`` and ``tau``.
    """
    c, t = np.broadcast_arrays(np.asarray(correct, np.int64), np.asarray(tau, np.float64))
    r = t * c / m
    h = t * (guesses - c) / m
    frozen = c == 0
    for i in range(int(c.max(initial=0)) - 1, -1, -1):
        active = (i < c) & ~frozen
        if not active.any():
            if (frozen | (i < c)).all():
                break
            continue
        h_new = np.where(active, np.maximum(h, curve.blow_up_inverse(r)), h)
        # Once h stops growing for a run, r stops too: nothing changes for it any more.
        frozen |= active & (h_new == h)
        r = np.minimum(r + (i / (guesses - i)) * (h_new - h), 1.0)
        h = h_new
    return (r + h > guesses / m) & (c > 0)


#: The tau grid of the p-values: 8 points a decade from 1e-16 to 1.
_TAU_GRID = np.logspace(-16.0, 0.0, 129)


def pair_p_values(
    curve: ClaimedCurve, *, m: int, guesses: int, correct: np.ndarray, extra: float
) -> np.ndarray:
    """For each count, the least tau of the grid (plus ``extra``) whose claim is refuted.

    Any refuted tau bounds P[correct >= c] from above, so the least one is a valid p-value;
    ``extra`` (the level each pair is tested at) is in the grid, so that "p <= level" is
    exactly "refuted at the level". 1 where no tau is refuted.
    """
    taus = np.unique(np.concatenate([_TAU_GRID, [extra]]))
    c = np.asarray(correct, np.int64).reshape(-1, 1)
    hit = falsified(curve, m=m, guesses=guesses, correct=c, tau=taus.reshape(1, -1))
    first = np.where(hit.any(axis=1), hit.argmax(axis=1), -1)
    return np.where(first >= 0, taus[np.clip(first, 0, None)], 1.0)


def p_values(counts: np.ndarray, curve: ClaimedCurve, *, m: int, level: float) -> np.ndarray:
    """The curve test's p-value of each run from its :func:`correct_counts` ``[..., pairs]``.

    The union bound over the pairs: the number of pairs times the least pair p-value, at most
    1. Each distinct count is tested once (thousands of simulated runs share few counts).
    """
    counts = np.asarray(counts)
    best = np.ones(counts.shape[:-1])
    per_pair = level / len(GUESS_PAIRS)
    for j, (k_in, k_out) in enumerate(guess_pairs(m)):
        column = counts[..., j]
        values, inverse = np.unique(column, return_inverse=True)
        p = pair_p_values(curve, m=m, guesses=k_in + k_out, correct=values, extra=per_pair)
        best = np.minimum(best, p[inverse.reshape(column.shape)])
    return np.minimum(best * len(GUESS_PAIRS), 1.0)


@dataclass(frozen=True)
class CurveTest:
    """The curve test of one audit.

    Attributes:
        claim_p_value: the p-value of "the run satisfies the claimed curve".
        claim_refuted: ``claim_p_value <= 1 - confidence``; a run that honours the claimed
            curve is refuted with probability at most 1 - confidence.
        noise_scale_upper_bound: see :func:`noise_scale_upper_bound` (None: nothing refuted
            up to :data:`SCALE_RANGE`'s top).
    """

    claim_p_value: float
    claim_refuted: bool
    noise_scale_upper_bound: float | None
    confidence: float


def curve_test(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    confidence: float = 0.95,
) -> CurveTest:
    """Test the claim that the run is T steps of the (sigma, q) subsampled Gaussian.

    Args:
        scores: one score per canary ``[m]`` (higher: more likely in).
        included: the canaries' true inclusion bits ``[m]``.
        noise_multiplier: the planned sigma.
        sample_rate: the planned q.
        steps: the releases the adversary saw (a pack's K T).
        confidence: 1 - the test's level.
    """
    level = level_of(confidence) * len(GUESS_PAIRS)  # 1 - confidence, checked
    counts = correct_counts(np.asarray(scores, np.float64), included)
    m = int(np.asarray(included).shape[0])

    def p_at(scale: float) -> float:
        curve = claimed_curve(
            noise_multiplier=noise_multiplier * scale, sample_rate=sample_rate, steps=steps
        )
        return float(p_values(counts, curve, m=m, level=level))

    p = p_at(1.0)
    bound = noise_scale_upper_bound(p_at, refuted_at_one=p <= level, level=level)
    return CurveTest(float(p), bool(p <= level), bound, confidence)


def noise_scale_upper_bound(
    p_at: Callable[[float], float], *, refuted_at_one: bool, level: float, iterations: int = 12
) -> float | None:
    """The smallest noise scale factor s the test refutes: an upper confidence bound.

    For a factor s the claim under test is "the run satisfies the curve of the subsampled
    Gaussian of multiplier sigma * s (same q and T)"; more noise is a more private curve, so
    the refuted factors are those above some s*. The returned s (bisected on log s, the
    refuted end) is such that, if the run satisfies the curve of sigma * s_true, then
    P[s <= s_true] <= 1 - confidence: **the noise acts as at most s times its planned scale**
    (at the test's confidence; a fault that is not a noise scale shows as one that is).
    Below 1 exactly when the planned claim is refuted. None where even
    :data:`SCALE_RANGE`'s top is not refuted (the audit saw too little to bound the noise).
    """
    lo_s, hi_s = SCALE_RANGE
    if refuted_at_one:
        if p_at(lo_s) <= level:
            return lo_s
        lo, hi = math.log(lo_s), 0.0
    else:
        if p_at(hi_s) > level:
            return None
        lo, hi = 0.0, math.log(hi_s)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if p_at(math.exp(mid)) <= level:
            hi = mid
        else:
            lo = mid
    return math.exp(hi)
