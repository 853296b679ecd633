"""A lower bound on epsilon from one training run's canary guesses (torch-free).

Steinke, Nasr & Jagielski (2023), "Privacy auditing with one (1) training run" (NeurIPS 2023,
arXiv:2305.08846): m canaries are each included independently with probability ½. The auditor
ranks them by score and guesses "in" for the top ``k_in``, "out" for the bottom ``k_out``, and
abstains on the rest. If the training run is (epsilon, delta)-DP, the number V of correct
guesses among the r = k_in + k_out made is nearly dominated by a Binomial(r, e^epsilon /
(1 + e^epsilon)): for every v (their Theorem 3.3 and Proposition 5.7),

    P[V >= v] <= P[Bin(r, p) >= v] + 2 m delta * max_{1<=i<=v} P[v-i <= Bin(r, p) < v] / i.

The theorem assumes nothing about the scores or the mechanism beyond (epsilon, delta)-DP with
respect to each canary, so the bound holds for any mechanism: the Gaussian-shaped DP-SGD, a
randomized response, a Laplace mechanism or a bug. An epsilon under which the observed v
would have probability at most 1 - confidence is rejected; the lower bound is the largest
rejected epsilon. The auditor tries a fixed set of (k_in, k_out) pairs (:data:`GUESS_PAIRS`)
and pays for the choice with a union bound: each pair is tested at level
(1 - confidence) / (number of pairs), so the reported bound holds at the stated confidence
whatever pair wins. The set is small on purpose: with delta > 0 each halving of the level
costs more of the bound than the extra pairs gain.

:func:`correct_counts` and :func:`exceeds` are the same computation vectorised over many
simulated runs: the soundness tests feed thousands of runs of mechanisms of known epsilon
through them.
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=4096)
def epsilon_lower_bound(*, m: int, guesses: int, correct: int, delta: float, level: float) -> float:
    """The largest epsilon whose p-value for ``correct`` of ``guesses`` is at most ``level``.

    Cached: it depends on integers and two fixed numbers only, and repeated audits (and the
    soundness tests' thousands of runs) meet the same counts again and again.
    """
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


def guess_pairs(m: int) -> list[tuple[int, int]]:
    """:data:`GUESS_PAIRS` in counts for ``m`` canaries (at least one "in" guess each)."""
    pairs = [(max(1, round(fi * m)), round(fo * m)) for fi, fo in GUESS_PAIRS]
    return [(k_in, min(k_out, m - k_in)) for k_in, k_out in pairs]


def level_of(confidence: float) -> float:
    """The level each pair is tested at: the union bound over :data:`GUESS_PAIRS`."""
    if not 0.5 < confidence < 1.0:
        raise ValueError("confidence must be in (0.5, 1)")
    return (1.0 - confidence) / len(GUESS_PAIRS)


def correct_counts(
    scores: np.ndarray, included: np.ndarray, *, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Correct guesses of each pair of :func:`guess_pairs`, ``[..., pairs]``, for scores and
    inclusion bits ``[..., m]`` (any leading axes: one run, or thousands of simulated ones).

    Ties are broken at random, not by index, which could correlate with the bits.
    """
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim < 1 or scores.shape[-1] < 2:
        raise ValueError("one score and one inclusion bit per canary, at least 2 canaries")
    m = int(scores.shape[-1])
    rng = rng if rng is not None else np.random.default_rng()
    order = np.lexsort((rng.random(scores.shape), -scores), axis=-1)
    ranked = np.take_along_axis(included, order, axis=-1)  # best "in" first
    zero = np.zeros((*ranked.shape[:-1], 1), dtype=np.int64)
    ins_top = np.concatenate([zero, np.cumsum(ranked, axis=-1)], axis=-1)  # in among top k
    outs_bottom = np.concatenate([zero, np.cumsum(~ranked[..., ::-1], axis=-1)], axis=-1)
    return np.stack(
        [ins_top[..., k_in] + outs_bottom[..., k_out] for k_in, k_out in guess_pairs(m)],
        axis=-1,
    )


def one_run_bound(
    scores: np.ndarray, included: np.ndarray, *, delta: float, confidence: float = 0.95
) -> OneRunBound:
    """The epsilon lower bound at ``confidence`` from canary ``scores`` and their true bits."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1:
        raise ValueError("one score and one inclusion bit per canary, at least 2 canaries")
    level = level_of(confidence)
    m = int(scores.shape[0])
    counts = correct_counts(scores, included)
    best = OneRunBound(0.0, confidence, 0, 0, 0, 0)
    for (k_in, k_out), correct in zip(guess_pairs(m), counts.tolist(), strict=True):
        r = k_in + k_out
        eps = epsilon_lower_bound(m=m, guesses=r, correct=correct, delta=delta, level=level)
        if eps > best.epsilon_lower_bound:
            best = OneRunBound(eps, confidence, r, correct, k_in, k_out)
    return best


def exceeds(
    counts: np.ndarray, *, m: int, epsilon: float, delta: float, confidence: float = 0.95
) -> np.ndarray:
    """Whether :func:`one_run_bound` of each run would exceed ``epsilon``, from its
    :func:`correct_counts` ``[..., pairs]``; ``[...]`` bool.

    The p-value grows with epsilon, so the bound (the largest rejected epsilon) exceeds
    ``epsilon`` exactly when some pair's count already rejects ``epsilon`` itself: one p-value
    per distinct count instead of a search per run.
    """
    counts = np.asarray(counts)
    level = level_of(confidence)
    out = np.zeros(counts.shape[:-1], dtype=bool)
    for j, (k_in, k_out) in enumerate(guess_pairs(m)):
        column = counts[..., j]
        values, inverse = np.unique(column, return_inverse=True)
        rejected = np.array(
            [
                p_value(m=m, guesses=k_in + k_out, correct=int(v), epsilon=epsilon, delta=delta)
                <= level
                for v in values
            ]
        )
        out |= rejected[inverse.reshape(column.shape)]
    return out
