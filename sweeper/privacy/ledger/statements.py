"""The hot path's SQL: prebuilt Core statements on the ledger's tables.

Reserve, charge and release run these on one :class:`~sqlalchemy.engine.Connection` inside one
transaction, without the ORM's session, identity map and flush: a charge is a locked read of
the dataset row, a read of its sweep's totals row, one insert and two updates (on PostgreSQL
the three writes are one statement). The statements are built once with named parameters and
compiled once per dialect (:mod:`~sweeper.privacy.ledger.driver_sql`).

Amounts stay exact :class:`~decimal.Decimal` values: every sum is computed in Python with
:mod:`~sweeper.privacy.ledger.amounts` while the dataset's lock is held, and written as a
plain value (never ``SET x = x + :amount`` in SQL: SQLite stores amounts as text, see
:class:`~sweeper.store.types.ExactDecimal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import Connection, Table, bindparam, exists, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sweeper.privacy.ledger.amounts import ZERO, add_exact
from sweeper.privacy.ledger.driver_sql import DriverStatement, run, touched
from sweeper.privacy.ledger.records import SweepBalance
from sweeper.privacy.ledger.rows import DatasetBudget, EntryKind, LedgerEntry, SweepTotals, utcnow

__all__ = [
    "BUDGETS",
    "ENTRIES",
    "TOTALS",
    "TOTAL_AMOUNTS",
    "TOTAL_COLUMNS",
    "BudgetState",
    "has_release",
    "lock_and_read",
    "read_totals",
    "write_operation",
]

BUDGETS = cast(Table, DatasetBudget.__table__)
ENTRIES = cast(Table, LedgerEntry.__table__)
TOTALS = cast(Table, SweepTotals.__table__)

_AMOUNTS = ("epsilon_spent", "delta_spent", "epsilon_reserved", "delta_reserved")


@dataclass
class BudgetState:
    """A dataset row's caps and totals, read under its lock and changed in Python.

    The same attribute names as :class:`~sweeper.privacy.ledger.rows.DatasetBudget`, so
    :meth:`~sweeper.privacy.ledger.core.LedgerCore._check_totals` checks either.
    """

    id: int
    dataset: str
    epsilon_cap: Decimal | None
    delta_cap: Decimal | None
    epsilon_spent: Decimal
    delta_spent: Decimal
    epsilon_reserved: Decimal
    delta_reserved: Decimal


# FOR UPDATE locks the dataset row on PostgreSQL until commit, serialising every writer of this
# dataset; SQLAlchemy omits it on SQLite, where BEGIN IMMEDIATE already holds the write lock.
# The sweep's totals are read by a second statement, after the lock is held: joined into this
# one, PostgreSQL (READ COMMITTED) would re-check only the locked row after waiting for it, and
# hand back the totals row as it was before the previous holder's commit.
_LOCK_BUDGET = (
    select(*(BUDGETS.c[name] for name in ("id", "dataset", "epsilon_cap", "delta_cap", *_AMOUNTS)))
    .where(BUDGETS.c.dataset == bindparam("k_dataset"))
    .with_for_update()
)

_NEW_BUDGET = BUDGETS.insert()

_STORE_BUDGET = (
    BUDGETS.update()
    .where(BUDGETS.c.id == bindparam("k_id"))
    .values(
        {
            **{name: bindparam(f"v_{name}", type_=BUDGETS.c[name].type) for name in _AMOUNTS},
            "updated_at": bindparam("v_updated_at", type_=BUDGETS.c.updated_at.type),
        }
    )
)

#: The exact amounts of a sweep's totals, in :class:`~sweeper.privacy.ledger.records.
#: SweepBalance`'s order.
TOTAL_AMOUNTS = (
    "epsilon_reserved",
    "delta_reserved",
    "epsilon_charged",
    "delta_charged",
    "epsilon_released",
    "delta_released",
)
#: Every column of a sweep's totals, in :class:`~sweeper.privacy.ledger.records.SweepBalance`'s
#: order.
TOTAL_COLUMNS = (*TOTAL_AMOUNTS, "reservations")

_READ_TOTALS = select(*(TOTALS.c[name] for name in TOTAL_COLUMNS)).where(
    TOTALS.c.dataset == bindparam("k_dataset"), TOTALS.c.sweep_id == bindparam("k_sweep")
)

_NEW_TOTALS = TOTALS.insert().values(
    {
        name: bindparam(f"t_{name}", type_=TOTALS.c[name].type)
        for name in ("dataset", "sweep_id", *TOTAL_COLUMNS)
    }
)

#: Which totals an entry of each kind adds to.
_COLUMN_OF = {
    EntryKind.RESERVE: "reserved",
    EntryKind.CHARGE: "charged",
    EntryKind.RELEASE: "released",
}


def _update_totals(kind: EntryKind) -> Any:
    names = [f"epsilon_{_COLUMN_OF[kind]}", f"delta_{_COLUMN_OF[kind]}"]
    if kind is EntryKind.RESERVE:
        names.append("reservations")
    return (
        TOTALS.update()
        .where(
            TOTALS.c.dataset == bindparam("k_dataset"), TOTALS.c.sweep_id == bindparam("k_sweep")
        )
        .values({name: bindparam(f"t_{name}", type_=TOTALS.c[name].type) for name in names})
    )


_UPDATE_TOTALS = {kind: _update_totals(kind) for kind in EntryKind}

_ENTRY_COLUMNS = (
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

_INSERT_ENTRY = ENTRIES.insert().values(
    {name: bindparam(f"e_{name}", type_=ENTRIES.c[name].type) for name in _ENTRY_COLUMNS}
)


# Whether a sweep has a release entry: the mark that it ended on this key. Read only when the
# totals cannot tell (see has_release), so the hot path stays one row whatever the number of
# the sweep's entries.
_RELEASED = select(
    exists().where(
        ENTRIES.c.dataset == bindparam("k_dataset"),
        ENTRIES.c.sweep_id == bindparam("k_sweep"),
        ENTRIES.c.kind == bindparam("k_kind", type_=ENTRIES.c.kind.type),
    )
)

# The same statements, run on the driver's cursor (see driver_sql).
_LOCK_BUDGET_D = DriverStatement(_LOCK_BUDGET)
_READ_TOTALS_D = DriverStatement(_READ_TOTALS)
_STORE_BUDGET_D = DriverStatement(_STORE_BUDGET)
_INSERT_ENTRY_D = DriverStatement(_INSERT_ENTRY)
_NEW_TOTALS_D = DriverStatement(_NEW_TOTALS)
_UPDATE_TOTALS_D = {kind: DriverStatement(stmt) for kind, stmt in _UPDATE_TOTALS.items()}
_RELEASED_D = DriverStatement(_RELEASED)


def lock_and_read(
    conn: Connection, dataset: str, sweep_id: str, *, create: bool
) -> tuple[BudgetState | None, SweepBalance | None]:
    """Lock and read a dataset's row (see ``_LOCK_BUDGET``), then read the sweep's totals.

    The totals are read by a statement of their own once the lock is held, so they are what
    earlier lock holders committed (see ``_LOCK_BUDGET``).

    Args:
        conn: A connection inside the operation's transaction.
        dataset: The dataset key.
        sweep_id: The sweep whose totals to read.
        create: Create an uncapped dataset row when there is none.

    Returns:
        The dataset row's values (``None`` when there is none and ``create`` is false) and
        the sweep's totals (``None`` before its first entry).
    """
    keys = {"k_dataset": dataset, "k_sweep": sweep_id}
    locked, totals = run(conn, [(_LOCK_BUDGET_D, keys), (_READ_TOTALS_D, keys)])
    row = locked.first()
    if row is None and create:
        _create_budget_row(conn, dataset)
        locked, totals = run(conn, [(_LOCK_BUDGET_D, keys), (_READ_TOTALS_D, keys)])
        row = locked.first()
        assert row is not None
    if row is None:
        return None, None
    amounts = totals.first()
    return BudgetState(*row), None if amounts is None else SweepBalance(dataset, sweep_id, *amounts)


def has_release(conn: Connection, dataset: str, sweep_id: str) -> bool:
    """Whether the sweep has a ``release`` entry on ``dataset``: it ended there.

    Run under the dataset's lock (after :func:`lock_and_read`), so a release committed by an
    earlier lock holder is seen, and none can commit before this operation does.

    Args:
        conn: A connection inside the operation's transaction.
        dataset: The dataset key.
        sweep_id: The sweep.
    """
    keys = {"k_dataset": dataset, "k_sweep": sweep_id, "k_kind": EntryKind.RELEASE}
    (found,) = run(conn, [(_RELEASED_D, keys)])
    row = found.first()
    return row is not None and bool(row[0])


def _create_budget_row(conn: Connection, dataset: str) -> None:
    # First use of this dataset. On PostgreSQL two transactions can get here at once (FOR
    # UPDATE locks no row that does not exist yet); the loser's INSERT fails on the unique key
    # once the winner commits, and it then locks the winner's row. The savepoint keeps the
    # transaction usable after that failure.
    now = utcnow()
    touched(conn)  # statements through SQLAlchemy, in the operation's transaction
    try:
        with conn.begin_nested():
            conn.execute(
                _NEW_BUDGET,
                {
                    "dataset": dataset,
                    **{name: ZERO for name in _AMOUNTS},
                    "created_at": now,
                    "updated_at": now,
                },
            )
    except IntegrityError:
        pass


def read_totals(conn: Connection | Session, dataset: str, sweep_id: str) -> SweepBalance | None:
    """A sweep's running-totals row as a :class:`SweepBalance` (``None`` before its first
    entry), read through SQLAlchemy (a session works too: the audit's checks use one)."""
    row = conn.execute(_READ_TOTALS, {"k_dataset": dataset, "k_sweep": sweep_id}).first()
    if row is None:
        return None
    return SweepBalance(dataset, sweep_id, *row)


def write_operation(
    conn: Connection,
    budget: BudgetState,
    old: SweepBalance | None,
    entry: dict[str, Any],
) -> int:
    """Write one operation: the dataset row's totals, the entry, and the sweep's totals with
    the entry's amounts added (exactly, in Python), and commit it: the operation's last work.
    One round trip on PostgreSQL, the commit included.

    Args:
        conn: A connection inside the operation's transaction (which holds the dataset's
            lock, so no other writer changed the rows since they were read).
        budget: The dataset row, with its new totals.
        old: The sweep's totals as read under that lock; ``None`` when it has no row yet.
        entry: The entry's columns (``_ENTRY_COLUMNS``); ``created_at`` also stamps the
            dataset row.

    Returns:
        The new entry's id.
    """
    kind: EntryKind = entry["kind"]
    epsilon: Decimal = entry["epsilon"]
    delta: Decimal = entry["delta"]
    dataset, sweep_id = budget.dataset, entry["sweep_id"]
    column = _COLUMN_OF[kind]
    totals: tuple[DriverStatement, dict[str, Any]]
    if old is None:
        values: dict[str, Any] = {f"t_{name}": ZERO for name in TOTAL_COLUMNS}
        values[f"t_epsilon_{column}"] = epsilon
        values[f"t_delta_{column}"] = delta
        values["t_reservations"] = int(kind is EntryKind.RESERVE)
        totals = (_NEW_TOTALS_D, {"t_dataset": dataset, "t_sweep_id": sweep_id, **values})
    else:
        params: dict[str, Any] = {
            "k_dataset": dataset,
            "k_sweep": sweep_id,
            f"t_epsilon_{column}": add_exact(getattr(old, f"epsilon_{column}"), epsilon),
            f"t_delta_{column}": add_exact(getattr(old, f"delta_{column}"), delta),
        }
        if kind is EntryKind.RESERVE:
            params["t_reservations"] = old.reservations + 1
        totals = (_UPDATE_TOTALS_D[kind], params)
    stored = {
        "k_id": budget.id,
        **{f"v_{name}": getattr(budget, name) for name in _AMOUNTS},
        "v_updated_at": entry["created_at"],
    }
    written = {f"e_{name}": value for name, value in entry.items()}
    if conn.dialect.name == "postgresql":
        # One statement: the two updates ride along as WITH clauses of the entry's INSERT.
        combined = _combined(totals[0])
        (inserted,) = run(conn, [(combined, {**stored, **written, **totals[1]})], last=True)
        return inserted.new_id()
    _, inserted, _ = run(
        conn, [(_STORE_BUDGET_D, stored), (_INSERT_ENTRY_D, written), totals], last=True
    )
    return inserted.new_id()


_COMBINED: dict[int, DriverStatement] = {}


def _combined(totals: DriverStatement) -> DriverStatement:
    """PostgreSQL: ``WITH budget AS (UPDATE ...), totals AS (UPDATE or INSERT ...) INSERT INTO
    entries ... RETURNING id``, the three writes of an operation in one statement (PostgreSQL
    runs every data-modifying WITH clause to completion, read or not)."""
    found = _COMBINED.get(id(totals))
    if found is None:
        stmt = (
            _INSERT_ENTRY.add_cte(_STORE_BUDGET.returning(BUDGETS.c.id).cte("stored_budget"))
            .add_cte(totals.statement.returning(TOTALS.c.id).cte("stored_totals"))
            .returning(ENTRIES.c.id)
        )
        found = _COMBINED[id(totals)] = DriverStatement(stmt)
    return found
