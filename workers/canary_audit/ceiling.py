"""The most the one-run bound can show for a DP-SGD claim: its ceiling (torch-free).

A white-box audit of DP-SGD sees, for each canary and step, the noised release projected on
the canary's direction. In the ideal case (canaries that do not interfere with one another
or with the data, a model with room for all of them) that projection is exactly the
Poisson-subsampled Gaussian the accountant analyses: ``z_t ~ N(b_t / sigma, 1)`` with
``b_t ~ Bernoulli(q)`` if the canary is in and ``b_t = 0`` if it is out. The strongest score
is the sum over steps of the per-step log-likelihood ratio (what
:func:`workers.canary_audit.scores.white_box_scores` computes from a real run).

:func:`one_run_ceiling` draws such ideal scores for m canaries and feeds them through the very
bound the audit reports (:func:`workers.canary_audit.bounds.one_run_bound`). What comes out is
what the method can show at best for this claim and this m: a real audit's bound should sit a
little below it (canaries that overlap in a small model, the data's own gradients), and a
target above it cannot be met by any placement of the canaries or any choice of score. It is
the yardstick the audit benchmark prints beside each bound.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from dpsweep.accounting_inputs import AccountingInputs
from workers.canary_audit.bounds import one_run_bound

#: Steps simulated at once (bounds the memory of one draw to ``STEP_CHUNK * m`` doubles).
STEP_CHUNK = 16


@dataclass(frozen=True)
class Ceiling:
    """The one-run bound on ideal scores: median and range over ``draws`` simulated audits."""

    canaries: int
    draws: int
    median: float
    low: float
    high: float


def ideal_scores(
    *,
    included: np.ndarray,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Ideal white-box scores ``[m]``: the summed per-step log-likelihood ratio of "in".

    Args:
        included: the canaries' inclusion bits ``[m]``.
        noise_multiplier: sigma, the noise's standard deviation over the clipping norm.
        sample_rate: q, the chance that an included canary is in a step's batch.
        steps: T, the number of noised releases.
        rng: the draw's generator (a simulation: no privacy rests on it).
    """
    if noise_multiplier <= 0 or not 0 < sample_rate <= 1 or steps < 1:
        raise ValueError("need noise_multiplier > 0, 0 < sample_rate <= 1 and steps >= 1")
    bits = np.asarray(included, dtype=bool)
    shift = 1.0 / noise_multiplier  # a clipped contribution in units of the noise
    total = np.zeros(bits.shape[0], dtype=np.float64)
    for start in range(0, steps, STEP_CHUNK):
        chunk = min(STEP_CHUNK, steps - start)
        sampled = bits & (rng.random((chunk, bits.shape[0])) < sample_rate)
        z = rng.standard_normal((chunk, bits.shape[0])) + shift * sampled
        log_ratio = shift * z - 0.5 * shift * shift
        if sample_rate < 1.0:
            # log(1 - q + q e^x), stable for large x.
            log_ratio = np.logaddexp(math.log1p(-sample_rate), math.log(sample_rate) + log_ratio)
        total += log_ratio.sum(axis=0)
    return total


def one_run_ceiling(
    claim: AccountingInputs,
    *,
    canaries: int,
    confidence: float = 0.95,
    draws: int = 5,
    seed: int | None = None,
) -> Ceiling:
    """The one-run bound at ``confidence`` on ideal scores of the claimed mechanism.

    Args:
        claim: the claimed mechanism: its sigma, q and T, and the delta the bound is stated at
            (its evaluations and accountant are not simulated).
        canaries: m, the number of canaries (each included with probability 1/2).
        confidence: the bound's confidence.
        draws: simulated audits; the median and range are reported.
        seed: the simulation's seed (``None``: fresh; nothing private is involved).
    """
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(draws):
        included = rng.random(canaries) < 0.5
        scores = ideal_scores(
            included=included,
            noise_multiplier=claim.sigma,
            sample_rate=claim.sample_rate,
            steps=claim.steps,
            rng=rng,
        )
        bound = one_run_bound(scores, included, delta=claim.delta, confidence=confidence)
        found.append(bound.epsilon_lower_bound)
    return Ceiling(canaries, draws, statistics.median(found), min(found), max(found))
