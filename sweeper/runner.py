"""The sweep driver: runs a stored sweep's trials on Ray, with the database as the truth.

Why Ray core tasks and not Ray Tune: Tune keeps its own experiment state (trial table,
checkpoints, resume files under ``storage_path``) and its own idea of which trials ran. Our
database already holds that state, and the ledger must be charged *before* a trial touches
data, at a moment the driver controls. With core tasks the driver decides everything (what
runs, when it is charged, what a crash means) and Ray only executes: one task per *pack* (a
batch of compatible trials trained as one computation, :mod:`workers.packing`), one CPU each
(and a GPU fraction on clusters with GPUs). Tasks are Ray *generators*: they stream evaluation
metrics back as they happen, and the driver alone writes them to the database. Optuna's TPE
sampler runs in the driver (ask/tell) for ``search: tpe``.

The life of a trial: ``pending`` → claimed (``running``, in one transaction that checks the
sweep is still running and this process still drives it) → **charged** in the ledger (its
grid's next run, :mod:`sweeper.charges`) → submitted → ``done`` / ``failed`` (charged either
way). A trial whose charge is refused never runs.

**Crash and resume policy.** A driver writes a heartbeat. When a sweep is started again and
its previous driver is gone (its process is dead, or its heartbeat older than
``stale_after_seconds``), the new driver takes over:

* A ``running`` trial whose last attempt was never charged never touched data: it goes back
  to ``pending`` at no cost.
* A charged ``running`` trial is marked ``interrupted``; it stays charged. It is re-run only if
  its grid's reservation still holds an unused run after every never-started trial of the grid
  has been given one (``privacy.retries`` reserves such runs up front; the default 0 reserves
  none). A re-run is charged as the grid's next run. Otherwise the trial is marked ``failed``
  with the reason. papernot-steinke grids never re-run (their run count is part of the
  guarantee).
* papernot-steinke grids write a single ledger charge, at their first run, for the whole
  search: per-run entries would count the secret number of runs. Their later runs therefore
  leave no trace of "charged" in the ledger, so once a grid's search has started, any of its
  claimed trials found ``running`` is taken to have touched data and is failed, never re-run
  (a claimed trial that never ran is failed too: a data-independent failure, which the
  guarantee covers, where a second run would not be).
* ``done`` trials are never run again; their results stay.

The same policy applies, under a live driver, to a pack whose Ray worker or node dies
(:meth:`SweepRunner._lost`); Ray itself never retries a pack (``max_retries=0``), because a second
run under one charge would release more than was paid for.

**Cancel** (:func:`sweeper.sweeps.cancel_sweep`, from any process) marks the sweep cancelled;
the driver sees it at its next poll, kills the running tasks (they stay charged) and exits.
"""

from __future__ import annotations

import math
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, selectinload

from sweeper import events
from sweeper.charges import ChargeSchedule, exact_sum, ps_charge_note
from sweeper.ledger import BudgetLedger, EntryKind, ReservationExceeded
from sweeper.settings import SweeperSettings
from sweeper.store import MetricPoint, Sweep, SweepState, Trial, TrialResultRow, TrialState
from sweeper.sweeps import (
    TERMINAL_SWEEPS,
    IllegalState,
    SweepNotFound,
    grid_key,
    hidden_grids,
    schedules,
)
from workers.accountants import trial_accountant_for_plan
from workers.errors import ConfigError, PrivacyError

# ---------------------------------------------------------------------------------------------
# The Ray task (runs in a worker process; never touches the database)


def _pack_task(spec: Any) -> Iterator[dict[str, Any]]:
    """Train one pack and stream its events: ``started``, ``eval`` (per evaluation),
    then ``result`` or ``error``."""
    from workers.errors import PrivacyError as _PrivacyError
    from workers.trainer import train_pack

    events: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def progress(p: Any) -> None:
        if p.evals is not None:
            evals = [{k: v for k, v in m.items() if k != "reliability"} for m in p.evals]
            events.put({"type": "eval", "step": p.step, "total": p.total_steps, "evals": evals})

    def work() -> None:
        t0 = time.perf_counter()
        try:
            results = train_pack(spec, progress=progress)
            seconds = time.perf_counter() - t0
            events.put(
                {"type": "result", "seconds": seconds, "results": [r.to_dict() for r in results]}
            )
        except BaseException as exc:  # reported to the driver, which marks the trials failed
            events.put(
                {
                    "type": "error",
                    "error": f"{type(exc).__name__}: {exc}",
                    "privacy": isinstance(exc, _PrivacyError),
                }
            )
        finally:
            events.put(None)

    yield {"type": "started", "worker": f"{socket.gethostname()}:{os.getpid()}@{_node_id()}"}
    thread = threading.Thread(target=work, name="dpsweep-pack", daemon=True)
    thread.start()
    while (event := events.get()) is not None:
        yield event
    thread.join()


def _node_id() -> str:
    """The Ray node this worker runs on (its id's first 12 hex digits), to tell the nodes of
    a cluster apart when several share a host name."""
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())[:12]
    except Exception:  # not under Ray (a direct call)
        return "local"


def gpu_request(trials: int, *, gpus_per_trial: float | None, gpu_fraction: float) -> float:
    """The GPU share of a pack of ``trials`` on a cluster with GPUs: its trials' shares summed
    (at most one whole GPU: a pack runs on one device), else the pack's ``gpu_fraction``.

    Example: ``gpu_request(3, gpus_per_trial=0.25, gpu_fraction=1.0) == 0.75``.
    """
    if gpus_per_trial is None:
        return gpu_fraction
    return min(1.0, round(gpus_per_trial * max(1, trials), 6))


_REMOTE: Any = None


def _remote() -> Any:
    global _REMOTE
    if _REMOTE is None:
        import ray

        _REMOTE = ray.remote(_pack_task)
    return _REMOTE


@contextmanager
def ray_session(settings: SweeperSettings, *, workers: int | None = None) -> Iterator[None]:
    """Use the Ray already initialised, else join ``ray_address``, else start a local Ray
    (capped object store, no dashboard, quiet, listening on 127.0.0.1). Only a Ray started
    here is shut down here."""
    import ray

    if ray.is_initialized():
        yield
        return
    import logging

    # Ray's token authentication stays on (a local cluster is still reachable by other local
    # users); its notice about it is not news to a dpsweep user.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": "WARNING",
        "log_to_driver": False,
        "configure_logging": True,
    }
    if settings.ray_address:
        ray.init(address=settings.ray_address, **kwargs)
    else:
        ray.init(
            num_cpus=workers or settings.workers or os.cpu_count() or 1,
            object_store_memory=settings.ray_object_store_mb * 2**20,
            **kwargs,
        )
    try:
        yield
    finally:
        ray.shutdown()


# ---------------------------------------------------------------------------------------------
# The driver


def _now() -> datetime:
    return datetime.now(UTC)


def _aware(dt: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes for timezone-aware columns; they were stored as UTC.
    if dt is not None and dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt


def _finite(value: Any) -> float | None:
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _driver_alive(driver: str) -> bool:
    host, _, pid = driver.rpartition(":")
    if host != socket.gethostname():
        return True  # another machine: only its heartbeat can tell
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


@dataclass
class _Pending:
    id: str
    arm: str
    strategy: str
    epsilon_budget: float
    params: dict[str, Any]
    seed: int
    number: int
    config: int
    noise_multiplier: float | None
    target_delta: float | None

    @property
    def grid(self) -> str:
        return grid_key(self.arm, self.epsilon_budget)


@dataclass
class _InFlight:
    gen: Any
    pack_id: str
    trials: list[_Pending]
    submitted: float


@dataclass
class Snapshot:
    """What a progress display shows.

    Counts, bests and the ETA leave out papernot-steinke grids, whose number of runs is
    secret: for a sweep with such grids ``eta`` is None and ``last_event`` only says which
    grids' searches are under way (a search starts with its grid's charge and ends with its
    release, both visible anyway) and the elapsed time, never a per-run event.
    """

    counts: dict[str, int]
    total: int
    best: dict[str, float]
    elapsed: float
    eta: float | None
    hidden_grids: int
    metric: str
    last_event: str = ""
    # papernot-steinke grids whose search has started and not yet ended.
    searching: tuple[str, ...] = ()


@dataclass
class RunOutcome:
    """How a driver left a sweep: its state and trials by state (papernot-steinke grids left
    out, as everywhere their count could be seen, logs included)."""

    sweep_id: str
    state: str
    counts: dict[str, int] = field(default_factory=dict)


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
    ) -> None:
        self.engine = engine
        # Set by a server shutting down: submit nothing new, let what runs finish (for at most
        # drain_seconds), then give the sweep up for the next driver.
        self.stop = stop
        self._stop_deadline: float | None = None
        self.sweep_id = sweep_id
        self.settings = settings or SweeperSettings()
        self.workers_wanted = workers or self.settings.workers
        self.on_progress = on_progress
        self.ident = f"{socket.gethostname()}:{os.getpid()}"
        self.ledger = BudgetLedger(engine)
        self._inflight: list[_InFlight] = []
        self._pending: list[_Pending] = []
        self._runs_used: dict[str, int] = {}
        self._best: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._studies: dict[str, Any] = {}
        self._asked: dict[tuple[str, int], int] = {}
        self._pack_caps: dict[str, int] = {}
        self._keys: dict[str, str] = {}
        self._done_this_run = 0
        self._t0 = time.monotonic()
        # When each papernot-steinke grid's search started (as this driver saw it).
        self._search_t0: dict[str, float] = {}
        self._last_beat = 0.0
        self._last_event = ""

    # -- entry point ---------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        """Take the sweep over, recover from any crash, run every trial, finish.

        Raises:
            SweepNotFound: no such sweep.
            IllegalState: another live process drives the sweep.
        """
        if not self._take_over():
            return self._outcome()
        self._load()
        self._ensure_reservation()
        self._recover()
        self._load()
        if not self._pending and not self._any_running():
            self._finish()
            return self._outcome()
        with ray_session(self.settings, workers=self.workers_wanted):
            import ray

            resources = ray.cluster_resources()
            self.workers = self.workers_wanted or max(1, int(resources.get("CPU", 1)))
            self.gpus = float(resources.get("GPU", 0.0)) > 0
            try:
                self._loop()
            finally:
                for f in self._inflight:
                    ray.cancel(f.gen, force=True)
        return self._outcome()

    # -- state in the database -----------------------------------------------------------------

    def _sweep_for_update(self, session: Session) -> Sweep:
        sweep = session.scalars(
            select(Sweep).where(Sweep.id == self.sweep_id).with_for_update()
        ).first()
        if sweep is None:
            raise SweepNotFound(f"no sweep {self.sweep_id!r}; `dpsweep sweeps` lists them")
        return sweep

    def _take_over(self) -> bool:
        with Session(self.engine) as session, session.begin():
            sweep = self._sweep_for_update(session)
            if sweep.state in TERMINAL_SWEEPS:
                return False
            beat = _aware(sweep.heartbeat_at)
            fresh = (
                beat is not None
                and (_now() - beat).total_seconds() < self.settings.stale_after_seconds
            )
            if (
                sweep.state == SweepState.running
                and sweep.driver
                and sweep.driver != self.ident
                and fresh
                and _driver_alive(sweep.driver)
            ):
                raise IllegalState(
                    f"sweep {self.sweep_id} is being run by {sweep.driver} (heartbeat "
                    f"{beat:%H:%M:%S} UTC); wait for it, cancel it, or if that process is gone "
                    f"retry after {self.settings.stale_after_seconds:g} s"
                )
            sweep.driver = self.ident
            sweep.heartbeat_at = _now()
            if sweep.state != SweepState.running:
                events.emit(session, self.sweep_id, events.SWEEP, {"state": "running"})
            sweep.state = SweepState.running
            sweep.started_at = sweep.started_at or _now()
            # The ledger key (the records' identity); the name for sweeps stored before
            # ledgers were keyed by content.
            self.dataset = sweep.ledger_key or sweep.dataset
            self.spec: dict[str, Any] = sweep.spec
            self.plan: list[dict[str, Any]] = list(sweep.plan or [])
            self.schedules: dict[str, ChargeSchedule] = schedules(sweep)
            self.hidden: set[str] = hidden_grids(sweep)
        objective = self.spec.get("objective", {})
        self.metric = objective.get("metric", "accuracy")
        self.mode = objective.get("mode", "max")
        return True

    def _load(self) -> None:
        """Read trials and charges: pending queue, runs used per grid, counts, best so far."""
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
            self._runs_used = {g: 0 for g in self.schedules}
            self._charges: dict[str, int] = {}
            for e in self.ledger.entries(self.dataset, self.sweep_id):
                if e.kind == EntryKind.CHARGE and e.trial_id in grid_of:
                    self._runs_used[grid_of[e.trial_id]] += 1
                    self._charges[e.trial_id] = self._charges.get(e.trial_id, 0) + 1
            self._pending = [
                _Pending(
                    id=t.id,
                    arm=t.arm,
                    strategy=t.strategy,
                    epsilon_budget=t.epsilon_budget,
                    params=dict(t.params or {}),
                    seed=t.seed,
                    number=t.number,
                    config=t.config,
                    noise_multiplier=t.noise_multiplier,
                    target_delta=t.target_delta,
                )
                for t in trials
                if t.state == TrialState.pending
            ]
            for grid in self.hidden:
                if self._runs_used.get(grid, 0):
                    self._search_t0.setdefault(grid, self._t0)
            self._counts = {s.value: 0 for s in TrialState}
            self._best = {}
            self._trial_rows = {
                t.id: (grid_of[t.id], t.state, t.attempts, t.config, t.params) for t in trials
            }
            for t in trials:
                grid = grid_of[t.id]
                if grid in self.hidden and self._runs_used.get(grid, 0) and t.attempts:
                    # A papernot-steinke grid's later runs write no ledger entry (only the
                    # first pays, for the whole search), so "charged" cannot be read back per
                    # trial: once the search has started, a claimed trial may have touched
                    # data, and must count as charged (never put back to pending).
                    self._charges[t.id] = max(self._charges.get(t.id, 0), t.attempts)
                if grid in self.hidden:
                    continue
                self._counts[t.state.value] += 1
                if t.state == TrialState.done and t.result is not None:
                    self._note_best(t.arm, t.result.metrics.get(self.metric))

    def _any_running(self) -> bool:
        return any(row[1] == TrialState.running for row in self._trial_rows.values())

    def _ensure_reservation(self) -> None:
        # A sweep is stored and then reserved; if the creator died in between, reserve now.
        balance = self.ledger.sweep_balance(self.dataset, sweep_id=self.sweep_id)
        if balance.reservations:
            return
        total_e = exact_sum([s.reserved_epsilon for s in self.schedules.values()])
        total_d = exact_sum([s.reserved_delta for s in self.schedules.values()])
        self.ledger.reserve(
            self.dataset, sweep_id=self.sweep_id, epsilon=total_e, delta=total_d, note="resume"
        )

    def _recover(self) -> None:
        """Apply the crash policy to trials a dead driver left ``running``/``interrupted``."""
        stale = [
            (tid, row)
            for tid, row in self._trial_rows.items()
            if row[1] in (TrialState.running, TrialState.interrupted)
        ]
        if not stale:
            return
        # Runs each grid still needs: one per pending trial (first runs and queued re-runs).
        needed: dict[str, int] = {}
        for grid, state, _, _, _ in self._trial_rows.values():
            if state == TrialState.pending:
                needed[grid] = needed.get(grid, 0) + 1
        now = _now()
        # Trials that never touched data go back to the queue first: they need runs of their
        # grid's reservation before any re-run may take one.
        stale.sort(key=lambda item: self._charges.get(item[0], 0) >= item[1][2])
        with Session(self.engine) as session, session.begin():
            events.lock_sweep(session, self.sweep_id)
            for tid, (grid, _state, attempts, _, _) in stale:
                charged = self._charges.get(tid, 0)
                trial = session.get(Trial, tid)
                assert trial is not None
                if charged < attempts:
                    # Claimed, but the driver died before charging it: it never touched data.
                    trial.state = TrialState.pending
                    trial.attempts = charged
                    trial.started_at = None
                    needed[grid] = needed.get(grid, 0) + 1
                    continue
                verdict = self._rerun_verdict(grid, needed)
                if verdict is None:
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
                        if verdict == ""
                        else "interrupted by a crash of the sweep's driver; it stays charged "
                        f"and is not re-run: {verdict}"
                    )
            session.flush()
            for tid, (grid, *_rest) in stale:
                trial = session.get(Trial, tid)
                assert trial is not None
                if grid not in self.hidden:
                    self._emit_trial(session, trial, note="recovered after a driver crash")

    # -- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        import ray

        while True:
            if not self._heartbeat():
                return  # cancelled, or taken over by another driver
            if self.stop is not None and self.stop.is_set():
                if self._stop_deadline is None:
                    self._stop_deadline = time.monotonic() + self.settings.drain_seconds
                    self._last_event = "stopping: waiting for running trials"
                if not self._inflight or time.monotonic() > self._stop_deadline:
                    # Trials still running now are killed (run()'s finally); they stay
                    # charged, and the next driver applies the crash policy to them.
                    self._give_up()
                    return
            while (
                len(self._inflight) < self.workers and self._pending and self._stop_deadline is None
            ):
                if not self._submit_next():
                    if not self._heartbeat(force=True):
                        return
                    break
            if not self._inflight:
                if not self._pending:
                    self._finish()
                    return
                continue
            ready, _ = ray.wait(
                [f.gen for f in self._inflight],
                num_returns=1,
                timeout=self.settings.poll_seconds,
            )
            for gen in ready:
                flight = next(f for f in self._inflight if f.gen is gen)
                self._advance(flight)
            self._report()

    def _give_up(self) -> None:
        """Leave the sweep running with no driver, so that the next one takes it at once."""
        with Session(self.engine) as session, session.begin():
            session.execute(
                update(Sweep)
                .where(Sweep.id == self.sweep_id, Sweep.driver == self.ident)
                .values(driver=None)
            )
        self._last_event = "stopped; the sweep resumes with the next driver"

    def _heartbeat(self, force: bool = False) -> bool:
        now = time.monotonic()
        if not force and now - self._last_beat < min(
            self.settings.heartbeat_seconds, self.settings.poll_seconds * 4
        ):
            return True
        self._last_beat = now
        with Session(self.engine) as session, session.begin():
            res = session.execute(
                update(Sweep)
                .where(
                    Sweep.id == self.sweep_id,
                    Sweep.driver == self.ident,
                    Sweep.state == SweepState.running,
                )
                .values(heartbeat_at=_now())
            )
            ok = bool(res.rowcount)  # type: ignore[attr-defined]
        if not ok:
            self._last_event = "sweep cancelled"
        return ok

    def _searching(self) -> tuple[str, ...]:
        """papernot-steinke grids whose search has started (charged) and not ended (some of
        its trials still queued or in flight): the two ends users see anyway, as the grid's
        charge and its release."""
        live = {t.grid for t in self._pending} | {t.grid for f in self._inflight for t in f.trials}
        return tuple(sorted(g for g in self.hidden if g in live and self._runs_used.get(g, 0) > 0))

    def _report(self) -> None:
        if self.on_progress is None:
            return
        now = time.monotonic()
        elapsed = now - self._t0
        searching = self._searching() if self.hidden else ()
        if self.hidden:
            # No counts, no per-run events, no ETA: each would be a function of the secret
            # number of runs. Only which searches are under way, and for how long.
            eta: float | None = None
            if searching:
                start = min(self._search_t0.get(g, self._t0) for g in searching)
                names = ", ".join(searching)
                grids = "grid" if len(searching) == 1 else "grids"
                message = (
                    f"papernot-steinke {grids} {names} running "
                    f"(elapsed {format_elapsed(now - start)})"
                )
            else:
                message = f"papernot-steinke: no search running (elapsed {format_elapsed(elapsed)})"
            if self._last_event:
                message += f"; {self._last_event}"
        else:
            remaining = self._counts.get("pending", 0) + self._counts.get("running", 0)
            eta = (
                elapsed / self._done_this_run * remaining
                if self._done_this_run and remaining
                else None
            )
            eta = eta if remaining else 0.0
            message = self._last_event
        self.on_progress(
            Snapshot(
                counts=dict(self._counts),
                total=sum(self._counts.values()),
                best=dict(self._best),
                elapsed=elapsed,
                eta=eta,
                hidden_grids=len(self.hidden),
                metric=self.metric,
                last_event=message,
                searching=searching,
            )
        )

    def _note_best(self, arm: str, value: Any) -> None:
        if not isinstance(value, int | float) or not math.isfinite(value):
            return
        cur = self._best.get(arm)
        better = cur is None or (value > cur if self.mode == "max" else value < cur)
        if better:
            self._best[arm] = float(value)

    def _all_hidden(self, trials: list[_Pending]) -> bool:
        """Whether every one of ``trials`` belongs to a papernot-steinke grid."""
        return all(t.grid in self.hidden for t in trials)

    def _count(self, trial: _Pending, old: str | None, new: str) -> None:
        if trial.grid in self.hidden:
            return
        if old is not None:
            self._counts[old] -= 1
        self._counts[new] += 1

    # -- forming, claiming, charging, submitting -----------------------------------------------

    def _arm(self, label: str) -> dict[str, Any]:
        return next(a for a in self.spec["arms"] if (a.get("name") or a["strategy"]) == label)

    def _pack_spec(self, trials: list[_Pending]) -> Any:
        from workers.models import ModelSpec
        from workers.plan_check import PlannedRun
        from workers.trainer import PackSpec, TrialSpec

        m, tr = self.spec["model"], self.spec["training"]
        grid = next(g for g in self.plan if g["grid"] == trials[0].grid)
        specs = []
        for t in trials:
            arm = self._arm(t.arm)
            params = {**arm.get("params", {}), **t.params}
            lr = params.pop("lr", None)
            specs.append(
                TrialSpec(
                    lr=float(lr) if lr is not None else float("nan"),
                    seed=t.seed,
                    noise_multiplier=t.noise_multiplier,
                    target_delta=float(t.target_delta or self.spec["privacy"]["delta"]),
                    params=params,
                )
            )
        return PackSpec(
            dataset=self._dataset_spec(),
            model=ModelSpec(m["name"], m.get("options", {})),
            strategy=trials[0].strategy,
            trials=specs,
            batch_size=tr["batch_size"],
            epochs=tr["epochs"] if tr.get("epochs") is not None else 1.0,
            steps=tr.get("steps"),
            optimizer=tr["optimizer"],
            momentum=tr["momentum"],
            weight_decay=tr["weight_decay"],
            eval_every=tr["eval_every"],
            # Trials report single-run epsilon with the accountant the grid's stored one maps
            # to (workers.accountants.PLAN_TO_WORKER); an unknown stored name is refused.
            accountant=trial_accountant_for_plan(grid["accountant"]),
            device="cuda" if self.gpus else "cpu",
            threads=1,
            # Secret per-trial randomness unless the spec opted into reproducible mode (a spec
            # stored before that option existed runs its remaining trials with secrets too).
            randomness="reproducible" if self.spec["privacy"].get("reproducible") else "secret",
            # The worker refuses to run anything but what the grid's reservation covers.
            planned=PlannedRun.of_grid(grid),
            # DP evaluation: each noisy count's multiplier, as planned and charged per grid.
            eval_noise_multiplier=grid.get("eval_noise_multiplier"),
        )

    def _dataset_spec(self) -> Any:
        # Uploads (ds_...) resolve to their stored file; the workers never see the database.
        if not hasattr(self, "_dataset"):
            from sweeper.catalog import resolve

            self._dataset = resolve(self.engine, self.spec["dataset"], self.spec.get("eval"))
        return self._dataset

    def _plan_mismatch(self, trials: list[_Pending]) -> str | None:
        """Why ``trials`` would not run as planned (see :mod:`workers.plan_check`), or None."""
        from workers.plan_check import PlanMismatch, check_pack

        spec = self._pack_spec(trials)
        assert spec.planned is not None
        data = self._current_data(spec.dataset)
        try:
            check_pack(spec, data)
        except (PlanMismatch, ConfigError) as exc:
            return str(exc)
        return None

    def _current_data(self, dataset: Any) -> Any:
        """The dataset as it is now on disk, reloaded whenever one of its files changed."""
        from workers.datasets import load_dataset

        stamp = []
        public_eval = getattr(dataset, "eval_dataset", None)
        paths = [dataset.path, dataset.labels_path]
        if public_eval is not None:
            paths += [public_eval.path, public_eval.labels_path]
        for path in paths:
            if path:
                try:
                    st = os.stat(path)
                    stamp.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
                except OSError:
                    stamp.append((path, -1, -1, -1))
        key = (repr(dataset), tuple(stamp))
        cached = getattr(self, "_data_cache", None)
        if cached is None or cached[0] != key:
            self._data_cache = (key, load_dataset(dataset))
        return self._data_cache[1]

    def _pack_key(self, t: _Pending) -> str:
        from workers.packing import pack_key

        cache_key = f"{t.id}:{sorted(t.params.items())}"
        if cache_key not in self._keys:
            try:
                self._keys[cache_key] = pack_key(self._pack_spec([t]))
            except Exception:  # invalid params: the trial runs alone, and fails alone
                self._keys[cache_key] = f"solo:{t.id}"
        return self._keys[cache_key]

    def _pack_cap(self, key: str, t: _Pending) -> int:
        if key not in self._pack_caps:
            from workers.packing import max_pack_size
            from workers.settings import WorkerSettings

            cap = 1
            if not key.startswith("solo:"):
                try:
                    spec = self._pack_spec([t])
                    data = self._current_data(spec.dataset)
                    cap = max_pack_size(
                        spec,
                        input_shape=data.input_shape,
                        num_classes=data.num_classes,
                        settings=WorkerSettings(),
                    )
                except Exception:
                    cap = 1
            if self.settings.max_pack_size:
                cap = min(cap, self.settings.max_pack_size)
            self._pack_caps[key] = max(1, cap)
        return self._pack_caps[key]

    def _next_group(self) -> tuple[str, list[_Pending]]:
        groups: dict[str, list[_Pending]] = {}
        for t in self._pending:
            groups.setdefault(self._pack_key(t), []).append(t)
        # papernot-steinke: group sizes count secret runs; which grid's search starts first
        # (visible as its charge) must not depend on them, so take groups in key order.
        key = min(groups) if self.hidden else max(groups, key=lambda k: (len(groups[k]), k))
        return key, groups[key]

    def _submit_next(self) -> bool:
        key, group = self._next_group()
        cap = self._pack_cap(key, group[0])
        free = max(1, self.workers - len(self._inflight))
        # Spread what is left over the free workers, so that both cores work; never above
        # the memory cap.
        size = max(1, min(cap, math.ceil(len(self._pending) / max(free, 1)), len(group)))
        chosen = group[:size]
        chosen_ids = {t.id for t in chosen}
        self._pending = [t for t in self._pending if t.id not in chosen_ids]
        self._assign_tpe(chosen)
        try:
            self._pack_spec(chosen)
        except Exception as exc:
            # The workers could not even be told what to run (an uploaded dataset gone, say):
            # these trials fail before they are charged, instead of charging and crashing.
            claimed = self._claim(chosen)
            if claimed is None:
                return False
            for t in claimed:
                self._end(
                    t,
                    TrialState.failed,
                    f"not run, and not charged: {type(exc).__name__}: {exc}",
                    uncharged=True,
                )
            return True
        mismatch = self._plan_mismatch(chosen)
        if mismatch is not None:
            # The data (or a trial row) no longer matches what the budget was reserved for:
            # refuse before charging. The worker checks again on the data it loads.
            claimed = self._claim(chosen)
            if claimed is None:
                return False
            for t in claimed:
                self._end(
                    t, TrialState.failed, f"not run, and not charged: {mismatch}", uncharged=True
                )
            return True
        claimed = self._claim(chosen)
        if claimed is None:
            return False
        charged = self._charge(claimed)
        if not charged:
            return True
        pack_id = charged[0].id
        gen = (
            _remote()
            .options(
                num_cpus=1,
                num_gpus=self._gpu_request(len(charged)),
                # Never let Ray re-run a pack on its own after a worker or node died: a second
                # run under the one charge would release more than was paid for. A lost pack
                # goes through the crash policy instead (_lost), which charges any re-run.
                max_retries=0,
                retry_exceptions=False,
            )
            .remote(self._pack_spec(charged))
        )
        self._inflight.append(_InFlight(gen, pack_id, charged, time.monotonic()))
        shown = [t for t in charged if t.grid not in self.hidden]
        if shown:
            # Not for papernot-steinke trials: "started N trial(s)" counts their runs.
            self._last_event = f"started {len(shown)} trial(s) of {shown[0].arm}"
        return True

    def _gpu_request(self, trials: int) -> float:
        """The GPU share a pack of ``trials`` asks Ray for (0 on a cluster without GPUs)."""
        if not self.gpus:
            return 0.0
        per_trial = (self.spec.get("resources") or {}).get("gpus_per_trial")
        return gpu_request(
            trials,
            gpus_per_trial=per_trial if per_trial is not None else self.settings.gpus_per_trial,
            gpu_fraction=self.settings.gpu_fraction,
        )

    def _claim(self, chosen: list[_Pending]) -> list[_Pending] | None:
        now = _now()
        claimed: list[_Pending] = []
        with Session(self.engine) as session, session.begin():
            sweep = self._sweep_for_update(session)
            if sweep.state != SweepState.running or sweep.driver != self.ident:
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
                    self._count(t, "pending", "running")
                    if t.grid not in self.hidden:
                        events.emit(
                            session,
                            self.sweep_id,
                            events.TRIAL,
                            self._trial_data(t, "running", params=t.params),
                            trial_id=t.id,
                        )
        return claimed

    def _charge(self, claimed: list[_Pending]) -> list[_Pending]:
        """Charge each claimed trial its grid's next run; trials refused a charge never run.

        A papernot-steinke grid (``whole_grid`` schedule) writes exactly one entry, at its
        first run, for the whole search, with a note naming the grid and no run index; its
        later runs cost nothing and write nothing: one zero entry per run would count the
        secret number of runs for anyone who reads the ledger. Other grids' run counts are
        public, so their notes say "run j of grid G".
        """
        ok: list[_Pending] = []
        for t in claimed:
            run = self._runs_used.get(t.grid, 0) + 1
            sched = self.schedules[t.grid]
            try:
                epsilon, delta = sched.charge_for_run(run)
                if not sched.whole_grid:
                    self.ledger.charge(
                        self.dataset,
                        sweep_id=self.sweep_id,
                        trial_id=t.id,
                        epsilon=epsilon,
                        delta=delta,
                        note=f"run {run} of grid {t.grid}",
                    )
                elif run == 1:
                    self.ledger.charge(
                        self.dataset,
                        sweep_id=self.sweep_id,
                        trial_id=t.id,
                        epsilon=epsilon,
                        delta=delta,
                        note=ps_charge_note(t.grid),
                    )
                    self._search_t0.setdefault(t.grid, time.monotonic())
            except (PrivacyError, ReservationExceeded) as exc:
                self._end(
                    t,
                    TrialState.failed,
                    f"not run, and not charged: {exc}",
                    uncharged=True,
                )
                continue
            self._runs_used[t.grid] = run
            ok.append(t)
        return ok

    # -- tpe -----------------------------------------------------------------------------------

    def _study(self, grid: str, arm_label: str) -> Any:
        if grid not in self._studies:
            import optuna

            from sweeper.search import optuna_distributions
            from sweeper.spec import ArmConfig

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            arm = ArmConfig.model_validate(self._arm(arm_label))
            dists = optuna_distributions(arm)
            seed = int(self.spec["search"].get("seed", 0))
            study = optuna.create_study(
                direction="maximize" if self.mode == "max" else "minimize",
                sampler=optuna.samplers.TPESampler(seed=seed + len(self._studies)),
            )
            # Rebuild the history from the database (a resumed sweep keeps what TPE learned).
            for value, params in self._finished_configs(grid):
                study.add_trial(
                    optuna.trial.create_trial(params=params, distributions=dists, value=value)
                )
            self._studies[grid] = (study, dists)
        return self._studies[grid]

    def _finished_configs(self, grid: str) -> list[tuple[float, dict[str, Any]]]:
        by_config: dict[int, list[Any]] = {}
        with Session(self.engine) as session:
            for t in session.scalars(
                select(Trial)
                .where(Trial.sweep_id == self.sweep_id)
                .options(selectinload(Trial.result))
            ):
                if grid_key(t.arm, t.epsilon_budget) == grid and t.params:
                    by_config.setdefault(t.config, []).append(t)
        out = []
        for rows in by_config.values():
            if all(r.state in (TrialState.done, TrialState.failed) for r in rows):
                value = self._config_value(rows)
                if value is not None:
                    out.append((value, dict(rows[0].params)))
        return out

    def _config_value(self, rows: list[Trial]) -> float | None:
        """A configuration's objective: the mean over its finished seeds (None if none)."""
        vals = [
            r.result.metrics.get(self.metric)
            for r in rows
            if r.state == TrialState.done and r.result is not None
        ]
        good = [float(v) for v in vals if isinstance(v, int | float) and math.isfinite(v)]
        return sum(good) / len(good) if good else None

    def _assign_tpe(self, chosen: list[_Pending]) -> None:
        if self.spec["search"]["method"] != "tpe":
            return
        for t in chosen:
            # An asked configuration's params reach the database and every queued sibling at
            # once (and a resumed driver reads them back), so empty params mean "not asked".
            if t.params:
                continue
            study, dists = self._study(t.grid, t.arm)
            trial = study.ask(dists)
            self._asked[(t.grid, t.config)] = trial.number
            for p in self._pending + chosen:
                if p.grid == t.grid and p.config == t.config:
                    p.params = dict(trial.params)
            with Session(self.engine) as session, session.begin():
                session.execute(
                    update(Trial)
                    .where(
                        Trial.sweep_id == self.sweep_id,
                        Trial.arm == t.arm,
                        Trial.epsilon_budget == t.epsilon_budget,
                        Trial.config == t.config,
                    )
                    .values(params=trial.params)
                )

    def _tell_tpe(self, t: _Pending) -> None:
        if self.spec["search"]["method"] != "tpe":
            return
        key = (t.grid, t.config)
        if key not in self._asked:
            return
        with Session(self.engine) as session:
            rows = list(
                session.scalars(
                    select(Trial)
                    .where(
                        Trial.sweep_id == self.sweep_id,
                        Trial.arm == t.arm,
                        Trial.epsilon_budget == t.epsilon_budget,
                        Trial.config == t.config,
                    )
                    .options(selectinload(Trial.result))
                )
            )
            if not all(r.state in (TrialState.done, TrialState.failed) for r in rows):
                return
            value = self._config_value(rows)
        import optuna

        study, _ = self._studies[t.grid]
        number = self._asked.pop(key)
        if value is not None:
            study.tell(number, value)
        else:
            study.tell(number, state=optuna.trial.TrialState.FAIL)

    # -- events --------------------------------------------------------------------------------

    def _advance(self, flight: _InFlight) -> None:
        import ray

        try:
            ref = next(flight.gen)
            event = ray.get(ref)
        except StopIteration:
            self._inflight.remove(flight)
            for t in flight.trials:
                self._end(t, TrialState.failed, "the worker ended without a result")
            return
        except Exception as exc:  # the worker process or its node died (the task reports
            # its own errors as events, so anything raised here is the infrastructure's)
            self._inflight.remove(flight)
            self._lost(flight, exc)
            return
        kind = event.get("type")
        if kind == "started":
            with Session(self.engine) as session, session.begin():
                session.execute(
                    update(Trial)
                    .where(Trial.id.in_([t.id for t in flight.trials]))
                    .values(worker=event["worker"])
                )
        elif kind == "eval":
            self._write_metrics(flight, event)
        elif kind == "result":
            self._inflight.remove(flight)
            self._write_results(flight, event)
        elif kind == "error":
            self._inflight.remove(flight)
            for t in flight.trials:
                self._end(t, TrialState.failed, event["error"])

    def _rerun_verdict(self, grid: str, needed: dict[str, int]) -> str | None:
        """Whether a charged, interrupted trial of ``grid`` may run again.

        ``needed`` counts the runs the grid's pending trials (and re-runs granted so far) will
        take; a re-run may only use a reserved run beyond those (``privacy.retries``).

        Returns:
            None: re-run it (``needed`` now counts it); ``""``: never, its grid is
            papernot-steinke; otherwise why not, naming the run it would need.
        """
        sched = self.schedules[grid]
        if sched.whole_grid:
            return ""
        used = self._runs_used.get(grid, 0)
        if sched.runs - used - needed.get(grid, 0) > 0:
            needed[grid] = needed.get(grid, 0) + 1
            return None
        run = used + needed.get(grid, 0) + 1
        return (
            f"the grid's reservation has no run left for it; a re-run would be run {run} of a "
            f"grid that reserved {sched.runs} (set privacy.retries to reserve re-runs)"
        )

    def _lost(self, flight: _InFlight, exc: Exception) -> None:
        """The crash policy for a pack whose worker or node died under this driver.

        Its trials were charged, may have touched data, and stay charged. Each is re-run only
        on a run its grid's reservation still holds after every pending trial of the grid has
        one (``privacy.retries``); papernot-steinke grids never re-run; the rest fail, saying
        why. The same rules as :meth:`_recover` applies after a driver crash.
        """
        reason = f"its worker was lost ({type(exc).__name__})"
        needed: dict[str, int] = {}
        for p in self._pending:
            needed[p.grid] = needed.get(p.grid, 0) + 1
        requeue: list[_Pending] = []
        for t in flight.trials:
            verdict = self._rerun_verdict(t.grid, needed)
            if verdict is None:
                requeue.append(t)
            elif verdict == "":
                self._end(
                    t,
                    TrialState.failed,
                    f"interrupted: {reason}; it stays charged, and papernot-steinke grids do "
                    "not re-run trials",
                )
            else:
                self._end(
                    t,
                    TrialState.failed,
                    f"interrupted: {reason}; it stays charged and is not re-run: {verdict}",
                )
        if not requeue:
            return
        with Session(self.engine) as session, session.begin():
            events.lock_sweep(session, self.sweep_id)
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
                if res.rowcount and t.grid not in self.hidden:  # type: ignore[attr-defined]
                    events.emit(
                        session,
                        self.sweep_id,
                        events.TRIAL,
                        self._trial_data(t, TrialState.pending.value, error=note),
                        trial_id=t.id,
                    )
        for t in requeue:
            self._count(t, "running", "pending")
        self._pending.extend(requeue)
        self._last_event = f"{len(requeue)} trial(s) re-queued: {reason}"

    def _write_metrics(self, flight: _InFlight, event: dict[str, Any]) -> None:
        step = int(event["step"])
        with Session(self.engine) as session, session.begin():
            events.lock_sweep(session, self.sweep_id)
            for t, metrics in zip(flight.trials, event["evals"], strict=True):
                if t.grid not in self.hidden:
                    values = {
                        k: (float(v) if math.isfinite(float(v)) else None)
                        for k, v in metrics.items()
                        if isinstance(v, int | float)
                    }
                    events.emit(
                        session,
                        self.sweep_id,
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
        if not self._all_hidden(flight.trials):
            # (A papernot-steinke run's steps would count its runs: _report says it instead.)
            self._last_event = f"{flight.trials[0].arm}: step {step}/{event['total']}"

    def _write_results(self, flight: _InFlight, event: dict[str, Any]) -> None:
        now = _now()
        seconds = float(event["seconds"])
        with Session(self.engine) as session, session.begin():
            events.lock_sweep(session, self.sweep_id)
            for t, r in zip(flight.trials, event["results"], strict=True):
                res = session.execute(
                    update(Trial)
                    .where(Trial.id == t.id, Trial.state == TrialState.running)
                    .values(
                        state=TrialState.done,
                        finished_at=now,
                        train_seconds=seconds,
                        error=None,
                    )
                )
                if not res.rowcount:  # type: ignore[attr-defined]
                    continue  # cancelled meanwhile: its late result is dropped
                m = r["metrics"]
                session.add(
                    TrialResultRow(
                        trial_id=t.id,
                        metrics={k: v for k, v in m.items() if k != "reliability"},
                        final_metrics={
                            k: v for k, v in r["final_metrics"].items() if k != "reliability"
                        },
                        epsilon=r["epsilon"],
                        delta=r["target_delta"],
                        accountant=r["accountant"],
                        steps=r["steps"],
                        best_step=r["best_step"],
                        reliability=m.get("reliability"),
                        trajectories=r["trajectories"],
                        step_time_ms_median=r["step_time_ms_median"],
                        diverged_at=r["diverged_at"],
                        objective=_finite(m.get(self.metric)),
                    )
                )
                self._count(t, "running", "done")
                if t.grid not in self.hidden:
                    self._done_this_run += 1  # (the ETA's rate: shown grids only)
                    events.emit(
                        session,
                        self.sweep_id,
                        events.TRIAL,
                        self._trial_data(
                            t,
                            "done",
                            metrics={k: v for k, v in m.items() if k != "reliability"},
                            # What this run alone would cost; not what was spent (see releases).
                            single_run_epsilon=r["epsilon"],
                        ),
                        trial_id=t.id,
                    )
                if t.grid not in self.hidden:
                    self._note_best(t.arm, m.get(self.metric))
        for t in flight.trials:
            self._tell_tpe(t)
        shown = [t for t in flight.trials if t.grid not in self.hidden]
        if shown:
            self._last_event = f"finished {len(shown)} trial(s) of {shown[0].arm}"

    def _end(self, t: _Pending, state: TrialState, error: str, *, uncharged: bool = False) -> None:
        with Session(self.engine) as session, session.begin():
            events.lock_sweep(session, self.sweep_id)
            values: dict[str, Any] = {"state": state, "error": error, "finished_at": _now()}
            if uncharged:
                values["attempts"] = Trial.attempts - 1
            res = session.execute(
                update(Trial)
                .where(Trial.id == t.id, Trial.state == TrialState.running)
                .values(**values)
            )
            changed = bool(res.rowcount)  # type: ignore[attr-defined]
            if uncharged and not changed:
                # Cancelled between its claim and its charge: the cancel marked it "running,
                # stays charged", but its charge was refused and it never ran. Its books say so.
                session.execute(
                    update(Trial)
                    .where(Trial.id == t.id, Trial.state == TrialState.cancelled)
                    .values(
                        attempts=Trial.attempts - 1,
                        error="cancelled before it ran (never charged)",
                    )
                )
            if changed and t.grid not in self.hidden:
                events.emit(
                    session,
                    self.sweep_id,
                    events.TRIAL,
                    self._trial_data(t, state.value, error=error),
                    trial_id=t.id,
                )
        if changed:
            self._count(t, "running", state.value)
            if t.grid not in self.hidden:
                self._done_this_run += 1
            self._tell_tpe(t)
        if t.grid not in self.hidden:
            # A papernot-steinke run's error is not shown: how many there are counts runs.
            self._last_event = error

    def _trial_data(self, t: _Pending, state: str, **extra: Any) -> dict[str, Any]:
        return events.trial_event(
            t.id, arm=t.arm, epsilon_budget=t.epsilon_budget, state=state, **extra
        )

    def _emit_trial(self, session: Session, trial: Trial, *, note: str) -> None:
        events.emit(
            session,
            self.sweep_id,
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

    def _finish(self) -> None:
        with Session(self.engine) as session, session.begin():
            sweep = self._sweep_for_update(session)
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
            sweep.finished_at = _now()
            sweep.driver = None
            events.emit(
                session,
                self.sweep_id,
                events.SWEEP,
                {"state": sweep.state.value, "error": sweep.error},
            )
        self.ledger.release(self.dataset, sweep_id=self.sweep_id, note="sweep finished")

    def _outcome(self) -> RunOutcome:
        with Session(self.engine) as session:
            sweep = session.get(Sweep, self.sweep_id)
            if sweep is None:
                raise SweepNotFound(f"no sweep {self.sweep_id!r}")
            hidden = hidden_grids(sweep)
            counts: dict[str, int] = {}
            for arm, level, s in session.execute(
                select(Trial.arm, Trial.epsilon_budget, Trial.state).where(
                    Trial.sweep_id == self.sweep_id
                )
            ):
                if grid_key(arm, level) not in hidden:
                    counts[s.value] = counts.get(s.value, 0) + 1
            return RunOutcome(self.sweep_id, sweep.state.value, counts)


def format_elapsed(seconds: float) -> str:
    """``80.4`` -> ``"1m20s"``, ``3725`` -> ``"1h02m05s"``, ``7`` -> ``"7s"``."""
    total = max(0, int(seconds))
    h, rest = divmod(total, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"


def run_sweep(
    engine: Engine,
    sweep_id: str,
    *,
    settings: SweeperSettings | None = None,
    workers: int | None = None,
    on_progress: Callable[[Snapshot], None] | None = None,
    stop: threading.Event | None = None,
) -> RunOutcome:
    """Run (or resume) a stored sweep to the end; see :class:`SweepRunner`."""
    return SweepRunner(
        engine, sweep_id, settings=settings, workers=workers, on_progress=on_progress, stop=stop
    ).run()
