"""Event streams wake on commits, not on a poll: PostgreSQL LISTEN/NOTIFY across processes,
in-process notifications on SQLite, and nothing lost when a notification never comes.

Every server here polls only every 30 s (``DPSWEEP_SSE_POLL_SECONDS`` and
``DPSWEEP_SSE_FALLBACK_SECONDS``), so an event that arrives within seconds was pushed.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

from api.testing.server import Server, start_server
from sweeper.store import SweepEvent
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.events import TRIAL, emit, lock_sweep
from tests.conftest import fresh_postgres_database

SLOW_POLL = {"DPSWEEP_SSE_POLL_SECONDS": "30", "DPSWEEP_SSE_FALLBACK_SECONDS": "30"}
PROMPT_S = 5.0  # far below the 30 s poll, with room for a loaded CI machine

SPEC = {
    "name": "sse",
    "dataset": {"name": "digits"},
    "model": {"name": "logreg"},
    "training": {"steps": 4, "batch_size": 64, "eval_every": 2},
    "privacy": {"budgets": [1], "delta": 1e-5, "accounting": "basic"},
    "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
}


class Stream:
    """An SSE stream read in a thread: (arrival time, event) pairs on a queue."""

    def __init__(self, client: httpx.Client, path: str) -> None:
        self.client = client
        self.events: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(client, path), daemon=True)
        self._thread.start()

    def _read(self, client: httpx.Client, path: str) -> None:
        with contextlib.suppress(httpx.HTTPError), client.stream("GET", path, timeout=120) as r:
            assert r.status_code == 200
            cur: dict[str, str] = {}
            for line in r.iter_lines():
                if line == "":
                    if "data" in cur:
                        event = {"id": int(cur["id"]), "event": cur["event"]}
                        event["data"] = json.loads(cur["data"])
                        self.events.put((time.monotonic(), event))
                    cur = {}
                elif not line.startswith(":"):
                    key, _, value = line.partition(":")
                    cur[key] = value[1:] if value.startswith(" ") else value

    def close(self) -> None:
        """Disconnect: the server ends the stream at once (no wait for its next poll)."""
        self.client.close()
        self._thread.join(timeout=10)

    def next(self, timeout: float) -> tuple[float, dict[str, Any]]:
        return self.events.get(timeout=timeout)


def _serve(url: str, tmp_path: Path) -> Server:
    upgrade(url)
    return start_server(url, tmp_path, scheduler=False, env=SLOW_POLL)


def _stop(server: Server, stream: Stream | None) -> None:
    t0 = time.monotonic()
    if stream is not None:
        stream.close()
    server.stop()
    # The open stream did not hold the shutdown up until its 30 s poll.
    assert time.monotonic() - t0 < 20


def _submit(server: Server) -> tuple[httpx.Client, str, Stream]:
    client = server.client(server.token("ada"))
    r = client.post("/api/v1/sweeps", json=SPEC)
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    stream = Stream(server.client(server.token("ada")), f"/api/v1/sweeps/{sweep_id}/events")
    _, first = stream.next(timeout=30)  # the stored "pending" event, read at once
    assert first["event"] == "sweep" and first["data"]["state"] == "pending"
    time.sleep(0.5)  # the stream is now waiting for a wake-up
    return client, sweep_id, stream


def _emit_elsewhere(url: str, sweep_id: str, marker: str, *, notify: bool = True) -> float:
    """Commit an event from this process (another process than the server's)."""
    engine = make_engine(url)
    try:
        with Session(engine) as session, session.begin():
            lock_sweep(session, sweep_id)
            if notify:
                emit(session, sweep_id, TRIAL, {"marker": marker})
            else:  # a writer that never notifies (or a notification lost on the way)
                session.add(SweepEvent(sweep_id=sweep_id, kind=TRIAL, data={"marker": marker}))
        return time.monotonic()
    finally:
        engine.dispose()


def test_postgresql_notifies_streams_across_processes_and_loses_nothing(
    postgres_url: str, tmp_path: Path
) -> None:
    url = fresh_postgres_database(postgres_url, str(tmp_path))
    server, stream = _serve(url, tmp_path), None
    try:
        _, sweep_id, stream = _submit(server)
        # An unnotified event is not pushed...
        _emit_elsewhere(url, sweep_id, "silent", notify=False)
        with pytest.raises(queue.Empty):
            stream.next(timeout=2.0)
        # ...but the next notified one wakes the stream, which then reads both, in order.
        sent = _emit_elsewhere(url, sweep_id, "loud")
        arrived, first = stream.next(timeout=PROMPT_S)
        _, second = stream.next(timeout=PROMPT_S)
        assert arrived - sent < PROMPT_S
        assert [first["data"]["marker"], second["data"]["marker"]] == ["silent", "loud"]
        assert first["id"] < second["id"]
    finally:
        _stop(server, stream)


def test_sqlite_streams_wake_on_commits_in_the_server_and_elsewhere(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sse.db'}"
    server, stream = _serve(url, tmp_path), None
    try:
        client, sweep_id, stream = _submit(server)
        # A commit by another process: the server's change-counter watch polls every 30 s
        # here, so it arrives by the fallback only; a commit in the server itself (a cancel)
        # wakes the stream at once, and the stream then reads both.
        _emit_elsewhere(url, sweep_id, "elsewhere")
        sent = time.monotonic()
        r = client.post(f"/api/v1/sweeps/{sweep_id}/cancel")
        assert r.status_code == 200, r.text
        got = [stream.next(timeout=PROMPT_S)]
        while got[-1][1]["event"] != "sweep":  # the cancelled trial, then the sweep's end
            got.append(stream.next(timeout=PROMPT_S))
        assert got[-1][0] - sent < PROMPT_S
        assert got[0][1]["data"]["marker"] == "elsewhere"
        assert got[-1][1]["data"]["state"] == "cancelled"
    finally:
        _stop(server, stream)


def test_sqlite_change_counter_wakes_streams_for_other_processes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sse.db'}"
    upgrade(url)
    server = start_server(
        url,
        tmp_path,
        scheduler=False,
        env={"DPSWEEP_SSE_POLL_SECONDS": "0.2", "DPSWEEP_SSE_FALLBACK_SECONDS": "30"},
    )
    stream = None
    try:
        _, sweep_id, stream = _submit(server)
        sent = _emit_elsewhere(url, sweep_id, "elsewhere")
        arrived, event = stream.next(timeout=PROMPT_S)
        assert event["data"]["marker"] == "elsewhere" and arrived - sent < PROMPT_S
    finally:
        _stop(server, stream)
