"""Notifications that a sweep has new events, sent by the transaction that commits them.

Live streams (the API's SSE) wait for these instead of polling the event table; the database
stays the only record (a woken stream reads the new events by id), so a lost notification only
delays an event until the stream's slow fallback read, and never loses it.

* PostgreSQL: :func:`sweep_changed` runs ``SELECT pg_notify('dpsweep_sweep_events',
  '<sweep id>')`` in the writer's transaction; PostgreSQL delivers it to every ``LISTEN``-ing
  connection when (and only if) the transaction commits, in commit order.
* Every backend, in this process: once the session commits, the sweep ids are handed to the
  callbacks of :func:`subscribe` (the API process's listener, when the writer is that process:
  a create or a cancel, or tests and demos that run everything in one process). A rolled-back
  transaction announces nothing. SQLite has no channel between processes; the API watches the
  database file's ``PRAGMA data_version`` for writers in other processes (``api.live``).

This module is torch- and FastAPI-free; only :func:`sweeper.sweeps.events.emit` calls
:func:`sweep_changed`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from sqlalchemy import event, text
from sqlalchemy.orm import Session, SessionTransaction

#: The PostgreSQL channel; the payload is the sweep's id.
CHANNEL = "dpsweep_sweep_events"

_PENDING = "dpsweep_notify_pending"
_NOTIFY = text("SELECT pg_notify(:channel, :sweep)")
_lock = threading.Lock()
_subscribers: list[Callable[[Iterable[str]], None]] = []
log = logging.getLogger("dpsweep.notify")


def sweep_changed(session: Session, sweep_id: str) -> None:
    """Announce, on commit of ``session``'s transaction, that ``sweep_id`` has new events.

    Once per sweep and transaction (the set of sweeps is kept in ``session.info`` until the
    transaction ends).
    """
    pending: set[str] = session.info.setdefault(_PENDING, set())
    if sweep_id in pending:
        return
    pending.add(sweep_id)
    if session.get_bind().dialect.name == "postgresql":
        # Transactional: delivered on commit, dropped on rollback.
        session.execute(_NOTIFY, {"channel": CHANNEL, "sweep": sweep_id})


def subscribe(callback: Callable[[Iterable[str]], None]) -> Callable[[], None]:
    """Call ``callback(sweep_ids)`` after each commit in this process that announced sweeps
    (from the committing thread: keep it short and thread-safe). Returns the unsubscriber."""
    with _lock:
        _subscribers.append(callback)

    def unsubscribe() -> None:
        with _lock:
            if callback in _subscribers:
                _subscribers.remove(callback)

    return unsubscribe


def publish(sweep_ids: Iterable[str]) -> None:
    """Hand ``sweep_ids`` to this process's subscribers (a subscriber's error is logged)."""
    ids = list(sweep_ids)
    with _lock:
        subscribers = list(_subscribers)
    for callback in subscribers:
        try:
            callback(ids)
        except Exception:  # a listener's bug must not fail the writer's committed work
            log.exception("a sweep-event subscriber failed")


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    # Also fired when a savepoint is released: only the outermost commit counts.
    if session.in_nested_transaction():
        return
    pending = session.info.pop(_PENDING, None)
    if pending:
        publish(pending)


@event.listens_for(Session, "after_transaction_end")
def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    # Rolled back or closed without a commit: announce nothing, and forget (a later transaction
    # of this session must notify again).
    if transaction.parent is None:
        session.info.pop(_PENDING, None)
