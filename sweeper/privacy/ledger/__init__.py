"""The privacy budget ledger: lifetime ε/δ caps per dataset, reserved and charged atomically.

A dataset may carry a lifetime cap on ε (and on δ). Money-like bookkeeping follows:

* **reserve** — when a sweep is accepted it reserves its whole cost (the sum over its arms and
  ε levels). The reservation succeeds only if ``spent + reserved + ε <= cap`` (and the same for
  δ when a δ cap exists); otherwise :class:`BudgetExhausted` is raised and nothing changes.
* **charge** — before a trial touches data, its cost moves from its sweep's reservation to
  *spent*. Charges are never undone: a trial that touched data stays charged even if it later
  fails or is cancelled. Charging more than the sweep still holds raises
  :class:`ReservationExceeded` and changes nothing (fail closed).
* **release** — when the sweep ends, whatever it reserved but never charged (trials that never
  started) goes back to the dataset. The release also ends the sweep on that dataset key: the
  ledger refuses every later charge of it, zero included, and every later reservation
  (:class:`SweepEnded`, a :class:`ReservationExceeded`), so a trial whose charge lands after
  the release never runs.

The invariant ``spent + reserved <= cap`` holds after every committed operation, and ``spent``
never decreases. Every operation writes one row to the entries table, so the running totals on
the dataset row can always be re-derived from the audit trail (``summary`` totals equal the sums
of the entries).

**Exact arithmetic** (:mod:`~sweeper.privacy.ledger.amounts`). Amounts are
:class:`~decimal.Decimal` values that are *exactly* the numbers the caller passed (a float
converts to its exact binary value), added and compared without any rounding and without a
tolerance, so sums cannot drift above a cap. The consequence is honest but sometimes
surprising: ``0.1`` as a float is slightly more than 1/10, so ten float reservations of ``0.1``
do not fit a cap of ``1.0``, while ten of ``Decimal("0.1")`` do. Pass ``Decimal`` values when
decimal amounts must add up exactly.

**Atomicity.** Each operation is one database transaction that reads the dataset row, checks,
and writes, under a write lock:

* SQLite: :func:`sweeper.store.engine.create_ledger_engine` turns off the sqlite3 driver's own
  transaction handling (``isolation_level=None``) and emits ``BEGIN IMMEDIATE`` from
  SQLAlchemy's ``begin`` event, as SQLAlchemy's SQLite documentation describes.
  ``BEGIN IMMEDIATE`` takes the database's write lock *before* the first read, so a second
  writer (thread or process) waits — up to the busy timeout — until the first commits, and then
  reads the new totals. With the driver's default (deferred) behaviour both writers could read
  the same totals before either wrote, and two sweeps racing for the last budget could both win.
* PostgreSQL: the dataset row is read with ``SELECT ... FOR UPDATE`` (``with_for_update()``, a
  no-op on SQLite), which serialises writers on that row. Under the default READ COMMITTED
  isolation every later statement in the transaction sees what earlier lock holders committed.

**The hot path.** Reserve, charge and release skip the ORM: they run prebuilt Core statements
(:mod:`~sweeper.privacy.ledger.statements`), compiled once per dialect and executed on the
driver's cursor of the operation's connection (:mod:`~sweeper.privacy.ledger.driver_sql`),
with the column types' own conversions. A charge locks the dataset row, reads its sweep's
running totals (``ledger_sweep_totals``: one row, whatever the number of earlier entries),
checks in Python with the exact arithmetic above, then writes the dataset row, the entry and
the sweep's totals (one statement on PostgreSQL) and commits: O(1) per charge. On
PostgreSQL (psycopg) each batch is one libpq pipeline of statements prepared once per server
session (:mod:`~sweeper.privacy.ledger.driver_pq`): ``BEGIN``, lock and totals read in one
round trip, the writes and ``COMMIT`` in the next; the server still runs them in order, so
the totals are read after the lock is granted.

Schema: the tables (:mod:`~sweeper.privacy.ledger.rows`) share the project's declarative
base (:mod:`sweeper.store.base`) and come from the Alembic migrations;
:func:`create_ledger_tables` creates them directly for tests and local use.
"""

from __future__ import annotations

from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.errors import (
    AllowanceExhausted,
    BudgetExhausted,
    ReservationExceeded,
    SweepEnded,
)
from sweeper.privacy.ledger.keys import IDENTITY_PREFIX, KEY_MAX_LENGTH, identity_key
from sweeper.privacy.ledger.records import (
    BudgetSummary,
    CarriedOver,
    LedgerRecord,
    Remaining,
    Reservation,
    SweepBalance,
    summed_entries,
)
from sweeper.privacy.ledger.rows import DatasetBudget, EntryKind, LedgerEntry, create_ledger_tables
from sweeper.privacy.ledger.units import EXAMPLE_UNIT, bind_privacy_unit, ledger_unit, unit_label

__all__ = [
    "EXAMPLE_UNIT",
    "IDENTITY_PREFIX",
    "KEY_MAX_LENGTH",
    "AllowanceExhausted",
    "BudgetExhausted",
    "BudgetLedger",
    "BudgetSummary",
    "CarriedOver",
    "DatasetBudget",
    "EntryKind",
    "LedgerEntry",
    "LedgerRecord",
    "Remaining",
    "Reservation",
    "ReservationExceeded",
    "SweepBalance",
    "SweepEnded",
    "bind_privacy_unit",
    "create_ledger_tables",
    "identity_key",
    "ledger_unit",
    "summed_entries",
    "unit_label",
]
