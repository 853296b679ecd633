"""What an audit will charge, shown before anything is charged, and the refusal of a charge
nobody confirmed (issue 51).

An audit of a private dataset spends its owner's budget for good (the claimed epsilon, the
K trials' T steps composed), so it is quoted first and runs only when confirmed: ``--yes`` or
a yes at the prompt on the CLI, ``confirm: true`` on the API. :func:`audit_cost` reads the
ledger and writes nothing; its ``epsilon`` and ``delta`` are the very figures
:func:`sweeper.audits.service.charge_audit` reserves (both are the prepared audit's claim).
"""

from __future__ import annotations

from sqlalchemy import Engine

from sweeper.audits.prepare import PreparedAudit
from sweeper.datasets.identity import owner_of
from sweeper.privacy.ledger.keys import scoped_identity_key
from sweeper.runs.one_off_cost import NotConfirmed, OneOffCost, read_cost

__all__ = ["AuditCost", "AuditNotConfirmed", "audit_cost"]


#: An audit's cost is a one-off run's (:mod:`sweeper.runs.one_off_cost`), said of "this audit".
AuditCost = OneOffCost


#: An audit sent without ``confirm`` (a one-off run's refusal, :class:`NotConfirmed`).
AuditNotConfirmed = NotConfirmed


def audit_cost(engine: Engine, prepared: PreparedAudit) -> AuditCost:
    """What :func:`sweeper.audits.service.charge_audit` will charge ``prepared``, read-only
    (nothing is bound, reserved or charged)."""
    if prepared.public:
        return AuditCost(
            what="this audit",
            dataset=prepared.dataset,
            public=True,
            epsilon=prepared.epsilon_claimed,
            delta=prepared.delta,
            ledger=None,
            epsilon_spent=None,
            epsilon_left=None,
            privacy_unit=prepared.privacy_unit,
        )
    key = prepared.ledger_key
    if key is None:
        # A loader name is bound to its records when charged (charge_audit's bind_name); its
        # ledger is the records', in the scope of the name's owner if it has a row.
        key = scoped_identity_key(prepared.content_sha256, owner=owner_of(engine, prepared.dataset))
    return read_cost(
        engine,
        what="this audit",
        dataset=prepared.dataset,
        public=False,
        epsilon=prepared.epsilon_claimed,
        delta=prepared.delta,
        ledger=key,
        privacy_unit=prepared.privacy_unit,
    )
