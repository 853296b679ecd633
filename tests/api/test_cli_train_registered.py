"""``dpsweep train --dataset NAME`` on a name registered with ``dpsweep datasets register``.

The name is resolved as a spec's ``dataset.name`` is: the owner's view of the records applies
(split settings and the declared size, from which q is taken), the run is charged on the
ledger the name was bound to at registration, and refused input charges nothing. Every
command is the installed ``dpsweep`` console script, on a real SQLite database.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

DPSWEEP = shutil.which("dpsweep", path=str(Path(sys.executable).parent)) or "dpsweep"
FAST = ["--model", "logreg", "--epochs", "1", "--batch-size", "32", "--eval-every", "10"]


def dpsweep(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120", "DPSWEEP_DATABASE_URL": db}
    return subprocess.run(
        [DPSWEEP, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def write_csv(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int)
    rows = (",".join(f"{v:.5f}" for v in r) + f",{lab}" for r, lab in zip(x, y, strict=True))
    path.write_text("a,b,c,d,target\n" + "\n".join(rows) + "\n")


def test_train_by_registered_name_uses_the_owners_view_and_its_ledger(tmp_path: Path) -> None:
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from sweeper.datasets.identity import ledger_key_of
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger
    from sweeper.privacy.ledger.rows import EntryKind
    from sweeper.store import Dataset
    from sweeper.store.engine import make_engine

    db = f"sqlite:///{tmp_path / 'owner.db'}"
    data = tmp_path / "clinic.csv"
    write_csv(data, 200, seed=0)
    p = dpsweep("datasets", "register", str(data), "--name", "clinic", "--label-column",
                "target", db=db)  # fmt: skip
    assert p.returncode == 0, p.stderr
    # The owner's view: a quarter held out, and 400 records declared (q and T come from it).
    p = dpsweep("datasets", "policy", "clinic", "--test-fraction", "0.25", "--n-examples", "400",
                db=db)  # fmt: skip
    assert p.returncode == 0, p.stderr

    # A private dataset's budget is spent for good: without --yes (and no terminal to ask on)
    # the run shows its charge and is refused, charging and binding nothing.
    p = dpsweep("train", "--dataset", "clinic", "--epsilon", "1", "--json", *FAST, db=db)
    assert p.returncode == 1 and not p.stdout, p.stderr
    said = " ".join(p.stderr.split())  # rich wraps lines
    assert "this run charges ε" in said and "to the lifetime budget of 'clinic'" in said
    assert "spent or reserved so far ε 0" in said and "nothing was charged" in said
    assert "--yes" in said
    probe = make_engine(db)
    try:
        assert float(BudgetLedger(probe).summary(ledger_key_of(probe, "clinic")).epsilon_spent) == 0
        with Session(probe) as session:
            assert [d.name for d in session.scalars(select(Dataset)).all()] == ["clinic"]
    finally:
        probe.dispose()

    p = dpsweep("train", "--dataset", "clinic", "--epsilon", "1", "--json", "--yes", *FAST, db=db)
    assert p.returncode == 0, p.stderr
    assert "confirmed by --yes" in p.stderr
    out = json.loads(p.stdout)
    # n_train as a sweep's plan takes it: 400 declared - round(400 * 0.25) held out = 300.
    assert out["sample_rate"] == pytest.approx(32 / 300)
    assert out["dataset"] == "clinic" and out["ledger"]["dataset"] == "clinic"
    charged = out["ledger"]["epsilon_charged"]
    assert charged == pytest.approx(out["epsilon"]) and 0.5 < charged <= 1.0

    engine = make_engine(db)
    try:
        with Session(engine) as session:
            stored = session.scalars(select(Dataset)).all()
            # No new name (no csv:PATH binding): the registration's row, its identity unchanged.
            assert [(d.name, d.content_sha256) for d in stored] == [
                ("clinic", stored[0].content_sha256)
            ]
        key = ledger_key_of(engine, "clinic")
        assert key == f"sha256:{stored[0].content_sha256}"
        ledger = BudgetLedger(engine)
        assert float(ledger.summary(key).epsilon_spent) == charged
        charges = [e for e in ledger.entries(key) if e.kind == EntryKind.CHARGE]
        assert [e.sweep_id for e in charges] == [out["ledger"]["run"]]

        # A sweep naming the same dataset is planned with the same q, and reserves on the same
        # ledger: one resolution (create_sweep is what `dpsweep run` and the API call).
        from sweeper.store import Sweep
        from sweeper.sweeps.create import create_sweep

        sweep_id = create_sweep(
            engine,
            {
                "name": "clinic-check",
                "dataset": {"name": "clinic"},
                "model": {"name": "logreg"},
                "training": {"epochs": 1, "batch_size": 32, "eval_every": 10},
                "privacy": {"budgets": [1], "delta": 1e-5},
                "arms": [{"strategy": "fixed", "grid": {"lr": [0.5]}}],
            },
        )
        with Session(engine) as session:
            sweep = session.get(Sweep, sweep_id)
            assert sweep is not None and sweep.ledger_key == key
            assert sweep.plan[0]["sample_rate"] == pytest.approx(out["sample_rate"])

        # And `dpsweep plan` on that spec shows the same q (the owner's view applies there too).
        spec_file = tmp_path / "clinic.yaml"
        spec_file.write_text(
            json.dumps(
                {
                    "name": "clinic-plan",
                    "dataset": {"name": "clinic"},
                    "model": {"name": "logreg"},
                    "training": {"epochs": 1, "batch_size": 32, "eval_every": 10},
                    "privacy": {"budgets": [1], "delta": 1e-5},
                    "arms": [{"strategy": "fixed", "grid": {"lr": [0.5]}}],
                }
            )
        )
        p = dpsweep("plan", str(spec_file), "--json", "--db", db, db=db)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)[0]["sample_rate"] == pytest.approx(out["sample_rate"])

        # Refused input charges nothing: a file flag with a registered name, a setting out of
        # range, an unknown name, and a run the records' cap cannot cover.
        entries = len(ledger.entries(key))
        refused = [
            (["--data-path", str(data)], 2, "leave out --data-path"),
            (["--test-fraction", "1.5"], 2, "--test-fraction"),
            (["--dataset", "clinc"], 2, "unknown dataset 'clinc'"),
        ]
        for extra, code, message in refused:
            p = dpsweep("train", "--dataset", "clinic", "--epsilon", "1", *FAST, *extra, db=db)
            assert p.returncode == code and message in p.stderr, (extra, p.stderr)
        # (the sweep holds a reservation of 1: a cap of what is used plus 0.5 fits no run)
        used = ledger.summary(key)
        ledger.set_cap(key, epsilon_cap=float(used.epsilon_spent + used.epsilon_reserved) + 0.5)
        p = dpsweep("train", "--dataset", "clinic", "--epsilon", "1", "--yes", *FAST, db=db)
        assert p.returncode == 1 and "cap" in p.stderr, p.stderr
        assert float(ledger.summary(key).epsilon_spent) == charged
        assert len(ledger.entries(key)) == entries
    finally:
        engine.dispose()


def test_train_as_a_tenant_sees_only_theirs_and_is_charged_as_them(tmp_path: Path) -> None:
    """``--owner NAME``: the run is NAME's (admission as NAME's token would be), its charge is
    logged as NAME's, and the operator's registered names are not NAME's to train on."""
    from sweeper.datasets.identity import ledger_key_of
    from sweeper.privacy.release_log import read_log
    from sweeper.store.engine import make_engine

    db = f"sqlite:///{tmp_path / 'tenant.db'}"
    data = tmp_path / "clinic.csv"
    write_csv(data, 200, seed=0)
    p = dpsweep("datasets", "register", str(data), "--name", "clinic", "--label-column",
                "target", db=db)  # fmt: skip
    assert p.returncode == 0, p.stderr
    p = dpsweep("train", "--owner", "bob", "--dataset", "clinic", "--epsilon", "1", "--yes",
                *FAST, db=db)  # fmt: skip
    assert p.returncode == 2 and "unknown dataset 'clinic'" in p.stderr, p.stderr

    p = dpsweep("train", "--owner", "bob", "--dataset", "digits", "--epsilon", "1", "--json",
                *FAST, db=db)  # fmt: skip
    assert p.returncode == 0, p.stderr
    run_id = json.loads(p.stdout)["ledger"]["run"].removeprefix("train_")
    engine = make_engine(db)
    try:
        log = read_log(engine, ledger_key_of(engine, "digits"), everyone=True)
        assert [(e["kind"], e["principal"], e["sweep_id"]) for e in log] == [
            ("train", "bob", run_id)
        ]
    finally:
        engine.dispose()
