"""``/api/v1/audits`` and ``Client.audit`` over real HTTP (one ``dpsweep serve`` on SQLite).

``olga`` uploads a CSV and grants it to ``ana``. Olga's audits run (public data: free; her
upload: charged the claimed epsilon once she confirms it, and quoted first; one of her trials
by id); an unconfirmed audit of her upload is a 422 naming ``confirm`` with its cost, free
(issue 51); ana's audit of the granted data is a 403 that charges and stores nothing; bad
input is a 422 naming the field, free.
Every audit is tiny (a few steps, a few hundred canaries).
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.testing.server import Server, start_server
from dpsweep import Client
from dpsweep.errors import ConfigError, PermissionDenied
from sweeper.store import Audit
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.api.test_api import assert_problem, wait_for

pytestmark = pytest.mark.slow  # one server, one tiny sweep and a few tiny audits

V1 = "/api/v1"
KEYS = {
    "epsilon_claimed",
    "epsilon_lower_bound",
    "confidence",
    "canaries",
    "setting",
    "strategy",
    "engine_path",
    "seconds",
    "exceeds_claim",
    "false_alarm_rate",
    "verdict",
    "epsilon_estimate",
    "estimate_assumption",
}


def _records() -> bytes:
    rng = np.random.default_rng(38)
    x = rng.uniform(-3, 3, size=(400, 4))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    lines = ["a,b,c,d,label"] + [
        ",".join(f"{v:.6f}" for v in row) + f",{t}" for row, t in zip(x, y, strict=True)
    ]
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("audits-api")
    url = f"sqlite:///{work / 'api.db'}"
    upgrade(url)
    s = start_server(url, work, workers=1)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def world(server: Server) -> dict[str, Any]:
    c = {n: server.client(server.token(n)) for n in ("olga", "ana")}
    r = c["olga"].post(
        f"{V1}/datasets",
        files={"file": ("points.csv", _records(), "text/csv")},
        data={
            "format": "csv",
            "label_column": "label",
            "epsilon_cap": "50",
            "declare_counted": "true",
        },
    )
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    grant = {"analyst": "ana", "epsilon_allowance": 3}
    r = c["olga"].post(f"{V1}/datasets/{ds}/grants", json=grant)
    assert r.status_code == 201, r.text
    return {"c": c, "ds": ds}


def _spent(server: Server, name: str) -> Decimal:
    from sweeper.datasets.identity import ledger_key_of
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger
    from sweeper.store.engine import create_ledger_engine

    engine = create_ledger_engine(server.db_url)
    try:
        s = BudgetLedger(engine).summary(ledger_key_of(engine, name))
        return s.epsilon_spent + s.epsilon_reserved
    finally:
        engine.dispose()


def _stored(server: Server) -> int:
    engine = make_engine(server.db_url)
    try:
        with Session(engine) as s:
            return int(s.scalar(select(func.count()).select_from(Audit)) or 0)
    finally:
        engine.dispose()


def _finished(client: httpx.Client, location: str, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        a = client.get(location).json()
        if a["state"] != "running":
            return a
        assert time.monotonic() < deadline, a
        time.sleep(0.3)


def test_owner_audits_public_data_for_free(server: Server, world: dict[str, Any]) -> None:
    olga = world["c"]["olga"]
    body = {"dataset": "digits", "epsilon": 8, "batch_size": 1437, "steps": 10, "canaries": 500}
    r = olga.post(f"{V1}/audits", json=body)
    assert r.status_code == 201, r.text
    location = r.headers["location"]
    assert location == f"{V1}/audits/{r.json()['id']}"
    assert r.json()["state"] in ("running", "succeeded") and r.json()["charge"] is None
    a = _finished(olga, location)
    assert a["state"] == "succeeded", a
    res = a["result"]
    assert set(res) >= KEYS
    assert res["epsilon_claimed"] == pytest.approx(8.0, rel=0.02)
    assert 0.0 <= res["epsilon_lower_bound"] <= res["epsilon_claimed"]
    # The verdict in the CLI's and the dashboard's words, with its error rate.
    assert res["method"] == "one-run" and res["exceeds_claim"] is False
    assert res["false_alarm_rate"] == pytest.approx(0.05)
    assert res["verdict"].startswith("The lower bound does not exceed the claimed epsilon")
    assert a["charge"] is None and a["dataset"] == "digits"
    # Listed for its owner, not for anyone else.
    assert a["id"] in [x["id"] for x in olga.get(f"{V1}/audits").json()["items"]]
    assert a["id"] not in [x["id"] for x in world["c"]["ana"].get(f"{V1}/audits").json()["items"]]
    assert_problem(world["c"]["ana"].get(location), 404)
    assert_problem(server.client().get(location), 401)


def test_owner_audit_of_a_private_upload_is_charged_the_claim(
    server: Server, world: dict[str, Any]
) -> None:
    olga, ds = world["c"]["olga"], world["ds"]
    before = _spent(server, ds)
    body = {
        "dataset": ds,
        "model": "logreg",
        "noise_multiplier": 2.0,
        "batch_size": 64,
        "steps": 8,
        "canaries": 200,
        "lrs": [0.1, 0.3],
    }
    quote = olga.post(f"{V1}/audits/quote", json=body)
    assert quote.status_code == 200, quote.text
    cost = quote.json()
    assert _spent(server, ds) == before  # a quote reserves nothing
    r = olga.post(f"{V1}/audits", json={**body, "confirm": True})
    assert r.status_code == 201, r.text
    charged = r.json()["charge"]["epsilon_charged"]
    assert float(_spent(server, ds) - before) == pytest.approx(charged, rel=1e-9)
    # The cost quoted first is the very epsilon charged, and the cap's figures add up.
    assert cost["charged"] is True and cost["epsilon"] == charged and cost["delta"] == 1e-5
    assert cost["epsilon_left_before"] == pytest.approx(50 - float(before))
    assert cost["epsilon_left_after"] == pytest.approx(50 - float(before) - charged)
    assert r.json()["request"]["confirm"] is True
    a = _finished(olga, r.headers["location"])
    assert a["state"] == "succeeded", a
    assert a["result"]["trials"] == 2
    # The claim charged before training is the one the audit reports.
    assert a["result"]["epsilon_claimed"] == pytest.approx(charged, rel=1e-9)
    assert 0.0 <= a["result"]["epsilon_lower_bound"] <= charged


def test_an_unconfirmed_charge_is_a_422_with_its_cost_and_spends_nothing(
    server: Server, world: dict[str, Any]
) -> None:
    """Issue 51: an audit of private data without ``confirm: true`` is refused before
    anything is reserved; the problem names ``confirm`` and carries the cost, the same as the
    quote's; public data needs no confirmation (quoted as free)."""
    olga, ds = world["c"]["olga"], world["ds"]
    before, stored = _spent(server, ds), _stored(server)
    body = {"dataset": ds, "model": "logreg", "noise_multiplier": 2.0, "batch_size": 64,
            "steps": 8, "canaries": 200}  # fmt: skip
    for sent in (body, {**body, "confirm": False}):
        problem = assert_problem(olga.post(f"{V1}/audits", json=sent), 422, field="confirm")
        cost = problem["cost"]
        assert cost["charged"] is True and cost["dataset"] == ds and cost["epsilon"] > 0
        assert cost["ledger"].startswith("sha256:") and cost["fits"] is True
        assert f"this audit charges ε {cost['epsilon']:.4g}, δ 1e-05" in problem["detail"]
        assert "nothing was reserved" in problem["detail"] and "confirm" in problem["detail"]
        assert cost["epsilon_left_before"] == pytest.approx(50 - float(before))
    quote = olga.post(f"{V1}/audits/quote", json=body).json()
    assert {k: v for k, v in quote.items() if k != "text"} == {
        k: v for k, v in cost.items() if k != "text"
    }
    assert _spent(server, ds) == before
    assert _stored(server) == stored
    free = olga.post(f"{V1}/audits/quote", json={"dataset": "digits", "noise_multiplier": 1.0})
    assert free.status_code == 200 and free.json()["charged"] is False
    assert free.json()["epsilon"] == 0.0 and free.json()["ledger"] is None
    # A quote is checked as the audit is: the analyst's is the same 403, bad input a 422.
    assert_problem(world["c"]["ana"].post(f"{V1}/audits/quote", json=body), 403)
    assert_problem(olga.post(f"{V1}/audits/quote", json={**body, "canaries": 1}), 422,
                   field="canaries")  # fmt: skip
    assert _stored(server) == stored


def test_analyst_and_bad_input_are_refused_free_and_unstored(
    server: Server, world: dict[str, Any]
) -> None:
    olga, ana, ds = world["c"]["olga"], world["c"]["ana"], world["ds"]
    before, stored = _spent(server, ds), _stored(server)
    ok = {"dataset": ds, "model": "logreg", "noise_multiplier": 1.0, "steps": 5, "canaries": 100}
    body = assert_problem(ana.post(f"{V1}/audits", json=ok), 403)
    assert "owner" in body["detail"]
    assert_problem(olga.post(f"{V1}/audits", json={**ok, "epsilon": 1.0}), 422,
                   field="noise_multiplier")  # fmt: skip
    assert_problem(olga.post(f"{V1}/audits", json={**ok, "canaries": 1}), 422, field="canaries")
    assert_problem(olga.post(f"{V1}/audits", json={**ok, "setting": "grey"}), 422, field="setting")
    assert_problem(olga.post(f"{V1}/audits", json={**ok, "strategy": "nonprivate"}), 422,
                   field="strategy")  # fmt: skip
    assert_problem(olga.post(f"{V1}/audits", json={**ok, "batch_size": 10**6}), 422,
                   field="batch_size")  # fmt: skip
    assert_problem(olga.post(f"{V1}/audits", json={**ok, "dataset": "nope"}), 422,
                   field="dataset")  # fmt: skip
    assert_problem(olga.post(f"{V1}/audits", json={"trial": "nope", "steps": 3}), 422,
                   field="steps")  # fmt: skip
    assert_problem(olga.post(f"{V1}/audits", json={"trial": "nope"}), 404)
    assert_problem(olga.get(f"{V1}/audits?cursor=zzz"), 422, field="cursor")
    assert _spent(server, ds) == before
    assert _stored(server) == stored


def test_audit_of_a_trial_reuses_its_configuration(server: Server, world: dict[str, Any]) -> None:
    olga, ana, ds = world["c"]["olga"], world["c"]["ana"], world["ds"]
    spec = {
        "name": "olga-sweep",
        "dataset": {"name": ds},
        "model": {"name": "logreg"},
        "training": {"steps": 6, "batch_size": 32, "eval_every": 3},
        "privacy": {"budgets": [2.0], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.2], "clip": [1.0]}}],
    }
    r = olga.post(f"{V1}/sweeps", json=spec)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert wait_for(olga, sid, lambda s: s["state"] in ("done", "failed"))["state"] == "done"
    trial = olga.get(f"{V1}/sweeps/{sid}/trials").json()["items"][0]
    detail = olga.get(f"{V1}/trials/{trial['id']}").json()
    before = _spent(server, ds)
    # Someone who does not see the trial: not found, nothing charged.
    assert_problem(ana.post(f"{V1}/audits", json={"trial": trial["id"]}), 404)
    # The case: a trial of a private dataset, refused until confirmed.
    assert_problem(olga.post(f"{V1}/audits", json={"trial": trial["id"], "canaries": 200}),
                   422, field="confirm")  # fmt: skip
    assert _spent(server, ds) == before
    r = olga.post(f"{V1}/audits", json={"trial": trial["id"], "canaries": 200, "confirm": True})
    assert r.status_code == 201, r.text
    assert r.json()["trial_id"] == trial["id"] and r.json()["sweep_id"] == sid
    a = _finished(olga, r.headers["location"])
    assert a["state"] == "succeeded", a
    res = a["result"]
    assert res["steps"] == 6 and res["trials"] == 1
    assert res["noise_multiplier"] == pytest.approx(detail["noise_multiplier"])
    # One trial's T steps at its sigma and q: the trial's own epsilon (at most its budget).
    assert res["epsilon_claimed"] <= 2.0 + 1e-9
    assert float(_spent(server, ds) - before) == pytest.approx(res["epsilon_claimed"], rel=1e-9)
    items = olga.get(f"{V1}/audits", params={"trial": trial["id"]}).json()["items"]
    assert [x["id"] for x in items] == [a["id"]]
    page = olga.get(f"{V1}/audits", params={"sweep": sid, "limit": 1}).json()
    assert [x["id"] for x in page["items"]] == [a["id"]] and page["next_cursor"] is None


def test_sdk_audit_waits_for_the_result(server: Server, world: dict[str, Any]) -> None:
    with Client(server.base, token=server.token("olga")) as client:
        a = client.audit(
            dataset="synthetic",
            noise_multiplier=1.0,
            batch_size=256,
            steps=5,
            canaries=200,
            setting="black-box",
            timeout=180,
            poll_seconds=0.3,
        )
        assert a["state"] == "succeeded", a
        assert a["result"]["setting"] == "black-box" and a["charge"] is None
        assert 0.0 <= a["result"]["epsilon_lower_bound"] <= a["result"]["epsilon_claimed"]
        assert client.get_audit(a["id"])["id"] == a["id"]
        assert a["id"] in [x["id"] for x in client.audits()]
        # Checked locally, before anything is sent.
        with pytest.raises(ConfigError) as exc:
            client.audit(dataset="digits", epsilon=1.0, noise_multiplier=1.0)
        assert exc.value.field == "noise_multiplier"
        # Private data: the cost first, refused without confirm=True (nothing reserved).
        ds, before = world["ds"], _spent(server, world["ds"])
        run = {"dataset": ds, "model": "logreg", "noise_multiplier": 2.0, "steps": 3,
               "canaries": 100}  # fmt: skip
        cost = client.audit_cost(**run)
        assert cost["charged"] is True and cost["epsilon"] > 0
        with pytest.raises(ConfigError) as refused:
            client.audit(**run)
        assert refused.value.field == "confirm" and refused.value.status == 422
        assert refused.value.problem["cost"]["epsilon"] == cost["epsilon"]
        assert _spent(server, ds) == before
        a = client.audit(**run, confirm=True, timeout=180, poll_seconds=0.3)
        assert a["state"] == "succeeded", a
        assert a["charge"]["epsilon_charged"] == cost["epsilon"]
        assert float(_spent(server, ds) - before) == pytest.approx(cost["epsilon"], rel=1e-9)
        assert a["result"]["summary"].startswith("95 % lower bound ")
    with Client(server.base, token=server.token("ana")) as client, pytest.raises(PermissionDenied):
        client.audit(dataset=world["ds"], noise_multiplier=1.0, steps=3, canaries=100)
