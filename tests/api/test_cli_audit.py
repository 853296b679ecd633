"""``dpsweep audit``: a canary audit from the command line, on a real SQLite database.

Public data (digits) spends nothing and asks nothing; a registered (private) dataset is
charged the claimed epsilon, computed and shown before training, and only with ``--yes``
(issue 51: without it, and no terminal to ask on, the audit is refused and nothing is
spent); refused input charges and stores nothing. Every run is tiny (digits or 300 records,
10 steps, a few hundred canaries).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.cli import main
from sweeper.store import Audit
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade

DPSWEEP = shutil.which("dpsweep", path=str(Path(sys.executable).parent)) or "dpsweep"
KEYS = {
    "epsilon_claimed",
    "epsilon_lower_bound",
    "confidence",
    "canaries",
    "setting",
    "strategy",
    "engine_path",
    "seconds",
    "exceeds_claim",
    "false_alarm_rate",
    "verdict",
    "epsilon_estimate",
    "estimate_assumption",
}


def _csv(path: Path, n: int = 300) -> None:
    rng = np.random.default_rng(38)
    x = rng.normal(size=(n, 4))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    rows = (",".join(f"{v:.5f}" for v in r) + f",{t}" for r, t in zip(x, y, strict=True))
    path.write_text("a,b,c,d,label\n" + "\n".join(rows) + "\n")


def _audits(db: str) -> int:
    engine = make_engine(db)
    try:
        with Session(engine) as s:
            return int(s.scalar(select(func.count()).select_from(Audit)) or 0)
    finally:
        engine.dispose()


def _spent(db: str, name: str) -> Decimal:
    from sweeper.datasets.identity import ledger_key_of
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger
    from sweeper.store.engine import create_ledger_engine

    engine = create_ledger_engine(db)
    try:
        s = BudgetLedger(engine).summary(ledger_key_of(engine, name))
        return s.epsilon_spent + s.epsilon_reserved
    finally:
        engine.dispose()


def test_audit_json_on_digits_is_free_and_stored(tmp_path: Path) -> None:
    """The issue's command, as the installed console script: the JSON keys, bound <= claim."""
    db = f"sqlite:///{tmp_path / 'a.db'}"
    args = ["audit", "--dataset", "digits", "--model", "mlp", "--strategy", "fixed",
            "--epsilon", "8", "--batch-size", "1437", "--steps", "10", "--canaries", "500",
            "--json", "--db", db]  # fmt: skip
    p = subprocess.run(
        [DPSWEEP, *args], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) >= KEYS
    assert {"delta", "trials", "steps", "sample_rate", "noise_multiplier", "method"} <= set(out)
    assert out["setting"] == "white-box" and out["canaries"] == 500 and out["trials"] == 1
    assert out["strategy"] == "fixed" and out["steps"] == 10 and out["confidence"] == 0.95
    # Calibrated to epsilon 8 for one trial of T steps.
    assert out["epsilon_claimed"] == pytest.approx(8.0, rel=0.02)
    assert 0.0 <= out["epsilon_lower_bound"] <= out["epsilon_claimed"]
    assert out["method"] == "one-run" and out["exceeds_claim"] is False
    assert out["false_alarm_rate"] == pytest.approx(0.05)
    assert "no evidence of a leak" in out["verdict"]
    assert _audits(db) == 1
    # digits is public: no ledger entry at all.
    engine = make_engine(db)
    try:
        from sweeper.privacy.ledger.budget_ledger import BudgetLedger

        assert BudgetLedger(engine).datasets() == []
    finally:
        engine.dispose()


def test_audit_of_a_registered_dataset_charges_the_claim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sweeper.datasets.registration import register_file

    db = f"sqlite:///{tmp_path / 'b.db'}"
    upgrade(db)
    data = tmp_path / "clinic.csv"
    _csv(data)
    engine = make_engine(db)
    try:
        register_file(engine, data, name="clinic", label_column="label")
    finally:
        engine.dispose()
    before = _spent(db, "clinic")
    rc = main(["audit", "--dataset", "clinic", "--model", "logreg", "--noise-multiplier", "1.5",
               "--batch-size", "64", "--steps", "10", "--lr", "0.1", "--lr", "0.3",
               "--canaries", "200", "--json", "--yes", "--db", db])  # fmt: skip
    assert rc == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["trials"] == 2 and out["noise_multiplier"] == 1.5
    # Charged exactly the claim: the two trials' 10 steps each, composed.
    assert float(_spent(db, "clinic") - before) == pytest.approx(out["epsilon_claimed"], rel=1e-9)
    assert 0.0 <= out["epsilon_lower_bound"] <= out["epsilon_claimed"]
    # The charge was shown first (on stderr: stdout is the JSON), as the ledger took it.
    assert f"this audit charges ε {out['epsilon_claimed']:.4g}, δ 1e-05" in captured.err
    assert "'clinic'" in captured.err and "confirmed by --yes" in captured.err
    assert out["summary"].startswith("95 % lower bound ")


def _clinic(tmp_path: Path, cap: float | None = None) -> str:
    """A database with a registered private dataset ``clinic`` (its ε cap when given)."""
    from sweeper.datasets.identity import ledger_key_of
    from sweeper.datasets.registration import register_file
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger

    db = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(db)
    data = tmp_path / "clinic.csv"
    _csv(data)
    engine = make_engine(db)
    try:
        register_file(engine, data, name="clinic", label_column="label")
        if cap is not None:
            BudgetLedger(engine).set_cap(ledger_key_of(engine, "clinic"), epsilon_cap=cap)
    finally:
        engine.dispose()
    return db


AUDIT = ["audit", "--dataset", "clinic", "--model", "logreg", "--noise-multiplier", "1.5",
         "--batch-size", "64", "--steps", "10", "--canaries", "200"]  # fmt: skip


def test_an_unconfirmed_audit_of_private_data_is_refused_and_spends_nothing(
    tmp_path: Path,
) -> None:
    """Issue 51: no --yes and no terminal (stdin is not one): one line that says what it
    would charge and how to proceed; the ledger and the stored audits are unchanged."""
    db = _clinic(tmp_path, cap=8.19)
    before = _spent(db, "clinic")
    p = subprocess.run(
        [DPSWEEP, *AUDIT, "--db", db], capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    line = lines[0]
    assert line.startswith("refused: this audit charges ε "), line
    assert "'clinic'" in line and "ε left 8.19 → " in line and "δ 1e-05" in line
    assert "nothing was charged" in line and "--yes" in line
    assert _spent(db, "clinic") == before == Decimal(0)
    assert _audits(db) == 0


def test_a_confirmed_audit_prints_its_cost_then_the_verdict_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --yes: the charge shown is the one taken, and the table ends with the one-line
    verdict (what the bound shows) before the long one."""
    monkeypatch.setenv("COLUMNS", "300")
    db = _clinic(tmp_path, cap=8.19)
    assert main([*AUDIT, "--yes", "--db", db]) == 0
    captured = capsys.readouterr()
    spent = _spent(db, "clinic")
    assert spent > 0
    err = " ".join(captured.err.split())
    after = Decimal("8.19") - spent
    assert f"this audit charges ε {float(spent):.4g}, δ 1e-05" in err, err
    assert f"ε left 8.19 → ≈{float(after):.6g}" in err or f"ε left 8.19 → {after}" in err, err
    out = " ".join(captured.out.split())
    verdict = next(x for x in captured.out.splitlines() if x.startswith("verdict: "))
    assert verdict.startswith("verdict: 95 % lower bound "), verdict
    assert "≤ claimed ε" in verdict and "consistent" in verdict, verdict
    assert "no evidence of a leak" in out
    assert f"charged ε {float(spent):.4g}" in out
    assert _audits(db) == 1


def test_the_table_shows_the_bound_the_estimate_and_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The words of the API's result, as the table and the line below it."""
    monkeypatch.setenv("COLUMNS", "200")  # one line per row
    db = f"sqlite:///{tmp_path / 't.db'}"
    rc = main(["audit", "--dataset", "digits", "--epsilon", "8", "--batch-size", "1437",
               "--steps", "5", "--canaries", "300", "--db", db])  # fmt: skip
    assert rc == 0
    out = " ".join(capsys.readouterr().out.split())  # the table's wrapping undone
    assert "epsilon lower bound (95%, any mechanism)" in out
    assert "epsilon estimate (Gaussian model)" in out
    assert "(not a bound" in out or "(withheld" in out
    assert "The lower bound does not exceed the claimed epsilon: no evidence of a leak." in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--epsilon", "2", "--noise-multiplier", "1"], "--noise-multiplier"),
        (["--noise-multiplier", "1", "--batch-size", "100000"], "--batch-size"),
        (["--noise-multiplier", "1", "--strategy", "nonprivate"], "--strategy"),
        (["--noise-multiplier", "1", "--canaries", "1"], "--canaries"),
        (["--noise-multiplier", "1", "--delta", "0.1"], "--delta"),
        (["--noise-multiplier", "1", "--confidence", "0.5"], "--confidence"),
    ],
)
def test_refused_audits_charge_and_store_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    from sweeper.datasets.registration import register_file

    db = f"sqlite:///{tmp_path / 'c.db'}"
    upgrade(db)
    data = tmp_path / "clinic.csv"
    _csv(data)
    engine = make_engine(db)
    try:
        register_file(engine, data, name="clinic", label_column="label")
    finally:
        engine.dispose()
    before = _spent(db, "clinic")
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--dataset", "clinic", "--model", "logreg", *flags, "--db", db])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert _spent(db, "clinic") == before
    assert _audits(db) == 0


class _Terminal(io.StringIO):
    """Stdin as a terminal that types ``answer``."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("answer", "charged"), [("n\n", False), ("\n", False), ("y\n", True)])
def test_on_a_terminal_the_audit_asks_and_only_yes_charges(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    answer: str,
    charged: bool,
) -> None:
    """Without --yes on a terminal: the cost, then "Charge it? [y/N]" (on stderr: stdout stays
    the result); anything but a yes refuses and spends nothing."""
    db = _clinic(tmp_path)
    monkeypatch.setattr(sys, "stdin", _Terminal(answer))
    rc = main([*AUDIT, "--json", "--db", db])
    captured = capsys.readouterr()
    assert "this audit charges ε " in captured.err and "Charge it? [y/N]" in captured.err
    if charged:
        assert rc == 0 and _audits(db) == 1
        out = json.loads(captured.out)
        assert float(_spent(db, "clinic")) == pytest.approx(out["epsilon_claimed"], rel=1e-9)
    else:
        assert rc == 1 and captured.out == "" and "Run again with --yes" in captured.err
        assert _spent(db, "clinic") == 0 and _audits(db) == 0
