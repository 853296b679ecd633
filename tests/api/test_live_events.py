"""SSE from notifications, over real HTTP: an event committed by a writer reaches a connected
stream at once, without waiting for the stream's fallback read (PostgreSQL LISTEN/NOTIFY; on
SQLite the in-process notifier and the ``data_version`` watcher), and an event whose
notification is missed still arrives, by the fallback read."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy.orm import Session

from api.testing.server import SMALL_SPEC, Server, start_server
from sweeper.store import SweepEvent
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps import events
from sweeper.sweeps.create import create_sweep
from tests.conftest import fresh_postgres_database

SLOW = "30"  # seconds: a path that must NOT be what delivers the event
# An event woken by its notification arrives well within this, even with the suite's two
# processes loading both cores; the slow paths above would take 30 s.
WOKEN_WITHIN = 10.0


class Stream:
    """An SSE stream read in a thread; events arrive in :attr:`events` with their time."""

    def __init__(self, server: Server, token: str, sweep_id: str) -> None:
        self.events: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self.opened = threading.Event()
        self._client = server.client(token)
        self._thread = threading.Thread(target=self._run, args=(sweep_id,), daemon=True)
        self._thread.start()
        assert self.opened.wait(30), "the stream did not open"

    def _run(self, sweep_id: str) -> None:
        with self._client.stream("GET", f"/api/v1/sweeps/{sweep_id}/events", timeout=120) as r:
            assert r.status_code == 200
            self.opened.set()
            cur: dict[str, str] = {}
            try:
                for line in r.iter_lines():
                    if line == "":
                        if "data" in cur:
                            item = {
                                "id": int(cur["id"]),
                                "event": cur["event"],
                                "data": json.loads(cur["data"]),
                            }
                            self.events.put((time.monotonic(), item))
                        cur = {}
                    elif not line.startswith(":"):
                        key, _, value = line.partition(":")
                        cur[key] = value[1:] if value.startswith(" ") else value
            except httpx.HTTPError:
                pass  # closed by the test

    def next(self, timeout: float = 20.0) -> tuple[float, dict[str, Any]]:
        return self.events.get(timeout=timeout)

    def close(self) -> None:
        self._client.close()


@pytest.fixture
def streams() -> Iterator[list[Stream]]:
    """Streams to close at the end (an open stream would hold up the server's shutdown)."""
    opened: list[Stream] = []
    yield opened
    for s in opened:
        s.close()


@pytest.fixture
def sweep_db(tmp_path: Path) -> Iterator[tuple[str, str]]:
    url = f"sqlite:///{tmp_path}/live.db"
    upgrade(url)
    yield url, _create(url)


def _create(url: str) -> str:
    engine = make_engine(url)
    try:
        return create_sweep(engine, yaml.safe_load(SMALL_SPEC), owner="ada")
    finally:
        engine.dispose()


def _emit(url: str, sweep_id: str, step: int, *, notify: bool = True) -> float:
    """Commit a metric event from this process (another process than the server's); the time
    of the commit. ``notify=False`` writes the row without :func:`events.emit` (a missed
    notification)."""
    engine = make_engine(url)
    try:
        data = {"trial": "t", "step": step, "values": {"accuracy": 0.5}}
        with Session(engine) as session, session.begin():
            events.lock_sweep(session, sweep_id)
            if notify:
                events.emit(session, sweep_id, events.METRIC, data)
            else:
                session.add(SweepEvent(sweep_id=sweep_id, kind=events.METRIC, data=data))
        return time.monotonic()
    finally:
        engine.dispose()


def _serve(url: str, tmp: Path, **env: str) -> Server:
    # Keep-alives each second: a closed test client is noticed (and the server stops) soon.
    env = {"SSE_KEEPALIVE_SECONDS": "1", **env}
    return start_server(url, tmp, scheduler=False, env={f"DPSWEEP_{k}": v for k, v in env.items()})


def _open(streams: list[Stream], server: Server, token: str, sweep_id: str) -> Stream:
    stream = Stream(server, token, sweep_id)
    streams.append(stream)
    return stream


def _first_event(stream: Stream) -> dict[str, Any]:
    _, first = stream.next()
    assert first["event"] == "sweep" and first["data"]["state"] == "pending"
    return first


def test_sqlite_writer_in_the_api_process_wakes_the_stream(
    sweep_db: tuple[str, str], tmp_path: Path, streams: list[Stream]
) -> None:
    url, sweep_id = sweep_db
    # Neither the watcher nor the fallback read could deliver within the test's window.
    server = _serve(url, tmp_path, SSE_POLL_SECONDS=SLOW, SSE_FALLBACK_SECONDS=SLOW)
    try:
        token = server.token("ada")
        stream = _open(streams, server, token, sweep_id)
        _first_event(stream)
        time.sleep(0.5)  # the stream is waiting now
        with server.client(token) as c:
            r = c.post(f"/api/v1/sweeps/{sweep_id}/cancel")
            assert r.status_code == 200, r.text
        done = time.monotonic()
        at, ev = stream.next()
        assert at - done < WOKEN_WITHIN
        while ev["event"] != "sweep":  # its trials' cancels, then the sweep's
            assert ev["event"] == "trial" and ev["data"]["state"] == "cancelled"
            _, ev = stream.next()
        assert ev["data"]["state"] == "cancelled"
    finally:
        for s in streams:
            s.close()
        server.stop()


def test_sqlite_writer_in_another_process_is_seen_by_the_watcher(
    sweep_db: tuple[str, str], tmp_path: Path, streams: list[Stream]
) -> None:
    url, sweep_id = sweep_db
    server = _serve(url, tmp_path, SSE_POLL_SECONDS="0.1", SSE_FALLBACK_SECONDS=SLOW)
    try:
        stream = _open(streams, server, server.token("ada"), sweep_id)
        first = _first_event(stream)
        time.sleep(0.5)
        for step in (1, 2):
            committed = _emit(url, sweep_id, step)
            at, ev = stream.next()
            assert ev["event"] == "metric" and ev["data"]["step"] == step
            assert at - committed < WOKEN_WITHIN
            assert ev["id"] > first["id"]
    finally:
        for s in streams:
            s.close()
        server.stop()


def test_a_missed_notification_is_read_by_the_fallback(
    sweep_db: tuple[str, str], tmp_path: Path, streams: list[Stream]
) -> None:
    url, sweep_id = sweep_db
    server = _serve(url, tmp_path, SSE_POLL_SECONDS=SLOW, SSE_FALLBACK_SECONDS="1")
    try:
        stream = _open(streams, server, server.token("ada"), sweep_id)
        _first_event(stream)
        # Written without a notification, and none of the watcher's checks comes in time.
        _emit(url, sweep_id, 1, notify=False)
        _emit(url, sweep_id, 2, notify=False)
        got = [stream.next(timeout=15)[1]["data"]["step"] for _ in range(2)]
        assert got == [1, 2]
    finally:
        for s in streams:
            s.close()
        server.stop()


def test_postgres_notify_wakes_the_stream(
    postgres_url: str, tmp_path: Path, streams: list[Stream]
) -> None:
    url = fresh_postgres_database(postgres_url, "live-events")
    upgrade(url)
    sweep_id = _create(url)
    server = _serve(url, tmp_path, SSE_FALLBACK_SECONDS=SLOW)
    try:
        token = server.token("ada")
        stream = _open(streams, server, token, sweep_id)
        _first_event(stream)
        time.sleep(0.5)  # LISTEN is on by now
        for step in (1, 2, 3):
            committed = _emit(url, sweep_id, step)
            at, ev = stream.next()
            assert ev["data"]["step"] == step
            assert at - committed < WOKEN_WITHIN
        # A notification missed (written without one): the fallback is 30 s here, so a
        # later notified event wakes the stream, which reads both, in order, by id.
        _emit(url, sweep_id, 4, notify=False)
        _emit(url, sweep_id, 5)
        assert [stream.next()[1]["data"]["step"] for _ in range(2)] == [4, 5]
        # The cancel (in the API process) ends the stream.
        with server.client(token) as c:
            assert c.post(f"/api/v1/sweeps/{sweep_id}/cancel").status_code == 200
        ev = stream.next()[1]
        while ev["event"] != "sweep":
            ev = stream.next()[1]
        assert ev["data"]["state"] == "cancelled"
    finally:
        for s in streams:
            s.close()
        server.stop()
