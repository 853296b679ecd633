"""``examples/cifar10-wrn16-4.yaml`` runs end to end on a small slice of synthetic CIFAR-10-shaped
data: the recipe's model (WRN-16-4, GroupNorm and weight standardisation), augmentation with
crop and flip, a logical batch in physical chunks and EMA, with only the sizes shrunk (records,
steps, batch, multiplicity, the grid) so that it takes seconds on a CPU."""

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


def test_the_cifar10_recipe_runs_on_a_small_slice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sweeper.datasets.registration import register_file

    root = write_cifar10(tmp_path / "cifar-10-batches-py", per_batch=40, test=20)
    db = f"sqlite:///{tmp_path / 'run.db'}"
    upgrade(db)
    engine = make_engine(db)
    try:
        register_file(engine, root, name="cifar10-train", fmt="cifar10")
        register_file(
            engine, root, name="cifar10-test", fmt="cifar10", options={"part": "test"}, public=True
        )
    finally:
        engine.dispose()
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
