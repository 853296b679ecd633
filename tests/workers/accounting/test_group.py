"""The epsilon per person of example-level DP-SGD (workers.accounting.group).

A person with one row is a row: the mixture accountant must give the subsampled Gaussian's
epsilon. More rows cost more, never less, and never more than group privacy's classic bound
(k rows: k * epsilon at k * e^((k-1) epsilon) * delta). The faster mixture PLD is the
library's, bit for bit, and the log-space epsilon the library's wherever that one is finite.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as library
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsweep.errors import ConfigError
from workers.accounting import pld_epsilon
from workers.accounting.gaussian_pld import self_compose
from workers.accounting.group import (
    group_epsilon,
    mixture_pld,
    person_mixture,
    pld_epsilon_for_delta,
)

BASE = {"noise_multiplier": 1.2, "sample_rate": 0.02, "steps": 80, "rows": 3, "delta": 1e-5}


def _pmf_state(pmf: object) -> tuple[object, ...]:
    """A PMF's masses whole (dense or sparse), for an exact comparison."""
    state = vars(pmf)
    probs = state.get("_probs")
    sparse = state.get("_loss_probs")
    return (
        type(pmf).__name__,
        state.get("_lower_loss"),
        None if probs is None else np.asarray(probs).tobytes(),
        None if sparse is None else sorted(sparse.items()),
        state["_infinity_mass"],
        state["_discretization"],
    )


@pytest.mark.parametrize(
    ("sigma", "q", "steps", "compositions"),
    [(1.0, 0.01, 3000, 1), (2.5, 0.1, 150, 4), (0.8, 0.004, 500, 9)],
)
def test_one_row_is_the_subsampled_gaussians_epsilon(
    sigma: float, q: float, steps: int, compositions: int
) -> None:
    person = group_epsilon(
        noise_multiplier=sigma,
        sample_rate=q,
        steps=steps,
        rows=1,
        delta=1e-5,
        compositions=compositions,
    )
    # The planner's compose figure: all K trials' T steps at one sigma and one q.
    row = pld_epsilon(
        noise_multiplier=sigma, sample_rate=q, steps=steps * compositions, target_delta=1e-5
    )
    assert person == pytest.approx(row, rel=1e-4)


def test_compositions_compose_the_trials_steps() -> None:
    grid = group_epsilon(**{**BASE, "steps": 20}, compositions=4)
    assert grid == pytest.approx(group_epsilon(**{**BASE, "steps": 80}), rel=1e-12)
    assert grid > group_epsilon(**{**BASE, "steps": 20})


def test_more_rows_cost_more() -> None:
    eps = [group_epsilon(**{**BASE, "rows": k}) for k in (1, 2, 3, 5, 13, 50)]
    assert all(a < b for a, b in itertools.pairwise(eps)), eps


@settings(max_examples=12, deadline=None)
@given(
    sigma=st.floats(min_value=1.0, max_value=3.0),
    q=st.floats(min_value=0.001, max_value=0.05),
    steps=st.integers(min_value=1, max_value=200),
    rows=st.integers(min_value=2, max_value=4),
)
def test_between_a_row_and_group_privacys_bound(
    sigma: float, q: float, steps: int, rows: int
) -> None:
    row_delta = 1e-7
    row = pld_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, target_delta=row_delta)
    common = {"noise_multiplier": sigma, "sample_rate": q, "steps": steps, "rows": rows}
    # More than one row: more than a row's epsilon at the same delta.
    assert group_epsilon(**common, delta=row_delta) > row
    # Group privacy: (eps, d)-DP rows give (k eps, k e^((k-1) eps) d) to k rows. Both figures
    # are pessimistic PLDs; 1 % allows for their grids.
    group_delta = rows * math.exp((rows - 1) * row) * row_delta
    if group_delta < 1:
        assert group_epsilon(**common, delta=group_delta) <= rows * row * 1.01 + 1e-3


@pytest.mark.parametrize(("sigma", "q", "rows"), [(2.0, 0.05, 3), (1.5, 0.2, 2), (4.0, 0.01, 6)])
def test_the_mixture_pld_is_the_librarys(sigma: float, q: float, rows: int) -> None:
    shifts, probabilities = person_mixture(rows=rows, sample_rate=q)
    fast = mixture_pld(
        noise_multiplier=sigma,
        sensitivities=shifts,
        probabilities=probabilities,
        value_discretization_interval=2e-3,
    )
    slow = library.from_mixture_gaussian_mechanism(
        sigma, shifts, probabilities, value_discretization_interval=2e-3
    )
    for a, b in ((fast._pmf_remove, slow._pmf_remove), (fast._pmf_add, slow._pmf_add)):
        assert _pmf_state(a) == _pmf_state(b)


def test_binomial_mixture_sums_to_one() -> None:
    shifts, probabilities = person_mixture(rows=50, sample_rate=0.03)
    assert shifts == [float(j) for j in range(51)]
    assert sum(probabilities) == pytest.approx(1.0)
    assert probabilities[1] == pytest.approx(50 * 0.03 * 0.97**49)


@pytest.mark.parametrize(("sigma", "q", "rows", "count"), [(1.1, 0.05, 3, 300), (2.0, 0.3, 1, 40)])
def test_log_space_epsilon_is_the_librarys_where_finite(
    sigma: float, q: float, rows: int, count: int
) -> None:
    shifts, probabilities = person_mixture(rows=rows, sample_rate=q)
    one = mixture_pld(
        noise_multiplier=sigma,
        sensitivities=shifts,
        probabilities=probabilities,
        value_discretization_interval=1e-3,
    )
    composed = self_compose(one, count)
    for delta in (1e-6, 1e-3):
        expected = composed.get_epsilon_for_delta(delta)
        assert pld_epsilon_for_delta(composed, delta) == pytest.approx(expected, rel=1e-9)


def test_an_epsilon_beyond_floats_exponent_is_finite() -> None:
    # Above ~709 the library's linear sums underflow and it answers inf; here it is a number.
    person = {"noise_multiplier": 1.0, "sample_rate": 0.01, "steps": 3000, "rows": 50}
    eps = group_epsilon(**person, delta=1e-5)
    assert 709 < eps < math.inf
    # A coarser grid over-states, a little.
    coarse = group_epsilon(**person, delta=1e-5, discretization=5e-2)
    assert eps <= coarse <= eps * 1.01


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("noise_multiplier", 0.0),
        ("noise_multiplier", -1.0),
        ("noise_multiplier", math.nan),
        ("sample_rate", 0.0),
        ("sample_rate", 1.5),
        ("sample_rate", "0.1"),
        ("steps", 0),
        ("steps", 2.5),
        ("rows", 0),
        ("rows", 1025),
        ("rows", True),
        ("delta", 0.0),
        ("delta", 1.0),
        ("compositions", 0),
        ("compositions", 1.5),
        ("discretization", 0.0),
        ("discretization", 2.0),
    ],
)
def test_invalid_inputs_name_their_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        group_epsilon(**{**BASE, field: value})  # type: ignore[arg-type]
    assert err.value.field == field
