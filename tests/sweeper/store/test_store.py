"""The store on a real SQLite file and a real PostgreSQL server: migrations and round trips."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError
from sweeper.privacy.ledger import BudgetExhausted, BudgetLedger
from sweeper.store import Dataset, MetricPoint, Sweep, Trial, TrialResultRow, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import (
    VERSION_TABLE,
    current_revision,
    downgrade,
    head_revision,
    require_head,
    upgrade,
)
from tests.conftest import fresh_postgres_database

TABLES = {
    "datasets",
    "sweeps",
    "trials",
    "metric_points",
    "trial_results",
    "dataset_budgets",
    "budget_ledger_entries",
    "sweep_events",
    "api_tokens",
    "idempotency_keys",
    "service_heartbeats",
    "model_artifacts",
    "staged_models",
    "dataset_grants",
    "release_records",
    "ledger_sweep_totals",
    "audits",
    VERSION_TABLE,
}
# What migrations 0003 and later add (downgrading to 0002 removes them).
SINCE_0003 = {
    "sweep_events",
    "api_tokens",
    "idempotency_keys",
    "service_heartbeats",
    "model_artifacts",
    "staged_models",
    "dataset_grants",
    "release_records",
    "ledger_sweep_totals",
    "audits",
}


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    # A fresh database per test on the shared server.
    return fresh_postgres_database(request.getfixturevalue("postgres_url"), str(tmp_path))


def test_migrations_upgrade_from_empty_and_downgrade(url: str) -> None:
    with pytest.raises(ConfigError, match="run `dpsweep db upgrade` first"):
        require_head(url)
    upgrade(url)
    assert current_revision(url) == head_revision()
    require_head(url)
    engine = sa.create_engine(url)
    assert set(sa.inspect(engine).get_table_names()) == TABLES
    # Down to 0002 removes the API's tables and the uploads' columns.
    downgrade(url, "0002")
    assert set(sa.inspect(engine).get_table_names()) == TABLES - SINCE_0003
    assert "owner" not in {c["name"] for c in sa.inspect(engine).get_columns("datasets")}
    # One step down removes 0002's columns and keeps the data model of 0001.
    downgrade(url, "-1")
    assert current_revision(url) == "0001"
    cols = {c["name"] for c in sa.inspect(engine).get_columns("sweeps")}
    assert "heartbeat_at" not in cols and "spec_hash" not in cols
    assert "number" not in {c["name"] for c in sa.inspect(engine).get_columns("trials")}
    downgrade(url, "-1")
    assert set(sa.inspect(engine).get_table_names()) == {VERSION_TABLE}
    upgrade(url)
    assert set(sa.inspect(engine).get_table_names()) == TABLES
    cols = {c["name"] for c in sa.inspect(engine).get_columns("trials")}
    assert {"number", "config", "train_seconds"} <= cols
    engine.dispose()


def test_migrations_match_the_models(url: str) -> None:
    """The schema the migrations build is the one the models describe (no drift)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from sweeper.store import metadata

    upgrade(url)
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE, "compare_type": False}
        )
        diff = [d for d in compare_metadata(ctx, metadata) if d[0] != "remove_table"]
    engine.dispose()
    assert diff == []


def test_round_trip_and_cascade(url: str) -> None:
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as s, s.begin():
        s.add(Dataset(name="digits", config={"name": "digits"}, n_examples=1797))
        sweep = Sweep(
            name="demo",
            dataset="digits",
            spec={"name": "demo"},
            owner="ada",
            plan=[{"arm": "fixed", "noise_multiplier": 1.2}],
        )
        sweep.trials = [
            Trial(
                arm="fixed",
                strategy="fixed",
                epsilon_budget=3.0,
                params={"lr": 0.1, "clip": 1},
                seed=s_,
                noise_multiplier=1.2,
                target_delta=1e-5,
            )
            for s_ in range(3)
        ]
        s.add(sweep)
        s.flush()
        t0 = sweep.trials[0]
        t0.state = TrialState.done
        t0.metrics = [MetricPoint(step=i, name="accuracy", value=0.1 * i) for i in range(5)]
        t0.result = TrialResultRow(
            metrics={"accuracy": 0.4, "ece": 0.1},
            final_metrics={"accuracy": 0.38},
            epsilon=2.9,
            delta=1e-5,
            accountant="pld",
            steps=100,
            best_step=80,
            reliability=[{"lower": 0.0, "upper": 0.1, "count": 3}],
            trajectories={"step": [50, 100], "clip": [1.0, 1.0]},
            step_time_ms_median=1.5,
        )
        sweep_id = sweep.id
    with Session(engine) as s:
        got = s.get(Sweep, sweep_id)
        assert got is not None and got.owner == "ada" and len(got.trials) == 3
        done = [t for t in got.trials if t.state == TrialState.done]
        assert len(done) == 1 and done[0].result is not None
        assert done[0].result.trajectories["clip"] == [1.0, 1.0]
        assert sorted(m.value for m in done[0].metrics) == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
        assert got.created_at.tzinfo is not None or engine.dialect.name == "sqlite"
    with Session(engine) as s, s.begin():
        s.delete(s.get(Sweep, sweep_id))
    with Session(engine) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Trial)) == 0
        assert s.scalar(sa.select(sa.func.count()).select_from(MetricPoint)) == 0
        assert s.scalar(sa.select(sa.func.count()).select_from(TrialResultRow)) == 0
    engine.dispose()


def test_ledger_on_the_migrated_schema_never_overspends(url: str) -> None:
    upgrade(url)
    engine = make_engine(url)
    ledger = BudgetLedger(engine)
    ledger.set_cap("digits", epsilon_cap=2.0)
    wins: list[bool] = []
    lock = threading.Lock()

    def race(i: int) -> None:
        try:
            ledger.reserve("digits", sweep_id=f"s{i}", epsilon=0.3, delta=0.0)
            ok = True
        except BudgetExhausted:
            ok = False
        with lock:
            wins.append(ok)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(wins) == 6
    summary = ledger.summary("digits")
    assert summary.epsilon_reserved <= 2 and summary.remaining.epsilon is not None
    assert summary.remaining.epsilon >= 0
    engine.dispose()


def test_cli_db_upgrade(tmp_path: Path) -> None:
    target = f"sqlite:///{tmp_path / 'cli.db'}"
    exe = Path(sys.executable).parent / "dpsweep"
    p = subprocess.run(
        [str(exe), "db", "upgrade", "--db", target],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr
    assert f"schema revision {head_revision()}" in p.stdout
    assert current_revision(target) == head_revision()


def test_migration_0008_sums_existing_entries_into_sweep_totals(url: str) -> None:
    """A ledger written before the running totals gets them from its entries, exactly."""
    from decimal import Decimal

    from sweeper.store.types import ExactDecimal

    upgrade(url, "0007")
    engine = sa.create_engine(url)
    amount = ExactDecimal()
    entries = sa.table(
        "budget_ledger_entries",
        sa.column("dataset", sa.String()),
        sa.column("sweep_id", sa.String()),
        sa.column("trial_id", sa.String()),
        sa.column("kind", sa.String()),
        sa.column("epsilon", amount),
        sa.column("delta", amount),
        sa.column("note", sa.String()),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    budgets = sa.table(
        "dataset_budgets",
        sa.column("dataset", sa.String()),
        *(
            sa.column(c, amount)
            for c in ("epsilon_spent", "delta_spent", "epsilon_reserved", "delta_reserved")
        ),
        sa.column("created_at", sa.DateTime(timezone=True)),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    d = Decimal
    with engine.begin() as conn:
        conn.execute(
            budgets.insert().values(
                dataset="k",
                epsilon_spent=d("0.3"),
                delta_spent=d(0),
                epsilon_reserved=d("0.7"),
                delta_reserved=d("1e-5"),
                created_at=now,
                updated_at=now,
            )
        )
        rows = [
            ("s1", None, "reserve", d("1"), d("1e-5")),
            ("s1", "t1", "charge", d("0.1"), d(0)),
            ("s1", "t2", "charge", d("0.2"), d(0)),
            ("s2", None, "reserve", d("0.5"), d(0)),
            ("s2", None, "release", d("0.5"), d(0)),
        ]
        for sweep, trial, kind, e, dl in rows:
            conn.execute(
                entries.insert().values(
                    dataset="k",
                    sweep_id=sweep,
                    trial_id=trial,
                    kind=kind,
                    epsilon=e,
                    delta=dl,
                    note="",
                    created_at=now,
                )
            )
    engine.dispose()
    upgrade(url)
    engine = make_engine(url)
    ledger = BudgetLedger(engine)
    with Session(engine) as session:
        for sweep in ("s1", "s2"):
            cached = ledger._balance(session, "k", sweep)
            assert cached == ledger._balance_from_entries(session, "k", sweep)
        s1 = ledger._balance(session, "k", "s1")
    assert s1.epsilon_charged == d("0.3") and s1.reservations == 1
    assert s1.epsilon_outstanding == d("0.7")
    # And the ledger goes on from them: a charge past the outstanding amount is refused.
    ledger.charge("k", sweep_id="s1", trial_id="t3", epsilon=d("0.7"), delta=0)
    with pytest.raises(Exception, match="holds only"):
        ledger.charge("k", sweep_id="s1", trial_id="t4", epsilon=0.01, delta=0)
    engine.dispose()
