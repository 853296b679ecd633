"""The scheduler: drives the sweeps the database says are waiting, on one Ray.

``dpsweep serve`` starts one as a child process next to the API (``python -m
sweeper.driver.scheduler``);
``dpsweep scheduler`` runs one alone (API replicas plus one scheduler, say). It talks to nothing
but the database, the single source of truth: the API creates and cancels sweeps there, and the
scheduler finds them there.

What it picks up, oldest first, up to ``max_concurrent_sweeps`` at once:

* ``pending`` sweeps (just created);
* ``running`` sweeps whose driver is gone: none recorded (a driver that shut down cleanly gives
  its sweep up), a dead process on this host, or a heartbeat older than
  ``stale_after_seconds``. The driver's crash policy (:mod:`sweeper.driver.crash`) then decides
  what happens to their interrupted trials.

Several schedulers on one database are safe: taking a sweep over is a row-locked check in the
driver (:func:`sweeper.driver.liveness.take_over`), and a sweep that another live driver holds
is skipped.

Shutting down (SIGTERM/SIGINT) stops submitting work, lets running trials finish for up to
``drain_seconds``, and gives the sweeps up so that the next scheduler resumes them at once.
A sweep whose driver crashes (a bug, a lost database) is retried after a pause; after
:data:`MAX_CRASHES` crashes it is ended as failed, releasing what it had not spent.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import Engine, delete, or_, select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, IllegalState, SweepNotFound
from sweeper.datasets.expiry import expire
from sweeper.driver import failures
from sweeper.driver.liveness import aware_utc, driver_alive, driver_ident, utc_now
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.settings import SweeperSettings
from sweeper.store import ServiceHeartbeat, Sweep, SweepState, iso
from sweeper.store.engine import database_url, make_engine
from sweeper.store.schema import ensure_schema
from sweeper.sweeps.lifecycle import fail_sweep

log = logging.getLogger("dpsweep.scheduler")

KIND = "scheduler"
MAX_CRASHES = 3
RETRY_AFTER_S = 10.0


@dataclass
class _Drive:
    thread: threading.Thread
    stop: threading.Event
    error: BaseException | None = None


@dataclass
class Scheduler:
    """Poll the database for sweeps to drive and drive them in threads sharing one Ray."""

    engine: Engine
    settings: SweeperSettings = field(default_factory=SweeperSettings)
    parent_pid: int | None = None

    def __post_init__(self) -> None:
        self.ident = driver_ident()
        self.name = f"{KIND}:{self.ident}"
        self._drives: dict[str, _Drive] = {}
        self._crashes: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event, *, handle_signals: bool = False) -> None:
        """Drive sweeps until ``stop`` is set (or the parent process is gone), then drain.

        Args:
            stop: Set it to drain and return.
            handle_signals: SIGTERM and SIGINT set ``stop`` (main thread only). Installed once
                Ray is up, because starting Ray replaces the handlers.
        """
        with ray_session(self.settings):
            if handle_signals:

                def on_signal(signum: int, frame: object) -> None:
                    log.info("signal %d: draining", signum)
                    stop.set()

                signal.signal(signal.SIGTERM, on_signal)
                signal.signal(signal.SIGINT, on_signal)
            log.info("scheduler %s ready", self.ident)
            try:
                while not stop.is_set():
                    if self.parent_pid is not None and os.getppid() != self.parent_pid:
                        log.warning("parent process gone; stopping")
                        break
                    self._beat()
                    self._reap()
                    self._start_ready()
                    self._expire()
                    stop.wait(max(0.2, self.settings.poll_seconds * 2))
            finally:
                self._drain()
                self._unregister()

    def _candidates(self) -> list[str]:
        stale = utc_now() - timedelta(seconds=self.settings.stale_after_seconds)
        with Session(self.engine) as session:
            rows = session.execute(
                select(Sweep.id, Sweep.state, Sweep.driver, Sweep.heartbeat_at)
                .where(
                    or_(
                        Sweep.state == SweepState.pending,
                        Sweep.state == SweepState.running,
                    )
                )
                .order_by(Sweep.created_at)
            ).all()
        out = []
        for sid, state, driver, beat in rows:
            if sid in self._drives or time.monotonic() < self._retry_at.get(sid, 0.0):
                continue
            if state == SweepState.running and driver:
                fresh = (b := aware_utc(beat)) is not None and b > stale
                if fresh and driver_alive(driver):
                    continue
            out.append(sid)
        return out

    def _start_ready(self) -> None:
        free = self.settings.max_concurrent_sweeps - len(self._drives)
        if free <= 0:
            return
        for sid in self._candidates()[:free]:
            drive = _Drive(threading.Thread(), threading.Event())
            drive.thread = threading.Thread(
                target=self._drive, args=(sid, drive), name=f"sweep-{sid[:8]}", daemon=True
            )
            self._drives[sid] = drive
            drive.thread.start()

    def _drive(self, sweep_id: str, drive: _Drive) -> None:
        log.info("sweep %s: driving", sweep_id)
        try:
            outcome = run_sweep(self.engine, sweep_id, settings=self.settings, stop=drive.stop)
            log.info("sweep %s: %s %s", sweep_id, outcome.state, outcome.counts)
        except (IllegalState, SweepNotFound) as exc:
            log.info("sweep %s: skipped (%s)", sweep_id, exc)
        except BaseException as exc:  # the thread must report, not vanish
            log.exception("sweep %s: driver crashed", sweep_id)
            drive.error = exc

    def _reap(self) -> None:
        for sid, drive in list(self._drives.items()):
            if drive.thread.is_alive():
                continue
            del self._drives[sid]
            if drive.error is None:
                self._crashes.pop(sid, None)
                continue
            n = self._crashes[sid] = self._crashes.get(sid, 0) + 1
            self._retry_at[sid] = time.monotonic() + RETRY_AFTER_S
            if n >= MAX_CRASHES:
                # Privacy: the crash's text may hold values computed from the records (a
                # loader's or an allocator's message); _drive logged it in full for the
                # operator, and the sweep says only its category (sweeper.driver.failures).
                failure = failures.public_failure(drive.error)
                with contextlib.suppress(IllegalState):
                    fail_sweep(
                        self.engine,
                        sid,
                        error=f"its driver crashed {n} times; last: {failure.text}",
                    )

    def _drain(self) -> None:
        for drive in self._drives.values():
            drive.stop.set()
        deadline = time.monotonic() + self.settings.drain_seconds + 10.0
        for drive in self._drives.values():
            drive.thread.join(max(0.0, deadline - time.monotonic()))

    # -- presence, for /ready ------------------------------------------------------------------

    def _expire(self) -> None:
        """Expire old idempotency keys and unused uploads, every ``expiry_every_seconds``."""
        now = time.monotonic()
        if now - getattr(self, "_last_expiry", -1e12) < self.settings.expiry_every_seconds:
            return
        self._last_expiry = now
        days = self.settings.upload_ttl_days
        try:
            out = expire(
                self.engine,
                idempotency_ttl=timedelta(hours=self.settings.idempotency_ttl_hours),
                upload_ttl=timedelta(days=days) if days > 0 else None,
            )
        except Exception:  # expiry is housekeeping: it never stops the scheduler
            log.exception("expiry failed; it is retried at the next pass")
            return
        if out.idempotency_keys or out.uploads:
            log.info(
                "expired %d idempotency key(s) and %d unused upload(s)",
                out.idempotency_keys,
                len(out.uploads),
            )

    def _beat(self) -> None:
        now = time.monotonic()
        if now - getattr(self, "_last_beat", -1e9) < self.settings.heartbeat_seconds:
            return
        self._last_beat = now
        info = {
            "workers": self.settings.workers,
            "max_concurrent_sweeps": self.settings.max_concurrent_sweeps,
            "driving": sorted(self._drives),
            "ray_address": self.settings.ray_address or "local",
        }
        with Session(self.engine) as session, session.begin():
            row = session.get(ServiceHeartbeat, self.name)
            if row is None:
                session.add(ServiceHeartbeat(name=self.name, kind=KIND, info=info))
            else:
                row.beat_at = utc_now()
                row.info = info

    def _unregister(self) -> None:
        try:
            with Session(self.engine) as session, session.begin():
                session.execute(delete(ServiceHeartbeat).where(ServiceHeartbeat.name == self.name))
        except Exception:  # shutting down: the row goes stale on its own
            log.warning("could not unregister %s", self.name)


def live_schedulers(engine: Engine, *, within_seconds: float) -> list[dict[str, object]]:
    """Schedulers that beat within the last ``within_seconds``."""
    since = utc_now() - timedelta(seconds=within_seconds)
    with Session(engine) as session:
        rows = list(session.scalars(select(ServiceHeartbeat).where(ServiceHeartbeat.kind == KIND)))
    return [
        {"name": r.name, "beat_at": iso(r.beat_at), **(r.info or {})}
        for r in rows
        if (b := aware_utc(r.beat_at)) is not None and b > since
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sweeper.driver.scheduler [--db URL] [--workers N] [--parent-pid PID]``."""
    parser = argparse.ArgumentParser(prog="dpsweep scheduler")
    parser.add_argument("--db", help="database URL (default DPSWEEP_DATABASE_URL)")
    parser.add_argument("--workers", type=int, help="packs run at once (default: CPUs)")
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    settings = SweeperSettings()
    if args.workers:
        settings = settings.model_copy(update={"workers": args.workers})
    url = database_url(args.db or settings.database_url)
    try:
        ensure_schema(url)  # as every command: SQLite is migrated on first use
    except ConfigError as exc:  # another database behind head: one line that says how
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    engine = make_engine(url)
    stop = threading.Event()
    Scheduler(engine, settings, parent_pid=args.parent_pid).run(stop, handle_signals=True)
    engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
