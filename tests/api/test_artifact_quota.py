"""``POST /api/v1/sweeps`` over the quota of kept models: 422 ``quota-exceeded`` naming
``artifacts.keep``, with the estimate made in the planning pool, and nothing reserved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.app import create_app
from api.settings import ApiSettings
from sweeper.privacy.ledger.rows import DatasetBudget, LedgerEntry
from sweeper.store import Sweep
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.store.tokens import create_token
from tests.sweeper.artifacts.test_quota import small_spec


def _counts(url: str) -> tuple[int, int, int]:
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            return tuple(  # type: ignore[return-value]
                s.scalar(sa.select(sa.func.count()).select_from(t)) or 0
                for t in (Sweep, LedgerEntry, DatasetBudget)
            )
    finally:
        engine.dispose()


def test_a_sweep_over_quota_gets_422_before_any_reservation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The planning processes read the quota from the environment, as in a deployment.
    monkeypatch.setenv("DPSWEEP_ARTIFACT_QUOTA_MB", "0.01")  # under one logreg and its card
    monkeypatch.delenv("DPSWEEP_ARTIFACT_URL", raising=False)
    url = f"sqlite:///{tmp_path / 'api.db'}"
    upgrade(url)
    engine = make_engine(url)
    token, _ = create_token(engine, name="ada")
    engine.dispose()
    app = create_app(ApiSettings(planner_processes=1), database_url=url)
    headers: dict[str, Any] = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/yaml",
    }
    with TestClient(app) as client:
        r = client.post("/api/v1/sweeps", content=yaml.safe_dump(small_spec()), headers=headers)
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["type"].endswith("quota-exceeded")
        assert body["errors"][0]["field"] == "artifacts.keep"
        assert "DPSWEEP_ARTIFACT_QUOTA_MB" in body["detail"]
        assert _counts(url) == (0, 0, 0)
        # Keeping nothing needs no room.
        spec = small_spec(artifacts={"keep": "none"})
        r = client.post("/api/v1/sweeps", content=yaml.safe_dump(spec), headers=headers)
        assert r.status_code == 201, r.text
