"""The vectorised Gaussian PLD (workers.accounting.gaussian_pld) is dp_accounting's, bit for bit.

Every comparison here is exact (``==`` on floats and on whole probability arrays): the faster
construction may not move any figure dpsweep plans, charges or verifies with.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as library
from dp_accounting.pld import privacy_loss_mechanism as plm
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.accounting import pld_epsilon
from workers.accounting.gaussian_pld import (
    SelfPowers,
    _vector_gaussian,
    composed_pld,
    gaussian_pld,
    self_compose,
)

SIGMAS = st.floats(min_value=0.4, max_value=40.0)
RATES = st.one_of(st.floats(min_value=1e-5, max_value=0.999), st.just(1.0), st.just(0.5))
GRIDS = st.sampled_from([1e-4, 2.5e-4, 1e-3])


def _pmf_state(pmf: object) -> tuple[object, ...]:
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


def _same_pld(a: object, b: object) -> None:
    assert _pmf_state(a._pmf_remove) == _pmf_state(b._pmf_remove)  # type: ignore[attr-defined]
    assert _pmf_state(a._pmf_add) == _pmf_state(b._pmf_add)  # type: ignore[attr-defined]


@settings(max_examples=25, deadline=None)
@given(sigma=SIGMAS, q=RATES, grid=GRIDS)
def test_one_gaussian_pld_has_the_librarys_masses(sigma: float, q: float, grid: float) -> None:
    fast = gaussian_pld(noise_multiplier=sigma, sample_rate=q, value_discretization_interval=grid)
    slow = library.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=grid, use_connect_dots=True
    )
    _same_pld(fast, slow)
    for delta in (1e-5, 1e-8):
        assert fast.get_epsilon_for_delta(delta) == slow.get_epsilon_for_delta(delta)


def _accountant_epsilon(
    sigma: float, q: float, steps: int, delta: float, eval_sigma: float | None
) -> float:
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=2.5e-4)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    if eval_sigma is not None:
        acc.compose(dp_event.GaussianDpEvent(eval_sigma))
    return float(acc.get_epsilon(delta))


@settings(max_examples=15, deadline=None)
@given(
    sigma=st.floats(min_value=0.5, max_value=8.0),
    q=st.floats(min_value=1e-4, max_value=0.2),
    steps=st.integers(min_value=1, max_value=3000),
    delta=st.sampled_from([1e-5, 1e-6, 1e-9]),
    releases=st.integers(min_value=0, max_value=20),
)
def test_pld_epsilon_equals_the_librarys_accountant(
    sigma: float, q: float, steps: int, delta: float, releases: int
) -> None:
    eval_sigma = None if releases == 0 else 30.0 / math.sqrt(releases)
    ours = pld_epsilon(
        noise_multiplier=sigma,
        sample_rate=q,
        steps=steps,
        target_delta=delta,
        eval_noise_multiplier=None if releases == 0 else 30.0,
        eval_releases=releases,
    )
    assert ours == _accountant_epsilon(sigma, q, steps, delta, eval_sigma)


def test_a_mechanism_without_noise_has_infinite_epsilon_like_the_accountant() -> None:
    assert composed_pld([(0.0, 0.01, 10)], value_discretization_interval=1e-3) is None
    eps = pld_epsilon(noise_multiplier=0.0, sample_rate=0.01, steps=10, target_delta=1e-5)
    assert eps == math.inf == _accountant_epsilon(0.0, 0.01, 10, 1e-5, None)


def test_a_zero_rate_composes_to_the_identity_and_a_zero_count_is_refused() -> None:
    """As PLDAccountant: q = 0 adds nothing; a count below 1 raises rather than count as 0."""
    for mechanisms in ([], [(1.0, 0.0, 50)]):
        total = composed_pld(mechanisms, value_discretization_interval=1e-3)
        assert total is not None and total.get_epsilon_for_delta(1e-5) == 0.0
    for count in (0, -1):
        with pytest.raises(ValueError):
            composed_pld([(1.0, 0.01, count)], value_discretization_interval=1e-3)
        with pytest.raises(ValueError):
            pld_privacy_accountant.PLDAccountant().compose(
                dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0)), count
            )


@pytest.mark.parametrize("q", [1e-4, 0.01, 0.3, 0.9])
@pytest.mark.parametrize("adjacency", [plm.AdjacencyType.ADD, plm.AdjacencyType.REMOVE])
def test_the_inverse_matches_the_scalar_code_at_its_edges(
    q: float, adjacency: plm.AdjacencyType
) -> None:
    """At zero, at the subsampling edge +-log(1-q) and next to it, and refusing beyond it."""
    slow = plm.GaussianPrivacyLoss(1.3, sampling_prob=q, adjacency_type=adjacency)
    fast = _vector_gaussian()(1.3, sampling_prob=q, adjacency_type=adjacency)
    edge = -math.log(1 - q) if adjacency == plm.AdjacencyType.ADD else math.log(1 - q)
    inner = -1.0 if adjacency == plm.AdjacencyType.ADD else 1.0  # towards the valid side
    points = [0.0, -0.0, edge, edge * (1 + 5e-10), math.nextafter(edge, inner * math.inf)]
    points += [edge + inner * k * 1e-3 for k in (1, 7, 100)]
    if adjacency == plm.AdjacencyType.ADD:
        points += [-math.inf]
    else:
        points += [math.inf]
    points = [p for p in points if _scalar_ok(slow, p)]
    expected = np.array([slow.inverse_privacy_loss(p) for p in points])
    got = fast._inverse_privacy_losses(np.array(points))
    np.testing.assert_array_equal(got, expected)
    beyond = edge - inner * 0.01
    with pytest.raises(ValueError):
        slow.inverse_privacy_loss(beyond)
    with pytest.raises(ValueError):
        fast._inverse_privacy_losses(np.array([0.0, beyond]))


def _scalar_ok(loss: plm.GaussianPrivacyLoss, point: float) -> bool:
    try:
        loss.inverse_privacy_loss(point)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("adjacency", [plm.AdjacencyType.ADD, plm.AdjacencyType.REMOVE])
def test_deltas_for_scalars_and_arrays_match_the_library(adjacency: plm.AdjacencyType) -> None:
    slow = plm.GaussianPrivacyLoss(0.9, sampling_prob=0.02, adjacency_type=adjacency)
    fast = _vector_gaussian()(0.9, sampling_prob=0.02, adjacency_type=adjacency)
    eps = np.linspace(-0.5, 0.5, 2001)
    np.testing.assert_array_equal(fast.get_delta_for_epsilon(eps), slow.get_delta_for_epsilon(eps))
    for e in (0.0, 0.01, -0.01, 0.3, np.float32(0.01), np.float64(-0.01)):
        assert fast.get_delta_for_epsilon(e) == slow.get_delta_for_epsilon(e)
        assert type(fast.get_delta_for_epsilon(e)) is type(slow.get_delta_for_epsilon(e))


@settings(max_examples=20, deadline=None)
@given(
    sigma=st.floats(min_value=0.5, max_value=60.0),
    q=st.floats(min_value=1e-4, max_value=0.5),
    count=st.one_of(
        st.integers(min_value=1, max_value=12), st.integers(min_value=13, max_value=3000)
    ),
)
def test_self_compose_is_the_librarys_without_its_big_power(
    sigma: float, q: float, count: int
) -> None:
    """Sparse PMFs (much noise) are made dense first exactly where the library would."""
    one = gaussian_pld(noise_multiplier=sigma, sample_rate=q, value_discretization_interval=2.5e-4)
    _same_pld(self_compose(one, count), one.self_compose(count))


def test_self_compose_of_a_large_count_is_fast_and_the_same() -> None:
    """The 10,000-trial bench's grid: 900,000 steps at sigma 25.5 (issue 41)."""
    one = gaussian_pld(
        noise_multiplier=25.5, sample_rate=0.0445, value_discretization_interval=2.5e-4
    )
    assert type(one._pmf_remove).__name__ == "SparsePLDPmf"  # the case the helper is for
    _same_pld(self_compose(one, 900_000), one.self_compose(900_000))


@settings(max_examples=8, deadline=None)
@given(
    sigma=st.floats(min_value=0.8, max_value=30.0),
    q=st.floats(min_value=1e-3, max_value=0.2),
    steps=st.integers(min_value=1, max_value=100),
    eval_sigma=st.one_of(st.none(), st.floats(min_value=2.0, max_value=50.0)),
    counts=st.lists(st.integers(min_value=1, max_value=1000), min_size=1, max_size=3),
)
def test_self_powers_are_the_librarys_self_compositions(
    sigma: float, q: float, steps: int, eval_sigma: float | None, counts: list[int]
) -> None:
    """A charge schedule's powers of one run's PLD: the library's, bit for bit."""
    mechanisms: list[tuple[float, float | None, int]] = [(sigma, q, steps)]
    if eval_sigma is not None:
        mechanisms.append((eval_sigma, None, 3))
    one = composed_pld(mechanisms, value_discretization_interval=2.5e-4)
    power = SelfPowers(one)
    for count in [*sorted(counts), counts[0]]:  # the moments reused, in any order
        _same_pld(power(count), one.self_compose(count))
