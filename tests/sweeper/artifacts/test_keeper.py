"""Kept models on a real local Ray into real databases: which models are kept, that every row
names a complete file, papernot-steinke's selected model only, and a driver killed while
writing."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sweeper.artifacts.keeper import collect_garbage, flush_staged
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.settings import SweeperSettings
from sweeper.store import ModelArtifact, StagedModel, Trial, TrialState
from sweeper.store.artifact_files import TMP_PREFIX, ArtifactStore, sha256_hex, sweep_prefix
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.stored import grid_key
from tests.conftest import fresh_postgres_database
from tests.sweeper.sweeps.test_sweep import tiny_spec

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def local_ray() -> Any:
    import ray

    with ray_session(SweeperSettings(), workers=2):
        yield ray


def _engine(url: str) -> Any:
    upgrade(url)
    return make_engine(url)


def _files(store: ArtifactStore, sweep_id: str) -> dict[str, list[str]]:
    prefix = sweep_prefix(sweep_id)
    return {t: sorted(store.files(f"{prefix}/{t}")) for t in store.folders(prefix)}


def _check_rows_name_complete_files(engine: Any, store: ArtifactStore, sweep_id: str) -> None:
    """Every artifact row names a file whose bytes hash to the row's sha256 (and its card)."""
    with Session(engine) as s:
        rows = list(s.scalars(sa.select(ModelArtifact).where(ModelArtifact.sweep_id == sweep_id)))
    for row in rows:
        assert sha256_hex(store.get(row.key)) == row.sha256
        card = store.get(row.key.rsplit("/", 1)[0] + "/card.json")
        assert sha256_hex(card) == row.card_sha256 and len(card) == row.card_size_bytes


def _best_by_grid(engine: Any, sweep_id: str) -> dict[str, str]:
    """Each grid's first trial with the highest accuracy (ties: the first to finish)."""
    best: dict[str, tuple[float, Any, str]] = {}
    with Session(engine) as s:
        for t in s.scalars(sa.select(Trial).where(Trial.sweep_id == sweep_id)):
            assert t.result is not None
            acc = t.result.metrics["accuracy"]
            g = grid_key(t.arm, t.epsilon_budget)
            if g not in best or acc > best[g][0]:
                best[g] = (acc, t.finished_at, t.id)
    return {g: v[2] for g, v in best.items()}


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_best_per_grid_keeps_each_grids_best_model(
    local_ray: Any, db: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if db == "sqlite":
        url = f"sqlite:///{tmp_path / 'keep.db'}"
        settings = SweeperSettings()  # the default store: beside the SQLite file
        root = tmp_path / "keep-artifacts"
    else:
        url = fresh_postgres_database(request.getfixturevalue("postgres_url"), str(tmp_path))
        root = tmp_path / "pg-store"
        settings = SweeperSettings(artifact_url=f"file://{root}")
    engine = _engine(url)
    try:
        sid = create_sweep(engine, tiny_spec())
        assert run_sweep(engine, sid, settings=settings).state == "done"
        store = ArtifactStore(str(root))
        with Session(engine) as s:
            rows = {
                r.grid: r
                for r in s.scalars(sa.select(ModelArtifact).where(ModelArtifact.sweep_id == sid))
            }
            assert s.scalar(sa.select(sa.func.count()).select_from(StagedModel)) == 0
        best = _best_by_grid(engine, sid)
        # One model per grid (strategy x epsilon level): the grid's best trial's.
        assert {g: r.trial_id for g, r in rows.items()} == best
        # The store holds exactly those models and their cards, no leftovers.
        assert _files(store, sid) == {t: ["card.json", "model.safetensors"] for t in best.values()}
        _check_rows_name_complete_files(engine, store, sid)
        for r in rows.values():
            assert r.reproducible is False and r.size_bytes > 0
    finally:
        engine.dispose()


def test_keep_all_and_none(local_ray: Any, tmp_path: Path) -> None:
    engine = _engine(f"sqlite:///{tmp_path / 'k.db'}")
    store = ArtifactStore(str(tmp_path / "k-artifacts"))
    spec = tiny_spec(
        arms=[
            {"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0]}},
            {"strategy": "automatic", "grid": {"lr": [0.5]}},
        ],
        privacy={"budgets": [3], "delta": 1e-5},
    )
    every = create_sweep(engine, {**spec, "name": "all", "artifacts": {"keep": "all"}})
    none = create_sweep(engine, {**spec, "name": "none", "artifacts": {"keep": "none"}})
    for sid in (every, none):
        assert run_sweep(engine, sid).state == "done"
    with Session(engine) as s:
        kept = {
            r.trial_id
            for r in s.scalars(sa.select(ModelArtifact).where(ModelArtifact.sweep_id == every))
        }
        trials = {t.id for t in s.scalars(sa.select(Trial).where(Trial.sweep_id == every))}
        n_none = s.scalar(
            sa.select(sa.func.count())
            .select_from(ModelArtifact)
            .where(ModelArtifact.sweep_id == none)
        )
    # Every trial's model (each had a selected checkpoint); none for keep: none.
    assert kept == trials and len(kept) == 3 and n_none == 0
    assert set(_files(store, every)) == kept
    assert _files(store, none) == {}
    _check_rows_name_complete_files(engine, store, every)
    engine.dispose()


def test_papernot_steinke_stores_only_the_selected_model(local_ray: Any, tmp_path: Path) -> None:
    from sweeper.sweeps.released import released_records

    engine = _engine(f"sqlite:///{tmp_path / 'ps.db'}")
    store = ArtifactStore(str(tmp_path / "ps-artifacts"))
    spec = tiny_spec(
        arms=[{"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0]}}],
        privacy={
            "budgets": [4],
            "delta": 1e-5,
            "accounting": "papernot-steinke",
            "distribution": {"name": "poisson"},
        },
        search={"method": "random", "n": 4},
        artifacts={"keep": "all"},  # still only the selected trial's
    )
    sid = create_sweep(engine, spec)
    assert run_sweep(engine, sid).state == "done"
    from sweeper.store import Sweep

    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        released = released_records(sweep, metric="accuracy", mode="max")
        n_runs = len(sweep.trials)
        rows = list(s.scalars(sa.select(ModelArtifact).where(ModelArtifact.sweep_id == sid)))
    if n_runs == 0:
        assert rows == [] and _files(store, sid) == {}
        return
    assert [r.trial_id for r in rows] == [t["id"] for t in released] and len(rows) == 1
    assert set(_files(store, sid)) == {rows[0].trial_id}
    card = rows[0].card
    # The card of a papernot-steinke model carries nothing that would count the runs.
    assert "created_at" not in card or card["created_at"] is None
    _check_rows_name_complete_files(engine, store, sid)
    engine.dispose()


def test_garbage_and_staged_models_are_settled_by_the_next_driver(tmp_path: Path) -> None:
    """flush_staged writes what is staged; collect_garbage deletes what no row names."""
    engine = _engine(f"sqlite:///{tmp_path / 'g.db'}")
    store = ArtifactStore(str(tmp_path / "g-artifacts"))
    sid = create_sweep(engine, tiny_spec(privacy={"budgets": [3], "delta": 1e-5}))
    prefix = sweep_prefix(sid)
    store.put(f"{prefix}/orphan/model.safetensors", b"half")
    store.put(f"{prefix}/orphan2/{TMP_PREFIX}x-model.safetensors", b"ha")
    assert collect_garbage(engine, sid, store=store) == 2
    assert _files(store, sid) == {}
    assert flush_staged(engine, sid, store=store) == 0
    engine.dispose()


# -- a driver killed while writing a model -------------------------------------------------

_SLOW_FS = """
import os, sys, time
import fsspec
from fsspec.implementations.local import LocalFileSystem

class SlowFS(LocalFileSystem):
    # Writes half of each model file, says so in a marker, then hangs (the test kills it).
    protocol = "slowfile"

    def open(self, path, mode="rb", **kw):
        f = super().open(path, mode, **kw)
        if "w" in mode and path.endswith("model.safetensors"):
            real_write = f.write
            def write(data):
                real_write(data[: len(data) // 2])
                f.flush()
                open(os.environ["SLOW_MARKER"], "w").write(path)
                time.sleep(3600)
            f.write = write
        return f

fsspec.register_implementation("slowfile", SlowFS, clobber=True)
from api.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_driver_killed_while_writing_leaves_no_dangling_row_and_resume_writes_it(
    tmp_path: Path,
) -> None:
    import yaml

    spec = tiny_spec(
        arms=[{"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0]}}],
        privacy={"budgets": [3], "delta": 1e-5},
        artifacts={"keep": "all"},
    )
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    root = tmp_path / "store"
    root.mkdir()
    script = tmp_path / "slow_run.py"
    script.write_text(_SLOW_FS)
    marker = tmp_path / "writing"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RAY_USAGE_STATS_ENABLED": "0",
        "DPSWEEP_ARTIFACT_URL": f"slowfile://{root}",
        "SLOW_MARKER": str(marker),
    }
    proc = subprocess.Popen(
        [sys.executable, str(script), "run", str(spec_path), "--db", url, "--quiet"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
            assert time.monotonic() < deadline, "the driver never wrote a model"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)  # mid-write: half a file under a temporary name
        proc.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    engine = make_engine(url)
    store = ArtifactStore(str(root))
    with Session(engine) as s:
        (sid,) = s.scalars(sa.select(Trial.sweep_id).distinct())
        staged = list(s.scalars(sa.select(StagedModel.trial_id)))
        done = {t.id for t in s.scalars(sa.select(Trial).where(Trial.state == TrialState.done))}
    # The trial's result and its staged weights were committed together; no row names the
    # half-written file, and a half-written file lies under a temporary name only.
    assert staged and set(staged) <= done
    _check_rows_name_complete_files(engine, store, sid)
    leftovers = [n for files in _files(store, sid).values() for n in files]
    assert any(n.startswith(TMP_PREFIX) for n in leftovers)
    assert "model.safetensors" not in [
        n for t, files in _files(store, sid).items() if t in staged for n in files
    ]

    # Resume with a healthy store at the same place: the staged model is written again.
    env["DPSWEEP_ARTIFACT_URL"] = f"file://{root}"
    again = subprocess.run(
        [sys.executable, "-m", "api.cli", "run", str(spec_path), "--db", url, "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=400,
    )
    assert again.returncode == 0, again.stderr.decode()[-3000:]
    with Session(engine) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(StagedModel)) == 0
        rows = {r.trial_id for r in s.scalars(sa.select(ModelArtifact))}
        done = {t.id for t in s.scalars(sa.select(Trial).where(Trial.state == TrialState.done))}
    assert set(staged) <= rows and rows == done
    _check_rows_name_complete_files(engine, store, sid)
    assert {t: f for t, f in _files(store, sid).items()} == {
        t: ["card.json", "model.safetensors"] for t in rows
    }
    engine.dispose()
