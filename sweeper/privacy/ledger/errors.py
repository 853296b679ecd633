"""The ledger's refusals: a reservation past a cap, a charge past a reservation, an operation
on a sweep that already ended."""

from __future__ import annotations

from decimal import Decimal

from dpsweep.errors import PrivacyError

__all__ = ["AllowanceExhausted", "BudgetExhausted", "ReservationExceeded", "SweepEnded"]


class BudgetExhausted(PrivacyError):
    """A reservation would take a dataset past its lifetime ε or δ cap; nothing was reserved.

    Attributes:
        dataset: The dataset key.
        quantity: ``"epsilon"`` or ``"delta"``, whichever cap refused.
        requested: The amount asked for.
        remaining: What the cap still allowed.
    """

    def __init__(
        self, message: str, *, dataset: str, quantity: str, requested: Decimal, remaining: Decimal
    ) -> None:
        super().__init__(message)
        self.dataset = dataset
        self.quantity = quantity
        self.requested = requested
        self.remaining = remaining


class AllowanceExhausted(BudgetExhausted):
    """A reservation would take an analyst past the ε allowance the data owner granted them;
    nothing was reserved (HTTP 409, like the lifetime cap)."""


class ReservationExceeded(PrivacyError):
    """A charge is larger than what its sweep still holds in reservation; nothing was charged.

    Attributes:
        dataset: The dataset key.
        sweep_id: The sweep that tried to charge.
        quantity: ``"epsilon"`` or ``"delta"``, whichever was short.
        requested: The amount the charge asked for.
        outstanding: What the sweep still held.
    """

    def __init__(
        self,
        message: str,
        *,
        dataset: str,
        sweep_id: str,
        quantity: str,
        requested: Decimal,
        outstanding: Decimal,
    ) -> None:
        super().__init__(message)
        self.dataset = dataset
        self.sweep_id = sweep_id
        self.quantity = quantity
        self.requested = requested
        self.outstanding = outstanding


class SweepEnded(ReservationExceeded):
    """The sweep's reservation was released (it ended on this dataset key): the ledger takes
    no charge for it, zero included, and no new reservation; nothing was recorded.

    A :class:`ReservationExceeded` (the sweep holds nothing any more), so every caller that
    refuses to run a trial whose charge failed refuses this one too. The sweep driver reads it
    as "the sweep ended: do not run this trial", never as a crash.
    """
