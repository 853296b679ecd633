"""PostgreSQL (psycopg 3): a batch of the hot path's statements in one libpq pipeline.

On PostgreSQL a charge used to be six network round trips (the pool's ping, ``BEGIN``, the
dataset's lock, the sweep's totals, the writes, ``COMMIT``), and much of its time went to
psycopg's per-execute machinery, the socket calls of each round trip, and the server parsing
and planning each statement. Here a batch goes out as one libpq pipeline (psycopg's
low-level :mod:`psycopg.pq` layer): ``BEGIN``, lock and totals read in one round trip, the
writes and ``COMMIT`` in the next, each statement prepared once per server session.

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

Prepared statements (``dpsweep_ledger_N``, never psycopg's names) can vanish from a session:
psycopg sends ``DEALLOCATE ALL`` when its own statement cache is cleared (a rollback after it
prepared something, ``ROLLBACK TO SAVEPOINT``, DDL). A pipeline that finds one gone
(SQLSTATE 26000) and had begun the transaction itself is rolled back and sent again,
prepared anew; a later batch of a transaction in which something else ran
(:func:`touched`) is sent unprepared; one that still finds a statement gone fails, closed
(the operation rolls back), and the next prepares anew.
"""

from __future__ import annotations

import re
import select
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Numbered", "numbered", "run_pipeline", "touched"]

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


@dataclass(eq=False)
class _Session:
    """What the ledger keeps for one psycopg connection (one server session)."""

    #: The connection's transformer (it caches its dumpers and loaders).
    transformer: Any
    #: The statements prepared on the server session: SQL -> name.
    prepared: dict[bytes, bytes] = field(default_factory=dict)
    #: The transaction (SQLAlchemy's) whose BEGIN went in one of our pipelines and in which
    #: nothing but our pipelines ran since: its prepared statements are still there.
    clean_in: object | None = None


_SESSIONS: weakref.WeakKeyDictionary[Any, _Session] = weakref.WeakKeyDictionary()
_SESSIONS_LOCK = threading.Lock()


def _session(raw: Any) -> _Session:
    found = _SESSIONS.get(raw)
    if found is None:
        # deferred: psycopg only on PostgreSQL; SQLite servers load this module (through
        # driver_sql) and never import psycopg (about 0.1 s)
        from psycopg.adapt import Transformer

        found = _Session(Transformer(raw))
        with _SESSIONS_LOCK:
            _SESSIONS[raw] = found
    return found


def touched(raw: Any) -> None:
    """Say that a statement not sent by :func:`run_pipeline` ran on ``raw`` in the current
    transaction. psycopg may then have dropped every prepared statement (it sends
    ``DEALLOCATE ALL`` when its own cache is cleared, after a ``ROLLBACK TO SAVEPOINT`` for
    one), so the transaction's later batches go unprepared."""
    found = _SESSIONS.get(raw)
    if found is not None:
        found.clean_in = None


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


@dataclass(frozen=True)
class _Deallocated:
    """What an attempt answers when a prepared statement of ours was gone from the server
    session: the server's error, and whether the attempt had begun the transaction. (A value,
    not an exception: errors of the server are dpsweep's tree or the driver's own.)"""

    error: Exception
    began: bool


def run_pipeline(
    raw: Any,
    statements: Sequence[tuple[Numbered, Mapping[str, Any]]],
    *,
    commit: bool,
    transaction: object,
) -> list[tuple[tuple[Any, ...] | None, tuple[int, ...]]]:
    """Run statements, in order, on psycopg connection ``raw`` in one pipeline (one round
    trip), in its transaction: begun first if the connection is idle, committed after them
    if ``commit``.

    Statements are prepared on the server session once (in the pipeline that first runs
    them) and then run by name, which spares the server their parsing and planning. Names are
    ``dpsweep_ledger_N``, never psycopg's. Should they be gone all the same (a
    ``DEALLOCATE ALL`` or ``DISCARD ALL`` on the session), a pipeline that began the
    transaction is rolled back and sent again, prepared anew (nothing else had run in that
    transaction); a later one fails (the operation rolls back), and the next prepares anew.

    Args:
        raw: The psycopg connection (SQLAlchemy's driver connection).
        statements: Each statement's SQL and its parameters by bind name, already through
            SQLAlchemy's bind processors.
        commit: Send ``COMMIT`` after the statements.
        transaction: SQLAlchemy's transaction on ``raw`` (what tells a later batch that it
            is in the transaction an earlier one began).

    Returns:
        For each statement, its first row (``None`` if none) and its columns' type codes
        (empty when it returns no rows).

    Raises:
        psycopg.Error: The first error the server reported (or a lost connection); nothing
            after it ran.
    """
    session = _session(raw)
    done = _attempt(raw, session, statements, commit=commit, transaction=transaction)
    if not isinstance(done, _Deallocated):
        return done
    session.prepared.clear()
    session.clean_in = None
    if not done.began:
        raise done.error
    # The failed pipeline began the transaction, which did nothing else: end it (psycopg's
    # rollback, which also resets its own prepared-statement cache) and send it again.
    raw.rollback()
    again = _attempt(raw, session, statements, commit=commit, transaction=transaction)
    if isinstance(again, _Deallocated):
        # Gone again at once: fail closed with the server's error; the next prepares anew.
        session.prepared.clear()
        session.clean_in = None
        raise again.error
    return again


def _attempt(
    raw: Any,
    session: _Session,
    statements: Sequence[tuple[Numbered, Mapping[str, Any]]],
    *,
    commit: bool,
    transaction: object,
) -> list[tuple[tuple[Any, ...] | None, tuple[int, ...]]] | _Deallocated:
    # deferred: psycopg, PostgreSQL only (see _session)
    from psycopg import errors
    from psycopg.pq import TransactionStatus  # deferred: psycopg, as above

    with raw.lock:
        pgconn = raw.pgconn
        began = pgconn.transaction_status == TransactionStatus.IDLE
        named = began or session.clean_in is transaction
        # Dumped before anything is queued: a value the driver refuses leaves nothing sent.
        dumped_all = _dump_parameters(session.transformer, statements)
        pgconn.enter_pipeline_mode()
        try:
            sent = _queue(
                raw, session, statements, dumped_all, began=began, named=named, commit=commit
            )
            pgconn.pipeline_sync()
            results = _until_sync(pgconn)
        except BaseException:
            # The first error stands (a lost connection, an interrupt); the connection is
            # closed if it cannot leave pipeline mode.
            _leave(raw, quiet=True)
            raise
        _leave(raw, quiet=False)
        rows, failed = _sort_results(session, sent, results, len(statements))
        if failed is not None:
            session.clean_in = None
            error = errors.error_from_result(failed, encoding=raw.info.encoding)
            if named and error.sqlstate == "26000":  # invalid_sql_statement_name
                return _Deallocated(error, began)
            raise error
        if commit:
            session.clean_in = None
        elif began:
            session.clean_in = transaction
        return _first_rows(session.transformer, rows)


def _dump_parameters(
    transformer: Any, statements: Sequence[tuple[Numbered, Mapping[str, Any]]]
) -> list[Any]:
    """Each statement's parameters, in its placeholders' order, dumped as text by the
    connection's transformer."""
    from psycopg.adapt import PyFormat  # deferred: psycopg, PostgreSQL only (see _session)

    dumped_all = []
    for sql, params in statements:
        values = [params[name] for name in sql.order]
        dumped_all.append(transformer.dump_sequence(values, [PyFormat.TEXT] * len(values)))
    return dumped_all


def _queue(
    raw: Any,
    session: _Session,
    statements: Sequence[tuple[Numbered, Mapping[str, Any]]],
    dumped_all: list[Any],
    *,
    began: bool,
    named: bool,
    commit: bool,
) -> list[tuple[str, Any]]:
    """Queue ``BEGIN`` (when ``began``), the statements and ``COMMIT`` (when ``commit``) on
    the pipeline: statements by name when ``named`` (each prepared first, in this pipeline, if
    the session has not got it yet), else unprepared.

    Returns:
        What each result will answer: ("begin"|"commit", None), ("prepare", (sql, name)) or
        ("run", index of the statement).
    """
    pgconn = raw.pgconn
    sent: list[tuple[str, Any]] = []
    if began:
        pgconn.send_query_params(_begin_command(raw), None)
        sent.append(("begin", None))
    for index, ((sql, _), dumped) in enumerate(zip(statements, dumped_all, strict=True)):
        if not named:
            pgconn.send_query_params(sql.sql, dumped)
            sent.append(("run", index))
            continue
        name = session.prepared.get(sql.sql)
        if name is None:
            pending = sum(kind == "prepare" for kind, _ in sent)
            name = f"dpsweep_ledger_{len(session.prepared) + pending}".encode()
            pgconn.send_prepare(name, sql.sql)
            sent.append(("prepare", (sql.sql, name)))
        pgconn.send_query_prepared(name, dumped)
        sent.append(("run", index))
    if commit:
        pgconn.send_query_params(b"COMMIT", None)
        sent.append(("commit", None))
    return sent


def _sort_results(
    session: _Session, sent: list[tuple[str, Any]], results: list[Any], n_statements: int
) -> tuple[list[Any], Any]:
    """Each statement's result, in order, and the pipeline's first failed result (or None);
    the statements the server prepared are recorded as the session's."""
    from psycopg.pq import ExecStatus  # deferred: psycopg, PostgreSQL only (see _session)

    rows: list[Any] = [None] * n_statements
    failed: Any = None
    for (kind, what), result in zip(sent, results, strict=True):
        if kind == "prepare" and result.status == ExecStatus.COMMAND_OK:
            session.prepared[what[0]] = what[1]
        elif kind == "run":
            rows[what] = result
        if failed is None and result.status == ExecStatus.FATAL_ERROR:
            failed = result
    return rows, failed


def _first_rows(
    transformer: Any, rows: list[Any]
) -> list[tuple[tuple[Any, ...] | None, tuple[int, ...]]]:
    """Each statement's first row (``None`` if none) and its columns' type codes (empty when
    it returns no rows), loaded by the connection's transformer."""
    from psycopg.pq import ExecStatus  # deferred: psycopg, PostgreSQL only (see _session)

    out: list[tuple[tuple[Any, ...] | None, tuple[int, ...]]] = []
    for result in rows:
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


def _leave(raw: Any, *, quiet: bool) -> None:
    """Take ``raw`` out of pipeline mode; if it cannot be (results left unread: it broke, or
    the wait was interrupted), close it, so that it is never used again."""
    from psycopg import OperationalError  # deferred: psycopg, PostgreSQL only (see _session)

    try:
        raw.pgconn.exit_pipeline_mode()
    except Exception as exc:
        raw.close()
        if not quiet:
            raise OperationalError("connection lost in a pipeline") from exc


def _until_sync(pgconn: Any) -> list[Any]:
    """Send what is queued and read every result up to the pipeline's sync point, waiting on
    the socket (``select`` releases the GIL; libpq's own wait would not here)."""
    # deferred: psycopg, PostgreSQL only (see _session)
    from psycopg import OperationalError
    from psycopg.pq import ConnStatus, ExecStatus  # deferred: psycopg, as above

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
