"""Change notifications for a sweep's events: who streams them hears of new ones at once.

Writers append a sweep's events inside the transaction that makes the change
(:func:`sweeper.sweeps.events.emit`), which calls :func:`notify_sweep`. Then:

* on PostgreSQL, ``pg_notify('dpsweep_sweep_events', <sweep id>)`` joins that transaction: the
  server delivers it to every ``LISTEN``-ing connection when (and only if) it commits, to any
  process (the API listens with one connection per process: ``api/notifications.py``);
* in this process, on either database, :data:`LOCAL` is told after the commit (listeners in
  the same process, e.g. an API that cancels a sweep, wake without a round trip).

SQLite has no cross-process notification; the API watches its change counter instead
(``PRAGMA data_version``, one cheap read per interval for all streams). Either way a
notification only says *look now*: readers then read the events from the database, the single
source of truth, by cursor, so a lost notification delays an event (until the stream's
fallback poll) but never loses it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

__all__ = ["CHANNEL", "LOCAL", "LocalHub", "notify_sweep"]

#: The PostgreSQL channel; the payload is the sweep's id.
CHANNEL = "dpsweep_sweep_events"

_PENDING = "dpsweep_notify_pending"


class LocalHub:
    """In-process subscribers to committed sweep changes (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[str], None]] = []

    def subscribe(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(sweep_id)`` after each commit that emitted events; returns the
        unsubscribe function."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def publish(self, sweep_id: str) -> None:
        """Tell every subscriber (errors in one do not stop the others or the writer)."""
        with self._lock:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            # A listener's bug must never fail a write that has already committed.
            with contextlib.suppress(Exception):
                callback(sweep_id)


LOCAL = LocalHub()


def notify_sweep(session: Session, sweep_id: str) -> None:
    """Notify listeners of ``sweep_id`` when the session's transaction commits.

    Once per sweep and transaction: on PostgreSQL one ``pg_notify`` (delivered on commit,
    dropped on rollback), and in this process a :data:`LOCAL` publish after the commit.
    """
    pending: set[str] | None = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = set()
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_soft_rollback", _after_rollback)
    if sweep_id in pending:
        return
    pending.add(sweep_id)
    if session.get_bind().dialect.name == "postgresql":
        with session.no_autoflush:  # the caller flushes its rows when it means to
            session.execute(select(func.pg_notify(CHANNEL, sweep_id)))


def _after_commit(session: Session) -> None:
    pending: set[str] = session.info.get(_PENDING) or set()
    sweeps = sorted(pending)
    pending.clear()
    for sweep_id in sweeps:
        LOCAL.publish(sweep_id)


def _after_rollback(session: Session, previous_transaction: object) -> None:
    pending: set[str] | None = session.info.get(_PENDING)
    if pending is not None:
        pending.clear()
