"""The ledger's hot path (Core statements on the driver's cursor) on SQLite and PostgreSQL:
exact totals after random sequences, refusals that change nothing, racing charges, durability."""

from __future__ import annotations

import decimal
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError

from sweeper.privacy.ledger import (
    BudgetExhausted,
    BudgetLedger,
    EntryKind,
    ReservationExceeded,
    SweepEnded,
)
from sweeper.privacy.ledger.driver_sql import run
from sweeper.privacy.ledger.rows import utcnow
from sweeper.privacy.ledger.statements import _INSERT_ENTRY_D
from sweeper.store.engine import make_engine
from tests.conftest import sqlite_or_postgres_url
from tests.sweeper.privacy.books import DS, assert_books

D = Decimal


@pytest.fixture(autouse=True)
def exact_decimals() -> Iterator[None]:
    # The model's own arithmetic must be exact too: any rounding raises.
    with decimal.localcontext() as ctx:
        ctx.prec = 5000
        ctx.traps[decimal.Inexact] = True
        yield


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(sqlite_or_postgres_url(request, tmp_path), pool_size=12)
    yield engine
    engine.dispose()


AMOUNTS = [D(0), D("0.1"), D("0.25"), D(1) / D(8), D(0.1), D(1 / 3), D("1e-30"), D(2)]


def test_random_reserve_charge_release_sequences_keep_the_books_exact(engine: Engine) -> None:
    ledger = BudgetLedger(engine)
    rng = random.Random(25)  # a fixed sequence: the same operations on both databases
    ledger.set_cap(DS, epsilon_cap=D(6), delta_cap=D("1e-4"))
    model: dict[str, list[Decimal]] = {}  # sweep -> [reserved, charged, released] of ε
    reserved_sweeps: set[str] = set()
    ended: set[str] = set()  # released: no charge nor reservation after that
    # Each slot's sweep is followed by a new one once released; now and then an operation
    # goes to the slot's previous, released sweep (and must be refused).
    generation = dict.fromkeys(["s1", "s2", "s3", "s4"], 0)
    refused_ended = 0
    for step in range(70):
        slot = rng.choice(sorted(generation))
        op = rng.choice(["reserve", "charge", "charge", "charge", "release"])
        eps, dlt = rng.choice(AMOUNTS), rng.choice([D(0), D("1e-6"), D(1e-7)])
        late = generation[slot] > 0 and rng.random() < 0.25
        sweep = f"{slot}.{generation[slot] - late}"
        books = model.setdefault(sweep, [D(0), D(0), D(0)])
        before = (ledger.summary(DS), len(ledger.entries(DS)))
        if op == "reserve":
            try:
                ledger.reserve(DS, sweep_id=sweep, epsilon=eps, delta=dlt)
            except SweepEnded:
                assert sweep in ended
                assert (ledger.summary(DS), len(ledger.entries(DS))) == before
                refused_ended += 1
                continue
            except BudgetExhausted:
                assert (ledger.summary(DS), len(ledger.entries(DS))) == before
                continue
            assert sweep not in ended
            books[0] += eps
            reserved_sweeps.add(sweep)
        elif op == "charge":
            outstanding = books[0] - books[1] - books[2]
            balance = ledger.sweep_balance(DS, sweep_id=sweep)
            try:
                record = ledger.charge(
                    DS, sweep_id=sweep, trial_id=f"t{step}", epsilon=eps, delta=dlt
                )
            except SweepEnded:
                assert sweep in ended  # any amount, zero included
                assert (ledger.summary(DS), len(ledger.entries(DS))) == before
                refused_ended += 1
                continue
            except ReservationExceeded:
                # Refused exactly when the sweep never reserved, or holds less than asked.
                assert (
                    sweep not in reserved_sweeps
                    or eps > outstanding
                    or dlt > balance.delta_outstanding
                )
                assert (ledger.summary(DS), len(ledger.entries(DS))) == before
                continue
            assert sweep in reserved_sweeps and sweep not in ended and eps <= outstanding
            assert dlt <= balance.delta_outstanding
            # What charge returns is what was stored.
            assert ledger.entries(DS, sweep)[-1] == record
            assert record.kind is EntryKind.CHARGE and record.epsilon == eps
            books[1] += eps
        else:
            rec = ledger.release(DS, sweep_id=sweep)
            assert rec is not None and rec.epsilon == books[0] - books[1] - books[2]
            books[2] += rec.epsilon
            ended.add(sweep)
            generation[slot] += not late
        assert_books(ledger)
        balance = ledger.sweep_balance(DS, sweep_id=sweep)
        assert (balance.epsilon_reserved, balance.epsilon_charged, balance.epsilon_released) == (
            books[0],
            books[1],
            books[2],
        )
    summary = ledger.summary(DS)
    assert summary.epsilon_spent == sum((b[1] for b in model.values()), D(0))
    assert summary.epsilon_spent + summary.epsilon_reserved <= 6
    # The sequence charged, ended sweeps, and tried them after their end.
    assert summary.epsilon_spent > 0 and refused_ended > 0 and len(ended) > 1


def test_racing_charges_take_exactly_what_was_reserved(engine: Engine) -> None:
    ledger = BudgetLedger(engine)
    ledger.set_cap(DS, epsilon_cap=D(100))
    ledger.reserve(DS, sweep_id="s", epsilon=D("0.7"), delta=0)  # room for 7 charges of 0.1
    barrier = threading.Barrier(10)

    def charge(i: int) -> int:
        barrier.wait()
        won = 0
        for j in range(2):
            try:
                ledger.charge(DS, sweep_id="s", trial_id=f"t{i}-{j}", epsilon=D("0.1"), delta=0)
                won += 1
            except ReservationExceeded:
                pass
        return won

    with ThreadPoolExecutor(max_workers=10) as pool:
        won = sum(pool.map(charge, range(10)))
    assert won == 7
    balance = ledger.sweep_balance(DS, sweep_id="s")
    assert balance.epsilon_charged == D("0.7") and balance.epsilon_outstanding == 0
    assert ledger.summary(DS).epsilon_spent == D("0.7")
    assert_books(ledger)


def test_racing_first_reservations_create_one_row_and_one_totals_row(engine: Engine) -> None:
    ledger = BudgetLedger(engine)
    barrier = threading.Barrier(8)

    def reserve(i: int) -> None:
        barrier.wait()
        ledger.reserve("fresh", sweep_id=f"s{i % 2}", epsilon=1, delta=0)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(reserve, range(8)))
    assert ledger.datasets() == ["fresh"]
    assert ledger.summary("fresh").epsilon_reserved == 8
    assert ledger.sweep_balance("fresh", sweep_id="s0").reservations == 4
    assert_books(ledger, "fresh")


def test_a_driver_error_is_raised_as_sqlalchemys(engine: Engine) -> None:
    # An entry for a dataset without a row breaks the foreign key: the same IntegrityError
    # SQLAlchemy itself would raise, and the transaction rolls back.
    values = {
        "e_principal": None,
        "e_dataset": "nowhere",
        "e_sweep_id": "s",
        "e_trial_id": None,
        "e_kind": EntryKind.RESERVE,
        "e_epsilon": D(1),
        "e_delta": D(0),
        "e_created_at": utcnow(),
        "e_note": "",
    }
    with pytest.raises(IntegrityError), engine.begin() as conn:
        run(conn, [(_INSERT_ENTRY_D, values)])
    assert BudgetLedger(engine).entries("nowhere") == []


def test_sqlite_commits_are_durable(tmp_path: Path) -> None:
    # A charge that was acknowledged must survive a power cut: WAL with synchronous FULL.
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        engine.dispose()
