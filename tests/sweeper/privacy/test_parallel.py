"""Planning in worker processes: distinct accounting problems are solved once, and every grid
gets exactly what planning it alone would give."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sweeper.sweeps.planning as planning
from dpsweep.plan import GridPlan
from dpsweep.spec import load_spec
from sweeper.privacy.charges import charge_schedule
from sweeper.privacy.grids import GridRequest
from sweeper.privacy.parallel import pmap_distinct
from sweeper.privacy.planner import plan_grid
from sweeper.sweeps.create import charge_schedules
from sweeper.sweeps.planning import plan_sweep

ROOT = Path(__file__).resolve().parents[3]


def _square(x: tuple[int, str]) -> int:
    return x[0] * x[0]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 5), st.text(max_size=2)), max_size=12))
def test_pmap_distinct_is_the_plain_map(items: list[tuple[int, str]]) -> None:
    """With a key holding everything fn reads, the results are the serial map's, in order."""
    got = pmap_distinct(
        _square,
        items,
        key=lambda x: x[0],
    )
    assert got == [(x, _square(x)) for x in items]


def test_shared_grids_get_what_each_alone_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's fixed and quantile grids share each level's accounting: planned once, each
    still gets exactly its own plan and charge schedule, labelled with its own arm."""
    monkeypatch.setenv("DPSWEEP_PLAN_PROCESSES", "1")  # count calls in this process
    calls: list[GridRequest] = []

    def counting(req: GridRequest) -> GridPlan:
        calls.append(req)
        return plan_grid(req)

    monkeypatch.setattr(planning, "plan_grid", counting)
    spec = load_spec(ROOT / "examples" / "demo.yaml")
    plan = plan_sweep(spec)
    levels = len(spec.privacy.budgets)
    assert len(plan.grids) == 3 * levels
    # fixed and quantile have 4 trials each, online 3: two accounting problems per level.
    assert len(calls) == 2 * levels
    for g in plan.grids:
        first = next(
            c for c in calls if (c.epsilon_budget, c.trials) == (g.epsilon_budget, g.trials)
        )
        alone = plan_grid(replace(first, arm=g.arm, strategy=g.strategy))
        assert (g.arm, g.strategy) in {(a.label, a.strategy) for a in spec.arms}
        assert g.noise_multiplier == alone.noise_multiplier
        assert g.epsilon_total == alone.epsilon_total
        assert g.epsilon_verified == alone.epsilon_verified
    schedules = charge_schedules(plan.grids)
    assert schedules == [charge_schedule(g) for g in plan.grids]
