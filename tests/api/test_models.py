"""Kept models over real HTTP: a real ``dpsweep serve`` (uvicorn, scheduler, local Ray) trains
small sweeps, and the SDK downloads, checks and loads their models.

* round trip: the model a trial keeps, loaded through the SDK and run on the dataset's
  evaluation split, gives exactly the accuracy recorded for the trial: on SQLite with the
  default store (beside the database file), and on PostgreSQL with a ``file://`` URL store;
* only the owner gets a model or a card (others get 404, as for every route); a trial
  without a kept model is a 404 that says why;
* a papernot-steinke sweep keeps only each grid's selected trial's model;
* deleting an ended sweep removes its rows and files and keeps what it spent (409 while it
  runs), through the API and the CLI.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from api.testing.server import SMALL_SPEC, Server, start_server
from dpsweep import Client, NotFound
from dpsweep.errors import ArtifactCorrupt, ConfigError
from dpsweep.trial import Trial, verify
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.store import Sweep
from sweeper.store.artifact_files import ArtifactStore, default_artifact_url, sweep_prefix
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.api.test_api import assert_problem, read_sse
from tests.conftest import fresh_postgres_database

YAML = {"Content-Type": "application/yaml"}
PS_SPEC = {
    "name": "ps-models",
    "dataset": {"name": "digits"},
    "model": {"name": "mlp"},
    "training": {"epochs": 1, "batch_size": 128, "eval_every": 10},
    "privacy": {
        "budgets": [2, 4],
        "delta": 1e-5,
        "accounting": "papernot-steinke",
        "distribution": {"name": "poisson"},
    },
    "arms": [{"strategy": "fixed", "grid": {"lr": [0.3, 1.0], "clip": [1.0]}}],
    "search": {"method": "random", "n": 4},
}
# Tables holding a sweep's rows (besides the sweep's own), and the column naming it.
SWEEP_TABLES = {
    "trials": "sweep_id",
    "sweep_events": "sweep_id",
    "model_artifacts": "sweep_id",
    "staged_models": "sweep_id",
}
TRIAL_TABLES = ("trial_results", "metric_points")


def _run(client: httpx.Client, spec: str | dict[str, Any]) -> str:
    """Submit a sweep and follow its events to its end; its id."""
    if isinstance(spec, str):
        r = client.post("/api/v1/sweeps", content=spec, headers=YAML)
    else:
        r = client.post("/api/v1/sweeps", json=spec)
    assert r.status_code == 201, r.text
    sid = str(r.json()["id"])
    events = read_sse(client, f"/api/v1/sweeps/{sid}/events")
    assert events[-1]["data"]["state"] == "done", events[-1]
    return sid


def _test_split(db_url: str, sweep_id: str) -> tuple[Any, Any]:
    """The sweep's dataset as its workers loaded it (same resolution, split and scaling), and
    its evaluation records' raw inputs (as on disk, unscaled)."""
    from sweeper.datasets.resolution import resolve
    from sweeper.sweeps.stored import typed_spec
    from workers.datasets.loading import load_dataset
    from workers.datasets.raw_records import raw_evaluation_inputs

    engine = make_engine(db_url)
    try:
        with Session(engine) as session:
            row = session.get(Sweep, sweep_id)
            assert row is not None
            spec = typed_spec(row)
        dataset = resolve(engine, spec.dataset, spec.eval)
        return load_dataset(dataset), raw_evaluation_inputs(dataset)
    finally:
        engine.dispose()


def _accuracy(module: Any, split: tuple[Any, Any]) -> float:
    """The accuracy as the trainer measures it (workers.metrics.classification_metrics: the
    mean, in float64, of argmax == label over the evaluation split), the model fed the raw
    records: a kept model carries its input transform (issue 51)."""
    import torch

    data, raw = split
    with torch.no_grad():
        logits = module(torch.from_numpy(raw))
    pred = logits.double().softmax(dim=-1).argmax(dim=-1)
    return float((pred == torch.from_numpy(data.y_test)).double().mean())


def _round_trip(
    server: Server, sweep_id: str, tmp_path: Path, store: ArtifactStore
) -> tuple[Trial, dict[str, Any]]:
    """Download the sweep's one kept model through the SDK, load it and check its accuracy
    against the trial's record; the kept trial and its card."""
    with Client(server.base, token=server.token("ada")) as client:
        sweep = client.sweep(sweep_id)
        trials = list(sweep.trials())
        assert len(trials) == 2 and all(isinstance(t, Trial) for t in trials)
        kept = [t for t in trials if t.model]
        # best_per_grid (the default): one grid, so one model: the grid's best trial.
        assert len(kept) == 1
        best = sweep.best_trial()
        assert best is not None and best.id == kept[0].id and best["model"] == kept[0].model
        ref = best.model
        assert ref is not None
        assert ref["url"] == f"/api/v1/trials/{best.id}/model"
        assert ref["card_url"] == f"/api/v1/trials/{best.id}/model-card"
        assert ref["reproducible"] is False

        path = best.download_model(f"{tmp_path / 'out'}/")  # a new directory
        assert path == tmp_path / "out" / f"dpsweep-{best.id}.safetensors"
        data = path.read_bytes()
        assert len(data) == ref["size_bytes"]
        assert hashlib.sha256(data).hexdigest() == ref["sha256"]
        card = best.model_card()
        assert json.loads((path.parent / f"dpsweep-{best.id}.card.json").read_text()) == card
        assert card["model"]["weights"]["sha256"] == ref["sha256"]
        # The store holds exactly what was served, under the sweep's folder.
        assert store.folders(sweep_prefix(sweep_id)) == [best.id]
        assert store.get(f"{sweep_prefix(sweep_id)}/{best.id}/model.safetensors") == data

        module = best.load_model()
        split = _test_split(server.db_url, sweep_id)
        assert card["model"]["input_transform"]["raw_inputs"] is True
        assert float(split[1].max()) > 1.0  # raw pixels, not the scaled [0, 1]
        accuracy = _accuracy(module, split)
        # Exactly equal: the same weights on the same records; the packed engine's forward
        # and the rebuilt module's agree on every argmax here.
        assert accuracy == best["metrics"]["accuracy"]
        if importlib.util.find_spec("onnx") is not None:
            # The SDK's ONNX export computes what the module does (onnx's reference runtime).
            import numpy as np
            import torch
            from onnx.reference import ReferenceEvaluator

            onnx_path = best.export_onnx(tmp_path / "out" / "model.onnx")
            x = torch.rand(3, *card["model"]["input_shape"])
            (out,) = ReferenceEvaluator(str(onnx_path)).run(None, {"input": x.numpy()})
            with torch.no_grad():
                np.testing.assert_allclose(out, module(x).numpy(), atol=1e-4)
            # On the raw evaluation records it scores the trial's accuracy too.
            raw = split[1].astype(np.float32)
            (logits,) = ReferenceEvaluator(str(onnx_path)).run(None, {"input": raw})
            got = float((np.asarray(logits).argmax(axis=-1) == split[0].y_test).mean())
            assert got == pytest.approx(best["metrics"]["accuracy"], abs=1.5 / len(raw))
        return best, card


# ---------------------------------------------------------------------------------------------
# SQLite with the default store (beside the database file)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("models")
    url = f"sqlite:///{work / 'api.db'}"
    upgrade(url)
    s = start_server(url, work)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def store(server: Server) -> ArtifactStore:
    path = default_artifact_url(server.db_url)
    assert path.endswith("api-artifacts")
    return ArtifactStore(path)


@pytest.fixture(scope="module")
def finished(server: Server) -> str:
    """A small sweep (one grid, two trials), run to its end."""
    with server.client(server.token("ada")) as ada:
        return _run(ada, SMALL_SPEC)


def test_round_trip_on_sqlite_with_the_default_store(
    server: Server, finished: str, store: ArtifactStore, tmp_path: Path
) -> None:
    best, kept_card = _round_trip(server, finished, tmp_path, store)
    with server.client(server.token("ada")) as ada:
        r = ada.get(f"/api/v1/trials/{best.id}/model")
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/octet-stream"
        assert r.headers["content-disposition"] == (
            f"attachment; filename=dpsweep-{best.id}.safetensors"
        )
        assert r.headers["content-length"] == str(len(r.content))
        sha = hashlib.sha256(r.content).hexdigest()
        assert r.headers["etag"] == f'"{sha}"'
        verify(r.content, r.headers, what="model")  # Repr-Digest and Digest agree
        again = ada.get(
            f"/api/v1/trials/{best.id}/model", headers={"If-None-Match": r.headers["etag"]}
        )
        assert again.status_code == 304 and again.content == b""
        card = ada.get(f"/api/v1/trials/{best.id}/model-card")
        assert card.status_code == 200 and card.headers["content-type"] == "application/json"
        assert card.json() == kept_card
        detail = ada.get(f"/api/v1/trials/{best.id}").json()
        assert detail["model"] == best.model


def test_only_the_owner_gets_a_model_and_a_missing_one_says_why(
    server: Server, finished: str, tmp_path: Path
) -> None:
    ada = server.client(server.token("ada"))
    bob = server.client(server.token("bob"))
    items = ada.get(f"/api/v1/sweeps/{finished}/trials").json()["items"]
    kept = next(t["id"] for t in items if t["model"])
    other = next(t["id"] for t in items if not t["model"])
    for path in (f"/api/v1/trials/{kept}/model", f"/api/v1/trials/{kept}/model-card"):
        body = assert_problem(bob.get(path), 404)
        # Exactly what an id that does not exist gets: nothing tells bob the trial exists.
        missing = assert_problem(bob.get(path.replace(kept, "0" * 32)), 404)
        assert body["detail"].replace(kept, "X") == missing["detail"].replace("0" * 32, "X")
    with Client(server.base, token=server.token("bob")) as c, pytest.raises(NotFound):
        Trial(c, {"id": kept}).download_model(tmp_path)
    assert list(tmp_path.iterdir()) == []
    # The owner's trial without a model: 404, saying why (not its grid's best).
    for path in (f"/api/v1/trials/{other}/model", f"/api/v1/trials/{other}/model-card"):
        body = assert_problem(ada.get(path), 404)
        assert "best_per_grid" in body["detail"] and other in body["detail"]
    # Nobody's trial: a plain 404.
    assert_problem(ada.get("/api/v1/trials/nope/model"), 404)


def test_model_routes_conform_to_the_openapi_document(server: Server, finished: str) -> None:
    """A real model, card, trial page and trial, validated by Schemathesis against the
    document the server serves (status, media type, headers, body)."""
    import schemathesis

    from tests.api.test_api_schema import CHECKS

    schema = schemathesis.openapi.from_url(f"{server.base}/openapi.json")
    token = server.token("ada")
    with server.client(token) as ada:
        items = ada.get(f"/api/v1/sweeps/{finished}/trials").json()["items"]
    kept = next(t["id"] for t in items if t["model"])
    calls = [
        ("/api/v1/trials/{trial_id}/model", {"trial_id": kept}, 200),
        ("/api/v1/trials/{trial_id}/model-card", {"trial_id": kept}, 200),
        ("/api/v1/trials/{trial_id}", {"trial_id": kept}, 200),
        ("/api/v1/sweeps/{sweep_id}/trials", {"sweep_id": finished}, 200),
        ("/api/v1/trials/{trial_id}/model", {"trial_id": "nope"}, 404),
    ]
    for path, params, status in calls:
        response = (
            schema[path]["GET"]
            .Case(path_parameters=params)
            .call_and_validate(
                base_url=server.base, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS
            )
        )
        assert response.status_code == status, (path, response.text)


def test_trial_pages_add_no_query_per_trial(server: Server, finished: str) -> None:
    from sweeper.datasets.access import Viewer
    from sweeper.sweeps.trial_pages import page_trials

    engine = make_engine(server.db_url)
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    try:
        counts = []
        for limit in (1, 50):
            statements.clear()
            page = page_trials(engine, finished, Viewer(owner=None, admin=True), limit=limit)
            counts.append(len(statements))
            assert any(i["model"] for i in page.items) or limit == 1
        assert counts[0] == counts[1]
    finally:
        engine.dispose()


def test_papernot_steinke_keeps_only_the_selected_trials_models(
    server: Server, store: ArtifactStore
) -> None:
    ada = server.client(server.token("ada"))
    engine = make_engine(server.db_url)
    try:
        # The number of runs per grid is random (Poisson, mean 4; a grid draws none about
        # once in 55): want both grids run, one of them at least twice.
        for _ in range(5):
            sid = _run(ada, PS_SPEC)
            with Session(engine) as session:
                rows = session.execute(
                    sa.text("SELECT id, arm, epsilon_budget FROM trials WHERE sweep_id = :s"),
                    {"s": sid},
                ).all()
                artifacts = session.execute(
                    sa.text("SELECT trial_id, grid FROM model_artifacts WHERE sweep_id = :s"),
                    {"s": sid},
                ).all()
            grids = {(r.arm, r.epsilon_budget) for r in rows}
            if len(rows) > 2 and len(grids) == 2:
                break
    finally:
        engine.dispose()
    assert len(rows) > 2 and len(grids) == 2
    items = ada.get(f"/api/v1/sweeps/{sid}/trials").json()["items"]
    released = {t["id"] for t in items}
    assert len(items) == 2 and all(t["model"] for t in items)  # one per grid, each kept
    # One artifact row per grid, each the grid's released trial; files for those only.
    assert sorted(a.trial_id for a in artifacts) == sorted(released)
    assert len({a.grid for a in artifacts}) == 2
    assert sorted(store.folders(sweep_prefix(sid))) == sorted(released)
    for t in items:
        r = ada.get(t["model"]["url"])
        assert (
            r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == t["model"]["sha256"]
        )
    for other in {r.id for r in rows} - released:
        assert_problem(ada.get(f"/api/v1/trials/{other}/model"), 404)
        assert_problem(ada.get(f"/api/v1/trials/{other}/model-card"), 404)


def test_load_model_without_torch_says_what_to_install(
    server: Server, finished: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    with Client(server.base, token=server.token("ada")) as client:
        best = client.sweep(finished).best_trial()
        assert best is not None
        monkeypatch.setitem(sys.modules, "torch", None)
        with pytest.raises(ConfigError, match=r'pip install "dpsweep\[server\]"'):
            best.load_model()


def test_a_download_that_does_not_match_its_hash_is_refused(tmp_path: Path) -> None:
    data = b"weights"
    sha = hashlib.sha256(data).hexdigest()
    assert verify(data, httpx.Headers({"ETag": f'"{sha}"'}), what="model") == sha
    with pytest.raises(ArtifactCorrupt, match="does not match"):
        verify(b"weightz", httpx.Headers({"ETag": f'"{sha}"'}), what="model")
    with pytest.raises(ArtifactCorrupt, match="does not match"):
        verify(data, httpx.Headers({"Repr-Digest": "sha-256=:AAAA:"}), what="model")
    with pytest.raises(ArtifactCorrupt, match="without a content hash"):
        verify(data, httpx.Headers({"ETag": 'W/"x"'}), what="model")


def _rows_of(db_url: str, sweep_id: str) -> dict[str, int]:
    engine = make_engine(db_url)
    try:
        with engine.connect() as c:
            out = {
                t: int(
                    c.execute(
                        sa.text(f"SELECT count(*) FROM {t} WHERE {col} = :s"), {"s": sweep_id}
                    ).scalar_one()
                )
                for t, col in SWEEP_TABLES.items()
            }
            for t in TRIAL_TABLES:
                out[t] = int(
                    c.execute(
                        sa.text(
                            f"SELECT count(*) FROM {t} WHERE trial_id IN "
                            "(SELECT id FROM trials WHERE sweep_id = :s)"
                        ),
                        {"s": sweep_id},
                    ).scalar_one()
                )
            out["sweeps"] = int(
                c.execute(
                    sa.text("SELECT count(*) FROM sweeps WHERE id = :s"), {"s": sweep_id}
                ).scalar_one()
            )
        return out
    finally:
        engine.dispose()


def _ledger(db_url: str, sweep_id: str) -> list[tuple[str, Decimal]]:
    from sweeper.datasets.identity import ledger_key_of

    engine = make_engine(db_url)
    try:
        ledger = BudgetLedger(engine)
        return [
            (e.kind.value, e.epsilon)
            for e in ledger.entries(ledger_key_of(engine, "digits"), sweep_id)
        ]
    finally:
        engine.dispose()


def test_deleting_a_sweep_removes_rows_and_files_but_not_its_spend(
    server: Server, finished: str, store: ArtifactStore
) -> None:
    """Last in this module: it deletes the shared sweep."""
    from api.cli import main

    ada = server.client(server.token("ada"))
    # A sweep that is running cannot be deleted; once cancelled it can (here by the CLI).
    r = ada.post("/api/v1/sweeps", content=SMALL_SPEC, headers=YAML)
    live = r.json()["id"]
    body = assert_problem(ada.delete(f"/api/v1/sweeps/{live}"), 409)
    assert "cancel it first" in body["detail"]
    assert ada.post(f"/api/v1/sweeps/{live}/cancel").status_code == 200
    # Refused (409) while its driver may still be stopping its trials, then deleted.
    deadline = time.monotonic() + 30
    while main(["delete", live, "--db", server.db_url]) != 0:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert_problem(ada.get(f"/api/v1/sweeps/{live}"), 404)

    _delete_and_check(server, finished, store)


def _delete_and_check(server: Server, sweep_id: str, store: ArtifactStore) -> None:
    """Delete an ended sweep through the API; check that its rows and files are gone and that
    its ledger entries and the dataset's lifetime spend are not."""
    ada = server.client(server.token("ada"))
    bob = server.client(server.token("bob"))
    before = ada.get("/api/v1/datasets/digits/budget").json()
    ledger = _ledger(server.db_url, sweep_id)
    trials = [t["id"] for t in ada.get(f"/api/v1/sweeps/{sweep_id}/trials").json()["items"]]
    assert store.folders(sweep_prefix(sweep_id))
    assert_problem(bob.delete(f"/api/v1/sweeps/{sweep_id}"), 404)  # not bob's
    rows = _rows_of(server.db_url, sweep_id)
    assert all(n for table, n in rows.items() if table != "staged_models"), rows  # untouched

    r = ada.delete(f"/api/v1/sweeps/{sweep_id}")
    assert r.status_code == 204 and r.content == b""
    assert set(_rows_of(server.db_url, sweep_id).values()) == {0}
    assert not store.exists(sweep_prefix(sweep_id))
    assert_problem(ada.get(f"/api/v1/sweeps/{sweep_id}"), 404)
    assert_problem(ada.delete(f"/api/v1/sweeps/{sweep_id}"), 404)
    for tid in trials:
        assert_problem(ada.get(f"/api/v1/trials/{tid}"), 404)
        assert_problem(ada.get(f"/api/v1/trials/{tid}/model"), 404)
    # What it spent stays spent: every ledger entry, and the dataset's lifetime totals.
    assert _ledger(server.db_url, sweep_id) == ledger and ledger
    after = ada.get("/api/v1/datasets/digits/budget").json()
    for key in ("epsilon_committed", "delta_committed", "epsilon_remaining"):
        assert after[key] == before[key], key


# ---------------------------------------------------------------------------------------------
# PostgreSQL with an fsspec file:// URL store (server, scheduler and driver all read it)


@pytest.fixture
def pg_server(postgres_url: str, tmp_path: Path) -> Iterator[tuple[Server, ArtifactStore]]:
    url = fresh_postgres_database(postgres_url, str(tmp_path))
    upgrade(url)
    store_url = f"file://{tmp_path / 'store'}"
    s = start_server(url, tmp_path, env={"DPSWEEP_ARTIFACT_URL": store_url})
    try:
        yield s, ArtifactStore(store_url)
    finally:
        s.stop()


@pytest.mark.slow
def test_round_trip_on_postgresql_with_a_url_store(
    pg_server: tuple[Server, ArtifactStore], tmp_path: Path
) -> None:
    server, store = pg_server
    with server.client(server.token("ada")) as ada:
        sid = _run(ada, SMALL_SPEC)
    _round_trip(server, sid, tmp_path, store)
    assert (tmp_path / "store" / "sweeps" / sid).is_dir()
    _delete_and_check(server, sid, store)
