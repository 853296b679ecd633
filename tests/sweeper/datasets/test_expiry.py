"""Expiry of idempotency keys and unused uploads, on a real SQLite store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sweeper.datasets.access import Viewer
from sweeper.datasets.expiry import expire
from sweeper.datasets.grants import grant
from sweeper.datasets.uploads import store_upload
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.store import Dataset, IdempotencyRecord, Sweep
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _csv(seed: int) -> bytes:
    import numpy as np

    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(size=(120, 3)), 3)
    rows = ["a,b,c,label"] + [f"{r[0]},{r[1]},{r[2]},{int(r[0] > 0)}" for r in x.tolist()]
    return ("\n".join(rows) + "\n").encode()


def _age(engine: Any, name: str, days: float) -> None:
    with Session(engine) as s, s.begin():
        s.execute(
            sa.update(Dataset)
            .where(Dataset.name == name)
            .values(created_at=datetime.now(UTC) - timedelta(days=days))
        )


def test_old_keys_and_unused_uploads_expire_and_ledgers_stay(engine: Any, tmp_path: Path) -> None:
    def upload(seed: int) -> dict[str, Any]:
        return store_upload(
            engine,
            owner="olga",
            content=_csv(seed),
            fmt="csv",
            data_dir=tmp_path,
            label_column="label",
            epsilon_cap=10.0,
            declare_counted=True,
        )

    unused, used, granted, fresh = upload(1), upload(2), upload(3), upload(4)
    spec = {
        "name": "s",
        "dataset": {"name": used["id"], "input_bounds": [-5.0, 5.0]},
        "model": {"name": "logreg"},
        "training": {"steps": 2, "batch_size": 16, "eval_every": 1},
        "privacy": {"budgets": [1], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }
    create_sweep(engine, spec, owner="olga")
    grant(engine, granted["id"], "ana", epsilon_allowance=1, viewer=Viewer("olga"), confirm=True)
    for d in (unused, used, granted):
        _age(engine, d["id"], 40)
    with Session(engine) as s, s.begin():
        s.add(IdempotencyRecord(owner="o", key="old", request_hash="h", status=201, body=""))
        s.add(IdempotencyRecord(owner="o", key="new", request_hash="h", status=201, body=""))
        s.flush()
        s.execute(
            sa.update(IdempotencyRecord)
            .where(IdempotencyRecord.key == "old")
            .values(created_at=datetime.now(UTC) - timedelta(hours=25))
        )
    with Session(engine) as s:
        path = s.scalar(sa.select(Dataset.storage_path).where(Dataset.name == unused["id"]))
        key = s.scalar(sa.select(Dataset.content_sha256).where(Dataset.name == unused["id"]))
    assert path and Path(path).exists()
    out = expire(engine, idempotency_ttl=timedelta(hours=24), upload_ttl=timedelta(days=30))
    assert out.idempotency_keys == 1 and out.uploads == [unused["id"]]
    with Session(engine) as s:
        names = set(s.scalars(sa.select(Dataset.name)))
        keys = set(s.scalars(sa.select(IdempotencyRecord.key)))
        assert s.scalar(sa.select(sa.func.count()).select_from(Sweep)) == 1
    # Used, granted and recent uploads stay; the unused old one's file is gone, its ledger
    # (and cap) are kept for the same records uploaded again.
    assert {used["id"], granted["id"], fresh["id"]} <= names and unused["id"] not in names
    assert keys == {"new"} and not Path(path).exists()
    assert BudgetLedger(engine).summary(f"sha256:{key}/olga").epsilon_cap == 10
    # Unset: uploads never expire.
    _age(engine, fresh["id"], 400)
    again = expire(engine, idempotency_ttl=timedelta(hours=24), upload_ttl=None)
    assert again.uploads == [] and again.idempotency_keys == 0
