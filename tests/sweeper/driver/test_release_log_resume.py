"""The audit log of releases after a crash and a resume: exactly the releases that happened.

An analyst's sweep on an owner's upload is driven by a real driver process that is SIGKILLed
with trials done and trials running, then resumed by another process to the end. The log
must then list one ``trial`` entry per finished trial and one ``trial-failed`` entry per
charged trial that failed, in the order the trials finished, one ``model`` entry per kept
model, nothing twice, everything received by the analyst, each trial's ε what the ledger
charged it (re-runs included).

A papernot-steinke sweep (whose driver dies mid-search, simulated by a dead driver's claim)
logs each grid's one release, its selected trial, with the grid's one charge, and never its
runs one by one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import sweeper.sweeps.create as sweeps_mod
from sweeper.datasets import grants
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.privacy.charges import ChargeSchedule, exact_sum, ps_charge_note
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.rows import EntryKind, LedgerEntry
from sweeper.settings import SweeperSettings
from sweeper.store import ModelArtifact, ReleaseRecord, Sweep, SweepState, Trial, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps import released
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.stored import grid_key
from tests.sweeper.datasets.test_grants import OWNER, _spec, _upload

ROOT = Path(__file__).resolve().parents[3]
ANALYST = "ana"

# Run (or resume) one stored sweep to its end in this process, as its driver.
RUNNER = (
    "import sys\n"
    "from sweeper.driver.loop import run_sweep\n"
    "from sweeper.store.engine import make_engine\n"
    "out = run_sweep(make_engine(sys.argv[1]), sys.argv[2], workers=2)\n"
    "sys.exit(0 if out.state == 'done' else 1)\n"
)


def _drive(url: str, sweep_id: str, cwd: Path) -> subprocess.Popen[bytes]:
    """A driver process for the sweep (its own session: its Ray processes die with it)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "DPSWEEP_MAX_PACK_SIZE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    return subprocess.Popen(
        [sys.executable, "-c", RUNNER, url, sweep_id],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _states(engine: Any, sweep_id: str) -> Counter[str]:
    with Session(engine) as s:
        rows = s.scalars(sa.select(Trial.state).where(Trial.sweep_id == sweep_id))
        return Counter(str(st.value) for st in rows)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # Ray processes the driver left behind
    proc.wait()


def _charges(engine: Any, sweep_id: str) -> dict[str, Decimal]:
    """The ε the ledger charged each trial of the sweep (exact sums)."""
    out: dict[str, list[Decimal]] = {}
    with Session(engine) as s:
        for tid, eps in s.execute(
            sa.select(LedgerEntry.trial_id, LedgerEntry.epsilon).where(
                LedgerEntry.sweep_id == sweep_id, LedgerEntry.kind == EntryKind.CHARGE
            )
        ):
            out.setdefault(str(tid), []).append(eps)
    return {tid: exact_sum(v) for tid, v in out.items()}


def _log(engine: Any, sweep_id: str) -> list[Any]:
    """The sweep's release records, oldest first (as stored: exact ε)."""
    with Session(engine) as s:
        rows = s.scalars(
            sa.select(ReleaseRecord)
            .where(ReleaseRecord.sweep_id == sweep_id)
            .order_by(ReleaseRecord.id)
        )
        return list(rows)


def _analyst_setup(tmp_path: Path, db: str) -> tuple[Any, str, str]:
    """A database with an owner's upload and a grant of it to the analyst."""
    url = f"sqlite:///{tmp_path / db}"
    upgrade(url)
    engine = make_engine(url)
    ds = _upload(engine, tmp_path, cap=100.0)
    grants.grant(engine, ds, ANALYST, epsilon_allowance=50, viewer=OWNER, confirm=True)
    return engine, url, ds


@pytest.mark.slow
def test_the_log_lists_exactly_the_releases_after_sigkill_and_resume(tmp_path: Path) -> None:
    engine, url, ds = _analyst_setup(tmp_path, "crash.db")
    # Six trials of one grid, two at a time, long enough to be caught running; one re-run
    # reserved: of two charged trials the crash interrupts, one re-runs and one fails.
    spec = _spec(ds, budgets=[2], n_lr=3) | {
        "model": {"name": "mlp"},
        "training": {"steps": 400, "batch_size": 32, "eval_every": 200},
        "seeds": 2,
        "privacy": {"budgets": [2], "delta": 1e-5, "retries": 1},
        "artifacts": {"keep": "all"},
    }
    sid = create_sweep(engine, spec, owner=ANALYST)

    first = _drive(url, sid, tmp_path)
    try:
        end = time.monotonic() + 240
        while time.monotonic() < end:
            st = _states(engine, sid)
            if st["done"] >= 1 and st["running"] >= 2:
                break
            if first.poll() is not None:
                raise AssertionError(f"the driver ended early: {first.stderr.read()[-2000:]!r}")  # type: ignore[union-attr]
            time.sleep(0.05)
        else:
            raise AssertionError(f"timed out; states {_states(engine, sid)}")
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        _reap(first)
    before = _states(engine, sid)
    assert before["running"] >= 2 and before["done"] >= 1
    logged_before = [(r.id, r.trial_id, r.kind) for r in _log(engine, sid)]
    with Session(engine) as s:
        running = set(s.scalars(sa.select(Trial.id).where(Trial.state == TrialState.running)))
    interrupted_charged = running & set(_charges(engine, sid))

    second = _drive(url, sid, tmp_path)
    try:
        _out, err = second.communicate(timeout=400)
    finally:
        _reap(second)
    assert second.returncode == 0, err.decode()[-3000:]

    with Session(engine) as s:
        trials = {t.id: t for t in s.scalars(sa.select(Trial).where(Trial.sweep_id == sid))}
        sweep = s.get(Sweep, sid)
        assert sweep is not None and sweep.state == SweepState.done
        kept = set(
            s.scalars(sa.select(ModelArtifact.trial_id).where(ModelArtifact.sweep_id == sid))
        )
    charges = _charges(engine, sid)
    log = _log(engine, sid)
    # What was logged before the crash is still there, unchanged, first.
    assert [(r.id, r.trial_id, r.kind) for r in log[: len(logged_before)]] == logged_before
    # Nothing twice; everything to the analyst, on this sweep.
    assert len({(r.trial_id, r.kind) for r in log}) == len(log)
    assert all(r.principal == ANALYST and r.dataset_name == ds for r in log)
    done = {tid for tid, t in trials.items() if t.state == TrialState.done}
    failed_charged = {
        tid for tid, t in trials.items() if t.state == TrialState.failed and tid in charges
    }
    assert any(t.attempts == 2 for t in trials.values())  # a re-run happened
    by_kind: dict[str, list[Any]] = {}
    for r in log:
        by_kind.setdefault(r.kind, []).append(r)
    assert {r.trial_id for r in by_kind.get("trial", [])} == done
    logged_failed = {r.trial_id for r in by_kind.get("trial-failed", [])}
    assert logged_failed <= failed_charged
    assert set(by_kind) <= {"trial", "trial-failed", "model"}
    # Each shown trial's ε is exactly what the ledger charged it (both runs of a re-run).
    for r in by_kind.get("trial", []) + by_kind.get("trial-failed", []):
        assert r.epsilon == charges[r.trial_id]
    # In the order the trials finished.
    shown = by_kind.get("trial", []) + by_kind.get("trial-failed", [])
    finish = [trials[r.trial_id].finished_at for r in sorted(shown, key=lambda r: r.id)]
    assert finish == sorted(finish)
    # One entry per kept model (every released trial's, with keep: all), after its trial's.
    assert {r.trial_id for r in by_kind.get("model", [])} == kept == done
    trial_entry = {r.trial_id: r.id for r in by_kind["trial"]}
    assert all(r.id > trial_entry[r.trial_id] and r.epsilon == 0 for r in by_kind["model"])
    engine.dispose()
    # A charged trial the crash policy failed (its error and history reach the analyst) is
    # logged too.
    if len(interrupted_charged) >= 2:  # one re-run reserved: the second one fails
        assert failed_charged & interrupted_charged
    assert logged_failed == failed_charged


# ---------------------------------------------------------------------------------------------
# papernot-steinke: one release per grid, never its runs


@pytest.fixture(scope="module")
def local_ray() -> Any:
    import ray

    with ray_session(SweeperSettings(), workers=2):
        yield ray


def _dead_driver() -> str:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return f"{socket.gethostname()}:{proc.pid}"


@pytest.mark.slow
def test_a_papernot_steinke_grid_logs_its_one_release_through_a_crash(
    local_ray: Any, tmp_path: Path
) -> None:
    engine, _url, ds = _analyst_setup(tmp_path, "ps.db")
    spec = _spec(ds, budgets=[3, 8], n_lr=2) | {
        "privacy": {
            "budgets": [3, 8],
            "delta": 1e-5,
            "accounting": "papernot-steinke",
            "distribution": {"name": "poisson"},
        },
        "search": {"method": "random", "n": 3},
    }
    with pytest.MonkeyPatch.context() as mp:  # every grid draws exactly 3 runs
        mp.setattr(sweeps_mod, "draw_run_count", lambda *a, **k: 3)
        sid = create_sweep(engine, spec, owner=ANALYST)
    # A driver died with one run of each grid claimed. In the first grid it had written the
    # grid's one charge (so that run may have touched data: it fails, never re-run, and is
    # never logged on its own); in the second it had not (the run goes back to the queue).
    with Session(engine) as s, s.begin():
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        sweep.state = SweepState.running
        sweep.driver = _dead_driver()
        sweep.heartbeat_at = datetime.now(UTC) - timedelta(hours=1)
        plan = {g["grid"]: g for g in sweep.plan or []}
        claimed: dict[str, str] = {}
        for t in sorted(sweep.trials, key=lambda t: t.id):
            key = grid_key(t.arm, t.epsilon_budget)
            if key not in claimed:
                claimed[key] = t.id
                t.state, t.attempts, t.started_at = TrialState.running, 1, datetime.now(UTC)
        ledger_key = str(sweep.ledger_key)
    charged_grid = sorted(claimed)[0]
    eps, dlt = ChargeSchedule.from_json(plan[charged_grid]["charges"]).charge_for_run(1)
    BudgetLedger(engine).charge(
        ledger_key,
        sweep_id=sid,
        trial_id=claimed[charged_grid],
        epsilon=eps,
        delta=dlt,
        note=ps_charge_note(charged_grid),
    )
    assert run_sweep(engine, sid).state == "done"
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        grids: dict[str, list[str]] = {}
        for t in sweep.trials:
            grids.setdefault(grid_key(t.arm, t.epsilon_budget), []).append(t.id)
        kept = set(
            s.scalars(sa.select(ModelArtifact.trial_id).where(ModelArtifact.sweep_id == sid))
        )
        states = {t.id: t.state for t in sweep.trials}
    assert len(grids) == 2 and all(len(v) == 3 for v in grids.values())
    assert states[claimed[charged_grid]] == TrialState.failed
    charges = _charges(engine, sid)
    log = _log(engine, sid)
    selected = [r for r in log if r.kind == "selected-trial"]
    # Exactly one release per grid, with the grid's one whole-search charge; no run's own.
    assert sorted(r.grid for r in selected) == sorted(grids)
    for r in selected:
        runs = grids[r.grid]
        assert r.trial_id in runs and r.principal == ANALYST
        (charge,) = [charges[t] for t in runs if t in charges]
        assert r.epsilon == charge > 0
        if r.grid == charged_grid:
            assert charge == eps  # the charge the dead driver wrote, once
        # Its detail says nothing of the number of runs.
        assert r.detail == {"released": ["metrics", "params"], "accounting": "papernot-steinke"}
    assert not [r for r in log if r.kind in ("trial", "trial-failed")]
    # The only other entries: the selected trials' kept models.
    assert {r.trial_id for r in log if r.kind == "model"} == kept <= {r.trial_id for r in selected}
    assert {r.kind for r in log} <= {"selected-trial", "model"}
    # Logging again (as a driver taking a finished sweep over would) adds nothing.
    assert released.record_hidden_releases(engine, sid, metric="accuracy", mode="max") == 0
    assert len(_log(engine, sid)) == len(log)
    engine.dispose()
