"""One ledger, one privacy unit: a ledger bound to a unit refuses spending at another level,
atomically, on SQLite and PostgreSQL (migrated schemas), and migration 0013 binds the ledgers
that were spent before units existed to ``example``."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

from dpsweep.errors import ConfigError, IllegalState
from sweeper.privacy.ledger import (
    EXAMPLE_UNIT,
    BudgetLedger,
    bind_privacy_unit,
    ledger_unit,
    unit_label,
)
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.conftest import fresh_postgres_database

DS = "sha256:" + "c" * 64


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return fresh_postgres_database(request.getfixturevalue("postgres_url"), str(tmp_path))


@pytest.fixture
def engine(url: str) -> Iterator[Engine]:
    upgrade(url)
    engine = make_engine(url, pool_size=10)
    yield engine
    engine.dispose()


def _entries(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(sa.text("SELECT count(*) FROM budget_ledger_entries")).scalar_one())


def test_the_first_reservation_binds_the_unit_and_another_unit_is_refused(engine: Engine) -> None:
    ledger = BudgetLedger(engine)
    assert ledger.privacy_unit_of(DS) is None
    ledger.reserve(DS, sweep_id="s1", epsilon=1, delta=0, privacy_unit="patient_id")
    assert ledger_unit(engine, DS) == "patient_id"
    before = _entries(engine)
    for other in (None, "visit_id"):
        with pytest.raises(IllegalState, match="One ledger has one privacy unit") as err:
            ledger.reserve(DS, sweep_id="s2", epsilon=1, delta=0, privacy_unit=other)
        # The message names the fix and never the content identity (it reaches analysts).
        assert "'patient_id'" in str(err.value) and "c" * 64 not in str(err.value)
    assert _entries(engine) == before
    summary = ledger.summary(DS)
    assert summary.epsilon_reserved == Decimal(1)
    # The same unit goes on.
    ledger.reserve(DS, sweep_id="s3", epsilon=1, delta=0, privacy_unit="patient_id")
    assert ledger.summary(DS).epsilon_reserved == Decimal(2)


def test_an_example_level_ledger_never_starts_counting_people(engine: Engine) -> None:
    ledger = BudgetLedger(engine)
    ledger.reserve(DS, sweep_id="s1", epsilon=1, delta=0)
    assert ledger.privacy_unit_of(DS) == EXAMPLE_UNIT
    with pytest.raises(IllegalState, match="group privacy"):
        ledger.reserve(DS, sweep_id="s2", epsilon=1, delta=0, privacy_unit="person")
    with pytest.raises(IllegalState):
        bind_privacy_unit(engine, DS, "person")
    assert ledger.privacy_unit_of(DS) == EXAMPLE_UNIT


def test_binding_at_registration_creates_the_row_and_is_idempotent(engine: Engine) -> None:
    assert bind_privacy_unit(engine, DS, "person") == "person"
    assert bind_privacy_unit(engine, DS, "person") == "person"
    ledger = BudgetLedger(engine)
    assert ledger.summary(DS).epsilon_spent == 0
    with pytest.raises(IllegalState):
        ledger.reserve(DS, sweep_id="s1", epsilon=1, delta=0)
    assert _entries(engine) == 0


def test_concurrent_binders_of_two_units_cannot_both_win(engine: Engine) -> None:
    def bind(unit: str) -> str | None:
        try:
            return bind_privacy_unit(engine, DS, unit)
        except IllegalState:
            return None

    units = ["person", "household"] * 4
    with ThreadPoolExecutor(8) as pool:
        won = {u for u in pool.map(bind, units) if u is not None}
    assert len(won) == 1
    assert ledger_unit(engine, DS) in won


def test_bad_unit_names_are_refused_before_anything_is_written(engine: Engine) -> None:
    ledger = BudgetLedger(engine)
    for bad in ("", "   ", "x" * 201):
        with pytest.raises(ConfigError) as err:
            ledger.reserve(DS, sweep_id="s1", epsilon=1, delta=0, privacy_unit=bad)
        assert err.value.field == "dataset.privacy_unit"
    assert ledger.privacy_unit_of(DS) is None
    assert unit_label(None) == EXAMPLE_UNIT


def test_migration_0013_binds_ledgers_spent_before_units_to_example(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0012")
    engine = sa.create_engine(url)
    now = "2026-11-01 00:00:00"
    with engine.begin() as c:
        for key in ("spent", "fresh"):
            c.execute(
                sa.text(
                    "INSERT INTO dataset_budgets (dataset, epsilon_spent, delta_spent, "
                    "epsilon_reserved, delta_reserved, created_at, updated_at) "
                    "VALUES (:k, '0', '0', '1', '0', :t, :t)"
                ),
                {"k": key, "t": now},
            )
        c.execute(
            sa.text(
                "INSERT INTO budget_ledger_entries (dataset, sweep_id, kind, epsilon, delta, "
                "note, created_at) VALUES ('spent', 's', 'reserve', '1', '0', '', :t)"
            ),
            {"t": now},
        )
    engine.dispose()
    upgrade(url)
    with sa.create_engine(url).connect() as c:
        found = c.execute(sa.text("SELECT dataset, privacy_unit FROM dataset_budgets")).all()
    rows: dict[str, str | None] = {str(k): v for k, v in found}
    assert rows == {"spent": EXAMPLE_UNIT, "fresh": None}


def test_merging_two_ledgers_of_the_same_records_keeps_the_stricter_unit(engine: Engine) -> None:
    ledger = BudgetLedger(engine)
    name_key, unbound, other = "by-name", "sha256:" + "d" * 64, "sha256:" + "e" * 64
    ledger.reserve(name_key, sweep_id="s1", epsilon=1, delta=0, privacy_unit="person")
    ledger.set_cap(unbound, epsilon_cap=5, delta_cap=None)  # a row, no unit yet
    ledger.carry_over(name_key, unbound)
    assert ledger.privacy_unit_of(unbound) == "person"
    # Records spent per row and per person already: from now on only per row (fail closed).
    ledger.reserve(other, sweep_id="s2", epsilon=1, delta=0)
    ledger.carry_over(unbound, other)
    assert ledger.privacy_unit_of(other) == EXAMPLE_UNIT
