"""``examples/cifar10-wrn16-4.yaml`` plans on a small synthetic CIFAR-10 directory, registered as
its comments say: the training batches as the private records, the test batch declared public
for evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.cli import main
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.workers.datasets.cifar_files import write_cifar10

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cifar10-wrn16-4.yaml"


def test_the_cifar10_recipe_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sweeper.datasets.registration import register_file

    # 5 x 1,000 training images: more than the expected batch of 4096 (q < 1).
    root = write_cifar10(tmp_path / "cifar-10-batches-py", per_batch=1000, test=50)
    db = f"sqlite:///{tmp_path / 'catalog.db'}"
    upgrade(db)
    engine = make_engine(db)
    try:
        register_file(engine, root, name="cifar10-train", fmt="cifar10")
        register_file(
            engine, root, name="cifar10-test", fmt="cifar10", options={"part": "test"}, public=True
        )
    finally:
        engine.dispose()
    assert main(["plan", str(EXAMPLE), "--json", "--db", db]) == 0
    (grid,) = json.loads(capsys.readouterr().out)
    assert grid["epsilon_budget"] == 8 and grid["trials"] == 3
    assert grid["steps_per_trial"] == 2468 and grid["sample_rate"] == pytest.approx(4096 / 5000)
    assert grid["engine_path"] == "generic"
    assert grid["eval_mode"] == "public" and grid["eval_dataset"] == "cifar10-test"
    # Per-grid accounting: the three trials share epsilon 8, each below it.
    assert grid["epsilon_per_trial"] < 8 and grid["epsilon_verified"] <= 8 + 1e-9
    assert grid["n_train"] == 5000 and grid["n_eval"] == 50
