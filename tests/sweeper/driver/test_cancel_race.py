"""A cancel racing a driver's claims and charges, many times, on SQLite and PostgreSQL: the
ledger takes no charge after the cancel's release, and the release log lists only trials that
were charged (that ran); trials caught between their claim and their charge never run.

The driver's side is the real one (:class:`~sweeper.driver.claims.Claims` on a sweep taken
over with :func:`~sweeper.driver.liveness.take_over`), without Ray: a charged trial either
fails in its "worker" (a charged failure, logged) or is still running when the cancel lands.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sweeper.driver.claims import Claims
from sweeper.driver.held_sweep import PendingTrial
from sweeper.driver.liveness import take_over
from sweeper.driver.progress import Progress
from sweeper.driver.tpe import TpeSearch
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.rows import EntryKind
from sweeper.privacy.release_log import read_log
from sweeper.settings import SweeperSettings
from sweeper.store import Sweep, Trial, TrialState, new_id, sweep_ledger_key
from sweeper.store.engine import make_engine
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.lifecycle import NEVER_RAN, cancel_sweep
from tests.conftest import sqlite_or_postgres_url
from tests.sweeper.sweeps.test_sweep import tiny_spec

ROUNDS = {"sqlite": 40, "postgresql": 30}


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    eng = make_engine(sqlite_or_postgres_url(request, tmp_path))
    eng.info_kind = request.param  # type: ignore[attr-defined]
    yield eng
    eng.dispose()


def _template(engine: Engine) -> str:
    """One planned sweep (one grid of 4 trials) to copy for every round: planning takes far
    longer than a round."""
    spec = tiny_spec(
        privacy={"budgets": [2], "delta": 1e-5},
        arms=[{"strategy": "fixed", "grid": {"lr": [0.05, 0.1, 0.2, 0.4], "clip": [1.0]}}],
    )
    return create_sweep(engine, spec)


def _copy(engine: Engine, template: str) -> str:
    """A new pending sweep with the template's spec, plan and trials, reserved as it was."""
    sid = new_id()
    sweeps, trials = cast(sa.Table, Sweep.__table__), cast(sa.Table, Trial.__table__)
    with Session(engine) as s, s.begin():
        row = dict(s.execute(sa.select(sweeps).where(sweeps.c.id == template)).mappings().one())
        s.execute(sa.insert(sweeps).values({**row, "id": sid}))
        for t in s.execute(sa.select(trials).where(trials.c.sweep_id == template)).mappings():
            s.execute(sa.insert(trials).values({**t, "id": new_id(), "sweep_id": sid}))
        key = row["ledger_key"] or row["dataset"]
    ledger = BudgetLedger(engine)
    (reserved,) = [e for e in ledger.entries(key, template) if e.kind is EntryKind.RESERVE]
    ledger.reserve(key, sweep_id=sid, epsilon=reserved.epsilon, delta=reserved.delta)
    return sid


def _drive(engine: Engine, sid: str, rng: random.Random, start: threading.Barrier) -> None:
    """What the driver does, pack after pack: claim, charge, and let a charged trial run
    (now and then it fails in its worker: a charged failure, logged); until the claim says
    the sweep is no longer running. Pauses stand for the driver's own work between steps."""
    held = take_over(
        engine, sid, ident=f"race-{sid}", settings=SweeperSettings(), ledger=BudgetLedger(engine)
    )
    assert held is not None
    with Session(engine) as s:
        rows = s.scalars(sa.select(Trial).where(Trial.sweep_id == sid).order_by(Trial.number))
        held.pending = [PendingTrial.of(t) for t in rows]
    progress = Progress(held, on_progress=None, t0=time.monotonic())
    progress.counts = {s.value: 0 for s in TrialState}
    progress.counts["pending"] = len(held.pending)
    claims = Claims(held, progress, TpeSearch(held))
    start.wait()
    while held.pending:
        size = rng.choice([1, 2])
        chosen, held.pending = held.pending[:size], held.pending[size:]
        time.sleep(rng.random() * 0.002)
        claimed = claims.claim(chosen)
        if claimed is None:
            return
        time.sleep(rng.random() * 0.002)  # the window between a pack's claim and its charge
        for t in claims.charge(claimed):
            if rng.random() < 0.3:
                claims.end(t, TrialState.failed, "the worker ended without a result")


def _cancel(engine: Engine, sid: str, delay: float, start: threading.Barrier) -> None:
    start.wait()
    time.sleep(delay)
    cancel_sweep(engine, sid)


def _race(engine: Engine, sid: str, rng: random.Random) -> None:
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def guarded(target: Any, *args: Any) -> None:
        try:
            target(*args)
        except BaseException as exc:  # reported below: neither side may crash
            errors.append(exc)

    threads = [
        threading.Thread(target=guarded, args=(_drive, engine, sid, rng, start)),
        threading.Thread(target=guarded, args=(_cancel, engine, sid, rng.random() * 0.012, start)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors


def _check(engine: Engine, sid: str) -> tuple[int, int]:
    """The round's books; returns how many trials were charged and how many never ran
    after their claim."""
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None and sweep.state.value == "cancelled"
        key = sweep_ledger_key(sweep)
        trials = list(s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)))
    entries = BudgetLedger(engine).entries(key, sid)
    (release,) = [e for e in entries if e.kind is EntryKind.RELEASE]
    charges: dict[str, int] = {}
    for e in entries:
        if e.kind is EntryKind.CHARGE:
            # No charge after the release: the cancel's release ended the sweep.
            assert e.id < release.id
            assert e.trial_id is not None
            charges[e.trial_id] = charges.get(e.trial_id, 0) + 1
    log = [e for e in read_log(engine, key, everyone=True) if e["sweep_id"] == sid]
    # Only charged trials are in the release log: every entry is a trial that ran.
    assert {e["trial_id"] for e in log} <= set(charges)
    logged = {(e["trial_id"], e["kind"]) for e in log}
    stopped = {t.id for t in trials if "while running" in (t.error or "")}
    assert {tid for tid, kind in logged if kind == "trial-cancelled"} == stopped
    for t in trials:
        # Every trial ended; its attempts are its charges (a refused charge took its
        # claim's attempt back); a refusal was read as "the sweep ended", never a failure.
        assert t.state in (TrialState.cancelled, TrialState.failed), t.state
        assert t.attempts == charges.get(t.id, 0), (t.id, t.error)
        assert "not run, and not charged" not in (t.error or "")
        if t.state == TrialState.failed:
            assert (t.id, "trial-failed") in logged
        elif t.id not in stopped:
            assert t.id not in charges and t.error in (
                NEVER_RAN,
                "cancelled before it started (not charged)",
            )
    never_ran = sum(t.error == NEVER_RAN for t in trials)
    return len(charges), never_ran


def test_a_cancel_racing_claims_and_charges_logs_only_trials_that_ran(engine: Engine) -> None:
    template = _template(engine)
    rng = random.Random(11)
    charged, never_ran = 0, 0
    for _ in range(ROUNDS[engine.info_kind]):  # type: ignore[attr-defined]
        sid = _copy(engine, template)
        _race(engine, sid, rng)
        ran, unran = _check(engine, sid)
        charged, never_ran = charged + ran, never_ran + unran
    # The cancel landed at every stage: after charges, and between claims and charges.
    assert charged > 0 and never_ran > 0
