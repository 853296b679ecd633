"""The charge's transaction in SQLAlchemy Core: the ledger's hot path.

A sweep charges once per trial, so a sweep of 10,000 trials commits 10,000 charges. Each is
one transaction of one read (the dataset's budget row, locked, joined with the sweep's running
totals) and three writes (the budget row, the entry, the totals), sent as Core statements
compiled once per dialect and sent on the DBAPI cursor of the transaction's connection
(:class:`_Prepared`): the ORM's unit of work, and even Core's per-execution machinery, cost
several times the commit itself (10,000 charges on SQLite: ORM 28 s, Core 7 s; the raw driver's
floor is 2.4 s). The parameters still go through each column type's own bind processor, and
the transaction is still SQLAlchemy's (BEGIN IMMEDIATE from the engine's hook, commit and
rollback by the ``engine.begin()`` block). The arithmetic is
the same exact :class:`~decimal.Decimal` arithmetic as every other ledger operation, done in
Python under the lock (amounts are stored as exact text on SQLite, so never summed in SQL).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import Connection, Dialect, Table, and_, bindparam, insert, select, update
from sqlalchemy.sql import ClauseElement

from dpsweep.errors import PrivacyError
from sweeper.privacy.ledger.amounts import add_exact, sub_exact
from sweeper.privacy.ledger.records import LedgerRecord, SweepBalance
from sweeper.privacy.ledger.rows import DatasetBudget, EntryKind, LedgerEntry, SweepTotals, utcnow
from sweeper.store.types import ExactDecimal

__all__ = ["BudgetAmounts", "ChargeRead", "move_to_spent", "read_for_charge", "write_charge"]

_BUDGETS = cast(Table, DatasetBudget.__table__)
_TOTALS = cast(Table, SweepTotals.__table__)
_ENTRIES = cast(Table, LedgerEntry.__table__)
_AMOUNT = ExactDecimal()

# FOR UPDATE OF both rows locks them on PostgreSQL until commit, serialising every writer of
# this dataset. Both must be locked: under READ COMMITTED, a statement that waited for a lock
# re-reads the latest version of the rows it locks but NOT of other joined rows, so a totals row
# read unlocked in the same statement could be stale (a lost update: the racing-charges test
# catches it). It is an inner join: a sweep with no totals row has no reservation, and the
# charge refuses it just as when the dataset has no budget row. SQLite omits the clause; the
# ledger engine's BEGIN IMMEDIATE already holds the database's write lock.
_READ = (
    select(
        _BUDGETS.c.id,
        _BUDGETS.c.epsilon_cap,
        _BUDGETS.c.delta_cap,
        _BUDGETS.c.epsilon_spent,
        _BUDGETS.c.delta_spent,
        _BUDGETS.c.epsilon_reserved,
        _BUDGETS.c.delta_reserved,
        _TOTALS.c.id.label("totals_id"),
        _TOTALS.c.epsilon_reserved.label("t_epsilon_reserved"),
        _TOTALS.c.delta_reserved.label("t_delta_reserved"),
        _TOTALS.c.epsilon_charged.label("t_epsilon_charged"),
        _TOTALS.c.delta_charged.label("t_delta_charged"),
        _TOTALS.c.epsilon_released.label("t_epsilon_released"),
        _TOTALS.c.delta_released.label("t_delta_released"),
        _TOTALS.c.reservations.label("t_reservations"),
    )
    .select_from(
        _BUDGETS.join(
            _TOTALS,
            and_(_TOTALS.c.dataset == _BUDGETS.c.dataset, _TOTALS.c.sweep_id == bindparam("sweep")),
        )
    )
    .where(_BUDGETS.c.dataset == bindparam("dataset"))
    .with_for_update(of=[_BUDGETS, _TOTALS])
)
_WRITE_BUDGET = (
    update(_BUDGETS)
    .where(_BUDGETS.c.id == bindparam("budget_id"))
    .values(
        {
            name: bindparam(name)
            for name in (
                "epsilon_reserved",
                "delta_reserved",
                "epsilon_spent",
                "delta_spent",
                "updated_at",
            )
        }
    )
)
_WRITE_TOTALS = (
    update(_TOTALS)
    .where(_TOTALS.c.id == bindparam("totals_id"))
    .values({name: bindparam(name) for name in ("epsilon_charged", "delta_charged")})
)
_WRITE_ENTRY = (
    insert(_ENTRIES)
    .values(
        {
            name: bindparam(name)
            for name in (
                "principal",
                "dataset",
                "sweep_id",
                "trial_id",
                "kind",
                "epsilon",
                "delta",
                "created_at",
                "note",
            )
        }
    )
    .returning(_ENTRIES.c.id)
)

_WRITE_ALL = _WRITE_ENTRY.add_cte(_WRITE_BUDGET.cte("charged_budget")).add_cte(
    _WRITE_TOTALS.cte("charged_totals")
)


class _Prepared:
    """A Core statement compiled once for a dialect, executed on the DBAPI cursor.

    Every parameter still passes through its column type's bind processor (exact decimal
    text on SQLite, aware UTC datetimes, the entry kind's stored value), as Core would do.
    """

    def __init__(self, statement: ClauseElement, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = compiled.string
        names = getattr(compiled, "positiontup", None)
        positional = getattr(compiled, "positional", False)
        self.order: list[str] | None = list(names) if positional and names else None
        self.processors: dict[str, Any] = {
            name: param.type._cached_bind_processor(dialect)
            for param, name in compiled.bind_names.items()  # type: ignore[attr-defined]
        }

    def params(self, values: dict[str, Any]) -> Any:
        """The driver's parameters for ``values`` (keyed by bind name)."""
        out = {
            n: (p(values[n]) if p is not None else values[n]) for n, p in self.processors.items()
        }
        return tuple(out[n] for n in self.order) if self.order is not None else out

    def run(self, conn: Connection, values: dict[str, Any]) -> Any:
        """Execute on ``conn``'s DBAPI connection, inside its transaction; the first row.

        (SQLAlchemy's documented escape hatch to the driver; no events or logging of
        SQLAlchemy run for these statements.)
        """
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(self.sql, self.params(values))
            return cursor.fetchone() if cursor.description is not None else None
        finally:
            cursor.close()


_PREPARED: dict[tuple[str, str], _Prepared] = {}


def _prepared(conn: Connection, name: str, statement: ClauseElement) -> _Prepared:
    # Keyed by dialect name: one engine's dialect compiles the same text as another's of the
    # same database kind (the statements use no dialect options beyond the database's own).
    key = (conn.dialect.name, name)
    found = _PREPARED.get(key)
    if found is None:
        found = _PREPARED[key] = _Prepared(statement, conn.dialect)
    return found


@dataclass(slots=True)
class BudgetAmounts:
    """A dataset's budget row as the charge reads and updates it (the caps check's input)."""

    dataset: str
    epsilon_cap: Decimal | None
    delta_cap: Decimal | None
    epsilon_spent: Decimal
    delta_spent: Decimal
    epsilon_reserved: Decimal
    delta_reserved: Decimal


class ChargeRead:
    """What a charge reads under the lock: the dataset's budget row and the sweep's balance."""

    __slots__ = ("balance", "budget", "budget_id", "totals_id")

    def __init__(self, row: Any, dataset: str, sweep_id: str, dialect: Dialect) -> None:
        # The driver's raw row: exact decimals come back as text on SQLite (Decimal on
        # PostgreSQL), converted by the column type's own result conversion.
        def cap(value: Any) -> Decimal | None:
            return _AMOUNT.process_result_value(value, dialect)

        def amount(value: Any) -> Decimal:
            found = cap(value)
            if found is None:  # NOT NULL columns: never read a missing amount as zero
                raise PrivacyError(f"ledger for {dataset!r} holds a NULL amount; refusing")
            return found

        (budget_id, e_cap, d_cap, e_spent, d_spent, e_res, d_res, totals_id, *t) = row
        self.budget_id: int = budget_id
        self.totals_id: int = totals_id
        self.budget = BudgetAmounts(
            dataset=dataset,
            epsilon_cap=cap(e_cap),
            delta_cap=cap(d_cap),
            epsilon_spent=amount(e_spent),
            delta_spent=amount(d_spent),
            epsilon_reserved=amount(e_res),
            delta_reserved=amount(d_res),
        )
        self.balance = SweepBalance(
            dataset=dataset,
            sweep_id=sweep_id,
            epsilon_reserved=amount(t[0]),
            delta_reserved=amount(t[1]),
            epsilon_charged=amount(t[2]),
            delta_charged=amount(t[3]),
            epsilon_released=amount(t[4]),
            delta_released=amount(t[5]),
            reservations=int(t[6]),
        )


def read_for_charge(conn: Connection, dataset: str, sweep_id: str) -> ChargeRead | None:
    """Lock the dataset's budget row and the sweep's totals row and read both.

    Returns:
        What was read, or None when either row is missing (the sweep never reserved).
    """
    row = _prepared(conn, "read", _READ).run(conn, {"dataset": dataset, "sweep": sweep_id})
    return None if row is None else ChargeRead(row, dataset, sweep_id, conn.dialect)


def write_charge(
    conn: Connection,
    read: ChargeRead,
    *,
    trial_id: str,
    epsilon: Decimal,
    delta: Decimal,
    note: str,
) -> LedgerRecord:
    """Move ``epsilon``/``delta`` from reserved to spent, in the entry and both totals.

    The caller has checked the sweep's outstanding reservation and the caps
    (``read.budget`` already holds the new totals) in this transaction, under the lock.
    """
    budget, balance = read.budget, read.balance
    now = utcnow()
    budget_values = {
        "budget_id": read.budget_id,
        "epsilon_reserved": budget.epsilon_reserved,
        "delta_reserved": budget.delta_reserved,
        "epsilon_spent": budget.epsilon_spent,
        "delta_spent": budget.delta_spent,
        "updated_at": now,
    }
    entry_values = {
        "principal": None,
        "dataset": balance.dataset,
        "sweep_id": balance.sweep_id,
        "trial_id": trial_id,
        "kind": EntryKind.CHARGE,
        "epsilon": epsilon,
        "delta": delta,
        "created_at": now,
        "note": note,
    }
    totals_values = {
        "totals_id": read.totals_id,
        "epsilon_charged": add_exact(balance.epsilon_charged, epsilon),
        "delta_charged": add_exact(balance.delta_charged, delta),
    }
    if conn.dialect.name == "postgresql":
        # One round trip for the three writes (data-modifying CTEs; all or none, like the
        # rest of the transaction): on a server, round trips are most of a charge's time.
        entry_id = _prepared(conn, "all", _WRITE_ALL).run(
            conn, budget_values | entry_values | totals_values
        )[0]
    else:
        _prepared(conn, "budget", _WRITE_BUDGET).run(conn, budget_values)
        entry_id = _prepared(conn, "entry", _WRITE_ENTRY).run(conn, entry_values)[0]
        _prepared(conn, "totals", _WRITE_TOTALS).run(conn, totals_values)
    return LedgerRecord(
        id=int(entry_id),
        dataset=balance.dataset,
        sweep_id=balance.sweep_id,
        trial_id=trial_id,
        kind=EntryKind.CHARGE,
        epsilon=epsilon,
        delta=delta,
        created_at=now,
        note=note,
    )


def move_to_spent(read: ChargeRead, *, epsilon: Decimal, delta: Decimal) -> None:
    """Update ``read.budget`` in memory: ``epsilon``/``delta`` from reserved to spent."""
    b = read.budget
    b.epsilon_reserved = sub_exact(b.epsilon_reserved, epsilon)
    b.delta_reserved = sub_exact(b.delta_reserved, delta)
    b.epsilon_spent = add_exact(b.epsilon_spent, epsilon)
    b.delta_spent = add_exact(b.delta_spent, delta)
