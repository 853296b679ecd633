"""Wake-ups for the API's event streams (SSE) when a sweep's events commit, without polling.

One :class:`SweepNotifier` per API process:

* PostgreSQL: a thread holds one ``LISTEN dpsweep_sweep_events`` connection; each notification
  (:func:`sweeper.store.notify.notify_sweep`, sent by the writer's transaction at commit, from
  any process) wakes the streams of that sweep.
* SQLite: no cross-process notifications exist, so a thread reads the database's change
  counter (``PRAGMA data_version``: no page reads) every ``sse_poll_seconds`` on one connection
  and wakes every stream when another connection committed; one cheap check per process
  instead of one query per stream.
* Both: commits in this process wake their sweep's streams at once (:data:`LOCAL`).

A wake-up only says *read now*: the stream reads its events from the database by cursor, so a
missed notification delays an event until the stream's fallback timeout, and never loses it.
Streams register before they read (:meth:`SweepNotifier.subscription`), so an event committed
between the read and the wait still wakes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from sweeper.store.notify import CHANNEL, LOCAL

__all__ = ["Subscription", "SweepNotifier"]

_ALL = "\0all"  # wake every stream


class Subscription:
    """One stream's registration: :meth:`wait` returns when its sweep may have new events."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()

    async def wait(self, timeout: float, *, unless: asyncio.Future[Any] | None = None) -> bool:
        """Wait for a wake-up (True), ``timeout`` seconds or ``unless`` finishing (False).

        ``unless`` is, e.g., a task that ends when the client disconnects: the stream then
        stops at once rather than at its next timeout.
        """
        woken = asyncio.ensure_future(self._event.wait())
        try:
            waits: set[asyncio.Future[Any]] = {woken} | ({unless} if unless else set())
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            return woken.done()
        finally:
            woken.cancel()
            self._event.clear()


class SweepNotifier:
    """Fans committed-event notifications out to the streams of this process."""

    def __init__(self, engine: Engine, *, poll_seconds: float) -> None:
        self._engine = engine
        self._poll = poll_seconds
        self._subs: dict[str, set[Subscription]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe: Any = None
        #: Whether changes by other processes reach this one as they commit.
        self.live = False

    # -- lifecycle (the app's lifespan) -------------------------------------------------------

    def start(self) -> None:
        """Start listening (call from the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._unsubscribe = LOCAL.subscribe(self._wake_threadsafe)
        target = {"postgresql": self._listen_postgres, "sqlite": self._watch_sqlite}.get(
            self._engine.dialect.name
        )
        if target is not None:
            self._thread = threading.Thread(target=target, name="dpsweep-notify", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- streams ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def subscription(self, sweep_id: str) -> Iterator[Subscription]:
        """Register a stream of ``sweep_id`` for as long as the block runs (event loop only)."""
        sub = Subscription()
        self._subs.setdefault(sweep_id, set()).add(sub)
        try:
            yield sub
        finally:
            subs = self._subs.get(sweep_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sweep_id]

    def _wake(self, sweep_id: str) -> None:
        targets = (
            [s for subs in self._subs.values() for s in subs]
            if sweep_id == _ALL
            else list(self._subs.get(sweep_id, ()))
        )
        for sub in targets:
            sub.wake()

    def _wake_threadsafe(self, sweep_id: str) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake, sweep_id)

    # -- sources ------------------------------------------------------------------------------

    def _listen_postgres(self) -> None:
        import psycopg

        dsn = self._engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while not self._stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.live = True
                    # Anything committed while we were not listening: every stream reads now.
                    self._wake_threadsafe(_ALL)
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            self._wake_threadsafe(note.payload)
            except Exception:  # the server went away: streams fall back to their timeout
                self.live = False
                self._stop.wait(1.0)
        self.live = False

    def _watch_sqlite(self) -> None:
        path = self._engine.url.database or ""
        try:
            uri = Path(path).resolve().as_uri() + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        except sqlite3.Error:
            return
        try:
            last = conn.execute("PRAGMA data_version").fetchone()[0]
            self.live = True
            while not self._stop.wait(self._poll):
                now = conn.execute("PRAGMA data_version").fetchone()[0]
                if now != last:
                    last = now
                    self._wake_threadsafe(_ALL)
        except sqlite3.Error:
            pass
        finally:
            self.live = False
            conn.close()
