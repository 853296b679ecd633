"""Issue 41: a compose grid's charges evaluated at O(log K) charge points, never under-charged.

The cumulative charge after run j is eps(p), p the first charge point >= j: never below the
exact eps(j) (what every run was charged before buckets), adding up exactly to the
reservation eps(K), in as many accountant evaluations as there are points.
"""

from __future__ import annotations

import itertools
import math
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsweep.errors import PrivacyError
from dpsweep.plan import GridPlan
from sweeper.privacy.charges import (
    EXACT_RUNS,
    POINT_GROWTH,
    ChargeSchedule,
    charge_points,
    charge_schedule,
    exact_sum,
)


def _plan(**over: Any) -> GridPlan:
    base: dict[str, Any] = dict(
        arm="a",
        strategy="fixed",
        epsilon_budget=100.0,
        delta=1e-5,
        trials=5,
        steps_per_trial=30,
        sample_rate=0.05,
        noise_multiplier=1.2,
        epsilon_per_trial=1.0,
        delta_per_trial=1e-5,
        epsilon_total=0.0,  # no top-up: the schedule's own eps(K) is the reservation
        epsilon_verified=0.0,
        accounting="compose",
        accountant="dp-rdp",
        verified_by="x",
        release="all",
    )
    base.update(over)
    return GridPlan(**base)


def _max_points(runs: int, exact_runs: int = EXACT_RUNS, growth: float = POINT_GROWTH) -> int:
    return min(runs, exact_runs) + math.ceil(math.log(max(runs, 1)) / math.log(growth)) + 1


@given(
    runs=st.integers(1, 10**7),
    exact_runs=st.integers(1, 20),
    growth=st.floats(1.05, 4.0),
)
def test_charge_points_are_increasing_end_at_k_and_are_logarithmic(
    runs: int, exact_runs: int, growth: float
) -> None:
    pts = charge_points(runs, exact_runs=exact_runs, growth=growth)
    assert pts[0] == 1 and pts[-1] == runs
    assert all(b > a for a, b in itertools.pairwise(pts))
    assert pts[: min(runs, exact_runs)] == list(range(1, min(runs, exact_runs) + 1))
    assert len(pts) <= _max_points(runs, exact_runs, growth)


@pytest.mark.parametrize(
    "bad", [dict(runs=0), dict(runs=5, growth=1.0), dict(runs=5, exact_runs=0)]
)
def test_charge_points_refuse_nonsense(bad: dict[str, Any]) -> None:
    with pytest.raises(PrivacyError):
        charge_points(**bad)


def _exact(plan: GridPlan) -> ChargeSchedule:
    """The exact per-run schedule: every run a charge point."""
    return charge_schedule(plan, exact_runs=plan.trials)


@settings(max_examples=12, deadline=None)
@given(
    runs=st.integers(1, 30),
    exact_runs=st.integers(1, 6),
    growth=st.floats(1.1, 3.0),
    sigma=st.floats(0.8, 5.0),
    releases=st.sampled_from([0, 3]),
)
def test_bucketed_charges_cover_every_prefix_and_add_up_to_the_reservation(
    runs: int, exact_runs: int, growth: float, sigma: float, releases: int
) -> None:
    plan = _plan(
        trials=runs,
        noise_multiplier=sigma,
        eval_releases=releases,
        eval_noise_multiplier=20.0 if releases else None,
    )
    exact = _exact(plan)
    s = charge_schedule(plan, exact_runs=exact_runs, growth=growth)
    assert exact.points is None or exact.points == tuple(range(1, runs + 1))
    assert s.runs == runs == exact.runs
    running = Decimal(0)
    for j in range(1, runs + 1):
        e, d = s.charge_for_run(j)
        assert e >= 0 and d >= 0
        running = exact_sum((running, e))
        # Never below what j runs cost (fail closed: over-charging inside a bucket only).
        assert running == s.cumulative(j)[0] >= exact.cumulative(j)[0]
        assert s.cumulative(j)[1] == Decimal(plan.delta)
    # Exactly the reservation, which is eps(K) of the exact schedule.
    assert running == s.reserved_epsilon == exact.reserved_epsilon
    assert s.reserved_delta == Decimal(plan.delta)
    with pytest.raises(PrivacyError, match="no budget is reserved"):
        s.charge_for_run(runs + 1)


@settings(max_examples=20, deadline=None)
@given(runs=st.integers(9, 400), exact_runs=st.integers(1, 8))
def test_a_stored_schedule_round_trips_and_an_old_dense_one_still_charges(
    runs: int, exact_runs: int
) -> None:
    pts = charge_points(runs, exact_runs=exact_runs)
    eps = tuple(Decimal(i) / 7 for i in range(1, len(pts) + 1))
    s = ChargeSchedule(eps, (Decimal("1e-5"),) * len(pts), points=tuple(pts))
    back = ChargeSchedule.from_json(s.to_json())
    assert back == s and back.runs == runs
    # A schedule stored before buckets (no "points"): every run its own value, as before.
    old = ChargeSchedule.from_json({"epsilon": ["0.5", "0.75", "1"], "delta": ["0"] * 3})
    assert old.points is None and old.runs == 3
    assert [old.charge_for_run(j)[0] for j in (1, 2, 3)] == [
        Decimal("0.5"),
        Decimal("0.25"),
        Decimal("0.25"),
    ]
    # The dense form is still what a schedule whose points are every run stores.
    assert "points" not in ChargeSchedule(eps[:2], eps[:2], points=(1, 2)).to_json()


@pytest.mark.parametrize(
    "bad",
    [
        {"epsilon": ["1", "0.5"], "delta": ["0", "0"], "points": [1, 2]},  # not cumulative
        {"epsilon": ["1", "2"], "delta": ["0", "0"], "points": [2, 2]},  # points not increasing
        {"epsilon": ["1", "2"], "delta": ["0", "0"], "points": [0, 2]},
        {"epsilon": ["1", "2"], "delta": ["0"], "points": [1, 2]},  # lengths differ
        {"epsilon": ["1", "NaN"], "delta": ["0", "0"]},
        {"epsilon": ["-1", "2"], "delta": ["0", "0"]},
    ],
)
def test_a_malformed_stored_schedule_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(PrivacyError):
        ChargeSchedule.from_json(bad)


def test_pld_buckets_never_charge_less_than_the_run_by_run_composition() -> None:
    """Against the PLD's run-by-run schedule (what every compose grid was charged before)."""
    from workers.accounting.registry import get_accountant

    plan = _plan(trials=14, accountant="pld", noise_multiplier=1.5)
    old = get_accountant("pld").run_epsilons(
        noise_multiplier=1.5, sample_rate=0.05, steps=30, runs=14, target_delta=1e-5
    )
    s = charge_schedule(plan, exact_runs=2, growth=2.0)
    assert s.points == (1, 2, 4, 8, 14)
    for j in range(1, 15):
        assert float(s.cumulative(j)[0]) >= old[j - 1]


# Every evaluation of the counting accountant (registered once per session) by its steps.
_CALLS: list[int] = []


def _counting_accountant(name: str) -> None:
    from workers.accounting.epsilon import dp_rdp_epsilon
    from workers.accounting.registry import (
        _REGISTRY,
        AccountantDescriptor,
        register_accountant,
    )

    def counted(**kw: Any) -> float:
        _CALLS.append(int(kw["steps"]))
        return dp_rdp_epsilon(**kw)

    if name not in _REGISTRY:
        register_accountant(
            AccountantDescriptor(
                name=name,
                description="counts its evaluations (a test accountant)",
                library="dp_accounting RDP",
                tight=False,
                epsilon=counted,
            )
        )


@pytest.mark.parametrize("runs", [1, 7, 100, 10_000])
def test_the_accountant_is_evaluated_once_per_charge_point(runs: int) -> None:
    _counting_accountant("counting-rdp-issue41")
    _CALLS.clear()
    plan = _plan(trials=runs, accountant="counting-rdp-issue41", epsilon_budget=1e6)
    s = charge_schedule(plan)
    assert len(_CALLS) == len(charge_points(runs)) <= _max_points(runs)
    assert sorted(_CALLS) == [p * 30 for p in charge_points(runs)]
    assert s.runs == runs


def test_a_ten_thousand_trial_pld_grid_is_scheduled_in_log_k_evaluations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 10,000-trial digits mlp grid's plan (4 epochs): its schedule completes."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    calls: list[float] = []
    real = pld.PrivacyLossDistribution.get_epsilon_for_delta

    def counted(self: Any, delta: float) -> float:
        calls.append(delta)
        return real(self, delta)

    monkeypatch.setattr(pld.PrivacyLossDistribution, "get_epsilon_for_delta", counted)
    plan = _plan(
        trials=10_000,
        accountant="pld",
        steps_per_trial=90,
        sample_rate=0.04450625869262865,
        noise_multiplier=25.503452454812006,
        epsilon_budget=8.0,
        epsilon_total=7.959768671960889,
    )
    s = charge_schedule(plan)
    assert len(calls) == len(charge_points(10_000)) <= 40
    assert s.runs == 10_000
    assert float(s.reserved_epsilon) == pytest.approx(7.959768671960889, rel=1e-6)
    assert exact_sum([e for e in (s.charge_for_run(j)[0] for j in range(1, 10_001))]) == (
        s.reserved_epsilon
    )


def test_a_bucketed_grid_is_reserved_and_charged_to_the_last_run_on_the_ledger(
    tmp_path: Any,
) -> None:
    """A 20-run compose grid (bucketed: 12 charge points) stored and reserved, its runs charged
    as the driver charges them (zero inside a bucket): the ledger accepts every charge, the
    reservation is used exactly, and a 21st run is refused."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from sweeper.privacy.ledger.budget_ledger import BudgetLedger
    from sweeper.store import Sweep, Trial
    from sweeper.store.engine import make_engine
    from sweeper.store.schema import upgrade
    from sweeper.sweeps.create import create_sweep
    from sweeper.sweeps.stored import schedules

    url = f"sqlite:///{tmp_path / 'b.db'}"
    upgrade(url)
    engine = make_engine(url)
    sid = create_sweep(
        engine,
        {
            "name": "buckets",
            "dataset": {"name": "digits"},
            "model": {"name": "logreg"},
            "training": {"steps": 10, "batch_size": 64, "eval_every": 10},
            "privacy": {"budgets": [4], "delta": 1e-5},
            "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.2, 0.3, 0.4], "clip": [1.0]}}],
            "seeds": 5,
        },
    )
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        ((_grid, sched),) = schedules(sweep).items()
        key = sweep.ledger_key
        ids = list(s.scalars(select(Trial.id).where(Trial.sweep_id == sid)))
    assert key is not None and sched.runs == len(ids) == 20
    assert sched.points == tuple(charge_points(20)) and len(sched.points) < 20
    ledger = BudgetLedger(engine)
    for run, tid in enumerate(ids, start=1):
        e, d = sched.charge_for_run(run)
        ledger.charge(key, sweep_id=sid, trial_id=tid, epsilon=e, delta=d, note=f"run {run}")
    bal = ledger.sweep_balance(key, sweep_id=sid)
    assert bal.epsilon_outstanding == 0 and bal.delta_outstanding == 0
    with pytest.raises(PrivacyError, match="no budget is reserved"):
        sched.charge_for_run(21)
    engine.dispose()
