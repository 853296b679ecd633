"""Wake-ups for the API's live streams (SSE): which sweeps have new events, without polling.

One :class:`EventHub` per API process. Streams register an :class:`asyncio.Event` per sweep
they follow (:meth:`EventHub.waiter`); the hub sets it when the sweep has new events, and the
stream then reads them from the database in order (``Last-Event-ID``: the number of the last
event it sent, counted in its sweep; never the table's global id, which would count other
tenants' events): the database stays the only record, so a lost notification delays an
event, never loses it. The hub learns of new events from:

* **PostgreSQL:** one connection per process that ``LISTEN``\\s on
  :data:`sweeper.store.notify.CHANNEL` (in a thread); writers notify in the transaction that
  commits the events (``pg_notify``, delivered on commit). After the connection is lost and
  re-established every stream is woken, as notifications may have been missed meanwhile.
* **Every backend, same process:** :func:`sweeper.store.notify.subscribe` (a create, a cancel,
  or a driver running in the API's process).
* **SQLite, other processes** (``dpsweep serve``'s scheduler is a child process): SQLite has
  no channel between processes, so a thread watches ``PRAGMA data_version`` of one connection
  (a counter in memory that changes when another connection commits: no table is read) while
  a stream is open, and on a change reads which sweeps got events since the last check (one
  indexed query for the whole process), waking only their streams.

Every stream still re-reads on its own every ``sse_fallback_seconds`` (a safety net for a
missed notification), and ends when its sweep ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.engine import make_url
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from sweeper.store import SweepEvent
from sweeper.store.notify import CHANNEL, subscribe
from sweeper.sweeps.events import read_numbered
from sweeper.sweeps.stored import TERMINAL_SWEEPS
from sweeper.sweeps.sweep_pages import check_sweep

TERMINAL = {s.value for s in TERMINAL_SWEEPS}

log = logging.getLogger("dpsweep.api.live")


class EventHub:
    """Fans notifications out to the asyncio events of the streams waiting on each sweep."""

    def __init__(self, engine: Engine, *, watch_seconds: float = 0.2) -> None:
        self._engine = engine
        self._watch_seconds = watch_seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._unsubscribe: Any = None
        self._streams = threading.Condition(self._lock)
        #: How many notifications woke a stream (tests and logs).
        self.delivered = 0

    # ----- lifecycle

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start listening (from the app's lifespan, on its event loop)."""
        self._loop = loop
        self._unsubscribe = subscribe(self.notify)
        dialect = self._engine.dialect.name
        target = self._listen_postgres if dialect == "postgresql" else self._watch_sqlite
        if dialect in ("postgresql", "sqlite"):
            t = threading.Thread(target=target, name=f"dpsweep-sse-{dialect}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop the listener threads (they exit within about a second)."""
        self._stop.set()
        with self._lock:
            self._streams.notify_all()
        if self._unsubscribe is not None:
            self._unsubscribe()
        for t in self._threads:
            t.join(timeout=5.0)

    # ----- streams

    @contextlib.contextmanager
    def waiter(self, sweep_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever ``sweep_id`` may have new events (clear it before reading)."""
        ev = asyncio.Event()
        with self._lock:
            self._waiters.setdefault(sweep_id, set()).add(ev)
            self._streams.notify_all()
        try:
            yield ev
        finally:
            with self._lock:
                group = self._waiters.get(sweep_id)
                if group is not None:
                    group.discard(ev)
                    if not group:
                        del self._waiters[sweep_id]

    def notify(self, sweep_ids: Iterable[str] | None) -> None:
        """Wake the streams of ``sweep_ids`` (None: every stream); thread-safe."""
        with self._lock:
            if sweep_ids is None:
                events = [e for group in self._waiters.values() for e in group]
            else:
                events = [e for s in set(sweep_ids) for e in self._waiters.get(s, ())]
        if events and self._loop is not None and not self._loop.is_closed():
            self.delivered += 1
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(_set_all, events)

    def _idle(self) -> bool:
        """Block while no stream is open; False once stopped."""
        with self._lock:
            while not self._waiters and not self._stop.is_set():
                self._streams.wait(timeout=1.0)
        return not self._stop.is_set()

    # ----- PostgreSQL: LISTEN

    def _listen_postgres(self) -> None:
        import psycopg  # deferred: psycopg, PostgreSQL only (a SQLite server never listens)

        url = make_url(self._engine.url).set(drivername="postgresql")
        dsn = url.render_as_string(hide_password=False)
        backoff = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    backoff = 0.5
                    # Missed while (re)connecting: let every stream read once.
                    self.notify(None)
                    while not self._stop.is_set():
                        batch = {n.payload for n in conn.notifies(timeout=1.0)}
                        if batch:
                            self.notify(batch)
            except Exception as exc:  # connection lost: the fallback reads cover the gap
                if self._stop.is_set():
                    return
                log.warning("SSE listener: %s; reconnecting in %.1f s", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    # ----- SQLite: PRAGMA data_version

    def _watch_sqlite(self) -> None:
        newest = select(func.max(SweepEvent.id))
        while self._idle():
            try:
                with self._engine.connect() as conn:
                    last = int(conn.execute(newest).scalar() or 0)
                    version = conn.exec_driver_sql("PRAGMA data_version").scalar()
                    conn.rollback()
                    while not self._stop.wait(self._watch_seconds):
                        now = conn.exec_driver_sql("PRAGMA data_version").scalar()
                        # No transaction left open: a snapshot would hide other commits.
                        conn.rollback()
                        if now == version:
                            if not self._waiters:
                                break  # no stream: stop watching until one opens
                            continue
                        version = now
                        rows = conn.execute(
                            select(SweepEvent.sweep_id, func.max(SweepEvent.id))
                            .where(SweepEvent.id > last)
                            .group_by(SweepEvent.sweep_id)
                        ).all()
                        conn.rollback()
                        if rows:
                            last = max(last, *(int(r[1]) for r in rows))
                            self.notify(r[0] for r in rows)
            except Exception as exc:  # e.g. the file is locked for long: fallback reads cover it
                if self._stop.is_set():
                    return
                log.warning("SSE watcher: %s", exc)
                self._stop.wait(1.0)
                self.notify(None)


def _set_all(events: list[asyncio.Event]) -> None:
    for e in events:
        e.set()


async def event_stream(
    request: Request, engine: Engine, settings: Any, viewer: Any, sweep_id: str, start: int
) -> AsyncIterator[str]:
    """The SSE body of ``GET /sweeps/{id}/events``: the sweep's events after its ``start``-th,
    read from the database whenever the app's :class:`EventHub` says there are new ones (and
    at least every ``sse_fallback_seconds``), until the sweep ends or the client leaves.

    Each event's SSE id is its number in the sweep (:mod:`sweeper.sweeps.events`)."""
    hub: EventHub = request.app.state.live
    # Woken by the hub when the sweep has new events (api.live: LISTEN/NOTIFY on
    # PostgreSQL), not by polling; the events themselves are read from the database in order,
    # and a slow fallback read covers a missed notification. ``row`` is the table id of the
    # last event sent: this stream's own cursor (the next read seeks to it instead of
    # counting the sweep's events again), never sent.
    last, quiet_since = start, time.monotonic()
    row: int | None = None
    yield "retry: 2000\n\n"
    with hub.waiter(sweep_id) as woken:
        while True:
            # Cleared before reading: a notification that arrives during the read wakes
            # the next wait at once.
            woken.clear()
            batch = await run_in_threadpool(
                read_numbered, engine, sweep_id, after=last, after_row=row
            )
            ended = False
            for e, row_id in batch:
                last, row = e.id, row_id
                yield f"id: {e.id}\nevent: {e.kind}\ndata: {json.dumps(e.data)}\n\n"
                if e.kind == "sweep" and e.data.get("state") in TERMINAL:
                    ended = True
            if ended:
                return
            if batch:
                quiet_since = time.monotonic()
                continue
            state, _ = await run_in_threadpool(check_sweep, engine, sweep_id, viewer)
            if state in TERMINAL:
                # Ended before this stream started (or its end event was already sent).
                more = await run_in_threadpool(
                    read_numbered, engine, sweep_id, after=last, after_row=row
                )
                if not more:
                    return
                continue
            if await request.is_disconnected():
                return
            now = time.monotonic()
            if now - quiet_since >= settings.sse_keepalive_seconds:
                quiet_since = now
                yield ": keep-alive\n\n"
            wait = min(
                settings.sse_fallback_seconds,
                settings.sse_keepalive_seconds - (time.monotonic() - quiet_since),
            )
            if not await _wait(woken, max(wait, 0.01), request):
                return


async def _wait(woken: asyncio.Event, seconds: float, request: Request) -> bool:
    """Wait until ``woken`` is set or ``seconds`` pass; False if the client went away (checked
    each second: the connection, not the database)."""
    deadline = time.monotonic() + seconds
    while not woken.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), timeout=min(left, 1.0))
        if not woken.is_set() and await request.is_disconnected():
            return False
    return True
