"""The one cap check: what would take a ledger past its lifetime cap is refused, exactly.

The ledger runs it under its lock when it reserves (:meth:`Reservations.reserve`); a sweep's
submission runs the same function first, as a pre-check that fails before anything is stored
(:func:`sweeper.sweeps.create`). One function, so that the pre-check can never say "fits"
where the ledger would refuse, and the two refusals read alike.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sweeper.privacy.ledger.amounts import ZERO, cap_left, show_amount, show_amounts, sub_exact
from sweeper.privacy.ledger.errors import AllowanceExhausted, BudgetExhausted


def check_caps(
    budget: Any,
    *,
    epsilon: Decimal,
    delta: Decimal,
    dataset: str,
    who: str,
    asks: str,
    analyst: bool,
) -> None:
    """Refuse ``epsilon`` and ``delta`` if either would take ``spent + reserved`` past its cap.

    Args:
        budget: the ledger's budget row or summary (caps, spent and reserved amounts).
        epsilon: the epsilon asked for (exact).
        delta: the delta asked for (exact).
        dataset: the ledger's name in the error.
        who: the message's subject, e.g. ``"dataset 'x': the sweep"``.
        asks: its verb, e.g. ``"asks for"``.
        analyst: the asker is an analyst: the refusal shows none of the cap's figures (they
            would tell what the owner and other analysts spent on the records).

    Raises:
        BudgetExhausted: the first quantity that does not fit (epsilon, then delta).
    """
    for quantity, asked, cap, spent, reserved in (
        ("epsilon", epsilon, budget.epsilon_cap, budget.epsilon_spent, budget.epsilon_reserved),
        ("delta", delta, budget.delta_cap, budget.delta_spent, budget.delta_reserved),
    ):
        left = cap_left(cap, spent, reserved)
        # Exact, no tolerance: asked <= left  <=>  spent + reserved + asked <= cap.
        if left is None or asked <= left:
            continue
        if analyst:
            raise BudgetExhausted(
                f"{who} does not fit what remains of the dataset's lifetime cap; ask its owner",
                dataset=dataset,
                quantity=quantity,
                requested=asked,
                remaining=ZERO,
            )
        shown_asked, shown_left = show_amounts(asked, left)
        raise BudgetExhausted(
            f"{who} {asks} {quantity}={shown_asked} but only {shown_left} remains of the "
            f"lifetime cap {show_amount(cap or ZERO)} ({show_amount(spent)} spent, "
            f"{show_amount(reserved)} reserved by running sweeps)",
            dataset=dataset,
            quantity=quantity,
            requested=asked,
            remaining=left,
        )


def check_allowance(
    *,
    epsilon: Decimal,
    used: Decimal,
    allowance: Decimal,
    analyst: str | None,
    dataset: str,
    who: str,
    asks: str,
) -> None:
    """Refuse ``epsilon`` if the analyst's sweeps, holding ``used``, would pass ``allowance``.

    The ledger runs it under its lock (with ``used`` read in the same transaction); a sweep's
    submission runs it first as a pre-check. Same arguments as :func:`check_caps`.

    Raises:
        AllowanceExhausted: ``used + epsilon`` would exceed ``allowance``.
    """
    left = sub_exact(allowance, used) if used <= allowance else ZERO
    if epsilon <= left:
        return
    shown_asked, shown_left = show_amounts(epsilon, left)
    raise AllowanceExhausted(
        f"{who} {asks} epsilon={shown_asked} but only {shown_left} remains of the allowance of "
        f"{show_amount(allowance)} the data owner granted {analyst!r} ({show_amount(used)} "
        "held by their sweeps); ask the owner for more",
        dataset=dataset,
        quantity="epsilon",
        requested=epsilon,
        remaining=left,
    )
