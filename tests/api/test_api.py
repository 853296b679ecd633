"""The REST API over real HTTP: a `dpsweep serve` process (uvicorn, scheduler, local Ray) on
loopback, against a real SQLite file, and PostgreSQL for the budget race."""

from __future__ import annotations

import json
import signal
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.testing.server import SMALL_SPEC, Server, start_server
from sweeper.datasets.identity import ledger_key_of
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.store.tokens import revoke_token
from tests.conftest import fresh_postgres_database

PROBLEM = "application/problem+json"
YAML = {"Content-Type": "application/yaml"}


def _csv(rows: int = 120, *, bad: bool = False) -> bytes:
    lines = ["a,b,c,label"]
    for i in range(rows):
        a, b = (i % 7) / 7.0, (i % 5) / 5.0
        lines.append(f"{a},{b},{(i % 3) * 0.5},{'yes' if a + b > 0.8 else 'no'}")
    if bad:
        lines.append("1.0,oops,2.0,yes")
    return ("\n".join(lines) + "\n").encode()


def _spec(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "api-json",
        "dataset": {"name": "digits"},
        "model": {"name": "mlp"},
        "training": {"epochs": 2, "batch_size": 128, "eval_every": 10},
        "privacy": {"budgets": [2], "delta": 1e-5, "accounting": "basic"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.3, 1.0], "clip": [1.0]}}],
    }
    spec.update(over)
    return spec


def read_sse(
    client: httpx.Client, path: str, *, headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Every event of a stream until the server ends it."""
    events: list[dict[str, Any]] = []
    with client.stream("GET", path, headers=headers, timeout=300) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        cur: dict[str, str] = {}
        for line in r.iter_lines():
            if line == "":
                if "data" in cur:
                    events.append(
                        {
                            "id": int(cur["id"]),
                            "event": cur["event"],
                            "data": json.loads(cur["data"]),
                        }
                    )
                cur = {}
            elif not line.startswith(":"):
                key, _, value = line.partition(":")
                cur[key] = value[1:] if value.startswith(" ") else value
    return events


def wait_for(
    client: httpx.Client, sweep_id: str, done: Any, timeout: float = 300
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        s = client.get(f"/api/v1/sweeps/{sweep_id}").json()
        if done(s):
            return s
        assert s["state"] not in ("done", "failed", "cancelled"), s
        assert time.monotonic() < deadline, s
        time.sleep(0.3)


def assert_problem(r: httpx.Response, status: int, *, field: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert {"type", "title", "status", "detail"} <= set(body)
    assert body["status"] == status and body["detail"]
    assert "Traceback" not in r.text
    if field is not None:
        assert field in [e["field"] for e in body["errors"]], body
    return body


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("api")
    url = f"sqlite:///{work / 'api.db'}"
    upgrade(url)
    s = start_server(
        url,
        work,
        env={
            "DPSWEEP_MAX_UPLOAD_BYTES": "200000",
            "DPSWEEP_MAX_TRIALS_PER_SWEEP": "200",
            "DPSWEEP_MAX_SPEC_BYTES": "20000",
        },
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def ada(server: Server) -> httpx.Client:
    return server.client(server.token("ada"))


@pytest.fixture(scope="module")
def finished(server: Server, ada: httpx.Client) -> dict[str, Any]:
    """A small sweep submitted as YAML, with its whole event stream read live."""
    r = ada.post("/api/v1/sweeps", content=SMALL_SPEC, headers=YAML)
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    assert r.headers["location"] == f"/api/v1/sweeps/{sweep_id}"
    events = read_sse(ada, f"/api/v1/sweeps/{sweep_id}/events")
    return {"id": sweep_id, "created": r.json(), "events": events}


# ---------------------------------------------------------------------------------------------


def test_health_ready_and_bearer_auth(server: Server) -> None:
    plain = server.client()
    assert plain.get("/health").json() == {"status": "ok"}
    ready = plain.get("/ready")
    assert ready.status_code == 200 and ready.json()["schedulers"] >= 1
    for headers in ({}, {"Authorization": "Bearer dps_nope_nope"}, {"Authorization": "Basic x"}):
        r = plain.get("/api/v1/sweeps", headers=headers)
        assert_problem(r, 401)
        assert r.headers["www-authenticate"].startswith("Bearer")
    token = server.token("eve")
    assert server.client(token).get("/api/v1/sweeps").status_code == 200
    engine = make_engine(server.db_url)
    revoke_token(engine, token.split("_")[1])
    engine.dispose()
    assert_problem(server.client(token).get("/api/v1/sweeps"), 401)


def test_a_sweep_runs_to_the_end_and_its_events_arrive_in_order(
    ada: httpx.Client, finished: dict[str, Any]
) -> None:
    sweep_id, events = finished["id"], finished["events"]
    # The 201 body is a snapshot read after the commit; a scheduler may already have claimed
    # the sweep by then. The stream's first event is always the queued state.
    assert finished["created"]["state"] in {"pending", "running"}
    ids = [e["id"] for e in events]
    assert ids == sorted(set(ids)), "event ids must strictly increase"
    assert events[0]["event"] == "sweep" and events[0]["data"]["state"] == "pending"
    assert events[-1]["event"] == "sweep" and events[-1]["data"]["state"] == "done"
    assert all(e["data"]["sweep"] == sweep_id for e in events)
    trials: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if "trial" in e["data"]:
            trials.setdefault(e["data"]["trial"], []).append(e)
    assert len(trials) == 2
    for seq in trials.values():
        kinds = [(e["event"], e["data"].get("state")) for e in seq]
        assert kinds[0] == ("trial", "running") and kinds[-1] == ("trial", "done")
        steps = [e["data"]["step"] for e in seq if e["event"] == "metric"]
        assert steps and steps == sorted(steps)
        assert all("accuracy" in e["data"]["values"] for e in seq if e["event"] == "metric")
    # Resuming from any event id delivers exactly what followed it.
    middle = events[len(events) // 2]["id"]
    rest = read_sse(
        ada, f"/api/v1/sweeps/{sweep_id}/events", headers={"Last-Event-ID": str(middle)}
    )
    assert [(e["id"], e["data"]) for e in rest] == [
        (e["id"], e["data"]) for e in events if e["id"] > middle
    ]
    # A stream opened after the end ends at once.
    assert read_sse(ada, f"/api/v1/sweeps/{sweep_id}/events?after={events[-1]['id']}") == []

    s = ada.get(f"/api/v1/sweeps/{sweep_id}").json()
    assert s["state"] == "done" and s["trials"]["done"] == 2
    budget = s["budget"]
    # basic accounting charges each of the two runs half the grid's reservation.
    assert budget["charges"] == 2
    assert budget["epsilon_charged"] == pytest.approx(budget["epsilon_reserved"])
    assert budget["epsilon_charged"] <= 2.0


def test_results_fronts_trials_and_metric_history(
    ada: httpx.Client, finished: dict[str, Any]
) -> None:
    sweep_id = finished["id"]
    res = ada.get(f"/api/v1/sweeps/{sweep_id}/results").json()
    assert [r["arm"] for r in res["results"]] == ["fixed"]
    front = ada.get(f"/api/v1/sweeps/{sweep_id}/pareto?x=epsilon&y=accuracy").json()
    assert [(p["x"], p["dominated"]) for p in front["points"]] == [(2.0, False)]
    assert front["points"][0]["y"] == pytest.approx(res["results"][0]["objective_mean"])
    cal = ada.get(f"/api/v1/sweeps/{sweep_id}/pareto", params={"x": "accuracy", "y": "ece"})
    assert cal.json()["x_mode"] == "max" and cal.json()["y_mode"] == "min"
    assert len(cal.json()["points"]) == 2
    assert_problem(ada.get(f"/api/v1/sweeps/{sweep_id}/pareto?y=nope"), 422, field="y")
    # A finished sweep's reads carry an ETag; asking again with it gives 304 and no body.
    for path in ("", "/results", "/pareto?x=accuracy&y=ece"):
        first = ada.get(f"/api/v1/sweeps/{sweep_id}{path}")
        again = ada.get(
            f"/api/v1/sweeps/{sweep_id}{path}", headers={"If-None-Match": first.headers["etag"]}
        )
        assert again.status_code == 304 and again.content == b""

    trials = ada.get(f"/api/v1/sweeps/{sweep_id}/trials").json()["items"]
    assert len(trials) == 2 and all(t["state"] == "done" for t in trials)
    best = ada.get(f"/api/v1/sweeps/{sweep_id}/trials?sort=objective&limit=1").json()
    assert best["items"][0]["objective"] == max(t["objective"] for t in trials)
    second = ada.get(
        f"/api/v1/sweeps/{sweep_id}/trials",
        params={"sort": "objective", "limit": 1, "cursor": best["next_cursor"]},
    ).json()
    assert second["next_cursor"] is None
    assert {best["items"][0]["id"], second["items"][0]["id"]} == {t["id"] for t in trials}
    assert ada.get(f"/api/v1/sweeps/{sweep_id}/trials?state=failed").json()["items"] == []
    assert len(ada.get(f"/api/v1/sweeps/{sweep_id}/trials?arm=fixed&level=2").json()["items"]) == 2
    assert_problem(ada.get(f"/api/v1/sweeps/{sweep_id}/trials?cursor=garbage"), 422, field="cursor")

    detail = ada.get(f"/api/v1/trials/{trials[0]['id']}").json()
    assert detail["planned"]["noise_multiplier"] == trials[0]["noise_multiplier"]
    charges = detail["privacy"]["charges"]
    assert len(charges) == 1 and charges[0]["epsilon"] > 0
    assert detail["reliability"] and detail["trajectories"]
    hist = ada.get(f"/api/v1/trials/{trials[0]['id']}/metrics", params={"name": "accuracy"})
    points = hist.json()["metrics"]["accuracy"]
    assert [p["step"] for p in points] == sorted(p["step"] for p in points)
    assert set(hist.json()["metrics"]) == {"accuracy"}


def test_idempotency_key_replays_and_refuses_another_body(server: Server) -> None:
    me = server.client(server.token("idem"))
    key = {"Idempotency-Key": "k-123", **YAML}
    first = me.post("/api/v1/sweeps", content=SMALL_SPEC, headers=key)
    again = me.post("/api/v1/sweeps", content=SMALL_SPEC, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["idempotent-replayed"] == "true"
    other = SMALL_SPEC.replace("api-small", "api-other")
    assert_problem(me.post("/api/v1/sweeps", content=other, headers=key), 422)
    ids = [s["id"] for s in me.get("/api/v1/sweeps").json()["items"]]
    assert ids == [first.json()["id"]]
    # Cancel is allowed once; then the sweep is finished (409).
    sid = first.json()["id"]
    assert me.post(f"/api/v1/sweeps/{sid}/cancel").json()["state"] == "cancelled"
    assert_problem(me.post(f"/api/v1/sweeps/{sid}/cancel"), 409)


def test_bad_input_gets_problem_json_and_stores_nothing(server: Server) -> None:
    me = server.client(server.token("bad"))
    post = me.post
    assert_problem(post("/api/v1/sweeps", content=b"a: [1,", headers=YAML), 422, field="body")
    assert_problem(post("/api/v1/sweeps", json={"name": "x"}), 422, field="dataset")
    unknown = _spec(arms=[{"strategy": "nope", "grid": {"lr": [0.1]}}])
    assert_problem(post("/api/v1/sweeps", json=unknown), 422, field="arms.nope.strategy")
    # Hyperparameter values are checked at submission, before any budget is reserved.
    zero_clip = _spec(arms=[{"strategy": "fixed", "grid": {"lr": [0.3], "clip": [0, 1]}}])
    assert_problem(post("/api/v1/sweeps", json=zero_clip), 422, field="arms.fixed.grid.clip")
    # So are the model's and the dataset's options (their torch-free descriptors).
    bad_model = _spec(model={"name": "mlp", "options": {"hidden": [0]}})
    assert_problem(post("/api/v1/sweeps", json=bad_model), 422, field="model.options.hidden")
    bad_data = _spec(dataset={"name": "synthetic", "options": {"n_samples": -1}})
    assert_problem(post("/api/v1/sweeps", json=bad_data), 422, field="dataset.options.n_samples")
    r = post("/api/v1/sweeps", content=b"name: x", headers={"Content-Type": "text/plain"})
    assert_problem(r, 415)
    big = "name: x\n" + "# padding\n" * 3000
    assert_problem(post("/api/v1/sweeps", content=big, headers=YAML), 413)
    many = _spec(arms=[{"strategy": "fixed", "grid": {"lr": {"logspace": [-2, 0], "k": 300}}}])
    assert_problem(post("/api/v1/sweeps", json=many), 422, field="arms")
    alias = "name: &n x\nother: *n\n"
    assert_problem(post("/api/v1/sweeps", content=alias, headers=YAML), 422)
    infeasible = _spec(privacy={"budgets": [0.001], "delta": 1e-5, "max_noise_multiplier": 2})
    body = assert_problem(post("/api/v1/sweeps", json=infeasible), 422)
    assert body["type"].endswith("infeasible-plan")
    path = _spec(dataset={"name": "csv", "path": "/etc/passwd", "label_column": "x"})
    assert_problem(post("/api/v1/sweeps", json=path), 422, field="dataset.path")
    # The dry run plans and stores nothing.
    plan = post("/api/v1/sweeps:plan", json=_spec())
    assert plan.status_code == 200, plan.text
    grid = plan.json()["grids"][0]
    assert grid["trials"] == 2 and grid["epsilon_reserved"] <= 2.0
    assert grid["eval_mode"] == "carve-out" and grid["eval_releases"] == 0
    # Evaluation modes: a loader is never a public evaluation dataset; DP evaluation is
    # planned (and charged) inside each grid's epsilon.
    not_public = _spec(eval={"dataset": "wine"})
    assert_problem(post("/api/v1/sweeps", json=not_public), 422, field="eval.dataset")
    bad_mode = _spec(eval={"mode": "dp", "dataset": "x"})
    assert_problem(post("/api/v1/sweeps", json=bad_mode), 422, field="eval")
    dp = post("/api/v1/sweeps:plan", json=_spec(eval={"mode": "dp"}))
    assert dp.status_code == 200, dp.text
    g = dp.json()["grids"][0]
    assert g["eval_mode"] == "dp" and g["eval_releases"] > 0
    assert 0 < g["epsilon_eval"] < g["epsilon_total"] <= g["epsilon_budget"]
    assert me.get("/api/v1/sweeps").json()["items"] == []


def test_sweep_pages_walk_every_sweep_once_newest_first(server: Server) -> None:
    me = server.client(server.token("pager"))
    created = []
    for i in range(3):
        r = me.post("/api/v1/sweeps", json=_spec(name=f"page-{i}"))
        assert r.status_code == 201, r.text
        created.append(r.json()["id"])
        me.post(f"/api/v1/sweeps/{created[-1]}/cancel")
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = me.get("/api/v1/sweeps", params=params).json()
        seen += [s["id"] for s in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == created[::-1]
    only = me.get("/api/v1/sweeps", params={"state": "cancelled"}).json()["items"]
    assert len(only) == 3
    assert me.get("/api/v1/sweeps", params={"state": "done"}).json()["items"] == []
    assert_problem(me.get("/api/v1/sweeps", params={"state": "nope"}), 422, field="state")


def test_uploads_caps_and_sweeps_on_an_upload(server: Server, tmp_path: Path) -> None:
    me = server.client(server.token("uploader"))
    r = me.post(
        "/api/v1/datasets",
        files={"file": ("tab.csv", _csv(), "text/csv")},
        data={"format": "csv", "label_column": "label", "epsilon_cap": "3", "delta_cap": "0.001"},
    )
    assert r.status_code == 201, r.text
    ds = r.json()
    assert ds["id"].startswith("ds_") and r.headers["location"] == f"/api/v1/datasets/{ds['id']}"
    assert ds["n_examples"] == 120 and ds["num_classes"] == 2
    assert "yes" not in r.text  # never the data: no labels, no rows
    listed = [d["id"] for d in me.get("/api/v1/datasets").json()["items"]]
    assert ds["id"] in listed and "digits" in listed
    budget = me.get(f"/api/v1/datasets/{ds['id']}/budget").json()
    assert budget["epsilon_cap"] == 3 and budget["epsilon_committed"] == 0
    # Refused uploads keep nothing.
    bad = me.post(
        "/api/v1/datasets",
        files={"file": ("bad.csv", _csv(bad=True), "text/csv")},
        data={"format": "csv", "label_column": "label"},
    )
    body = assert_problem(bad, 422)
    assert "oops" in body["detail"] and "uploads" not in body["detail"]
    huge = me.post("/api/v1/datasets", files={"file": ("h.csv", b"0" * 300_000, "text/csv")})
    assert_problem(huge, 413)
    assert len(me.get("/api/v1/datasets").json()["items"]) == len(listed)
    # A sweep on the upload reserves from its cap; one that does not fit is a 409.
    spec = _spec(
        dataset={"name": ds["id"]},
        training={"epochs": 1, "batch_size": 16, "eval_every": 5},
        privacy={"budgets": [2], "delta": 1e-4, "accounting": "basic"},
    )
    first = me.post("/api/v1/sweeps", json=spec)
    assert first.status_code == 201, first.text
    reserved = first.json()["budget"]["epsilon_reserved"]
    refused = assert_problem(me.post("/api/v1/sweeps", json=spec), 409)
    assert refused["type"].endswith("budget-exhausted")
    done = wait_for(me, first.json()["id"], lambda s: s["state"] in ("done", "failed"))
    assert done["state"] == "done", done
    after = me.get(f"/api/v1/datasets/{ds['id']}/budget").json()
    assert after["epsilon_committed"] == pytest.approx(reserved)
    assert after["epsilon_reserved"] == 0
    assert [s["sweep"] for s in after["sweeps"]] == [first.json()["id"]]
    # Caps can be changed by the owner, never below what is committed.
    assert_problem(me.put(f"/api/v1/datasets/{ds['id']}/budget", json={"epsilon_cap": 0.5}), 422)
    ok = me.put(f"/api/v1/datasets/{ds['id']}/budget", json={"epsilon_cap": 10, "delta_cap": None})
    assert ok.status_code == 200 and ok.json()["epsilon_cap"] == 10


def test_tenants_see_only_their_own_objects(server: Server, finished: dict[str, Any]) -> None:
    ada = server.client(server.token("ada"))
    bob = server.client(server.token("bob"))
    root = server.client(server.token("root", admin=True))
    up = ada.post(
        "/api/v1/datasets",
        files={"file": ("mine.csv", _csv(), "text/csv")},
        data={"format": "csv", "label_column": "label"},
    )
    assert up.status_code == 201
    ds = up.json()["id"]
    sid = finished["id"]
    tid = ada.get(f"/api/v1/sweeps/{sid}/trials").json()["items"][0]["id"]
    for method, path in [
        ("GET", f"/api/v1/sweeps/{sid}"),
        ("GET", f"/api/v1/sweeps/{sid}/results"),
        ("GET", f"/api/v1/sweeps/{sid}/pareto"),
        ("GET", f"/api/v1/sweeps/{sid}/trials"),
        ("GET", f"/api/v1/sweeps/{sid}/events"),
        ("POST", f"/api/v1/sweeps/{sid}/cancel"),
        ("GET", f"/api/v1/trials/{tid}"),
        ("GET", f"/api/v1/trials/{tid}/metrics"),
        ("GET", f"/api/v1/datasets/{ds}"),
        ("GET", f"/api/v1/datasets/{ds}/budget"),
        ("PUT", f"/api/v1/datasets/{ds}/budget"),
    ]:
        kwargs: dict[str, Any] = {"json": {"epsilon_cap": 1}} if method == "PUT" else {}
        assert_problem(bob.request(method, path, **kwargs), 404)
        assert root.request(method, path, **kwargs).status_code != 404, path
    assert sid not in [s["id"] for s in bob.get("/api/v1/sweeps").json()["items"]]
    assert sid in [s["id"] for s in root.get("/api/v1/sweeps").json()["items"]]
    assert ds not in [d["id"] for d in bob.get("/api/v1/datasets").json()["items"]]
    # bob cannot run a sweep on ada's upload either (and cannot tell that it exists).
    spec = _spec(dataset={"name": ds})
    assert_problem(bob.post("/api/v1/sweeps", json=spec), 422, field="dataset.name")
    # A shared dataset's budget is visible to all, and set by admins only.
    assert bob.get("/api/v1/datasets/digits/budget").status_code == 200
    assert_problem(bob.put("/api/v1/datasets/digits/budget", json={"epsilon_cap": 100}), 403)
    assert ada.get(f"/api/v1/sweeps/{sid}").json()["state"] == "done"


# ---------------------------------------------------------------------------------------------


@pytest.fixture
def pg_server(postgres_url: str, tmp_path: Path) -> Any:
    url = fresh_postgres_database(postgres_url, str(tmp_path))
    upgrade(url)
    s = start_server(url, tmp_path, scheduler=False)
    yield s
    s.stop()


def test_budget_race_thirty_concurrent_submissions_on_postgresql(pg_server: Server) -> None:
    me = pg_server.client(pg_server.token("racer"))
    up = me.post(
        "/api/v1/datasets",
        files={"file": ("race.csv", _csv(), "text/csv")},
        data={"format": "csv", "label_column": "label"},
    )
    assert up.status_code == 201, up.text
    ds = up.json()["id"]
    spec = _spec(
        dataset={"name": ds},
        privacy={"budgets": [1], "delta": 1e-4, "accounting": "basic"},
        training={"epochs": 1, "batch_size": 16},
    )
    cost = me.post("/api/v1/sweeps:plan", json=spec).json()["epsilon_reserved"]
    cap = 7.5 * cost  # room for exactly 7 sweeps
    assert me.put(f"/api/v1/datasets/{ds}/budget", json={"epsilon_cap": cap}).status_code == 200
    statuses: list[int] = []
    bodies: list[dict[str, Any]] = []
    lock = threading.Lock()

    def submit() -> None:
        with pg_server.client(pg_server.token("racer")) as c:
            r = c.post("/api/v1/sweeps", json=spec)
        with lock:
            statuses.append(r.status_code)
            bodies.append(r.json())

    threads = [threading.Thread(target=submit) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(set(statuses)) == [201, 409], statuses
    assert statuses.count(201) == 7
    for b in bodies:
        if b.get("status") == 409:
            assert b["type"].endswith("budget-exhausted") and ds in b["detail"]
    engine = make_engine(pg_server.db_url)
    summary = BudgetLedger(engine).summary(ledger_key_of(engine, ds))
    engine.dispose()
    assert summary.epsilon_spent + summary.epsilon_reserved <= Decimal(str(cap))
    budget = me.get(f"/api/v1/datasets/{ds}/budget").json()
    assert len(budget["sweeps"]) == 7
    assert len(me.get("/api/v1/sweeps").json()["items"]) == 7  # refused ones left nothing


@pytest.mark.slow
def test_restart_mid_sweep_resumes_and_reports_consistently(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'restart.db'}"
    upgrade(url)
    # One trial at a time, so that the stop comes between trials of one sweep.
    env = {"DPSWEEP_DRAIN_SECONDS": "120", "DPSWEEP_MAX_PACK_SIZE": "1"}
    server = start_server(url, tmp_path, workers=1, env=env)
    try:
        sid = _submit_and_stop_midway(server)
    finally:
        server.stop()
    _check_stopped_cleanly(url, sid)
    server = server.restart()
    try:
        me = server.client(server.token("ada"))
        mid = me.get(f"/api/v1/sweeps/{sid}").json()
        assert mid["state"] in ("running", "done")
        assert mid["trials"]["interrupted"] == 0 and mid["trials"]["failed"] == 0
        events = read_sse(me, f"/api/v1/sweeps/{sid}/events")
        assert events[-1]["data"]["state"] == "done"
        final = me.get(f"/api/v1/sweeps/{sid}").json()
        assert final["state"] == "done" and final["trials"]["done"] == 6
        # Every trial was charged exactly once, across both servers.
        assert final["budget"]["charges"] == 6
        assert final["budget"]["epsilon_charged"] == pytest.approx(
            final["budget"]["epsilon_reserved"]
        )
        trials = me.get(f"/api/v1/sweeps/{sid}/trials").json()["items"]
        assert all(t["attempts"] == 1 for t in trials)
    finally:
        server.stop()


def _submit_and_stop_midway(server: Server) -> str:
    me = server.client(server.token("ada"))
    spec = _spec(
        name="restart",
        training={"epochs": 6, "batch_size": 64, "eval_every": 20},
        arms=[{"strategy": "fixed", "grid": {"lr": [0.1, 0.3, 1.0], "clip": [0.5, 1.0]}}],
    )
    r = me.post("/api/v1/sweeps", json=spec)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    wait_for(me, sid, lambda s: s["trials"]["done"] >= 1 and s["trials"]["pending"] >= 1)
    # A graceful stop: the running pack may finish (drain), nothing new starts.
    assert server.stop(signal.SIGTERM) == 0
    return sid


def _check_stopped_cleanly(url: str, sid: str) -> None:
    from sqlalchemy.orm import Session

    from sweeper.store import Sweep

    engine = make_engine(url)
    with Session(engine) as session:
        row = session.get(Sweep, sid)
        assert row is not None and row.state.value == "running" and row.driver is None
    engine.dispose()


def test_papernot_steinke_sweeps_serve_only_the_selected_trial(
    server: Server, ada: httpx.Client
) -> None:
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from sweeper.store import Trial

    spec = _spec(
        name="ps",
        privacy={
            "budgets": [4],
            "delta": 1e-5,
            "accounting": "papernot-steinke",
            "distribution": {"name": "poisson"},
        },
        search={"method": "random", "n": 3},
    )
    engine = make_engine(server.db_url)
    for _ in range(6):  # the number of runs is random (Poisson, mean 3): want at least two
        r = ada.post("/api/v1/sweeps", json=spec)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert "trials" not in r.json()["plan"][0]
        events = read_sse(ada, f"/api/v1/sweeps/{sid}/events")
        with Session(engine) as session:
            ids = list(session.scalars(select(Trial.id).where(Trial.sweep_id == sid)))
        if len(ids) >= 2:
            break
    engine.dispose()
    assert len(ids) >= 2
    # Nothing per trial is streamed, counted or charged visibly: only the sweep's own events.
    assert {e["event"] for e in events} == {"sweep"}
    s = ada.get(f"/api/v1/sweeps/{sid}").json()
    assert s["state"] == "done" and sum(s["trials"].values()) == 0
    assert s["budget"]["charges"] is None
    items = ada.get(f"/api/v1/sweeps/{sid}/trials").json()["items"]
    assert len(items) == 1 and items[0]["state"] == "done"
    chosen = items[0]["id"]
    assert ada.get(f"/api/v1/trials/{chosen}").status_code == 200
    assert ada.get(f"/api/v1/trials/{chosen}/metrics").json()["metrics"]
    for other in set(ids) - {chosen}:
        assert_problem(ada.get(f"/api/v1/trials/{other}"), 404)
        assert_problem(ada.get(f"/api/v1/trials/{other}/metrics"), 404)
    assert ada.get(f"/api/v1/sweeps/{sid}/trials?state=pending").json()["items"] == []
    assert len(ada.get(f"/api/v1/sweeps/{sid}/pareto?x=accuracy&y=ece").json()["points"]) <= 1
