"""The ledger's tables: one row of caps and running totals per dataset key, one per entry."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum

from sqlalchemy import (
    CheckConstraint,
    Engine,
    Enum,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from sweeper.privacy.ledger.amounts import ZERO
from sweeper.privacy.ledger.keys import KEY_MAX_LENGTH
from sweeper.store.base import Base
from sweeper.store.types import ExactDecimal, UTCDateTime

__all__ = [
    "DatasetBudget",
    "EntryKind",
    "LedgerEntry",
    "SweepTotals",
    "create_ledger_tables",
    "utcnow",
]


def utcnow() -> datetime:
    """Now, timezone-aware in UTC (what :class:`~sweeper.store.types.UTCDateTime` stores)."""
    return datetime.now(UTC)


class EntryKind(StrEnum):
    """What a ledger entry did."""

    RESERVE = "reserve"
    """The sweep set ε/δ aside: ``reserved += amount``."""
    CHARGE = "charge"
    """A trial of the sweep touched data: ``reserved -= amount``, ``spent += amount``."""
    RELEASE = "release"
    """The sweep ended and gave back its uncharged reservation: ``reserved -= amount``."""


class DatasetBudget(Base):
    """One dataset's lifetime caps and running totals.

    The totals are a cache of the entries (kept in the same transaction as the entry that
    changes them) so that the reserve check reads one locked row. A ``NULL`` cap means no cap.
    """

    __tablename__ = "dataset_budgets"

    id: Mapped[int] = mapped_column(primary_key=True)
    dataset: Mapped[str] = mapped_column(String(KEY_MAX_LENGTH), unique=True)
    epsilon_cap: Mapped[Decimal | None] = mapped_column(ExactDecimal())
    delta_cap: Mapped[Decimal | None] = mapped_column(ExactDecimal())
    epsilon_spent: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    delta_spent: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    epsilon_reserved: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    delta_reserved: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    #: What one unit of this ledger is: ``example`` (a row) or a unit column's name (a
    #: person). NULL: not bound yet (no reservation or registration named one). Once bound it
    #: never changes, so the same people's budget is never spent at two levels
    #: (:mod:`sweeper.privacy.ledger.units`).
    privacy_unit: Mapped[str | None] = mapped_column(String(KEY_MAX_LENGTH), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class LedgerEntry(Base):
    """One reservation, charge or release. Amounts are non-negative; ``kind`` gives the sign."""

    __tablename__ = "budget_ledger_entries"
    __table_args__ = (
        Index("ix_budget_ledger_entries_dataset_sweep", "dataset", "sweep_id"),
        # Only charges belong to a trial, and every charge must say which trial it was.
        CheckConstraint("(kind = 'charge') = (trial_id IS NOT NULL)", name="trial_id_iff_charge"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    dataset: Mapped[str] = mapped_column(
        String(KEY_MAX_LENGTH), ForeignKey("dataset_budgets.dataset")
    )
    sweep_id: Mapped[str] = mapped_column(String(KEY_MAX_LENGTH))
    trial_id: Mapped[str | None] = mapped_column(String(KEY_MAX_LENGTH))
    kind: Mapped[EntryKind] = mapped_column(
        Enum(
            EntryKind,
            name="ledger_entry_kind",
            native_enum=False,
            create_constraint=True,
            length=16,
            values_callable=lambda kinds: [kind.value for kind in kinds],
        )
    )
    epsilon: Mapped[Decimal] = mapped_column(ExactDecimal())
    delta: Mapped[Decimal] = mapped_column(ExactDecimal())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    note: Mapped[str] = mapped_column(Text, default="")
    # Whose sweep reserved (the tenant; NULL: local use, or entries from before principals):
    # an analyst's allowance counts the reservations of their sweeps, less what they release
    # (sweeper.datasets.grants). Kept even when the sweep's rows are deleted.
    principal: Mapped[str | None] = mapped_column(String(200))


class SweepTotals(Base):
    """One sweep's running totals on one dataset: a cache of its entries, kept in the same
    transaction as each entry (under the dataset's budget-row lock), so that a charge reads
    one row instead of every earlier entry of its sweep."""

    __tablename__ = "ledger_sweep_totals"
    __table_args__ = (
        UniqueConstraint("dataset", "sweep_id", name="uq_ledger_sweep_totals_dataset_sweep"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    dataset: Mapped[str] = mapped_column(
        String(KEY_MAX_LENGTH), ForeignKey("dataset_budgets.dataset")
    )
    sweep_id: Mapped[str] = mapped_column(String(KEY_MAX_LENGTH))
    epsilon_reserved: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    delta_reserved: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    epsilon_charged: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    delta_charged: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    epsilon_released: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    delta_released: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    reservations: Mapped[int] = mapped_column(Integer, default=0)


def create_ledger_tables(engine: Engine) -> None:
    """Create the ledger tables if they do not exist (tests and local use).

    The project's rule is that the schema comes from Alembic migrations only
    (:func:`sweeper.store.schema.upgrade`), never ``create_all``, outside tests.

    Args:
        engine: The engine to create the tables on.
    """
    # Only the ledger's own tables: the store's come with their migrations.
    tables = Base.metadata.tables
    Base.metadata.create_all(
        engine,
        tables=[
            tables[DatasetBudget.__tablename__],
            tables[LedgerEntry.__tablename__],
            tables[SweepTotals.__tablename__],
        ],
    )
