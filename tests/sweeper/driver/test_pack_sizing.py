"""A worker sizes a sweep's packs for `dpsweep run`, so that its driver imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from dpsweep.spec import ModelConfig, TrainingConfig
from sweeper.driver import ray_backend
from sweeper.driver.ray_backend import ray_session
from sweeper.settings import SweeperSettings
from workers.datasets.records import DatasetSpec
from workers.pack_keys import pack_key
from workers.packing import max_pack_size
from workers.settings import WorkerSettings
from workers.training.specs import TrialSpec, training_pack

ROOT = Path(__file__).resolve().parents[3]


def _spec(model: str, batch: int) -> Any:
    return training_pack(
        model=ModelConfig(name=model),
        training=TrainingConfig(steps=3, batch_size=batch),
        strategy="fixed",
        trials=[TrialSpec(lr=0.1, seed=0, noise_multiplier=1.0, params={"clip": 1.0})],
        dataset=DatasetSpec("synthetic"),
        accountant="pld",
        reproducible=True,
        planned=None,
    )


def test_a_worker_sizes_packs_as_the_driver_would() -> None:
    """The same caps as the driver's own estimate: a small MLP fills a pack, a WRN-16-4 at a
    large batch fits only a few trials in the memory budget."""
    specs = [_spec("mlp", 64), _spec("wrn16_4", 512)]
    shape, classes = (3, 32, 32), 10
    local = [
        max_pack_size(s, input_shape=shape, num_classes=classes, settings=WorkerSettings())
        for s in specs
    ]
    assert local[0] > local[1]  # the comparison below can tell the two apart
    with ray_session(SweeperSettings(), workers=1):
        remote = ray_backend.remote_pack_caps(specs, input_shape=shape, num_classes=classes)
    assert remote == local


def test_the_pack_key_needs_no_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        from workers.pack_keys import pack_key
        assert "torch" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=ROOT)
    assert pack_key(_spec("mlp", 64)) == pack_key(_spec("mlp", 64))
    assert pack_key(_spec("mlp", 64)) != pack_key(_spec("mlp", 32))


@pytest.mark.slow
def test_dpsweep_run_keeps_torch_out_of_the_driver(tmp_path: Path) -> None:
    """A multi-trial `dpsweep run` on its own local Ray: packs sized by a worker, trained, and
    the driver never imported torch."""
    spec = {
        "name": "sizing",
        "dataset": {"name": "digits"},
        "model": {"name": "mlp"},
        "training": {"steps": 3, "batch_size": 64, "eval_every": 3},
        "privacy": {"budgets": [3], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0]}}],
        "seeds": 1,
        "search": {"method": "grid"},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    url = f"sqlite:///{tmp_path / 'd.db'}"
    code = textwrap.dedent(
        f"""
        import sys
        from api.cli import main
        rc = main(["run", {str(path)!r}, "--db", {url!r}, "--quiet", "--json", "--workers", "2",
                   "--plots", {str(tmp_path / "plots")!r}])
        print("RC", rc, "TORCH", "torch" in sys.modules)
        """
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "RC 0 TORCH False" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    summary, _ = json.JSONDecoder().raw_decode(p.stdout[p.stdout.index("{") :])
    assert summary["state"] == "done", summary["state"]
    (result,) = summary["results"]
    assert result["trials_done"] == 2  # both grid points trained (one pack, sized by a worker)
