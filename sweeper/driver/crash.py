"""The crash policy: what happens to trials a crash interrupted. One policy, two occasions:

* a sweep is started again and its previous driver is gone (its process is dead, or its
  heartbeat older than ``stale_after_seconds``): :meth:`CrashPolicy.recover` applies the policy
  to the trials that driver left ``running`` or ``interrupted``;
* under a live driver, a pack's Ray worker or node dies: :meth:`CrashPolicy.lost` applies it
  to the pack's trials. Ray itself never retries a pack (``max_retries=0``), because a second
  run under one charge would release more than was paid for.

The policy (:func:`decide`):

* A ``running`` trial whose last attempt was never charged never touched data: it goes back
  to ``pending`` at no cost.
* A charged trial stays charged. It is re-run only if its grid's reservation still holds an
  unused run after every never-started trial of the grid has been given one
  (``privacy.retries`` reserves such runs up front; the default 0 reserves none). A re-run is
  charged as the grid's next run. Otherwise the trial is marked ``failed`` with the reason.
  papernot-steinke grids never re-run (their run count is part of the guarantee).
* papernot-steinke grids write a single ledger charge, at their first run, for the whole
  search: per-run entries would count the secret number of runs. Their later runs therefore
  leave no trace of "charged" in the ledger, so once a grid's search has started, any of its
  claimed trials found ``running`` is taken to have touched data and is failed, never re-run
  (a claimed trial that never ran is failed too: a data-independent failure, which the
  guarantee covers, where a second run would not be). The driver's load counts such trials
  as charged.
* ``done`` trials are never run again; their results stay.

The two occasions differ only in how the verdicts are written: after a dead driver, straight to
the trial rows in one transaction (the next load re-counts them); under a live driver, through
:class:`~sweeper.driver.claims.Claims` and the live queue and counts. Each says in the trial's
error which crash interrupted it; a lost worker's error text goes to the driver's log, and the
trial says only its failure's category (:mod:`sweeper.driver.failures`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from sqlalchemy import update
from sqlalchemy.orm import Session

from sweeper.driver import failures
from sweeper.driver.claims import Claims
from sweeper.driver.held_sweep import HeldSweep, InFlight, PendingTrial
from sweeper.driver.liveness import utc_now
from sweeper.driver.progress import Progress
from sweeper.privacy import release_log
from sweeper.store import Sweep, Trial, TrialState
from sweeper.sweeps import events

log = logging.getLogger(__name__)


class TrialRow(NamedTuple):
    """A stored trial as the driver's load read it: its grid, state and attempts."""

    grid: str
    state: TrialState
    attempts: int


class Fate(Enum):
    """What the crash policy does with an interrupted trial."""

    REQUEUE_UNCHARGED = "never charged: back to pending at no cost"
    RERUN = "charged: re-run on a run its grid's reservation still holds"
    FAIL_PAPERNOT_STEINKE = "charged: papernot-steinke grids never re-run"
    FAIL_NO_RUN_LEFT = "charged: its grid's reservation has no run left for it"


@dataclass(frozen=True)
class Interrupted:
    """A trial a crash interrupted: its id, its grid, and whether its last attempt was
    charged."""

    trial_id: str
    grid: str
    charged: bool


@dataclass(frozen=True)
class Verdict:
    """The policy's decision for one interrupted trial (``why``: for FAIL_NO_RUN_LEFT, the
    run it would need)."""

    trial: Interrupted
    fate: Fate
    why: str = ""


def rerun_verdict(held: HeldSweep, grid: str, needed: dict[str, int]) -> tuple[Fate, str]:
    """Whether a charged, interrupted trial of ``grid`` may run again.

    ``needed`` counts the runs the grid's pending trials (and re-runs granted so far) will
    take; a re-run may only use a reserved run beyond those (``privacy.retries``).

    Returns:
        The fate and, for FAIL_NO_RUN_LEFT, why, naming the run it would need. RERUN counts
        the re-run in ``needed``.
    """
    sched = held.schedules[grid]
    if sched.whole_grid:
        return Fate.FAIL_PAPERNOT_STEINKE, ""
    used = held.runs_used.get(grid, 0)
    if sched.runs - used - needed.get(grid, 0) > 0:
        needed[grid] = needed.get(grid, 0) + 1
        return Fate.RERUN, ""
    run = used + needed.get(grid, 0) + 1
    return Fate.FAIL_NO_RUN_LEFT, (
        f"the grid's reservation has no run left for it; a re-run would be run {run} of a "
        f"grid that reserved {sched.runs} (set privacy.retries to reserve re-runs)"
    )


def decide(
    held: HeldSweep, interrupted: Sequence[Interrupted], needed: dict[str, int]
) -> list[Verdict]:
    """The crash policy for ``interrupted`` trials, in the order it decides them.

    Trials that never touched data go back to the queue first: they need runs of their grid's
    reservation before any re-run may take one.

    Args:
        needed: Runs each grid still needs: one per pending trial (first runs and queued
            re-runs); updated with the trials put back and the re-runs granted.
    """
    verdicts = []
    for trial in sorted(interrupted, key=lambda t: t.charged):
        if not trial.charged:
            needed[trial.grid] = needed.get(trial.grid, 0) + 1
            verdicts.append(Verdict(trial, Fate.REQUEUE_UNCHARGED))
            continue
        fate, why = rerun_verdict(held, trial.grid, needed)
        verdicts.append(Verdict(trial, fate, why))
    return verdicts


class CrashPolicy:
    """Apply :func:`decide` after a dead driver (:meth:`recover`) or a lost pack
    (:meth:`lost`).

    Args:
        held: The sweep the driver holds.
        progress: The driver's tally (counts, last event).
        claims: Ends the trials that fail under a live driver.
    """

    def __init__(self, held: HeldSweep, progress: Progress, claims: Claims) -> None:
        self.held = held
        self.progress = progress
        self.claims = claims

    def recover(self, rows: dict[str, TrialRow], charges: dict[str, int]) -> None:
        """Apply the crash policy to trials a dead driver left ``running``/``interrupted``.

        Args:
            rows: Every trial of the sweep, as loaded.
            charges: Each trial's charges (papernot-steinke trials of a started search count
                as charged for every attempt).
        """
        held = self.held
        stale = {
            tid: row
            for tid, row in rows.items()
            if row.state in (TrialState.running, TrialState.interrupted)
        }
        if not stale:
            return
        needed: dict[str, int] = {}
        for row in rows.values():
            if row.state == TrialState.pending:
                needed[row.grid] = needed.get(row.grid, 0) + 1
        verdicts = decide(
            held,
            [
                Interrupted(tid, row.grid, charged=charges.get(tid, 0) >= row.attempts)
                for tid, row in stale.items()
            ],
            needed,
        )
        now = utc_now()
        with Session(held.engine) as session, session.begin():
            events.lock_sweep(session, held.sweep_id)
            for v in verdicts:
                tid, attempts = v.trial.trial_id, stale[v.trial.trial_id].attempts
                trial = session.get(Trial, tid)
                assert trial is not None
                if v.fate == Fate.REQUEUE_UNCHARGED:
                    # Claimed, but the driver died before charging it: it never touched data.
                    trial.state = TrialState.pending
                    trial.attempts = charges.get(tid, 0)
                    trial.started_at = None
                elif v.fate == Fate.RERUN:
                    trial.state = TrialState.pending
                    trial.error = (
                        f"interrupted by a crash of the sweep's driver (attempt {attempts}, "
                        "charged); re-run on a run reserved by privacy.retries"
                    )
                else:
                    trial.state = TrialState.failed
                    trial.finished_at = now
                    trial.error = (
                        "interrupted by a crash of the sweep's driver (charged); "
                        "papernot-steinke grids do not re-run trials"
                        if v.fate == Fate.FAIL_PAPERNOT_STEINKE
                        else "interrupted by a crash of the sweep's driver; it stays charged "
                        f"and is not re-run: {v.why}"
                    )
            session.flush()
            for v in verdicts:
                trial = session.get(Trial, v.trial.trial_id)
                assert trial is not None
                if held.shows(v.trial.grid):
                    emit_stored_trial(session, held, trial, note="recovered after a driver crash")
                    if trial.state == TrialState.failed:
                        # A charged trial's failure reaches its owner: the release log.
                        sweep = session.get(Sweep, held.sweep_id)
                        if sweep is not None:
                            release_log.record_trial(
                                session,
                                sweep,
                                trial_id=trial.id,
                                grid=v.trial.grid,
                                kind="trial-failed",
                                what=["error", "history"],
                            )

    def lost(self, flight: InFlight, exc: Exception) -> None:
        """Apply the crash policy to a pack whose worker or node died under this driver.

        Its trials were charged, may have touched data, and stay charged. Each is re-run only
        on a run its grid's reservation still holds after every pending trial of the grid has
        one (``privacy.retries``); papernot-steinke grids never re-run; the rest fail, saying
        why.
        """
        held = self.held
        # Privacy: Ray's error text names the node, the process and (for an out-of-memory kill)
        # the memory it used, which scales with the private batch: it goes to the driver's log;
        # the trials say only the failure's category (sweeper.driver.failures).
        failure = failures.log_failure(
            log,
            exc,
            "sweep %s: the worker of trial(s) %s was lost",
            held.sweep_id,
            ", ".join(t.id for t in flight.trials),
        )
        category = failure.category
        if category not in (failures.OUT_OF_MEMORY, failures.CANCELLED):
            # Anything raised while reading a pack's events is the infrastructure's (the task
            # reports its own errors as events).
            category = failures.WORKER_LOST
        reason = f"its worker was lost ({category}; {failures.DETAILS})"
        needed: dict[str, int] = {}
        for p in held.pending:
            needed[p.grid] = needed.get(p.grid, 0) + 1
        by_id = {t.id: t for t in flight.trials}
        verdicts = decide(
            held, [Interrupted(t.id, t.grid, charged=True) for t in flight.trials], needed
        )
        requeue: list[PendingTrial] = []
        for v in verdicts:
            t = by_id[v.trial.trial_id]
            if v.fate == Fate.RERUN:
                requeue.append(t)
            elif v.fate == Fate.FAIL_PAPERNOT_STEINKE:
                self.claims.end(
                    t,
                    TrialState.failed,
                    f"interrupted: {reason}; it stays charged, and papernot-steinke grids do "
                    "not re-run trials",
                )
            else:
                self.claims.end(
                    t,
                    TrialState.failed,
                    f"interrupted: {reason}; it stays charged and is not re-run: {v.why}",
                )
        if not requeue:
            return
        with Session(held.engine) as session, session.begin():
            events.lock_sweep(session, held.sweep_id)
            for t in requeue:
                note = (
                    f"interrupted: {reason}; it stays charged and is re-run on a run reserved "
                    "by privacy.retries"
                )
                res = session.execute(
                    update(Trial)
                    .where(Trial.id == t.id, Trial.state == TrialState.running)
                    .values(state=TrialState.pending, error=note, started_at=None)
                )
                if res.rowcount and held.shows(t.grid):  # type: ignore[attr-defined]
                    events.emit(
                        session,
                        held.sweep_id,
                        events.TRIAL,
                        held.trial_data(t, TrialState.pending.value, error=note),
                        trial_id=t.id,
                    )
        for t in requeue:
            self.progress.count(t, "running", "pending")
        held.pending.extend(requeue)
        self.progress.last_event = f"{len(requeue)} trial(s) re-queued: {reason}"


def emit_stored_trial(session: Session, held: HeldSweep, trial: Trial, *, note: str) -> None:
    """Emit a trial event for a stored trial row as it now is."""
    events.emit(
        session,
        held.sweep_id,
        events.TRIAL,
        events.trial_event(
            trial.id,
            arm=trial.arm,
            epsilon_budget=trial.epsilon_budget,
            state=trial.state.value,
            error=trial.error,
            note=note,
        ),
        trial_id=trial.id,
    )
