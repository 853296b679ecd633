"""What a one-off run (``dpsweep train``, a canary audit) will charge, shown before it is.

A run outside a sweep on private records spends their owner's budget for good, so it is quoted
first and runs only when confirmed: ``--yes`` or a yes at the prompt on the CLI,
``confirm: true`` on the API. A :class:`OneOffCost` is read from the ledger and writes nothing;
its epsilon and delta are the very figures the charge reserves.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine

from dpsweep.errors import ConfigError
from dpsweep.plan_fields import unit_suffix
from sweeper.privacy.ledger.amounts import epsilon_amount, show_amount
from sweeper.privacy.ledger.budget_ledger import BudgetLedger


@dataclass(frozen=True)
class OneOffCost:
    """A one-off run's charge and the ledger it goes to, before it is charged.

    Args:
        what: What is charged, in words ("this run", "this audit").
        dataset: The dataset as the user named it.
        public: Public records (a shared set, or declared public): nothing to confirm.
        epsilon: The epsilon reserved and charged (None: a non-private run, nothing charged).
        delta: Its delta.
        ledger: The ledger's key (None: not read, e.g. an audit of public data).
        epsilon_spent: Spent and reserved on that ledger so far (None: not read).
        epsilon_left: What its cap leaves now (None: no cap, or not read).
        privacy_unit: What each ε protects (``person``: all of a person's rows; None or
            ``example``: one record), named in the quote.
    """

    what: str
    dataset: str
    public: bool
    epsilon: float | None
    delta: float
    ledger: str | None
    epsilon_spent: Decimal | None
    epsilon_left: Decimal | None
    privacy_unit: str | None = None

    @property
    def charged(self) -> bool:
        """Whether the run spends a private dataset's budget (and so must be confirmed)."""
        return not self.public and self.epsilon is not None

    @property
    def epsilon_left_after(self) -> Decimal | None:
        """What the cap would leave after the charge (None: no cap, or nothing charged)."""
        if not self.charged or self.epsilon_left is None or self.epsilon is None:
            return None
        return self.epsilon_left - epsilon_amount(self.epsilon)

    def describe(self) -> str:
        """One line: the charge, on whose ledger, and the ε the cap leaves before and after."""
        if self.public:
            return f"public data ({self.dataset!r}): {self.what} charges nothing to confirm"
        if self.epsilon is None:
            return f"{self.what} adds no noise: nothing is charged"
        line = (
            f"{self.what} charges ε {self.epsilon:.4g}{unit_suffix(self.privacy_unit)}, "
            f"δ {self.delta:g} to the lifetime "
            f"budget of {self.dataset!r} (ledger {self.ledger}; spent or reserved so far ε "
            f"{show_amount(self.epsilon_spent or Decimal(0))}"
        )
        after = self.epsilon_left_after
        if self.epsilon_left is None or after is None:
            return line + "; no cap)"
        line += f"; ε left {show_amount(self.epsilon_left)} → {show_amount(after)}"
        if after < 0:
            return line + ": more than the cap leaves, so it will be refused)"
        return line + ")"

    def to_dict(self) -> dict[str, Any]:
        """The cost as JSON (exact amounts as floats, for reading; the ledger keeps them)."""
        after = self.epsilon_left_after

        def number(value: Decimal | None) -> float | None:
            return None if value is None else float(value)

        return {
            "charged": self.charged,
            "dataset": self.dataset,
            "ledger": self.ledger,
            "epsilon": self.epsilon if self.charged else 0.0,
            "delta": self.delta if self.charged else 0.0,
            "epsilon_claimed": self.epsilon,
            "epsilon_spent": number(self.epsilon_spent),
            "epsilon_left_before": number(self.epsilon_left),
            "epsilon_left_after": number(after),
            "privacy_unit": self.privacy_unit or "example",
            "fits": after is None or after >= 0,
            "text": self.describe(),
        }


def read_cost(
    engine: Engine,
    *,
    what: str,
    dataset: str,
    public: bool,
    epsilon: float | None,
    delta: float,
    ledger: str,
    privacy_unit: str | None = None,
) -> OneOffCost:
    """The cost of charging ``epsilon`` (per ``privacy_unit``) on ``ledger``, read-only."""
    summary = BudgetLedger(engine).summary(ledger)
    return OneOffCost(
        what=what,
        dataset=dataset,
        public=public,
        epsilon=epsilon,
        delta=delta,
        ledger=ledger,
        epsilon_spent=summary.epsilon_spent + summary.epsilon_reserved,
        epsilon_left=summary.remaining.epsilon,
        privacy_unit=privacy_unit,
    )


class NotConfirmed(ConfigError):
    """A charge on private records that nobody confirmed: refused, nothing reserved or charged.

    Attributes:
        cost: What it would have charged (the API returns it in the 422's ``cost``).
    """

    def __init__(
        self,
        cost: OneOffCost,
        *,
        how: str = "Send confirm: true to charge it",
        nothing: str = "nothing was reserved",
    ) -> None:
        super().__init__(f"{cost.describe()}; {nothing}. {how}", field="confirm")
        self.cost = cost
