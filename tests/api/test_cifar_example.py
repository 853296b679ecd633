"""``examples/cifar10-wrn16-4.yaml`` plans on a small synthetic CIFAR-10 directory, registered as
its comments say: the training batches as the private records, the test batch declared public
for evaluation; and it runs end to end on a small slice of such data (the recipe's model, WS,
GroupNorm, EMA, crop and flip, a logical batch in physical chunks; only the sizes shrunk)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from api.cli import main
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.workers.datasets.cifar_files import write_cifar10

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cifar10-wrn16-4.yaml"


def _registered(tmp_path: Path, *, per_batch: int, test: int) -> str:
    """A synthetic CIFAR-10 directory registered as the example's comments say; its database."""
    from sweeper.datasets.registration import register_file

    root = write_cifar10(tmp_path / "cifar-10-batches-py", per_batch=per_batch, test=test)
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
    return db


def test_the_cifar10_recipe_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 5 x 1,000 training images: more than the expected batch of 4096 (q < 1).
    db = _registered(tmp_path, per_batch=1000, test=50)
    assert main(["plan", str(EXAMPLE), "--json", "--db", db]) == 0
    (grid,) = json.loads(capsys.readouterr().out)
    assert grid["epsilon_budget"] == 8 and grid["trials"] == 3
    assert grid["steps_per_trial"] == 2468 and grid["sample_rate"] == pytest.approx(4096 / 5000)
    assert grid["engine_path"] == "generic"
    assert grid["eval_mode"] == "public" and grid["eval_dataset"] == "cifar10-test"
    # Per-grid accounting: the three trials share epsilon 8, each below it.
    assert grid["epsilon_per_trial"] < 8 and grid["epsilon_verified"] <= 8 + 1e-9
    assert grid["n_train"] == 5000 and grid["n_eval"] == 50


def test_the_cifar10_recipe_runs_on_a_small_slice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _registered(tmp_path, per_batch=40, test=20)
    spec = yaml.safe_load(EXAMPLE.read_text())
    # The recipe as written, its sizes shrunk: the model, its options, the optimizer, EMA, the
    # augmentation ops and the chunked logical batch stay.
    spec["training"].update(
        steps=2, batch_size=12, physical_batch_size=4, eval_every=1,
        augment={"multiplicity": 2, "ops": ["crop", "flip"]},
    )  # fmt: skip
    spec["arms"][0]["grid"]["lr"] = [4.0]
    small = tmp_path / "cifar-small.yaml"
    small.write_text(yaml.safe_dump(spec))
    code = main(["run", str(small), "--db", db, "--quiet", "--json", "--workers", "1"])
    out = capsys.readouterr()
    assert code == 0, out.err
    shown = json.loads(out.out[out.out.index("{") :])
    assert shown["state"] == "done" and shown["trials"]["done"] == 1, shown
    assert shown["trials"].get("failed", 0) == 0
