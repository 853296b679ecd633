"""An ended sweep takes no charge: once its reservation is released, the ledger refuses every
charge of it (zero included) and every new reservation, on SQLite and PostgreSQL, and a
release racing charges leaves every charge before it."""

from __future__ import annotations

import decimal
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import Engine

from sweeper.privacy.ledger import (
    BudgetLedger,
    EntryKind,
    ReservationExceeded,
    SweepEnded,
)
from sweeper.store.engine import make_engine
from tests.conftest import sqlite_or_postgres_url
from tests.sweeper.privacy.books import DS, assert_books

D = Decimal
STEP = D("0.1000000000000000000000000000001")


@pytest.fixture(autouse=True)
def exact_decimals() -> Iterator[None]:
    # The test's own sums must be exact too: any rounding raises.
    with decimal.localcontext() as ctx:
        ctx.prec = 5000
        ctx.traps[decimal.Inexact] = True
        yield


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(sqlite_or_postgres_url(request, tmp_path), pool_size=8)
    yield engine
    engine.dispose()


def _state(ledger: BudgetLedger, sweep_id: str) -> tuple[object, ...]:
    return (
        ledger.summary(DS),
        ledger.sweep_balance(DS, sweep_id=sweep_id),
        ledger.entries(DS),
    )


@pytest.mark.parametrize("charged_in_full", [False, True], ids=["left-over", "nothing-left"])
def test_a_released_sweep_takes_no_charge_zero_included(
    engine: Engine, charged_in_full: bool
) -> None:
    # "nothing-left": the release gives back zero, so only its entry marks the end (the
    # totals alone cannot tell a zero release from none).
    ledger = BudgetLedger(engine)
    ledger.set_cap(DS, epsilon_cap=D(10), delta_cap=D("1e-4"))
    ledger.reserve(DS, sweep_id="s", epsilon=STEP * 2, delta=D("2e-6"))
    ledger.charge(DS, sweep_id="s", trial_id="t1", epsilon=STEP, delta=D("1e-6"))
    if charged_in_full:
        ledger.charge(DS, sweep_id="s", trial_id="t2", epsilon=STEP, delta=D("1e-6"))
    released = ledger.release(DS, sweep_id="s", note="sweep cancelled")
    assert released is not None
    assert released.epsilon == (0 if charged_in_full else STEP)
    before = _state(ledger, "s")
    for trial_id, epsilon, delta in (
        ("zero", D(0), D(0)),
        ("some", STEP, D(0)),
        ("delta-only", D(0), D("1e-7")),
    ):
        with pytest.raises(SweepEnded, match="has ended") as refused:
            ledger.charge(DS, sweep_id="s", trial_id=trial_id, epsilon=epsilon, delta=delta)
        # A ReservationExceeded too: callers that refuse a trial on it refuse this one.
        assert isinstance(refused.value, ReservationExceeded)
        assert refused.value.sweep_id == "s" and refused.value.outstanding == 0
        assert "must not run" in str(refused.value)
    with pytest.raises(SweepEnded, match="cannot reserve again"):
        ledger.reserve(DS, sweep_id="s", epsilon=STEP, delta=D(0))
    assert _state(ledger, "s") == before  # nothing recorded, no total moved
    # Releasing again still gives back nothing more (and is still allowed).
    again = ledger.release(DS, sweep_id="s")
    assert again is not None and again.epsilon == 0 and again.delta == 0
    assert_books(ledger)


def test_a_sweep_that_holds_nothing_but_never_released_still_takes_zero_charges(
    engine: Engine,
) -> None:
    # The totals' shortcut must not take "nothing left" for "ended": a schedule's zero
    # charges after the last paid run are accepted until the release.
    ledger = BudgetLedger(engine)
    ledger.reserve(DS, sweep_id="s", epsilon=STEP, delta=D(0))
    ledger.charge(DS, sweep_id="s", trial_id="paid", epsilon=STEP, delta=D(0))
    zero = ledger.charge(DS, sweep_id="s", trial_id="free", epsilon=D(0), delta=D(0))
    assert zero.kind is EntryKind.CHARGE and zero.epsilon == 0
    ledger.release(DS, sweep_id="s")
    with pytest.raises(SweepEnded):
        ledger.charge(DS, sweep_id="s", trial_id="late", epsilon=D(0), delta=D(0))
    # Other sweeps on the same dataset are not ended by it.
    ledger.reserve(DS, sweep_id="other", epsilon=STEP, delta=D(0))
    ledger.charge(DS, sweep_id="other", trial_id="t", epsilon=D(0), delta=D(0))
    assert_books(ledger)


def _race_round(ledger: BudgetLedger, sweep: str, rng: random.Random) -> int:
    """One round: 3 threads charging (zero and non-zero, with room for every charge, so a
    refusal can only come from the release) against one releasing once ``first`` charges
    went through (0 to 3, so that the release lands early in some rounds, later in others);
    checks the round's entries and returns how many charges the release refused."""
    chargers, tries, first = 3, 3, rng.randrange(4)
    reserved = STEP * chargers * tries
    ledger.reserve(DS, sweep_id=sweep, epsilon=reserved, delta=D(0))
    barrier = threading.Barrier(chargers + 1)
    pauses = [[rng.random() * 0.003 for _ in range(tries)] for _ in range(chargers)]
    won: list[str] = []
    lock, go = threading.Lock(), threading.Event()
    if first == 0:
        go.set()

    def charge(i: int) -> None:
        barrier.wait()
        for j in range(tries):
            time.sleep(pauses[i][j])
            trial, epsilon = f"t{i}-{j}", STEP * (j % 2)
            try:
                ledger.charge(DS, sweep_id=sweep, trial_id=trial, epsilon=epsilon, delta=0)
            except SweepEnded:
                return  # ended: every later try would be refused too
            with lock:
                won.append(trial)
                if len(won) >= first:
                    go.set()

    def release() -> None:
        barrier.wait()
        go.wait()
        ledger.release(DS, sweep_id=sweep, note="sweep cancelled")

    with ThreadPoolExecutor(max_workers=chargers + 1) as pool:
        for future in [pool.submit(charge, i) for i in range(chargers)] + [pool.submit(release)]:
            future.result()
    entries = ledger.entries(DS, sweep)
    (released,) = [e for e in entries if e.kind is EntryKind.RELEASE]
    charges = [e for e in entries if e.kind is EntryKind.CHARGE]
    # Exactly the charges the threads were told succeeded, every one committed before the
    # release, and the release gave back exactly what they left.
    assert sorted(e.trial_id or "" for e in charges) == sorted(won) and len(won) >= first
    assert all(e.id < released.id for e in charges)
    assert released.epsilon == reserved - sum((e.epsilon for e in charges), D(0))
    with pytest.raises(SweepEnded):
        ledger.charge(DS, sweep_id=sweep, trial_id="after", epsilon=D(0), delta=D(0))
    return chargers * tries - len(won)


def test_a_release_racing_charges_leaves_every_charge_before_it(engine: Engine) -> None:
    ledger = BudgetLedger(engine)
    rng = random.Random(7)
    refused = [_race_round(ledger, f"s{i}", rng) for i in range(40)]
    assert any(refused)  # the release did land among the charges
    assert_books(ledger)
