"""Claim-and-charge: a trial's way from ``pending`` to ``running`` and on to its end.

A trial is claimed (``running``, in one transaction that checks the sweep is still running and
this process still drives it), then **charged** in the ledger (its grid's next run,
:mod:`sweeper.privacy.charges`), and only then submitted. A trial whose charge is refused never
runs:
it ends ``failed``, "not run, and not charged", with its attempt taken back. A charge refused
because the sweep ended (a cancel released its reservation between the claim and the charge:
:class:`~sweeper.privacy.ledger.errors.SweepEnded`) is no failure: the trial ends ``cancelled``,
never run, never charged, and nothing of it is released.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from dpsweep.errors import PrivacyError
from sweeper.driver.held_sweep import HeldSweep, PendingTrial
from sweeper.driver.liveness import utc_now
from sweeper.driver.progress import Progress
from sweeper.driver.tpe import TpeSearch
from sweeper.privacy import release_log
from sweeper.privacy.charges import ps_charge_note
from sweeper.privacy.ledger.errors import ReservationExceeded, SweepEnded
from sweeper.store import Sweep, SweepState, Trial, TrialState
from sweeper.sweeps import events
from sweeper.sweeps.lifecycle import NEVER_RAN


class Claims:
    """Claim trials, charge them, and end them, keeping the counts and events in step.

    Args:
        held: The sweep the driver holds.
        progress: The driver's tally (counts, last event).
        tpe: The TPE adapter, told of every trial that ends.
    """

    def __init__(self, held: HeldSweep, progress: Progress, tpe: TpeSearch) -> None:
        self.held = held
        self.progress = progress
        self.tpe = tpe

    def claim(self, chosen: list[PendingTrial]) -> list[PendingTrial] | None:
        """Mark ``chosen`` ``running`` (one more attempt each) as one pack.

        Returns:
            The trials claimed (those still pending), or None when the sweep is no longer
            running under this driver (cancelled, or taken over).
        """
        held = self.held
        now = utc_now()
        claimed: list[PendingTrial] = []
        with Session(held.engine) as session, session.begin():
            sweep = held.sweep_for_update(session)
            if sweep.state != SweepState.running or sweep.driver != held.ident:
                return None
            for t in chosen:
                res = session.execute(
                    update(Trial)
                    .where(Trial.id == t.id, Trial.state == TrialState.pending)
                    .values(
                        state=TrialState.running,
                        attempts=Trial.attempts + 1,
                        started_at=now,
                        finished_at=None,
                        pack_id=chosen[0].id,
                        params=t.params,
                    )
                )
                if res.rowcount:  # type: ignore[attr-defined]
                    claimed.append(t)
                    self.progress.count(t, "pending", "running")
                    if held.shows(t.grid):
                        events.emit(
                            session,
                            held.sweep_id,
                            events.TRIAL,
                            held.trial_data(t, "running", params=t.params),
                            trial_id=t.id,
                        )
        return claimed

    def charge(self, claimed: list[PendingTrial]) -> list[PendingTrial]:
        """Charge each claimed trial its grid's next run; trials refused a charge never run.

        A papernot-steinke grid (``whole_grid`` schedule) writes exactly one entry, at its
        first run, for the whole search, with a note naming the grid and no run index; its
        later runs cost nothing and write nothing: one zero entry per run would count the
        secret number of runs for anyone who reads the ledger. Other grids' run counts are
        public, so their notes say "run j of grid G".
        """
        held = self.held
        ok: list[PendingTrial] = []
        for t in claimed:
            run = held.runs_used.get(t.grid, 0) + 1
            sched = held.schedules[t.grid]
            try:
                epsilon, delta = sched.charge_for_run(run)
                if not sched.whole_grid:
                    held.ledger.charge(
                        held.dataset,
                        sweep_id=held.sweep_id,
                        trial_id=t.id,
                        epsilon=epsilon,
                        delta=delta,
                        note=f"run {run} of grid {t.grid}",
                    )
                elif run == 1:
                    held.ledger.charge(
                        held.dataset,
                        sweep_id=held.sweep_id,
                        trial_id=t.id,
                        epsilon=epsilon,
                        delta=delta,
                        note=ps_charge_note(t.grid),
                    )
                    self.progress.search_t0.setdefault(t.grid, time.monotonic())
            except SweepEnded:
                # Cancelled (or failed) since the claim: the ledger ended the sweep, so this
                # trial must not run. Not a crash, not a failure of the trial.
                self.end(t, TrialState.cancelled, NEVER_RAN, uncharged=True)
                continue
            except (PrivacyError, ReservationExceeded) as exc:
                self.end(
                    t,
                    TrialState.failed,
                    f"not run, and not charged: {exc}",
                    uncharged=True,
                )
                continue
            held.runs_used[t.grid] = run
            ok.append(t)
        return ok

    def end(
        self, t: PendingTrial, state: TrialState, error: str, *, uncharged: bool = False
    ) -> None:
        """End a claimed trial in ``state`` with ``error`` (if it is still ``running``).

        Args:
            uncharged: It was never charged: its attempt is taken back.
        """
        held = self.held
        with Session(held.engine) as session, session.begin():
            events.lock_sweep(session, held.sweep_id)
            values: dict[str, Any] = {"state": state, "error": error, "finished_at": utc_now()}
            if uncharged:
                values["attempts"] = Trial.attempts - 1
            res = session.execute(
                update(Trial)
                .where(Trial.id == t.id, Trial.state == TrialState.running)
                .values(**values)
            )
            changed = bool(res.rowcount)  # type: ignore[attr-defined]
            if uncharged and not changed:
                # Cancelled between its claim and its charge, by a cancel that took it for a
                # charged one; its charge was refused and it never ran: its books say so. (A
                # cancel that knew, NEVER_RAN, took its attempt back itself.)
                session.execute(
                    update(Trial)
                    .where(
                        Trial.id == t.id,
                        Trial.state == TrialState.cancelled,
                        Trial.error.is_distinct_from(NEVER_RAN),
                    )
                    .values(
                        attempts=Trial.attempts - 1,
                        error=NEVER_RAN,
                    )
                )
            if changed and held.shows(t.grid):
                events.emit(
                    session,
                    held.sweep_id,
                    events.TRIAL,
                    held.trial_data(t, state.value, error=error),
                    trial_id=t.id,
                )
                if not uncharged and state == TrialState.failed:
                    # A charged trial's failure (its error) reaches its owner: logged.
                    sweep = session.get(Sweep, held.sweep_id)
                    if sweep is not None:
                        release_log.record_trial(
                            session,
                            sweep,
                            trial_id=t.id,
                            grid=t.grid,
                            kind="trial-failed",
                            what=["error", "history"],
                        )
        if changed:
            self.progress.count(t, "running", state.value)
            if held.shows(t.grid):
                self.progress.done_this_run += 1
            self.tpe.tell(t)
        if held.shows(t.grid):
            # A papernot-steinke run's error is not shown: how many there are counts runs.
            self.progress.last_event = error
