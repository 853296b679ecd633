"""The audit log of releases: who received what, from which sweep and trial, at what ε, when.

Each entry is written in the same transaction as the release it records, so the log lists
exactly the releases that happened, in the order they happened, through crashes and resumes
(a unique key on sweep, trial and kind makes a repeated write a no-op). The table is
append-only: the database refuses updates and deletes (migration 0007's triggers), and no
route writes to it.

What counts as a release (each reaches the sweep's owner, and its dataset's owner):

* ``trial``: a trial's metrics, when it finishes; ε is what the trial was charged.
* ``trial-failed``: a charged trial's failure (its error is shown); ε is its charge.
* ``trial-cancelled``: a charged trial stopped by a cancel (its streamed history was shown);
  ε is its charge. The cancel releases the sweep's reservation first, so the ledger takes no
  charge after it, and logs only the trials charged by then: a trial it caught between its
  claim and its charge never runs and is never logged.
* ``selected-trial``: a papernot-steinke grid's one release, when its search completes; ε is
  the grid's one whole-search charge. Its runs are never logged one by one (their number is
  secret).
* ``model``: a kept model (:mod:`sweeper.artifacts`), covered by its trial's release (ε 0).
* ``audit``: a canary audit of the records (its bound reaches whoever asked for it); ε is
  what it was charged, logged with the charge. ``sweep_id`` is the audit's id.
* ``train``: a one-off ``dpsweep train`` run (its model and metrics reach its user); ε is
  its charge, logged with it. ``sweep_id`` is the run's id.

The dataset's owner reads every entry on its records; an analyst reads their own. The table's
ids are global (every tenant's releases share them), so readers are shown each entry's number
in their own log instead (:func:`sweeper.datasets.analyst_views.audit_page`).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from sweeper.privacy.ledger.amounts import ZERO, add_exact
from sweeper.privacy.ledger.rows import EntryKind, LedgerEntry
from sweeper.store import ReleaseRecord, Sweep, iso, sweep_ledger_key

KINDS = ("trial", "trial-failed", "trial-cancelled", "selected-trial", "model", "audit", "train")


def charged(session: Session, sweep: Sweep, trial_ids: list[str]) -> tuple[Decimal, Decimal]:
    """The ε and δ the ledger charged ``sweep`` for ``trial_ids`` (exact sums)."""
    rows = session.execute(
        select(LedgerEntry.epsilon, LedgerEntry.delta).where(
            LedgerEntry.dataset == sweep_ledger_key(sweep),
            LedgerEntry.sweep_id == sweep.id,
            LedgerEntry.kind == EntryKind.CHARGE,
            LedgerEntry.trial_id.in_(trial_ids),
        )
    ).all()
    eps, dlt = ZERO, ZERO
    for e, d in rows:
        eps, dlt = add_exact(eps, e), add_exact(dlt, d)
    return eps, dlt


def charged_trials(session: Session, sweep: Sweep, trial_ids: list[str]) -> set[str]:
    """Which of ``trial_ids`` the ledger charged (at any ε, zero included): the trials that
    touched data. Once the sweep is released the ledger takes no more charges, so this is
    final: a trial not in it never ran."""
    if not trial_ids:
        return set()
    rows = session.scalars(
        select(LedgerEntry.trial_id)
        .where(
            LedgerEntry.dataset == sweep_ledger_key(sweep),
            LedgerEntry.sweep_id == sweep.id,
            LedgerEntry.kind == EntryKind.CHARGE,
            LedgerEntry.trial_id.in_(trial_ids),
        )
        .distinct()
    )
    return {tid for tid in rows if tid is not None}


def record(
    session: Session,
    sweep: Sweep,
    *,
    trial_id: str,
    kind: str,
    grid: str | None,
    epsilon: Decimal,
    delta: Decimal,
    detail: dict[str, Any] | None = None,
) -> bool:
    """Append a release to the log (inside the release's own transaction).

    Returns:
        Whether it was new (a release already logged is not logged again).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown release kind {kind!r}")
    exists = session.scalar(
        select(ReleaseRecord.id).where(
            ReleaseRecord.sweep_id == sweep.id,
            ReleaseRecord.trial_id == trial_id,
            ReleaseRecord.kind == kind,
        )
    )
    if exists is not None:
        return False
    session.add(
        ReleaseRecord(
            dataset=sweep_ledger_key(sweep),
            dataset_name=sweep.dataset,
            principal=sweep.owner,
            sweep_id=sweep.id,
            trial_id=trial_id,
            kind=kind,
            grid=grid,
            epsilon=epsilon,
            delta=delta,
            detail=detail or {},
        )
    )
    session.flush()
    return True


def record_run(
    engine: Engine,
    *,
    ledger_key: str,
    dataset_name: str,
    principal: str | None,
    run_id: str,
    kind: str,
    epsilon: float | Decimal,
    delta: float | Decimal,
    detail: dict[str, Any] | None = None,
) -> None:
    """Log a charge that belongs to no sweep: an audit's or a ``dpsweep train`` run's.

    Written right after the run's charge commits, before anything of it is released (an
    audit's bound, a trained model): a crash between the two leaves the charge without its
    entry, never a release without its charge. Writing it twice is a no-op.
    """
    if kind not in ("audit", "train"):
        raise ValueError(f"not a run's release kind: {kind!r}")
    with Session(engine) as session, session.begin():
        exists = session.scalar(
            select(ReleaseRecord.id).where(
                ReleaseRecord.sweep_id == run_id,
                ReleaseRecord.trial_id == "",
                ReleaseRecord.kind == kind,
            )
        )
        if exists is not None:
            return
        session.add(
            ReleaseRecord(
                dataset=ledger_key,
                dataset_name=dataset_name,
                principal=principal,
                sweep_id=run_id,
                trial_id="",
                kind=kind,
                grid=None,
                epsilon=Decimal(str(epsilon)) if isinstance(epsilon, float) else epsilon,
                delta=Decimal(str(delta)) if isinstance(delta, float) else delta,
                detail=detail or {},
            )
        )


def record_trial(
    session: Session, sweep: Sweep, *, trial_id: str, grid: str, kind: str, what: list[str]
) -> None:
    """Log a shown trial's release (``trial`` or ``trial-failed``) with its charge."""
    eps, dlt = charged(session, sweep, [trial_id])
    record(
        session,
        sweep,
        trial_id=trial_id,
        kind=kind,
        grid=grid,
        epsilon=eps,
        delta=dlt,
        detail={"released": sorted(what)},
    )


def record_selected(
    session: Session, sweep: Sweep, *, trial_id: str, grid: str, run_ids: list[str]
) -> bool:
    """Log a papernot-steinke grid's release of its selected trial, with the grid's charge
    (the detail says nothing of the number of runs)."""
    eps, dlt = charged(session, sweep, run_ids)
    return record(
        session,
        sweep,
        trial_id=trial_id,
        kind="selected-trial",
        grid=grid,
        epsilon=eps,
        delta=dlt,
        detail={"released": ["metrics", "params"], "accounting": "papernot-steinke"},
    )


def entry_view(r: ReleaseRecord) -> dict[str, Any]:
    """An entry as the API shows it, but with the table's global id (the API shows the
    entry's number in its reader's log instead: never this one to a tenant)."""
    return {
        "id": r.id,
        "at": iso(r.created_at),
        "principal": r.principal,
        "dataset": r.dataset_name,
        "sweep_id": r.sweep_id,
        "trial_id": r.trial_id or None,
        "kind": r.kind,
        "grid": r.grid,
        "epsilon": float(r.epsilon),
        "delta": float(r.delta),
        "detail": r.detail,
    }


def read_log(
    engine: Engine,
    ledger_key: str,
    *,
    principal: str | None = None,
    everyone: bool,
    after: int | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """The log's entries on the records of ``ledger_key``, oldest first.

    Args:
        ledger_key: The records' ledger key.
        principal: Whose entries (an analyst's own); ignored with ``everyone``.
        everyone: Every principal's entries (the dataset's owner).
        after: Only entries with a larger id (the cursor of the previous page).
        limit: At most this many.
    """
    stmt = select(ReleaseRecord).where(ReleaseRecord.dataset == ledger_key)
    if not everyone:
        stmt = stmt.where(ReleaseRecord.principal == principal)
    if after is not None:
        stmt = stmt.where(ReleaseRecord.id > after)
    with Session(engine) as session:
        rows = session.scalars(stmt.order_by(ReleaseRecord.id).limit(limit))
        return [entry_view(r) for r in rows]
