"""The ledger's engine, its transactions, and the steps every ledger operation shares."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

from sqlalchemy import Connection, Engine, Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from dpsweep.errors import ConfigError, PrivacyError
from sweeper.privacy.ledger.amounts import ZERO, add_exact
from sweeper.privacy.ledger.keys import dataset_label
from sweeper.privacy.ledger.records import LedgerRecord, SweepBalance
from sweeper.privacy.ledger.rows import DatasetBudget, EntryKind, LedgerEntry, utcnow
from sweeper.privacy.ledger.statements import BudgetState, read_totals, write_operation
from sweeper.store.engine import has_ledger_hooks, read_only

__all__ = ["LedgerCore"]


def _budget_row_stmt(dataset: str) -> Select[DatasetBudget]:
    # FOR UPDATE locks the dataset row on PostgreSQL until commit, serialising every writer of
    # this dataset; SQLAlchemy omits it on SQLite, where BEGIN IMMEDIATE already holds the lock.
    return select(DatasetBudget).where(DatasetBudget.dataset == dataset).with_for_update()


class LedgerCore:
    """The ledger's engine and transactions, and the steps its operations share.

    :class:`~sweeper.privacy.ledger.BudgetLedger` is this plus its operations (caps,
    reservations, moves between keys, reads), each group in a module of its own.

    Args:
        engine: An engine from :func:`~sweeper.store.engine.create_ledger_engine` (required
            for SQLite, whose atomicity depends on the ``BEGIN IMMEDIATE`` hook it installs).

    Raises:
        ConfigError: If ``engine`` is a SQLite engine without that configuration.
    """

    def __init__(self, engine: Engine) -> None:
        if engine.dialect.name == "sqlite" and not has_ledger_hooks(engine):
            # Without BEGIN IMMEDIATE two sweeps could both reserve the last budget: refuse.
            raise ConfigError(
                "this SQLite engine was not configured for the ledger; create it with "
                "sweeper.store.engine.create_ledger_engine(url) so reservations are atomic",
                field="engine",
            )
        self._engine = engine
        self._writer = sessionmaker(bind=engine, expire_on_commit=False)
        self._reader = sessionmaker(bind=read_only(engine), expire_on_commit=False)

    @property
    def engine(self) -> Engine:
        """The engine the ledger writes to."""
        return self._engine

    # -- transactions ------------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[Session]:
        # One transaction per operation: commit on success, roll back on any exception.
        with self._writer.begin() as session:
            yield session

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        # The hot path's transaction (reserve, charge, release): a bare connection, no ORM
        # session. On SQLite its BEGIN is BEGIN IMMEDIATE (the engine's hook), as for _write.
        with self._engine.begin() as conn:
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._reader.begin() as session:
            yield session

    @staticmethod
    def _lock_budget(session: Session, dataset: str, *, create: bool) -> DatasetBudget | None:
        budget = session.scalars(_budget_row_stmt(dataset)).one_or_none()
        if budget is not None or not create:
            return budget
        # First use of this dataset: create its (uncapped) row. On PostgreSQL two transactions
        # can get here at once (FOR UPDATE locks no row that does not exist yet); the loser's
        # INSERT fails on the unique key once the winner commits, and it then locks the
        # winner's row. The savepoint keeps the outer transaction usable after that failure.
        try:
            with session.begin_nested():
                budget = DatasetBudget(
                    dataset=dataset,
                    epsilon_spent=ZERO,
                    delta_spent=ZERO,
                    epsilon_reserved=ZERO,
                    delta_reserved=ZERO,
                )
                session.add(budget)
        except IntegrityError:
            budget = session.scalars(_budget_row_stmt(dataset)).one()
        return budget

    @classmethod
    def _balance(cls, conn: Connection | Session, dataset: str, sweep_id: str) -> SweepBalance:
        """The sweep's totals: one row (:class:`~sweeper.privacy.ledger.rows.SweepTotals`),
        kept with every entry (zeros before its first entry). A connection or a session."""
        return read_totals(conn, dataset, sweep_id) or SweepBalance.empty(dataset, sweep_id)

    @staticmethod
    def _balance_from_entries(
        conn: Connection | Session, dataset: str, sweep_id: str
    ) -> SweepBalance:
        """The sweep's totals summed from its entries (what :meth:`_balance` caches; the
        audit's check)."""
        rows = conn.execute(
            select(LedgerEntry.kind, LedgerEntry.epsilon, LedgerEntry.delta).where(
                LedgerEntry.dataset == dataset, LedgerEntry.sweep_id == sweep_id
            )
        ).all()
        totals = {kind: [ZERO, ZERO] for kind in EntryKind}
        reservations = 0
        for kind, epsilon, delta in rows:
            reservations += EntryKind(kind) is EntryKind.RESERVE
            pair = totals[EntryKind(kind)]
            pair[0] = add_exact(pair[0], epsilon)
            pair[1] = add_exact(pair[1], delta)
        return SweepBalance(
            dataset=dataset,
            sweep_id=sweep_id,
            epsilon_reserved=totals[EntryKind.RESERVE][0],
            delta_reserved=totals[EntryKind.RESERVE][1],
            epsilon_charged=totals[EntryKind.CHARGE][0],
            delta_charged=totals[EntryKind.CHARGE][1],
            epsilon_released=totals[EntryKind.RELEASE][0],
            delta_released=totals[EntryKind.RELEASE][1],
            reservations=reservations,
        )

    @staticmethod
    def _record(
        conn: Connection,
        *,
        budget: BudgetState,
        totals: SweepBalance | None,
        sweep_id: str,
        trial_id: str | None,
        kind: EntryKind,
        epsilon: Decimal,
        delta: Decimal,
        note: str,
        principal: str | None = None,
    ) -> LedgerRecord:
        """Write one operation: the dataset row's new totals (checked first), the entry, and
        the sweep's running totals, all in the caller's transaction.

        Args:
            conn: The operation's connection; its transaction holds the dataset's lock.
            budget: The dataset row, its totals already changed by the operation.
            totals: The sweep's totals as read under the lock (``None``: no row yet).
            sweep_id: The sweep.
            trial_id: The trial (charges only).
            kind: What the entry does.
            epsilon: The entry's ε.
            delta: The entry's δ.
            note: Free text kept with the entry.
            principal: Whose sweep reserves (reservations).

        Returns:
            The recorded entry.
        """
        LedgerCore._check_totals(budget)
        now = utcnow()
        entry_id = write_operation(
            conn,
            budget,
            totals,
            {
                "principal": principal,
                "dataset": budget.dataset,
                "sweep_id": sweep_id,
                "trial_id": trial_id,
                "kind": kind,
                "epsilon": epsilon,
                "delta": delta,
                "created_at": now,
                "note": note,
            },
        )
        return LedgerRecord(
            id=entry_id,
            dataset=budget.dataset,
            sweep_id=sweep_id,
            trial_id=trial_id,
            kind=kind,
            epsilon=epsilon,
            delta=delta,
            created_at=now,
            note=note,
        )

    @staticmethod
    def _check_totals(budget: DatasetBudget | BudgetState) -> None:
        # Last line of defence before commit: if arithmetic elsewhere were ever wrong, refuse to
        # commit a ledger that is negative or over its cap (the transaction rolls back).
        for name in ("epsilon", "delta"):
            spent: Decimal = getattr(budget, f"{name}_spent")
            reserved: Decimal = getattr(budget, f"{name}_reserved")
            cap: Decimal | None = getattr(budget, f"{name}_cap")
            if spent < 0 or reserved < 0 or (cap is not None and add_exact(spent, reserved) > cap):
                raise PrivacyError(
                    f"ledger for {dataset_label(budget.dataset)} would become inconsistent "
                    f"({name}: spent {spent}, reserved {reserved}, cap {cap}); refusing"
                )
