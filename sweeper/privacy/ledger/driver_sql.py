"""Core statements compiled once and run on the driver's cursor: the hot path's executor.

A ledger charge is a handful of tiny statements whose cost is mostly SQLAlchemy's per-execute
machinery (about 25 µs each here, against 2 µs on the sqlite3 cursor) plus, on PostgreSQL, one
network round trip each. This module keeps what SQLAlchemy is good at (the SQL text, compiled
per dialect from the same Core statements; the column types' own bind and result processors,
so amounts are stored exactly as :class:`~sweeper.store.types.ExactDecimal` stores them;
connections and transactions, taken from the operation's :class:`~sqlalchemy.engine.Connection`)
and runs the compiled SQL on the DBAPI cursor of that connection, inside its transaction.

Driver errors are re-raised as SQLAlchemy's (:class:`~sqlalchemy.exc.DBAPIError` and its
subclasses such as :class:`~sqlalchemy.exc.IntegrityError`), as if SQLAlchemy had run them.

On PostgreSQL with psycopg 3, a batch is one libpq pipeline, one round trip
(:mod:`~sweeper.privacy.ledger.driver_pq`); the operation's last batch carries its ``COMMIT``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from threading import Lock
from typing import Any

from sqlalchemy import Connection, Dialect, Select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import Executable

from sweeper.privacy.ledger import driver_pq
from sweeper.privacy.ledger.driver_pq import Numbered, numbered, run_pipeline

__all__ = ["DriverStatement", "run", "touched"]

_Processor = Callable[[Any], Any] | None


def _key(dialect: Dialect) -> tuple[Any, ...]:
    # What the SQL text and the conversions depend on: the database, the driver (its
    # parameter style) and the server's version (what SQL it supports).
    return (dialect.name, dialect.driver, dialect.paramstyle, dialect.server_version_info)


@dataclass(frozen=True)
class _Compiled:
    """One statement's SQL for one dialect, and how its parameters convert."""

    sql: str
    names: tuple[str, ...]
    positional: bool
    binds: tuple[_Processor, ...]


class DriverStatement:
    """A Core statement compiled once per dialect and run on the DBAPI cursor.

    Args:
        stmt: The statement, every parameter a named :func:`~sqlalchemy.sql.bindparam`.
    """

    def __init__(self, stmt: Executable) -> None:
        self._stmt = stmt
        self._compiled: dict[tuple[Any, ...], _Compiled] = {}
        self._results: dict[tuple[Any, ...], tuple[_Processor, ...]] = {}
        self._returns_rows: dict[tuple[Any, ...], bool] = {}
        self._numbered: dict[tuple[Any, ...], Numbered] = {}
        self._lock = Lock()

    @property
    def statement(self) -> Any:
        """The Core statement."""
        return self._stmt

    def compiled(self, dialect: Dialect) -> _Compiled:
        """The statement compiled for ``dialect`` (once; later calls reuse it)."""
        found = self._compiled.get(_key(dialect))
        if found is not None:
            return found
        with self._lock:
            compiler = self._stmt.compile(dialect=dialect)  # type: ignore[attr-defined]
            assert isinstance(compiler, SQLCompiler)
            names = (
                tuple(compiler.positiontup or ()) if compiler.positional else tuple(compiler.binds)
            )
            binds = tuple(
                compiler.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
                for name in names
            )
            found = _Compiled(
                sql=compiler.string,
                names=names,
                positional=compiler.positional,
                binds=binds,
            )
            self._compiled[_key(dialect)] = found
        return found

    def parameters(self, dialect: Dialect, params: Mapping[str, Any]) -> Any:
        """``params`` converted for the driver (a tuple or a dict, as its style wants)."""
        c = self.compiled(dialect)
        values = [
            process(params[name]) if process is not None else params[name]
            for name, process in zip(c.names, c.binds, strict=True)
        ]
        return tuple(values) if c.positional else dict(zip(c.names, values, strict=True))

    def numbered(self, dialect: Dialect) -> Numbered:
        """The SQL with libpq's ``$n`` placeholders (psycopg's pipeline)."""
        found = self._numbered.get(_key(dialect))
        if found is None:
            found = self._numbered[_key(dialect)] = numbered(self.compiled(dialect).sql)
        return found

    def returns_rows(self, dialect: Dialect, cursor: Any) -> bool:
        """Whether the statement returns rows (a ``SELECT``, or ``RETURNING``), as ``cursor``
        (which ran it) says the first time: on psycopg, reading the description builds every
        column's description, too slow to do for every statement."""
        found = self._returns_rows.get(_key(dialect))
        if found is None:
            found = self._returns_rows[_key(dialect)] = cursor.description is not None
        return found

    def results(
        self, dialect: Dialect, type_codes: Callable[[], Sequence[Any]]
    ) -> tuple[_Processor, ...]:
        """The result processors of a ``SELECT``'s columns (some need the columns' type
        codes: ``type_codes`` is asked for them the first time for each dialect)."""
        found = self._results.get(_key(dialect))
        if found is None:
            selected = self._stmt.selected_columns  # type: ignore[attr-defined]
            found = tuple(
                column.type.dialect_impl(dialect).result_processor(dialect, code)
                for column, code in zip(selected, type_codes(), strict=True)
            )
            self._results[_key(dialect)] = found
        return found


@dataclass(frozen=True)
class Ran:
    """One statement of a batch, after it ran: what it returned, read at once (the next
    statement of the batch reuses the cursor)."""

    #: The first row as the driver returned it (statements that return rows), else ``None``.
    raw: tuple[Any, ...] | None
    #: A ``SELECT``'s result processors (else empty).
    results: tuple[_Processor, ...]
    #: The row id the driver reports (an ``INSERT`` without ``RETURNING`` on SQLite).
    lastrowid: int | None

    def first(self) -> tuple[Any, ...] | None:
        """A ``SELECT``'s first row, converted by its column types (``None`` if none)."""
        if self.raw is None:
            return None
        return tuple(
            process(value) if process is not None else value
            for value, process in zip(self.raw, self.results, strict=True)
        )

    def new_id(self) -> int:
        """The primary key an ``INSERT`` created."""
        if self.raw is not None:  # INSERT ... RETURNING id
            return int(self.raw[0])
        assert self.lastrowid is not None
        return int(self.lastrowid)


def _ran(statement: DriverStatement, dialect: Dialect, cursor: Any) -> Ran:
    if not statement.returns_rows(dialect, cursor):
        return Ran(None, (), getattr(cursor, "lastrowid", None))  # psycopg has no lastrowid
    raw = cursor.fetchone()
    if not isinstance(statement.statement, Select):
        return Ran(raw, (), None)
    return Ran(raw, statement.results(dialect, lambda: [d[1] for d in cursor.description]), None)


@contextmanager
def _driver_errors(conn: Connection, sql: str) -> Iterator[None]:
    dbapi = conn.dialect.loaded_dbapi
    try:
        yield
    except dbapi.Error as exc:
        raise DBAPIError.instance(sql, None, exc, dbapi.Error, dialect=conn.dialect) from exc


def touched(conn: Connection) -> None:
    """Say that a statement ran on ``conn`` through SQLAlchemy (not :func:`run`) inside an
    operation's transaction: on PostgreSQL, :func:`run`'s later batches in it then go
    unprepared (see :func:`~sweeper.privacy.ledger.driver_pq.touched`)."""
    if _pipelines(conn.dialect):
        driver_pq.touched(conn.connection.driver_connection)


def _pipelines(dialect: Dialect) -> bool:
    found = _PIPELINES.get(_key(dialect))
    if found is None:
        found = dialect.driver == "psycopg"
        if found:
            from psycopg import Pipeline  # deferred: psycopg, PostgreSQL only (driver_pq)

            found = Pipeline.is_supported()  # libpq 14 or later
        _PIPELINES[_key(dialect)] = found
    return found


_PIPELINES: dict[tuple[Any, ...], bool] = {}


def run(
    conn: Connection,
    batch: Sequence[tuple[DriverStatement, Mapping[str, Any]]],
    *,
    last: bool = False,
) -> list[Ran]:
    """Run statements, in order, on ``conn``'s driver connection, inside its transaction.

    Args:
        conn: A connection inside the operation's transaction.
        batch: The statements and their parameters (column names or bind names).
        last: The operation's last statements: on PostgreSQL (psycopg) its ``COMMIT`` goes
            with them, so nothing may run on ``conn`` afterwards (``conn``'s own commit then
            finds nothing to do). Elsewhere ``conn``'s commit commits.

    Returns:
        Each statement's result, in order.
    """
    dialect = conn.dialect
    raw = conn.connection.driver_connection
    assert raw is not None
    if _pipelines(dialect):
        return _run_pipelined(conn, raw, batch, last=last)
    ran: list[Ran] = []
    cursor = raw.cursor()
    for statement, params in batch:
        sql = statement.compiled(dialect).sql
        with _driver_errors(conn, sql):
            cursor.execute(sql, statement.parameters(dialect, params))
            ran.append(_ran(statement, dialect, cursor))
    return ran


def _run_pipelined(
    conn: Connection,
    raw: Any,
    batch: Sequence[tuple[DriverStatement, Mapping[str, Any]]],
    *,
    last: bool,
) -> list[Ran]:
    dialect = conn.dialect
    # Converted before anything is sent: a value the types refuse fails with nothing sent.
    queued = [
        (statement.numbered(dialect), statement.parameters(dialect, params))
        for statement, params in batch
    ]
    sql = ";\n".join(statement.compiled(dialect).sql for statement, _ in batch)
    with _driver_errors(conn, sql):
        done = run_pipeline(raw, queued, commit=last, transaction=conn.get_transaction())
    ran: list[Ran] = []
    for (statement, _), (row, codes) in zip(batch, done, strict=True):
        if row is None or not isinstance(statement.statement, Select):
            ran.append(Ran(row, (), None))
        else:
            ran.append(Ran(row, statement.results(dialect, partial(tuple, codes)), None))
    return ran
