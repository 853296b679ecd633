"""Checking pooled connections before use, only after they have sat idle.

SQLAlchemy's ``pool_pre_ping`` sends ``SELECT 1`` at *every* checkout, so that a connection
the server dropped (a restart, a failover, an idle timeout) is replaced before a statement
fails on it. On a busy server that is one extra network round trip per checkout: the API
checks a connection out two or three times per request, and the ledger once per charge, and
on PostgreSQL over loopback the round trip costs about as much CPU as the work it guards.
The API's read pool (:func:`sweeper.store.engine.make_read_engine`) uses this instead; the
writers keep ``pool_pre_ping``, because a ledger charge or a driver's write failing on a
dropped connection costs more than a read that the client retries.

:func:`ping_when_idle` keeps the guarantee where it matters: a connection is pinged at
checkout only if it has been back in the pool for at least ``idle_seconds``. A connection in
steady use is not pinged between uses a few milliseconds apart: the server dropping it in
that window is no likelier than dropping it in the middle of the statement that follows a
ping, which no ping guards against either. A connection that fails its ping is replaced, and
with it every connection the pool made before, exactly as ``pool_pre_ping`` does.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, event, exc

#: Seconds a pooled connection may sit idle and still be used without a ping first.
PING_AFTER_IDLE_S = 1.0

_IDLE_SINCE = "dpsweep_idle_since"


def ping_when_idle(engine: Engine, *, idle_seconds: float = PING_AFTER_IDLE_S) -> Engine:
    """Ping ``engine``'s pooled connections at checkout after ``idle_seconds`` in the pool.

    Args:
        engine: An engine created without ``pool_pre_ping`` (which would ping every time).
        idle_seconds: How long a connection may sit in the pool and be used unpinged.

    Returns:
        ``engine``, with the pool listeners installed.
    """
    dialect = engine.dialect

    def checkin(dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_IDLE_SINCE] = time.monotonic()

    def checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.pop(_IDLE_SINCE, None)
        # A connection never checked in is new: it was just made, so it needs no ping.
        if since is None or time.monotonic() - since < idle_seconds:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as err:
            if dialect.is_disconnect(err, dbapi_connection, None):
                # The pool discards this connection (and all made before it) and checks out
                # a fresh one, as pool_pre_ping does.
                raise exc.InvalidatePoolError() from err
            raise

    event.listen(engine, "checkin", checkin)
    event.listen(engine, "checkout", checkout)
    return engine
