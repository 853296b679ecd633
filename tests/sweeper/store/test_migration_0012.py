"""Migration 0012 splits identity ledgers that several tenants' uploads shared, by owner,
without losing, duplicating or merging an entry."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sweeper.privacy.ledger import BudgetLedger
from sweeper.privacy.ledger.rows import DatasetBudget, LedgerEntry, SweepTotals
from sweeper.store import Audit, Dataset, ReleaseRecord, Sweep, SweepState
from sweeper.store.engine import create_ledger_engine
from sweeper.store.schema import upgrade
from tests.conftest import fresh_postgres_database

SHARED = "a" * 64  # uploaded by olga and (as a guess) by ana: no unowned name
MIXED = "b" * 64  # the operator's registered name and olga's upload of the same records
OLD, OLD_MIXED = f"sha256:{SHARED}", f"sha256:{MIXED}"


@pytest.fixture(params=["sqlite", "postgresql"])
def url_at_0011(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
    else:
        url = fresh_postgres_database(request.getfixturevalue("postgres_url"), str(tmp_path))
    upgrade(url, "0011")
    return url


def _fill(engine: sa.Engine) -> None:
    """Shared ledgers as code before 0012 wrote them."""
    with Session(engine) as s, s.begin():
        for name, owner, content in (
            ("ds_olga", "olga", SHARED),
            ("ds_ana", "ana", SHARED),
            ("reg", None, MIXED),
            ("ds_olga2", "olga", MIXED),
        ):
            s.add(Dataset(name=name, owner=owner, content_sha256=content, config={}))
        for sid, name, owner, key in (
            ("s_olga", "ds_olga", "olga", OLD),
            ("s_ana", "ds_ana", "ana", OLD),
            ("s_grant", "ds_olga", "bea", OLD),  # an analyst's sweep on olga's upload
            ("s_reg", "reg", None, OLD_MIXED),
            ("s_olga2", "ds_olga2", "olga", OLD_MIXED),
        ):
            s.add(
                Sweep(
                    id=sid,
                    name=sid,
                    dataset=name,
                    spec={},
                    state=SweepState.done,
                    owner=owner,
                    ledger_key=key,
                )
            )
        s.add(Audit(id="x1", owner="olga", dataset="ds_olga", request={}))
    # Today's ledger code writes the old rows: it reads a column of a later migration (0013's
    # privacy_unit), there only while it writes; the upgrade under test then runs without it.
    with engine.begin() as c:
        c.execute(sa.text("ALTER TABLE dataset_budgets ADD COLUMN privacy_unit VARCHAR(200)"))
    _fill_ledger(engine)
    with engine.begin() as c:
        c.execute(sa.text("ALTER TABLE dataset_budgets DROP COLUMN privacy_unit"))


def _fill_ledger(engine: sa.Engine) -> None:
    ledger = BudgetLedger(engine)
    ledger.set_cap(OLD, epsilon_cap=3.5, delta_cap=None)  # ana's upload lowered olga's cap
    runs = [
        (OLD, "s_olga", "olga", "1.0", "0.75", ""),
        (OLD, "s_ana", "ana", "0.5", "0.5", ""),
        (OLD, "s_grant", "bea", "0.25", "0.125", ""),
        (OLD, "audit_x1", "olga", "0.3", "0.3", ""),
        (OLD, "train_t1", None, "0.2", "0.2", "dpsweep train: one fixed run on 'ds_ana'"),
        (OLD, "s_gone", "ana", "0.1", "0.1", ""),  # a deleted sweep: its principal says
        (OLD_MIXED, "s_reg", None, "0.4", "0.4", ""),
        (OLD_MIXED, "s_olga2", "olga", "0.6", "0.25", ""),
    ]
    for key, sid, principal, reserved, charged, note in runs:
        ledger.reserve(
            key, sweep_id=sid, epsilon=Decimal(reserved), delta=0, note=note, principal=principal
        )
        ledger.charge(key, sweep_id=sid, trial_id=sid, epsilon=Decimal(charged), delta=0, note=note)
    ledger.release(OLD, sweep_id="s_olga")
    with Session(engine) as s, s.begin():
        for sid, name, key in (("s_olga", "ds_olga", OLD), ("s_ana", "ds_ana", OLD)):
            s.add(
                ReleaseRecord(
                    dataset=key,
                    dataset_name=name,
                    principal=None,
                    sweep_id=sid,
                    trial_id=sid,
                    kind="trial",
                    epsilon=Decimal("0.5"),
                    delta=Decimal(0),
                    detail={},
                )
            )


def test_shared_ledgers_split_by_owner_and_nothing_is_lost(url_at_0011: str) -> None:
    engine = create_ledger_engine(url_at_0011)
    _fill(engine)
    with Session(engine) as s:
        before = {e.id: (e.sweep_id, e.kind, e.epsilon) for e in s.scalars(sa.select(LedgerEntry))}
    upgrade(url_at_0011)
    olga, ana = f"{OLD}/olga", f"{OLD}/ana"
    with Session(engine) as s:
        after = {e.id: e for e in s.scalars(sa.select(LedgerEntry))}
        # Every entry kept, once, unchanged but for its ledger.
        assert {i: (e.sweep_id, e.kind, e.epsilon) for i, e in after.items()} == before
        where = {e.sweep_id: e.dataset for e in after.values()}
        assert where == {
            "s_olga": olga,
            "s_grant": olga,  # charged on the owner's ledger, as the analyst's sweeps are
            "audit_x1": olga,
            "s_ana": ana,
            "train_t1": ana,  # by the name in its note
            "s_gone": ana,  # by its principal
            "s_reg": OLD_MIXED,  # the operator's name keeps the identity's ledger
            "s_olga2": f"{OLD_MIXED}/olga",
        }
        keys = {b.dataset: b for b in s.scalars(sa.select(DatasetBudget))}
        assert OLD not in keys  # no name reads it, nothing is left on it
        assert keys[olga].epsilon_cap == keys[ana].epsilon_cap == Decimal("3.5")
        assert keys[olga].epsilon_spent == Decimal("1.175")
        assert keys[olga].epsilon_reserved == Decimal("0.125")  # bea's sweep still holds it
        assert keys[ana].epsilon_spent == Decimal("0.8")
        assert keys[ana].epsilon_reserved == Decimal("0")
        assert keys[OLD_MIXED].epsilon_spent == Decimal("0.4")
        assert keys[f"{OLD_MIXED}/olga"].epsilon_reserved == Decimal("0.35")
        totals = {t.sweep_id: t.dataset for t in s.scalars(sa.select(SweepTotals))}
        assert totals == where
        sweeps = {x.id: x.ledger_key for x in s.scalars(sa.select(Sweep))}
        assert sweeps["s_olga"] == olga and sweeps["s_ana"] == ana
        assert sweeps["s_reg"] == OLD_MIXED
        releases = {r.sweep_id: r.dataset for r in s.scalars(sa.select(ReleaseRecord))}
        assert releases == {"s_olga": olga, "s_ana": ana}
    # The release log is append-only again.
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as c:
        c.execute(sa.text("UPDATE release_records SET dataset = 'x'"))
    # Each ledger's cached totals equal its entries' (the ledger's own reading).
    ledger = BudgetLedger(engine)
    for key in (olga, ana, OLD_MIXED, f"{OLD_MIXED}/olga"):
        summary = ledger.summary(key)
        charged = sum(
            (e.epsilon for e in ledger.entries(key) if e.kind.value == "charge"), Decimal(0)
        )
        assert summary.epsilon_spent == charged
    engine.dispose()
