"""A sweep's event log: trial state changes and metric points, for live streams (SSE).

Writers (the runner, cancel, create) append events inside the transaction that makes the
change, so an event exists exactly when its change committed. Every such transaction locks the
sweep's row *first* (:func:`lock_sweep`): on PostgreSQL two writers of one sweep then commit in
the order they took ids from the sequence, so event ids grow in commit order within a sweep.
(SQLite serialises writers anyway.) Taking the lock first also keeps the lock order sweep →
trials everywhere.

Readers never see the table's ids: they are global (every tenant's events share one sequence),
so the gap between two of them would count what other sweeps did meanwhile. An event is shown
with its number in its own sweep instead (1, 2, ...: :attr:`Event.id`), and a stream resumes
after the ``n``-th event of the sweep (``Last-Event-ID``). Since ids grow in commit order within
a sweep, an event's number never changes, and a reader resuming after ``n`` never misses one.

Papernot–Steinke grids emit nothing per trial (no state changes, metric points or cancels):
the number of their runs is part of the privacy guarantee and must stay secret, and a stream of
per-run events would count it; only the sweep's own events (pending, running, its end) say how
it goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from sweeper.store import Sweep, SweepEvent, iso
from sweeper.store.notify import sweep_changed

SWEEP = "sweep"
TRIAL = "trial"
METRIC = "metric"


def lock_sweep(session: Session, sweep_id: str) -> None:
    """Lock the sweep's row for the rest of the transaction (a no-op on SQLite)."""
    session.execute(select(Sweep.id).where(Sweep.id == sweep_id).with_for_update())


def emit(
    session: Session,
    sweep_id: str,
    kind: str,
    data: dict[str, Any],
    *,
    trial_id: str | None = None,
) -> None:
    """Append an event to the current transaction (which must have called :func:`lock_sweep`
    before changing anything). Live streams are notified when it commits
    (:func:`sweeper.store.notify.sweep_changed`)."""
    session.add(SweepEvent(sweep_id=sweep_id, kind=kind, trial_id=trial_id, data=data))
    sweep_changed(session, sweep_id)


def trial_event(
    trial_id: str,
    *,
    arm: str,
    epsilon_budget: float,
    state: str,
    **extra: Any,
) -> dict[str, Any]:
    """The data of a trial state change."""
    return {
        "trial": trial_id,
        "arm": arm,
        "epsilon_budget": epsilon_budget,
        "state": state,
        **{k: v for k, v in extra.items() if v is not None},
    }


@dataclass(frozen=True)
class Event:
    """An event as readers see it."""

    id: int  # its number in its sweep (1 for the first), never the table's global id
    kind: str
    data: dict[str, Any]
    created_at: str | None


def read_numbered(
    engine: Engine,
    sweep_id: str,
    *,
    after: int = 0,
    after_row: int | None = None,
    limit: int = 500,
) -> list[tuple[Event, int]]:
    """The sweep's events after its ``after``-th, oldest first, each with its row's id.

    Args:
        after: How many of the sweep's events the reader has (its last event's number).
        after_row: The table id of that ``after``-th event, when known (a stream's own
            cursor, never shown): the read then starts from it instead of counting ``after``
            events from the sweep's first.
        limit: At most this many.

    Returns:
        (event, row id) pairs; the row id is for the caller's next ``after_row`` only.
    """
    stmt = select(SweepEvent).where(SweepEvent.sweep_id == sweep_id).order_by(SweepEvent.id)
    if after_row is not None:
        stmt = stmt.where(SweepEvent.id > after_row)
    elif after:
        stmt = stmt.offset(after)
    with Session(engine) as session:
        rows = session.scalars(stmt.limit(limit))
        return [
            (Event(after + i, r.kind, {"sweep": sweep_id, **r.data}, iso(r.created_at)), r.id)
            for i, r in enumerate(rows, start=1)
        ]


def read_events(engine: Engine, sweep_id: str, *, after: int = 0, limit: int = 500) -> list[Event]:
    """The sweep's events after its ``after``-th (numbered in the sweep), oldest first."""
    return [e for e, _ in read_numbered(engine, sweep_id, after=after, limit=limit)]
