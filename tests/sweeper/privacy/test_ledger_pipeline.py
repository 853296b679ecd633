"""The ledger's pipelined path on PostgreSQL (psycopg): the totals read in the same round trip
as the dataset's lock must still see what the previous holder committed, and an error inside a
pipeline must surface as SQLAlchemy's, roll everything back and leave a usable connection."""

from __future__ import annotations

import contextlib
import decimal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from sweeper.privacy.ledger import BudgetLedger, EntryKind, ReservationExceeded
from sweeper.privacy.ledger.driver_pq import numbered
from sweeper.privacy.ledger.driver_sql import touched
from sweeper.privacy.ledger.statements import lock_and_read
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.conftest import fresh_postgres_database
from tests.sweeper.privacy.books import DS, assert_books

D = Decimal
# Not a binary fraction, and 31 significant digits: any rounding or float on the way shows.
STEP = D("0.1000000000000000000000000000001")


@pytest.fixture(autouse=True)
def exact_decimals() -> Iterator[None]:
    with decimal.localcontext() as ctx:
        ctx.prec = 5000
        ctx.traps[decimal.Inexact] = True
        yield


@pytest.fixture
def url(postgres_url: str, request: pytest.FixtureRequest) -> str:
    url = fresh_postgres_database(postgres_url, request.node.nodeid)
    upgrade(url)
    return url


@pytest.fixture
def engine(url: str) -> Iterator[Engine]:
    engine = make_engine(url, pool_size=20)
    yield engine
    engine.dispose()


def test_placeholders_are_numbered_once_per_name() -> None:
    sql = numbered("SELECT %(a)s, %(b)s::INTEGER, %(a)s, '100%%' WHERE x = %(c)s")
    assert sql.sql == b"SELECT $1, $2::INTEGER, $1, '100%' WHERE x = $3"
    assert sql.order == ("a", "b", "c")


def test_many_threads_racing_take_exactly_what_was_reserved(engine: Engine) -> None:
    # 16 threads, 3 tries each, for a reservation of exactly 20 charges. A totals read that
    # ran on a snapshot from before the lock was granted would let more than 20 through.
    ledger = BudgetLedger(engine)
    ledger.set_cap(DS, epsilon_cap=D(100))
    ledger.reserve(DS, sweep_id="s", epsilon=STEP * 20, delta=D("2e-9"))
    barrier = threading.Barrier(16)

    def charge(i: int) -> int:
        barrier.wait()
        won = 0
        for j in range(3):
            try:
                ledger.charge(DS, sweep_id="s", trial_id=f"t{i}-{j}", epsilon=STEP, delta=D(0))
                won += 1
            except ReservationExceeded:
                pass
        return won

    with ThreadPoolExecutor(max_workers=16) as pool:
        won = sum(pool.map(charge, range(16)))
    assert won == 20
    balance = ledger.sweep_balance(DS, sweep_id="s")
    assert balance.epsilon_charged == STEP * 20 and balance.epsilon_outstanding == 0
    assert ledger.summary(DS).epsilon_spent == STEP * 20
    assert_books(ledger)


def test_a_release_racing_charges_gives_back_exactly_what_was_left(engine: Engine) -> None:
    # A release computes what it gives back from the totals it read: from a stale read it
    # would give back what a charge had just taken, and the books would not add up.
    ledger = BudgetLedger(engine)
    ledger.reserve(DS, sweep_id="s", epsilon=STEP * 40, delta=D(0))
    barrier = threading.Barrier(9)

    def charge(i: int) -> None:
        barrier.wait()
        for j in range(4):
            with contextlib.suppress(ReservationExceeded):
                ledger.charge(DS, sweep_id="s", trial_id=f"t{i}-{j}", epsilon=STEP, delta=D(0))

    def release() -> None:
        barrier.wait()
        ledger.release(DS, sweep_id="s")

    with ThreadPoolExecutor(max_workers=9) as pool:
        done = [pool.submit(charge, i) for i in range(8)] + [pool.submit(release)]
        for future in done:
            future.result()
    balance = ledger.sweep_balance(DS, sweep_id="s")
    assert balance.epsilon_charged + balance.epsilon_released == STEP * 40
    assert balance.epsilon_outstanding == 0
    summary = ledger.summary(DS)
    assert summary.epsilon_reserved == 0 and summary.epsilon_spent == balance.epsilon_charged
    assert_books(ledger)


def _fail_on(engine: Engine, trial_id: str, errcode: str) -> None:
    # A real failure of the write statement, from the server, after the lock and the read
    # succeeded (the entry's INSERT is the pipelined write's last part).
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"""CREATE FUNCTION refuse_entry() RETURNS trigger AS $$
            BEGIN
                IF NEW.trial_id = '{trial_id}' THEN
                    RAISE EXCEPTION 'refused by the test' USING ERRCODE = '{errcode}';
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql"""
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse_entry BEFORE INSERT ON budget_ledger_entries "
            "FOR EACH ROW EXECUTE FUNCTION refuse_entry()"
        )


@pytest.mark.parametrize(
    ("errcode", "raised"), [("check_violation", IntegrityError), ("P0001", ProgrammingError)]
)
def test_an_error_in_the_pipelined_write_rolls_everything_back(
    url: str, errcode: str, raised: type[Exception]
) -> None:
    # One pooled connection: the operations after the failure reuse the very connection the
    # failed pipeline ran on, so it must come back out of pipeline mode and its transaction.
    engine = make_engine(url, pool_size=1, max_overflow=0, pool_timeout=10)
    try:
        ledger = BudgetLedger(engine)
        ledger.reserve(DS, sweep_id="s", epsilon=STEP * 3, delta=D(0))
        ledger.charge(DS, sweep_id="s", trial_id="ok-1", epsilon=STEP, delta=D(0))
        _fail_on(engine, "boom", errcode)
        before = (ledger.summary(DS), ledger.entries(DS), ledger.sweep_balance(DS, sweep_id="s"))
        with pytest.raises(raised, match="refused by the test"):
            ledger.charge(DS, sweep_id="s", trial_id="boom", epsilon=STEP, delta=D(0))
        after = (ledger.summary(DS), ledger.entries(DS), ledger.sweep_balance(DS, sweep_id="s"))
        assert after == before
        # The lock was released and the connection is clean: the next charges go through.
        ledger.charge(DS, sweep_id="s", trial_id="ok-2", epsilon=STEP, delta=D(0))
        ledger.release(DS, sweep_id="s")
        balance = ledger.sweep_balance(DS, sweep_id="s")
        assert balance.epsilon_charged == STEP * 2 and balance.epsilon_released == STEP
        assert_books(ledger)
    finally:
        engine.dispose()


def test_an_error_in_the_first_round_trip_rolls_back_and_releases(url: str) -> None:
    # The lock times out while another transaction holds the dataset's row: the error comes
    # from the pipeline that also carried BEGIN; nothing is recorded, and once the holder is
    # gone the same (only) connection charges again.
    engine = make_engine(
        url, pool_size=1, max_overflow=0, connect_args={"options": "-c lock_timeout=200"}
    )
    holder_engine = make_engine(url)
    try:
        ledger = BudgetLedger(engine)
        ledger.reserve(DS, sweep_id="s", epsilon=STEP * 2, delta=D(0))
        before = (ledger.summary(DS), ledger.entries(DS))
        with holder_engine.begin() as holder:
            holder.execute(
                sa.text("SELECT id FROM dataset_budgets WHERE dataset = :d FOR UPDATE"), {"d": DS}
            ).all()
            with pytest.raises(OperationalError, match="lock"):
                ledger.charge(DS, sweep_id="s", trial_id="t1", epsilon=STEP, delta=D(0))
        assert (ledger.summary(DS), ledger.entries(DS)) == before
        ledger.charge(DS, sweep_id="s", trial_id="t1", epsilon=STEP, delta=D(0))
        assert ledger.sweep_balance(DS, sweep_id="s").epsilon_charged == STEP
        assert_books(ledger)
    finally:
        holder_engine.dispose()
        engine.dispose()


def test_a_dropped_connection_is_replaced_before_the_next_charge(url: str) -> None:
    # The pool's pre-ping stays on: a pooled connection whose server session was killed is
    # replaced at checkout, and the charge goes through on a new one.
    engine = make_engine(url, pool_size=1, max_overflow=0)
    admin = make_engine(url)
    try:
        ledger = BudgetLedger(engine)
        ledger.reserve(DS, sweep_id="s", epsilon=STEP * 2, delta=D(0))
        ledger.charge(DS, sweep_id="s", trial_id="t1", epsilon=STEP, delta=D(0))
        with engine.connect() as conn:
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        with admin.begin() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        ledger.charge(DS, sweep_id="s", trial_id="t2", epsilon=STEP, delta=D(0))
        assert ledger.sweep_balance(DS, sweep_id="s").epsilon_charged == STEP * 2
        assert_books(ledger)
    finally:
        admin.dispose()
        engine.dispose()


def test_statements_dropped_from_the_session_are_prepared_again(url: str) -> None:
    # One pooled connection, whose prepared statements are dropped between operations: by
    # hand (DEALLOCATE ALL), and by psycopg itself (it deallocates everything when a rollback
    # clears its own cache of statements it prepared, here a query run 6 times).
    engine = make_engine(url, pool_size=1, max_overflow=0)
    try:
        ledger = BudgetLedger(engine)
        ledger.reserve(DS, sweep_id="s", epsilon=STEP * 3, delta=D(0))
        ledger.charge(DS, sweep_id="s", trial_id="t1", epsilon=STEP, delta=D(0))
        with engine.connect() as conn:
            conn.exec_driver_sql("DEALLOCATE ALL")
        ledger.charge(DS, sweep_id="s", trial_id="t2", epsilon=STEP, delta=D(0))
        with engine.connect() as conn:
            for _ in range(6):
                conn.exec_driver_sql("SELECT count(*) FROM budget_ledger_entries").all()
            conn.rollback()
        ledger.release(DS, sweep_id="s")
        balance = ledger.sweep_balance(DS, sweep_id="s")
        assert balance.epsilon_charged == STEP * 2 and balance.epsilon_released == STEP
        assert [e.trial_id for e in ledger.entries(DS)] == [None, "t1", "t2", None]
        assert_books(ledger)
    finally:
        engine.dispose()


def test_a_first_reservation_racing_on_a_new_dataset_prepares_nothing_stale(url: str) -> None:
    # A first reservation creates the dataset's row between its two round trips (through
    # SQLAlchemy, with a savepoint): its write must not count on statements prepared before.
    engine = make_engine(url, pool_size=8)
    try:
        ledger = BudgetLedger(engine)
        ledger.reserve("warm", sweep_id="s", epsilon=STEP, delta=D(0))
        barrier = threading.Barrier(8)

        def reserve(i: int) -> None:
            barrier.wait()
            ledger.reserve(f"new{i % 2}", sweep_id=f"s{i}", epsilon=STEP, delta=D(0))

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(reserve, range(8)))
        for dataset in ("new0", "new1"):
            assert ledger.summary(dataset).epsilon_reserved == STEP * 4
            assert_books(ledger, dataset)
    finally:
        engine.dispose()


def test_statements_dropped_inside_an_operation_fail_it_closed_unless_announced(
    url: str,
) -> None:
    # Statements dropped between an operation's two round trips: announced (touched, as the
    # ledger's own SQLAlchemy statements are), the write goes unprepared and succeeds; not
    # announced, the write fails, nothing is recorded, and the next operation prepares anew.
    engine = make_engine(url, pool_size=1, max_overflow=0)
    try:
        ledger = BudgetLedger(engine)
        ledger.reserve(DS, sweep_id="s", epsilon=STEP * 4, delta=D(0))
        ledger.charge(DS, sweep_id="s", trial_id="t1", epsilon=STEP, delta=D(0))

        def charge_dropping(trial_id: str, *, announce: bool) -> None:
            with engine.begin() as conn:
                budget, totals = lock_and_read(conn, DS, "s", create=False)
                assert budget is not None and totals is not None
                if announce:
                    touched(conn)
                conn.exec_driver_sql("DEALLOCATE ALL")
                budget.epsilon_reserved -= STEP
                budget.epsilon_spent += STEP
                ledger._record(
                    conn,
                    budget=budget,
                    totals=totals,
                    sweep_id="s",
                    trial_id=trial_id,
                    kind=EntryKind.CHARGE,
                    epsilon=STEP,
                    delta=D(0),
                    note="",
                )

        charge_dropping("t2", announce=True)
        # Prepares its three statements anew (the first round trip finds them gone, and is
        # sent again), so that the next write runs a statement that is then dropped.
        ledger.charge(DS, sweep_id="s", trial_id="t3", epsilon=STEP, delta=D(0))
        before = (ledger.summary(DS), ledger.entries(DS))
        with pytest.raises(ProgrammingError, match="does not exist"):
            charge_dropping("t4", announce=False)
        assert (ledger.summary(DS), ledger.entries(DS)) == before
        ledger.charge(DS, sweep_id="s", trial_id="t5", epsilon=STEP, delta=D(0))
        assert [e.trial_id for e in ledger.entries(DS)] == [None, "t1", "t2", "t3", "t5"]
        assert ledger.sweep_balance(DS, sweep_id="s").epsilon_outstanding == 0
        assert_books(ledger)
    finally:
        engine.dispose()


def test_a_connection_killed_inside_a_pipeline_fails_the_charge_and_is_replaced(
    url: str,
) -> None:
    # The charge's first round trip waits for the dataset's lock, held by another
    # transaction; its server session is killed meanwhile. The charge fails (nothing is
    # recorded) and the next one runs on a new connection.
    engine = make_engine(url, pool_size=1, max_overflow=0)
    admin = make_engine(url)
    try:
        ledger = BudgetLedger(engine)
        ledger.reserve(DS, sweep_id="s", epsilon=STEP * 2, delta=D(0))
        with admin.connect() as holder:
            holder.execute(
                sa.text("SELECT id FROM dataset_budgets WHERE dataset = :d FOR UPDATE"), {"d": DS}
            ).all()
            with ThreadPoolExecutor(max_workers=1) as pool:
                charging = pool.submit(
                    ledger.charge, DS, sweep_id="s", trial_id="t1", epsilon=STEP, delta=D(0)
                )
                with admin.connect() as killer:
                    for _ in range(200):  # up to 10 s for the charge to wait on the lock
                        killed = killer.exec_driver_sql(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                        ).all()
                        if killed:
                            break
                        threading.Event().wait(0.05)
                    assert killed
                with pytest.raises(OperationalError):
                    charging.result(timeout=30)
            holder.rollback()
        assert [e.trial_id for e in ledger.entries(DS)] == [None]
        ledger.charge(DS, sweep_id="s", trial_id="t2", epsilon=STEP, delta=D(0))
        assert ledger.sweep_balance(DS, sweep_id="s").epsilon_charged == STEP
        assert_books(ledger)
    finally:
        admin.dispose()
        engine.dispose()
