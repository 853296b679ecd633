"""The ledger's engine, its transactions, and the steps every ledger operation shares."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

from sqlalchemy import Engine, Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from dpsweep.errors import ConfigError, PrivacyError
from sweeper.privacy.ledger.amounts import ZERO, add_exact
from sweeper.privacy.ledger.keys import dataset_label
from sweeper.privacy.ledger.records import LedgerRecord, SweepBalance
from sweeper.privacy.ledger.rows import DatasetBudget, EntryKind, LedgerEntry, SweepTotals, utcnow
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

    @staticmethod
    def _totals(session: Session, dataset: str, sweep_id: str) -> SweepTotals | None:
        """The sweep's running-totals row (None before its first entry)."""
        return session.scalars(
            select(SweepTotals).where(
                SweepTotals.dataset == dataset, SweepTotals.sweep_id == sweep_id
            )
        ).one_or_none()

    @classmethod
    def _balance(cls, session: Session, dataset: str, sweep_id: str) -> SweepBalance:
        """The sweep's totals: one row (:class:`SweepTotals`), kept with every entry."""
        return cls._balance_of(cls._totals(session, dataset, sweep_id), dataset, sweep_id)

    @staticmethod
    def _balance_of(row: SweepTotals | None, dataset: str, sweep_id: str) -> SweepBalance:
        """A totals row as a :class:`SweepBalance` (zeros for None)."""
        if row is None:
            return SweepBalance(dataset, sweep_id, ZERO, ZERO, ZERO, ZERO, ZERO, ZERO)
        return SweepBalance(
            dataset=dataset,
            sweep_id=sweep_id,
            epsilon_reserved=row.epsilon_reserved,
            delta_reserved=row.delta_reserved,
            epsilon_charged=row.epsilon_charged,
            delta_charged=row.delta_charged,
            epsilon_released=row.epsilon_released,
            delta_released=row.delta_released,
            reservations=row.reservations,
        )

    @staticmethod
    def _balance_from_entries(session: Session, dataset: str, sweep_id: str) -> SweepBalance:
        """The sweep's totals summed from its entries (what :meth:`_balance` caches; the
        audit's check)."""
        rows = session.execute(
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
        session: Session,
        *,
        dataset: str,
        sweep_id: str,
        trial_id: str | None,
        kind: EntryKind,
        epsilon: Decimal,
        delta: Decimal,
        note: str,
        principal: str | None = None,
        totals: SweepTotals | None = None,
    ) -> LedgerRecord:
        entry = LedgerEntry(
            principal=principal,
            dataset=dataset,
            sweep_id=sweep_id,
            trial_id=trial_id,
            kind=kind,
            epsilon=epsilon,
            delta=delta,
            created_at=utcnow(),
            note=note,
        )
        session.add(entry)
        # The sweep's running totals, in the same transaction (the caller holds the dataset's
        # budget-row lock, so no other writer updates them meanwhile).
        if totals is None:  # (a caller that read the row already passes it)
            totals = session.scalars(
                select(SweepTotals).where(
                    SweepTotals.dataset == dataset, SweepTotals.sweep_id == sweep_id
                )
            ).one_or_none()
        if totals is None:
            totals = SweepTotals(
                dataset=dataset,
                sweep_id=sweep_id,
                epsilon_reserved=ZERO,
                delta_reserved=ZERO,
                epsilon_charged=ZERO,
                delta_charged=ZERO,
                epsilon_released=ZERO,
                delta_released=ZERO,
                reservations=0,
            )
            session.add(totals)
        name = {EntryKind.RESERVE: "reserved", EntryKind.CHARGE: "charged"}.get(kind, "released")
        setattr(totals, f"epsilon_{name}", add_exact(getattr(totals, f"epsilon_{name}"), epsilon))
        setattr(totals, f"delta_{name}", add_exact(getattr(totals, f"delta_{name}"), delta))
        if kind is EntryKind.RESERVE:
            totals.reservations = totals.reservations + 1
        session.flush()  # assigns the id; the commit happens when the operation's block exits
        return LedgerRecord.from_row(entry)

    @staticmethod
    def _check_totals(budget: DatasetBudget) -> None:
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
