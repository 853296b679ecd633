"""Analysts racing for their allowance on PostgreSQL: 30 identical sweeps submitted at once.

Each thread has its own engine (its own connections), and every thread is released by one
barrier into :func:`~sweeper.sweeps.create.create_sweep` with the same prepared plan, so the
race is on the reservation itself: the allowance is checked under the dataset's budget-row lock
(``SELECT ... FOR UPDATE``), the same lock as the lifetime cap. Exactly as many sweeps as fit
pass; the rest are refused whole (nothing stored, nothing reserved).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from dpsweep.spec import load_spec
from sweeper.datasets import grants
from sweeper.datasets.resolution import resolve
from sweeper.privacy.charges import exact_sum
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.errors import AllowanceExhausted, BudgetExhausted
from sweeper.privacy.ledger.rows import EntryKind, LedgerEntry
from sweeper.store import Sweep
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import PreparedSweep, create_sweep, prepare_sweep
from tests.conftest import fresh_postgres_database
from tests.sweeper.datasets.test_grants import OWNER, _spec, _upload

N = 30


@pytest.fixture
def url(postgres_url: str, tmp_path: Path) -> str:
    """A fresh PostgreSQL database for the test, migrated."""
    u = fresh_postgres_database(postgres_url, str(tmp_path))
    upgrade(u)
    return u


@pytest.fixture
def engine(url: str) -> Iterator[Any]:
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _race(url: str, n: int, work: Callable[[Any, int], object]) -> list[object]:
    """Run ``work(engine, i)`` in ``n`` threads, each with its own engine, released together;
    return each result or exception."""
    engines = [make_engine(url, pool_size=1, max_overflow=2) for _ in range(n)]
    for e in engines:  # connect before the barrier: the race is on the reservation
        with e.connect():
            pass
    barrier = threading.Barrier(n)

    def one(i: int) -> object:
        barrier.wait()
        try:
            return work(engines[i], i)
        except Exception as exc:
            return exc

    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            return list(pool.map(one, range(n)))
    finally:
        for e in engines:
            e.dispose()


def _setup(engine: Any, tmp_path: Path) -> tuple[str, dict[str, Any], PreparedSweep, Decimal, str]:
    """An owner's upload with a large cap; a spec planned once; one sweep's reservation as
    read from the ledger (the owner's first sweep); the records' ledger key."""
    ds = _upload(engine, tmp_path, cap=1000.0)
    spec = _spec(ds, budgets=[1])
    loaded = load_spec(spec)
    # Planned once and reused by every racer: the race is on the reservation, not the plan.
    prepared = prepare_sweep(loaded, dataset=resolve(engine, loaded.dataset, loaded.eval))
    first = create_sweep(engine, spec, owner=OWNER.owner, prepared=prepared)
    with Session(engine) as s:
        key = s.scalar(sa.select(Sweep.ledger_key).where(Sweep.id == first))
    assert key is not None
    ((r, who),) = _reservations(engine, key)
    assert r == exact_sum([s.reserved_epsilon for s in prepared.schedules]) and 0 < r <= 1
    assert who == OWNER.owner
    return ds, spec, prepared, r, key


def _times(k: int, r: Decimal) -> Decimal:
    return exact_sum([r] * k)


def _analyst_sweeps(engine: Any, analyst: str) -> list[str]:
    with Session(engine) as s:
        return list(s.scalars(sa.select(Sweep.id).where(Sweep.owner == analyst)))


def _reservations(engine: Any, key: str) -> list[tuple[Decimal, str | None]]:
    """Every reserve entry on ``key``: its ε and whose sweep reserved it."""
    with Session(engine) as s:
        rows = s.execute(
            sa.select(LedgerEntry.epsilon, LedgerEntry.principal)
            .where(LedgerEntry.dataset == key, LedgerEntry.kind == EntryKind.RESERVE)
            .order_by(LedgerEntry.id)
        ).all()
    return [(e, p) for e, p in rows]


def _reserved_by(engine: Any, key: str, analyst: str) -> list[Decimal]:
    return [e for e, who in _reservations(engine, key) if who == analyst]


def test_thirty_sweeps_racing_for_one_allowance(engine: Any, url: str, tmp_path: Path) -> None:
    ds, spec, prepared, r, key = _setup(engine, tmp_path)
    k = 7
    grants.grant(engine, ds, "ana", epsilon_allowance=_times(k, r), viewer=OWNER, confirm=True)
    results = _race(url, N, lambda e, i: create_sweep(e, spec, owner="ana", prepared=prepared))
    ok = [x for x in results if isinstance(x, str)]
    refused = [x for x in results if not isinstance(x, str)]
    assert all(isinstance(x, AllowanceExhausted) for x in refused), refused
    assert len(ok) == k and len(refused) == N - k
    # Only the sweeps that passed were stored and reserved; exactly k reservations, exactly.
    assert sorted(_analyst_sweeps(engine, "ana")) == sorted(ok)
    assert _reserved_by(engine, key, "ana") == [r] * k
    # What the analyst holds is exactly k reservations: the whole allowance, never above it.
    assert grants.usage(engine, key, "ana") == _times(k, r)
    (listed,) = grants.list_grants(engine, ds, OWNER)
    assert Decimal(listed["epsilon_used"]) == Decimal(float(_times(k, r)))
    # The lifetime cap holds everyone together: the owner's sweep and the analyst's.
    summary = BudgetLedger(engine).summary(key)
    assert summary.epsilon_reserved == _times(k + 1, r)
    assert summary.epsilon_cap is not None
    assert summary.epsilon_spent + summary.epsilon_reserved <= summary.epsilon_cap
    # The refusals say why without naming the records' identity.
    assert all("allowance" in str(x) and "sha256" not in str(x) for x in refused)


@pytest.mark.parametrize(
    ("allow_ana", "allow_bob", "room"),
    [
        (4, 6, 15),  # the allowances bind: exactly 4 and 6 pass, the cap has room left
        (10, 10, 15),  # the cap binds: 15 pass in all, neither analyst past 10
    ],
)
def test_two_analysts_racing_are_bound_by_their_allowances_and_the_cap(
    engine: Any, url: str, tmp_path: Path, allow_ana: int, allow_bob: int, room: int
) -> None:
    ds, spec, prepared, r, key = _setup(engine, tmp_path)
    # The cap leaves room for `room` sweeps besides the owner's.
    BudgetLedger(engine).set_cap(key, epsilon_cap=_times(1 + room, r))
    allowed = {"ana": allow_ana, "bob": allow_bob}
    for who, k in allowed.items():
        grants.grant(engine, ds, who, epsilon_allowance=_times(k, r), viewer=OWNER, confirm=True)
    who_of = ["ana" if i % 2 == 0 else "bob" for i in range(N)]  # 15 requests each
    results = _race(url, N, lambda e, i: create_sweep(e, spec, owner=who_of[i], prepared=prepared))
    won = {
        who: [x for x, w in zip(results, who_of, strict=True) if w == who and isinstance(x, str)]
        for who in allowed
    }
    refused = [x for x in results if not isinstance(x, str)]
    # Refused by the analyst's own allowance or by the lifetime cap, for nothing else.
    assert all(isinstance(x, AllowanceExhausted | BudgetExhausted) for x in refused), refused
    passed = min(room, allow_ana + allow_bob)
    assert len(won["ana"]) + len(won["bob"]) == passed
    if allow_ana + allow_bob <= room:
        assert {who: len(ids) for who, ids in won.items()} == allowed
        assert all(isinstance(x, AllowanceExhausted) for x in refused)
    for who, ids in won.items():
        assert len(ids) <= allowed[who]
        assert sorted(_analyst_sweeps(engine, who)) == sorted(ids)
        assert _reserved_by(engine, key, who) == [r] * len(ids)
        assert grants.usage(engine, key, who) == _times(len(ids), r) <= _times(allowed[who], r)
    summary = BudgetLedger(engine).summary(key)
    assert summary.epsilon_cap == _times(1 + room, r)
    assert summary.epsilon_reserved == _times(1 + passed, r) <= summary.epsilon_cap
