"""The budget ledger: its operations, gathered in one class."""

from __future__ import annotations

from sweeper.privacy.ledger.caps import CapOperations
from sweeper.privacy.ledger.reads import LedgerReads
from sweeper.privacy.ledger.rekeying import KeyMoves
from sweeper.privacy.ledger.reservations import ReservationOperations
from sweeper.privacy.ledger.units import UnitOperations

__all__ = ["BudgetLedger"]


class BudgetLedger(CapOperations, ReservationOperations, KeyMoves, LedgerReads, UnitOperations):
    """Lifetime ε/δ budgets per dataset, with atomic reserve, charge and release.

    Every public method is one transaction; a failure anywhere inside it rolls the whole
    operation back, so the ledger is never left half-updated. Datasets without a row (never
    capped, never reserved against) have no cap; their first reservation creates the row, and
    every reservation and charge is recorded all the same.

    The operations live by concept: caps (:mod:`~sweeper.privacy.ledger.caps`), a sweep's
    reserve/charge/release (:mod:`~sweeper.privacy.ledger.reservations`), moves between keys
    (:mod:`~sweeper.privacy.ledger.rekeying`), reads (:mod:`~sweeper.privacy.ledger.reads`)
    and the ledger's privacy unit (:mod:`~sweeper.privacy.ledger.units`),
    over the shared transactions of :mod:`~sweeper.privacy.ledger.core`.

    Args:
        engine: An engine from :func:`~sweeper.store.engine.create_ledger_engine` (required
            for SQLite, whose atomicity depends on the ``BEGIN IMMEDIATE`` hook it installs).

    Raises:
        ConfigError: If ``engine`` is a SQLite engine without that configuration.
    """
