"""An audit of what the canaries cannot enter is refused before anything is charged (issue 49).

A private strategy that reads no per-example norms (the plug-in that clipped nothing and passed
its audit with a bound of 0) is refused by ``dpsweep audit`` (usage error naming
``--strategy``) and by ``POST /api/v1/audits`` (422 naming ``strategy``), on a registered
private dataset: its ledger's spent and reserved totals are unchanged and no audit is stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from api.cli import main
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.api.test_cli_audit import _audits, _csv, _spent
from tests.workers.canary_audit import normless as _normless

normless = _normless.normless

WORDS = "cannot enter its releases"


@pytest.fixture
def clinic(tmp_path: Path) -> Iterator[str]:
    """A database with a registered private dataset ``clinic`` (one earlier spend on it)."""
    from sweeper.datasets.identity import ledger_key_of
    from sweeper.datasets.registration import register_file
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger

    db = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade(db)
    data = tmp_path / "clinic.csv"
    _csv(data)
    engine = make_engine(db)
    try:
        register_file(engine, data, name="clinic", label_column="label")
        key = ledger_key_of(engine, "clinic")
        ledger = BudgetLedger(engine)
        ledger.reserve(key, sweep_id="earlier", epsilon=0.5, delta=1e-6, note="earlier")
        ledger.charge(key, sweep_id="earlier", trial_id="t", epsilon=0.25, delta=1e-6, note="x")
    finally:
        engine.dispose()
    yield db


def test_the_cli_refuses_before_charging(
    clinic: str, normless: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _spent(clinic, "clinic")
    assert before > Decimal(0)
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--dataset", "clinic", "--model", "logreg", "--strategy", normless,
              "--noise-multiplier", "1", "--steps", "5", "--db", clinic])  # fmt: skip
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--strategy" in err and WORDS in err, err
    assert _spent(clinic, "clinic") == before
    assert _audits(clinic) == 0


def test_the_api_refuses_with_a_422_before_charging(clinic: str, normless: str) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.settings import ApiSettings

    before = _spent(clinic, "clinic")
    app = create_app(ApiSettings(auth=False, planner_processes=1), database_url=clinic)
    body = {"dataset": "clinic", "model": "logreg", "strategy": normless,
            "noise_multiplier": 1.0, "steps": 5}  # fmt: skip
    with TestClient(app) as client:
        r = client.post("/api/v1/audits", json=body)
        assert r.status_code == 422, r.text
        problem = r.json()
        assert problem["errors"][0]["field"] == "strategy", problem
        assert WORDS in problem["detail"], problem
    assert _spent(clinic, "clinic") == before
    assert _audits(clinic) == 0
