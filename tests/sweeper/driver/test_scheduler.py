"""The scheduler: picks up what the database says is waiting, drives it on one Ray, drains."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from sweeper.driver.ray_backend import ray_session
from sweeper.driver.scheduler import Scheduler, live_schedulers
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.settings import SweeperSettings
from sweeper.store import Sweep, SweepEvent, Trial
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from tests.sweeper.sweeps.test_sweep import digits_key, tiny_spec


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'sched.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _states(engine: Any, ids: list[str]) -> list[str]:
    with Session(engine) as s:
        return [s.get(Sweep, i).state.value for i in ids]  # type: ignore[union-attr]


def test_scheduler_drives_waiting_sweeps_in_order_and_fails_unrunnable_trials_uncharged(
    engine: Any,
) -> None:
    one = tiny_spec(privacy={"budgets": [2], "delta": 1e-5})
    first = create_sweep(engine, {**one, "name": "first"}, owner="ada")
    second = create_sweep(engine, {**one, "name": "second"}, owner="ada")
    broken = create_sweep(engine, {**one, "name": "broken"}, owner="ada")
    # Its dataset becomes an upload that does not exist: the workers cannot be told what to
    # run, so its trials must fail without being charged.
    with Session(engine) as s, s.begin():
        row = s.get(Sweep, broken)
        assert row is not None
        row.spec = {**row.spec, "dataset": {**row.spec["dataset"], "name": "ds_gone"}}
    settings = SweeperSettings(
        workers=2, poll_seconds=0.05, heartbeat_seconds=0.2, max_concurrent_sweeps=1
    )
    stop = threading.Event()
    sched = Scheduler(engine, settings)
    with ray_session(settings, workers=2):
        thread = threading.Thread(target=sched.run, args=(stop,))
        thread.start()
        try:
            deadline = time.monotonic() + 240
            seen_live = False
            while _states(engine, [first, second, broken]) != ["done", "done", "failed"]:
                seen_live = seen_live or bool(live_schedulers(engine, within_seconds=5))
                assert time.monotonic() < deadline, _states(engine, [first, second, broken])
                time.sleep(0.1)
        finally:
            stop.set()
            thread.join(60)
    assert seen_live and not thread.is_alive()
    assert live_schedulers(engine, within_seconds=60) == []  # unregistered on the way out
    with Session(engine) as s:
        rows = {i: s.get(Sweep, i) for i in (first, second, broken)}
        # One at a time, oldest first.
        assert rows[first].finished_at <= rows[second].started_at  # type: ignore[union-attr,operator]
        trials = list(s.scalars(select(Trial).where(Trial.sweep_id == broken)))
        assert trials and all(t.state.value == "failed" for t in trials)
        assert all("not charged" in (t.error or "") and t.attempts == 0 for t in trials)
        kinds = list(s.scalars(select(SweepEvent.kind).where(SweepEvent.sweep_id == broken)))
    balance = BudgetLedger(engine).sweep_balance(digits_key(engine), sweep_id=broken)
    assert balance.epsilon_charged == 0 and balance.epsilon_outstanding == 0
    assert kinds.count("trial") == 2 * len(trials)  # running, then failed


def test_a_stopped_scheduler_gives_its_sweep_up_and_the_next_one_finishes_it(
    engine: Any,
) -> None:
    # Eight one-trial packs run one at a time: even on a loaded machine, where the stop can
    # take a while to land, some are still waiting when it does (with four, all had finished).
    lrs = [0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7]
    spec = tiny_spec(
        privacy={"budgets": [2], "delta": 1e-5},
        arms=[{"strategy": "fixed", "grid": {"lr": lrs, "clip": [1.0]}}],
    )
    sid = create_sweep(engine, spec)
    settings = SweeperSettings(
        workers=1, poll_seconds=0.05, heartbeat_seconds=0.2, max_pack_size=1, drain_seconds=60
    )
    with ray_session(settings, workers=1):
        stop = threading.Event()
        thread = threading.Thread(target=Scheduler(engine, settings).run, args=(stop,))
        thread.start()
        deadline = time.monotonic() + 120
        while True:
            with Session(engine) as s:
                done = s.scalars(
                    select(Trial.id).where(Trial.sweep_id == sid, Trial.state == "done")
                ).all()
            if done:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stop.set()
        thread.join(90)
        assert not thread.is_alive()
        with Session(engine) as s:
            row = s.get(Sweep, sid)
            assert row is not None and row.state.value == "running" and row.driver is None
            states = list(s.scalars(select(Trial.state).where(Trial.sweep_id == sid)))
        # Drained: nothing was left running (so nothing is interrupted); some still wait.
        assert "running" not in states and "pending" in states
        stop = threading.Event()
        thread = threading.Thread(target=Scheduler(engine, settings).run, args=(stop,))
        thread.start()
        try:
            deadline = time.monotonic() + 120
            while _states(engine, [sid]) != ["done"]:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            stop.set()
            thread.join(60)
    with Session(engine) as s:
        trials = list(s.scalars(select(Trial).where(Trial.sweep_id == sid)))
    assert all(t.state.value == "done" and t.attempts == 1 for t in trials)
    balance = BudgetLedger(engine).sweep_balance(digits_key(engine), sweep_id=sid)
    assert balance.epsilon_charged == balance.epsilon_reserved
