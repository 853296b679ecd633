"""The one-run bound's ceiling: ideal scores of the claimed mechanism through the audit's bound."""

from __future__ import annotations

import numpy as np
import pytest

from dpsweep.accounting_inputs import AccountingInputs
from workers.canary_audit.bounds import one_run_bound
from workers.canary_audit.ceiling import ideal_scores, one_run_ceiling


def test_full_batch_scores_separate_by_steps_over_sigma_squared() -> None:
    """At q = 1 the summed log-likelihood ratio of an "in" canary exceeds an "out" one's by
    T / sigma^2 on average (each step's ratio is linear in a Gaussian shifted by 1 / sigma)."""
    rng = np.random.default_rng(0)
    included = np.arange(200_000) % 2 == 0
    scores = ideal_scores(
        included=included, noise_multiplier=2.0, sample_rate=1.0, steps=10, rng=rng
    )
    gap = scores[included].mean() - scores[~included].mean()
    assert gap == pytest.approx(10 / 4.0, rel=0.02)
    # And "out" scores are the ratio's mean under "out": -T / (2 sigma^2).
    assert scores[~included].mean() == pytest.approx(-10 / 8.0, rel=0.03)


def test_subsampled_scores_are_the_mixture_ratio() -> None:
    """At q < 1 an "out" canary's per-step ratio log(1 - q + q e^x) has mean log E[...] <= 0
    (Jensen: E_out[ratio] = 1), and an "in" canary scores higher."""
    rng = np.random.default_rng(1)
    included = np.arange(100_000) % 2 == 0
    scores = ideal_scores(
        included=included, noise_multiplier=0.8, sample_rate=0.05, steps=50, rng=rng
    )
    assert scores[~included].mean() < 0
    assert scores[included].mean() > 0
    # The ratio's exponential has mean 1 under "out": the test of its definition.
    one_step = ideal_scores(
        included=included, noise_multiplier=0.8, sample_rate=0.05, steps=1, rng=rng
    )
    assert np.exp(one_step[~included]).mean() == pytest.approx(1.0, abs=0.01)


def test_ceiling_is_the_reported_bound_on_ideal_scores() -> None:
    """Same seed, same draws: the ceiling is exactly the audit's bound on those scores."""
    claim = AccountingInputs(noise_multiplier=1.0, sample_rate=1.0, steps=10, delta=1e-5)
    ceiling = one_run_ceiling(claim, canaries=1000, draws=1, seed=7)
    rng = np.random.default_rng(7)
    included = rng.random(1000) < 0.5
    scores = ideal_scores(
        included=included, noise_multiplier=1.0, sample_rate=1.0, steps=10, rng=rng
    )
    bound = one_run_bound(scores, included, delta=1e-5).epsilon_lower_bound
    assert ceiling.median == ceiling.low == ceiling.high
    assert ceiling.median == pytest.approx(bound, abs=1e-9)  # continuous scores: no ties


def test_less_noise_raises_the_ceiling_and_it_stays_below_the_truth() -> None:
    """Halving the noise raises what the bound can show; an honest claim stays above it.

    At q = 1, T = 10 and sigma = 2 the mechanism is exactly Gaussian with mu = sqrt(10) / 2,
    whose epsilon at delta 1e-5 is about 8: the ceiling is well below it (the issue-49 finding
    that half the claim is out of the one-run bound's reach at m = 1000).
    """
    weak, strong = (
        one_run_ceiling(
            AccountingInputs(noise_multiplier=sigma, sample_rate=1.0, steps=10, delta=1e-5),
            canaries=1000,
            draws=5,
            seed=3,
        )
        for sigma in (2.0, 1.0)
    )
    assert strong.median > weak.median + 0.5
    assert 1.0 < weak.median < 0.5 * 8.0
    assert weak.low <= weak.median <= weak.high


@pytest.mark.parametrize(
    ("sigma", "q", "steps"), [(0.0, 1.0, 10), (1.0, 0.0, 10), (1.0, 1.5, 10), (1.0, 0.5, 0)]
)
def test_refuses_a_mechanism_that_is_not_one(sigma: float, q: float, steps: int) -> None:
    with pytest.raises(ValueError, match="noise_multiplier"):
        ideal_scores(
            included=np.ones(4, dtype=bool),
            noise_multiplier=sigma,
            sample_rate=q,
            steps=steps,
            rng=np.random.default_rng(),
        )


def test_auto_direction_is_dirac_where_every_canary_has_a_coordinate() -> None:
    from workers.canary_audit.canaries import resolve_direction

    assert resolve_direction("auto", m=1000, room=9738) == "dirac"
    assert resolve_direction("auto", m=9738, room=9738) == "dirac"
    assert resolve_direction("auto", m=9739, room=9738) == "random"
    assert resolve_direction("random", m=10, room=9738) == "random"
    assert resolve_direction("dirac", m=10, room=9738) == "dirac"
