"""DP evaluation's privacy accounting (``eval: {mode: dp}``): each trial's E noisy counts are
charged in the plan (calibration, figures, verification), the sweep's composition and a
single run's epsilon.

The evaluations' own cost is checked against the closed form of the Gaussian mechanism
(Balle & Wang 2018), written out here independently of the planner.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import norm

from dpsweep.errors import PrivacyError
from dpsweep.plan import GridPlan, SweepPlan
from dpsweep.spec import SweepSpec
from sweeper.privacy.grids import GridRequest, InfeasiblePlan
from sweeper.privacy.planner import grid_requests, plan_grid
from sweeper.privacy.releases import sweep_release
from sweeper.privacy.verification import verify_plan
from workers.accounting import audit, compute_epsilon, dp_rdp_epsilon, pld_epsilon
from workers.schedule import eval_releases

DELTA = 1e-5
Q, T, K, E = 0.05, 60, 4, 6


def analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """epsilon(delta) of a Gaussian mechanism, mu = sensitivity/std (Balle & Wang, Thm 8)."""

    def excess(eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta

    if excess(0.0) <= 0:
        return 0.0
    return float(brentq(excess, 0.0, 200.0, xtol=1e-12))


def req(**kw: Any) -> GridRequest:
    base: dict[str, Any] = dict(
        arm="fixed",
        strategy="fixed",
        epsilon_budget=2.0,
        delta=DELTA,
        trials=K,
        steps_per_trial=T,
        sample_rate=Q,
        max_noise_multiplier=1000.0,
        # The figures below are for a 10 % share (the spec's default is larger).
        eval_epsilon_share=0.1,
    )
    base.update(kw)
    return GridRequest(**base)


@pytest.fixture(scope="module")
def compose_pair() -> tuple[GridPlan, GridPlan]:
    return plan_grid(req()), plan_grid(req(eval_releases=E))


def test_compose_charges_the_evaluations(compose_pair: tuple[GridPlan, GridPlan]) -> None:
    without, with_eval = compose_pair
    assert with_eval.eval_releases == E and without.eval_releases == 0
    assert without.eval_noise_multiplier is None and without.epsilon_eval is None
    # Training and evaluation together fit the budget, so training needs more noise.
    assert 0.99 * 2.0 <= with_eval.epsilon_total <= 2.0
    assert with_eval.noise_multiplier > without.noise_multiplier
    # The plan's figure is the composition of both: more than the steps alone at its sigma.
    steps_only = pld_epsilon(
        noise_multiplier=with_eval.noise_multiplier,
        sample_rate=Q,
        steps=K * T,
        target_delta=DELTA,
    )
    assert with_eval.epsilon_total > steps_only
    # The verifier (PRV, with the evaluations) agrees and fits the budget.
    assert with_eval.epsilon_verified_lower is not None
    assert with_eval.epsilon_verified_lower <= with_eval.epsilon_total <= 2.0
    # epsilon_per_trial covers one trial's steps and its E evaluations.
    one_trial: dict[str, Any] = dict(
        noise_multiplier=with_eval.noise_multiplier, sample_rate=Q, steps=T
    )
    assert with_eval.epsilon_per_trial > pld_epsilon(**one_trial, target_delta=DELTA)
    assert with_eval.epsilon_per_trial == pytest.approx(
        pld_epsilon(
            **one_trial,
            target_delta=DELTA,
            eval_noise_multiplier=with_eval.eval_noise_multiplier,
            eval_releases=E,
        ),
        rel=1e-9,
    )


def test_chosen_eval_noise_spends_the_share(compose_pair: tuple[GridPlan, GridPlan]) -> None:
    plan = compose_pair[1]
    sigma_e = plan.eval_noise_multiplier
    assert sigma_e is not None
    # All K*E releases alone, by the closed form: at most the 10 % share, and the smallest
    # such sigma_e (a slightly smaller one would exceed it).
    alone = analytic_gaussian_epsilon(math.sqrt(K * E) / sigma_e, DELTA)
    assert 0.1 * 2.0 * (1 - 1e-6) <= alone <= 0.1 * 2.0
    assert analytic_gaussian_epsilon(math.sqrt(K * E) / (sigma_e * 0.99), DELTA) > 0.2
    assert plan.epsilon_eval == pytest.approx(alone, rel=1e-9)


def test_a_given_eval_noise_is_kept_and_zero_releases_change_nothing(
    compose_pair: tuple[GridPlan, GridPlan],
) -> None:
    plan = plan_grid(req(eval_releases=E, eval_noise_multiplier=30.0))
    assert plan.eval_noise_multiplier == 30.0
    alone = analytic_gaussian_epsilon(math.sqrt(K * E) / 30.0, DELTA)
    assert plan.epsilon_eval == pytest.approx(alone, rel=1e-9)
    assert plan.epsilon_total <= 2.0
    # Without releases a noise multiplier is ignored: the plan is today's, to the bit.
    same = plan_grid(req(eval_noise_multiplier=30.0, eval_epsilon_share=0.5))
    without = compose_pair[0]
    assert same.noise_multiplier == without.noise_multiplier
    assert same.epsilon_total == without.epsilon_total
    assert same.eval_noise_multiplier is None and same.eval_releases == 0


def test_evaluations_alone_over_budget_are_infeasible() -> None:
    # 24 releases at sigma_e 2 cost epsilon ~ 13 alone: nothing is left for training.
    with pytest.raises(InfeasiblePlan, match=r"raise eval\.noise_multiplier \(e\.g\. to"):
        plan_grid(req(eval_releases=E, eval_noise_multiplier=2.0))


def test_prv_takes_an_unsubsampled_gaussian_exactly() -> None:
    for sigma_e, n in ((5.0, 10), (40.0, 24), (2.0, 1)):
        exact = analytic_gaussian_epsilon(math.sqrt(n) / sigma_e, DELTA)
        b = audit.prv_compose_epsilon([(sigma_e, 1.0, n)], target_delta=DELTA, eps_error=0.01)
        assert b.lower <= exact <= b.upper
        assert b.estimate == pytest.approx(exact, abs=1e-3)
        # n Gaussians compose to one of sigma_e / sqrt(n).
        one = audit.prv_compose_epsilon(
            [(sigma_e / math.sqrt(n), 1.0, 1)], target_delta=DELTA, eps_error=0.01
        )
        assert one.estimate == pytest.approx(exact, abs=1e-3)


@pytest.mark.parametrize(
    "kw",
    [
        {"accounting": "compose"},
        {"accounting": "basic"},
        {"accounting": "papernot-steinke", "distribution_shape": 1.0},
    ],
)
def test_verifier_refuses_a_halved_eval_noise(kw: dict[str, Any]) -> None:
    # With a large share, the evaluations weigh enough that halving sigma_e is not within
    # the accountants' error bars.
    plan = plan_grid(req(eval_releases=E, eval_epsilon_share=0.4, **kw))
    assert plan.epsilon_total <= 2.0
    assert plan.eval_noise_multiplier is not None
    verify_plan(plan)  # the plan as made verifies
    halved = replace(plan, eval_noise_multiplier=plan.eval_noise_multiplier / 2)
    with pytest.raises(PrivacyError, match="under-states its privacy cost"):
        verify_plan(halved)
    # Releases without a multiplier cannot be verified at all.
    with pytest.raises(PrivacyError, match="eval_noise_multiplier"):
        verify_plan(replace(plan, eval_noise_multiplier=None))


@pytest.mark.parametrize(
    "kw",
    [{"accounting": "basic"}, {"accounting": "papernot-steinke", "distribution_shape": 0.0}],
)
def test_basic_and_random_search_fit_with_evaluations(kw: dict[str, Any]) -> None:
    without = plan_grid(req(**kw))
    plan = plan_grid(req(eval_releases=E, **kw))
    assert plan.noise_multiplier >= without.noise_multiplier
    assert plan.epsilon_total <= 2.0
    assert plan.epsilon_verified_lower is not None and plan.epsilon_verified_lower <= 2.0
    assert plan.verified_by != "unverified"
    assert plan.epsilon_eval is not None and 0 < plan.epsilon_eval <= 0.1 * 2.0 * (1 + 1e-6)
    sigma_e = plan.eval_noise_multiplier
    assert sigma_e is not None
    if kw["accounting"] == "basic":
        assert K * plan.epsilon_per_trial <= 2.0 * (1 + 1e-9)
        # Each trial's E releases at delta/K cost at most share * epsilon / K.
        alone = analytic_gaussian_epsilon(math.sqrt(E) / sigma_e, DELTA / K)
        assert alone <= 0.1 * 2.0 / K
    else:
        # A random search's evaluations cost more than one run's alone (repeat and select).
        one_run = analytic_gaussian_epsilon(math.sqrt(E) / sigma_e, DELTA)
        assert one_run < plan.epsilon_eval


def _strip(plan: GridPlan) -> GridPlan:
    return replace(plan, eval_releases=0, eval_noise_multiplier=None)


def test_sweep_composition_charges_the_evaluations() -> None:
    grids = [plan_grid(req(epsilon_budget=b, eval_releases=E)) for b in (1.0, 2.0)]
    sweep = audit.sweep_epsilon(grids)
    assert sweep.method == "pld composition"
    assert sweep.tight < sum(g.epsilon_total for g in grids)
    assert sweep.verifier_bounds.lower <= sweep.tight
    # The same grids without their evaluations compose to less.
    assert audit.sweep_epsilon([_strip(g) for g in grids]).tight < sweep.tight
    # Stored plans (JSON, read back typed) carry the fields through sweep_release.
    stored = SweepPlan.from_stored(json.loads(json.dumps(SweepPlan(grids).to_stored())))
    released = sweep_release(stored.grids)
    assert released is not None
    assert released["epsilon"] == pytest.approx(sweep.epsilon, rel=1e-12)
    stripped = sweep_release([_strip(g) for g in stored])
    assert stripped is not None and stripped["epsilon"] < released["epsilon"]


def test_sweep_composition_with_a_random_search_charges_the_evaluations() -> None:
    grids = [
        plan_grid(req(eval_releases=E)),
        plan_grid(req(eval_releases=E, accounting="papernot-steinke", distribution_shape=1.0)),
    ]
    sweep = audit.sweep_epsilon(grids)
    assert sweep.method in ("rdp composition", "sum of grid epsilons")
    stripped = audit.sweep_epsilon([_strip(g) for g in grids])
    assert stripped.tight < sweep.tight
    assert stripped.verifier_bounds.estimate < sweep.verifier_bounds.estimate


def test_old_stored_plans_still_load(compose_pair: tuple[GridPlan, GridPlan]) -> None:
    d = compose_pair[0].to_stored()
    for name in ("eval_mode", "eval_dataset", "eval_releases", "eval_noise_multiplier"):
        d.pop(name)
    d.pop("epsilon_eval")
    old = GridPlan(**d)
    assert old.eval_mode == "carve-out" and old.eval_releases == 0
    assert verify_plan(old).epsilon_total == compose_pair[0].epsilon_total


@pytest.mark.parametrize("accountant", ["rdp", "pld", "prv"])
def test_a_single_runs_epsilon_includes_its_evaluations(accountant: str) -> None:
    kw: dict[str, Any] = dict(
        noise_multiplier=1.5, sample_rate=Q, steps=T, target_delta=DELTA, accountant=accountant
    )
    alone = compute_epsilon(**kw)
    with_eval = compute_epsilon(**kw, eval_noise_multiplier=10.0, eval_releases=E)
    assert with_eval > alone
    assert compute_epsilon(**kw, eval_noise_multiplier=5.0, eval_releases=E) > with_eval
    with pytest.raises(PrivacyError):
        compute_epsilon(**kw, eval_noise_multiplier=None, eval_releases=E)


def test_the_extra_gaussian_is_e_releases_or_one_equivalent() -> None:
    kw: dict[str, Any] = dict(noise_multiplier=1.5, sample_rate=Q, steps=T, target_delta=DELTA)
    for fn in (pld_epsilon, dp_rdp_epsilon):
        many = fn(**kw, eval_noise_multiplier=12.0, eval_releases=9)
        one = fn(**kw, eval_noise_multiplier=4.0, eval_releases=1)
        assert many == pytest.approx(one, rel=1e-9)
        assert many > fn(**kw)


def test_grid_requests_charge_dp_evaluation() -> None:
    spec = SweepSpec.model_validate(
        {
            "name": "dp-eval",
            "dataset": {"name": "digits"},
            "model": {"name": "logreg"},
            "training": {"steps": 20, "batch_size": 64, "eval_every": 10},
            "privacy": {"budgets": [2, 6], "delta": 1e-5},
            "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
            "eval": {"mode": "dp", "epsilon_share": 0.2},
        }
    )
    reqs = grid_requests(spec, dataset_size=1797, n_train=1400)
    assert [r.eval_releases for r in reqs] == [eval_releases(steps=20, eval_every=10)] * 2
    assert all(r.eval_epsilon_share == 0.2 and r.eval_noise_multiplier is None for r in reqs)
    carve_out = SweepSpec.model_validate({**spec.model_dump(), "eval": {"mode": "carve-out"}})
    assert all(
        r.eval_releases == 0 for r in grid_requests(carve_out, dataset_size=1797, n_train=1400)
    )


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    k=st.integers(1, 6),
    e=st.integers(1, 12),
    sigma_e=st.one_of(st.none(), st.floats(4.0, 200.0)),
    budget=st.floats(0.5, 4.0),
)
def test_plans_with_evaluations_fit_their_budget(
    k: int, e: int, sigma_e: float | None, budget: float
) -> None:
    r = req(trials=k, epsilon_budget=budget, eval_releases=e, eval_noise_multiplier=sigma_e)
    alone = (
        None if sigma_e is None else analytic_gaussian_epsilon(math.sqrt(k * e) / sigma_e, DELTA)
    )
    if alone is not None and alone >= budget:
        with pytest.raises(InfeasiblePlan, match=r"eval\.noise_multiplier"):
            plan_grid(r)
        return
    try:
        plan = plan_grid(r)
    except InfeasiblePlan:
        # Only when the evaluations leave training almost nothing.
        assert alone is not None and alone > 0.9 * budget
        return
    assert plan.epsilon_total <= budget
    assert plan.epsilon_eval is not None and plan.epsilon_eval < plan.epsilon_total
    assert plan.epsilon_verified_lower is not None and plan.epsilon_verified_lower <= budget
    if sigma_e is None:
        assert plan.epsilon_eval <= 0.1 * budget


def test_the_charge_schedule_charges_the_evaluations_too() -> None:
    """Each run's ledger charge includes its noisy evaluations: the schedule's total is the
    plan's (evaluations included), and a plan whose schedule would leave them out is refused."""
    from sweeper.privacy.charges import charge_schedule

    req = GridRequest(
        arm="fixed",
        strategy="fixed",
        epsilon_budget=2.0,
        delta=1e-5,
        trials=4,
        steps_per_trial=40,
        sample_rate=0.05,
        eval_releases=5,
        eval_epsilon_share=0.3,
    )
    plan = plan_grid(req)
    schedule = charge_schedule(plan)
    assert float(schedule.reserved_epsilon) >= plan.epsilon_total
    assert float(schedule.reserved_epsilon) == pytest.approx(plan.epsilon_total, rel=0.01)
    # The same plan with its evaluations dropped from the schedule's view is caught.
    with pytest.raises(PrivacyError, match="below the plan"):
        charge_schedule(replace(plan, eval_releases=0, eval_noise_multiplier=None))
