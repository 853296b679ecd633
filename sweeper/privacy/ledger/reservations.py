"""A sweep's money: reserve its cost, charge its trials, release what it never used."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from sweeper.privacy.ledger.amounts import (
    ZERO,
    add_exact,
    delta_amount,
    epsilon_amount,
    show_amount,
    show_amounts,
    sub_exact,
)
from sweeper.privacy.ledger.cap_check import check_allowance, check_caps
from sweeper.privacy.ledger.core import LedgerCore
from sweeper.privacy.ledger.driver_sql import touched
from sweeper.privacy.ledger.errors import (
    ReservationExceeded,
    SweepEnded,
)
from sweeper.privacy.ledger.keys import checked_key, checked_note, dataset_label
from sweeper.privacy.ledger.records import LedgerRecord, Reservation, SweepBalance
from sweeper.privacy.ledger.rows import EntryKind, LedgerEntry, SweepTotals
from sweeper.privacy.ledger.statements import (
    TOTAL_COLUMNS,
    TOTALS,
    has_release,
    lock_and_read,
)
from sweeper.privacy.ledger.units import check_unit_under_lock, unit_label

__all__ = ["ReservationOperations"]


class ReservationOperations(LedgerCore):
    """Reserve, charge and release (part of :class:`~sweeper.privacy.ledger.BudgetLedger`)."""

    def reserve(
        self,
        dataset: str,
        *,
        sweep_id: str,
        epsilon: float | Decimal,
        delta: float | Decimal,
        note: str = "",
        principal: str | None = None,
        allowance: Decimal | None = None,
        privacy_unit: str | None = None,
    ) -> Reservation:
        """Reserve a sweep's cost against a dataset's caps, atomically.

        A sweep may reserve more than once (the reservations add up), until it is released.

        Args:
            dataset: The dataset key.
            sweep_id: The sweep reserving.
            epsilon: ε to reserve (finite, >= 0): the sum over the sweep's arms and levels.
            delta: δ to reserve, in [0, 1).
            note: Free text kept with the entry.
            principal: Whose sweep reserves (the tenant), kept with the entry.
            allowance: The most ε ``principal``'s sweeps may hold on the dataset together (an
                analyst's grant): what they reserved less what they released, this reservation
                included. Checked under the same lock as the caps, so concurrent reservations
                cannot pass it together.
            privacy_unit: What one unit of the reserved ε is: None for a row (``example``),
                else the dataset's unit column (:mod:`~sweeper.privacy.ledger.units`). An
                unbound ledger is bound to it; a ledger bound to another unit refuses.

        Returns:
            The recorded ``reserve`` entry.

        Raises:
            BudgetExhausted: If ``spent + reserved + epsilon`` would exceed the ε cap, or the same
                for δ; nothing is recorded.
            AllowanceExhausted: If ``principal``'s sweeps would hold more than ``allowance``.
            SweepEnded: If the sweep was released (it ended); nothing is recorded.
            IllegalState: If the ledger is bound to another privacy unit; nothing is recorded.
            ConfigError: If an argument is invalid.
        """
        dataset = checked_key(dataset, "dataset")
        unit_label(privacy_unit)  # a bad unit name is refused before the transaction
        sweep_id = checked_key(sweep_id, "sweep_id")
        eps = epsilon_amount(epsilon)
        dlt = delta_amount(delta)
        note = checked_note(note)
        with self._transaction() as conn:
            budget, totals = lock_and_read(conn, dataset, sweep_id, create=True)
            assert budget is not None
            # An ended sweep takes no charge, so a new reservation would hold budget for nothing.
            _refuse_if_ended(conn, dataset, sweep_id, totals, eps, "it cannot reserve again")
            # One ledger, one unit: a person's budget is never spent per row and per person.
            check_unit_under_lock(conn, dataset, privacy_unit)
            check_caps(
                budget,
                epsilon=eps,
                delta=dlt,
                dataset=dataset,
                who=f"{dataset_label(dataset)}: sweep {sweep_id!r}",
                asks="asked for",
                analyst=allowance is not None,
            )
            if allowance is not None:
                _check_allowance(conn, dataset, sweep_id, eps, principal, allowance)
            budget.epsilon_reserved = add_exact(budget.epsilon_reserved, eps)
            budget.delta_reserved = add_exact(budget.delta_reserved, dlt)
            return self._record(
                conn,
                budget=budget,
                totals=totals,
                sweep_id=sweep_id,
                trial_id=None,
                kind=EntryKind.RESERVE,
                epsilon=eps,
                delta=dlt,
                note=note,
                principal=principal,
            )

    def charge(
        self,
        dataset: str,
        *,
        sweep_id: str,
        trial_id: str,
        epsilon: float | Decimal,
        delta: float | Decimal,
        note: str = "",
    ) -> LedgerRecord:
        """Move a trial's cost from its sweep's reservation to spent.

        Charge *before* the trial touches data: the charge is permanent, so a trial that then
        fails, crashes or is cancelled stays charged, as it must. Charging the same trial again
        (a retry touches the data again) adds a second charge. A sweep that was released (it
        ended) takes no charge at all, zero included: a trial refused here must not run.

        Args:
            dataset: The dataset key.
            sweep_id: The sweep the trial belongs to; its reservation pays for the charge.
            trial_id: The trial being charged.
            epsilon: The trial's ε (finite, >= 0).
            delta: The trial's δ, in [0, 1).
            note: Free text kept with the entry.

        Returns:
            The recorded ``charge`` entry.

        Raises:
            SweepEnded: If the sweep's reservation was released (any amount, zero included);
                nothing is recorded.
            ReservationExceeded: If the sweep's outstanding reservation (reserved, minus charged,
                minus released) is smaller than the charge; nothing is recorded.
            ConfigError: If an argument is invalid.
        """
        dataset = checked_key(dataset, "dataset")
        sweep_id = checked_key(sweep_id, "sweep_id")
        trial_id = checked_key(trial_id, "trial_id")
        eps = epsilon_amount(epsilon)
        dlt = delta_amount(delta)
        note = checked_note(note)
        with self._transaction() as conn:
            budget, totals = lock_and_read(conn, dataset, sweep_id, create=False)
            # Checked under the lock the release takes: a charge either commits before the
            # release (and the release gives back only what is left) or is refused.
            refused = f"trial {trial_id!r} cannot be charged and must not run"
            _refuse_if_ended(conn, dataset, sweep_id, totals, eps, refused)
            if budget is None or totals is None or totals.reservations == 0:
                # Even a zero charge is refused: a sweep that never reserved was never
                # accepted against this dataset, so its trials must not run.
                raise ReservationExceeded(
                    f"{dataset_label(dataset)}: sweep {sweep_id!r} has no reservation, so trial "
                    f"{trial_id!r} cannot be charged and must not run",
                    dataset=dataset,
                    sweep_id=sweep_id,
                    quantity="epsilon",
                    requested=eps,
                    outstanding=ZERO,
                )
            _check_outstanding(totals, trial_id, eps, dlt)
            budget.epsilon_reserved = sub_exact(budget.epsilon_reserved, eps)
            budget.delta_reserved = sub_exact(budget.delta_reserved, dlt)
            budget.epsilon_spent = add_exact(budget.epsilon_spent, eps)
            budget.delta_spent = add_exact(budget.delta_spent, dlt)
            return self._record(
                conn,
                budget=budget,
                totals=totals,
                sweep_id=sweep_id,
                trial_id=trial_id,
                kind=EntryKind.CHARGE,
                epsilon=eps,
                delta=dlt,
                note=note,
            )

    def release(self, dataset: str, *, sweep_id: str, note: str = "") -> LedgerRecord | None:
        """Give back what a sweep reserved but never charged, and end it on ``dataset``.

        Call it when the sweep ends. Charges stay: only the outstanding part returns to the
        dataset. The release entry marks the sweep ended: from its commit on, the ledger
        refuses every charge (zero included) and reservation of the sweep
        (:class:`SweepEnded`), so the charges the sweep will ever have are those committed
        before it. Releasing again releases nothing more, and so does releasing a sweep that
        holds nothing.

        Args:
            dataset: The dataset key.
            sweep_id: The sweep that ended.
            note: Free text kept with the entry.

        Returns:
            The recorded ``release`` entry (its amounts are what was given back), or ``None``
            when the dataset has no ledger row (nothing was ever reserved on it).

        Raises:
            ConfigError: If an argument is invalid.
        """
        dataset = checked_key(dataset, "dataset")
        sweep_id = checked_key(sweep_id, "sweep_id")
        note = checked_note(note)
        with self._transaction() as conn:
            budget, totals = lock_and_read(conn, dataset, sweep_id, create=False)
            if budget is None:
                return None
            balance = totals or SweepBalance.empty(dataset, sweep_id)
            eps, dlt = balance.epsilon_outstanding, balance.delta_outstanding
            budget.epsilon_reserved = sub_exact(budget.epsilon_reserved, eps)
            budget.delta_reserved = sub_exact(budget.delta_reserved, dlt)
            # Recorded even when zero: the entry also marks, in the audit trail, that the sweep
            # ended.
            return self._record(
                conn,
                budget=budget,
                totals=totals,
                sweep_id=sweep_id,
                trial_id=None,
                kind=EntryKind.RELEASE,
                epsilon=eps,
                delta=dlt,
                note=note,
            )


def _refuse_if_ended(
    conn: Connection,
    dataset: str,
    sweep_id: str,
    totals: SweepBalance | None,
    requested: Decimal,
    refused: str,
) -> None:
    """Raise :class:`SweepEnded` if the sweep has a release entry on ``dataset``.

    Called under the dataset's lock. The totals answer without a query in every common case:
    what was released is non-zero, or the sweep still holds something (a release gives back
    everything outstanding, and nothing is reserved or charged after it, so a sweep that
    holds something was never released). Only a sweep holding nothing, with nothing released,
    has its entries looked up (:func:`~sweeper.privacy.ledger.statements.has_release`): a
    zero release leaves no other trace in the totals. So a charge stays one totals row read,
    whatever the number of the sweep's entries.

    Args:
        conn: The operation's connection (its transaction holds the dataset's lock).
        dataset: The dataset key.
        sweep_id: The sweep.
        totals: The sweep's totals as read under the lock (``None``: no entry yet).
        requested: The ε the refused operation asked for.
        refused: What is refused, for the message.
    """
    if totals is None:
        return
    if not (totals.epsilon_released or totals.delta_released):
        if totals.epsilon_outstanding or totals.delta_outstanding:
            return
        if not has_release(conn, dataset, sweep_id):
            return
    raise SweepEnded(
        f"{dataset_label(dataset)}: sweep {sweep_id!r} has ended (its reservation was "
        f"released), so {refused}",
        dataset=dataset,
        sweep_id=sweep_id,
        quantity="epsilon",
        requested=requested,
        outstanding=ZERO,
    )


def _check_outstanding(balance: SweepBalance, trial_id: str, eps: Decimal, dlt: Decimal) -> None:
    """Raise :class:`ReservationExceeded` if the sweep holds less than ``trial_id``'s charge."""
    for quantity, asked, outstanding in (
        ("epsilon", eps, balance.epsilon_outstanding),
        ("delta", dlt, balance.delta_outstanding),
    ):
        if asked > outstanding:
            shown_asked, shown_left = show_amounts(asked, outstanding)
            raise ReservationExceeded(
                f"{dataset_label(balance.dataset)}: trial {trial_id!r} of sweep "
                f"{balance.sweep_id!r} would be charged {quantity}={shown_asked} but the sweep "
                f"holds only {shown_left} in reservation (reserved "
                f"{show_amount(_reserved(balance, quantity))}, already charged "
                f"{show_amount(_charged(balance, quantity))}, released "
                f"{show_amount(_released(balance, quantity))}); the trial must not run",
                dataset=balance.dataset,
                sweep_id=balance.sweep_id,
                quantity=quantity,
                requested=asked,
                outstanding=outstanding,
            )


def _reserved(balance: SweepBalance, quantity: str) -> Decimal:
    return balance.epsilon_reserved if quantity == "epsilon" else balance.delta_reserved


def _charged(balance: SweepBalance, quantity: str) -> Decimal:
    return balance.epsilon_charged if quantity == "epsilon" else balance.delta_charged


def _released(balance: SweepBalance, quantity: str) -> Decimal:
    return balance.epsilon_released if quantity == "epsilon" else balance.delta_released


def _principal_sweeps(
    conn: Connection | Session, dataset: str, principal: str
) -> list[SweepBalance]:
    """The running totals of every sweep ``principal`` reserved for on ``dataset`` (their
    whole totals: an entry of such a sweep counts whoever wrote it)."""
    sweeps = (
        select(LedgerEntry.sweep_id)
        .where(
            LedgerEntry.dataset == dataset,
            LedgerEntry.principal == principal,
            LedgerEntry.kind == EntryKind.RESERVE,
        )
        .distinct()
    )
    rows = conn.execute(
        select(SweepTotals.sweep_id, *(TOTALS.c[name] for name in TOTAL_COLUMNS)).where(
            SweepTotals.dataset == dataset, SweepTotals.sweep_id.in_(sweeps)
        )
    ).all()
    return [SweepBalance(dataset, sweep_id, *amounts) for sweep_id, *amounts in rows]


def principal_usage(conn: Connection | Session, dataset: str, principal: str | None) -> Decimal:
    """ε that ``principal``'s sweeps hold on ``dataset``: what they reserved less what they
    released unused (charges move ε from reserved to spent, and stay counted)."""
    if principal is None:
        return ZERO
    reserved, released = ZERO, ZERO
    for sweep in _principal_sweeps(conn, dataset, principal):
        reserved = add_exact(reserved, sweep.epsilon_reserved)
        released = add_exact(released, sweep.epsilon_released)
    return sub_exact(reserved, released) if released <= reserved else ZERO


def principal_totals(
    conn: Connection | Session, dataset: str, principal: str
) -> tuple[Decimal, Decimal]:
    """ε charged to ``principal``'s sweeps on ``dataset``, and ε they still hold reserved."""
    reserved, charged, released = ZERO, ZERO, ZERO
    for sweep in _principal_sweeps(conn, dataset, principal):
        reserved = add_exact(reserved, sweep.epsilon_reserved)
        charged = add_exact(charged, sweep.epsilon_charged)
        released = add_exact(released, sweep.epsilon_released)
    held = sub_exact(reserved, released)
    outstanding = sub_exact(held, charged) if charged <= held else ZERO
    return charged, outstanding


def _check_allowance(
    conn: Connection,
    dataset: str,
    sweep_id: str,
    eps: Decimal,
    principal: str | None,
    allowance: Decimal,
) -> None:
    """Refuse ``eps`` if ``principal``'s sweeps would hold more than ``allowance`` on the
    dataset; run under the reservation's lock, so concurrent reservations cannot pass it
    together."""
    touched(conn)  # a read through SQLAlchemy, in the operation's transaction
    check_allowance(
        epsilon=eps,
        used=principal_usage(conn, dataset, principal),
        allowance=allowance,
        analyst=principal,
        dataset=dataset,
        who=f"{dataset_label(dataset)}: sweep {sweep_id!r}",
        asks="asked for",
    )
