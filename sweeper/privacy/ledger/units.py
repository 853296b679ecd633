"""A ledger's privacy unit: what one unit of its ε protects (a row, or a person).

Example-level DP protects a person with k rows only at group privacy (about k·ε for small ε),
so the same records spent per row by one sweep and per person by another would leave each
person less than either ledger figure shows. A ledger is therefore bound to one unit:

* ``example``: each row is its own unit (every dataset without a declared unit);
* a unit column's name (``patient_id``, ``person``): ε is per unit, all its rows together.

The binding happens at the first registration, upload or reservation that names a unit
(:func:`bind_privacy_unit`, :meth:`UnitOperations.bind_privacy_unit`, and every
:meth:`~sweeper.privacy.ledger.reservations.ReservationOperations.reserve`, under the same lock
as the caps) and never changes: a reservation at another unit is refused
(:class:`~dpsweep.errors.IllegalState`, HTTP 409) before anything is recorded. Ledgers that
held entries before units existed were spent per row: migration 0013 binds them to ``example``.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, select, update

from dpsweep.errors import ConfigError, IllegalState
from sweeper.privacy.ledger.core import LedgerCore
from sweeper.privacy.ledger.driver_sql import touched
from sweeper.privacy.ledger.keys import KEY_MAX_LENGTH, checked_key, dataset_label
from sweeper.privacy.ledger.rows import DatasetBudget
from sweeper.privacy.ledger.statements import lock_and_read

__all__ = [
    "EXAMPLE_UNIT",
    "UnitOperations",
    "bind_privacy_unit",
    "check_unit_under_lock",
    "ledger_unit",
    "unit_label",
]

#: The unit of a dataset without a declared unit column: each row protects itself.
EXAMPLE_UNIT = "example"


def unit_label(privacy_unit: str | None) -> str:
    """The ledger's name for a privacy unit: ``example`` for None (each row its own unit).

    Raises:
        ConfigError: a blank or over-long unit name (field ``dataset.privacy_unit``).
    """
    if privacy_unit is None:
        return EXAMPLE_UNIT
    if not isinstance(privacy_unit, str) or not privacy_unit.strip():
        raise ConfigError(
            "dataset.privacy_unit must name the unit column (e.g. patient_id)",
            field="dataset.privacy_unit",
        )
    if len(privacy_unit) > KEY_MAX_LENGTH:
        raise ConfigError(
            f"dataset.privacy_unit is at most {KEY_MAX_LENGTH} characters",
            field="dataset.privacy_unit",
        )
    return privacy_unit


def _refusal(dataset: str, bound: str, asked: str) -> IllegalState:
    def level(unit: str) -> str:
        return "per row (example level)" if unit == EXAMPLE_UNIT else f"per {unit!r}"

    if bound == EXAMPLE_UNIT:
        fix = (
            "leave out dataset.privacy_unit; a ledger spent per row cannot start counting "
            "people (its earlier spending protects a person only at group privacy)"
        )
    else:
        fix = f"leave out dataset.privacy_unit, or give {bound!r}, the unit its owner declared"
    return IllegalState(
        f"{dataset_label(dataset)} is budgeted {level(bound)}; this asks to spend it "
        f"{level(asked)}. One ledger has one privacy unit, so the same people's budget is "
        f"never spent at two levels: {fix}"
    )


def check_unit_under_lock(conn: Connection, dataset: str, privacy_unit: str | None) -> None:
    """Bind an unbound ledger to ``privacy_unit``, or refuse another unit than its own.

    Runs inside an operation's transaction, after the dataset row was locked (and created):
    a concurrent binder waits for the lock, so two units can never both bind.

    Raises:
        IllegalState: the ledger is bound to another unit (nothing is written).
    """
    asked = unit_label(privacy_unit)
    touched(conn)  # statements through SQLAlchemy, in the operation's transaction
    bound = conn.execute(
        select(DatasetBudget.privacy_unit).where(DatasetBudget.dataset == dataset)
    ).scalar_one()
    if bound is None:
        conn.execute(
            update(DatasetBudget).where(DatasetBudget.dataset == dataset).values(privacy_unit=asked)
        )
        return
    if bound != asked:
        raise _refusal(dataset, bound, asked)


class UnitOperations(LedgerCore):
    """Bind and read a ledger's privacy unit (part of
    :class:`~sweeper.privacy.ledger.BudgetLedger`)."""

    def bind_privacy_unit(self, dataset: str, privacy_unit: str | None) -> str:
        """Bind ``dataset``'s ledger to ``privacy_unit`` (None: ``example``), or confirm it.

        Creates the ledger's (uncapped) row when there is none, as a first reservation would.

        Returns:
            The ledger's unit.

        Raises:
            IllegalState: the ledger is bound to another unit.
            ConfigError: a bad key or unit name.
        """
        dataset = checked_key(dataset, "dataset")
        with self._transaction() as conn:
            lock_and_read(conn, dataset, "", create=True)
            check_unit_under_lock(conn, dataset, privacy_unit)
        return unit_label(privacy_unit)

    def privacy_unit_of(self, dataset: str) -> str | None:
        """The unit ``dataset``'s ledger is bound to; None when unbound or without a row."""
        with self._read() as session:
            return session.scalars(
                select(DatasetBudget.privacy_unit).where(DatasetBudget.dataset == dataset)
            ).one_or_none()


def bind_privacy_unit(engine: Engine, dataset_key: str, privacy_unit: str | None) -> str:
    """:meth:`UnitOperations.bind_privacy_unit` on the ledger of ``engine``."""
    return UnitOperations(engine).bind_privacy_unit(dataset_key, privacy_unit)


def ledger_unit(engine: Engine, dataset_key: str) -> str | None:
    """The unit ``dataset_key``'s ledger is bound to (None: unbound)."""
    return UnitOperations(engine).privacy_unit_of(dataset_key)
