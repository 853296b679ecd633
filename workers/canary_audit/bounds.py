"""A lower bound on epsilon from one training run's canary guesses (torch-free).

Steinke, Nasr & Jagielski (2023), "Privacy auditing with one (1) training run": m canaries are
each included independently with probability ½. The auditor ranks them by score and guesses
"in" for the top ``k_in``, "out" for the bottom ``k_out``, and abstains on the rest. If the
training run is (epsilon, delta)-DP, the number V of correct guesses among the r = k_in + k_out
made is nearly dominated by a Binomial(r, e^epsilon / (1 + e^epsilon)): for every v (their
Theorem 3.3 and Proposition 5.7),

    P[V >= v] <= P[Bin(r, p) >= v] + 2 m delta * max_{1<=i<=v} P[v-i <= Bin(r, p) < v] / i.

An epsilon under which the observed v would have probability at most 1 - confidence is
rejected; the lower bound is the largest rejected epsilon. The auditor tries a fixed set of
(k_in, k_out) pairs (:data:`GUESS_PAIRS`) and pays for the choice with a union bound: each
pair is tested at level (1 - confidence) / (number of pairs), so the reported bound holds at the
stated confidence whatever pair wins. The set is small on purpose: with delta > 0 each halving of
the level costs more of the bound than the extra pairs gain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

#: The (k_in, k_out) pairs tried, as fractions of m: "in" for the top scores, "out" for the
#: bottom ones. Fixed before any score is seen.
GUESS_PAIRS = (
    (0.01, 0.01),
    (0.025, 0.025),
    (0.05, 0.05),
    (0.1, 0.1),
    (0.25, 0.25),
    (0.5, 0.5),
    (0.05, 0.0),
    (0.1, 0.0),
    (0.25, 0.0),
)


@dataclass(frozen=True)
class OneRunBound:
    """The bound and the guesses behind it."""

    epsilon_lower_bound: float
    confidence: float
    guesses: int  # r
    correct: int  # v
    guessed_in: int
    guessed_out: int


def p_value(*, m: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """An upper bound on P[V >= correct] for an (epsilon, delta)-DP run (the module's formula)."""
    if not 0 <= correct <= guesses <= m:
        raise ValueError("need 0 <= correct <= guesses <= m")
    if correct == 0:
        return 1.0
    p = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(stats.binom.sf(correct - 1, guesses, p))
    if delta <= 0:
        return min(tail, 1.0)
    # max over i of P[v-i <= B < v] / i, from the pmf below v.
    pmf = stats.binom.pmf(np.arange(correct - 1, -1, -1), guesses, p)  # v-1, v-2, ..., 0
    ratios = np.cumsum(pmf) / np.arange(1, correct + 1)
    return min(tail + 2.0 * m * delta * float(ratios.max()), 1.0)


def epsilon_lower_bound(*, m: int, guesses: int, correct: int, delta: float, level: float) -> float:
    """The largest epsilon whose p-value for ``correct`` of ``guesses`` is at most ``level``."""
    if p_value(m=m, guesses=guesses, correct=correct, epsilon=0.0, delta=delta) > level:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m=m, guesses=guesses, correct=correct, epsilon=hi, delta=delta) <= level:
        lo, hi = hi, hi * 2.0
        if hi > 200:
            return lo
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if p_value(m=m, guesses=guesses, correct=correct, epsilon=mid, delta=delta) <= level:
            lo = mid
        else:
            hi = mid
    return lo


def one_run_bound(
    scores: np.ndarray, included: np.ndarray, *, delta: float, confidence: float = 0.95
) -> OneRunBound:
    """The epsilon lower bound at ``confidence`` from canary ``scores`` and their true bits."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    m = int(scores.shape[0])
    if included.shape != (m,) or m < 2:
        raise ValueError("one score and one inclusion bit per canary, at least 2 canaries")
    if not 0.5 < confidence < 1.0:
        raise ValueError("confidence must be in (0.5, 1)")
    # Ties broken at random (not by index, which could correlate with the bits).
    order = np.lexsort((np.random.default_rng().random(m), -scores))
    ranked = included[order]  # best "in" first
    pairs = [(max(1, round(fi * m)), round(fo * m)) for fi, fo in GUESS_PAIRS]
    pairs = [(k_in, min(k_out, m - k_in)) for k_in, k_out in pairs]
    level = (1.0 - confidence) / len(GUESS_PAIRS)
    best = OneRunBound(0.0, confidence, 0, 0, 0, 0)
    for k_in, k_out in pairs:
        correct = int(ranked[:k_in].sum()) + (int((~ranked[m - k_out :]).sum()) if k_out else 0)
        r = k_in + k_out
        eps = epsilon_lower_bound(m=m, guesses=r, correct=correct, delta=delta, level=level)
        if eps > best.epsilon_lower_bound:
            best = OneRunBound(eps, confidence, r, correct, k_in, k_out)
    return best


@dataclass(frozen=True)
class GaussianBound:
    """The Gaussian-DP bound and the separation behind it."""

    epsilon_lower_bound: float
    confidence: float
    mu_estimate: float
    mu_lower_bound: float


def gdp_epsilon(mu: float, *, delta: float) -> float:
    """The epsilon at ``delta`` of mu-Gaussian DP (Dong, Roth & Su 2019), 0 for ``mu <= 0``.

    ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``, decreasing in eps.
    """
    if not mu > 0:
        return 0.0

    def excess(eps: float) -> float:
        a = stats.norm.cdf(-eps / mu + mu / 2)
        b = math.exp(eps + stats.norm.logcdf(-eps / mu - mu / 2))
        return float(a - b - delta)

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    lo = 0.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
    return lo


def gaussian_bound(
    scores: np.ndarray, included: np.ndarray, *, delta: float, confidence: float = 0.95
) -> GaussianBound:
    """A lower bound on epsilon if the canaries' scores are Gaussian (Agrawal et al. 2026).

    White-box DP-SGD's canary-aligned signals are asymptotically Gaussian ("Let's ask Gauss"):
    the scores of included and excluded canaries are then two normal laws a separation ``mu``
    apart, and the run is at best mu-GDP. ``mu`` is the standardised difference of the two
    groups' means; its lower confidence bound (the normal approximation of its standard
    error) gives the epsilon at ``delta``. The bound assumes the Gaussian shape: a mechanism
    whose scores are far from it is bounded by :func:`one_run_bound`, which assumes nothing.
    """
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    s_in, s_out = scores[included], scores[~included]
    n_in, n_out = len(s_in), len(s_out)
    if n_in < 2 or n_out < 2:
        return GaussianBound(0.0, confidence, 0.0, 0.0)
    pooled = math.sqrt((s_in.var(ddof=1) + s_out.var(ddof=1)) / 2.0)
    if not pooled > 0:
        return GaussianBound(0.0, confidence, 0.0, 0.0)
    d = float((s_in.mean() - s_out.mean()) / pooled)
    se = math.sqrt((n_in + n_out) / (n_in * n_out) + d * d / (2.0 * (n_in + n_out)))
    mu_lb = d - float(stats.norm.ppf(confidence)) * se
    return GaussianBound(gdp_epsilon(mu_lb, delta=delta), confidence, d, mu_lb)
