"""What a running pack streams back, written to the database by the driver alone.

A pack task (:mod:`sweeper.driver.ray_backend`) yields ``started`` (which worker runs it),
``eval`` (metrics at each evaluation), then ``result`` or ``error``. A task that ends without a
result fails its trials; a worker or node that dies takes the pack through the crash policy
(:meth:`sweeper.driver.crash.CrashPolicy.lost`). A failed trial's stored error is its failure's
category and fixed reason (:mod:`sweeper.driver.failures`); the worker's own report goes to the
driver's log.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from sweeper.artifacts.keeper import ModelKeeper
from sweeper.driver import failures, ray_backend
from sweeper.driver.claims import Claims
from sweeper.driver.crash import CrashPolicy
from sweeper.driver.held_sweep import HeldSweep, InFlight, PendingTrial
from sweeper.driver.liveness import utc_now
from sweeper.driver.progress import Progress
from sweeper.driver.tpe import TpeSearch
from sweeper.privacy import release_log
from sweeper.store import MetricPoint, Sweep, Trial, TrialResultRow, TrialState
from sweeper.sweeps import events

log = logging.getLogger(__name__)


def finite(value: Any) -> float | None:
    """``value`` as a float if it is a finite number, else None."""
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


class PackEvents:
    """Take each pack's next event and write it down.

    Args:
        held: The sweep the driver holds.
        progress: The driver's tally.
        claims: Ends trials.
        tpe: Told of every finished trial.
        crash: The crash policy, for packs whose worker was lost.
        keeper: Keeps the trained models the spec's ``artifacts.keep`` asks for.
    """

    def __init__(
        self,
        held: HeldSweep,
        progress: Progress,
        claims: Claims,
        tpe: TpeSearch,
        crash: CrashPolicy,
        keeper: ModelKeeper,
    ) -> None:
        self.held = held
        self.progress = progress
        self.claims = claims
        self.tpe = tpe
        self.crash = crash
        self.keeper = keeper

    def advance(self, flight: InFlight) -> None:
        """Read ``flight``'s next event (one is ready) and act on it."""
        held = self.held
        try:
            event = ray_backend.next_event(flight.gen)
        except StopIteration:
            held.inflight.remove(flight)
            for t in flight.trials:
                self.claims.end(t, TrialState.failed, "the worker ended without a result")
            return
        except Exception as exc:  # the worker process or its node died (the task reports
            # its own errors as events, so anything raised here is the infrastructure's)
            held.inflight.remove(flight)
            self.crash.lost(flight, exc)
            return
        kind = event.get("type")
        if kind == "started":
            with Session(held.engine) as session, session.begin():
                session.execute(
                    update(Trial)
                    .where(Trial.id.in_([t.id for t in flight.trials]))
                    .values(worker=event["worker"])
                )
        elif kind == "eval":
            self.write_metrics(flight, event)
        elif kind == "result":
            held.inflight.remove(flight)
            self.write_results(flight, event)
        elif kind == "error":
            held.inflight.remove(flight)
            # Privacy: the worker's exception text may hold values computed from the records;
            # it goes to the server log for the operator, never to the database or the events.
            # The stored error is rebuilt here from the category alone (an unknown one is
            # internal-error), so only one of the fixed public texts can be stored.
            failure = failures.for_category(event.get("category"))
            log.error(
                "sweep %s: trial(s) %s failed in their worker (%s); the worker's report:\n%s",
                held.sweep_id,
                ", ".join(t.id for t in flight.trials),
                failure.category,
                event.get("detail") or "(none)",
            )
            for t in flight.trials:
                self.claims.end(t, TrialState.failed, failure.text)

    def write_metrics(self, flight: InFlight, event: dict[str, Any]) -> None:
        """Store an ``eval`` event's metrics (and their events, for shown grids)."""
        held = self.held
        step = int(event["step"])
        with Session(held.engine) as session, session.begin():
            events.lock_sweep(session, held.sweep_id)
            for t, metrics in zip(flight.trials, event["evals"], strict=True):
                if held.shows(t.grid):
                    values = {
                        k: (float(v) if math.isfinite(float(v)) else None)
                        for k, v in metrics.items()
                        if isinstance(v, int | float)
                    }
                    events.emit(
                        session,
                        held.sweep_id,
                        events.METRIC,
                        {"trial": t.id, "step": step, "values": values},
                        trial_id=t.id,
                    )
                for name, value in metrics.items():
                    if isinstance(value, int | float):
                        v = float(value)
                        session.add(
                            MetricPoint(
                                trial_id=t.id,
                                step=step,
                                name=name,
                                value=v if math.isfinite(v) else None,
                            )
                        )
        if not held.all_hidden(flight.trials):
            # (A papernot-steinke run's steps would count its runs: the progress report says
            # it instead.)
            self.progress.last_event = f"{flight.trials[0].arm}: step {step}/{event['total']}"

    def write_results(self, flight: InFlight, event: dict[str, Any]) -> None:
        """Store a ``result`` event: each trial ``done`` with its result row."""
        held = self.held
        now = utc_now()
        seconds = float(event["seconds"])
        weights = event.get("weights") or [None] * len(flight.trials)
        with Session(held.engine) as session, session.begin():
            events.lock_sweep(session, held.sweep_id)
            sweep = session.get(Sweep, held.sweep_id)
            for t, r, w in zip(flight.trials, event["results"], weights, strict=True):
                if not _mark_done(session, t.id, now, seconds):
                    continue  # cancelled meanwhile: its late result is dropped
                session.add(_result_row(t.id, r, held.metric))
                # Kept models are staged with their result (one transaction), then written.
                self.keeper.stage(
                    session,
                    trial_id=t.id,
                    grid=t.grid,
                    private=bool(r["private"]),
                    metrics=r["metrics"],
                    weights=w,
                    info=r.get("model_info") or {},
                )
                self.progress.count(t, "running", "done")
                if held.shows(t.grid):
                    self._announce_done(session, sweep, t, r)
        self.keeper.flush()
        for t in flight.trials:
            self.tpe.tell(t)
        shown = [t for t in flight.trials if held.shows(t.grid)]
        if shown:
            self.progress.last_event = f"finished {len(shown)} trial(s) of {shown[0].arm}"

    def _announce_done(
        self, session: Session, sweep: Sweep | None, t: PendingTrial, r: dict[str, Any]
    ) -> None:
        """A shown trial's ``done``: its event, the tally's best, and the release's audit log
        entry, all in the caller's transaction."""
        held = self.held
        m = r["metrics"]
        self.progress.done_this_run += 1  # (the ETA's rate: shown grids only)
        events.emit(
            session,
            held.sweep_id,
            events.TRIAL,
            held.trial_data(
                t,
                "done",
                metrics={k: v for k, v in m.items() if k != "reliability"},
                # What this run alone would cost; not what was spent (see releases).
                single_run_epsilon=r["epsilon"],
            ),
            trial_id=t.id,
        )
        self.progress.note_best(t.arm, m.get(held.metric))
        # The audit log, in the release's own transaction.
        if sweep is not None:
            release_log.record_trial(
                session,
                sweep,
                trial_id=t.id,
                grid=t.grid,
                kind="trial",
                what=["metrics", "params", "history"],
            )


def _mark_done(session: Session, trial_id: str, now: datetime, seconds: float) -> bool:
    """Set a running trial ``done``; False when it is no longer running (cancelled)."""
    res = session.execute(
        update(Trial)
        .where(Trial.id == trial_id, Trial.state == TrialState.running)
        .values(
            state=TrialState.done,
            finished_at=now,
            train_seconds=seconds,
            error=None,
        )
    )
    return bool(res.rowcount)  # type: ignore[attr-defined]


def _result_row(trial_id: str, r: dict[str, Any], metric: str) -> TrialResultRow:
    """A worker's result for one trial as its row (``metric``: the objective's)."""
    m = r["metrics"]
    return TrialResultRow(
        trial_id=trial_id,
        metrics={k: v for k, v in m.items() if k != "reliability"},
        final_metrics={k: v for k, v in r["final_metrics"].items() if k != "reliability"},
        epsilon=r["epsilon"],
        delta=r["target_delta"],
        accountant=r["accountant"],
        steps=r["steps"],
        best_step=r["best_step"],
        reliability=m.get("reliability"),
        trajectories=r["trajectories"],
        step_time_ms_median=r["step_time_ms_median"],
        diverged_at=r["diverged_at"],
        objective=finite(m.get(metric)),
        engine_path=r.get("engine_path"),
    )
