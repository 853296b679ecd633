"""The hot path's SQL: prebuilt Core statements on the ledger's tables.

Reserve, charge and release run these on one :class:`~sqlalchemy.engine.Connection` inside one
transaction, without the ORM's session, identity map and flush: a charge is a locked read of
the dataset row, a read of its sweep's totals row, one insert and two updates. The statements
are built once with named parameters, so SQLAlchemy compiles each once and reuses it.

Amounts stay exact :class:`~decimal.Decimal` values: every sum is computed in Python with
:mod:`~sweeper.privacy.ledger.amounts` while the dataset's lock is held, and written as a
plain value (never ``SET x = x + :amount`` in SQL: SQLite stores amounts as text, see
:class:`~sweeper.store.types.ExactDecimal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import Connection, Table, bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sweeper.privacy.ledger.amounts import ZERO, add_exact
from sweeper.privacy.ledger.records import SweepBalance
from sweeper.privacy.ledger.rows import DatasetBudget, EntryKind, LedgerEntry, SweepTotals, utcnow

__all__ = [
    "BUDGETS",
    "ENTRIES",
    "TOTALS",
    "TOTAL_COLUMNS",
    "BudgetState",
    "insert_entry",
    "lock_budget_row",
    "read_totals",
    "store_budget",
    "write_totals",
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

#: The totals of a sweep, in :class:`~sweeper.privacy.ledger.records.SweepBalance`'s order.
TOTAL_COLUMNS = (
    "epsilon_reserved",
    "delta_reserved",
    "epsilon_charged",
    "delta_charged",
    "epsilon_released",
    "delta_released",
    "reservations",
)

_READ_TOTALS = select(*(TOTALS.c[name] for name in TOTAL_COLUMNS)).where(
    TOTALS.c.dataset == bindparam("k_dataset"), TOTALS.c.sweep_id == bindparam("k_sweep")
)

_NEW_TOTALS = TOTALS.insert()

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
        .values({name: bindparam(f"v_{name}", type_=TOTALS.c[name].type) for name in names})
    )


_UPDATE_TOTALS = {kind: _update_totals(kind) for kind in EntryKind}

_INSERT_ENTRY = ENTRIES.insert()


def lock_budget_row(conn: Connection, dataset: str, *, create: bool) -> BudgetState | None:
    """Lock and read a dataset's row (see ``_LOCK_BUDGET``); create it first if asked.

    Args:
        conn: A connection inside the operation's transaction.
        dataset: The dataset key.
        create: Create an uncapped row when there is none.

    Returns:
        The row's values, or ``None`` when there is no row and ``create`` is false.
    """
    row = conn.execute(_LOCK_BUDGET, {"k_dataset": dataset}).first()
    if row is None and create:
        # First use of this dataset. On PostgreSQL two transactions can get here at once (FOR
        # UPDATE locks no row that does not exist yet); the loser's INSERT fails on the unique
        # key once the winner commits, and it then locks the winner's row. The savepoint keeps
        # the transaction usable after that failure.
        now = utcnow()
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
        row = conn.execute(_LOCK_BUDGET, {"k_dataset": dataset}).one()
    if row is None:
        return None
    return BudgetState(*row)


def store_budget(conn: Connection, budget: BudgetState, now: datetime) -> None:
    """Write a dataset row's four totals back (the caller holds its lock)."""
    conn.execute(
        _STORE_BUDGET,
        {
            "k_id": budget.id,
            **{f"v_{name}": getattr(budget, name) for name in _AMOUNTS},
            "v_updated_at": now,
        },
    )


def read_totals(conn: Connection | Session, dataset: str, sweep_id: str) -> SweepBalance | None:
    """A sweep's running-totals row as a :class:`SweepBalance` (``None`` before its first
    entry). A session works too (the audit's checks read through one)."""
    row = conn.execute(_READ_TOTALS, {"k_dataset": dataset, "k_sweep": sweep_id}).first()
    if row is None:
        return None
    return SweepBalance(dataset, sweep_id, *row)


def write_totals(
    conn: Connection,
    old: SweepBalance | None,
    *,
    dataset: str,
    sweep_id: str,
    kind: EntryKind,
    epsilon: Decimal,
    delta: Decimal,
) -> None:
    """Add one entry's amounts to its sweep's running totals (exactly, in Python).

    Args:
        conn: A connection inside the operation's transaction (which holds the dataset's
            lock, so no other writer changes the row between ``old`` being read and this).
        old: The totals as read under that lock; ``None`` when the sweep has no row yet.
        dataset: The dataset key.
        sweep_id: The sweep.
        kind: The entry's kind (which totals it adds to).
        epsilon: The entry's ε.
        delta: The entry's δ.
    """
    column = _COLUMN_OF[kind]
    if old is None:
        values: dict[str, Any] = {name: ZERO for name in TOTAL_COLUMNS}
        values[f"epsilon_{column}"] = epsilon
        values[f"delta_{column}"] = delta
        values["reservations"] = int(kind is EntryKind.RESERVE)
        conn.execute(_NEW_TOTALS, {"dataset": dataset, "sweep_id": sweep_id, **values})
        return
    params: dict[str, Any] = {
        "k_dataset": dataset,
        "k_sweep": sweep_id,
        f"v_epsilon_{column}": add_exact(getattr(old, f"epsilon_{column}"), epsilon),
        f"v_delta_{column}": add_exact(getattr(old, f"delta_{column}"), delta),
    }
    if kind is EntryKind.RESERVE:
        params["v_reservations"] = old.reservations + 1
    conn.execute(_UPDATE_TOTALS[kind], params)


def insert_entry(conn: Connection, values: dict[str, Any]) -> int:
    """Insert one entry; its new id."""
    key = conn.execute(_INSERT_ENTRY, values).inserted_primary_key
    assert key is not None
    return int(key[0])
