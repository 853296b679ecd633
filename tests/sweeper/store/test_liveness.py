"""Pooled PostgreSQL connections: pinged after idling, replaced when the server dropped them;
the API's read pool in autocommit, reading what writers committed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

from sweeper.store.engine import make_engine, make_read_engine
from sweeper.store.liveness import ping_when_idle
from tests.conftest import fresh_postgres_database

IDLE_S = 0.3


@pytest.fixture
def pg_url(postgres_url: str, tmp_path: Path) -> str:
    return fresh_postgres_database(postgres_url, str(tmp_path))


@pytest.fixture
def counted(pg_url: str) -> Iterator[tuple[Engine, list[int]]]:
    """An engine pinging after IDLE_S of idling, and the count of its pings so far."""
    engine = ping_when_idle(sa.create_engine(pg_url, pool_size=2), idle_seconds=IDLE_S)
    pings = [0]
    ping = engine.dialect.do_ping

    def counting(dbapi_connection: Any) -> bool:
        pings[0] += 1
        return ping(dbapi_connection)

    engine.dialect.do_ping = counting  # type: ignore[method-assign]
    yield engine, pings
    engine.dispose()


def _pids(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(url: str, pid: int) -> None:
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        assert c.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
    admin.dispose()


def test_connections_in_steady_use_are_not_pinged(counted: tuple[Engine, list[int]]) -> None:
    engine, pings = counted
    pids = {_pids(engine) for _ in range(50)}
    assert pings[0] == 0 and len(pids) == 1  # one pooled connection, reused 50 times
    time.sleep(IDLE_S * 1.5)
    assert _pids(engine) in pids and pings[0] == 1  # idle long enough: pinged once, alive


def test_a_connection_the_server_dropped_while_idle_is_replaced(
    counted: tuple[Engine, list[int]], pg_url: str
) -> None:
    engine, pings = counted
    first = _pids(engine)
    _terminate(pg_url, first)
    time.sleep(IDLE_S * 1.5)
    # The ping finds it dead: the pool replaces it and the statement runs on a new one.
    second = _pids(engine)
    assert second != first and pings[0] == 1


def test_the_read_pool_pings_idle_connections_and_writers_ping_every_checkout(
    pg_url: str,
) -> None:
    writer = make_engine(pg_url)
    reader = make_read_engine(writer)
    try:
        first = _pids(reader)
        _terminate(pg_url, first)
        time.sleep(1.5)  # past PING_AFTER_IDLE_S
        assert _pids(reader) != first
        # The writers' pool pre-pings: a connection killed a moment ago is replaced too.
        first = _pids(writer)
        _terminate(pg_url, first)
        assert _pids(writer) != first
    finally:
        reader.dispose()
        writer.dispose()


def test_the_read_pool_is_autocommit_and_sees_what_writers_commit(pg_url: str) -> None:
    writer = make_engine(pg_url)
    reader = make_read_engine(writer, pool_size=2)
    try:
        assert reader.pool is not writer.pool
        with reader.connect() as c:
            raw = c.connection.driver_connection
            assert raw is not None and raw.autocommit is True
            c.execute(sa.text("SELECT 1"))
            # No transaction was opened around it (no BEGIN/ROLLBACK round trips).
            assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with writer.begin() as c:
            c.execute(sa.text("CREATE TABLE t (x int)"))
            c.execute(sa.text("INSERT INTO t VALUES (7)"))
        with reader.connect() as c:
            assert c.execute(sa.text("SELECT x FROM t")).scalar_one() == 7
    finally:
        reader.dispose()
        writer.dispose()


def test_on_sqlite_the_read_engine_shares_the_writers_pool(tmp_path: Path) -> None:
    writer = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    reader = make_read_engine(writer)
    assert reader.pool is writer.pool
    writer.dispose()
