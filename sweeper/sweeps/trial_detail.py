"""One released trial for the API: its details, its privacy charges, its metric history.

A trial exists for a viewer only if the viewer sees its sweep and the trial is released: a
papernot-steinke grid's other trials are "not found". The released trial shows no position,
timestamps, durations or worker, and its privacy charges are the grid's one whole-search charge:
each of those could tell how many runs went before or beside it. An analyst's trial shows no
worker and no per-step time, and its times (charges' included) rounded to 10 s: they follow the
realised batches (:mod:`sweeper.datasets.analyst_clock`).
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, selectinload

from dpsweep.errors import TrialNotFound
from dpsweep.plan import SweepPlan
from dpsweep.spec import randomness_label
from sweeper.datasets.access import Viewer
from sweeper.datasets.analyst_clock import coarse_time, for_analyst, reads_as_analyst
from sweeper.datasets.grants import sees_sweep
from sweeper.privacy.charges import exact_sum, ps_charge_note
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.records import LedgerRecord
from sweeper.privacy.ledger.rows import EntryKind
from sweeper.store import MetricPoint, Sweep, Trial, iso
from sweeper.store.model_refs import model_refs
from sweeper.sweeps.released import released_records
from sweeper.sweeps.stored import grid_key, hidden_grids, schedules, typed_spec
from sweeper.sweeps.trial_pages import trial_item


def released_trial(session: Session, trial_id: str, viewer: Viewer) -> tuple[Trial, bool]:
    """The trial, if the viewer may see it, and whether it is a papernot-steinke grid's
    selected trial (shown without its position, timestamps and worker).

    Raises:
        TrialNotFound: no such trial, someone else's, or a papernot-steinke trial that is not
            (or not yet) released.
    """
    trial = session.get(Trial, trial_id)
    if trial is not None:
        sweep = session.get(Sweep, trial.sweep_id)
        if sweep is not None and sees_sweep(
            session, viewer, owner=sweep.owner, dataset=sweep.dataset
        ):
            hidden = hidden_grids(sweep)
            if grid_key(trial.arm, trial.epsilon_budget) not in hidden:
                return trial, False
            objective = typed_spec(sweep).objective
            metric, mode = objective.metric, objective.mode
            # A papernot-steinke trial exists for the caller only if it is the selected one.
            full = session.scalars(
                select(Sweep)
                .where(Sweep.id == sweep.id)
                .options(selectinload(Sweep.trials).selectinload(Trial.result))
            ).one()
            if any(r["id"] == trial_id for r in released_records(full, metric=metric, mode=mode)):
                return trial, True
    raise TrialNotFound(f"no trial {trial_id!r}; GET /api/v1/sweeps/{{id}}/trials lists them")


def _clean(value: Any) -> Any:
    """JSON cannot carry NaN or infinities; they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def trial_detail(engine: Engine, trial_id: str, viewer: Viewer) -> dict[str, Any]:
    """Everything about one released trial: parameters, planned σ, its privacy charges,
    best-checkpoint and final metrics, reliability bins and trajectories."""
    with Session(engine) as session:
        trial, selected_only = released_trial(session, trial_id, viewer)
        sweep = session.get(Sweep, trial.sweep_id)
        assert sweep is not None
        analyst = reads_as_analyst(session, viewer, sweep.dataset)
        r = trial.result
        refs = model_refs(session, [trial_id])
        out = trial_item(trial, selected_only=selected_only, model=refs.get(trial_id))
        out["randomness"] = randomness_label(sweep.spec or {})
        grid = grid_key(trial.arm, trial.epsilon_budget)
        # A papernot-steinke grid's trials, whose one charge (held by whichever trial ran
        # first) is the released trial's: who paid says whether it ran first.
        grid_trials = (
            set(
                session.scalars(
                    select(Trial.id).where(
                        Trial.sweep_id == trial.sweep_id,
                        Trial.arm == trial.arm,
                        Trial.epsilon_budget == trial.epsilon_budget,
                    )
                )
            )
            if selected_only
            else set()
        )
        plan = next((g for g in SweepPlan.from_stored(sweep.plan) if g.grid == grid), None)
        sched = schedules(sweep).get(grid)
        dataset = sweep.ledger_key or sweep.dataset
        out |= {
            "target_delta": trial.target_delta,
            # Which worker process ran a papernot-steinke run hints at how many ran before.
            "worker": None if selected_only else trial.worker,
            "planned": {
                "noise_multiplier": trial.noise_multiplier,
                "gradient_noise_multiplier": plan.gradient_noise_multiplier if plan else None,
                "steps": plan.steps_per_trial if plan else None,
                "sample_rate": plan.sample_rate if plan else None,
                "accountant": plan.accountant if plan else None,
                "accounting": plan.accounting if plan else None,
                "grid_epsilon_budget": plan.epsilon_budget if plan else None,
                "grid_runs_reserved": sched.runs if sched and not sched.whole_grid else None,
                "engine_path": plan.engine_path if plan else None,
            },
            "final_metrics": (r.final_metrics if r is not None else None) or {},
            "accountant": r.accountant if r is not None else None,
            "reliability": (r.reliability if r is not None else None) or [],
            "trajectories": (r.trajectories if r is not None else None) or {},
            # A packed run's step time is its pack's, and pack sizes follow the number of runs.
            "step_time_ms_median": (
                r.step_time_ms_median if r is not None and not selected_only else None
            ),
            "diverged_at": r.diverged_at if r is not None else None,
            # Results stored before the generic path existed were all trained packed.
            "engine_path": (r.engine_path or "packed") if r is not None else None,
        }
    charges = _charges(
        BudgetLedger(engine).entries(dataset, trial.sweep_id),
        trial_id,
        grid=grid if selected_only else None,
        grid_trials=grid_trials,
    )
    if analyst:
        # A charge's time is its trial's claim: the gaps between them time the packs before.
        out = for_analyst(out)
        charges = [c | {"at": coarse_time(c["at"])} for c in charges]
    out["privacy"] = {
        "charges": charges,
        "epsilon_charged": sum(c["epsilon"] for c in charges),
        "delta_charged": sum(c["delta"] for c in charges),
        "single_run_epsilon": out["single_run_epsilon"],
    }
    return _clean(out)


def _charges(
    entries: list[LedgerRecord], trial_id: str, *, grid: str | None, grid_trials: set[str]
) -> list[dict[str, Any]]:
    """The trial's privacy charges from its sweep's ledger ``entries``; ``grid``: the
    papernot-steinke grid whose selected trial it is (``grid_trials``: that grid's trials)."""
    if grid is not None:
        # The grid's whole-search charge, whoever holds it, without its time (the time of
        # the grid's first run). Summed, so that sweeps stored when every run wrote an entry
        # (zero after the first) still show one.
        mine = [e for e in entries if e.kind == EntryKind.CHARGE and e.trial_id in grid_trials]
        if not mine:
            return []
        return [
            {
                "kind": EntryKind.CHARGE.value,
                "epsilon": float(exact_sum([e.epsilon for e in mine])),
                "delta": float(exact_sum([e.delta for e in mine])),
                "at": None,
                "note": ps_charge_note(grid),
            }
        ]
    return [
        {
            "kind": e.kind.value,
            "epsilon": float(e.epsilon),
            "delta": float(e.delta),
            "at": iso(e.created_at),
            "note": e.note,
        }
        for e in entries
        if e.kind == EntryKind.CHARGE and e.trial_id == trial_id
    ]


def metric_history(
    engine: Engine, trial_id: str, viewer: Viewer, *, name: str | None = None
) -> dict[str, Any]:
    """A released trial's evaluation history: ``{name: [{step, value}, ...]}``."""
    with Session(engine) as session:
        released_trial(session, trial_id, viewer)  # raises unless released
        stmt = select(MetricPoint.name, MetricPoint.step, MetricPoint.value).where(
            MetricPoint.trial_id == trial_id
        )
        if name is not None:
            stmt = stmt.where(MetricPoint.name == name)
        rows = session.execute(stmt.order_by(MetricPoint.name, MetricPoint.step)).all()
    series: dict[str, list[dict[str, Any]]] = {}
    for n, step, value in rows:
        series.setdefault(n, []).append({"step": step, "value": value})
    return {"trial": trial_id, "metrics": series}
