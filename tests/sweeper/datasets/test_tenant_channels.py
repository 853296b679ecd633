"""What one tenant could learn of the others through the numbers the server shows, on SQLite
and PostgreSQL: audit-log ids, sweep event ids, a built-in set's budget, and whether a grant
names a tenant at all (issue 36).

Each test interleaves another tenant's activity with the reader's and checks that nothing the
reader gets moves with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DatasetNotFound
from sweeper.datasets import grants
from sweeper.datasets.access import Viewer
from sweeper.datasets.analyst_views import audit_page
from sweeper.datasets.identity import view_key
from sweeper.datasets.views import budget, list_datasets
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.store.tokens import create_token
from sweeper.sweeps import events
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.summary import summarize
from tests.sweeper.datasets.test_analyst_views import _log, _sweep, _upload

OLGA, ANA, BEA, MALLORY = Viewer("olga"), Viewer("ana"), Viewer("bea"), Viewer("mallory")
ADMIN = Viewer("root", admin=True)


@pytest.fixture
def engine(both_engines: Any) -> Any:
    return both_engines


def _ids(page: Any) -> list[int]:
    return [e["id"] for e in page.items]


def test_audit_ids_number_the_readers_own_log(engine: Any, tmp_path: Path) -> None:
    ds = _upload(engine, tmp_path, "olga")
    for who in ("ana", "bea"):
        grants.grant(engine, ds, who, epsilon_allowance=5, viewer=OLGA, confirm=True)
    other = _upload(engine, tmp_path, "mallory")
    ana, bea, mal = (
        _sweep(engine, ds, "ana"),
        _sweep(engine, ds, "bea"),
        _sweep(engine, other, "mallory"),
    )
    # Everyone's releases interleave in the global table.
    _log(engine, mal, ["m1", "m2"])
    _log(engine, ana, ["a1"])
    _log(engine, bea, ["b1", "b2"])
    _log(engine, mal, ["m3"])
    _log(engine, ana, ["a2", "a3"])

    # Each analyst's ids count their own releases only: 1, 2, 3 whatever others did.
    mine = audit_page(engine, ds, ANA)
    assert [e["trial_id"] for e in mine.items] == ["a1", "a2", "a3"] and _ids(mine) == [1, 2, 3]
    assert _ids(audit_page(engine, ds, BEA)) == [1, 2]
    # The owner numbers every release on their dataset (never Mallory's, on her own name).
    owner = audit_page(engine, ds, OLGA)
    assert [e["trial_id"] for e in owner.items] == ["a1", "b1", "b2", "a2", "a3"]
    assert _ids(owner) == [1, 2, 3, 4, 5]
    # Filtered, the owner's numbers stay those of their log; after= takes them.
    assert _ids(audit_page(engine, ds, OLGA, analyst="ana")) == [1, 4, 5]
    assert _ids(audit_page(engine, ds, OLGA, analyst="ana", after=1)) == [4, 5]
    assert [e["trial_id"] for e in audit_page(engine, ds, ANA, after=1).items] == ["a2", "a3"]
    # Pages by cursor give the same numbers.
    first = audit_page(engine, ds, ANA, limit=2)
    assert _ids(first) == [1, 2]
    assert _ids(audit_page(engine, ds, ANA, cursor=first.next_cursor)) == [3]
    # An admin reads the dataset's ledger's log, numbered in it: Mallory's upload is a
    # ledger of her own (whether her records equal Olga's is nobody's business).
    assert _ids(audit_page(engine, ds, ADMIN)) == [1, 2, 3, 4, 5]


def test_sweep_event_ids_number_the_sweeps_own_events(engine: Any, tmp_path: Path) -> None:
    ds = _upload(engine, tmp_path, "olga")
    grants.grant(engine, ds, "ana", epsilon_allowance=5, viewer=OLGA, confirm=True)
    theirs = _sweep(engine, ds, "olga")

    def emit(sweep_id: str, n: int) -> None:
        with Session(engine) as s, s.begin():
            events.lock_sweep(s, sweep_id)
            for i in range(n):
                events.emit(s, sweep_id, events.METRIC, {"step": i})

    emit(theirs, 3)
    mine = _sweep(engine, ds, "ana")
    emit(mine, 2)
    emit(theirs, 4)  # between two of the analyst's events
    emit(mine, 1)
    seen = events.read_events(engine, mine)
    assert [e.id for e in seen] == list(range(1, len(seen) + 1))
    # Resuming after any of them gives exactly the rest, numbered as before.
    for n in range(len(seen) + 1):
        assert events.read_events(engine, mine, after=n) == seen[n:]
    rows = events.read_numbered(engine, mine, after=2)
    assert [e for e, _ in rows] == seen[2:]
    # A stream's own cursor (the row id of the last event sent) gives the same.
    (_, row), *_ = events.read_numbered(engine, mine, after=1, limit=1)
    assert [e for e, _ in events.read_numbered(engine, mine, after=2, after_row=row)] == seen[2:]


def _digits(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "dataset": {"name": "digits"},
        "model": {"name": "logreg"},
        "training": {"steps": 4, "batch_size": 32, "eval_every": 2},
        "privacy": {"budgets": [1], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }


def test_a_builtin_shows_a_tenant_their_own_spending(engine: Any) -> None:
    create_sweep(engine, _digits("bea's"), owner="bea")
    create_sweep(engine, _digits("bea's again"), owner="bea")
    mine = create_sweep(engine, _digits("ana's"), owner="ana")
    key = view_key(engine, "digits")
    ledger = BudgetLedger(engine)
    own = ledger.sweep_balance(key, sweep_id=mine).epsilon_outstanding
    total = ledger.summary(key)
    assert total.epsilon_reserved > own > 0

    b = budget(engine, "digits", ANA)
    assert b["epsilon_reserved"] == pytest.approx(float(own)) and b["epsilon_committed"] == 0
    assert b["scope"] == "yours"
    assert [s["sweep"] for s in b["sweeps"]] == [mine]
    (listed,) = [d["budget"] for d in list_datasets(engine, ANA) if d["id"] == "digits"]
    assert listed["scope"] == "yours" and listed["epsilon_reserved"] == b["epsilon_reserved"]
    assert budget(engine, "digits", MALLORY)["epsilon_reserved"] == 0
    # Capped, what is left is the cap less their own spending.
    ledger.set_cap(key, epsilon_cap=50, delta_cap=None)
    b = budget(engine, "digits", ANA)
    assert b["epsilon_cap"] == 50
    assert b["epsilon_remaining"] == pytest.approx(float(50 - own))
    # Their sweep's dataset-lifetime figure is theirs too.
    life = summarize(engine, mine)["privacy"]["dataset_lifetime"]
    assert life["scope"] == "tenant" and life["epsilon_reserved"] == pytest.approx(float(own))
    # Admins and local use see the records' totals.
    for viewer in (ADMIN, Viewer(owner=None)):
        b = budget(engine, "digits", viewer)
        assert b["scope"] == "records"
        assert b["epsilon_reserved"] == pytest.approx(float(total.epsilon_reserved))
        assert len(b["sweeps"]) == 3


def test_a_grant_to_a_name_no_token_has_needs_confirming(engine: Any, tmp_path: Path) -> None:
    ds = _upload(engine, tmp_path, "olga")
    # No token at all (local use): refused, saying how to go on.
    with pytest.raises(ConfigError) as exc:
        grants.grant(engine, ds, "ana", epsilon_allowance=1, viewer=OLGA)
    assert exc.value.field == "analyst" and "no API token exists yet" in str(exc.value)
    assert "confirm" in str(exc.value) and "dpsweep token create --name ana" in str(exc.value)
    assert grants.list_grants(engine, ds, OLGA) == []
    create_token(engine, name="ana")
    assert grants.grant(engine, ds, "ana", epsilon_allowance=1, viewer=OLGA)["active"]
    with pytest.raises(ConfigError) as exc:
        grants.grant(engine, ds, "anna", epsilon_allowance=1, viewer=OLGA)
    assert exc.value.field == "analyst" and "no API token has the name 'anna'" in str(exc.value)
    g = grants.grant(engine, ds, "anna", epsilon_allowance=1, viewer=OLGA, confirm=True)
    assert g["analyst"] == "anna" and g["active"]
    # Only the dataset's owner learns whether a name has a token.
    with pytest.raises(DatasetNotFound):
        grants.grant(engine, ds, "nobody", epsilon_allowance=1, viewer=MALLORY)
