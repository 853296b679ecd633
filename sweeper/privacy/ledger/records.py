"""What the ledger hands back: plain, frozen records detached from any session."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sweeper.privacy.ledger.amounts import ZERO, add_exact, cap_left, sub_exact
from sweeper.privacy.ledger.rows import DatasetBudget, EntryKind, LedgerEntry

__all__ = [
    "BudgetSummary",
    "CarriedOver",
    "LedgerRecord",
    "Remaining",
    "Reservation",
    "SweepBalance",
    "summary_of",
    "summed_entries",
]


@dataclass(frozen=True)
class LedgerRecord:
    """A committed ledger entry, as returned by reserve, charge, release and entries."""

    id: int
    dataset: str
    sweep_id: str
    trial_id: str | None
    kind: EntryKind
    epsilon: Decimal
    delta: Decimal
    created_at: datetime
    note: str

    @classmethod
    def from_row(cls, row: LedgerEntry) -> LedgerRecord:
        return cls(
            id=row.id,
            dataset=row.dataset,
            sweep_id=row.sweep_id,
            trial_id=row.trial_id,
            kind=EntryKind(row.kind),
            epsilon=row.epsilon,
            delta=row.delta,
            created_at=row.created_at,
            note=row.note,
        )


#: What :meth:`BudgetLedger.reserve` returns: the recorded ``reserve`` entry.
Reservation = LedgerRecord


@dataclass(frozen=True)
class Remaining:
    """Budget left under a dataset's caps; ``None`` means that quantity has no cap."""

    epsilon: Decimal | None
    delta: Decimal | None


@dataclass(frozen=True)
class BudgetSummary:
    """A dataset's caps and totals at one moment (all exact)."""

    dataset: str
    epsilon_cap: Decimal | None
    delta_cap: Decimal | None
    epsilon_spent: Decimal
    delta_spent: Decimal
    epsilon_reserved: Decimal
    delta_reserved: Decimal

    @property
    def remaining(self) -> Remaining:
        """What a new reservation could still take (``None`` where uncapped)."""
        return Remaining(
            epsilon=cap_left(self.epsilon_cap, self.epsilon_spent, self.epsilon_reserved),
            delta=cap_left(self.delta_cap, self.delta_spent, self.delta_reserved),
        )


@dataclass(frozen=True)
class SweepBalance:
    """One sweep's totals on one dataset."""

    dataset: str
    sweep_id: str
    epsilon_reserved: Decimal
    delta_reserved: Decimal
    epsilon_charged: Decimal
    delta_charged: Decimal
    epsilon_released: Decimal
    delta_released: Decimal
    reservations: int = 0
    """How many ``reserve`` entries the sweep has (a sweep must reserve before it charges)."""

    @classmethod
    def empty(cls, dataset: str, sweep_id: str) -> SweepBalance:
        """The totals of a sweep without entries: all zero."""
        return cls(dataset, sweep_id, ZERO, ZERO, ZERO, ZERO, ZERO, ZERO)

    @property
    def epsilon_outstanding(self) -> Decimal:
        """ε reserved and neither charged nor released: what charges may still take."""
        return sub_exact(
            sub_exact(self.epsilon_reserved, self.epsilon_charged), self.epsilon_released
        )

    @property
    def delta_outstanding(self) -> Decimal:
        """δ reserved and neither charged nor released."""
        return sub_exact(sub_exact(self.delta_reserved, self.delta_charged), self.delta_released)


@dataclass(frozen=True)
class CarriedOver:
    """What :meth:`BudgetLedger.carry_over` moved from one ledger key to another."""

    source: str
    target: str
    entries: int
    """How many entries moved (their notes say where they came from)."""
    epsilon_spent: Decimal
    delta_spent: Decimal
    epsilon_reserved: Decimal
    delta_reserved: Decimal
    """The source's totals, now added to the target's."""
    summary: BudgetSummary
    """The target after the move."""
    cap_clamped: bool
    """The stricter cap was below what both keys had committed together: it was set to that
    total (nothing is left) instead, since spent budget cannot be un-spent."""


def summary_of(budget: DatasetBudget) -> BudgetSummary:
    """A dataset row's caps and totals as a detached :class:`BudgetSummary`."""
    return BudgetSummary(
        dataset=budget.dataset,
        epsilon_cap=budget.epsilon_cap,
        delta_cap=budget.delta_cap,
        epsilon_spent=budget.epsilon_spent,
        delta_spent=budget.delta_spent,
        epsilon_reserved=budget.epsilon_reserved,
        delta_reserved=budget.delta_reserved,
    )


def summed_entries(records: Iterable[LedgerRecord]) -> dict[str, Decimal]:
    """Re-derive a dataset's totals from its entries (an audit check on the running totals).

    Args:
        records: Entries of one dataset, e.g. from :meth:`BudgetLedger.entries`.

    Returns:
        ``epsilon_spent``, ``delta_spent``, ``epsilon_reserved`` and ``delta_reserved``, exact.
    """
    totals = {
        "epsilon_spent": ZERO,
        "delta_spent": ZERO,
        "epsilon_reserved": ZERO,
        "delta_reserved": ZERO,
    }
    for record in records:
        for name, amount in (("epsilon", record.epsilon), ("delta", record.delta)):
            if record.kind is EntryKind.RESERVE:
                totals[f"{name}_reserved"] = add_exact(totals[f"{name}_reserved"], amount)
            elif record.kind is EntryKind.CHARGE:
                totals[f"{name}_reserved"] = sub_exact(totals[f"{name}_reserved"], amount)
                totals[f"{name}_spent"] = add_exact(totals[f"{name}_spent"], amount)
            else:
                totals[f"{name}_reserved"] = sub_exact(totals[f"{name}_reserved"], amount)
    return totals
