"""Pages of a sweep's released trials for the API, filtered and sorted.

Release policy: a papernot-steinke sweep shows only each grid's selected trial, once the grid's
search has completed without a cancel (:func:`sweeper.sweeps.released.released_records`); its
other trials are not listed, and their number is never shown. The released trial itself shows
no position, timestamps or durations (see :func:`sweeper.sweeps.released.trial_record`). An
analyst's page shows times rounded to 10 s (:mod:`sweeper.datasets.analyst_clock`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, case, func, literal, select, tuple_
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError
from sweeper.datasets.access import Viewer
from sweeper.datasets.analyst_clock import for_analyst
from sweeper.store import ModelArtifact, Trial, TrialResultRow, TrialState, iso
from sweeper.store.cursors import Page, decode_cursor, encode_cursor
from sweeper.store.model_refs import REF_COLUMNS, model_refs, row_ref
from sweeper.sweeps.released import released_records, trial_record
from sweeper.sweeps.stored import load_sweep
from sweeper.sweeps.sweep_pages import sweep_head

SORTS = ("number", "objective")


def trial_item(
    t: Trial, *, selected_only: bool = False, model: dict[str, Any] | None = None
) -> dict[str, Any]:
    """:func:`~sweeper.sweeps.released.trial_record`, plus the sweep, the stored objective
    and its kept model (``model``: :func:`sweeper.store.model_refs.model_ref`, None if none;
    ``selected_only``: a papernot-steinke grid's released trial)."""
    r = t.result
    return trial_record(t, selected_only=selected_only) | {
        "sweep": t.sweep_id,
        "objective": r.objective if r is not None else None,
        "model": model,
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
    """A trial record from plain columns (a page reads no ORM objects: it is the hot path),
    with its kept model from the columns joined in (:data:`~sweeper.store.model_refs.
    REF_COLUMNS`)."""
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
        "model": row_ref(r.id, r),
    }


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
    # An analyst's trials: how long they took depends on the realised batches (coarse times).
    shown = for_analyst if head.analyst else dict
    if hidden:
        page = _page_released(
            engine, sweep_id, arm=arm, level=level, state=state, sort=sort, limit=limit,
            cursor=cursor, metric=metric, mode=mode,
        )  # fmt: skip
        items = [shown(i) | {"randomness": head.randomness} for i in page.items]
        return Page(items, page.next_cursor)
    sign = -1.0 if mode == "max" else 1.0
    missing = case((TrialResultRow.objective.is_(None), 1), else_=0)
    value = func.coalesce(TrialResultRow.objective * sign, 0.0)
    if sort == "number":
        cols: list[Any] = [Trial.arm, Trial.epsilon_budget, Trial.number, Trial.id]
    else:
        cols = [missing, value, Trial.id]
    key = decode_cursor(cursor, length=len(cols))
    # The kept model joins on its primary key: the page stays one query.
    stmt = (
        select(*_TRIAL_COLUMNS, *_RESULT_COLUMNS, *REF_COLUMNS)
        .outerjoin(TrialResultRow, TrialResultRow.trial_id == Trial.id)
        .outerjoin(ModelArtifact, ModelArtifact.trial_id == Trial.id)
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
    items = [shown(_row_record(r)) | {"randomness": head.randomness} for r in rows[:limit]]
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
    with Session(engine) as session:
        refs = model_refs(session, [rec["id"] for rec in records])
    items = []
    for rec in records:
        item = trial_item(by_id[rec["id"]], selected_only=True, model=refs.get(rec["id"]))
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
