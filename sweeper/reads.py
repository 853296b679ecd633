"""Reads for the API: visibility, cursor pages of sweeps and trials, trial details, versions.

Visibility: a viewer sees its own objects (admins and local use see all); anything else is
"not found", so ids of other owners do not leak. Release policy: a papernot-steinke sweep
shows only each grid's selected trial, once the grid's search has completed without a cancel
(:func:`sweeper.sweeps.released_records`); its other trials are not found, and their number
is never shown. The released trial itself shows no position, timestamps, durations or worker
(see :func:`sweeper.sweeps.trial_record`), and its privacy charges are the grid's one
whole-search charge: each of those could tell how many runs went before or beside it.

Pages use opaque keyset cursors (base64 JSON of the last row's sort key), so a page never
skips or repeats rows when new rows arrive.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, case, func, literal, select, tuple_
from sqlalchemy.orm import Session

from dpsweep.errors import TrialNotFound
from sweeper.catalog import Viewer
from sweeper.charges import exact_sum, ps_charge_note
from sweeper.ledger import LedgerEntry
from sweeper.spec import randomness_label
from sweeper.store import (
    MetricPoint,
    Sweep,
    SweepEvent,
    SweepState,
    Trial,
    TrialResultRow,
    TrialState,
    iso,
)
from sweeper.sweeps import (
    SweepNotFound,
    grid_key,
    hidden_grids,
    load_sweep,
    released_records,
    schedules,
    trial_record,
)
from workers.errors import ConfigError

SORTS = ("number", "objective")


# ---------------------------------------------------------------------------------------------
# Cursors


def encode_cursor(key: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, *, length: int) -> list[Any] | None:
    """The key a cursor holds (None for the first page).

    Raises:
        ConfigError: a cursor this API did not hand out.
    """
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        key = None
    if not isinstance(key, list) or len(key) != length:
        raise ConfigError(
            "invalid cursor: pass the next_cursor of a previous page unchanged, or omit it",
            field="cursor",
        )
    return key


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None


# ---------------------------------------------------------------------------------------------
# Sweeps


@dataclass(frozen=True)
class SweepHead:
    """What a read needs to know first: the state, whether papernot-steinke grids hide
    trials, and a version that changes whenever the sweep's summary may change (its newest
    event and newest ledger entry: charges come without events)."""

    state: str
    hidden: bool
    version: tuple[int, int]
    metric: str = "accuracy"
    mode: str = "max"
    randomness: str = "secret"


def sweep_head(engine: Engine, sweep_id: str, viewer: Viewer) -> SweepHead:
    """One query: the :class:`SweepHead` of a visible sweep.

    Raises:
        SweepNotFound: no such sweep, or someone else's.
    """
    ev = (
        select(func.max(SweepEvent.id))
        .where(SweepEvent.sweep_id == Sweep.id)
        .correlate(Sweep)
        .scalar_subquery()
    )
    le = (
        select(func.max(LedgerEntry.id))
        .where(
            # The sweep's ledger key (its name for sweeps stored before identities).
            LedgerEntry.dataset == func.coalesce(Sweep.ledger_key, Sweep.dataset),
            LedgerEntry.sweep_id == Sweep.id,
        )
        .correlate(Sweep)
        .scalar_subquery()
    )
    with Session(engine) as session:
        row = session.execute(
            select(Sweep.owner, Sweep.state, Sweep.spec, ev, le).where(Sweep.id == sweep_id)
        ).first()
    if row is None or not viewer.sees(row[0]):
        raise SweepNotFound(f"no sweep {sweep_id!r}; GET /api/v1/sweeps lists yours")
    # The planner releases selected trials only (hides the rest) exactly for this accounting.
    spec = row[2] or {}
    hidden = spec.get("privacy", {}).get("accounting") == "papernot-steinke"
    objective = spec.get("objective", {})
    return SweepHead(
        row[1].value,
        hidden,
        (int(row[3] or 0), int(row[4] or 0)),
        objective.get("metric", "accuracy"),
        objective.get("mode", "max"),
        randomness_label(spec),
    )


def check_sweep(engine: Engine, sweep_id: str, viewer: Viewer) -> tuple[str, bool]:
    """(state, has hidden grids) of a visible sweep; raises SweepNotFound otherwise."""
    head = sweep_head(engine, sweep_id, viewer)
    return head.state, head.hidden


def sweep_item(s: Sweep) -> dict[str, Any]:
    return {
        "id": s.id,
        "name": s.name,
        "dataset": s.dataset,
        "state": s.state.value,
        "owner": s.owner,
        "created_at": iso(s.created_at),
        "started_at": iso(s.started_at),
        "finished_at": iso(s.finished_at),
        "error": s.error,
        "randomness": randomness_label(s.spec or {}),
    }


def page_sweeps(
    engine: Engine,
    viewer: Viewer,
    *,
    state: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Page:
    """The viewer's sweeps, newest first, ``limit`` at a time."""
    key = decode_cursor(cursor, length=2)
    stmt = select(Sweep)
    if not (viewer.admin or viewer.owner is None):
        stmt = stmt.where(Sweep.owner == viewer.owner)
    if state is not None:
        try:
            stmt = stmt.where(Sweep.state == SweepState(state))
        except ValueError:
            raise ConfigError(
                f"unknown state {state!r}; choose one of {', '.join(s.value for s in SweepState)}",
                field="state",
            ) from None
    if key is not None:
        from datetime import datetime

        try:
            at = datetime.fromisoformat(str(key[0]))
        except ValueError:
            raise ConfigError("invalid cursor", field="cursor") from None
        stmt = stmt.where(tuple_(Sweep.created_at, Sweep.id) < tuple_(literal(at), str(key[1])))
    stmt = stmt.order_by(Sweep.created_at.desc(), Sweep.id.desc()).limit(limit + 1)
    with Session(engine) as session:
        rows = list(session.scalars(stmt))
        more = len(rows) > limit
        rows = rows[:limit]
        progress = _progress(session, rows)
    nxt = encode_cursor([rows[-1].created_at.isoformat(), rows[-1].id]) if more else None
    return Page([sweep_item(r) | progress[r.id] for r in rows], nxt)


def _progress(session: Session, sweeps: list[Sweep]) -> dict[str, dict[str, Any]]:
    """For a page of sweeps: trials by state, ε levels and the best trial objective per arm,
    in two grouped queries.

    Papernot–Steinke sweeps get no counts and no bests: how many trials ran is K, which the
    release must not reveal (their selected trials are shown on the sweep itself).
    """
    ids = [s.id for s in sweeps]
    counts: dict[str, dict[str, int]] = {i: {st.value: 0 for st in TrialState} for i in ids}
    best: dict[str, dict[str, float]] = {i: {} for i in ids}
    modes: dict[str, tuple[str, str]] = {}
    hidden: set[str] = set()
    for s in sweeps:
        objective = (s.spec or {}).get("objective", {})
        modes[s.id] = (objective.get("metric", "accuracy"), objective.get("mode", "max"))
        if (s.spec or {}).get("privacy", {}).get("accounting") == "papernot-steinke":
            hidden.add(s.id)
    if ids:
        for sid, state, n in session.execute(
            select(Trial.sweep_id, Trial.state, func.count())
            .where(Trial.sweep_id.in_(ids))
            .group_by(Trial.sweep_id, Trial.state)
        ):
            counts[sid][state.value] = int(n)
        for sid, arm, hi, lo in session.execute(
            select(
                Trial.sweep_id,
                Trial.arm,
                func.max(TrialResultRow.objective),
                func.min(TrialResultRow.objective),
            )
            .join(TrialResultRow, TrialResultRow.trial_id == Trial.id)
            .where(Trial.sweep_id.in_(ids), Trial.state == TrialState.done)
            .group_by(Trial.sweep_id, Trial.arm)
        ):
            value = hi if modes[sid][1] == "max" else lo
            if value is not None:
                best[sid][arm] = float(value)
    out: dict[str, dict[str, Any]] = {}
    for s in sweeps:
        metric, mode = modes[s.id]
        levels = sorted({float(g["epsilon_budget"]) for g in s.plan or []})
        shown = s.id not in hidden
        out[s.id] = {
            "objective": {"metric": metric, "mode": mode},
            "levels": levels,
            "trials": counts[s.id] if shown else None,
            "best": (
                [{"arm": arm, "objective": v} for arm, v in sorted(best[s.id].items())]
                if shown
                else None
            ),
        }
    return out


# ---------------------------------------------------------------------------------------------
# Trials


def _record(t: Trial, *, selected_only: bool = False) -> dict[str, Any]:
    """:func:`sweeper.sweeps.trial_record`, plus the sweep and the stored objective
    (``selected_only``: a papernot-steinke grid's released trial)."""
    r = t.result
    return trial_record(t, selected_only=selected_only) | {
        "sweep": t.sweep_id,
        "objective": r.objective if r is not None else None,
    }


_TRIAL_COLUMNS = (
    Trial.id,
    Trial.sweep_id,
    Trial.arm,
    Trial.strategy,
    Trial.epsilon_budget,
    Trial.params,
    Trial.seed,
    Trial.number,
    Trial.state,
    Trial.attempts,
    Trial.noise_multiplier,
    Trial.error,
    Trial.started_at,
    Trial.finished_at,
    Trial.train_seconds,
)
_RESULT_COLUMNS = (
    TrialResultRow.metrics,
    TrialResultRow.objective,
    TrialResultRow.epsilon,
    TrialResultRow.delta,
    TrialResultRow.steps,
    TrialResultRow.best_step,
)


def _row_record(r: Any) -> dict[str, Any]:
    """A trial record from plain columns (a page reads no ORM objects: it is the hot path)."""
    return {
        "id": r.id,
        "sweep": r.sweep_id,
        "arm": r.arm,
        "strategy": r.strategy,
        "epsilon_budget": r.epsilon_budget,
        "params": r.params,
        "seed": r.seed,
        "number": r.number,
        "state": r.state.value,
        "attempts": r.attempts,
        "noise_multiplier": r.noise_multiplier,
        "error": r.error,
        "metrics": r.metrics or {},
        "objective": r.objective,
        "single_run_epsilon": r.epsilon,
        "delta": r.delta,
        "steps": r.steps,
        "best_step": r.best_step,
        "started_at": iso(r.started_at),
        "finished_at": iso(r.finished_at),
        "train_seconds": r.train_seconds,
    }


def _mode(sweep: Sweep) -> tuple[str, str]:
    obj = sweep.spec.get("objective", {})
    return obj.get("metric", "accuracy"), obj.get("mode", "max")


def page_trials(
    engine: Engine,
    sweep_id: str,
    viewer: Viewer,
    *,
    arm: str | None = None,
    level: float | None = None,
    state: str | None = None,
    sort: str = "number",
    limit: int = 50,
    cursor: str | None = None,
) -> Page:
    """A sweep's released trials, filtered, sorted by grid order (``number``: arm, level,
    number) or by the objective (best first, trials without one last)."""
    if sort not in SORTS:
        raise ConfigError(f"unknown sort {sort!r}; choose one of {', '.join(SORTS)}", field="sort")
    head = sweep_head(engine, sweep_id, viewer)
    hidden, metric, mode = head.hidden, head.metric, head.mode
    if state is not None and state not in {s.value for s in TrialState}:
        raise ConfigError(
            f"unknown state {state!r}; choose one of pending, running, done, failed, "
            "interrupted, cancelled",
            field="state",
        )
    if hidden:
        page = _page_released(
            engine, sweep_id, arm=arm, level=level, state=state, sort=sort, limit=limit,
            cursor=cursor, metric=metric, mode=mode,
        )  # fmt: skip
        return Page([i | {"randomness": head.randomness} for i in page.items], page.next_cursor)
    sign = -1.0 if mode == "max" else 1.0
    missing = case((TrialResultRow.objective.is_(None), 1), else_=0)
    value = func.coalesce(TrialResultRow.objective * sign, 0.0)
    if sort == "number":
        cols: list[Any] = [Trial.arm, Trial.epsilon_budget, Trial.number, Trial.id]
    else:
        cols = [missing, value, Trial.id]
    key = decode_cursor(cursor, length=len(cols))
    stmt = (
        select(*_TRIAL_COLUMNS, *_RESULT_COLUMNS)
        .outerjoin(TrialResultRow, TrialResultRow.trial_id == Trial.id)
        .where(Trial.sweep_id == sweep_id)
    )
    if arm is not None:
        stmt = stmt.where(Trial.arm == arm)
    if level is not None:
        stmt = stmt.where(Trial.epsilon_budget == float(level))
    if state is not None:
        stmt = stmt.where(Trial.state == state)
    if key is not None:
        stmt = stmt.where(tuple_(*cols) > tuple_(*[literal(v) for v in key]))
    stmt = stmt.order_by(*cols).limit(limit + 1)
    with Session(engine) as session:
        rows = session.execute(stmt).all()
    more = len(rows) > limit
    items = [_row_record(r) | {"randomness": head.randomness} for r in rows[:limit]]
    nxt = None
    if more:
        last = items[-1]
        if sort == "number":
            nxt = encode_cursor([last["arm"], last["epsilon_budget"], last["number"], last["id"]])
        else:
            obj = last["objective"]
            nxt = encode_cursor(
                [1 if obj is None else 0, 0.0 if obj is None else sign * obj, last["id"]]
            )
    return Page(items, nxt)


def _page_released(
    engine: Engine,
    sweep_id: str,
    *,
    arm: str | None,
    level: float | None,
    state: str | None,
    sort: str,
    limit: int,
    cursor: str | None,
    metric: str,
    mode: str,
) -> Page:
    # papernot-steinke: at most one released trial per grid, so the page is built in memory.
    sweep = load_sweep(engine, sweep_id)
    records = released_records(sweep, metric=metric, mode=mode)
    by_id = {t.id: t for t in sweep.trials}
    items = []
    for rec in records:
        item = _record(by_id[rec["id"]], selected_only=True)
        if arm is not None and item["arm"] != arm:
            continue
        if level is not None and item["epsilon_budget"] != float(level):
            continue
        if state is not None and item["state"] != state:
            continue
        items.append(item)
    sign = -1.0 if mode == "max" else 1.0

    def sort_key(i: dict[str, Any]) -> list[Any]:
        if sort == "number":
            return [i["arm"], i["epsilon_budget"], i["number"], i["id"]]
        obj = i["objective"]
        return [1 if obj is None else 0, 0.0 if obj is None else sign * obj, i["id"]]

    items.sort(key=sort_key)
    key = decode_cursor(cursor, length=4 if sort == "number" else 3)
    if key is not None:
        items = [i for i in items if sort_key(i) > key]
    more = len(items) > limit
    items = items[:limit]
    return Page(items, encode_cursor(sort_key(items[-1])) if more else None)


def _released_trial(session: Session, trial_id: str, viewer: Viewer) -> tuple[Trial, bool]:
    """The trial, if the viewer may see it, and whether it is a papernot-steinke grid's
    selected trial (shown without its position, timestamps and worker).

    Raises:
        TrialNotFound: no such trial, someone else's, or a papernot-steinke trial that is not
            (or not yet) released.
    """
    trial = session.get(Trial, trial_id)
    if trial is not None:
        sweep = session.get(Sweep, trial.sweep_id)
        if sweep is not None and viewer.sees(sweep.owner):
            hidden = hidden_grids(sweep)
            if grid_key(trial.arm, trial.epsilon_budget) not in hidden:
                return trial, False
            metric, mode = _mode(sweep)
            # A papernot-steinke trial exists for the caller only if it is the selected one.
            from sqlalchemy.orm import selectinload

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
    from sweeper.ledger import BudgetLedger, EntryKind

    with Session(engine) as session:
        trial, selected_only = _released_trial(session, trial_id, viewer)
        sweep = session.get(Sweep, trial.sweep_id)
        assert sweep is not None
        r = trial.result
        out = _record(trial, selected_only=selected_only)
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
        plan = next((g for g in sweep.plan or [] if g["grid"] == grid), {})
        sched = schedules(sweep).get(grid)
        dataset = sweep.ledger_key or sweep.dataset
        out |= {
            "target_delta": trial.target_delta,
            # Which worker process ran a papernot-steinke run hints at how many ran before.
            "worker": None if selected_only else trial.worker,
            "planned": {
                "noise_multiplier": trial.noise_multiplier,
                "gradient_noise_multiplier": plan.get("gradient_noise_multiplier"),
                "steps": plan.get("steps_per_trial"),
                "sample_rate": plan.get("sample_rate"),
                "accountant": plan.get("accountant"),
                "accounting": plan.get("accounting"),
                "grid_epsilon_budget": plan.get("epsilon_budget"),
                "grid_runs_reserved": sched.runs if sched and not sched.whole_grid else None,
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
        }
    entries = BudgetLedger(engine).entries(dataset, trial.sweep_id)
    if selected_only:
        # The grid's whole-search charge, whoever holds it, without its time (the time of
        # the grid's first run). Summed, so that sweeps stored when every run wrote an entry
        # (zero after the first) still show one.
        mine = [e for e in entries if e.kind == EntryKind.CHARGE and e.trial_id in grid_trials]
        charges = (
            [
                {
                    "kind": EntryKind.CHARGE.value,
                    "epsilon": float(exact_sum([e.epsilon for e in mine])),
                    "delta": float(exact_sum([e.delta for e in mine])),
                    "at": None,
                    "note": ps_charge_note(grid),
                }
            ]
            if mine
            else []
        )
    else:
        charges = [
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
    out["privacy"] = {
        "charges": charges,
        "epsilon_charged": sum(c["epsilon"] for c in charges),
        "delta_charged": sum(c["delta"] for c in charges),
        "single_run_epsilon": out["single_run_epsilon"],
    }
    return _clean(out)


def metric_history(
    engine: Engine, trial_id: str, viewer: Viewer, *, name: str | None = None
) -> dict[str, Any]:
    """A released trial's evaluation history: ``{name: [{step, value}, ...]}``."""
    with Session(engine) as session:
        _released_trial(session, trial_id, viewer)  # raises unless released
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
