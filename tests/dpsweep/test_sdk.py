"""The Python client against a real ``dpsweep serve`` on loopback (and, for retries, against a
small real HTTP server that misbehaves on purpose)."""

from __future__ import annotations

import http.server
import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any, ClassVar

import pytest

from api.testing.postgres import free_port
from api.testing.server import SMALL_SPEC, Server, start_server
from dpsweep import (
    AuthError,
    Client,
    Conflict,
    ConnectionFailed,
    NotFound,
    RateLimited,
    ServerError,
    ValidationError,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("sdk")
    srv = start_server(f"sqlite:///{work / 'sdk.db'}", work, env={"DPSWEEP_DRAIN_SECONDS": "1"})
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[Client]:
    with Client(server.base, token=server.token("sdk-user")) as c:
        yield c


@pytest.mark.slow
def test_submit_wait_results_pareto_dataframe(client: Client, tmp_path: Path) -> None:
    spec_file = tmp_path / "small.yaml"
    spec_file.write_text(SMALL_SPEC)
    plan = client.plan(spec_file)
    assert plan["trials"] == 2 and plan["grids"][0]["noise_multiplier"] > 0

    sweep = client.submit(spec_file)
    assert sweep.state in ("pending", "running")
    assert sweep.url == f"{client.base_url}/sweeps/{sweep.id}"
    err = io.StringIO()
    with redirect_stderr(err):
        assert sweep.wait(progress=True, timeout=300) is sweep
    assert sweep.state == "done" and sweep.counts == {**sweep.counts, "done": 2}

    # The events of the whole run, typed and in order, ending with the sweep.
    events = list(sweep.stream())
    assert [e.id for e in events] == sorted({e.id for e in events})
    assert events[-1].kind == "sweep" and events[-1].state == "done"
    done = [e for e in events if e.kind == "trial" and e.state == "done"]
    assert len(done) == 2 and all("metrics" in e.data for e in done)
    assert any(e.kind == "metric" for e in events)

    results = sweep.results()
    assert len(results) == 1 and results[0]["arm"] == "fixed"
    front = sweep.pareto()
    assert [p["arm"] for p in front] == ["fixed"] and front[0]["x"] == 2.0
    calibration = sweep.pareto(x="accuracy", y="ece")
    assert len(calibration) == 2

    best = sweep.best_trial()
    trials = list(sweep.trials())
    assert best is not None
    assert best["objective"] == max(t["objective"] for t in trials)
    assert best["privacy"]["epsilon_charged"] > 0

    df = sweep.to_dataframe()
    assert len(df) == 2 and {"lr", "clip", "accuracy", "ece", "single_run_epsilon"} <= set(
        df.columns
    )
    assert sorted(df["lr"]) == [0.3, 1.0]
    assert set(sweep.to_dataframe("results").columns) >= {"arm", "objective_mean", "lr"}
    assert sweep.to_dataframe("pareto")["dominated"].tolist() == [False]
    # It is listed, and the list's handle refreshes into the full summary.
    listed = next(s for s in client.sweeps(state="done") if s.id == sweep.id)
    assert "plan" in listed.refresh().data


@pytest.mark.slow
def test_idempotent_resubmission_returns_the_same_sweep_and_cancel(client: Client) -> None:
    spec = {
        "name": "sdk-idem",
        "dataset": {"name": "digits"},
        "model": {"name": "mlp"},
        # Long trials, so that none can finish before the cancel below: with 3 epochs a warm
        # Ray can finish a pack first and the count falls short of 24 (one CI failure, whose
        # output we did not keep, fits that).
        "training": {"epochs": 300, "batch_size": 128},
        "privacy": {
            "budgets": [48],
            "delta": 1e-5,
            "accounting": "basic",
            "max_noise_multiplier": 1000,
        },
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.3, 1.0], "clip": [0.5, 1.0]}}],
        "seeds": 4,
    }
    first = client.submit(spec, idempotency_key="sdk-test-key-1")
    again = client.submit(spec, idempotency_key="sdk-test-key-1")
    assert again.id == first.id
    assert sum(1 for s in client.sweeps() if s.name == "sdk-idem") == 1
    # The same key with another body is refused with its field.
    other = dict(spec, name="sdk-idem-2")
    with pytest.raises(ValidationError):
        client.submit(other, idempotency_key="sdk-test-key-1")

    out = first.cancel()
    assert first.state == "cancelled"
    assert out["cancelled_pending"] + out["stopped_running"] == 24
    with pytest.raises(Conflict) as e:
        first.cancel()
    assert e.value.status == 409
    # The whole sweep's reservation that never ran went back to the dataset.
    budget = client.budget("digits")
    mine = [s for s in budget["sweeps"] if s["sweep"] == first.id]
    assert mine and all(s["epsilon_reserved"] == 0 for s in mine), json.dumps(mine)


def test_each_situation_raises_its_typed_error(
    server: Server, client: Client, tmp_path: Path
) -> None:
    with Client(server.base, token="dps_000000000000_wrong", retries=0) as bad:
        with pytest.raises(AuthError) as e:
            bad.me()
        assert e.value.status == 401 and "token" in e.value.detail
    with pytest.raises(NotFound):
        client.sweep("0" * 32)

    # Invalid specs are refused locally, before any request, naming the field.
    with pytest.raises(ValidationError) as v:
        client.submit({"name": "x", "dataset": {"name": "digits"}, "model": {"name": "mlp"}})
    assert v.value.status is None and v.value.errors[0]["field"].startswith("privacy")
    with pytest.raises(ValidationError, match="strategy"):
        client.plan(SMALL_SPEC.replace("strategy: fixed", "strategy: nope"))
    # ... and the server refuses what only it can judge (an infeasible plan), with a 422.
    infeasible = SMALL_SPEC.replace("budgets: [2]", "budgets: [0.0001]")
    with pytest.raises(ValidationError) as v:
        client.plan(infeasible)
    assert v.value.status == 422 and v.value.kind == "infeasible-plan"

    # An exhausted budget: a dataset capped below what the sweep needs.
    csv = tmp_path / "toy.csv"
    csv.write_text("a,b,label\n" + "".join(f"{i % 5},{i % 3},{i % 2}\n" for i in range(200)))
    ds = client.upload_dataset(csv, label="label", epsilon_cap=0.5)
    assert ds["id"].startswith("ds_") and client.budget(ds["id"])["epsilon_cap"] == 0.5
    assert any(d["id"] == ds["id"] for d in client.datasets())
    spec = SMALL_SPEC.replace("{name: digits}", f"{{name: {ds['id']}}}")
    with pytest.raises(Conflict) as c:
        client.submit(spec)
    assert c.value.kind == "budget-exhausted" and "remains of the lifetime cap" in c.value.detail

    # A dataset of people: the unit column is not a feature, and the dataset counts units.
    people = tmp_path / "people.csv"
    people.write_text(
        "a,b,person,label\n" + "".join(f"{i % 7},{i % 3},p{i % 40},{i % 2}\n" for i in range(200))
    )
    unit = client.upload_dataset(people, label="label", privacy_unit="person", declare_counted=True)
    assert unit["privacy_unit"] == "person" and unit["n_units"] == 40
    assert unit["input_shape"] == [2]


# ---------------------------------------------------------------------------------------------
# Retries, against a real HTTP server that answers as told


class _Scripted(http.server.BaseHTTPRequestHandler):
    script: ClassVar[list[tuple[int, dict[str, str], dict[str, Any]]]] = []
    seen: ClassVar[list[float]] = []

    def do_GET(self) -> None:
        self.seen.append(time.monotonic())
        status, headers, body = self.script.pop(0) if self.script else (500, {}, {})
        data = json.dumps(body).encode()
        self.send_response(status)
        ctype = "application/json" if status < 400 else "application/problem+json"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[tuple[str, type[_Scripted]]]:
    handler = type("Handler", (_Scripted,), {"script": [], "seen": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


SWEEP = {"id": "s1", "name": "n", "dataset": "digits", "state": "done", "trials": {"done": 1}}
BUSY = {"type": "x/unavailable", "title": "Service unavailable", "status": 503, "detail": "busy"}


def test_503_with_retry_after_twice_then_success_is_retried(
    scripted: tuple[str, type[_Scripted]],
) -> None:
    url, handler = scripted
    handler.script += [(503, {"Retry-After": "1"}, BUSY)] * 2 + [(200, {}, SWEEP)]
    with Client(url, retries=3) as c:
        t0 = time.monotonic()
        s = c.sweep("s1")
    assert s.id == "s1" and s.finished
    assert len(handler.seen) == 3
    gaps = [b - a for a, b in zip(handler.seen, handler.seen[1:], strict=False)]
    assert all(g >= 0.9 for g in gaps), gaps  # Retry-After: 1 was honoured each time
    assert time.monotonic() - t0 < 10


def test_retries_run_out_into_typed_errors(scripted: tuple[str, type[_Scripted]]) -> None:
    url, handler = scripted
    busy = (429, {"Retry-After": "0"}, {"detail": "slow down", "status": 429})
    handler.script += [busy] * 3
    with Client(url, retries=2) as c:
        with pytest.raises(RateLimited) as e:
            c.sweep("s1")
        assert e.value.retry_after == 0 and len(handler.seen) == 3
        handler.script += [(500, {}, {"detail": "boom", "status": 500})]
        with pytest.raises(ServerError, match="boom"):
            c.sweep("s1")  # a 500 is not retried: the server may have acted
        assert len(handler.seen) == 4
    # Nobody listening: connection errors are retried, then raised typed.
    nobody = f"http://127.0.0.1:{free_port()}"
    with Client(nobody, retries=1, backoff=0.01) as c, pytest.raises(ConnectionFailed):
        c.sweep("s1")


def test_a_retry_after_longer_than_the_limit_is_not_waited_for(
    scripted: tuple[str, type[_Scripted]],
) -> None:
    url, handler = scripted
    handler.script += [(503, {"Retry-After": "3600"}, BUSY)]
    with Client(url, retries=5, max_retry_wait=5) as c, pytest.raises(ServerError):
        c.sweep("s1")
    assert len(handler.seen) == 1


# ---------------------------------------------------------------------------------------------


def test_the_client_imports_without_torch_ray_or_a_database() -> None:
    """The light install: the client and its spec validation load with the heavy packages
    blocked (an import of any of them would fail)."""
    heavy = ["torch", "ray", "sqlalchemy", "fastapi", "numpy", "opacus", "pandas", "alembic"]
    code = (
        "import sys\n"
        f"for m in {heavy!r}: sys.modules[m] = None\n"
        "import dpsweep\n"
        "from dpsweep.client import spec_body\n"
        "body = spec_body(open('examples/demo.yaml').read())\n"
        "try:\n"
        "    dpsweep.Sweep(dpsweep.Client('http://127.0.0.1:1'), {'id': 'x'}).to_dataframe()\n"
        "except ImportError as e:\n"
        "    print('pandas:', e)\n"
        f"print(sorted(m for m in {heavy!r} if sys.modules.get(m) is not None))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "[]"
    assert "pip install pandas" in lines[0]


@pytest.mark.slow
def test_the_sdk_walkthrough_runs(server: Server, tmp_path: Path) -> None:
    """docs/sdk.md's Python blocks, run in order as one script against the real server, with
    a small spec in place of the demo's (same steps, seconds instead of a minute)."""
    import re

    doc = (ROOT / "docs" / "sdk.md").read_text()
    code = "\n".join(re.findall(r"```python\n(.*?)```", doc, flags=re.S))
    spec = tmp_path / "small.yaml"
    spec.write_text(SMALL_SPEC)
    code = code.replace('"examples/demo.yaml"', repr(str(spec)))
    (tmp_path / "patients.csv").write_text(
        "age,dose,outcome\n" + "".join(f"{i % 50},{i % 7},{i % 2}\n" for i in range(300))
    )
    # The walkthrough grants ana, a tenant: her token's name (a name without one is refused).
    server.token("ana")
    env = {
        **{k: v for k, v in __import__("os").environ.items() if not k.startswith("DPSWEEP_")},
        "DPSWEEP_URL": server.base,
        "DPSWEEP_TOKEN": server.token("walkthrough"),
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'name': 'walkthrough'" in out.stdout
    assert "non-dominated" in out.stdout
    assert (tmp_path / "front.png").stat().st_size > 10_000
