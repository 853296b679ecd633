"""Tuning small, then scaling (Sander et al. 2023): public pre-tuning at the logical batch B / r
with sigma / r (sigma / B as the private grid's); the private grid keeps its batch, sigma and
epsilon, and the plan shows both."""

from __future__ import annotations

from typing import Any

import pytest

from dpsweep.plan import GridPlan
from dpsweep.spec import TrainingConfig, load_spec
from sweeper.sweeps.planning import plan_sweep
from workers.public_tuning import scaled_for_tuning


def test_the_tuning_batch_and_sigma_keep_sigma_over_b() -> None:
    batch, sigma = scaled_for_tuning(TrainingConfig(batch_size=4096, tune_batch_scale=16), 3.0)
    assert (batch, sigma) == (256, pytest.approx(3.0 / 16))
    batch, sigma = scaled_for_tuning(TrainingConfig(batch_size=100, tune_batch_scale=3), 2.0)
    assert batch == 33 and sigma / batch == pytest.approx(2.0 / 100)
    assert scaled_for_tuning(TrainingConfig(batch_size=64), 1.5) == (64, 1.5)


def _spec(scale: int) -> dict[str, Any]:
    return {
        "name": "tan",
        "dataset": {"name": "mnist1d"},
        "eval": {"mode": "public", "dataset": "mnist1d-test"},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "training": {"steps": 10, "batch_size": 64, "eval_every": 5, "tune_batch_scale": scale},
        "privacy": {"budgets": [3], "delta": 1e-5},
        "arms": [
            {
                "strategy": "fixed",
                "grid": {"lr": [0.5, 2.0], "clip": [1.0]},
                "tune_on": "mnist1d-test",
            }
        ],
        "seeds": 1,
        "search": {"method": "grid"},
        "objective": {"metric": "accuracy", "mode": "max"},
    }


def test_the_plan_shows_the_small_tuning_batch_and_the_full_private_one() -> None:
    pytest.importorskip("mnist1d")
    (full,) = plan_sweep(load_spec(_spec(1))).grids
    (small,) = plan_sweep(load_spec(_spec(4))).grids
    assert full.tuned_at is None
    assert small.tuned_at == {
        "scale": 4,
        "batch_size": 16,
        "noise_multiplier": pytest.approx(small.noise_multiplier / 4),
    }
    # The private grid is the full batch's: the same q, steps, sigma and epsilon.
    assert (small.sample_rate, small.steps_per_trial, small.noise_multiplier) == (
        full.sample_rate,
        full.steps_per_trial,
        full.noise_multiplier,
    )
    assert small.epsilon_total == full.epsilon_total
    assert GridPlan.from_stored(small.to_stored()) == small
