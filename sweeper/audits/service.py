"""Audits: quote, charge, store, run (in the foreground or a background thread), read and page.

:func:`start_audit` is the API's path, :func:`start_prepared` the CLI's (which shows the cost
and asks in between): the request is checked and the run settled
(:func:`sweeper.audits.prepare.prepare_audit`); on a private dataset the charge must be
confirmed (:mod:`sweeper.audits.cost`: the cost is quoted first), then the claimed epsilon is
reserved and charged (:func:`charge_audit`, as ``dpsweep train`` charges a run); only then is
the audit stored (state ``running``) and trained. A refused request (a bad setting, an
analyst, an unconfirmed charge, a cap that cannot cover it) stores nothing and charges nothing.

A failed audit stores a fixed public reason (:mod:`sweeper.driver.failures`); the exception's
text goes to the operator's log only.
"""

from __future__ import annotations

import logging
import math
import threading
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, literal, select, tuple_
from sqlalchemy.orm import Session

from dpsweep.audit import AuditRequest, result_view
from dpsweep.errors import ConfigError, NotFound
from sweeper.audits.cost import AuditCost, AuditNotConfirmed, audit_cost
from sweeper.audits.prepare import PreparedAudit, prepare_audit
from sweeper.datasets.access import Viewer
from sweeper.driver.failures import log_failure
from sweeper.runs.one_off_charge import OneOffCharge, charge_one_off
from sweeper.store import Audit, AuditState, iso, new_id
from sweeper.store.cursors import Page, decode_cursor, encode_cursor

log = logging.getLogger("dpsweep.audits")

#: Audits a process trains at once (the others wait their turn in their threads).
_RUNNING = threading.BoundedSemaphore(1)


class AuditNotFound(NotFound):
    """No such audit, or someone else's."""


def charge_audit(
    engine: Engine, prepared: PreparedAudit, audit_id: str, *, principal: str | None = None
) -> dict[str, Any] | None:
    """Reserve and charge a private dataset's ledger the audit's claimed epsilon, before
    anything trains, and log the charge in the release log (kind ``audit``), so every ε
    committed is attributable: the one charge of one-off runs
    (:func:`sweeper.runs.one_off_charge.charge_one_off`, as ``dpsweep train``'s).

    Public data (a shared set or one declared public) is charged nothing (returns None).

    Raises:
        BudgetExhausted: the dataset's cap cannot cover the claim (nothing is charged).
    """
    if prepared.public:
        return None
    # A loader name read locally (a factory) has no ledger yet: it is bound here to the
    # records read, as `dpsweep train` binds it (one_off_charge.ledger_key_for).
    charge = OneOffCharge(
        dataset=prepared.dataset,
        stored=False,
        content_sha256=prepared.content_sha256,
        config={"name": prepared.dataset, "path": None},
        epsilon=prepared.epsilon_claimed,
        delta=prepared.delta,
        kind="audit",
        run_id=audit_id,
        note=f"dpsweep audit: {prepared.trials} {prepared.pack.strategy} trial(s) on "
        f"{prepared.dataset!r}",
        principal=principal,
        detail={
            "released": ["epsilon_lower_bound", "claim_p_value", "noise_scale_upper_bound"],
            "setting": prepared.request.setting,
            "privacy_unit": prepared.privacy_unit,
        },
        # Per unit on a dataset with one: the ledger refuses a charge at another unit.
        privacy_unit=prepared.privacy_unit,
    )
    charge_one_off(engine, charge, ledger_key=prepared.ledger_key)
    run, eps, delta = f"audit_{audit_id}", prepared.epsilon_claimed, prepared.delta
    return {
        "run": run,
        "dataset": prepared.dataset,
        "epsilon_charged": eps,
        "delta_charged": delta,
        "privacy_unit": prepared.privacy_unit,
    }


def quote_audit(
    engine: Engine, request: AuditRequest, viewer: Viewer, *, device: str = "cpu", threads: int = 1
) -> AuditCost:
    """What ``request`` would charge, checked as :func:`start_audit` checks it; nothing is
    stored, reserved or charged.

    Raises:
        ConfigError, PermissionDenied, TrialNotFound: the audit would be refused.
    """
    prepared = prepare_audit(engine, request, viewer, device=device, threads=threads)
    return audit_cost(engine, prepared)


def start_audit(
    engine: Engine,
    request: AuditRequest,
    viewer: Viewer,
    *,
    background: bool = True,
    device: str = "cpu",
    threads: int = 1,
) -> dict[str, Any]:
    """Check, charge (when ``request.confirm`` says so), store and run one audit; its view
    (state ``running`` when in the background, else its final state).

    Raises:
        ConfigError, PermissionDenied, TrialNotFound: refused (nothing charged or stored).
        AuditNotConfirmed: private data without ``confirm`` (nothing reserved or stored).
        BudgetExhausted: the cap cannot cover the claimed epsilon (nothing charged or stored).
    """
    prepared = prepare_audit(engine, request, viewer, device=device, threads=threads)
    return start_prepared(
        engine, prepared, viewer, confirmed=request.confirm, background=background
    )


def start_prepared(
    engine: Engine,
    prepared: PreparedAudit,
    viewer: Viewer,
    *,
    confirmed: bool,
    background: bool = True,
) -> dict[str, Any]:
    """Charge (once ``confirmed``), store and run an audit :func:`prepare_audit` settled.

    Raises:
        AuditNotConfirmed: private data, not ``confirmed`` (nothing reserved or stored).
        BudgetExhausted: the cap cannot cover the claimed epsilon (nothing charged or stored).
    """
    cost = audit_cost(engine, prepared)
    if cost.charged and not confirmed:
        # Fail closed: a spend of someone's budget happens only when asked for in so many words.
        raise AuditNotConfirmed(cost)
    audit_id = new_id()
    charge = charge_audit(engine, prepared, audit_id, principal=viewer.owner)
    with Session(engine) as session, session.begin():
        session.add(
            Audit(
                id=audit_id,
                owner=viewer.owner,
                dataset=prepared.dataset,
                sweep_id=prepared.sweep_id,
                trial_id=prepared.trial_id,
                request=prepared.request.model_dump(mode="json", exclude_unset=True),
                state=AuditState.running,
                charge=charge,
            )
        )
    if background:
        threading.Thread(
            target=run_audit_row,
            args=(engine, audit_id, prepared),
            name=f"dpsweep-audit-{audit_id}",
            daemon=True,
        ).start()
        return get_audit(engine, audit_id, viewer)
    run_audit_row(engine, audit_id, prepared)
    return get_audit(engine, audit_id, viewer)


def run_audit_row(engine: Engine, audit_id: str, prepared: PreparedAudit) -> None:
    """Train the prepared audit and store its result (or its failure's public reason)."""
    # deferred: workers.canary_audit.run imports torch, and the API imports this module
    from workers.canary_audit.run import run_audit

    req = prepared.request
    try:
        with _RUNNING:
            result = run_audit(
                prepared.pack,
                setting=req.setting,
                canaries=req.canaries,
                direction=req.direction,
                confidence=req.confidence,
                dataset=prepared.data,
                public_data=prepared.public,
                canary_rows=req.canary_rows,
            )
        _finish(engine, audit_id, AuditState.succeeded, result=_finite(result.to_dict()))
    except BaseException as exc:
        failure = log_failure(log, exc, "audit %s failed", audit_id)
        _finish(engine, audit_id, AuditState.failed, error=failure.text)
        if not isinstance(exc, Exception):
            raise


def _finite(values: dict[str, Any]) -> dict[str, Any]:
    """JSON has no infinity: a non-finite float is stored as None."""
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()
    }


def _finish(
    engine: Engine,
    audit_id: str,
    state: AuditState,
    *,
    result: dict[str, Any] | None = None,
    error: str | None = None,
) -> None:
    with Session(engine) as session, session.begin():
        row = session.get(Audit, audit_id)
        if row is None:
            return
        row.state = state
        row.result = result
        row.error = error
        row.finished_at = datetime.now(UTC)


def audit_view(row: Audit) -> dict[str, Any]:
    """An audit as its owner reads it."""
    return {
        "id": row.id,
        "state": row.state.value,
        "dataset": row.dataset,
        "sweep_id": row.sweep_id,
        "trial_id": row.trial_id,
        "request": dict(row.request or {}),
        # Older results read in today's terms (the bound alone, and its verdict).
        "result": result_view(row.result),
        "charge": row.charge,
        "error": row.error,
        "created_at": iso(row.created_at),
        "finished_at": iso(row.finished_at),
    }


def _visible(stmt: Any, viewer: Viewer) -> Any:
    if viewer.admin or viewer.owner is None:
        return stmt
    return stmt.where(Audit.owner == viewer.owner)


def get_audit(engine: Engine, audit_id: str, viewer: Viewer) -> dict[str, Any]:
    """One audit the viewer asked for (admins and local use: any).

    Raises:
        AuditNotFound: no such audit, or someone else's.
    """
    with Session(engine) as session:
        row = session.scalars(_visible(select(Audit).where(Audit.id == audit_id), viewer)).first()
        if row is None:
            raise AuditNotFound(f"no audit {audit_id!r}")
        return audit_view(row)


def page_audits(
    engine: Engine,
    viewer: Viewer,
    *,
    trial: str | None = None,
    sweep: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Page:
    """The viewer's audits, newest first (of one trial or sweep when given)."""
    key = decode_cursor(cursor, length=2)
    stmt = _visible(select(Audit), viewer)
    if trial is not None:
        stmt = stmt.where(Audit.trial_id == trial)
    if sweep is not None:
        stmt = stmt.where(Audit.sweep_id == sweep)
    if key is not None:
        try:
            at = datetime.fromisoformat(str(key[0]))
        except ValueError:
            raise ConfigError("invalid cursor", field="cursor") from None
        stmt = stmt.where(tuple_(Audit.created_at, Audit.id) < tuple_(literal(at), str(key[1])))
    stmt = stmt.order_by(Audit.created_at.desc(), Audit.id.desc()).limit(limit + 1)
    with Session(engine) as session:
        rows = list(session.scalars(stmt))
        more = len(rows) > limit
        rows = rows[:limit]
        items = [audit_view(r) for r in rows]
    nxt = encode_cursor([rows[-1].created_at.isoformat(), rows[-1].id]) if more else None
    return Page(items, nxt)
