"""Database URL and engines: the SQLite set-up that makes ledger writes atomic.

Every engine of the project comes from :func:`make_engine`. SQLite URLs go through
:func:`create_ledger_engine`, which makes each write transaction take the database's write lock
before its first read:

* SQLite: the sqlite3 driver's own transaction handling is turned off
  (``isolation_level=None``) and ``BEGIN IMMEDIATE`` is emitted from SQLAlchemy's ``begin``
  event, as SQLAlchemy's SQLite documentation describes. ``BEGIN IMMEDIATE`` takes the write
  lock *before* the first read, so a second writer (thread or process) waits — up to the busy
  timeout — until the first commits, and then reads the new totals. With the driver's default
  (deferred) behaviour both writers could read the same totals before either wrote, and two
  sweeps racing for the last budget could both win. Engines from :func:`read_only` begin
  DEFERRED instead: a consistent snapshot without the write lock.
* PostgreSQL: the ledger reads the dataset row with ``SELECT ... FOR UPDATE``, which
  serialises writers on that row; the engine only pins READ COMMITTED isolation.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url

from dpsweep.errors import ConfigError
from sweeper.store.liveness import ping_when_idle

__all__ = [
    "DEFAULT_URL",
    "SQLITE_BUSY_TIMEOUT_S",
    "create_ledger_engine",
    "database_url",
    "display_url",
    "has_ledger_hooks",
    "make_engine",
    "read_only",
    "writable",
]

DEFAULT_URL = "sqlite:///dpsweep.db"

#: Seconds a writer waits for SQLite's write lock before giving up with "database is locked".
#: Ledger transactions are a handful of small statements, so a wait this long means something
#: else holds the lock; giving up then (and not running the trial) is the fail-closed answer.
SQLITE_BUSY_TIMEOUT_S = 30.0

# Execution option that marks a connection as read-only, so that it begins a deferred
# transaction instead of taking the write lock (see _sqlite_begin).
_READ_ONLY_OPTION = "dpsweep_ledger_read_only"


def database_url(url: str | None = None) -> str:
    """``url``, else ``DPSWEEP_DATABASE_URL``, else the embedded SQLite file ``./dpsweep.db``."""
    return url or os.environ.get("DPSWEEP_DATABASE_URL") or DEFAULT_URL


def display_url(url: str) -> str:
    """``url`` with its password masked, for logs and messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy can parse: show nothing of it
        return "<database url>"


def make_engine(url: str | None = None, **engine_kwargs: object) -> Engine:
    """An engine for the store; SQLite URLs get the ledger's locking set-up.

    Args:
        url: The database URL (default: :func:`database_url`).
        **engine_kwargs: For :func:`sqlalchemy.create_engine` (``pool_size``, say).
    """
    url = database_url(url)
    if url.startswith("sqlite"):
        return create_ledger_engine(url, **engine_kwargs)
    return create_engine(url, pool_pre_ping=True, **engine_kwargs)


def _sqlite_connect(dbapi_connection: Any, connection_record: Any) -> None:
    # Take transaction control away from the sqlite3 driver: in its legacy mode it emits BEGIN
    # only before INSERT/UPDATE/DELETE, so the SELECT that reads the totals would run outside
    # the transaction and two writers could both read the old totals. _sqlite_begin emits our
    # BEGIN instead; the driver still issues COMMIT/ROLLBACK correctly. (The busy timeout comes
    # from the driver's ``timeout`` argument, set in create_ledger_engine.)
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys = ON")
        # WAL lets readers (summaries, dashboards) read a snapshot while a writer holds the
        # write lock. synchronous stays at its default (FULL): a charge that was acknowledged
        # must survive a power cut, or the ledger would under-count spent budget.
        cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    # BEGIN IMMEDIATE takes SQLite's write lock before the first read, so the read-check-write
    # of reserve/charge/release runs with no other writer in between. A second writer blocks
    # here (for up to the busy timeout) and then reads the totals the first one committed.
    # Read-only operations take a deferred BEGIN: a consistent snapshot without the write lock.
    if conn.get_execution_options().get(_READ_ONLY_OPTION):
        conn.exec_driver_sql("BEGIN DEFERRED")
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def read_only(engine: Engine) -> Engine:
    """The same engine for reads only: on SQLite its transactions begin DEFERRED (a snapshot,
    without the write lock), so readers do not queue behind each other and behind writers."""
    return engine.execution_options(**{_READ_ONLY_OPTION: True})


def make_read_engine(engine: Engine, **engine_kwargs: object) -> Engine:
    """An engine for a server's reads of the same database as ``engine``.

    On SQLite this is :func:`read_only` of ``engine`` itself (DEFERRED transactions, which read
    one snapshot across their statements). On PostgreSQL it is a pool of its own whose
    connections are in autocommit: every read statement then runs without the ``BEGIN`` and
    ``ROLLBACK`` round trips that wrap it otherwise. This changes nothing a reader sees: under
    READ COMMITTED (:func:`create_ledger_engine`), each statement of a transaction takes its
    own snapshot anyway. Reads only: a write through this engine would commit statement by
    statement, so writers use ``engine``. Its connections are pinged only after idling
    (:func:`~sweeper.store.liveness.ping_when_idle`), not at every checkout: a read that
    fails on a connection the server dropped a moment ago is one retryable error, while the
    writers (the ledger, the drivers) keep ``pool_pre_ping``.

    Args:
        engine: The server's engine (its writes go there).
        **engine_kwargs: For :func:`sqlalchemy.create_engine` (``pool_size``, say).
    """
    if engine.dialect.name != "postgresql":
        return read_only(engine)
    reads = create_engine(engine.url, isolation_level="AUTOCOMMIT", **engine_kwargs)
    return read_only(ping_when_idle(reads))


def writable(engine: Engine) -> Engine:
    """The same engine for writes, also when ``engine`` came from :func:`read_only` (its
    SQLite transactions then begin IMMEDIATE again, taking the write lock before they read)."""
    return engine.execution_options(**{_READ_ONLY_OPTION: False})


def has_ledger_hooks(engine: Engine) -> bool:
    """Whether ``engine`` (a SQLite engine) came from :func:`create_ledger_engine`, so that its
    write transactions take the write lock before they read."""
    # An engine from engine.execution_options() (read_only, writable) shares its parent's
    # listeners; such engines may wrap each other.
    base = engine
    while hasattr(base, "_proxied"):
        base = base._proxied
    return event.contains(base, "connect", _sqlite_connect) and event.contains(
        base, "begin", _sqlite_begin
    )


def create_ledger_engine(url: str, **engine_kwargs: Any) -> Engine:
    """Create an engine that the ledger can use atomically.

    For SQLite it sets a busy timeout, turns off the sqlite3 driver's transaction handling and
    installs the ``BEGIN IMMEDIATE`` hook (see the module docstring). Only file databases are
    accepted: ``:memory:`` gives every connection its own private database, so threads would
    not share one ledger. Other URLs (PostgreSQL) get a plain engine; the ledger's
    ``SELECT ... FOR UPDATE`` does the locking there.

    Args:
        url: A SQLAlchemy database URL, e.g. ``sqlite:////var/lib/dpsweep/ledger.db``.
        **engine_kwargs: Passed on to :func:`sqlalchemy.create_engine` (e.g. ``pool_size``).

    Returns:
        The configured engine.

    Raises:
        ConfigError: If the URL cannot be parsed or names an in-memory SQLite database.
    """
    try:
        parsed = make_url(url)
    except Exception as exc:  # ArgumentError, ValueError: both mean a malformed URL
        raise ConfigError(f"invalid database URL {url!r}: {exc}", field="url") from exc
    if parsed.get_backend_name() == "postgresql":
        # READ COMMITTED (PostgreSQL's default, made explicit): after FOR UPDATE waits for the
        # previous holder of the dataset row, the following statements see what it committed.
        # Under REPEATABLE READ the same wait ends in a serialization error instead.
        engine_kwargs.setdefault("isolation_level", "READ COMMITTED")
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, **engine_kwargs)
    database = parsed.database or ""
    if database in ("", ":memory:") or parsed.query.get("mode") == "memory":
        raise ConfigError(
            "the budget ledger needs a SQLite *file* database (an in-memory database is private "
            "to one connection, so concurrent sweeps would not see each other's reservations)",
            field="url",
        )
    connect_args = dict(engine_kwargs.pop("connect_args", {}))
    connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_S)
    engine = create_engine(parsed, connect_args=connect_args, **engine_kwargs)
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine
