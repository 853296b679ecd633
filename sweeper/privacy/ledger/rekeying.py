"""Moving budget between ledger keys that name the same data (a name and its content
identity), or handing a name's caps to the new records it now holds."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError
from sweeper.privacy.ledger.amounts import add_exact, stricter_cap
from sweeper.privacy.ledger.core import LedgerCore
from sweeper.privacy.ledger.keys import checked_key, checked_note
from sweeper.privacy.ledger.records import BudgetSummary, CarriedOver, summary_of
from sweeper.privacy.ledger.rows import DatasetBudget, LedgerEntry, SweepTotals, utcnow
from sweeper.privacy.ledger.statements import TOTAL_AMOUNTS
from sweeper.privacy.ledger.units import EXAMPLE_UNIT

__all__ = ["KeyMoves"]


class KeyMoves(LedgerCore):
    """Carry a ledger over to another key, or inherit its caps (part of
    :class:`~sweeper.privacy.ledger.BudgetLedger`)."""

    def carry_over(
        self,
        source: str,
        target: str,
        *,
        note: str = "",
        within: Callable[[Session], None] | None = None,
    ) -> CarriedOver | None:
        """Move everything recorded under ``source`` to ``target``, atomically, and drop the
        ``source`` row: spent and reserved add up, every entry moves (so each sweep's balance
        moves with it), and the stricter of the two caps applies (per quantity; no cap counts
        as the loosest). Nothing spent is lost.

        For keys that turned out to name the same records (a dataset's old name key and its
        content identity). If the stricter cap is below what the two have committed together,
        the cap becomes that total: the data is then exhausted, never over its cap.

        Args:
            source: The key to empty and remove.
            target: The key that receives it (created if missing).
            note: Appended to every moved entry's note, for the audit trail.
            within: Called with the session inside the same transaction (to re-point other
                rows at ``target`` in the same commit).

        Returns:
            What moved, or ``None`` when ``source`` has no row (``within`` still ran).

        Raises:
            ConfigError: If a key is invalid, or both are the same.
        """
        source = checked_key(source, "source")
        target = checked_key(target, "target")
        note = checked_note(note)
        if source == target:
            raise ConfigError("carry_over needs two different keys", field="target")
        with self._write() as session:
            # Lock both rows in key order, so two carry-overs sharing a key never deadlock.
            rows = {
                key: self._lock_budget(session, key, create=False)
                for key in sorted((source, target))
            }
            old = rows[source]
            if old is None:
                if within is not None:
                    within(session)
                return None
            new = rows[target] or self._lock_budget(session, target, create=True)
            assert new is not None
            clamped = _add_budget(new, old)
            new.updated_at = utcnow()
            session.flush()  # the target row exists before entries point at it (foreign key)
            moved = _move_entries(session, source, target, note)
            _move_sweep_totals(session, source, target)
            session.flush()
            moved_totals = (
                old.epsilon_spent,
                old.delta_spent,
                old.epsilon_reserved,
                old.delta_reserved,
            )
            session.delete(old)
            self._check_totals(new)
            if within is not None:
                within(session)
            session.flush()
            return CarriedOver(
                source,
                target,
                int(moved or 0),
                *moved_totals,
                summary=summary_of(new),
                cap_clamped=clamped,
            )

    def inherit_caps(self, source: str, target: str) -> BudgetSummary | None:
        """Give ``target`` the caps of ``source`` when ``target`` has no ledger row yet.

        For a name that now holds other records (an edited file): the new records have a
        ledger of their own (nothing spent on the old ones moves), but the cap the data owner
        set for the name must not vanish with the edit.

        Returns:
            ``target``'s summary if caps were given, else ``None`` (``target`` already has a
            row, with its own caps, or ``source`` has no cap).
        """
        source = checked_key(source, "source")
        target = checked_key(target, "target")
        if source == target:
            return None
        with self._write() as session:
            rows = {
                key: self._lock_budget(session, key, create=False)
                for key in sorted((source, target))
            }
            old, new = rows[source], rows[target]
            if new is not None or old is None:
                return None
            if old.epsilon_cap is None and old.delta_cap is None:
                return None
            new = self._lock_budget(session, target, create=True)
            assert new is not None
            if any((new.epsilon_spent, new.delta_spent, new.epsilon_reserved, new.delta_reserved)):
                return None  # another writer created and used the row first: it has its own
            new.epsilon_cap, new.delta_cap = old.epsilon_cap, old.delta_cap
            new.updated_at = utcnow()
            self._check_totals(new)
            return summary_of(new)


def _add_budget(new: DatasetBudget, old: DatasetBudget) -> bool:
    """Add ``old``'s spent and reserved amounts to ``new``'s, and give ``new`` the stricter of
    the two caps (per quantity; no cap counts as the loosest). A cap below what the two have
    committed together becomes that total; returns whether any cap was so clamped."""
    clamped = False
    for name in ("epsilon", "delta"):
        spent = add_exact(getattr(new, f"{name}_spent"), getattr(old, f"{name}_spent"))
        reserved = add_exact(getattr(new, f"{name}_reserved"), getattr(old, f"{name}_reserved"))
        cap = stricter_cap(getattr(new, f"{name}_cap"), getattr(old, f"{name}_cap"))
        committed = add_exact(spent, reserved)
        if cap is not None and committed > cap:
            cap, clamped = committed, True
        setattr(new, f"{name}_spent", spent)
        setattr(new, f"{name}_reserved", reserved)
        setattr(new, f"{name}_cap", cap)
    new.privacy_unit = _merged_unit(new.privacy_unit, old.privacy_unit)
    return clamped


def _merged_unit(target: str | None, source: str | None) -> str | None:
    """The unit of two ledgers of the same records, merged: the bound one's; two different
    units (the records were spent at two levels already) merge to ``example``, the level
    that forbids counting people from then on (fail closed: a person's budget is never
    assumed to be higher than its rows' spending allows)."""
    if target is None or source is None or target == source:
        return target or source
    return EXAMPLE_UNIT


def _move_entries(session: Session, source: str, target: str, note: str) -> int | None:
    """Re-key every ledger entry of ``source`` to ``target``, ``note`` appended to each
    entry's note, in the caller's transaction; returns how many moved."""
    return session.execute(
        update(LedgerEntry)
        .where(LedgerEntry.dataset == source)
        .values(dataset=target, note=LedgerEntry.note + note)
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]


def _move_sweep_totals(session: Session, source: str, target: str) -> None:
    """Re-key the sweeps' running totals of ``source`` to ``target``, in the caller's
    transaction."""
    # The sweeps' running totals follow their entries (merged with the target's own
    # totals for a sweep that, unusually, has entries under both keys).
    for totals in session.scalars(select(SweepTotals).where(SweepTotals.dataset == source)).all():
        there = session.scalars(
            select(SweepTotals).where(
                SweepTotals.dataset == target, SweepTotals.sweep_id == totals.sweep_id
            )
        ).one_or_none()
        if there is None:
            totals.dataset = target
            continue
        for field in TOTAL_AMOUNTS:
            setattr(there, field, add_exact(getattr(there, field), getattr(totals, field)))
        there.reservations = there.reservations + totals.reservations
        session.delete(totals)
