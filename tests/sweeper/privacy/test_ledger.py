"""The budget ledger against real SQLite files: arithmetic, refusals, atomicity, concurrency."""

from __future__ import annotations

import decimal
import math
import multiprocessing
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy import Engine, create_engine
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import OperationalError
from sqlalchemy.schema import CreateTable

from dpsweep.errors import ConfigError, PrivacyError
from sweeper.privacy.ledger import (
    BudgetExhausted,
    BudgetLedger,
    BudgetSummary,
    DatasetBudget,
    EntryKind,
    LedgerEntry,
    ReservationExceeded,
    SweepEnded,
    create_ledger_tables,
    summed_entries,
)
from sweeper.privacy.ledger.core import _budget_row_stmt
from sweeper.store.engine import create_ledger_engine

DS = "digits"
D = Decimal


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture(autouse=True)
def exact_decimals() -> Iterator[None]:
    # The tests' own Decimal arithmetic must be exact too (the default context rounds to 28
    # digits, and the exact value of a float like 0.1 has 55); any rounding raises.
    with decimal.localcontext() as ctx:
        ctx.prec = 5000
        ctx.traps[decimal.Inexact] = True
        yield


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    # pool_size >= the number of racing threads: every thread really holds its own connection.
    engine = create_ledger_engine(sqlite_url(tmp_path / "ledger.db"), pool_size=25)
    create_ledger_tables(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def ledger(engine: Engine) -> BudgetLedger:
    return BudgetLedger(engine)


def assert_consistent(ledger: BudgetLedger, dataset: str = DS) -> BudgetSummary:
    """The running totals equal the sums of the entries, and nothing is over its cap."""
    summary = ledger.summary(dataset)
    derived = summed_entries(ledger.entries(dataset))
    assert derived == {
        "epsilon_spent": summary.epsilon_spent,
        "delta_spent": summary.delta_spent,
        "epsilon_reserved": summary.epsilon_reserved,
        "delta_reserved": summary.delta_reserved,
    }
    assert summary.epsilon_spent >= 0 and summary.epsilon_reserved >= 0
    assert summary.delta_spent >= 0 and summary.delta_reserved >= 0
    # Each sweep's running totals (what a charge reads) equal the sums of its entries.
    from sqlalchemy.orm import Session

    with Session(ledger.engine) as session:
        for sweep_id in {e.sweep_id for e in ledger.entries(dataset)}:
            cached = ledger._balance(session, dataset, sweep_id)
            assert cached == ledger._balance_from_entries(session, dataset, sweep_id)
    if summary.epsilon_cap is not None:
        assert summary.epsilon_spent + summary.epsilon_reserved <= summary.epsilon_cap
    if summary.delta_cap is not None:
        assert summary.delta_spent + summary.delta_reserved <= summary.delta_cap
    return summary


# ---------------------------------------------------------------------------------------------
# Arithmetic and the entries recorded
# ---------------------------------------------------------------------------------------------


def test_reserve_charge_release_arithmetic(ledger: BudgetLedger) -> None:
    ledger.set_cap(DS, epsilon_cap=3.0, delta_cap=2**-10)
    reservation = ledger.reserve(DS, sweep_id="s1", epsilon=2.0, delta=2**-12, note="3 arms")
    assert reservation.kind is EntryKind.RESERVE
    assert (reservation.epsilon, reservation.delta) == (D(2), D(2**-12))
    assert reservation.trial_id is None and reservation.note == "3 arms"

    ledger.charge(DS, sweep_id="s1", trial_id="t1", epsilon=0.5, delta=2**-14)
    ledger.charge(DS, sweep_id="s1", trial_id="t2", epsilon=0.25, delta=2**-14)
    summary = assert_consistent(ledger)
    assert summary.epsilon_spent == D("0.75")
    assert summary.epsilon_reserved == D("1.25")
    assert summary.delta_spent == D(2**-13)
    assert summary.delta_reserved == D(2**-13)
    assert summary.remaining.epsilon == D(1)
    assert ledger.remaining(DS).delta == D(2**-10) - D(2**-12)

    balance = ledger.sweep_balance(DS, sweep_id="s1")
    assert balance.epsilon_outstanding == D("1.25")
    assert balance.epsilon_charged == D("0.75")

    released = ledger.release(DS, sweep_id="s1", note="sweep finished")
    # Only the part that was never charged comes back.
    assert released is not None and released.kind is EntryKind.RELEASE
    assert (released.epsilon, released.delta) == (D("1.25"), D(2**-13))

    summary = assert_consistent(ledger)
    assert summary.epsilon_spent == D("0.75")  # the charges persist after release
    assert summary.delta_spent == D(2**-13)
    assert summary.epsilon_reserved == 0 and summary.delta_reserved == 0
    assert summary.remaining.epsilon == D("2.25")

    entries = ledger.entries(DS)
    assert [e.kind for e in entries] == [
        EntryKind.RESERVE,
        EntryKind.CHARGE,
        EntryKind.CHARGE,
        EntryKind.RELEASE,
    ]
    assert [e.trial_id for e in entries] == [None, "t1", "t2", None]
    assert [e.id for e in entries] == sorted(e.id for e in entries)
    assert entries[-1].note == "sweep finished"
    assert all(e.sweep_id == "s1" and e.dataset == DS for e in entries)
    assert all(e.created_at.tzinfo is not None for e in entries)
    assert all(abs((datetime.now(UTC) - e.created_at).total_seconds()) < 60 for e in entries)


def test_release_twice_gives_nothing_more_and_other_sweeps_are_untouched(
    ledger: BudgetLedger,
) -> None:
    ledger.set_cap(DS, epsilon_cap=4.0)
    ledger.reserve(DS, sweep_id="a", epsilon=1.0, delta=0.0)
    ledger.reserve(DS, sweep_id="a", epsilon=0.5, delta=0.0)  # reservations add up
    ledger.reserve(DS, sweep_id="b", epsilon=2.0, delta=0.0)
    ledger.charge(DS, sweep_id="a", trial_id="t", epsilon=1.0, delta=0.0)

    first = ledger.release(DS, sweep_id="a")
    second = ledger.release(DS, sweep_id="a")
    assert first is not None and first.epsilon == D("0.5")
    assert second is not None and second.epsilon == 0
    summary = assert_consistent(ledger)
    assert summary.epsilon_spent == D(1)
    assert summary.epsilon_reserved == D(2)  # sweep b still holds its reservation
    assert [e.sweep_id for e in ledger.entries(DS, sweep_id="b")] == ["b"]
    assert len(ledger.entries(DS, sweep_id="a")) == 5
    # A released sweep cannot charge any more: its trials would be unreserved.
    with pytest.raises(ReservationExceeded):
        ledger.charge(DS, sweep_id="a", trial_id="late", epsilon=0.1, delta=0.0)
    # Releasing on a dataset the ledger has never seen is a no-op.
    assert ledger.release("never-seen", sweep_id="a") is None
    assert ledger.datasets() == [DS]


def test_amounts_are_exact_so_sums_cannot_drift_past_a_cap(ledger: BudgetLedger) -> None:
    # Ten float 0.1s sum to 0.9999999999999999 in float arithmetic, so a float ledger would
    # accept them under a cap of 1 -- but each float 0.1 is slightly more than 1/10, so the
    # true total is above the cap. The ledger adds exactly and refuses the tenth (fails closed).
    assert sum([0.1] * 10) <= 1.0
    ledger.set_cap(DS, epsilon_cap=1.0)
    for i in range(9):
        ledger.reserve(DS, sweep_id=f"f{i}", epsilon=0.1, delta=0.0)
    with pytest.raises(BudgetExhausted):
        ledger.reserve(DS, sweep_id="f9", epsilon=0.1, delta=0.0)
    assert ledger.summary(DS).epsilon_reserved == 9 * D(0.1)

    # Decimal amounts are decimal-exact: ten Decimal("0.1") fill a cap of 1 exactly.
    ledger.set_cap("dec", epsilon_cap=D(1))
    for i in range(10):
        ledger.reserve("dec", sweep_id=f"d{i}", epsilon=D("0.1"), delta=0.0)
    assert ledger.remaining("dec").epsilon == 0
    with pytest.raises(BudgetExhausted):
        ledger.reserve("dec", sweep_id="tiny", epsilon=5e-324, delta=0.0)

    # A reservation split into float thirds is charged in full, and what is left over is exact.
    ledger.set_cap("split", epsilon_cap=1.0)
    ledger.reserve("split", sweep_id="s", epsilon=1.0, delta=0.0)
    for trial in range(3):
        ledger.charge("split", sweep_id="s", trial_id=f"t{trial}", epsilon=1 / 3, delta=0.0)
    leftover = ledger.sweep_balance("split", sweep_id="s").epsilon_outstanding
    assert leftover == 1 - 3 * D(1 / 3) > 0
    ledger.charge("split", sweep_id="s", trial_id="t3", epsilon=leftover, delta=0.0)
    assert ledger.summary("split").epsilon_spent == 1
    assert_consistent(ledger, "split")


# ---------------------------------------------------------------------------------------------
# Refusals change nothing
# ---------------------------------------------------------------------------------------------


def test_over_cap_reservation_is_refused_with_a_helpful_message(ledger: BudgetLedger) -> None:
    ledger.set_cap(DS, epsilon_cap=1.0)
    ledger.reserve(DS, sweep_id="first", epsilon=0.75, delta=0.0)
    before = (ledger.summary(DS), ledger.entries(DS))

    with pytest.raises(BudgetExhausted) as info:
        ledger.reserve(DS, sweep_id="second", epsilon=0.5, delta=0.0)

    error = info.value
    assert isinstance(error, PrivacyError)
    message = str(error)
    assert "digits" in message and "second" in message and "epsilon" in message
    assert "0.5" in message  # what was asked
    assert "0.25 remains" in message  # what is left
    assert "1.0" in message  # the cap
    assert (error.quantity, error.requested, error.remaining) == ("epsilon", D("0.5"), D("0.25"))
    assert (ledger.summary(DS), ledger.entries(DS)) == before

    # Exactly what remains still fits.
    ledger.reserve(DS, sweep_id="second", epsilon=0.25, delta=0.0)
    assert ledger.remaining(DS).epsilon == 0


def test_near_equal_amounts_are_shown_exactly_in_the_message(ledger: BudgetLedger) -> None:
    ledger.set_cap(DS, epsilon_cap=1.0)
    ledger.reserve(DS, sweep_id="a", epsilon=1 / 3, delta=0.0)
    left = ledger.remaining(DS).epsilon
    assert left is not None
    assert D(float(left)) != left  # 1 - float(1/3) needs 54 bits: it is not a float itself
    asked = float(left)
    if D(asked) <= left:
        asked = math.nextafter(asked, math.inf)  # the smallest float that does not fit
    with pytest.raises(BudgetExhausted) as info:
        ledger.reserve(DS, sweep_id="b", epsilon=asked, delta=0.0)
    # Both print as 0.6666666666666667 when shortened; the message must not read "asked
    # 0.6666666666666667 but only 0.6666666666666667 remains", so it shows the exact values.
    assert str(left) in str(info.value) and str(D(asked)) in str(info.value)


def test_delta_cap_is_enforced(ledger: BudgetLedger) -> None:
    ledger.set_cap(DS, epsilon_cap=None, delta_cap=1e-5)
    ledger.reserve(DS, sweep_id="a", epsilon=100.0, delta=6e-6)
    before = ledger.summary(DS)
    with pytest.raises(BudgetExhausted) as info:
        ledger.reserve(DS, sweep_id="b", epsilon=0.0, delta=6e-6)
    assert info.value.quantity == "delta"
    assert "delta" in str(info.value)
    assert ledger.summary(DS) == before
    # ε is uncapped here: any ε is fine as long as δ fits.
    ledger.reserve(DS, sweep_id="c", epsilon=1e6, delta=4e-6)
    assert ledger.remaining(DS).epsilon is None
    assert_consistent(ledger)


def test_uncapped_datasets_record_everything_and_never_refuse(ledger: BudgetLedger) -> None:
    # Never capped: the first reservation creates the dataset's row.
    for i in range(3):
        ledger.reserve("open", sweep_id=f"s{i}", epsilon=1e6, delta=0.5)
    ledger.charge("open", sweep_id="s0", trial_id="t", epsilon=1e6, delta=0.5)
    summary = assert_consistent(ledger, "open")
    assert (summary.epsilon_cap, summary.delta_cap) == (None, None)
    assert summary.remaining.epsilon is None and summary.remaining.delta is None
    assert summary.epsilon_spent == D(10**6) and summary.epsilon_reserved == D(2 * 10**6)
    assert summary.delta_reserved == D(1)  # uncapped δ may add up past 1: it is bookkeeping
    assert len(ledger.entries("open")) == 4
    # A dataset the ledger has never seen reads as uncapped and untouched.
    assert ledger.summary("unknown") == BudgetSummary("unknown", None, None, *[D(0)] * 4)


def test_charging_beyond_the_reservation_fails_closed(ledger: BudgetLedger) -> None:
    ledger.set_cap(DS, epsilon_cap=10.0, delta_cap=1e-4)
    ledger.reserve(DS, sweep_id="s", epsilon=1.0, delta=1e-5)
    ledger.reserve(DS, sweep_id="other", epsilon=5.0, delta=1e-5)
    ledger.charge(DS, sweep_id="s", trial_id="t1", epsilon=0.75, delta=1e-6)
    before = (ledger.summary(DS), ledger.entries(DS))

    with pytest.raises(ReservationExceeded) as info:
        # The dataset has budget left, and sweep "other" holds plenty: neither may pay for s.
        ledger.charge(DS, sweep_id="s", trial_id="t2", epsilon=0.5, delta=0.0)
    assert isinstance(info.value, PrivacyError)
    assert info.value.outstanding == D("0.25") and info.value.requested == D("0.5")
    assert "'t2'" in str(info.value) and "0.25" in str(info.value)

    with pytest.raises(ReservationExceeded) as info:
        ledger.charge(DS, sweep_id="s", trial_id="t2", epsilon=0.1, delta=1e-5)
    assert info.value.quantity == "delta"

    with pytest.raises(ReservationExceeded, match="no reservation"):
        ledger.charge(DS, sweep_id="ghost", trial_id="t", epsilon=0.0, delta=0.0)
    with pytest.raises(ReservationExceeded, match="no reservation"):
        ledger.charge("unknown", sweep_id="s", trial_id="t", epsilon=0.1, delta=0.0)

    assert (ledger.summary(DS), ledger.entries(DS)) == before
    assert ledger.datasets() == [DS]  # the failed charge did not create a row for "unknown"


def test_set_cap_cannot_go_below_what_is_committed(ledger: BudgetLedger) -> None:
    ledger.set_cap(DS, epsilon_cap=2.0)
    ledger.reserve(DS, sweep_id="s", epsilon=1.0, delta=0.0)
    ledger.charge(DS, sweep_id="s", trial_id="t", epsilon=0.5, delta=0.0)
    with pytest.raises(ConfigError) as info:
        ledger.set_cap(DS, epsilon_cap=0.75)
    assert info.value.field == "epsilon_cap"
    assert ledger.summary(DS).epsilon_cap == 2
    # Tightening to exactly spent + reserved freezes the dataset.
    ledger.set_cap(DS, epsilon_cap=1.0)
    with pytest.raises(BudgetExhausted):
        ledger.reserve(DS, sweep_id="s2", epsilon=5e-324, delta=0.0)
    ledger.charge(DS, sweep_id="s", trial_id="t2", epsilon=0.5, delta=0.0)  # still allowed
    assert_consistent(ledger)
    # None removes the cap (set_cap sets both caps explicitly).
    ledger.set_cap(DS, epsilon_cap=None)
    ledger.reserve(DS, sweep_id="s3", epsilon=100.0, delta=0.0)


Op = Callable[[BudgetLedger, Any], object]


def _reserve(ledger: BudgetLedger, value: Any, field: str) -> object:
    kwargs: dict[str, Any] = {"sweep_id": "s", "epsilon": 0.1, "delta": 0.0}
    kwargs[field] = value
    return ledger.reserve(DS, **kwargs)


def _charge(ledger: BudgetLedger, value: Any, field: str) -> object:
    kwargs: dict[str, Any] = {"sweep_id": "s", "trial_id": "t", "epsilon": 0.1, "delta": 0.0}
    kwargs[field] = value
    return ledger.charge(DS, **kwargs)


def _set_cap(ledger: BudgetLedger, value: Any, field: str) -> object:
    return ledger.set_cap(DS, **{field: value})


@pytest.mark.parametrize(
    ("op", "field", "value"),
    [
        (_reserve, "epsilon", -0.1),
        (_reserve, "epsilon", math.nan),
        (_reserve, "epsilon", math.inf),
        (_reserve, "epsilon", D("Infinity")),
        (_reserve, "epsilon", True),
        (_reserve, "epsilon", "0.1"),
        (_reserve, "epsilon", None),
        (_reserve, "epsilon", Fraction(1, 3)),  # not exactly a float: would be rounded
        (_reserve, "epsilon", D("1e400")),
        (_reserve, "delta", -1e-9),
        (_reserve, "delta", 1.0),
        (_reserve, "delta", 1.5),
        (_reserve, "delta", math.nan),
        (_reserve, "sweep_id", ""),
        (_reserve, "sweep_id", "x" * 201),
        (_reserve, "note", 3),
        (_charge, "epsilon", -1.0),
        (_charge, "epsilon", math.inf),
        (_charge, "delta", 1.0),
        (_charge, "trial_id", ""),
        (_charge, "trial_id", None),
        (_set_cap, "epsilon_cap", -1.0),
        (_set_cap, "epsilon_cap", math.inf),
        (_set_cap, "delta_cap", 1.0),
        (_set_cap, "delta_cap", -0.5),
    ],
)
def test_invalid_inputs_raise_config_error_naming_the_field(
    ledger: BudgetLedger, op: Callable[[BudgetLedger, Any, str], object], field: str, value: Any
) -> None:
    ledger.set_cap(DS, epsilon_cap=5.0)
    ledger.reserve(DS, sweep_id="s", epsilon=1.0, delta=0.0)
    before = (ledger.summary(DS), ledger.entries(DS))
    with pytest.raises(ConfigError) as info:
        op(ledger, value, field)
    assert info.value.field == field
    assert field in str(info.value)
    assert (ledger.summary(DS), ledger.entries(DS)) == before


def test_dataset_key_is_validated(ledger: BudgetLedger) -> None:
    with pytest.raises(ConfigError) as info:
        ledger.reserve("  ", sweep_id="s", epsilon=0.1, delta=0.0)
    assert info.value.field == "dataset"


def test_other_numeric_types_are_accepted_exactly(ledger: BudgetLedger) -> None:
    ledger.reserve(DS, sweep_id="s", epsilon=2, delta=D("1e-5"))
    half: Any = Fraction(1, 2)  # typed as float | Decimal, but any exactly-a-float Real works
    ledger.reserve(DS, sweep_id="s", epsilon=half, delta=-0.0)
    summary = ledger.summary(DS)
    assert summary.epsilon_reserved == D("2.5") and summary.delta_reserved == D("1e-5")


def test_a_failure_inside_an_operation_rolls_it_back(
    ledger: BudgetLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger.set_cap(DS, epsilon_cap=2.0)
    ledger.reserve(DS, sweep_id="s", epsilon=1.0, delta=0.0)
    before = (ledger.summary(DS), ledger.entries(DS))

    def crash(*args: object, **kwargs: object) -> None:
        # Called after the running totals were updated, before the entry is written.
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(BudgetLedger, "_record", staticmethod(crash))
    with pytest.raises(RuntimeError):
        ledger.reserve(DS, sweep_id="s2", epsilon=0.5, delta=0.0)
    with pytest.raises(RuntimeError):
        ledger.charge(DS, sweep_id="s", trial_id="t", epsilon=0.5, delta=0.0)
    with pytest.raises(RuntimeError):
        ledger.release(DS, sweep_id="s")
    monkeypatch.undo()

    assert (ledger.summary(DS), ledger.entries(DS)) == before
    assert_consistent(ledger)


# ---------------------------------------------------------------------------------------------
# Engine configuration and the PostgreSQL path
# ---------------------------------------------------------------------------------------------


def test_sqlite_engine_must_come_from_create_ledger_engine(tmp_path: Path) -> None:
    plain = create_engine(sqlite_url(tmp_path / "plain.db"))
    try:
        with pytest.raises(ConfigError, match="create_ledger_engine") as info:
            BudgetLedger(plain)
        assert info.value.field == "engine"
    finally:
        plain.dispose()
    for url in ("sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"):
        with pytest.raises(ConfigError) as info:
            create_ledger_engine(url)
        assert info.value.field == "url"


def test_sqlite_transactions_take_the_write_lock_up_front(engine: Engine) -> None:
    # While one ledger transaction is open (it has only read so far), a second writer cannot
    # even begin: BEGIN IMMEDIATE took the lock before the read.
    fast = create_ledger_engine(str(engine.url), connect_args={"timeout": 0.05})
    try:
        with engine.begin() as holder:
            holder.exec_driver_sql("SELECT count(*) FROM dataset_budgets").all()
            with pytest.raises(OperationalError, match="locked"), fast.begin() as other:
                other.exec_driver_sql("SELECT 1").all()
    finally:
        fast.dispose()


def test_postgresql_locks_the_dataset_row_and_stores_exact_numerics() -> None:
    stmt = _budget_row_stmt(DS)
    assert "FOR UPDATE" in str(stmt.compile(dialect=postgresql.dialect()))
    assert "FOR UPDATE" not in str(stmt.compile(dialect=sqlite.dialect()))
    ddl = str(CreateTable(DatasetBudget.__table__).compile(dialect=postgresql.dialect()))  # type: ignore[arg-type]
    assert "epsilon_spent NUMERIC NOT NULL" in ddl
    ddl = str(CreateTable(LedgerEntry.__table__).compile(dialect=sqlite.dialect()))  # type: ignore[arg-type]
    assert "epsilon VARCHAR NOT NULL" in ddl  # text on SQLite, whose NUMERIC would be a float


# ---------------------------------------------------------------------------------------------
# Concurrency
# ---------------------------------------------------------------------------------------------


def _race(n: int, work: Callable[[int], object]) -> list[object]:
    """Run ``work(i)`` in ``n`` threads released together; return results or exceptions."""
    barrier = threading.Barrier(n)

    def one(i: int) -> object:
        barrier.wait()
        try:
            return work(i)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, range(n)))


@pytest.mark.parametrize("round_", range(3))
def test_twenty_threads_racing_for_one_cap_never_overspend(
    ledger: BudgetLedger, round_: int
) -> None:
    dataset = f"race-{round_}"
    ledger.set_cap(dataset, epsilon_cap=2.0)
    results = _race(20, lambda i: ledger.reserve(dataset, sweep_id=f"s{i}", epsilon=0.3, delta=0.0))
    failures = [r for r in results if isinstance(r, Exception)]
    assert all(isinstance(r, BudgetExhausted) for r in failures), failures
    assert len(results) - len(failures) == 6  # 6 * 0.3 <= 2.0 < 7 * 0.3
    summary = assert_consistent(ledger, dataset)
    assert summary.epsilon_reserved == 6 * D(0.3) <= 2
    assert len(ledger.entries(dataset)) == 6


def test_racing_sweeps_that_reserve_charge_and_release_stay_consistent(
    ledger: BudgetLedger,
) -> None:
    ledger.set_cap(DS, epsilon_cap=3.0, delta_cap=1e-4)
    stop = threading.Event()
    observed: list[BudgetSummary] = []

    def watch() -> None:
        # A reader sees only committed states, and every one of them is within the cap.
        while not stop.is_set():
            observed.append(ledger.summary(DS))

    def sweep(i: int) -> int:
        try:
            ledger.reserve(DS, sweep_id=f"s{i}", epsilon=0.5, delta=1e-5)
        except BudgetExhausted:
            return 0
        ledger.charge(DS, sweep_id=f"s{i}", trial_id="a", epsilon=0.2, delta=2e-6)
        ledger.charge(DS, sweep_id=f"s{i}", trial_id="b", epsilon=0.2, delta=2e-6)
        ledger.release(DS, sweep_id=f"s{i}")
        return 1

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = _race(16, sweep)
    finally:
        stop.set()
        watcher.join()
    assert not [r for r in results if isinstance(r, Exception)], results
    winners = sum(r for r in results if isinstance(r, int))
    assert winners >= 6  # at least the first 6 fit, more once early sweeps release
    summary = assert_consistent(ledger)
    assert summary.epsilon_reserved == 0 and summary.delta_reserved == 0
    assert summary.epsilon_spent == winners * 2 * D(0.2)
    assert summary.epsilon_spent <= 3
    spent_so_far = D(0)
    for state in observed:
        assert state.epsilon_spent + state.epsilon_reserved <= 3
        assert state.delta_spent + state.delta_reserved <= D(1e-4)
        assert state.epsilon_spent >= spent_so_far  # reads are in commit order, spent only grows
        spent_so_far = state.epsilon_spent


def test_first_use_of_a_dataset_from_many_threads_creates_one_row(ledger: BudgetLedger) -> None:
    results = _race(12, lambda i: ledger.reserve("fresh", sweep_id=f"s{i}", epsilon=1, delta=0))
    assert not [r for r in results if isinstance(r, Exception)], results
    assert ledger.datasets() == ["fresh"]
    assert ledger.summary("fresh").epsilon_reserved == 12
    assert_consistent(ledger, "fresh")


def _reserve_in_process(url: str, barrier: Any, results: Any, attempts: int) -> None:
    """Child process body: its own engine on the shared file, racing the other processes."""
    try:
        engine = create_ledger_engine(url)
        ledger = BudgetLedger(engine)
        barrier.wait(timeout=60)
        won = 0
        for attempt in range(attempts):
            try:
                ledger.reserve(
                    "shared", sweep_id=f"p{os.getpid()}-{attempt}", epsilon=0.3, delta=0.0
                )
                won += 1
            except BudgetExhausted:
                pass
        engine.dispose()
        results.put(won)
    except BaseException as exc:  # report anything to the parent instead of dying silently
        results.put(repr(exc))


def test_processes_racing_on_one_file_never_overspend(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "shared.db")
    engine = create_ledger_engine(url)
    try:
        create_ledger_tables(engine)
        ledger = BudgetLedger(engine)
        ledger.set_cap("shared", epsilon_cap=2.0)

        ctx = multiprocessing.get_context("spawn")
        n_procs, attempts = 4, 4
        barrier = ctx.Barrier(n_procs)
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_reserve_in_process, args=(url, barrier, results, attempts))
            for _ in range(n_procs)
        ]
        for proc in procs:
            proc.start()
        try:
            outcomes = [results.get(timeout=120) for _ in procs]
        except queue.Empty:  # pragma: no cover - only when a child hangs
            pytest.fail("a child process did not report")
        finally:
            for proc in procs:
                proc.join(timeout=30)
        assert all(isinstance(o, int) for o in outcomes), outcomes
        assert sum(o for o in outcomes if isinstance(o, int)) == 6
        summary = assert_consistent(ledger, "shared")
        assert summary.epsilon_reserved == 6 * D(0.3) <= 2
    finally:
        engine.dispose()


# ---------------------------------------------------------------------------------------------
# Property: any sequence of operations keeps spent + reserved <= cap and spent non-decreasing
# ---------------------------------------------------------------------------------------------

AMOUNTS = st.one_of(
    st.sampled_from([0.0, 0.1, 0.25, 0.3, 1 / 3, 0.5, 1.0, 2.0]),
    st.floats(min_value=0.0, max_value=3.0, allow_nan=False, allow_infinity=False),
    st.decimals(min_value=0, max_value=3, places=3),
)
DELTAS = st.one_of(
    st.sampled_from([0.0, 1e-6, 1e-5]),
    st.floats(min_value=0.0, max_value=5e-5, allow_nan=False),
)
SWEEPS = st.sampled_from(["s1", "s2", "s3"])


class LedgerMachine(RuleBasedStateMachine):
    """Random reserve/charge/release sequences, checked against an exact model."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="ledger-hyp-")
        self.engine = create_ledger_engine(sqlite_url(Path(self.directory) / "ledger.db"))
        create_ledger_tables(self.engine)
        self.ledger = BudgetLedger(self.engine)
        self.caps: dict[str, Decimal | None] = {"epsilon": None, "delta": None}
        self.spent = {"epsilon": D(0), "delta": D(0)}
        # The model: (sweep, quantity) -> [reserved, charged, released], all exact.
        self.model: dict[tuple[str, str], list[Decimal]] = {}
        self.reserved_sweeps: set[str] = set()
        self.ended: set[str] = set()  # released: the ledger takes nothing more for them
        self.trials = 0

    @initialize(
        epsilon_cap=st.none() | st.floats(min_value=0.0, max_value=5.0),
        delta_cap=st.none() | st.floats(min_value=0.0, max_value=1e-4),
    )
    def set_caps(self, epsilon_cap: float | None, delta_cap: float | None) -> None:
        self.ledger.set_cap(DS, epsilon_cap=epsilon_cap, delta_cap=delta_cap)
        self.caps = {
            "epsilon": None if epsilon_cap is None else D(epsilon_cap),
            "delta": None if delta_cap is None else D(delta_cap),
        }

    def _entry(self, sweep: str, quantity: str) -> list[Decimal]:
        return self.model.setdefault((sweep, quantity), [D(0), D(0), D(0)])

    def _outstanding(self, sweep: str, quantity: str) -> Decimal:
        reserved, charged, released = self._entry(sweep, quantity)
        return reserved - charged - released

    def _committed(self, quantity: str) -> Decimal:
        spent = sum((v[1] for (_, q), v in self.model.items() if q == quantity), D(0))
        held = sum((self._outstanding(s, q) for (s, q) in self.model if q == quantity), D(0))
        return spent + held

    @rule(sweep=SWEEPS, epsilon=AMOUNTS, delta=DELTAS)
    def reserve(self, sweep: str, epsilon: float | Decimal, delta: float) -> None:
        asked = {"epsilon": D(epsilon), "delta": D(delta)}
        fits = all(
            cap is None or self._committed(quantity) + asked[quantity] <= cap
            for quantity, cap in self.caps.items()
        )
        before = self.ledger.summary(DS)
        try:
            self.ledger.reserve(DS, sweep_id=sweep, epsilon=epsilon, delta=delta)
        except SweepEnded:
            assert sweep in self.ended
            assert self.ledger.summary(DS) == before
            return
        except BudgetExhausted:
            assert not fits
            assert self.ledger.summary(DS) == before
            return
        assert fits and sweep not in self.ended
        for quantity in asked:
            self._entry(sweep, quantity)[0] += asked[quantity]
        self.reserved_sweeps.add(sweep)

    @rule(sweep=SWEEPS, epsilon=AMOUNTS, delta=DELTAS)
    def charge(self, sweep: str, epsilon: float | Decimal, delta: float) -> None:
        self.trials += 1
        asked = {"epsilon": D(epsilon), "delta": D(delta)}
        allowed = (
            sweep in self.reserved_sweeps
            and sweep not in self.ended
            and all(asked[quantity] <= self._outstanding(sweep, quantity) for quantity in asked)
        )
        before = self.ledger.summary(DS)
        try:
            self.ledger.charge(
                DS, sweep_id=sweep, trial_id=f"t{self.trials}", epsilon=epsilon, delta=delta
            )
        except ReservationExceeded as exc:
            assert not allowed
            assert isinstance(exc, SweepEnded) == (sweep in self.ended)
            assert self.ledger.summary(DS) == before
            return
        assert allowed
        for quantity in asked:
            self._entry(sweep, quantity)[1] += asked[quantity]

    @rule(sweep=SWEEPS)
    def release(self, sweep: str) -> None:
        expected = {q: self._outstanding(sweep, q) for q in ("epsilon", "delta")}
        record = self.ledger.release(DS, sweep_id=sweep)
        assert record is not None  # set_caps created the dataset's row
        assert (record.epsilon, record.delta) == (expected["epsilon"], expected["delta"])
        for quantity, amount in expected.items():
            self._entry(sweep, quantity)[2] += amount
        self.ended.add(sweep)

    @invariant()
    def within_caps_and_spent_only_grows(self) -> None:
        summary = assert_consistent(self.ledger)  # also: totals == sums of the entries
        for quantity, cap in self.caps.items():
            spent: Decimal = getattr(summary, f"{quantity}_spent")
            reserved: Decimal = getattr(summary, f"{quantity}_reserved")
            if cap is not None:
                assert spent + reserved <= cap
            assert spent >= self.spent[quantity]
            self.spent[quantity] = spent
            assert spent + reserved == self._committed(quantity)
            assert spent == sum((v[1] for (_, q), v in self.model.items() if q == quantity), D(0))

    def teardown(self) -> None:
        self.engine.dispose()
        shutil.rmtree(self.directory, ignore_errors=True)


LedgerMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerProperties = LedgerMachine.TestCase
