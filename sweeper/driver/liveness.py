"""Which process drives a sweep: taking a sweep over, the driver's heartbeat, giving it up.

A driver writes a heartbeat on its sweep's row. Another process may take the sweep over only
when its driver is gone: none recorded, a dead process on this host, or a heartbeat older than
``stale_after_seconds`` (:func:`take_over`). The scheduler (:mod:`sweeper.driver.scheduler`)
uses the same tests to pick up sweeps whose driver is gone.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import UTC, datetime

from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from dpsweep.errors import IllegalState
from dpsweep.plan import SweepPlan
from dpsweep.spec import SweepSpec
from sweeper.driver.held_sweep import HeldSweep, PlannedGrid, sweep_for_update
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.settings import SweeperSettings
from sweeper.store import Sweep, SweepState
from sweeper.sweeps import events
from sweeper.sweeps.stored import TERMINAL_SWEEPS, hidden_grids, schedules


def utc_now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def aware_utc(dt: datetime | None) -> datetime | None:
    """``dt`` with its timezone: SQLite hands back naive datetimes for timezone-aware
    columns, and they were stored as UTC."""
    if dt is not None and dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt


def driver_ident() -> str:
    """This process as a sweep's ``driver`` column names it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def driver_alive(driver: str) -> bool:
    """Whether the process ``host:pid`` may still be alive: False only for a process of this
    host that is gone (on another machine, only its heartbeat can tell)."""
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


def take_over(
    engine: Engine,
    sweep_id: str,
    *,
    ident: str,
    settings: SweeperSettings,
    ledger: BudgetLedger,
) -> HeldSweep | None:
    """Make this process the sweep's driver and read what it drives, in one row-locked
    transaction.

    Returns:
        The held sweep, or None if the sweep already ended.

    Raises:
        SweepNotFound: no such sweep.
        IllegalState: another live process drives the sweep.
    """
    with Session(engine) as session, session.begin():
        sweep = sweep_for_update(session, sweep_id)
        if sweep.state in TERMINAL_SWEEPS:
            return None
        beat = aware_utc(sweep.heartbeat_at)
        fresh = beat is not None and (utc_now() - beat).total_seconds() < (
            settings.stale_after_seconds
        )
        if (
            sweep.state == SweepState.running
            and sweep.driver
            and sweep.driver != ident
            and fresh
            and driver_alive(sweep.driver)
        ):
            raise IllegalState(
                f"sweep {sweep_id} is being run by {sweep.driver} (heartbeat "
                f"{beat:%H:%M:%S} UTC); wait for it, cancel it, or if that process is gone "
                f"retry after {settings.stale_after_seconds:g} s"
            )
        sweep.driver = ident
        sweep.heartbeat_at = utc_now()
        if sweep.state != SweepState.running:
            events.emit(session, sweep_id, events.SWEEP, {"state": "running"})
        sweep.state = SweepState.running
        sweep.started_at = sweep.started_at or utc_now()
        return HeldSweep(
            engine=engine,
            sweep_id=sweep_id,
            ident=ident,
            settings=settings,
            ledger=ledger,
            # The ledger key (the records' identity); the name for sweeps stored before
            # ledgers were keyed by content.
            dataset=sweep.ledger_key or sweep.dataset,
            # The stored spec, parsed once: the driver reads typed fields, never raw keys.
            spec=SweepSpec.model_validate(sweep.spec),
            # A malformed plan fails here, before anything is charged (PlanCorrupt).
            plan=[PlannedGrid(g) for g in SweepPlan.from_stored(sweep.plan)],
            schedules=schedules(sweep),
            hidden=hidden_grids(sweep),
        )


class Heartbeat:
    """A driver's heartbeat on its sweep's row, which also tells it whether it still drives.

    Args:
        held: The sweep this driver holds.
    """

    def __init__(self, held: HeldSweep) -> None:
        self.held = held
        self._last_beat = 0.0

    def beat(self, force: bool = False) -> bool:
        """Write the heartbeat (at most every ``min(heartbeat_seconds, 4 * poll_seconds)``
        unless ``force``).

        Returns:
            False when the sweep was cancelled or another driver took it over.
        """
        settings = self.held.settings
        now = time.monotonic()
        if not force and now - self._last_beat < min(
            settings.heartbeat_seconds, settings.poll_seconds * 4
        ):
            return True
        self._last_beat = now
        with Session(self.held.engine) as session, session.begin():
            res = session.execute(
                update(Sweep)
                .where(
                    Sweep.id == self.held.sweep_id,
                    Sweep.driver == self.held.ident,
                    Sweep.state == SweepState.running,
                )
                .values(heartbeat_at=utc_now())
            )
            return bool(res.rowcount)  # type: ignore[attr-defined]


def give_up(held: HeldSweep) -> None:
    """Leave the sweep running with no driver, so that the next one takes it at once."""
    with Session(held.engine) as session, session.begin():
        session.execute(
            update(Sweep)
            .where(Sweep.id == held.sweep_id, Sweep.driver == held.ident)
            .values(driver=None)
        )
