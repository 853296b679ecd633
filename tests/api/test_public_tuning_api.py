"""Public pre-tuning through the REST API (the real app, its spawned planning process, SQLite):
a refused ``tune_on`` is a 422 naming ``arms.<label>.tune_on`` with nothing reserved, and a
dry run's plan shows each tuned grid's public point and centred grid."""

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
from sweeper.store import Sweep, Trial
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.store.tokens import create_token
from tests.sweeper.sweeps.test_public_tuning import _spec

pytest.importorskip("mnist1d")


def _counts(url: str) -> tuple[int, ...]:
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            return tuple(
                s.scalar(sa.select(sa.func.count()).select_from(t)) or 0
                for t in (Sweep, Trial, LedgerEntry, DatasetBudget)
            )
    finally:
        engine.dispose()


def test_tune_on_through_the_api(tmp_path: Path) -> None:
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
    before = _counts(url)
    tpe = _spec(tune_on="mnist1d-test")
    tpe["search"] = {"method": "tpe", "n": 3}
    with TestClient(app) as client:
        for spec, why in ((tpe, "tpe"), (_spec(tune_on="digits"), "declared public")):
            r = client.post("/api/v1/sweeps", content=yaml.safe_dump(spec), headers=headers)
            assert r.status_code == 422, r.text
            body = r.json()
            assert "arms.fixed.tune_on" in [e["field"] for e in body["errors"]], body
            assert why in body["detail"]
        assert _counts(url) == before  # nothing stored, nothing reserved

        r = client.post(
            "/api/v1/sweeps:plan",
            content=yaml.safe_dump(_spec(tune_on="mnist1d-test")),
            headers=headers,
        )
        assert r.status_code == 200, r.text
        (grid,) = r.json()["grids"]
        assert grid["tuned_on"] == "mnist1d-test"
        assert set(grid["tuned_params"]) == {"lr", "clip"}
        assert isinstance(grid["tuned_score"], float)
        assert len(grid["tuned_grid"]["lr"]) == 3 and len(grid["tuned_grid"]["clip"]) == 2
        assert grid["trials"] == 6
