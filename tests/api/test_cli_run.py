"""``dpsweep run`` on a spec whose newest sweep has finished: its results are shown, nothing is
reserved or spent, and only ``--new`` starts (and spends) another sweep. No Ray: the finished
sweeps are made with the store's own functions, and ``--new`` stops at the driver."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from api.cli import main
from dpsweep.errors import DpsweepError
from dpsweep.spec import load_spec
from sweeper.datasets.identity import ledger_key_of
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.store import Sweep, SweepState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.lifecycle import cancel_sweep, find_finished

SPEC = {
    "name": "again",
    "dataset": {"name": "digits"},
    "model": {"name": "logreg"},
    "training": {"steps": 10, "batch_size": 64, "eval_every": 5},
    "privacy": {"budgets": [2], "delta": 1e-5},
    "arms": [{"strategy": "fixed", "grid": {"lr": [0.05, 0.5], "clip": [1.0]}}],
}


@dataclass
class Db:
    url: str
    engine: Any
    spec: Path


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Db]:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    upgrade(url)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    engine = make_engine(url)
    yield Db(url, engine, spec)
    engine.dispose()


def _state(db: Db) -> tuple[int, Any, int]:
    """The number of sweeps, the dataset's ledger totals and its number of entries."""
    with Session(db.engine) as s:
        sweeps = s.scalar(sa.select(sa.func.count()).select_from(Sweep))
    ledger = BudgetLedger(db.engine)
    key = ledger_key_of(db.engine, "digits")
    return int(sweeps or 0), ledger.summary(key), len(ledger.entries(key))


def _set_state(db: Db, sweep_id: str, state: SweepState) -> None:
    with Session(db.engine) as s, s.begin():
        s.execute(sa.update(Sweep).where(Sweep.id == sweep_id).values(state=state))


def _run(db: Db, *extra: str) -> int:
    return main(["run", str(db.spec), "--db", db.url, "--quiet", *extra])


def test_a_done_spec_shows_its_results_and_spends_nothing(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = create_sweep(db.engine, load_spec(db.spec))
    _set_state(db, sid, SweepState.done)
    assert find_finished(db.engine, load_spec(db.spec)) == (sid, SweepState.done)
    before = _state(db)
    assert _run(db) == 0
    out, err = (" ".join(text.split()) for text in capsys.readouterr())
    assert f"sweep {sid} again on digits" in out
    assert "nothing was run or spent" in err and "--new" in err
    assert _state(db) == before
    assert _run(db, "--json") == 0
    assert f'"id": "{sid}"' in capsys.readouterr().out
    assert _state(db) == before


def test_a_cancelled_spec_exits_1_and_spends_nothing(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = create_sweep(db.engine, load_spec(db.spec))
    cancel_sweep(db.engine, sid)
    before = _state(db)
    assert _run(db) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"sweep {sid} of this spec ended cancelled" in err and "--new" in err
    assert _state(db) == before


def test_new_starts_another_sweep(
    db: Db, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = create_sweep(db.engine, load_spec(db.spec))
    _set_state(db, sid, SweepState.done)
    sweeps, summary, entries = _state(db)

    def not_run(*args: Any, **kwargs: Any) -> Any:
        raise DpsweepError("stopped before the driver (test)")

    monkeypatch.setattr("sweeper.driver.loop.run_sweep", not_run)
    assert _run(db, "--new") == 1
    assert "stopped before the driver" in capsys.readouterr().err
    now, now_summary, now_entries = _state(db)
    assert now == sweeps + 1 and now_entries > entries
    assert now_summary.epsilon_reserved > summary.epsilon_reserved
    # The new sweep is unfinished: a plain run resumes it (not the done one).
    assert find_finished(db.engine, load_spec(db.spec)) is None
