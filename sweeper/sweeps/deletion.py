"""Deleting a finished sweep: its rows and its kept models, never its privacy spend.

What a sweep spent on its dataset stays spent: the budget ledger's entries name the sweep by
id only (no foreign key), and nothing here touches them, so the dataset's lifetime spend, its
remaining budget and its audit trail are the same after the deletion as before. A sweep whose
reservation was still outstanding (its end was recorded but the release was not) gives it
back first, as its end would have.

Only an ended sweep (done, failed or cancelled) may be deleted: a pending or running one has a
driver (or will) that writes its rows and models; cancel it first. The rows go in one
transaction (trials, results, metric points, events, kept and staged models; the foreign keys
cascade too, on SQLite and PostgreSQL), then the sweep's folder in the artifact store: a row
never names a file that is gone, and a crash in between leaves only files that no row names.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from sqlalchemy import Engine, delete, select
from sqlalchemy.orm import Session

from dpsweep.errors import IllegalState, SweepNotFound
from sweeper.datasets.access import Viewer
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.settings import SweeperSettings
from sweeper.store import (
    MetricPoint,
    ModelArtifact,
    StagedModel,
    Sweep,
    SweepEvent,
    SweepState,
    Trial,
    TrialResultRow,
)
from sweeper.store.artifact_files import ArtifactStore, sweep_prefix
from sweeper.sweeps.sweep_pages import check_sweep_owner

log = logging.getLogger(__name__)

DELETABLE = frozenset({SweepState.done, SweepState.failed, SweepState.cancelled})


def delete_sweep(
    engine: Engine,
    sweep_id: str,
    viewer: Viewer,
    *,
    store: ArtifactStore,
    settle_seconds: float | None = None,
) -> None:
    """Delete an ended sweep's rows, then its kept models; its ledger entries stay.

    Args:
        engine: The store's engine.
        sweep_id: The sweep.
        viewer: Who asks (someone else's sweep is "not found").
        store: The artifact store its models are kept in.
        settle_seconds: How long after its driver's last heartbeat a cancelled sweep may
            still have a driver stopping its trials (default: from the sweeper's settings,
            :func:`settle_time`).

    Raises:
        SweepNotFound: no such sweep, or someone else's.
        IllegalState: the sweep is pending or running (cancel it first), or was cancelled
            so recently that its driver may still be stopping (try again in a moment).
    """
    with Session(engine) as session:
        row = session.execute(
            select(Sweep.owner, Sweep.state, Sweep.ledger_key, Sweep.dataset).where(
                Sweep.id == sweep_id
            )
        ).first()
    if row is None:
        raise SweepNotFound(f"no sweep {sweep_id!r}; GET /api/v1/sweeps lists yours")
    if not viewer.sees(row.owner):
        # The dataset's owner sees an analyst's sweep (403), anyone else does not (404).
        check_sweep_owner(engine, sweep_id, viewer)
    _check_ended(sweep_id, row.state)
    settle = settle_time(SweeperSettings()) if settle_seconds is None else settle_seconds
    ledger_key = row.ledger_key or row.dataset
    # Normally nothing is outstanding (the end released it); if the process that ended the
    # sweep died before its release, give the reservation back now, while the sweep is known.
    balance = BudgetLedger(engine).sweep_balance(ledger_key, sweep_id=sweep_id)
    if balance.epsilon_outstanding > 0 or balance.delta_outstanding > 0:
        BudgetLedger(engine).release(ledger_key, sweep_id=sweep_id, note="sweep deleted")
    with Session(engine) as session, session.begin():
        # The sweep's row lock, which a driver's artifact writes also take
        # (keeper.flush_staged): none is midway while the rows go.
        sweep = session.scalars(select(Sweep).where(Sweep.id == sweep_id).with_for_update()).first()
        if sweep is None:
            raise SweepNotFound(f"no sweep {sweep_id!r}; GET /api/v1/sweeps lists yours")
        _check_ended(sweep_id, sweep.state)
        _check_settled(sweep, settle)
        trials = select(Trial.id).where(Trial.sweep_id == sweep_id)
        # Children first: the same outcome whether or not the foreign keys cascade.
        for stmt in (
            delete(ModelArtifact).where(ModelArtifact.sweep_id == sweep_id),
            delete(StagedModel).where(StagedModel.sweep_id == sweep_id),
            delete(MetricPoint).where(MetricPoint.trial_id.in_(trials)),
            delete(TrialResultRow).where(TrialResultRow.trial_id.in_(trials)),
            delete(SweepEvent).where(SweepEvent.sweep_id == sweep_id),
            delete(Trial).where(Trial.sweep_id == sweep_id),
            delete(Sweep).where(Sweep.id == sweep_id),
        ):
            session.execute(stmt.execution_options(synchronize_session=False))
    # After the rows' commit: no row names a file from here on.
    store.delete_folder(sweep_prefix(sweep_id))
    log.info("deleted sweep %s and its kept models", sweep_id)


def settle_time(settings: SweeperSettings) -> float:
    """Seconds after its last heartbeat by which a cancelled sweep's driver has stopped: it
    checks for a cancel every ``min(heartbeat, 4 * poll)`` seconds, then stops its trials."""
    check = min(settings.heartbeat_seconds, 4 * settings.poll_seconds)
    return 2 * check + 2 * settings.poll_seconds + 1.0


def _check_settled(sweep: Sweep, settle: float) -> None:
    """Refuse a sweep cancelled under a driver that may not have seen the cancel yet: until
    it does, it may still write the metrics of the trials it is stopping."""
    if sweep.state != SweepState.cancelled or sweep.heartbeat_at is None:
        return
    beat = sweep.heartbeat_at
    if beat.tzinfo is None:  # SQLite hands back naive datetimes, stored as UTC
        beat = beat.replace(tzinfo=UTC)
    if (datetime.now(UTC) - beat).total_seconds() < settle:
        raise IllegalState(
            f"sweep {sweep.id} was cancelled moments ago and its driver may still be stopping "
            "its trials; try again in a few seconds"
        )


def _check_ended(sweep_id: str, state: SweepState) -> None:
    if state not in DELETABLE:
        raise IllegalState(
            f"sweep {sweep_id} is {state.value}; cancel it first (POST /api/v1/sweeps/"
            f"{sweep_id}/cancel or `dpsweep cancel {sweep_id}`), then delete it"
        )
