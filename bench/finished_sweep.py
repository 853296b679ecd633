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
            dataset, plan = sweep.ledger_key or sweep.dataset, {g["grid"]: g for g in sweep.plan}
            scheds = schedules(sweep)
            every = int(sweep.spec["training"]["eval_every"])
            rows = session.execute(
                select(Trial.id, Trial.arm, Trial.epsilon_budget, Trial.number, Trial.params)
                .where(Trial.sweep_id == sweep_id)
                .order_by(Trial.arm, Trial.epsilon_budget, Trial.number)
            ).all()
            n = len(rows)
            # Two workers, about 0.6 s a trial, ending a minute ago.
            end = datetime.now(UTC) - timedelta(minutes=1)
            start = end - timedelta(seconds=0.3 * n + 1.0)
            trial_updates: list[dict[str, Any]] = []
            results: list[dict[str, Any]] = []
            points: list[dict[str, Any]] = []
            evts: list[dict[str, Any]] = [
                {
                    "sweep_id": sweep_id,
                    "kind": events.SWEEP,
                    "trial_id": None,
                    "data": {"state": "running"},
                    "created_at": start,
                }
            ]
            charges: list[dict[str, Any]] = []
            for i, (tid, arm, level, number, params) in enumerate(rows):
                g = plan[grid_key(arm, level)]
                began = start + timedelta(seconds=0.3 * i)
                took = 0.5 + 0.2 * rng.random()
                done_at = began + timedelta(seconds=took)
                steps = int(g["steps_per_trial"])
                evals = _eval_steps(steps, every)
                # Better with more budget and a learning rate near 0.3.
                lr_penalty = 0.08 * math.log10(float(params["lr"]) / 0.3) ** 2
                quality = 0.55 + 0.4 * (1 - math.exp(-level / 4)) - lr_penalty
                history = [_fake_eval(rng, quality - 0.1 * (1 - s / steps)) for s in evals]
                best = max(range(len(evals)), key=lambda j: history[j]["accuracy"])
                metrics = {k: history[best][k] for k in METRICS}
                trial_updates.append(
                    {
                        "id": tid,
                        "state": TrialState.done,
                        "attempts": 1,
                        "worker": f"bench-{i % 2}",
                        "pack_id": tid,
                        "started_at": began,
                        "finished_at": done_at,
                        "train_seconds": took - 0.05,
                        "error": None,
                    }
                )
                results.append(
                    {
                        "trial_id": tid,
                        "metrics": metrics,
                        "final_metrics": {k: history[-1][k] for k in METRICS},
                        "epsilon": float(g["epsilon_per_trial"]),
                        "delta": float(g["delta_per_trial"]),
                        "accountant": g["accountant"],
                        "steps": steps,
                        "best_step": evals[best],
                        "reliability": history[best]["reliability"],
                        "trajectories": {
                            "step": evals,
                            "lr": [float(params["lr"])] * len(evals),
                            "clip": [
                                float(params.get("clip", params.get("clip_init", 1.0)))
                                * (1 + 0.1 * rng.random())
                                for _ in evals
                            ],
                        },
                        "step_time_ms_median": 2.5 + rng.random(),
                        "diverged_at": None,
                        "objective": metrics["accuracy"],
                    }
                )
                trial = {"trial": tid, "arm": arm, "epsilon_budget": level}
                evts.append(
                    {
                        "sweep_id": sweep_id,
                        "kind": events.TRIAL,
                        "trial_id": tid,
                        "data": trial | {"state": "running", "params": params},
                        "created_at": began,
                    }
                )
                for j, (s, h) in enumerate(zip(evals, history, strict=True)):
                    at = began + timedelta(seconds=took * (j + 1) / (len(evals) + 1))
                    values = {k: h[k] for k in METRICS}
                    points.extend(
                        {"trial_id": tid, "step": s, "name": k, "value": v}
                        for k, v in values.items()
                    )
                    evts.append(
                        {
                            "sweep_id": sweep_id,
                            "kind": events.METRIC,
                            "trial_id": tid,
                            "data": {"trial": tid, "step": s, "values": values},
                            "created_at": at,
                        }
                    )
                evts.append(
                    {
                        "sweep_id": sweep_id,
                        "kind": events.TRIAL,
                        "trial_id": tid,
                        "data": trial
                        | {"state": "done", "metrics": metrics, "epsilon": g["epsilon_per_trial"]},
                        "created_at": done_at,
                    }
                )
                # Each trial was its grid's (number + 1)-th run, charged before it started.
                run = number + 1
                eps, dlt = scheds[g["grid"]].charge_for_run(run)
                charges.append(
                    {
                        "dataset": dataset,
                        "sweep_id": sweep_id,
                        "trial_id": tid,
                        "kind": EntryKind.CHARGE,
                        "epsilon": eps,
                        "delta": dlt,
                        "created_at": began,
                        "note": f"run {run} of grid {g['grid']}",
                    }
                )
            evts.append(
                {
                    "sweep_id": sweep_id,
                    "kind": events.SWEEP,
                    "trial_id": None,
                    "data": {"state": "done", "error": None},
                    "created_at": end,
                }
            )
            session.execute(update(Trial), trial_updates)
            session.execute(insert(TrialResultRow), results)
            session.execute(insert(MetricPoint), points)
            session.execute(insert(SweepEvent), evts)
            # What BudgetLedger.charge does per trial, in bulk: the dataset's totals move from
            # reserved to spent (exactly), and one charge entry per trial is recorded.
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
            # ... and the sweep's running totals (what the next charge or release reads).
            totals = session.scalars(
                select(SweepTotals).where(
                    SweepTotals.dataset == dataset, SweepTotals.sweep_id == sweep_id
                )
            ).one()
            totals.epsilon_charged = exact_sum((totals.epsilon_charged, spent_e))
            totals.delta_charged = exact_sum((totals.delta_charged, spent_d))
            sweep.state = SweepState.done
            sweep.started_at = start
            sweep.finished_at = end
            sweep.driver = None
            sweep.heartbeat_at = end
        ledger.release(dataset, sweep_id=sweep_id, note="sweep finished")
        return LoadedSweep(
            sweep_id,
            n,
            time.perf_counter() - t0,
            {
                "trials": n,
                "metric_points": len(points),
                "events": len(evts) + 1,  # and create_sweep's "pending"
                "ledger_entries": len(charges) + 2,  # and the reservation and the release
            },
        )
    finally:
        engine.dispose()
