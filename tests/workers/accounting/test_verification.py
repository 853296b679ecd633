"""The second, independent accountant: plan verification, independent RDP, sweep epsilon."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import gammaln, logsumexp

from dpsweep.errors import PrivacyError
from dpsweep.plan import GridPlan
from sweeper.privacy.grids import GridRequest
from sweeper.privacy.papernot_steinke import repeat_and_select_epsilon
from sweeper.privacy.planner import plan_grid
from sweeper.privacy.verification import verify_plan
from workers.accounting import audit, pld_epsilon
from workers.accounting.audit import sweep as audit_sweep

REF_Q = 256 / 60000
REF_STEPS = int(60 / REF_Q)


def req(**kw: Any) -> GridRequest:
    base: dict[str, Any] = dict(
        arm="fixed",
        strategy="fixed",
        epsilon_budget=3.0,
        delta=1e-5,
        trials=25,
        steps_per_trial=100,
        sample_rate=0.05,
        max_noise_multiplier=1000.0,
    )
    base.update(kw)
    return GridRequest(**base)


def exact_integer_rdp(*, noise_multiplier: float, sample_rate: float, order: int) -> float:
    """The binomial expansion of the Rényi moment at an integer order (Mironov et al. 2019)."""
    k = np.arange(order + 1)
    log_terms = (
        gammaln(order + 1)
        - gammaln(k + 1)
        - gammaln(order - k + 1)
        + k * math.log(sample_rate)
        + (order - k) * math.log1p(-sample_rate)
        + (k * k - k) / (2 * noise_multiplier**2)
    )
    return float(logsumexp(log_terms)) / (order - 1)


def dp_rdp_curve(*, noise_multiplier: float, sample_rate: float, steps: int) -> np.ndarray:
    """dp_accounting's RDP of the same mechanism on our orders (only to compare)."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant(orders=list(audit.RDP_ORDERS))
    acc.compose(
        dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier)),
        steps,
    )
    return np.asarray(acc._rdp)


# -------------------------------------------------------------------------------------------
# verify_plan


@pytest.fixture(scope="module")
def compose_plan() -> GridPlan:
    return plan_grid(req())


def test_plans_carry_the_second_accountants_figures(compose_plan: GridPlan) -> None:
    p = compose_plan
    assert p.verifier.startswith("prv-accountant 0.2.0") and "Gopi" in p.verifier
    assert "PRV" in p.verified_by
    assert p.epsilon_verified_lower is not None and p.epsilon_verified_upper is not None
    assert p.epsilon_verified_lower <= p.epsilon_verified <= p.epsilon_verified_upper
    # The planner's pessimistic PLD is an upper bound: never below the PRV's lower bound,
    # and here within a fraction of a percent of the PRV's estimate.
    assert p.epsilon_verified_lower <= p.epsilon_total <= p.epsilon_budget
    assert p.epsilon_total == pytest.approx(p.epsilon_verified, rel=0.005)
    assert verify_plan(p) == p  # idempotent: the plan's own fields say it all


@pytest.mark.parametrize("factor", [0.8, 0.9, 1.1, 1.25])
def test_a_wrong_noise_multiplier_is_refused(compose_plan: GridPlan, factor: float) -> None:
    bad = dataclasses.replace(compose_plan, noise_multiplier=compose_plan.noise_multiplier * factor)
    side = "under-states" if factor < 1 else "exceeds the verifier's upper bound"
    with pytest.raises(PrivacyError, match=side) as exc:
        verify_plan(bad)
    msg = str(exc.value)
    # The message names the arm, both figures and both accountants with the error bars.
    assert "'fixed'" in msg and "dp_accounting PLD" in msg and "prv-accountant 0.2.0" in msg
    assert f"{compose_plan.epsilon_total:.4f}" in msg and "bounds" in msg


def test_basic_and_random_search_plans_pass_and_catch_less_noise() -> None:
    basic = plan_grid(req(accounting="basic", trials=10))
    assert "per trial, times K" in basic.verified_by
    assert basic.epsilon_verified_lower is not None
    assert basic.epsilon_verified_lower <= basic.epsilon_total <= 3.0
    for shape in (0.0, 1.0, math.inf):
        ps = plan_grid(req(accounting="papernot-steinke", distribution_shape=shape, trials=10))
        assert ps.verifier == audit.RDP_SOURCE and ps.distribution_shape == shape
        # Ours optimises over a superset of dp_accounting's orders: never higher.
        assert ps.epsilon_verified <= ps.epsilon_total * (1 + 1e-9)
        assert ps.epsilon_verified >= ps.epsilon_total * (1 - audit.RDP_AGREEMENT)
        with pytest.raises(PrivacyError, match="under-states"):
            verify_plan(dataclasses.replace(ps, noise_multiplier=ps.noise_multiplier * 0.8))
    with pytest.raises(PrivacyError, match="under-states"):
        verify_plan(dataclasses.replace(basic, noise_multiplier=basic.noise_multiplier * 0.8))
    with pytest.raises(PrivacyError, match="upper bound"):
        verify_plan(dataclasses.replace(basic, noise_multiplier=basic.noise_multiplier * 1.25))


def test_rdp_calibrated_plans_are_checked_on_the_lower_side_only() -> None:
    p = plan_grid(req(accountant="rdp"))
    assert p.epsilon_verified_upper is not None
    # RDP is loose: well above the PRV's upper bound, and still accepted.
    assert p.epsilon_total > p.epsilon_verified_upper
    with pytest.raises(PrivacyError, match="under-states"):
        verify_plan(dataclasses.replace(p, noise_multiplier=p.noise_multiplier * 0.8))


def test_stored_plans_round_trip_through_json_and_verify() -> None:
    ps = plan_grid(req(accounting="papernot-steinke", distribution_shape=math.inf, trials=5))
    d = json.loads(json.dumps(ps.to_stored(), allow_nan=False))  # Poisson's shape is "inf"
    assert d["distribution_shape"] == "inf"
    again = verify_plan(GridPlan(**d))
    assert again.epsilon_verified == pytest.approx(ps.epsilon_verified)


def test_over_budget_and_unrecorded_plans_are_refused(compose_plan: GridPlan) -> None:
    with pytest.raises(PrivacyError, match="exceeds the budget"):
        verify_plan(dataclasses.replace(compose_plan, epsilon_budget=2.5))
    ps = plan_grid(req(accounting="papernot-steinke", distribution_shape=1.0, trials=5))
    with pytest.raises(PrivacyError, match="does not record its distribution"):
        verify_plan(dataclasses.replace(ps, distribution_shape=None))


# -------------------------------------------------------------------------------------------
# The PRV accountant


def test_prv_brackets_the_pld_where_prv_accountant_0_2_0_misplaces_its_mean() -> None:
    # q in (0.1, 0.2): the library alone reports 12.97-13.47 here; composing the privacy
    # loss exactly (rounded up and down on a 2.5e-4 grid) brackets the truth in 12.61-12.68.
    b = audit.prv_epsilon(
        noise_multiplier=1.172, sample_rate=0.1358, steps=276, target_delta=1e-5, eps_error=0.25
    )
    pld = pld_epsilon(noise_multiplier=1.172, sample_rate=0.1358, steps=276, target_delta=1e-5)
    assert b.lower <= 12.608 and b.upper >= 12.677
    assert b.estimate == pytest.approx(pld, rel=1e-3)


@settings(max_examples=6, deadline=None)
@given(size=st.integers(1, 400_000).map(lambda n: 2 * n), dt=st.floats(1e-5, 1e-2))
def test_the_prv_domain_only_widens_to_a_fast_fft_length(size: int, dt: float) -> None:
    """Issue 41: same mesh and nodes, whole cells added on each side, an even 5-smooth size."""
    from prv_accountant.domain import Domain

    from workers.accounting.audit.prv import _fast_domain

    def smooth(n: int) -> bool:  # no prime factor above 5
        for p in (2, 3, 5):
            while n % p == 0:
                n //= p
        return n == 1

    c = size // 2 - 1
    domain = Domain(-c * dt, (c + 1) * dt, size)  # create_aligned's form
    fast = _fast_domain(domain)
    assert len(fast) >= size and len(fast) % 2 == 0 and smooth(len(fast))
    extra = (len(fast) - size) // 2
    assert fast.dt() == pytest.approx(dt, rel=1e-9)
    assert fast.t_min() == pytest.approx(-(c + extra) * dt, rel=1e-9)
    assert fast.t_max() == pytest.approx((c + 1 + extra) * dt, rel=1e-9)


def test_the_prv_of_a_10_000_trial_grid_is_the_unwidened_domains() -> None:
    """The widened domain only truncates less: the bounds match the library's size's."""
    from workers.accounting.audit import prv

    mechanisms = ((25.5, 0.0445, 900_000),)
    fast = prv._prv_bounds(mechanisms, 1e-5, 0.16, 1e-8)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(prv, "_fast_domain", lambda domain: domain)
        plain = prv._prv_bounds(mechanisms, 1e-5, 0.16, 1e-8)
    assert fast == pytest.approx(plain, abs=1e-6)


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(
    sigma=st.floats(0.6, 8.0),
    q=st.floats(0.002, 0.3),
    steps=st.integers(10, 3000),
)
def test_prv_bounds_contain_a_fine_pld(sigma: float, q: float, steps: int) -> None:
    pld = pld_epsilon(
        noise_multiplier=sigma, sample_rate=q, steps=steps, target_delta=1e-5, discretization=5e-5
    )
    b = audit.prv_epsilon(
        noise_multiplier=sigma,
        sample_rate=q,
        steps=steps,
        target_delta=1e-5,
        eps_error=audit.prv_error(pld),
    )
    assert b.lower <= pld <= b.upper + audit.pld_overstatement(epsilon=b.upper, steps=steps)


# -------------------------------------------------------------------------------------------
# The independent RDP curve


@settings(max_examples=10, deadline=None)
@given(sigma=st.floats(0.4, 8.0), q=st.floats(1e-4, 0.9), order=st.integers(2, 128))
def test_rdp_curve_matches_the_exact_integer_order_formula(
    sigma: float, q: float, order: int
) -> None:
    (ours,) = audit.subsampled_gaussian_rdp(
        noise_multiplier=sigma, sample_rate=q, orders=(float(order),)
    )
    exact = exact_integer_rdp(noise_multiplier=sigma, sample_rate=q, order=order)
    assert ours == pytest.approx(exact, rel=1e-7)


@settings(max_examples=6, deadline=None)
@given(sigma=st.floats(0.5, 5.0), q=st.floats(0.001, 0.2), steps=st.integers(1, 2000))
def test_rdp_curve_agrees_with_dp_accounting(sigma: float, q: float, steps: int) -> None:
    ours = audit.subsampled_gaussian_rdp(noise_multiplier=sigma, sample_rate=q, steps=steps)
    theirs = dp_rdp_curve(noise_multiplier=sigma, sample_rate=q, steps=steps)
    orders = np.asarray(audit.RDP_ORDERS)
    integer = (orders == np.round(orders)) & np.isfinite(theirs)
    np.testing.assert_allclose(ours[integer], theirs[integer], rtol=1e-6)
    # At fractional orders dp_accounting's series may over-state (by up to ~20x near order 1
    # at large sigma, checked against 40-digit quadrature); it must never under-state.
    finite = np.isfinite(theirs)
    assert np.all(theirs[finite] >= ours[finite] * (1 - 1e-6))
    eps_ours = audit.rdp_to_epsilon(orders, ours, target_delta=1e-5)
    eps_theirs = pld_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, target_delta=1e-5)
    assert eps_ours >= eps_theirs * (1 - 0.01)  # RDP is an upper bound of the tight PLD


def test_q_one_is_the_plain_gaussian() -> None:
    sigma = 2.0
    ours = audit.subsampled_gaussian_rdp(noise_multiplier=sigma, sample_rate=1.0)
    orders = np.asarray(audit.RDP_ORDERS)
    np.testing.assert_allclose(ours, orders / (2 * sigma**2), rtol=1e-9)


# -------------------------------------------------------------------------------------------
# Papernot & Steinke


@pytest.mark.parametrize("shape", [0.0, 0.5, 1.0, 2.0, math.inf])
@pytest.mark.parametrize("mean", [1.0, 10.0, 100.0])
def test_papernot_steinke_bound_is_close_to_dp_accountings(shape: float, mean: float) -> None:
    kw: dict[str, Any] = dict(
        noise_multiplier=1.1,
        sample_rate=REF_Q,
        steps=REF_STEPS,
        mean_trials=mean,
        shape=shape,
        target_delta=1e-5,
    )
    ours = audit.papernot_steinke_epsilon(**kw)
    theirs = repeat_and_select_epsilon(**kw)
    assert theirs * (1 - audit.RDP_AGREEMENT) <= ours <= theirs * (1 + 1e-9)


def test_papernot_steinke_reference_value() -> None:
    # Papernot & Steinke's setting in test_planner: dp_accounting gives 4.29.
    eps = audit.papernot_steinke_epsilon(
        noise_multiplier=1.1,
        sample_rate=REF_Q,
        steps=REF_STEPS,
        mean_trials=10,
        shape=0.0,
        target_delta=1e-5,
    )
    assert eps == pytest.approx(4.29, abs=0.02)


@settings(max_examples=25, deadline=None)
@given(shape=st.sampled_from([0.0, 0.3, 1.0, 4.0]), mean=st.floats(1.01, 1e4))
def test_truncated_negative_binomial_gamma_inverts_the_mean(shape: float, mean: float) -> None:
    gamma = audit.truncated_negative_binomial_gamma(shape, mean)
    assert 0 < gamma < 1
    assert audit.truncated_negative_binomial_mean(gamma, shape) == pytest.approx(mean, rel=1e-9)
    # The conservative side: a smaller gamma, a mean at least as large.
    assert audit.truncated_negative_binomial_mean(gamma, shape) >= mean * (1 - 1e-12)


def test_one_trial_costs_one_run() -> None:
    orders = audit.RDP_ORDERS
    one = audit.subsampled_gaussian_rdp(noise_multiplier=1.0, sample_rate=0.05, steps=200)
    for shape in (0.0, 1.0, 2.5):
        out = audit.repeat_and_select_rdp(orders, one, mean_trials=1.0, shape=shape)
        np.testing.assert_allclose(out, np.minimum.accumulate(one[::-1])[::-1])


# -------------------------------------------------------------------------------------------
# A sweep's epsilon


def test_two_grids_on_one_dataset_compose_below_their_sum() -> None:
    a = plan_grid(req(arm="a", epsilon_budget=2.0, trials=10))
    b = plan_grid(req(arm="b", epsilon_budget=6.0, trials=10, sample_rate=0.02, delta=2e-6))
    s = audit.sweep_epsilon([a, b])
    assert s.method == "pld composition" and s.delta == pytest.approx(1.2e-5)
    assert s.epsilon == s.tight < a.epsilon_total + b.epsilon_total == pytest.approx(s.summed)
    # Releasing both costs more than either alone (at the same delta).
    alone = pld_epsilon(
        noise_multiplier=b.noise_multiplier, sample_rate=0.02, steps=1000, target_delta=s.delta
    )
    assert s.epsilon > alone
    # An independent heterogeneous composition: prv-accountant's own PRVAccountant.
    from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

    acc = PRVAccountant(
        prvs=[
            PoissonSubsampledGaussianMechanism(
                noise_multiplier=g.noise_multiplier, sampling_probability=g.sample_rate
            )
            for g in (a, b)
        ],
        max_self_compositions=[1000, 1000],
        eps_error=0.05,
        delta_error=1e-9,
    )
    lower, _, upper = acc.compute_epsilon(delta=1.2e-5, num_self_compositions=[1000, 1000])
    assert lower <= s.epsilon <= upper + audit.pld_overstatement(epsilon=upper, steps=2000)
    assert s.verifier.startswith("prv-accountant 0.2.0")
    assert s.verifier_bounds.lower <= s.epsilon <= s.verifier_bounds.upper * 1.01
    # Stored plans (JSON dicts) give the same answer.
    assert audit.sweep_epsilon([a.to_stored(), b.to_stored()]).epsilon == s.epsilon


def test_a_single_grid_sweep_costs_that_grid() -> None:
    a = plan_grid(req(trials=4))
    s = audit.sweep_epsilon([a])
    assert s.epsilon <= a.epsilon_total
    assert s.epsilon == pytest.approx(a.epsilon_total, rel=1e-6)


def test_random_search_and_compose_sweep_in_rdp() -> None:
    c = plan_grid(req(arm="c", epsilon_budget=2.0, trials=8))
    ps = plan_grid(req(arm="p", accounting="papernot-steinke", distribution_shape=1.0, trials=8))
    s = audit.sweep_epsilon([c.to_stored(), ps.to_stored()])
    assert s.method in ("rdp composition", "sum of grid epsilons")
    assert s.verifier == audit.RDP_SOURCE
    assert s.epsilon == min(s.tight, s.summed) <= c.epsilon_total + ps.epsilon_total
    assert s.tight >= s.verifier_bounds.lower
    # Composing in RDP is looser than PLD for the compose grid, yet together it beats adding.
    assert s.tight < s.summed


def test_sweep_disagreement_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    a = plan_grid(req(trials=4))
    real = audit_sweep._pld_sweep
    monkeypatch.setattr(audit_sweep, "_pld_sweep", lambda gs, d: real(gs, d) * 0.8)
    with pytest.raises(PrivacyError, match="disagree beyond their error bars"):
        audit.sweep_epsilon([a])
