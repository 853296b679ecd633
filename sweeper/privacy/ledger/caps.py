"""Setting a dataset's lifetime caps: set them outright, or only tighten them."""

from __future__ import annotations

from decimal import Decimal

from dpsweep.errors import ConfigError
from sweeper.privacy.ledger.amounts import (
    add_exact,
    delta_amount,
    epsilon_amount,
    show_amount,
    stricter_cap,
)
from sweeper.privacy.ledger.core import LedgerCore
from sweeper.privacy.ledger.keys import checked_key, dataset_label
from sweeper.privacy.ledger.records import BudgetSummary, summary_of
from sweeper.privacy.ledger.rows import utcnow

__all__ = ["CapOperations"]


class CapOperations(LedgerCore):
    """The ledger's cap operations (part of :class:`~sweeper.privacy.ledger.BudgetLedger`)."""

    def set_cap(
        self,
        dataset: str,
        *,
        epsilon_cap: float | Decimal | None = None,
        delta_cap: float | Decimal | None = None,
    ) -> BudgetSummary:
        """Set a dataset's lifetime caps (both of them: ``None`` means no cap).

        A cap may be lowered, but not below what is already spent plus reserved: outstanding
        reservations may still be charged, and the cap must hold after they are.

        Args:
            dataset: The dataset key.
            epsilon_cap: Lifetime ε cap, finite and >= 0, or ``None`` for no cap.
            delta_cap: Lifetime δ cap in [0, 1), or ``None`` for no cap.

        Returns:
            The dataset's summary after the change.

        Raises:
            ConfigError: If a value is invalid or a cap is below spent + reserved.
        """
        dataset = checked_key(dataset, "dataset")
        epsilon = None if epsilon_cap is None else epsilon_amount(epsilon_cap, "epsilon_cap")
        delta = None if delta_cap is None else delta_amount(delta_cap, "delta_cap")
        with self._write() as session:
            budget = self._lock_budget(session, dataset, create=True)
            assert budget is not None
            for field, cap, spent, reserved in (
                ("epsilon_cap", epsilon, budget.epsilon_spent, budget.epsilon_reserved),
                ("delta_cap", delta, budget.delta_spent, budget.delta_reserved),
            ):
                committed = add_exact(spent, reserved)
                if cap is not None and cap < committed:
                    raise ConfigError(
                        f"{field}={show_amount(cap)} for {dataset_label(dataset)} is below what is "
                        f"already committed ({show_amount(spent)} spent + {show_amount(reserved)} "
                        "reserved); release or finish the outstanding sweeps first",
                        field=field,
                    )
            budget.epsilon_cap = epsilon
            budget.delta_cap = delta
            budget.updated_at = utcnow()
            self._check_totals(budget)
            return summary_of(budget)

    def tighten_caps(
        self,
        dataset: str,
        *,
        epsilon_cap: float | Decimal | None = None,
        delta_cap: float | Decimal | None = None,
    ) -> BudgetSummary:
        """Lower a dataset's caps to these values where that is stricter; never raise them.

        For caps given by someone who is not the only holder of the data (an upload of
        records that are already known): they may add a restriction, never lift one.

        Args:
            dataset: The dataset key.
            epsilon_cap: An ε cap to apply if stricter than the current one (``None``: leave).
            delta_cap: A δ cap to apply if stricter than the current one (``None``: leave).

        Returns:
            The dataset's summary after the change.

        Raises:
            ConfigError: If a value is invalid or the resulting cap is below spent + reserved.
        """
        dataset = checked_key(dataset, "dataset")
        epsilon = None if epsilon_cap is None else epsilon_amount(epsilon_cap, "epsilon_cap")
        delta = None if delta_cap is None else delta_amount(delta_cap, "delta_cap")
        with self._write() as session:
            budget = self._lock_budget(session, dataset, create=True)
            assert budget is not None
            caps = {
                "epsilon_cap": stricter_cap(budget.epsilon_cap, epsilon),
                "delta_cap": stricter_cap(budget.delta_cap, delta),
            }
            for field, spent, reserved in (
                ("epsilon_cap", budget.epsilon_spent, budget.epsilon_reserved),
                ("delta_cap", budget.delta_spent, budget.delta_reserved),
            ):
                cap = caps[field]
                committed = add_exact(spent, reserved)
                if cap is not None and cap < committed:
                    raise ConfigError(
                        f"{field}={show_amount(cap)} for {dataset_label(dataset)} is below what is "
                        f"already committed ({show_amount(spent)} spent + {show_amount(reserved)} "
                        "reserved)",
                        field=field,
                    )
            budget.epsilon_cap, budget.delta_cap = caps["epsilon_cap"], caps["delta_cap"]
            budget.updated_at = utcnow()
            self._check_totals(budget)
            return summary_of(budget)
