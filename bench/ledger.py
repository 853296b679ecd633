"""The budget ledger under many charges: N charges of one sweep, on SQLite and PostgreSQL.

Each charge is a real ledger transaction (:meth:`sweeper.privacy.ledger.BudgetLedger.charge`):
the dataset's budget row locked, the sweep's outstanding reservation checked, the entry and
the sweep's running totals written, committed (SQLite: WAL, synchronous FULL). A charge used
to sum every earlier entry of its sweep (O(entries)); with the running totals
(``ledger_sweep_totals``, migration 0008) it reads one row, and it runs as prebuilt Core
statements on the driver's cursor (no ORM session): O(1). On PostgreSQL a charge is the pool's
ping and two pipelined round trips of prepared statements (``sweeper.privacy.ledger.driver_pq``).
Targets (issue 25): 10,000 charges in < 5 s on SQLite and < 10 s on PostgreSQL.

The PostgreSQL figure uses a throwaway server (``api.testing.postgres``); it is skipped with a
note where the server binaries are missing. After the charges the books are checked: the
sweep's totals equal the sum of its entries, exactly.

Usage: ``python bench/ledger.py [--charges N] [--json]``. It prints
``{"sqlite": {"charges": N, "seconds": S}, "postgresql": {"charges": N, "seconds": S}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = {"sqlite": 5.0, "postgresql": 10.0}  # seconds for 10,000 charges


def charge_many(url: str, charges: int) -> dict[str, Any]:
    """Reserve for ``charges`` trials, then charge them one at a time; time the charges."""
    from sqlalchemy.orm import Session

    from sweeper.privacy.ledger.budget_ledger import BudgetLedger
    from sweeper.store.engine import make_engine
    from sweeper.store.schema import upgrade

    upgrade(url)
    engine = make_engine(url)
    ledger = BudgetLedger(engine)
    per = Decimal("0.001")
    ledger.reserve("bench", sweep_id="s", epsilon=per * charges, delta=Decimal(0))
    t0 = time.perf_counter()
    for i in range(charges):
        ledger.charge("bench", sweep_id="s", trial_id=f"t{i}", epsilon=per, delta=Decimal(0))
    seconds = time.perf_counter() - t0
    with Session(engine) as session:
        cached = ledger._balance(session, "bench", "s")
        summed = ledger._balance_from_entries(session, "bench", "s")
    engine.dispose()
    if cached != summed or cached.epsilon_charged != per * charges:
        raise SystemExit(f"the books disagree: {cached} vs {summed}")
    return {"charges": charges, "seconds": round(seconds, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--charges", type=int, default=10_000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out["sqlite"] = charge_many(f"sqlite:///{Path(tmp) / 'ledger.db'}", args.charges)
    try:
        from api.testing.postgres import PostgresMissing, throwaway_postgres

        with throwaway_postgres() as base:
            out["postgresql"] = charge_many(base, args.charges)
    except PostgresMissing as exc:
        out["postgresql"] = {"charges": 0, "seconds": None, "skipped": str(exc)}
    if args.json:
        print(json.dumps(out))
        return 0
    for name, r in out.items():
        if r.get("seconds") is None:
            print(f"{name:>10}: skipped ({r.get('skipped')})")
            continue
        per_10k = r["seconds"] * 10_000 / max(1, r["charges"])
        print(
            f"{name:>10}: {r['charges']} charges in {r['seconds']:.2f} s "
            f"({per_10k:.2f} s per 10,000; target < {TARGETS[name]:g} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
