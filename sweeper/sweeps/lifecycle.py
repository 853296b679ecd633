"""A sweep's end: cancel it, fail it, or find an unfinished one to resume (or a finished one).

Ending a sweep releases the reservation its trials did not use, then stops its trials under
the sweep's lock: unstarted trials were never charged; started ones stay charged. The release
comes first because it ends the sweep on the ledger (no charge is taken after it), which makes
"which trials ran" final before the release log is written. papernot-steinke grids are handled
by :mod:`sweeper.sweeps.released`'s rules: nothing here counts their trials, and a grid whose
search had started stays charged in full.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from dpsweep.errors import IllegalState, SweepNotFound
from dpsweep.spec import SweepSpec
from sweeper.privacy import release_log
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.store import Sweep, SweepState, Trial, TrialState, sweep_ledger_key
from sweeper.sweeps import events
from sweeper.sweeps.create import spec_hash
from sweeper.sweeps.stored import TERMINAL_SWEEPS, grid_key, hidden_grids


def _now() -> datetime:
    return datetime.now(UTC)


#: A trial a cancel caught between its claim and its charge: the ledger refused its charge
#: (the sweep had ended), so it never ran and nothing of it was released.
NEVER_RAN = "cancelled before it ran (never charged)"

PS_CANCEL_NOTE = (
    "grids whose search had started stay charged in full and release nothing unless their "
    "search had already completed"
)


def cancel_sweep(engine: Engine, sweep_id: str) -> dict[str, Any]:
    """Cancel a sweep: unstarted trials release their reservation; running trials stop (the
    driver kills them when it sees the state) and stay charged. A trial claimed but not yet
    charged never runs: the release ends the sweep on the ledger first, which refuses its
    charge; it counts as pending and is not logged as a release.

    papernot-steinke grids are not counted (their number of runs is secret). A grid whose
    search had started was charged in full at its first run and stays so; it releases its
    selected trial only if every one of its runs had already finished (see
    :func:`search_completed`); a grid that had not started releases its reservation.

    Returns:
        ``{"cancelled_pending": n, "stopped_running": m, "released_epsilon": ...,
        "papernot_steinke": note or None}``: n and m count trials of the other grids only;
        ``papernot_steinke`` states the rule above when the sweep has such grids.

    Raises:
        SweepNotFound: no such sweep.
        IllegalState: the sweep already finished, or its dataset changed ledger keys while it
            was being cancelled (cancel again).
    """
    return _end_sweep(engine, sweep_id, SweepState.cancelled, error=None)


def fail_sweep(engine: Engine, sweep_id: str, *, error: str) -> dict[str, Any]:
    """End a sweep that cannot be driven (its driver keeps crashing) as ``failed``: like a
    cancel, unstarted trials release their reservation and started ones stay charged."""
    return _end_sweep(engine, sweep_id, SweepState.failed, error=error)


def _end_sweep(
    engine: Engine, sweep_id: str, final: SweepState, *, error: str | None
) -> dict[str, Any]:
    key = _live_ledger_key(engine, sweep_id)
    # The release comes first, under the ledger's lock: from its commit on the ledger refuses
    # every charge of the sweep (SweepEnded), so the trials charged by then are all it will
    # ever have, and the release log below names exactly the ones that ran. Should this
    # process die before the rows below are written, the sweep fails closed: its driver's
    # charges are refused, so nothing more runs.
    rec = BudgetLedger(engine).release(key, sweep_id=sweep_id, note=f"sweep {final.value}")
    with Session(engine) as session, session.begin():
        sweep = _live(
            session.scalars(select(Sweep).where(Sweep.id == sweep_id).with_for_update()).first(),
            sweep_id,
        )
        if sweep_ledger_key(sweep) != key:
            # Re-keyed since it was read: what ended on the ledger is not its key now.
            raise IllegalState(f"sweep {sweep_id}'s dataset changed keys meanwhile; retry")
        events.lock_sweep(session, sweep_id)
        counts = _stop_trials(session, sweep, final)
        hidden = bool(hidden_grids(sweep))
        sweep.state = final
        sweep.error = error
        sweep.finished_at = _now()
        sweep.driver = None
        events.emit(
            session,
            sweep_id,
            events.SWEEP,
            {"state": final.value} | ({"error": error} if error else {}),
        )
    return {
        "cancelled_pending": counts["pending"],
        "stopped_running": counts["running"] + counts["interrupted"],
        "released_epsilon": float(rec.epsilon) if rec is not None else 0.0,
        "papernot_steinke": PS_CANCEL_NOTE if hidden else None,
    }


def _live_ledger_key(engine: Engine, sweep_id: str) -> str:
    """The ledger key of a sweep that has not ended yet.

    Raises:
        SweepNotFound: no such sweep.
        IllegalState: the sweep already finished.
    """
    with Session(engine) as session:
        return sweep_ledger_key(_live(session.get(Sweep, sweep_id), sweep_id))


def _live(sweep: Sweep | None, sweep_id: str) -> Sweep:
    """``sweep``, if it exists and has not ended.

    Raises:
        SweepNotFound: no such sweep.
        IllegalState: the sweep already finished.
    """
    if sweep is None:
        raise SweepNotFound(f"no sweep {sweep_id!r}; `dpsweep sweeps` lists them")
    if sweep.state in TERMINAL_SWEEPS:
        raise IllegalState(
            f"sweep {sweep_id} is already {sweep.state.value}; only pending or running "
            "sweeps can be cancelled"
        )
    return sweep


def _stop_trials(session: Session, sweep: Sweep, final: SweepState) -> dict[str, int]:
    """Cancel the sweep's unfinished trials (under its lock, after its release), emit their
    events and log the releases of those that ran.

    Returns:
        How many were pending (or claimed, never charged), interrupted and running, leaving
        papernot-steinke grids out: how many of their trials were pending or running is a
        function of their secret number of runs.
    """
    verb = "cancelled" if final == SweepState.cancelled else "stopped (sweep failed)"
    now = _now()
    hidden = hidden_grids(sweep)
    stopping = session.execute(
        select(Trial.id, Trial.arm, Trial.epsilon_budget, Trial.state).where(
            Trial.sweep_id == sweep.id,
            Trial.state.in_([TrialState.pending, TrialState.interrupted, TrialState.running]),
        )
    ).all()
    shown = [row for row in stopping if grid_key(row.arm, row.epsilon_budget) not in hidden]
    # Final: the ledger was released, so it takes no more charges. A running trial without a
    # charge was claimed and never ran: its driver's charge is (or will be) refused.
    ran = release_log.charged_trials(
        session, sweep, [row.id for row in shown if row.state != TrialState.pending]
    )
    unran = [row.id for row in shown if row.state == TrialState.running and row.id not in ran]
    counts = {s.value: 0 for s in (TrialState.pending, TrialState.interrupted, TrialState.running)}
    for row in shown:
        counts[TrialState.pending.value if row.id in unran else row.state.value] += 1
    for state, note in (
        (TrialState.pending, f"{verb} before it started (not charged)"),
        (TrialState.interrupted, f"{verb} after an interruption (stays charged)"),
        (TrialState.running, f"{verb} while running (stays charged)"),
    ):
        session.execute(
            update(Trial)
            .where(Trial.sweep_id == sweep.id, Trial.state == state)
            .values(state=TrialState.cancelled, error=note, finished_at=now)
        )
    if unran:
        # Never charged, never run: their claim's attempt is taken back here (their driver,
        # whose charge is refused, leaves a trial marked so as it is).
        session.execute(
            update(Trial)
            .where(Trial.id.in_(unran))
            .values(error=NEVER_RAN, attempts=Trial.attempts - 1)
        )
    for tid, arm, level, _state in shown:
        events.emit(
            session,
            sweep.id,
            events.TRIAL,
            events.trial_event(tid, arm=arm, epsilon_budget=level, state="cancelled"),
            trial_id=tid,
        )
        if tid in ran:
            # A charged trial stopped by the cancel: its streamed history reached the
            # sweep's owner, so it is a release (the release log).
            release_log.record_trial(
                session,
                sweep,
                trial_id=tid,
                grid=grid_key(arm, level),
                kind="trial-cancelled",
                what=["history"],
            )
    return counts


def _owned_by(owner: str | None) -> Any:
    """The condition that a sweep is ``owner``'s (None: the operator's, made on the command
    line without ``--owner``)."""
    return Sweep.owner.is_(None) if owner is None else Sweep.owner == owner


def find_resumable(engine: Engine, spec: SweepSpec, *, owner: str | None = None) -> str | None:
    """The newest unfinished sweep of exactly this spec of ``owner`` (None: the operator's),
    if any."""
    with Session(engine) as session:
        return session.scalars(
            select(Sweep.id)
            .where(
                _owned_by(owner),
                Sweep.spec_hash == spec_hash(spec),
                Sweep.state.in_([SweepState.pending, SweepState.running]),
            )
            .order_by(Sweep.created_at.desc())
        ).first()


def find_finished(
    engine: Engine, spec: SweepSpec, *, owner: str | None = None
) -> tuple[str, SweepState] | None:
    """The newest sweep of exactly this spec of ``owner`` (None: the operator's), with its
    state, if it has finished.

    ``dpsweep run`` shows such a sweep's results rather than spending the spec's budget again
    (``--new`` starts another). None when the spec has no sweep, or its newest is unfinished.
    """
    with Session(engine) as session:
        row = session.execute(
            select(Sweep.id, Sweep.state)
            .where(_owned_by(owner), Sweep.spec_hash == spec_hash(spec))
            .order_by(Sweep.created_at.desc(), Sweep.id.desc())
            .limit(1)
        ).first()
    if row is None or row.state not in TERMINAL_SWEEPS:
        return None
    return row.id, SweepState(row.state)
