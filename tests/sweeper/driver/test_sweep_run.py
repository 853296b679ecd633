"""Sweeps on a real local Ray into real databases: end to end, crash and resume, cancel."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from api.cli import main
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.privacy.charges import EXACT, ChargeSchedule, exact_sum
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.rows import EntryKind
from sweeper.settings import SweeperSettings
from sweeper.store import MetricPoint, Sweep, Trial, TrialResultRow, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.lifecycle import cancel_sweep
from sweeper.sweeps.results import pareto_mask
from sweeper.sweeps.stored import grid_key
from sweeper.sweeps.summary import summarize
from tests.conftest import fresh_postgres_database
from tests.sweeper.sweeps.test_sweep import digits_key, tiny_spec

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def local_ray() -> Any:
    """One local Ray for the module (the runner reuses an initialised Ray)."""
    import ray

    with ray_session(SweeperSettings(), workers=2):
        yield ray


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'run.db'}"
    else:
        url = fresh_postgres_database(request.getfixturevalue("postgres_url"), str(tmp_path))
    upgrade(url)
    eng = make_engine(url)
    eng.info_url = url  # type: ignore[attr-defined]
    yield eng
    eng.dispose()


def _charges(engine: Any, dataset: str, sweep_id: str) -> dict[str, list[Decimal]]:
    out: dict[str, list[Decimal]] = {}
    for e in BudgetLedger(engine).entries(dataset, sweep_id):
        if e.kind == EntryKind.CHARGE:
            assert e.trial_id is not None
            out.setdefault(e.trial_id, []).append(e.epsilon)
    return out


def _check_books(engine: Any, sweep_id: str) -> None:
    """Every trial accounted for; charges == attempts; grids charged exactly their schedule
    prefix; reserved == charged + released (+ outstanding while unfinished)."""
    with Session(engine) as s:
        sweep = s.get(Sweep, sweep_id)
        assert sweep is not None
        trials = list(s.scalars(sa.select(Trial).where(Trial.sweep_id == sweep_id)))
        plan = list(sweep.plan or [])
        dataset = sweep.ledger_key or sweep.dataset
        results = {r.trial_id for r in s.scalars(sa.select(TrialResultRow))}
    charges = _charges(engine, dataset, sweep_id)
    used: dict[str, int] = {}
    for t in trials:
        n = len(charges.get(t.id, []))
        assert n == t.attempts, (t.state, t.error)
        used[grid_key(t.arm, t.epsilon_budget)] = used.get(grid_key(t.arm, t.epsilon_budget), 0) + n
        assert (t.id in results) == (t.state == TrialState.done)
    for g in plan:
        sched = ChargeSchedule.from_json(g["charges"])
        runs = used.get(g["grid"], 0)
        got = exact_sum(
            [
                c
                for t in trials
                if grid_key(t.arm, t.epsilon_budget) == g["grid"]
                for c in charges.get(t.id, [])
            ]
        )
        assert got == sched.cumulative(runs)[0]
    bal = BudgetLedger(engine).sweep_balance(dataset, sweep_id=sweep_id)
    assert bal.epsilon_reserved == exact_sum(
        [ChargeSchedule.from_json(g["charges"]).reserved_epsilon for g in plan]
    )
    assert bal.epsilon_outstanding >= 0


def test_end_to_end_on_local_ray(local_ray: Any, engine: Any) -> None:
    sid = create_sweep(engine, tiny_spec())
    snaps: list[Any] = []
    out = run_sweep(engine, sid, on_progress=snaps.append)
    assert out.state == "done" and out.counts == {"done": 6}
    assert snaps and snaps[-1].counts["done"] == 6
    # The last line is the sweep's end, not the last pack's "finished 1 trial(s) of ...".
    assert snaps[-1].last_event == "all 6 trial(s) ended: 6 done"
    _check_books(engine, sid)
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        plan = {g["grid"]: g for g in sweep.plan or []}
        trials = list(s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)))
        for t in trials:
            assert t.state == TrialState.done and t.attempts == 1
            assert t.train_seconds is not None and t.started_at and t.finished_at
            r = s.get(TrialResultRow, t.id)
            assert r is not None and 0 <= r.metrics["accuracy"] <= 1
            # The trial's own epsilon comes from the noise it ran with, by the plan's PLD.
            g = plan[grid_key(t.arm, t.epsilon_budget)]
            assert r.epsilon == pytest.approx(g["epsilon_per_trial"], rel=1e-9)
            steps = sorted(
                {
                    m.step
                    for m in s.scalars(sa.select(MetricPoint).where(MetricPoint.trial_id == t.id))
                }
            )
            assert steps == [10, 20]
    bal = BudgetLedger(engine).sweep_balance(digits_key(engine), sweep_id=sid)
    # The ledger's committed epsilon is the plan's: every run happened, nothing was released.
    assert float(bal.epsilon_charged) == pytest.approx(
        sum(g["epsilon_total"] for g in plan.values()), rel=1e-6
    )
    assert bal.epsilon_charged == bal.epsilon_reserved and bal.epsilon_released == 0
    # Results by hand: the best configuration per arm and level, and the Pareto flags.
    summary = summarize(engine, sid)
    assert summary["state"] == "done"
    by_hand: dict[tuple[str, float], tuple[float, dict[str, Any]]] = {}
    with Session(engine) as s:
        for t in s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)):
            acc = s.get(TrialResultRow, t.id).metrics["accuracy"]  # type: ignore[union-attr]
            k = (t.arm, t.epsilon_budget)
            if k not in by_hand or acc > by_hand[k][0]:
                by_hand[k] = (acc, t.params)
    assert len(summary["results"]) == len(by_hand) == 4
    for r in summary["results"]:
        acc, params = by_hand[(r["arm"], r["epsilon_budget"])]
        assert r["objective_mean"] == acc and r["best_params"] == params
    pts = summary["pareto"]["epsilon"]
    flags = pareto_mask([(p["x"], p["y"]) for p in pts], x_mode="min", y_mode="max")
    assert [not p["dominated"] for p in pts] == flags


def test_crash_policy_with_a_dead_driver(local_ray: Any, engine: Any) -> None:
    """A dead driver left one trial charged and running, one claimed but uncharged."""
    sid = create_sweep(engine, tiny_spec(privacy={"budgets": [2], "delta": 1e-5}))
    ledger = BudgetLedger(engine)
    with Session(engine) as s, s.begin():
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        trials = sorted(
            s.scalars(sa.select(Trial).where(Trial.sweep_id == sid, Trial.arm == "fixed")),
            key=lambda t: t.number,
        )
        charged, claimed = trials[0], trials[1]
        for t in (charged, claimed):
            t.state, t.attempts = TrialState.running, 1
        sweep.state = sweep.state.running
        sweep.driver = "ghost-host-that-is-not-this-one:1"
        sweep.heartbeat_at = None  # long silent
        sched = ChargeSchedule.from_json(sweep.plan[0]["charges"])  # type: ignore[index]
        charged_id, claimed_id = charged.id, claimed.id
    e, d = sched.charge_for_run(1)
    ledger.charge(digits_key(engine), sweep_id=sid, trial_id=charged_id, epsilon=e, delta=d)
    out = run_sweep(engine, sid)
    assert out.state == "done"
    with Session(engine) as s:
        a, b = s.get(Trial, charged_id), s.get(Trial, claimed_id)
        assert a is not None and b is not None
        # No run left in the grid's reservation (retries: 0): failed, charged, with the reason.
        assert a.state == TrialState.failed and "not re-run" in (a.error or "")
        assert "privacy.retries" in (a.error or "")
        # Never charged, so it never touched data: it simply ran.
        assert b.state == TrialState.done and b.attempts == 1
    _check_books(engine, sid)


def test_crash_policy_reruns_on_reserved_retries(local_ray: Any, engine: Any) -> None:
    sid = create_sweep(engine, tiny_spec(privacy={"budgets": [2], "delta": 1e-5, "retries": 1}))
    with Session(engine) as s, s.begin():
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        t = min(
            s.scalars(sa.select(Trial).where(Trial.sweep_id == sid, Trial.arm == "fixed")),
            key=lambda t: t.number,
        )
        t.state, t.attempts = TrialState.running, 1
        sweep.state, sweep.driver = sweep.state.running, "ghost-host-that-is-not-this-one:1"
        sched = ChargeSchedule.from_json(sweep.plan[0]["charges"])  # type: ignore[index]
        tid = t.id
    e, d = sched.charge_for_run(1)
    BudgetLedger(engine).charge(digits_key(engine), sweep_id=sid, trial_id=tid, epsilon=e, delta=d)
    assert run_sweep(engine, sid).state == "done"
    with Session(engine) as s:
        t2 = s.get(Trial, tid)
        assert t2 is not None and t2.state == TrialState.done and t2.attempts == 2
    _check_books(engine, sid)
    assert len(_charges(engine, digits_key(engine), sid)[tid]) == 2


def test_tpe_and_papernot_steinke_sweeps(local_ray: Any, engine: Any) -> None:
    tpe = tiny_spec(
        arms=[{"strategy": "fixed", "grid": {"lr": {"logspace": [-2, 0], "k": 2}, "clip": [1.0]}}],
        privacy={"budgets": [3], "delta": 1e-5},
        search={"method": "tpe", "n": 4, "seed": 1},
    )
    sid = create_sweep(engine, tpe)
    assert run_sweep(engine, sid).state == "done"
    with Session(engine) as s:
        lrs = [t.params["lr"] for t in s.scalars(sa.select(Trial).where(Trial.sweep_id == sid))]
    assert len(set(lrs)) == 4 and all(0.01 <= v <= 1 for v in lrs)
    _check_books(engine, sid)

    ps = tiny_spec(
        arms=[{"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0]}}],
        privacy={
            "budgets": [4],
            "delta": 1e-5,
            "accounting": "papernot-steinke",
            "distribution": {"name": "poisson"},
        },
        search={"method": "random", "n": 3},
    )
    sid = create_sweep(engine, ps)
    assert run_sweep(engine, sid).state == "done"
    summary = summarize(engine, sid)
    with Session(engine) as s:
        n = len(list(s.scalars(sa.select(Trial).where(Trial.sweep_id == sid))))
    # Only the selected trial is released, and no count.
    assert len(summary["results"]) == (1 if n else 0)
    assert sum(summary["trials"].values()) == 0 and summary["budget"]["charges"] is None
    charges = sorted(c for cs in _charges(engine, digits_key(engine), sid).values() for c in cs)
    if n:
        # One entry for the whole search, whatever the number of runs (which it must not count).
        assert charges == [Decimal(summary["plan"][0]["epsilon_total"])]
    else:
        assert charges == []


def test_cli_show_export_sweeps(local_ray: Any, engine: Any, capsys: Any, tmp_path: Path) -> None:
    url = engine.info_url
    sid = create_sweep(engine, tiny_spec(privacy={"budgets": [2], "delta": 1e-5}))
    run_sweep(engine, sid)
    capsys.readouterr()
    assert main(["show", sid, "--db", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {"state", "arms", "results", "pareto"} <= set(shown)
    for r in shown["results"]:
        assert {
            "strategy",
            "epsilon_budget",
            "best_params",
            "objective_mean",
            "objective_std",
            "ece_mean",
        } <= set(r)
    # One seed per configuration: no spread to show, a dash rather than "0.0000".
    assert main(["show", sid, "--db", url]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if "lr=" in ln]
    assert rows and all("—" in ln and "0.0000" not in ln for ln in rows), rows
    assert main(["export", sid, "--db", url, "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("id,arm,strategy,epsilon_budget") and len(lines) == 1 + 3
    # The SDK DataFrame's columns: hyperparameters and metrics under their own names.
    header = lines[0].split(",")
    assert {"lr", "accuracy"} <= set(header) and not any(h.startswith("param") for h in header)
    out = tmp_path / "x.json"
    assert main(["export", sid, "--db", url, "--format", "json", "-o", str(out)]) == 0
    assert len(json.loads(out.read_text())["trials"]) == 3
    assert main(["sweeps", "--db", url, "--json"]) == 0
    assert sid in {r["id"] for r in json.loads(capsys.readouterr().out)}
    assert main(["cancel", sid, "--db", url]) == 1
    assert "already done" in capsys.readouterr().err
    assert main(["show", "nope", "--db", url]) == 1


# ---------------------------------------------------------------------------------------------
# The real `dpsweep run` process: SIGKILL and resume, cancel mid-sweep

SLOW_SPEC = {
    "name": "slow",
    "dataset": {"name": "digits"},
    "model": {"name": "cnn"},
    "training": {"steps": 120, "batch_size": 64, "eval_every": 40},
    "privacy": {"budgets": [3, 8], "delta": 1e-5, "retries": 1},
    "arms": [
        {"strategy": "fixed", "grid": {"lr": [0.1, 0.3, 1.0], "clip": [1.0]}},
        {"strategy": "automatic", "grid": {"lr": [0.3, 1.0]}},
    ],
}


def _start(spec_path: Path, url: str, cwd: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DPSWEEP_MAX_PACK_SIZE": "2", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "api.cli", "run", str(spec_path), "--db", url, "--quiet"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _states(url: str) -> dict[str, int]:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            return {
                str(k): int(v)
                for k, v in c.execute(sa.text("select state, count(*) from trials group by state"))
            }
    except sa.exc.OperationalError:
        return {}
    finally:
        eng.dispose()


def _wait_for(url: str, cond: Any, proc: subprocess.Popen[bytes], timeout: float = 240) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond(_states(url)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"dpsweep run ended early: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        time.sleep(0.1)
    raise AssertionError(f"timed out; states {_states(url)}")


def _reap(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # Ray processes the run left behind
    proc.wait()


@pytest.mark.slow
def test_sigkill_mid_sweep_then_resume(tmp_path: Path) -> None:
    spec_path = tmp_path / "slow.yaml"
    spec_path.write_text(yaml.safe_dump(SLOW_SPEC))
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    first = _start(spec_path, url, tmp_path)
    try:
        _wait_for(url, lambda s: s.get("done", 0) >= 1 and s.get("running", 0) >= 1, first)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        _reap(first)
    before = _states(url)
    assert before.get("running", 0) >= 1 and before.get("pending", 0) >= 1
    second = _start(spec_path, url, tmp_path)
    try:
        _out, err = second.communicate(timeout=400)
    finally:
        _reap(second)
    assert second.returncode == 0, err.decode()[-3000:]
    assert b"resuming sweep" in err
    engine = make_engine(url)
    with Session(engine) as s:
        (sweep,) = s.scalars(sa.select(Sweep))
        trials = list(s.scalars(sa.select(Trial)))
        sid = sweep.id
    assert sweep.state.value == "done"
    assert len(trials) == 10 and all(
        t.state in (TrialState.done, TrialState.failed) for t in trials
    )
    # Interrupted trials were re-run on the reserved retries, or failed saying why; none ran
    # twice silently.
    for t in trials:
        if t.attempts > 1:
            assert "interrupted" in (t.error or "") or t.state == TrialState.done
        if t.state == TrialState.failed:
            assert "interrupted" in (t.error or "")
    assert any(t.attempts == 2 for t in trials)
    _check_books(engine, sid)
    bal = BudgetLedger(engine).sweep_balance(digits_key(engine), sweep_id=sid)
    assert bal.epsilon_outstanding == 0  # released at the end
    assert BudgetLedger(engine).summary(digits_key(engine)).epsilon_spent == bal.epsilon_charged
    engine.dispose()


@pytest.mark.slow
def test_cancel_mid_sweep_releases_the_unstarted_reservation(tmp_path: Path) -> None:
    spec_path = tmp_path / "slow.yaml"
    spec_path.write_text(
        yaml.safe_dump({**SLOW_SPEC, "privacy": {"budgets": [3, 8], "delta": 1e-5}})
    )
    url = f"sqlite:///{tmp_path / 'cancel.db'}"
    proc = _start(spec_path, url, tmp_path)
    try:
        _wait_for(url, lambda s: s.get("done", 0) >= 1 and s.get("pending", 0) >= 1, proc)
        engine = make_engine(url)
        with Session(engine) as s:
            (sid,) = s.scalars(sa.select(Sweep.id))
        result = cancel_sweep(engine, sid)
        proc.wait(timeout=120)
    finally:
        _reap(proc)
    assert proc.returncode == 1  # "ended cancelled"
    assert result["cancelled_pending"] >= 1
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None and sweep.state.value == "cancelled"
        trials = list(s.scalars(sa.select(Trial)))
        plan = list(sweep.plan or [])
    assert all(
        t.state in (TrialState.done, TrialState.cancelled, TrialState.failed) for t in trials
    )
    _check_books(engine, sid)
    # Exactly the unstarted runs' part of each grid's schedule went back.
    charges = _charges(engine, digits_key(engine), sid)
    unstarted = []
    for g in plan:
        sched = ChargeSchedule.from_json(g["charges"])
        runs = sum(
            len(charges.get(t.id, []))
            for t in trials
            if grid_key(t.arm, t.epsilon_budget) == g["grid"]
        )
        spent = sched.cumulative(runs)[0]
        unstarted.append(EXACT.subtract(sched.reserved_epsilon, spent))
    entries = BudgetLedger(engine).entries(digits_key(engine), sid)
    (release,) = [e for e in entries if e.kind == EntryKind.RELEASE]
    assert release.epsilon == exact_sum(unstarted) > 0
    # Trials that never started were never charged.
    for t in trials:
        if t.state == TrialState.cancelled and "before it started" in (t.error or ""):
            assert t.id not in charges
    # The release log: every trial stopped while running is a release at its charge; the
    # ones that never ran are not: never started, or caught by the cancel between their claim
    # and their charge (the cancel's release came first, so the ledger refused that charge).
    from sweeper.privacy.release_log import read_log

    log = read_log(engine, digits_key(engine), everyone=True)
    stopped = {t.id for t in trials if "while running" in (t.error or "")}
    cancelled = {e["trial_id"]: e for e in log if e["kind"] == "trial-cancelled"}
    assert set(cancelled) == stopped
    for tid, e in cancelled.items():
        assert Decimal(str(e["epsilon"])) == pytest.approx(exact_sum(charges[tid]))
    assert {e["trial_id"] for e in log} <= set(charges)
    engine.dispose()


def test_cancel_between_claim_and_charge_leaves_exact_books(
    local_ray: Any, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel that lands after the driver claimed trials but before it charged them: the
    cancel releases the reservation, so the charges are refused; those trials never run, and
    their books say so (no attempt, no charge, no "stays charged")."""
    from sweeper.driver.claims import Claims

    sid = create_sweep(engine, tiny_spec())
    original = Claims.charge
    cancelled: list[dict[str, Any]] = []

    def charge_after_a_cancel(self: Any, claimed: list[Any]) -> list[Any]:
        if not cancelled:
            cancelled.append(cancel_sweep(engine, sid))
        return original(self, claimed)

    monkeypatch.setattr(Claims, "charge", charge_after_a_cancel)
    out = run_sweep(engine, sid)
    assert out.state == "cancelled" and cancelled
    with Session(engine) as s:
        trials = list(s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)))
    never_ran = [t for t in trials if t.error == "cancelled before it ran (never charged)"]
    assert never_ran and all(t.attempts == 0 for t in never_ran)
    assert all(t.state == TrialState.cancelled for t in trials)
    assert _charges(engine, digits_key(engine), sid) == {}
    # Nothing of them was released: the release log has no entry for a trial that never ran.
    from sweeper.privacy.release_log import read_log

    assert read_log(engine, digits_key(engine), everyone=True) == []
    _check_books(engine, sid)
    bal = BudgetLedger(engine).sweep_balance(digits_key(engine), sweep_id=sid)
    assert bal.epsilon_charged == 0 and bal.epsilon_released == bal.epsilon_reserved


def test_a_generic_model_sweeps_on_ray_and_says_its_engine_path(local_ray: Any) -> None:
    """A model the fast path does not cover (res_cnn: residual blocks, GroupNorm) plans,
    packs (memory estimate of the generic path), trains on Ray and records its path; the plan
    and the trial detail say which (SQLite: the engine path does not depend on the store)."""
    import tempfile

    from sweeper.datasets.access import Viewer
    from sweeper.sweeps.trial_detail import trial_detail

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/generic.db"
        upgrade(url)
        engine = make_engine(url)
        spec = tiny_spec(
            model={"name": "res_cnn", "options": {"width": 8, "blocks": 1}},
            training={"steps": 4, "batch_size": 32, "eval_every": 2},
            privacy={"budgets": [4], "delta": 1e-5},
            arms=[{"strategy": "fixed", "grid": {"lr": [0.1, 0.3], "clip": [1.0]}}],
        )
        sid = create_sweep(engine, spec)
        out = run_sweep(engine, sid)
        assert out.state == "done" and out.counts == {"done": 2}
        with Session(engine) as s:
            sweep = s.get(Sweep, sid)
            assert sweep is not None
            assert [g["engine_path"] for g in sweep.plan or []] == ["generic"]
            ids = [t.id for t in s.scalars(sa.select(Trial).where(Trial.sweep_id == sid))]
        for tid in ids:
            detail = trial_detail(engine, tid, Viewer(None))
            assert detail["engine_path"] == "generic"
            assert detail["planned"]["engine_path"] == "generic"
        summary = summarize(engine, sid)
        assert summary["plan"][0]["engine_path"] == "generic"
        engine.dispose()
