"""The sweep's release stored with the key of its plan: stored once, read without composing.

The whole-sweep epsilon (:func:`sweeper.privacy.releases.sweep_release`) takes seconds of tight
composition; the driver stores it with the sha256 of what it was computed from, and summaries
use it only while that key is the current plan's. Real SQLite and PostgreSQL stores, real
sweeps from :func:`sweeper.sweeps.create.create_sweep`, and a fresh process for the "restart".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from dpsweep.plan import GridPlan, SweepPlan
from sweeper.privacy import releases
from sweeper.privacy.releases import (
    release_key,
    store_release,
    stored_release,
    sweep_release,
    sweep_release_of,
)
from sweeper.store import Sweep, Trial, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import downgrade, upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.stored import load_sweep
from sweeper.sweeps.summary import summarize
from tests.conftest import fresh_postgres_database

ROOT = Path(__file__).resolve().parents[3]


def small_spec(budgets: list[float] | None = None) -> dict[str, Any]:
    return {
        "name": "release-store",
        "dataset": {"name": "digits"},
        "model": {"name": "logreg"},
        "training": {"steps": 20, "batch_size": 64, "eval_every": 10},
        "privacy": {"budgets": budgets or [2], "delta": 1e-5},
        "arms": [
            {"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0]}},
            {"strategy": "automatic", "grid": {"lr": [0.5]}},
        ],
    }


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def made(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, str]]:
    """A store with one real sweep, planned and stored by ``create_sweep`` (seconds, so once
    per module); tests work on copies of it (:func:`_copy`)."""
    tmp = tmp_path_factory.mktemp("release-store")
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'store.db'}"
    else:
        url = fresh_postgres_database(request.getfixturevalue("postgres_url"), str(tmp))
    upgrade(url)
    engine = make_engine(url)
    yield engine, create_sweep(engine, small_spec())
    engine.dispose()


@pytest.fixture
def engine(made: tuple[Engine, str]) -> Engine:
    return made[0]


@pytest.fixture
def sid(made: tuple[Engine, str]) -> str:
    """A fresh copy of the module's sweep, its release not stored yet."""
    return _copy(*made)


def _copy(engine: Engine, source: str, plan: list[dict[str, Any]] | None = None) -> str:
    """A copy of sweep ``source`` (its row, without trials), optionally with another plan."""
    with Session(engine) as session, session.begin():
        src = session.get(Sweep, source)
        assert src is not None
        copy = Sweep(
            name=src.name,
            dataset=src.dataset,
            spec=src.spec,
            plan=plan if plan is not None else src.plan,
            state=src.state,
            ledger_key=src.ledger_key,
        )
        session.add(copy)
        session.flush()
        return copy.id


def _typed(plan: list[dict[str, Any]]) -> list[GridPlan]:
    """A stored plan read back as the readers read it."""
    return list(SweepPlan.from_stored(plan))


def _computed(plan: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The release computed afresh (the in-process memo cleared first)."""
    releases._sweep_release.cache_clear()
    return sweep_release(_typed(plan))


def _set_plan(engine: Engine, sweep_id: str, plan: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        conn.execute(update(Sweep).where(Sweep.id == sweep_id).values(plan=plan))


def _changed(plan: list[dict[str, Any]], field: str = "noise_multiplier") -> list[dict[str, Any]]:
    """``plan`` with one composed figure of its first grid changed (x1.5)."""
    out = [dict(g) for g in plan]
    out[0][field] = float(out[0][field]) * 1.5
    return out


def test_the_stored_release_is_the_computed_one(engine: Engine, sid: str) -> None:
    sweep = load_sweep(engine, sid)
    assert sweep.release is None and stored_release(sweep) is None
    before = sweep.updated_at
    stored = store_release(engine, sid)
    sweep = load_sweep(engine, sid)
    plan = list(sweep.plan or [])
    computed = _computed(plan)
    assert computed is not None and computed["method"] == "pld composition"
    # Exactly equal after the database's JSON round trip, every figure to the last bit.
    assert stored == computed
    assert sweep.release == computed and stored_release(sweep) == computed
    assert sweep.release_key == release_key(_typed(plan))
    assert sweep.updated_at == before  # the sweep itself did not change
    assert summarize(engine, sid)["privacy"]["sweep"] == computed
    # A second store (a resumed sweep) finds it and composes nothing.
    releases._sweep_release.cache_clear()
    assert store_release(engine, sid) == computed
    assert releases._sweep_release.cache_info().currsize == 0


def test_a_background_store_that_fails_once_is_retried(
    engine: Engine, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transient failure (a driver's concurrent import of torch made scipy fail once) does
    not lose the stored release; a failure that persists is given up after a few tries."""
    real = releases.store_release
    calls: list[str] = []

    def flaky(engine: Engine, sweep_id: str) -> dict[str, Any] | None:
        calls.append(sweep_id)
        if len(calls) == 1:
            raise AttributeError("partially initialized module 'torch' has no attribute 'Tensor'")
        return real(engine, sweep_id)

    monkeypatch.setattr(releases, "_RETRY_SECONDS", 0.01)
    monkeypatch.setattr(releases, "store_release", flaky)
    releases.store_release_in_background(engine, sid).join(30)
    assert calls == [sid, sid]
    assert stored_release(load_sweep(engine, sid)) == _computed(
        list(load_sweep(engine, sid).plan or [])
    )

    def broken(engine: Engine, sweep_id: str) -> None:
        calls.append(sweep_id)
        raise RuntimeError("the database is gone")

    calls.clear()
    monkeypatch.setattr(releases, "store_release", broken)
    thread = releases.store_release_in_background(engine, sid)
    thread.join(30)
    assert not thread.is_alive() and len(calls) == releases._STORE_ATTEMPTS


def test_a_changed_plan_never_gets_the_stored_release(engine: Engine, sid: str) -> None:
    stored = store_release(engine, sid)
    assert stored is not None
    plan = list(load_sweep(engine, sid).plan or [])
    # A field the composition does not read (the plan's warnings) keeps it.
    _set_plan(engine, sid, [g | {"warnings": ["x"]} for g in plan])
    assert stored_release(load_sweep(engine, sid)) == stored
    # Any composed figure changed: the stored release is not this plan's, it is recomputed.
    for field in ("noise_multiplier", "sample_rate", "steps_per_trial", "delta"):
        changed = _changed(plan, field)
        _set_plan(engine, sid, changed)
        sweep = load_sweep(engine, sid)
        assert sweep.release == stored  # still in the row, but
        assert stored_release(sweep) is None  # not used for this plan
        assert sweep_release_of(sweep) == sweep_release(_typed(changed)) != stored
    assert summarize(engine, sid)["privacy"]["sweep"] == sweep_release(_typed(changed))
    # Storing again keys it to the new plan.
    assert store_release(engine, sid) == sweep_release(_typed(changed))
    assert stored_release(load_sweep(engine, sid)) == sweep_release(_typed(changed))


def test_a_release_copied_from_another_plan_is_refused(engine: Engine, sid: str) -> None:
    store_release(engine, sid)
    other = _copy(engine, sid, _changed(list(load_sweep(engine, sid).plan or [])))
    with Session(engine) as session, session.begin():
        src, dst = session.get(Sweep, sid), session.get(Sweep, other)
        assert src is not None and dst is not None
        dst.release, dst.release_key = src.release, src.release_key
    copied = load_sweep(engine, other)
    assert copied.release is not None and stored_release(copied) is None
    assert sweep_release_of(copied) == sweep_release(_typed(list(copied.plan or [])))
    assert sweep_release_of(copied) != copied.release


def test_a_new_composition_version_invalidates_every_stored_release(
    engine: Engine, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_release(engine, sid)
    sweep = load_sweep(engine, sid)
    assert stored_release(sweep) is not None
    monkeypatch.setattr(releases, "COMPOSITION_VERSION", releases.COMPOSITION_VERSION + 1)
    releases._key_of.cache_clear()
    try:
        assert stored_release(sweep) is None
    finally:
        releases._key_of.cache_clear()


def test_the_driver_stores_the_release_when_it_takes_a_sweep(tmp_path: Path) -> None:
    """A driver that takes a sweep over stores its release (here a sweep whose trials all
    ended, which the driver finishes without starting Ray)."""
    from sweeper.driver.loop import run_sweep

    url = f"sqlite:///{tmp_path / 'driver.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        sid = create_sweep(engine, small_spec())
        with engine.begin() as conn:
            conn.execute(update(Trial).where(Trial.sweep_id == sid).values(state=TrialState.failed))
        assert load_sweep(engine, sid).release is None
        assert run_sweep(engine, sid).state == "failed"
        sweep = load_sweep(engine, sid)
        assert sweep.release is not None
        assert stored_release(sweep) == _computed(list(sweep.plan or []))
    finally:
        engine.dispose()


RESTART = """
import json, sys
from sweeper.store.engine import make_engine
from sweeper.sweeps.summary import summarize

engine = make_engine(sys.argv[1])
out = {}
for sid in sys.argv[2:]:
    sweep = summarize(engine, sid)["privacy"]["sweep"]
    out[sid] = {"sweep": sweep, "dp_accounting": "dp_accounting" in sys.modules}
print(json.dumps(out))
"""


def test_a_fresh_process_reads_the_stored_release_without_composing(
    made: tuple[Engine, str],
) -> None:
    """After a restart a summary shows the stored release without importing dp_accounting;
    a sweep whose plan no longer matches its stored key is composed again, as before."""
    engine, source = made
    kept, moved = _copy(engine, source), _copy(engine, source)
    stored = store_release(engine, kept)
    store_release(engine, moved)
    changed = _changed(list(load_sweep(engine, moved).plan or []), "sample_rate")
    _set_plan(engine, moved, changed)
    expected_moved = sweep_release(_typed(changed))
    url = engine.url.render_as_string(hide_password=False)
    p = subprocess.run(
        [sys.executable, "-c", RESTART, url, kept, moved],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    # The first summary (the stored one) imported no accountant; the second had to compose.
    assert out[kept] == {"sweep": stored, "dp_accounting": False}
    assert out[moved] == {"sweep": expected_moved, "dp_accounting": True}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0009_adds_and_removes_the_columns(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """0009 upgrades a database holding a sweep (its release NULL: computed on read) and
    downgrades back to 0008 keeping the sweep."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'm.db'}"
    else:
        url = fresh_postgres_database(request.getfixturevalue("postgres_url"), str(tmp_path))
    upgrade(url, "0008")
    eng = sa.create_engine(url)
    try:
        sweeps = sa.table(
            "sweeps",
            sa.column("id", sa.String()),
            sa.column("name", sa.String()),
            sa.column("dataset", sa.String()),
            sa.column("spec", sa.JSON()),
            sa.column("plan", sa.JSON()),
            sa.column("state", sa.String()),
            sa.column("created_at", sa.DateTime(timezone=True)),
            sa.column("updated_at", sa.DateTime(timezone=True)),
        )
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        with eng.begin() as conn:
            conn.execute(
                sweeps.insert().values(
                    id="s1",
                    name="old",
                    dataset="digits",
                    spec={},
                    plan=[],
                    state="done",
                    created_at=now,
                    updated_at=now,
                )
            )
        upgrade(url, "0009")
        cols = {c["name"] for c in sa.inspect(eng).get_columns("sweeps")}
        assert {"release", "release_key"} <= cols
        with eng.connect() as conn:
            row = conn.execute(
                select(sa.column("release_key"), sa.column("release")).select_from(
                    sa.table("sweeps")
                )
            ).one()
        assert tuple(row) == (None, None)
        downgrade(url, "0008")
        cols = {c["name"] for c in sa.inspect(eng).get_columns("sweeps")}
        assert not {"release", "release_key"} & cols
        with eng.connect() as conn:
            assert conn.execute(sa.text("SELECT id, name FROM sweeps")).all() == [("s1", "old")]
    finally:
        eng.dispose()
