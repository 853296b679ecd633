"""The sweep driver's loop: runs a stored sweep's trials on Ray, with the database as the truth.

The driver decides everything (what runs, when it is charged, what a crash means) and Ray only
executes (:mod:`sweeper.driver.ray_backend`): one task per *pack* of compatible trials
(:mod:`sweeper.driver.packs`), streaming its metrics back; the driver alone writes them to the
database (:mod:`sweeper.driver.pack_events`). Optuna's TPE sampler runs in the driver (ask/tell)
for ``search: tpe`` (:mod:`sweeper.driver.tpe`).

The life of a trial: ``pending`` → claimed (``running``, in one transaction that checks the
sweep is still running and this process still drives it) → **charged** in the ledger (its
grid's next run, :mod:`sweeper.privacy.charges`) → submitted → ``done`` / ``failed`` (charged either
way). A trial whose charge is refused never runs (:mod:`sweeper.driver.claims`).

A driver writes a heartbeat (:mod:`sweeper.driver.liveness`). When a sweep is started again
and its previous driver is gone, the new driver takes over and applies the crash policy
(:mod:`sweeper.driver.crash`) to the trials it left; the same policy applies, under a live
driver, to a pack whose Ray worker or node dies.

**Cancel** (:func:`sweeper.sweeps.cancel_sweep`, from any process) marks the sweep cancelled;
the driver sees it at its next poll, kills the running tasks (they stay charged) and exits.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, selectinload

from sweeper.artifacts.keeper import ModelKeeper
from sweeper.datasets.grants import sweep_may_continue
from sweeper.driver import failures, ray_backend
from sweeper.driver.claims import Claims
from sweeper.driver.crash import CrashPolicy, TrialRow
from sweeper.driver.held_sweep import HeldSweep, InFlight, PendingTrial
from sweeper.driver.liveness import Heartbeat, driver_ident, give_up, take_over, utc_now
from sweeper.driver.pack_events import PackEvents
from sweeper.driver.packs import Packer
from sweeper.driver.progress import Progress, RunOutcome, Snapshot, run_outcome
from sweeper.driver.tpe import TpeSearch
from sweeper.privacy.charges import exact_sum
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.rows import EntryKind
from sweeper.privacy.releases import store_release_in_background
from sweeper.settings import SweeperSettings
from sweeper.store import Sweep, SweepState, Trial, TrialState
from sweeper.store.artifact_files import quota_bytes, store_for
from sweeper.sweeps import events, released
from sweeper.sweeps.stored import grid_key

log = logging.getLogger(__name__)

# How long a driver ending its run waits for the sweep's release to be stored (a reader
# computes it when it is missing, so this only bounds the wait).
RELEASE_JOIN_SECONDS = 60.0


class SweepRunner:
    """Drive one stored sweep to a terminal state (or until it is cancelled)."""

    def __init__(
        self,
        engine: Engine,
        sweep_id: str,
        *,
        settings: SweeperSettings | None = None,
        workers: int | None = None,
        on_progress: Callable[[Snapshot], None] | None = None,
        stop: threading.Event | None = None,
        size_packs_remotely: bool = False,
    ) -> None:
        self.engine = engine
        # dpsweep run's own local Ray is idle when the sweep starts: a worker sizes the packs
        # (importing torch, which it needs anyway), not this driver. A server's shared Ray may
        # be busy, and a blocking task would wait for a CPU there: its driver sizes them itself.
        self.size_packs_remotely = size_packs_remotely
        # Set by a server shutting down: submit nothing new, let what runs finish (for at most
        # drain_seconds), then give the sweep up for the next driver.
        self.stop = stop
        self._stop_deadline: float | None = None
        self.sweep_id = sweep_id
        self.settings = settings or SweeperSettings()
        self.workers_wanted = workers or self.settings.workers
        self.on_progress = on_progress
        self.ident = driver_ident()
        self.ledger = BudgetLedger(engine)
        self._t0 = time.monotonic()
        # Set when the data owner revoked an analyst's grant mid-sweep (the sweep then ends
        # cancelled, with this reason, once its running trials finish).
        self._revoked: str | None = None

    # -- entry point ---------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        """Take the sweep over, recover from any crash, run every trial, finish.

        Raises:
            SweepNotFound: no such sweep.
            IllegalState: another live process drives the sweep.
        """
        held = take_over(
            self.engine, self.sweep_id, ident=self.ident, settings=self.settings, ledger=self.ledger
        )
        if held is None:
            return run_outcome(self.engine, self.sweep_id)
        # The sweep's audited epsilon (seconds of composition), stored once for its plan, so
        # that readers (summaries after a server start, model cards) need not compute it.
        release = store_release_in_background(self.engine, self.sweep_id)
        outcome = self._run(held)
        release.join(timeout=RELEASE_JOIN_SECONDS)
        return outcome

    def _run(self, held: HeldSweep) -> RunOutcome:
        self.held = held
        self.progress = Progress(held, on_progress=self.on_progress, t0=self._t0)
        self.tpe = TpeSearch(held)
        self.claims = Claims(held, self.progress, self.tpe)
        self.crash = CrashPolicy(held, self.progress, self.claims)
        self.packs = Packer(held)
        self.keeper = ModelKeeper(
            self.engine,
            self.sweep_id,
            keep=held.spec.artifacts.keep,
            metric=held.metric,
            mode=held.mode,
            hidden=held.hidden,
            store=store_for(self.engine, self.settings),
            quota_bytes=quota_bytes(self.settings.artifact_quota_mb),
        )
        self.pack_events = PackEvents(
            held, self.progress, self.claims, self.tpe, self.crash, self.keeper
        )
        self.heartbeat = Heartbeat(held)
        rows, charges = self._load()
        self._ensure_reservation()
        self.crash.recover(rows, charges)
        # Models a dead driver staged are written now; files it left unreferenced go.
        self.keeper.recover()
        self._log_hidden_releases()
        rows, _ = self._load()
        if not held.pending and not any(r.state == TrialState.running for r in rows.values()):
            self._finish()
            return run_outcome(self.engine, self.sweep_id)
        with ray_backend.ray_session(self.settings, workers=self.workers_wanted):
            resources = ray_backend.cluster_resources()
            held.workers = self.workers_wanted or max(1, int(resources.get("CPU", 1)))
            held.gpus = float(resources.get("GPU", 0.0)) > 0
            if self.size_packs_remotely and len(held.pending) > 1:
                self.packs.size_packs_remotely()
            try:
                self._loop()
            finally:
                ray_backend.kill([f.gen for f in held.inflight])
        return run_outcome(self.engine, self.sweep_id)

    # -- state in the database -----------------------------------------------------------------

    def _load(self) -> tuple[dict[str, TrialRow], dict[str, int]]:
        """Read trials and charges: pending queue, runs used per grid, counts, best so far.

        Returns:
            Every trial as stored, and the charges of each trial (papernot-steinke trials of a
            started search counted as charged for every attempt), for the crash policy.
        """
        held, progress = self.held, self.progress
        with Session(self.engine) as session:
            trials = list(
                session.scalars(
                    select(Trial)
                    .where(Trial.sweep_id == self.sweep_id)
                    .options(selectinload(Trial.result))
                    .order_by(Trial.number, Trial.arm, Trial.epsilon_budget, Trial.id)
                )
            )
            grid_of = {t.id: grid_key(t.arm, t.epsilon_budget) for t in trials}
            held.runs_used = {g: 0 for g in held.schedules}
            charges: dict[str, int] = {}
            for e in self.ledger.entries(held.dataset, self.sweep_id):
                if e.kind == EntryKind.CHARGE and e.trial_id in grid_of:
                    held.runs_used[grid_of[e.trial_id]] += 1
                    charges[e.trial_id] = charges.get(e.trial_id, 0) + 1
            held.pending = [PendingTrial.of(t) for t in trials if t.state == TrialState.pending]
            for grid in held.hidden:
                if held.runs_used.get(grid, 0):
                    progress.search_t0.setdefault(grid, self._t0)
            progress.counts = {s.value: 0 for s in TrialState}
            progress.best = {}
            rows = {t.id: TrialRow(grid_of[t.id], t.state, t.attempts) for t in trials}
            for t in trials:
                grid = grid_of[t.id]
                if not held.shows(grid) and held.runs_used.get(grid, 0) and t.attempts:
                    # A papernot-steinke grid's later runs write no ledger entry (only the
                    # first pays, for the whole search), so "charged" cannot be read back per
                    # trial: once the search has started, a claimed trial may have touched
                    # data, and must count as charged (never put back to pending).
                    charges[t.id] = max(charges.get(t.id, 0), t.attempts)
                if not held.shows(grid):
                    continue
                progress.counts[t.state.value] += 1
                if t.state == TrialState.done and t.result is not None:
                    progress.note_best(t.arm, t.result.metrics.get(held.metric))
        return rows, charges

    def _ensure_reservation(self) -> None:
        # A sweep is stored and then reserved; if the creator died in between, reserve now.
        held = self.held
        balance = self.ledger.sweep_balance(held.dataset, sweep_id=self.sweep_id)
        if balance.reservations:
            return
        total_e = exact_sum([s.reserved_epsilon for s in held.schedules.values()])
        total_d = exact_sum([s.reserved_delta for s in held.schedules.values()])
        # At the plan's privacy unit, as create_sweep reserves: a ledger bound to another
        # unit refuses (nothing reserved, the sweep fails) rather than spend at two levels.
        unit = held.plan[0].record.privacy_unit if held.plan else None
        self.ledger.reserve(
            held.dataset,
            sweep_id=self.sweep_id,
            epsilon=total_e,
            delta=total_d,
            note="resume",
            privacy_unit=unit,
        )

    def _finish(self) -> None:
        held = self.held
        with Session(self.engine) as session, session.begin():
            sweep = held.sweep_for_update(session)
            if sweep.state != SweepState.running or sweep.driver != self.ident:
                return
            states = list(
                session.scalars(select(Trial.state).where(Trial.sweep_id == self.sweep_id))
            )
            if any(s in (TrialState.pending, TrialState.running) for s in states):
                return
            failed = bool(states) and all(s == TrialState.failed for s in states)
            sweep.state = SweepState.failed if failed else SweepState.done
            if failed:
                sweep.error = "every trial failed; see the trials' errors"
            if self._revoked is not None:
                sweep.state = SweepState.cancelled
                sweep.error = self._revoked.removeprefix("not run, and not charged: ")
            sweep.finished_at = utc_now()
            sweep.driver = None
            events.emit(
                session,
                self.sweep_id,
                events.SWEEP,
                {"state": sweep.state.value, "error": sweep.error},
            )
        self.ledger.release(held.dataset, sweep_id=self.sweep_id, note="sweep finished")

    def _grant_holds(self) -> bool:
        """Whether the sweep may start new trials: an analyst's only while their grant on the
        dataset is active (:func:`sweeper.datasets.grants.sweep_may_continue`)."""
        with Session(self.engine) as session:
            row = session.execute(
                select(Sweep.owner, Sweep.dataset).where(Sweep.id == self.sweep_id)
            ).first()
        if row is None:
            return False
        return sweep_may_continue(self.engine, dataset=row.dataset, owner=row.owner)

    def _stop_new_trials(self, reason: str) -> None:
        """Cancel every trial not started yet (never charged: the end of the sweep releases
        their reservation); running trials finish and stay charged."""
        held = self.held
        stopped, held.pending = held.pending, []
        ids = [t.id for t in stopped]
        if not ids:
            return
        with Session(self.engine) as session, session.begin():
            events.lock_sweep(session, self.sweep_id)
            session.execute(
                update(Trial)
                .where(Trial.id.in_(ids), Trial.state == TrialState.pending)
                .values(state=TrialState.cancelled, error=reason, finished_at=utc_now())
            )
        for t in stopped:
            self.progress.count(t, "pending", "cancelled")
        self._revoked = reason
        self.progress.last_event = reason.removeprefix("not run, and not charged: ")

    def _log_hidden_releases(self) -> None:
        """Log the release of every papernot-steinke grid whose search completed."""
        held = self.held
        if held.hidden:
            released.record_hidden_releases(
                self.engine, self.sweep_id, metric=held.metric, mode=held.mode
            )

    # -- the loop ------------------------------------------------------------------------------

    def _beat(self, force: bool = False) -> bool:
        ok = self.heartbeat.beat(force)
        if not ok:
            self.progress.last_event = "sweep cancelled"
        return ok

    def _loop(self) -> None:
        held = self.held
        while True:
            if not self._beat():
                return  # cancelled, or taken over by another driver
            if self.stop is not None and self.stop.is_set():
                if self._stop_deadline is None:
                    self._stop_deadline = time.monotonic() + self.settings.drain_seconds
                    self.progress.last_event = "stopping: waiting for running trials"
                if not held.inflight or time.monotonic() > self._stop_deadline:
                    # Trials still running now are killed (run()'s finally); they stay
                    # charged, and the next driver applies the crash policy to them.
                    give_up(held)
                    self.progress.last_event = "stopped; the sweep resumes with the next driver"
                    return
            while (
                len(held.inflight) < held.workers and held.pending and self._stop_deadline is None
            ):
                if not self._submit_next():
                    if not self._beat(force=True):
                        return
                    break
            if not held.inflight:
                if not held.pending:
                    self._finish()
                    return
                continue
            ready = ray_backend.wait_any(
                [f.gen for f in held.inflight], timeout=self.settings.poll_seconds
            )
            hidden_ended = False
            for gen in ready:
                flight = next(f for f in held.inflight if f.gen is gen)
                self.pack_events.advance(flight)
                if flight not in held.inflight and not all(
                    held.shows(t.grid) for t in flight.trials
                ):
                    hidden_ended = True
            if hidden_ended:
                # A papernot-steinke grid whose search just completed releases its selected
                # trial: logged, and its model stored.
                self._log_hidden_releases()
            self.keeper.release_hidden()
            self.progress.report()

    def _submit_next(self) -> bool:
        """Form the next pack, check it, claim it, charge it and submit it.

        Returns:
            False when the sweep is no longer running under this driver.
        """
        held, packs, claims = self.held, self.packs, self.claims
        if not self._grant_holds():
            self._stop_new_trials(
                "not run, and not charged: the data owner revoked this analyst's access to "
                "the dataset"
            )
            return True
        if len(held.pending) == 1:
            # Nothing to pack it with: its pack key (which builds the model, so imports torch
            # into the driver: seconds of a one-trial sweep's first result) is not needed.
            key, group, cap = "", list(held.pending), 1
        else:
            key, group = packs.next_group()
            cap = packs.pack_cap(key, group[0])
        free = max(1, held.workers - len(held.inflight))
        # Spread what is left over the free workers, so that both cores work; never above
        # the memory cap.
        size = max(1, min(cap, math.ceil(len(held.pending) / max(free, 1)), len(group)))
        chosen = group[:size]
        chosen_ids = {t.id for t in chosen}
        held.pending = [t for t in held.pending if t.id not in chosen_ids]
        self.tpe.assign(chosen)
        try:
            packs.spec_for(chosen)
        except Exception as exc:
            # The workers could not even be told what to run (an uploaded dataset gone, say):
            # these trials fail before they are charged, instead of charging and crashing.
            # Privacy: the exception's text (a path, a loader's message) goes to the driver's
            # log; the trials say only its category (sweeper.driver.failures).
            failure = failures.log_failure(
                log,
                exc,
                "sweep %s: trial(s) %s could not be prepared",
                held.sweep_id,
                ", ".join(t.id for t in chosen),
            )
            claimed = claims.claim(chosen)
            if claimed is None:
                return False
            for t in claimed:
                claims.end(
                    t,
                    TrialState.failed,
                    f"not run, and not charged: {failure.text}",
                    uncharged=True,
                )
            return True
        mismatch = packs.plan_mismatch(chosen)
        if mismatch is not None:
            # The data (or a trial row) no longer matches what the budget was reserved for:
            # refuse before charging. The worker checks again on the data it loads.
            claimed = claims.claim(chosen)
            if claimed is None:
                return False
            for t in claimed:
                claims.end(
                    t, TrialState.failed, f"not run, and not charged: {mismatch}", uncharged=True
                )
            return True
        claimed = claims.claim(chosen)
        if claimed is None:
            return False
        charged = claims.charge(claimed)
        if not charged:
            return True
        gen = ray_backend.submit_pack(
            packs.spec_for(charged), num_gpus=packs.gpu_request(len(charged))
        )
        held.inflight.append(InFlight(gen, charged[0].id, charged, time.monotonic()))
        shown = [t for t in charged if held.shows(t.grid)]
        if shown:
            # Not for papernot-steinke trials: "started N trial(s)" counts their runs.
            self.progress.last_event = f"started {len(shown)} trial(s) of {shown[0].arm}"
        return True


def run_sweep(
    engine: Engine,
    sweep_id: str,
    *,
    settings: SweeperSettings | None = None,
    workers: int | None = None,
    on_progress: Callable[[Snapshot], None] | None = None,
    stop: threading.Event | None = None,
    size_packs_remotely: bool = False,
) -> RunOutcome:
    """Run (or resume) a stored sweep to the end; see :class:`SweepRunner`."""
    return SweepRunner(
        engine,
        sweep_id,
        settings=settings,
        workers=workers,
        on_progress=on_progress,
        stop=stop,
        size_packs_remotely=size_packs_remotely,
    ).run()
