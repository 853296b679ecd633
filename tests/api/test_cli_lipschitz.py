"""``dpsweep train --strategy lipschitz`` learns with the CLI's default settings.

Under the lipschitz strategy the noise is sigma times a worst-case bound on every per-sample
gradient, far above a typical clipping threshold, so the CLI's general default lr (0.5) drove
lip_mlp to chance; the strategy has its own default lr (``api.cli.train.LIPSCHITZ_LR``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.cli.train import DEFAULT_LR, LIPSCHITZ_LR, default_lr

ROOT = Path(__file__).resolve().parents[2]


def test_default_lr_is_strategy_specific() -> None:
    assert default_lr("lipschitz") == LIPSCHITZ_LR < DEFAULT_LR == default_lr("fixed")


@pytest.mark.slow
def test_lip_mlp_learns_on_digits_at_epsilon_8_with_the_defaults(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(ROOT)}
    args = ["--strategy", "lipschitz", "--model", "lip_mlp", "--dataset", "digits"]
    # --reproducible (batches and noise from --seed) only so that the outcome is
    # deterministic; every training setting is the CLI's default.
    args += ["--epsilon", "8", "--reproducible", "--json", "--db", f"sqlite:///{tmp_path}/l.db"]
    p = subprocess.run(
        [sys.executable, "-m", "api.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["epsilon"] <= 8
    assert out["lr_final"] == LIPSCHITZ_LR or abs(out["lr_final"] - LIPSCHITZ_LR) < 1e-7
    assert out["accuracy"] > 0.5, out["accuracy"]  # chance is 0.1; lr 0.5 gave 0.10
