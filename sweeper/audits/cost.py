"""What an audit will charge, shown before anything is charged, and the refusal of a charge
nobody confirmed (issue 51).

An audit of a private dataset spends its owner's budget for good (the claimed epsilon, the
K trials' T steps composed), so it is quoted first and runs only when confirmed: ``--yes`` or
a yes at the prompt on the CLI, ``confirm: true`` on the API. :func:`audit_cost` reads the
ledger and writes nothing; its ``epsilon`` and ``delta`` are the very figures
:func:`sweeper.audits.service.charge_audit` reserves (both are the prepared audit's claim).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine

from dpsweep.errors import ConfigError
from sweeper.audits.prepare import PreparedAudit
from sweeper.datasets.identity import owner_of
from sweeper.privacy.ledger.amounts import epsilon_amount, show_amount
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.keys import scoped_identity_key

__all__ = ["AuditCost", "AuditNotConfirmed", "audit_cost"]


@dataclass(frozen=True)
class AuditCost:
    """An audit's charge and the ledger it goes to, before it is charged."""

    dataset: str
    public: bool  # public records: nothing is charged, nothing to confirm
    epsilon: float  # the claimed epsilon: what is reserved and charged on private data
    delta: float
    ledger: str | None  # the ledger key (None: public data)
    epsilon_spent: Decimal | None  # spent and reserved so far (None: public data)
    epsilon_left: Decimal | None  # what the cap leaves now (None: no cap, or public data)

    @property
    def charged(self) -> bool:
        """Whether the audit spends budget (and so must be confirmed)."""
        return not self.public

    @property
    def epsilon_left_after(self) -> Decimal | None:
        """What the cap would leave after the charge (None: no cap, or public data)."""
        if self.public or self.epsilon_left is None:
            return None
        return self.epsilon_left - epsilon_amount(self.epsilon)

    def describe(self) -> str:
        """One line: the charge, on whose ledger, and the ε the cap leaves before and after."""
        if self.public:
            return f"public data ({self.dataset!r}): this audit charges nothing"
        line = (
            f"this audit charges ε {self.epsilon:.4g}, δ {self.delta:g} to the lifetime budget "
            f"of {self.dataset!r} (ledger {self.ledger}; spent or reserved so far ε "
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
            "epsilon": 0.0 if self.public else self.epsilon,
            "delta": 0.0 if self.public else self.delta,
            "epsilon_claimed": self.epsilon,
            "epsilon_spent": number(self.epsilon_spent),
            "epsilon_left_before": number(self.epsilon_left),
            "epsilon_left_after": number(after),
            "fits": after is None or after >= 0,
            "text": self.describe(),
        }


class AuditNotConfirmed(ConfigError):
    """An audit that would be charged, sent without ``confirm``: refused, nothing reserved.

    Attributes:
        cost: What it would have charged (the API returns it in the 422's ``cost``).
    """

    def __init__(self, cost: AuditCost, *, how: str = "send confirm: true to charge it") -> None:
        super().__init__(f"{cost.describe()}; nothing was reserved: {how}", field="confirm")
        self.cost = cost


def audit_cost(engine: Engine, prepared: PreparedAudit) -> AuditCost:
    """What :func:`sweeper.audits.service.charge_audit` will charge ``prepared``, read-only
    (nothing is bound, reserved or charged)."""
    if prepared.public:
        return AuditCost(
            dataset=prepared.dataset,
            public=True,
            epsilon=prepared.epsilon_claimed,
            delta=prepared.delta,
            ledger=None,
            epsilon_spent=None,
            epsilon_left=None,
        )
    key = prepared.ledger_key
    if key is None:
        # A loader name is bound to its records when charged (charge_audit's bind_name); its
        # ledger is the records', in the scope of the name's owner if it has a row.
        key = scoped_identity_key(prepared.content_sha256, owner=owner_of(engine, prepared.dataset))
    summary = BudgetLedger(engine).summary(key)
    return AuditCost(
        dataset=prepared.dataset,
        public=False,
        epsilon=prepared.epsilon_claimed,
        delta=prepared.delta,
        ledger=key,
        epsilon_spent=summary.epsilon_spent + summary.epsilon_reserved,
        epsilon_left=summary.remaining.epsilon,
    )
