"""The maths of the audit's lower bound (torch-free): one-run (Steinke, Nasr & Jagielski 2023),
on simulated mechanisms whose epsilon is known. The thousands-of-runs soundness tests are in
``test_soundness.py``; the Gaussian estimate and its check in ``test_estimate.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from workers.canary_audit.bounds import (
    correct_counts,
    epsilon_lower_bound,
    guess_pairs,
    one_run_bound,
    p_value,
)
from workers.canary_audit.estimate import gdp_epsilon


@settings(max_examples=60, deadline=None)
@given(
    r=st.integers(1, 400),
    frac=st.floats(0.0, 1.0),
    eps=st.floats(0.0, 6.0),
    delta=st.sampled_from([0.0, 1e-6, 1e-5]),
)
def test_p_value_is_a_probability_and_grows_with_epsilon(
    r: int, frac: float, eps: float, delta: float
) -> None:
    v = round(frac * r)
    lo = p_value(m=1000, guesses=r, correct=v, epsilon=eps, delta=delta)
    hi = p_value(m=1000, guesses=r, correct=v, epsilon=eps + 0.5, delta=delta)
    assert 0.0 <= lo <= hi <= 1.0


def test_p_value_without_delta_is_the_binomial_tail() -> None:
    p = 1 / (1 + math.exp(-1.0))
    assert p_value(m=100, guesses=50, correct=40, epsilon=1.0, delta=0.0) == pytest.approx(
        stats.binom.sf(39, 50, p)
    )


@settings(max_examples=40, deadline=None)
@given(r=st.integers(1, 300), level=st.sampled_from([0.05, 0.01, 0.001]))
def test_the_bound_is_the_largest_rejected_epsilon(r: int, level: float) -> None:
    v = r  # all correct: the strongest evidence r guesses can give
    eps = epsilon_lower_bound(m=1000, guesses=r, correct=v, delta=1e-5, level=level)
    if eps > 0:  # 0: not even epsilon = 0 is rejected (too few guesses)
        assert p_value(m=1000, guesses=r, correct=v, epsilon=eps, delta=1e-5) <= level + 1e-12
        assert p_value(m=1000, guesses=r, correct=v, epsilon=eps + 1e-3, delta=1e-5) > level
    # Without delta and all correct, it has a closed form: p^r = level.
    closed = epsilon_lower_bound(m=1000, guesses=r, correct=v, delta=0.0, level=level)
    p = level ** (1 / r)
    assert closed == pytest.approx(max(0.0, math.log(p / (1 - p))), abs=1e-6)


def _randomized_response(m: int, epsilon: float, rng: np.random.Generator) -> tuple:
    """The worst case for the one-run bound: each canary's bit is released by epsilon-RR."""
    bits = rng.random(m) < 0.5
    keep = rng.random(m) < math.exp(epsilon) / (1 + math.exp(epsilon))
    return np.where(keep, bits, ~bits).astype(float) + 1e-3 * rng.random(m), bits


def test_one_run_bound_is_sound_and_close_on_randomized_response() -> None:
    rng = np.random.default_rng(7)
    for epsilon in (0.5, 1.0, 2.0):
        bounds = [
            one_run_bound(*_randomized_response(2000, epsilon, rng), delta=0.0).epsilon_lower_bound
            for _ in range(20)
        ]
        # A 95 % lower bound: above the truth about 5 % of the time at most.
        assert sum(b > epsilon for b in bounds) <= 3
        assert np.median(bounds) > 0.5 * epsilon


def test_gdp_epsilon_matches_the_tradeoff_formula() -> None:
    for mu in (0.3, 1.0, 2.5):
        eps = gdp_epsilon(mu, delta=1e-5)
        delta = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(
            -eps / mu - mu / 2
        )
        assert delta == pytest.approx(1e-5, rel=1e-4)
    assert gdp_epsilon(0.0, delta=1e-5) == 0.0
    assert gdp_epsilon(1.0, delta=1e-5) < gdp_epsilon(1.1, delta=1e-5)


def test_no_signal_gives_no_bound() -> None:
    rng = np.random.default_rng(3)
    bits = rng.random(1000) < 0.5
    scores = rng.standard_normal(1000)
    assert one_run_bound(scores, bits, delta=1e-5).epsilon_lower_bound < 0.5


@settings(max_examples=30, deadline=None)
@given(m=st.integers(2, 300), seed=st.integers(0, 2**32 - 1))
def test_correct_counts_are_the_guesses_made_one_run_at_a_time(m: int, seed: int) -> None:
    """The vectorised count (many runs at once) is the count of each run on its own."""
    rng = np.random.default_rng(seed)
    bits = rng.random((3, m)) < 0.5
    scores = rng.standard_normal((3, m)) + bits
    counts = correct_counts(scores, bits)
    for run in range(3):
        order = np.argsort(-scores[run])
        ranked = bits[run][order]
        for j, (k_in, k_out) in enumerate(guess_pairs(m)):
            correct = int(ranked[:k_in].sum()) + int((~ranked[m - k_out :]).sum() if k_out else 0)
            assert counts[run, j] == correct
