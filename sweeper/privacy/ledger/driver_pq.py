"""PostgreSQL (psycopg 3): a batch of the hot path's statements in one libpq pipeline.

On PostgreSQL a charge used to be six network round trips (the pool's ping, ``BEGIN``, the
dataset's lock, the sweep's totals, the writes, ``COMMIT``), and the client's share of its
time was mostly psycopg's per-execute machinery and the socket calls of each round trip.
Here a batch goes out as one libpq pipeline (psycopg's low-level :mod:`psycopg.pq` layer):
``BEGIN``, lock and totals read in one round trip, the writes and ``COMMIT`` in the next.

What stays as it was:

* the server still runs the statements one after another, each with its own READ COMMITTED
  snapshot, so the totals are read after the dataset's lock is granted (what the previous
  holder committed), exactly as when they were sent one by one;
* the SQL is SQLAlchemy's (compiled once per dialect, with its casts), placeholders
  renumbered ``$n``; parameters go through SQLAlchemy's bind processors, then through the
  connection's own :class:`psycopg.adapt.Transformer` (text format: the server parses them as
  the types the statement gives them), and rows come back through the same transformer;
* ``BEGIN`` is psycopg's own for this connection (isolation level, access mode), sent only
  when the connection is idle, as its cursor would; SQLAlchemy's commit or rollback of the
  operation's connection then ends whatever is left (psycopg skips a commit when the
  pipeline already committed, and rolls back a failed transaction);
* an error result raises psycopg's exception class for its SQLSTATE, after the rest of the
  pipeline was read back (the server skips what follows an error), so the caller turns it into
  SQLAlchemy's and the transaction rolls back; if the connection cannot leave pipeline mode
  (it broke), it is closed, so that SQLAlchemy invalidates it and never hands it out again;
* the connection's lock is held, as psycopg does, and waiting is done with ``select`` (the GIL
  released: other threads run while this one waits for the dataset's row lock).
"""

from __future__ import annotations

import re
import select
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Numbered", "numbered", "run_pipeline"]

_NAMED = re.compile(r"%\((\w+)\)s|%%")


@dataclass(frozen=True)
class Numbered:
    """SQL in libpq's style: ``$n`` placeholders, and the bind name each one takes."""

    sql: bytes
    order: tuple[str, ...]


def numbered(sql: str) -> Numbered:
    """``sql`` in psycopg's ``%(name)s`` style with ``$n`` placeholders instead (a name used
    twice takes the same number; ``%%`` is a literal ``%``)."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return Numbered(_NAMED.sub(number, sql).encode(), tuple(order))


# One transformer per psycopg connection (it caches its dumpers and loaders).
_TRANSFORMERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_TRANSFORMERS_LOCK = threading.Lock()


def _transformer(raw: Any) -> Any:
    found = _TRANSFORMERS.get(raw)
    if found is None:
        from psycopg.adapt import Transformer

        found = Transformer(raw)
        with _TRANSFORMERS_LOCK:
            _TRANSFORMERS[raw] = found
    return found


def _begin_command(raw: Any) -> bytes:
    # psycopg's BEGIN for this connection (what its cursor sends first), from its settings.
    parts = ["BEGIN"]
    if raw.isolation_level is not None:
        parts.append("ISOLATION LEVEL " + raw.isolation_level.name.replace("_", " "))
    if raw.read_only is not None:
        parts.append("READ ONLY" if raw.read_only else "READ WRITE")
    if raw.deferrable is not None:
        parts.append("DEFERRABLE" if raw.deferrable else "NOT DEFERRABLE")
    return " ".join(parts).encode()


def run_pipeline(
    raw: Any, statements: Sequence[tuple[Numbered, Mapping[str, Any]]], *, commit: bool
) -> list[tuple[tuple[Any, ...] | None, tuple[int, ...]]]:
    """Run statements, in order, on psycopg connection ``raw`` in one pipeline (one round
    trip), in its transaction: begun first if the connection is idle, committed after them
    if ``commit``.

    Args:
        raw: The psycopg connection (SQLAlchemy's driver connection).
        statements: Each statement's SQL and its parameters by bind name, already through
            SQLAlchemy's bind processors.
        commit: Send ``COMMIT`` after the statements.

    Returns:
        For each statement, its first row (``None`` if none) and its columns' type codes
        (empty when it returns no rows).

    Raises:
        psycopg.Error: The first error the server reported (or a lost connection); nothing
            after it ran.
    """
    from psycopg import errors
    from psycopg.adapt import PyFormat
    from psycopg.pq import ExecStatus, TransactionStatus

    transformer = _transformer(raw)
    out: list[tuple[tuple[Any, ...] | None, tuple[int, ...]]] = []
    with raw.lock:
        pgconn = raw.pgconn
        # The statements' results are at these positions (BEGIN's comes first if sent).
        first = 0
        pgconn.enter_pipeline_mode()
        try:
            if pgconn.transaction_status == TransactionStatus.IDLE:
                pgconn.send_query_params(_begin_command(raw), None)
                first = 1
            for sql, params in statements:
                values = [params[name] for name in sql.order]
                dumped = transformer.dump_sequence(values, [PyFormat.TEXT] * len(values))
                pgconn.send_query_params(sql.sql, dumped)
            if commit:
                pgconn.send_query_params(b"COMMIT", None)
            pgconn.pipeline_sync()
            results = _until_sync(pgconn)
        finally:
            try:
                pgconn.exit_pipeline_mode()
            except Exception as exc:
                # Results left unread (the connection broke, or an interrupt): unusable.
                raw.close()
                raise errors.OperationalError("connection lost in a pipeline") from exc
        failed = next((r for r in results if r.status == ExecStatus.FATAL_ERROR), None)
        if failed is not None:
            raise errors.error_from_result(failed, encoding=raw.info.encoding)
        for result in results[first : first + len(statements)]:
            if result.status != ExecStatus.TUPLES_OK:
                out.append((None, ()))
                continue
            codes = tuple(result.ftype(i) for i in range(result.nfields))
            if result.ntuples == 0:
                out.append((None, codes))
                continue
            transformer.set_pgresult(result)
            out.append((transformer.load_row(0, tuple), codes))
    return out


def _until_sync(pgconn: Any) -> list[Any]:
    """Send what is queued and read every result up to the pipeline's sync point, waiting on
    the socket (``select`` releases the GIL; libpq's own wait would not here)."""
    from psycopg import OperationalError
    from psycopg.pq import ConnStatus, ExecStatus

    while pgconn.flush():
        select.select([pgconn.socket], [pgconn.socket], [])
        pgconn.consume_input()
    results: list[Any] = []
    while True:
        while pgconn.is_busy():
            select.select([pgconn.socket], [], [])
            pgconn.consume_input()
        if pgconn.status != ConnStatus.OK:
            raise OperationalError(pgconn.get_error_message())
        result = pgconn.get_result()
        if result is None:  # the end of one statement's results
            continue
        if result.status == ExecStatus.PIPELINE_SYNC:
            return results
        results.append(result)
