"""``dpsweep audit`` of a registered dataset with a privacy unit (issue 54): the audit is per
unit, and so is its charge.

A CSV of patients (a ``patient_id`` unit column) is registered with its unit; the owner's
white-box and black-box audits say ``privacy_unit`` in their result and verdict, are charged
their claimed epsilon per unit on the records' ledger (bound to ``patient_id``), and the
table says the claim is per unit. Every run is tiny.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from api.cli import main
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade

UNIT = "patient_id"


def _patients(path: Path) -> None:
    """60 patients of 1-12 rows (one of 50), 4 features, 2 classes."""
    rng = np.random.default_rng(54)
    sizes = rng.integers(1, 13, size=60)
    sizes[7] = 50
    ids = rng.permutation(np.repeat(np.arange(60), sizes))
    x = rng.normal(size=(len(ids), 4))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    rows = (
        ",".join(f"{v:.5f}" for v in r) + f",p{p},{t}" for r, p, t in zip(x, ids, y, strict=True)
    )
    path.write_text(f"a,b,c,d,{UNIT},label\n" + "\n".join(rows) + "\n")


@pytest.fixture
def clinic(tmp_path: Path) -> str:
    from sweeper.datasets.registration import register_file

    db = f"sqlite:///{tmp_path / 'u.db'}"
    upgrade(db)
    data = tmp_path / "clinic.csv"
    _patients(data)
    engine = make_engine(db)
    try:
        register_file(engine, data, name="clinic", label_column="label", privacy_unit=UNIT)
    finally:
        engine.dispose()
    return db


def _ledger(db: str) -> tuple[Decimal, str | None]:
    from sweeper.datasets.identity import ledger_key_of
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger
    from sweeper.privacy.ledger.units import ledger_unit
    from sweeper.store.engine import create_ledger_engine

    engine = create_ledger_engine(db)
    try:
        key = ledger_key_of(engine, "clinic")
        s = BudgetLedger(engine).summary(key)
        return s.epsilon_spent + s.epsilon_reserved, ledger_unit(engine, key)
    finally:
        engine.dispose()


AUDIT = ["audit", "--dataset", "clinic", "--model", "logreg", "--noise-multiplier", "1.5",
         "--batch-size", "16", "--steps", "10", "--canaries", "100", "--yes"]  # fmt: skip


@pytest.mark.parametrize("setting", ["white-box", "black-box"])
def test_an_audit_of_people_is_per_unit_and_charged_per_unit(
    clinic: str, setting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before, _ = _ledger(clinic)
    extra = ["--unit-bounding", "capped"] if setting == "black-box" else ["--canary-rows", "3"]
    rc = main([*AUDIT, "--setting", setting, *extra, "--json", "--db", clinic])
    assert rc == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["privacy_unit"] == UNIT
    assert out["canary_rows"] == (3 if setting == "white-box" else 4)
    assert f"The audit is per unit (unit: {UNIT})" in out["verdict"]
    assert f"per {UNIT} (unit: {UNIT})" in out["summary"]
    assert 0.0 <= out["epsilon_lower_bound"] <= out["epsilon_claimed"]
    spent, unit = _ledger(clinic)
    # Charged the claim per unit, on the records' ledger bound to the unit.
    assert float(spent - before) == pytest.approx(out["epsilon_claimed"], rel=1e-9)
    assert unit == UNIT


def test_the_table_says_the_claim_is_per_unit(
    clinic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main([*AUDIT, "--db", clinic])
    assert rc == 0
    out = capsys.readouterr().out
    assert f"per {UNIT}" in out and "audit per unit" in out
    assert "The audit is per unit" in " ".join(out.split())


def test_the_cost_quoted_before_charging_is_per_unit(
    clinic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before, _ = _ledger(clinic)
    rc = main([*[a for a in AUDIT if a != "--yes"], "--db", clinic])
    assert rc != 0
    said = " ".join((lambda c: c.out + c.err)(capsys.readouterr()).split())
    assert "this audit charges ε" in said and f"per {UNIT} (unit: {UNIT}), δ" in said, said
    assert _ledger(clinic)[0] == before  # refused: nothing reserved or charged
