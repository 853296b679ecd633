"""Every ε committed is attributable: after a mix of sweeps (one run to its end, one
cancelled), an analyst's sweep, a canary audit and a ``dpsweep train`` run on one upload, the
rows of its budget add up to its committed ε, exactly, and every charge on the ledger is in the
release log, over real HTTP against ``dpsweep serve`` and the real CLI on the same database."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.testing.server import start_server
from sweeper.datasets.identity import ledger_key_of
from sweeper.privacy.ledger.rows import EntryKind, LedgerEntry
from sweeper.store import ReleaseRecord
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.api.test_api import wait_for
from tests.api.test_cli_train_registered import FAST, dpsweep

pytestmark = pytest.mark.slow  # a server, three tiny sweeps, an audit and a train: ~1 min

V1 = "/api/v1"


def _csv() -> bytes:
    rng = np.random.default_rng(8)
    x = rng.normal(size=(240, 3))
    rows = [",".join(f"{v:.4f}" for v in r) + f",{int(r[0] > 0)}" for r in x]
    return ("a,b,c,label\n" + "\n".join(rows) + "\n").encode()


def _spec(
    ds: str, name: str, *, steps: int = 4, lrs: int = 2, eval_every: int = 2
) -> dict[str, Any]:
    return {
        "name": name,
        "dataset": {"name": ds, "input_bounds": [-5.0, 5.0]},
        "model": {"name": "logreg"},
        "training": {"steps": steps, "batch_size": 16, "eval_every": eval_every},
        "privacy": {"budgets": [1.0], "delta": 1e-5},
        "eval": {"mode": "dp"},
        "arms": [
            {
                "strategy": "fixed",
                "grid": {"lr": [0.1 * (i + 1) for i in range(lrs)], "clip": [1.0]},
            }
        ],
    }


def _audited(client: Any, location: str) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while (a := client.get(location).json())["state"] == "running":
        assert time.monotonic() < deadline, a
        time.sleep(0.3)
    return a


def test_every_charge_is_a_budget_row_and_a_release(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'api.db'}"
    upgrade(url)
    server = start_server(url, tmp_path, workers=1)
    try:
        olga = server.client(server.token("olga"))
        ana = server.client(server.token("ana"))
        r = olga.post(
            f"{V1}/datasets",
            files={"file": ("points.csv", _csv(), "text/csv")},
            data={"label_column": "label", "epsilon_cap": "40", "declare_counted": "true"},
        )
        assert r.status_code == 201, r.text
        ds = r.json()["id"]
        olga.put(f"{V1}/datasets/{ds}/policy", json={"view": {"input_bounds": [-5.0, 5.0]}})
        olga.post(f"{V1}/datasets/{ds}/grants", json={"analyst": "ana", "epsilon_allowance": 5})
        done = olga.post(f"{V1}/sweeps", json=_spec(ds, "done")).json()["id"]
        theirs = ana.post(f"{V1}/sweeps", json=_spec(ds, "analyst")).json()["id"]
        for client, sid in ((olga, done), (ana, theirs)):
            assert wait_for(client, sid, lambda s: s["state"] == "done")["state"] == "done"
        # Cancelled once it has charged some of its trials (or none: both are books to keep).
        # Long enough (6 x 3,000 steps on one worker) that it cannot end before the cancel
        # lands: 200 steps did once, and the cancel of a finished sweep is a 409.
        slow = _spec(ds, "cancelled", steps=3000, lrs=6, eval_every=1000)
        long = olga.post(f"{V1}/sweeps", json=slow).json()
        wait_for(olga, long["id"], lambda s: s["state"] == "running")
        assert olga.post(f"{V1}/sweeps/{long['id']}/cancel").status_code in (200, 202)
        wait_for(olga, long["id"], lambda s: s["state"] == "cancelled")
        audit = {
            "dataset": ds,
            "model": "logreg",
            "noise_multiplier": 2.0,
            "batch_size": 64,
            "steps": 4,
            "canaries": 100,
            "confirm": True,  # a private dataset: the charge is confirmed
        }
        r = olga.post(f"{V1}/audits", json=audit)
        assert r.status_code == 201, r.text
        assert _audited(olga, r.headers["location"])["state"] == "succeeded"
    finally:
        server.stop()
    # The data's owner trains once on the command line, on the same database (local use).
    p = dpsweep("train", "--dataset", ds, "--epsilon", "0.5", "--yes", *FAST, db=url)
    assert p.returncode == 0, p.stderr

    server = start_server(url, tmp_path, workers=1)
    try:
        olga = server.client(server.token("olga"))
        budget = olga.get(f"{V1}/datasets/{ds}/budget").json()
    finally:
        server.stop()
    rows = budget["sweeps"]
    assert {row["kind"] for row in rows} == {"sweep", "audit", "train"}
    assert {done, theirs, long["id"]} <= {row["sweep"] for row in rows}
    engine = make_engine(url)
    key = ledger_key_of(engine, ds)
    with Session(engine) as s:
        entries = list(s.scalars(select(LedgerEntry).where(LedgerEntry.dataset == key)))
        releases = list(s.scalars(select(ReleaseRecord).where(ReleaseRecord.dataset == key)))
    engine.dispose()
    charges = [e for e in entries if e.kind == EntryKind.CHARGE]
    committed = sum((e.epsilon for e in charges), Decimal(0))
    # Every row of the ledger is shown (floats of exact sums), and together they are what
    # the ledger committed.
    assert sum(row["epsilon_charged"] for row in rows) == pytest.approx(float(committed))
    assert budget["epsilon_committed"] == pytest.approx(float(committed))
    assert {row["sweep"] for row in rows} == {e.sweep_id for e in entries}
    # Every charge is released to someone in the log: a trial's (or a cancelled trial's),
    # an audit's, a train's. What the log says of each run adds up to its charges.
    logged: dict[str, Decimal] = {}
    for rec in releases:
        run = {"audit": "audit_", "train": "train_"}.get(rec.kind, "") + rec.sweep_id
        logged[run] = logged.get(run, Decimal(0)) + rec.epsilon
    for run in {e.sweep_id for e in charges}:
        spent = sum((e.epsilon for e in charges if e.sweep_id == run), Decimal(0))
        assert float(logged.get(run, Decimal(0))) == pytest.approx(float(spent)), run
