"""``dpsweep train -o DIR`` keeps its model as ``dpsweep model -o`` keeps a sweep's: weights,
card and README, the card's ε the run's charge, and the weights the ones whose metrics it
states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DPSWEEP = str(Path(sys.executable).with_name("dpsweep"))
FAST = ["--epochs", "2", "--batch-size", "64", "--eval-every", "10"]


def _train(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "DPSWEEP_DATABASE_URL": db}
    return subprocess.run(
        [DPSWEEP, "train", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_train_o_writes_a_model_its_card_and_readme(tmp_path: Path) -> None:
    import hashlib

    from sweeper.artifacts.recheck import measure
    from workers.checkpoints import build_trained
    from workers.datasets.loading import load_dataset
    from workers.datasets.raw_records import raw_evaluation_inputs
    from workers.datasets.records import DatasetSpec

    out = tmp_path / "kept"
    db = f"sqlite:///{tmp_path / 'o.db'}"
    p = _train("--dataset", "digits", "--model", "logreg", "--epsilon", "2", "--json",
               "-o", str(out), *FAST, db=db)  # fmt: skip
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert sorted(os.listdir(out)) == ["README.md", "card.json", "model.safetensors"]
    assert summary["kept"]["card.json"] == str(out / "card.json")

    card = json.loads((out / "card.json").read_text())
    weights = (out / "model.safetensors").read_bytes()
    assert card["format"] == "dpsweep-model-card" and card["kind"] == "train"
    assert card["model"]["weights"]["sha256"] == hashlib.sha256(weights).hexdigest()
    # The card's ε is what the ledger charged for this run, labelled as this run's release.
    privacy = card["privacy"]
    assert privacy["private"] is True
    assert privacy["epsilon"] == summary["ledger"]["epsilon_charged"]
    assert privacy["ledger_run"] == summary["ledger"]["run"] == card["run"]["id"]
    assert "this one training run" in privacy["covers"]
    assert privacy["noise_multiplier"] == summary["noise_multiplier"]
    assert card["metrics"]["values"]["accuracy"] == summary["accuracy"]
    assert card["dataset"]["input_scaling"] and card["dataset"]["split"]["loader"] == "digits"
    readme = (out / "README.md").read_text()
    assert "this run alone" in readme and f"{privacy['epsilon']:.4g}" in readme

    # The weights are the best checkpoint: on the rebuilt evaluation split they score what the
    # card says, fed the raw records (the file carries digits' input transform).
    assert card["model"]["input_transform"]["in_model_file"] is True
    assert "Inputs: raw records" in readme
    module = build_trained(card["model"], weights)
    split = card["dataset"]["split"]
    spec = DatasetSpec(
        name="digits", test_fraction=split["test_fraction"], split_seed=split["split_seed"]
    )
    data = load_dataset(spec)
    raw = raw_evaluation_inputs(spec)
    got = measure(module, data, task="classification", dp=False, inputs=raw)
    assert got["accuracy"] == pytest.approx(summary["accuracy"], abs=1e-9)


def test_an_output_that_cannot_be_written_is_refused_before_the_charge(tmp_path: Path) -> None:
    from sweeper.datasets.identity import ledger_key_of
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger
    from sweeper.store.engine import make_engine

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    p = _train("--dataset", "digits", "--model", "logreg", "--epsilon", "2",
               "-o", str(blocker), *FAST, db=db)  # fmt: skip
    assert p.returncode == 2 and "is a file" in p.stderr, p.stderr
    engine = make_engine(db)
    try:
        assert (
            float(BudgetLedger(engine).summary(ledger_key_of(engine, "digits")).epsilon_spent) == 0
        )
    finally:
        engine.dispose()
