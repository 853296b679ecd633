"""Temporary re-exports (issue 21): the ledger moved to :mod:`sweeper.privacy.ledger`; its base,
column types and engine factory to :mod:`sweeper.store`."""

from __future__ import annotations

from sweeper.privacy.ledger.budget_ledger import BudgetLedger  # noqa: F401
from sweeper.privacy.ledger.core import _budget_row_stmt  # noqa: F401
from sweeper.privacy.ledger.errors import BudgetExhausted, ReservationExceeded  # noqa: F401
from sweeper.privacy.ledger.keys import IDENTITY_PREFIX, KEY_MAX_LENGTH, identity_key  # noqa: F401
from sweeper.privacy.ledger.records import (  # noqa: F401
    BudgetSummary,
    CarriedOver,
    LedgerRecord,
    Remaining,
    Reservation,
    SweepBalance,
    summed_entries,
)
from sweeper.privacy.ledger.rows import (  # noqa: F401
    DatasetBudget,
    EntryKind,
    LedgerEntry,
    create_ledger_tables,
)
from sweeper.store.base import LedgerBase  # noqa: F401
from sweeper.store.engine import (  # noqa: F401
    SQLITE_BUSY_TIMEOUT_S,
    create_ledger_engine,
    read_only,
    writable,
)
from sweeper.store.types import ExactDecimal, UTCDateTime  # noqa: F401
