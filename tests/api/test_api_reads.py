"""The API's reads of a big finished sweep, over real HTTP: no torch on the request path, and
the cached pages of trials follow every change of the sweep (events, kept models, deletion)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from api.testing.server import start_server
from sweeper.store import ModelArtifact, Trial
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps import events

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 200  # plans in seconds (fewer trials per grid plan slower)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A SQLite file holding a finished sweep of 200 trials (``bench/finished_sweep.py``)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from finished_sweep import load_finished_sweep
    finally:
        sys.path.remove(str(ROOT / "bench"))
    path = tmp_path_factory.mktemp("reads") / "finished.db"
    upgrade(f"sqlite:///{path}")
    loaded = load_finished_sweep(f"sqlite:///{path}", TRIALS)
    yield path, loaded.id


def _copy(src: Path, tmp: Path) -> str:
    dst = tmp / "copy.db"
    shutil.copy(src, dst)
    return f"sqlite:///{dst}"


SERVE_AND_CHECK = textwrap.dedent(
    """
    import sys, threading, time
    import httpx, uvicorn
    from api.app import create_app
    from api.settings import ApiSettings
    from api.testing.postgres import free_port

    url, sweep_id = sys.argv[1], sys.argv[2]
    port = free_port()
    app = create_app(ApiSettings(database_url=url, auth=False))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    base = f"http://127.0.0.1:{port}/api/v1/sweeps/{sweep_id}"
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    for path in ("", "/pareto", "/pareto?x=accuracy&y=ece", "/trials?limit=100", "/results",
                 "/trials?limit=100&sort=objective"):
        r = httpx.get(base + path, timeout=60)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    with httpx.stream("GET", base + "/events", timeout=60) as r:
        assert r.status_code == 200
        assert sum(1 for line in r.iter_lines() if line.startswith("event: sweep")) >= 2
    server.should_exit = True
    print("TORCH", "torch" in sys.modules)
    """
)


def test_serving_a_finished_sweep_imports_no_torch(
    finished: tuple[Path, str], tmp_path: Path
) -> None:
    path, sweep_id = finished
    url = _copy(path, tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", SERVE_AND_CHECK, url, sweep_id],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TORCH False" in out.stdout, out.stdout + out.stderr[-2000:]


def test_cached_trial_pages_follow_the_sweep(finished: tuple[Path, str], tmp_path: Path) -> None:
    path, sweep_id = finished
    url = _copy(path, tmp_path)
    server = start_server(url, tmp_path, scheduler=False)
    engine = make_engine(url)
    page = f"/api/v1/sweeps/{sweep_id}/trials?limit=10"
    try:
        with server.client(server.token("bench")) as c:
            first = c.get(page)
            assert first.status_code == 200
            assert c.get(page).content == first.content  # served again (from the cache)
            item = first.json()["items"][0]
            assert item["model"] is None and item["error"] is None

            # A kept model (no event: the artifacts' stamp changes).
            with Session(engine) as session, session.begin():
                session.add(
                    ModelArtifact(
                        trial_id=item["id"],
                        sweep_id=sweep_id,
                        owner="bench",
                        grid="g",
                        key=f"models/{item['id']}.safetensors",
                        sha256="ab" * 32,
                        size_bytes=123,
                        card={},
                        card_sha256="cd" * 32,
                        card_size_bytes=4,
                    )
                )
            model = c.get(page).json()["items"][0]["model"]
            assert model is not None and model["sha256"] == "ab" * 32
            with Session(engine) as session, session.begin():
                session.execute(delete(ModelArtifact).where(ModelArtifact.trial_id == item["id"]))
            assert c.get(page).json()["items"][0]["model"] is None

            # A change of a trial comes with an event of its sweep: a new version.
            with Session(engine) as session, session.begin():
                events.lock_sweep(session, sweep_id)
                session.execute(update(Trial).where(Trial.id == item["id"]).values(error="late"))
                events.emit(session, sweep_id, events.TRIAL, {"trial": item["id"]})
            assert c.get(page).json()["items"][0]["error"] == "late"
            # Other queries are cached apart and see the same version.
            by_objective = c.get(page + "&sort=objective").json()["items"]
            assert len(by_objective) == 10 and by_objective != first.json()["items"]

            # Deleted: gone, whatever was cached.
            assert c.delete(f"/api/v1/sweeps/{sweep_id}").status_code == 204
            assert c.get(page).status_code == 404
    finally:
        engine.dispose()
        server.stop()
