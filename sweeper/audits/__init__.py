"""Canary audits of a run's epsilon: the service behind ``dpsweep audit`` and
``/api/v1/audits`` (issue 38). The training and the bound are the workers'
(:mod:`workers.canary_audit`); here: who may audit, what is charged, and the stored audits.

* :mod:`sweeper.audits.prepare` — the request checked and the run settled, nothing charged;
* :mod:`sweeper.audits.cost` — what an audit will charge, quoted before it is confirmed;
* :mod:`sweeper.audits.service` — charge, store, run, read and page.
"""

from __future__ import annotations

from sweeper.audits.cost import AuditCost, AuditNotConfirmed, audit_cost
from sweeper.audits.prepare import PreparedAudit, check_owner, is_public_dataset, prepare_audit
from sweeper.audits.service import (
    AuditNotFound,
    audit_view,
    charge_audit,
    get_audit,
    page_audits,
    quote_audit,
    run_audit_row,
    start_audit,
    start_prepared,
)

__all__ = [
    "AuditCost",
    "AuditNotConfirmed",
    "AuditNotFound",
    "PreparedAudit",
    "audit_cost",
    "audit_view",
    "charge_audit",
    "check_owner",
    "get_audit",
    "is_public_dataset",
    "page_audits",
    "prepare_audit",
    "quote_audit",
    "run_audit_row",
    "start_audit",
    "start_prepared",
]
