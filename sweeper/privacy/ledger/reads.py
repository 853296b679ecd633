"""Reading the ledger: a dataset's summary and remaining budget, a sweep's balance, entries."""

from __future__ import annotations

from sqlalchemy import select

from sweeper.privacy.ledger.amounts import ZERO
from sweeper.privacy.ledger.core import LedgerCore
from sweeper.privacy.ledger.keys import checked_key
from sweeper.privacy.ledger.records import (
    BudgetSummary,
    LedgerRecord,
    Remaining,
    SweepBalance,
    summary_of,
)
from sweeper.privacy.ledger.rows import DatasetBudget, LedgerEntry

__all__ = ["LedgerReads"]


class LedgerReads(LedgerCore):
    """The ledger's reads, each a snapshot that takes no write lock (part of
    :class:`~sweeper.privacy.ledger.BudgetLedger`)."""

    def summary(self, dataset: str) -> BudgetSummary:
        """A dataset's caps, spent, reserved and remaining budget.

        Args:
            dataset: The dataset key. A dataset the ledger has never seen has no cap and
                nothing spent.

        Returns:
            The exact totals.
        """
        dataset = checked_key(dataset, "dataset")
        with self._read() as session:
            budget = session.scalars(
                select(DatasetBudget).where(DatasetBudget.dataset == dataset)
            ).one_or_none()
            if budget is None:
                return BudgetSummary(dataset, None, None, ZERO, ZERO, ZERO, ZERO)
            return summary_of(budget)

    def remaining(self, dataset: str) -> Remaining:
        """Budget a new reservation could still take (``None`` where a quantity is uncapped).

        Args:
            dataset: The dataset key.

        Returns:
            The remaining ε and δ.
        """
        return self.summary(dataset).remaining

    def sweep_balance(self, dataset: str, *, sweep_id: str) -> SweepBalance:
        """One sweep's reserved, charged, released and outstanding amounts on a dataset.

        Args:
            dataset: The dataset key.
            sweep_id: The sweep.

        Returns:
            The sweep's exact totals (zero if it never reserved).
        """
        dataset = checked_key(dataset, "dataset")
        sweep_id = checked_key(sweep_id, "sweep_id")
        with self._read() as session:
            return self._balance(session, dataset, sweep_id)

    def entries(self, dataset: str, sweep_id: str | None = None) -> list[LedgerRecord]:
        """The recorded entries of a dataset, oldest first.

        Args:
            dataset: The dataset key.
            sweep_id: If given, only that sweep's entries.

        Returns:
            The entries, in the order they were committed.
        """
        dataset = checked_key(dataset, "dataset")
        stmt = select(LedgerEntry).where(LedgerEntry.dataset == dataset)
        if sweep_id is not None:
            stmt = stmt.where(LedgerEntry.sweep_id == checked_key(sweep_id, "sweep_id"))
        with self._read() as session:
            return [
                LedgerRecord.from_row(row) for row in session.scalars(stmt.order_by(LedgerEntry.id))
            ]

    def datasets(self) -> list[str]:
        """Keys of every dataset the ledger has a row for, sorted."""
        with self._read() as session:
            return list(
                session.scalars(select(DatasetBudget.dataset).order_by(DatasetBudget.dataset))
            )
