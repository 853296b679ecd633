"""A finished sweep of any size, loaded straight through the store, for the read benchmarks.

The sweep is a real one: :func:`sweeper.sweeps.create_sweep` plans and stores it (digits, mlp,
4 arms x 5 epsilon levels, ``accounting: basic``, grids sized so that the total is
``--trials``, rounded up to a multiple of the number of levels), then it is finished in bulk
in one transaction, as the runner would have left it: every trial ``done`` with start/finish
times, a result row (best-checkpoint and final accuracy/loss/ece/mce, epsilon, delta, steps,
best step, 15 reliability bins, trajectories), a metric point per metric and evaluation
(3 evaluations x 4 metrics), the runner's events (sweep running, each trial's running,
metric and done events, sweep done), one ledger charge per trial (the grid's next run in its
stored charge schedule; written in bulk with the dataset's totals moved from reserved to
spent exactly as ``BudgetLedger.charge`` does, because charging 2,000 trials one by one
through the ledger takes ~20 s on SQLite: each charge re-reads all of the sweep's entries),
then the sweep's release through the ledger and the sweep set ``done``. On PostgreSQL the
database is then ``VACUUM ANALYZE``d, as autovacuum soon would be after such a load.

Used by ``bench/api_load.py`` (API read latency) and ``bench/dashboard_open.py``.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from sweeper.privacy.charges import EXACT, exact_sum
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.rows import DatasetBudget, EntryKind, LedgerEntry, SweepTotals
from sweeper.store import (
    MetricPoint,
    Sweep,
    SweepEvent,
    SweepState,
    Trial,
    TrialResultRow,
    TrialState,
)
from sweeper.store.engine import make_engine
from sweeper.sweeps import events
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.stored import grid_key, schedules

OWNER = "bench"
LEVELS = [1.0, 2.0, 4.0, 8.0, 16.0]
# (strategy, second grid axis, its values, fixed params): four arms, as in a real comparison.
ARMS: list[tuple[str, str, list[float], dict[str, Any]]] = [
    ("fixed", "clip", [0.25, 0.5, 1.0, 2.0, 4.0], {}),
    # sigma_b must stay above sigma / 2, and sigma is large at epsilon 1 over 100 trials.
    ("quantile", "target_quantile", [0.1, 0.3, 0.5, 0.7, 0.9], {"count_noise": 2000.0}),
    ("automatic", "clip", [0.25, 0.5, 1.0, 2.0, 4.0], {}),
    ("online", "clip_init", [0.05, 0.1, 0.2, 0.5, 1.0], {}),
]
METRICS = ("accuracy", "loss", "ece", "mce")
N_BINS = 15
TEST_EXAMPLES = 360  # digits' 20% evaluation split


def sweep_spec(trials: int) -> dict[str, Any]:
    """A spec of about ``trials`` trials: 4 arms x 5 levels, rounded up to a multiple of 5."""
    levels = LEVELS[: max(1, min(len(LEVELS), trials))]
    per_level = math.ceil(trials / len(levels))
    arms = []
    for i, (strategy, axis, values, params) in enumerate(ARMS):
        k = per_level // len(ARMS) + (i < per_level % len(ARMS))
        if k == 0:
            continue
        second = values if k % len(values) == 0 and k >= 2 * len(values) else [values[2]]
        grid = {
            "lr": {"logspace": [-2.0, 0.5], "k": k // len(second)},
            axis: second,
        }
        arms.append({"strategy": strategy, "grid": grid, "params": params})
    return {
        "name": f"api-load-{trials}",
        "dataset": {"name": "digits"},
        "model": {"name": "mlp"},
        "training": {"epochs": 2, "batch_size": 128, "eval_every": 10},
        "privacy": {
            "budgets": levels,
            "delta": 1e-5,
            "accounting": "basic",
            "max_noise_multiplier": 1000.0,
        },
        "arms": arms,
        "objective": {"metric": "accuracy", "mode": "max"},
    }


def _eval_steps(steps: int, every: int) -> list[int]:
    out = list(range(every, steps + 1, every))
    return out if out and out[-1] == steps else [*out, steps]


def _fake_eval(rng: random.Random, quality: float) -> dict[str, Any]:
    """Plausible metrics and reliability bins for a model of accuracy about ``quality``."""
    acc = min(0.99, max(0.05, quality + rng.gauss(0, 0.02)))
    counts = [0] * N_BINS
    for _ in range(TEST_EXAMPLES):
        conf = min(0.999, max(0.1, rng.gauss(acc, 0.15)))
        counts[min(N_BINS - 1, int(conf * N_BINS))] += 1
    bins = []
    for m, cnt in enumerate(counts):
        mid = (m + 0.5) / N_BINS
        bins.append(
            {
                "lower": m / N_BINS,
                "upper": (m + 1) / N_BINS,
                "count": cnt,
                "accuracy": min(1.0, max(0.0, mid + rng.gauss(0, 0.05))) if cnt else None,
                "confidence": mid if cnt else None,
            }
        )
    ece = abs(rng.gauss(0.06, 0.03))
    return {
        "accuracy": acc,
        "loss": max(0.02, -math.log(acc) * 1.1 + rng.gauss(0, 0.03)),
        "ece": ece,
        "mce": ece * (2.0 + rng.random() * 2.0),
        "reliability": bins,
    }


@dataclass
class LoadedSweep:
    id: str
    trials: int
    seconds: float
    rows: dict[str, int] = field(default_factory=dict)


@dataclass
class _FinishedRows:
    """What the runner would have written for the whole sweep, gathered for one insert each."""

    trial_updates: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    points: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    charges: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class _TrialRun:
    """One trial's made-up run: its grid, when it ran, its evaluations and the best of them."""

    tid: str
    arm: str
    level: float
    params: dict[str, Any]
    grid: dict[str, Any]
    began: datetime
    took: float
    evals: list[int]
    history: list[dict[str, Any]]
    best: int

    @property
    def done_at(self) -> datetime:
        return self.began + timedelta(seconds=self.took)

    @property
    def metrics(self) -> dict[str, Any]:
        return {k: self.history[self.best][k] for k in METRICS}


def load_finished_sweep(url: str, trials: int, *, seed: int = 0) -> LoadedSweep:
    """Create a sweep of about ``trials`` trials through the store and finish it in bulk."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    engine = make_engine(url)
    try:
        sweep_id = create_sweep(engine, sweep_spec(trials), owner=OWNER)
        ledger = BudgetLedger(engine)
        with Session(engine) as session, session.begin():
            events.lock_sweep(session, sweep_id)
            sweep = session.get(Sweep, sweep_id)
            assert sweep is not None and sweep.plan is not None
            # The ledger is keyed by the records' identity (sweeps.ledger_key), not the name.
            dataset = sweep.ledger_key or sweep.dataset
            trial_rows = _trials_in_order(session, sweep_id)
            n = len(trial_rows)
            # Two workers, about 0.6 s a trial, ending a minute ago.
            end = datetime.now(UTC) - timedelta(minutes=1)
            start = end - timedelta(seconds=0.3 * n + 1.0)
            rows = _finished_rows(sweep, dataset, trial_rows, start, end, rng)
            session.execute(update(Trial), rows.trial_updates)
            session.execute(insert(TrialResultRow), rows.results)
            session.execute(insert(MetricPoint), rows.points)
            session.execute(insert(SweepEvent), rows.events)
            _charge_in_bulk(session, dataset, sweep_id, rows.charges, end)
            _mark_done(sweep, start, end)
        ledger.release(dataset, sweep_id=sweep_id, note="sweep finished")
        return LoadedSweep(
            sweep_id,
            n,
            time.perf_counter() - t0,
            {
                "trials": n,
                "metric_points": len(rows.points),
                "events": len(rows.events) + 1,  # and create_sweep's "pending"
                "ledger_entries": len(rows.charges) + 2,  # and the reservation and the release
            },
        )
    finally:
        engine.dispose()


def _trials_in_order(session: Session, sweep_id: str) -> list[tuple[str, str, float, int, Any]]:
    """The sweep's trials (id, arm, level, number, params), by arm, level and number."""
    rows = session.execute(
        select(Trial.id, Trial.arm, Trial.epsilon_budget, Trial.number, Trial.params)
        .where(Trial.sweep_id == sweep_id)
        .order_by(Trial.arm, Trial.epsilon_budget, Trial.number)
    ).all()
    return [tuple(row) for row in rows]


def _finished_rows(
    sweep: Sweep,
    dataset: str,
    trial_rows: list[tuple[str, str, float, int, Any]],
    start: datetime,
    end: datetime,
    rng: random.Random,
) -> _FinishedRows:
    """Every trial run one after the other from ``start``, and the sweep's events around them."""
    assert sweep.plan is not None
    plan = {g["grid"]: g for g in sweep.plan}
    scheds = schedules(sweep)
    every = int(sweep.spec["training"]["eval_every"])
    rows = _FinishedRows()
    rows.events.append(_sweep_event(sweep.id, {"state": "running"}, start))
    for i, (tid, arm, level, number, params) in enumerate(trial_rows):
        g = plan[grid_key(arm, level)]
        began = start + timedelta(seconds=0.3 * i)
        run = _simulate_run(rng, tid, arm, level, params, g, began, every)
        rows.trial_updates.append(_done_trial(run, worker=f"bench-{i % 2}"))
        rows.results.append(_result_row(run, rng))
        _add_trial_events(rows, sweep.id, run)
        # Each trial was its grid's (number + 1)-th run, charged before it started.
        eps, dlt = scheds[g["grid"]].charge_for_run(number + 1)
        rows.charges.append(
            {
                "dataset": dataset,
                "sweep_id": sweep.id,
                "trial_id": tid,
                "kind": EntryKind.CHARGE,
                "epsilon": eps,
                "delta": dlt,
                "created_at": began,
                "note": f"run {number + 1} of grid {g['grid']}",
            }
        )
    rows.events.append(_sweep_event(sweep.id, {"state": "done", "error": None}, end))
    return rows


def _simulate_run(
    rng: random.Random,
    tid: str,
    arm: str,
    level: float,
    params: dict[str, Any],
    grid: dict[str, Any],
    began: datetime,
    every: int,
) -> _TrialRun:
    """How long the trial took and what each of its evaluations measured."""
    took = 0.5 + 0.2 * rng.random()
    steps = int(grid["steps_per_trial"])
    evals = _eval_steps(steps, every)
    # Better with more budget and a learning rate near 0.3.
    lr_penalty = 0.08 * math.log10(float(params["lr"]) / 0.3) ** 2
    quality = 0.55 + 0.4 * (1 - math.exp(-level / 4)) - lr_penalty
    history = [_fake_eval(rng, quality - 0.1 * (1 - s / steps)) for s in evals]
    best = max(range(len(evals)), key=lambda j: history[j]["accuracy"])
    return _TrialRun(tid, arm, level, params, grid, began, took, evals, history, best)


def _done_trial(run: _TrialRun, *, worker: str) -> dict[str, Any]:
    """The trial row's update: done, in one attempt, as its own pack."""
    return {
        "id": run.tid,
        "state": TrialState.done,
        "attempts": 1,
        "worker": worker,
        "pack_id": run.tid,
        "started_at": run.began,
        "finished_at": run.done_at,
        "train_seconds": run.took - 0.05,
        "error": None,
    }


def _result_row(run: _TrialRun, rng: random.Random) -> dict[str, Any]:
    """The trial's result: best-checkpoint and final metrics, privacy spent, trajectories."""
    g, params, evals = run.grid, run.params, run.evals
    metrics = run.metrics
    return {
        "trial_id": run.tid,
        "metrics": metrics,
        "final_metrics": {k: run.history[-1][k] for k in METRICS},
        "epsilon": float(g["epsilon_per_trial"]),
        "delta": float(g["delta_per_trial"]),
        "accountant": g["accountant"],
        "steps": int(g["steps_per_trial"]),
        "best_step": evals[run.best],
        "reliability": run.history[run.best]["reliability"],
        "trajectories": {
            "step": evals,
            "lr": [float(params["lr"])] * len(evals),
            "clip": [
                float(params.get("clip", params.get("clip_init", 1.0))) * (1 + 0.1 * rng.random())
                for _ in evals
            ],
        },
        "step_time_ms_median": 2.5 + rng.random(),
        "diverged_at": None,
        "objective": metrics["accuracy"],
    }


def _add_trial_events(rows: _FinishedRows, sweep_id: str, run: _TrialRun) -> None:
    """The trial's running event, a metric event and points per evaluation, its done event."""
    tid = run.tid
    trial = {"trial": tid, "arm": run.arm, "epsilon_budget": run.level}
    rows.events.append(
        _trial_event(sweep_id, tid, trial | {"state": "running", "params": run.params}, run.began)
    )
    for j, (s, h) in enumerate(zip(run.evals, run.history, strict=True)):
        at = run.began + timedelta(seconds=run.took * (j + 1) / (len(run.evals) + 1))
        values = {k: h[k] for k in METRICS}
        rows.points.extend(
            {"trial_id": tid, "step": s, "name": k, "value": v} for k, v in values.items()
        )
        rows.events.append(
            {
                "sweep_id": sweep_id,
                "kind": events.METRIC,
                "trial_id": tid,
                "data": {"trial": tid, "step": s, "values": values},
                "created_at": at,
            }
        )
    done = {"state": "done", "metrics": run.metrics, "epsilon": run.grid["epsilon_per_trial"]}
    rows.events.append(_trial_event(sweep_id, tid, trial | done, run.done_at))


def _sweep_event(sweep_id: str, data: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {
        "sweep_id": sweep_id,
        "kind": events.SWEEP,
        "trial_id": None,
        "data": data,
        "created_at": at,
    }


def _trial_event(sweep_id: str, tid: str, data: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {
        "sweep_id": sweep_id,
        "kind": events.TRIAL,
        "trial_id": tid,
        "data": data,
        "created_at": at,
    }


def _charge_in_bulk(
    session: Session, dataset: str, sweep_id: str, charges: list[dict[str, Any]], end: datetime
) -> None:
    """What ``BudgetLedger.charge`` does per trial, in bulk, in the caller's transaction.

    The dataset's totals move from reserved to spent (exactly), one charge entry per trial is
    recorded, and the sweep's running totals (what the next charge or release reads) grow.
    """
    budget = session.scalars(
        select(DatasetBudget).where(DatasetBudget.dataset == dataset).with_for_update()
    ).one()
    spent_e = exact_sum([c["epsilon"] for c in charges])
    spent_d = exact_sum([c["delta"] for c in charges])
    budget.epsilon_reserved = EXACT.subtract(budget.epsilon_reserved, spent_e)
    budget.delta_reserved = EXACT.subtract(budget.delta_reserved, spent_d)
    budget.epsilon_spent = exact_sum((budget.epsilon_spent, spent_e))
    budget.delta_spent = exact_sum((budget.delta_spent, spent_d))
    budget.updated_at = end
    if min(budget.epsilon_reserved, budget.delta_reserved) < Decimal(0):
        raise RuntimeError("the charges exceed the sweep's reservation")
    session.execute(insert(LedgerEntry), charges)
    totals = session.scalars(
        select(SweepTotals).where(SweepTotals.dataset == dataset, SweepTotals.sweep_id == sweep_id)
    ).one()
    totals.epsilon_charged = exact_sum((totals.epsilon_charged, spent_e))
    totals.delta_charged = exact_sum((totals.delta_charged, spent_d))


def _mark_done(sweep: Sweep, start: datetime, end: datetime) -> None:
    """The sweep as the runner leaves it: done, between ``start`` and ``end``, no driver."""
    sweep.state = SweepState.done
    sweep.started_at = start
    sweep.finished_at = end
    sweep.driver = None
    sweep.heartbeat_at = end
