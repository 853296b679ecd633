"""The charge's Core path (sweeper/privacy/ledger/charging.py) on SQLite and PostgreSQL: racing
charges never spend past a reservation, a failure mid-write rolls everything back, and what a
charge returns is what it stored."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sweeper.privacy.ledger import BudgetLedger, EntryKind, ReservationExceeded, charging
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.conftest import fresh_postgres_database

DS = "records"
RACERS = 24


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'charges.db'}"
    else:
        url = fresh_postgres_database(request.getfixturevalue("postgres_url"), str(tmp_path))
    upgrade(url)
    # pool_size >= the racing threads: each really holds its own connection.
    eng = make_engine(url, pool_size=RACERS + 2)
    yield eng
    eng.dispose()


def _books_agree(ledger: BudgetLedger, sweep_id: str) -> None:
    with Session(ledger.engine) as session:
        assert ledger._balance(session, DS, sweep_id) == ledger._balance_from_entries(
            session, DS, sweep_id
        )


def test_racing_charges_spend_exactly_the_reservation(engine: Engine) -> None:
    ledger = BudgetLedger(engine)
    ledger.set_cap(DS, epsilon_cap=5, delta_cap=1e-3)
    ledger.reserve(DS, sweep_id="s", epsilon=Decimal("0.7"), delta=Decimal("7e-6"))
    ledger.reserve(DS, sweep_id="other", epsilon=1, delta=0)
    start = threading.Barrier(RACERS)

    def charge(i: int) -> bool:
        start.wait()
        try:
            ledger.charge(
                DS, sweep_id="s", trial_id=f"t{i}", epsilon=Decimal("0.1"), delta=Decimal("1e-6")
            )
        except ReservationExceeded:
            return False
        return True

    with ThreadPoolExecutor(RACERS) as pool:
        won = sum(pool.map(charge, range(RACERS)))
    assert won == 7  # 0.7 / 0.1, exactly: no lost update, no overspend
    summary = ledger.summary(DS)
    assert summary.epsilon_spent == Decimal("0.7") and summary.delta_spent == Decimal("7e-6")
    assert summary.epsilon_reserved == 1 and summary.delta_reserved == 0  # the other sweep's
    charges = [e for e in ledger.entries(DS) if e.kind is EntryKind.CHARGE]
    assert len(charges) == 7 and {e.sweep_id for e in charges} == {"s"}
    _books_agree(ledger, "s")
    _books_agree(ledger, "other")


def test_a_failure_after_the_first_write_rolls_the_charge_back(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = BudgetLedger(engine)
    ledger.reserve(DS, sweep_id="s", epsilon=1, delta=0)
    before = (ledger.summary(DS), ledger.entries(DS))
    run = charging._Prepared.run

    def crash_after_write(self: charging._Prepared, conn: Any, values: dict[str, Any]) -> Any:
        result = run(self, conn, values)
        if not self.sql.lstrip().upper().startswith("SELECT"):
            raise RuntimeError("disk on fire")  # the write reached the database
        return result

    monkeypatch.setattr(charging._Prepared, "run", crash_after_write)
    with pytest.raises(RuntimeError):
        ledger.charge(DS, sweep_id="s", trial_id="t", epsilon=Decimal("0.5"), delta=0)
    monkeypatch.undo()
    assert (ledger.summary(DS), ledger.entries(DS)) == before
    _books_agree(ledger, "s")
    # And the next charge goes through on the same pool.
    ledger.charge(DS, sweep_id="s", trial_id="t", epsilon=Decimal("0.5"), delta=0)
    assert ledger.summary(DS).epsilon_spent == Decimal("0.5")


def test_a_charge_returns_the_entry_it_stored(engine: Engine) -> None:
    ledger = BudgetLedger(engine)
    ledger.reserve(DS, sweep_id="s", epsilon=Decimal("0.3"), delta=Decimal("1e-6"))
    record = ledger.charge(
        DS,
        sweep_id="s",
        trial_id="trial-1",
        epsilon=Decimal("0.125"),
        delta=Decimal("2.5e-7"),
        note="grid 0",
    )
    (stored,) = [e for e in ledger.entries(DS) if e.kind is EntryKind.CHARGE]
    assert record == stored
    assert (stored.epsilon, stored.delta) == (Decimal("0.125"), Decimal("2.5e-7"))
    assert stored.created_at.tzinfo is not None and stored.note == "grid 0"
    # A charge past what is left is refused, and changes nothing.
    with pytest.raises(ReservationExceeded):
        ledger.charge(DS, sweep_id="s", trial_id="t2", epsilon=Decimal("0.2"), delta=0)
    assert ledger.summary(DS).epsilon_reserved == Decimal("0.175")
    _books_agree(ledger, "s")
