"""One naming rule for a flat table of trials (CSV exports and the SDK's DataFrames)."""

from __future__ import annotations

from dpsweep.columns import metric_column, param_column
from dpsweep.sweep import _flat_trial


def test_names_are_their_own_unless_taken() -> None:
    assert param_column("lr", ["id", "seed"]) == "lr"
    assert param_column("seed", ["id", "seed"]) == "param_seed"
    assert metric_column("accuracy", ["id", "lr"]) == "accuracy"
    assert metric_column("steps", ["id", "steps"]) == "metric_steps"


def test_the_dataframe_row_follows_the_rule() -> None:
    trial = {
        "id": "t1",
        "seed": 3,
        "steps": 100,
        "params": {"lr": 0.5, "seed": 7},
        "metrics": {"accuracy": 0.9, "steps": 99, "lr": 1.0},
    }
    row = _flat_trial(trial)
    assert row == {
        "id": "t1",
        "seed": 3,
        "steps": 100,
        "lr": 0.5,
        "param_seed": 7,
        "accuracy": 0.9,
        "metric_steps": 99,
        "metric_lr": 1.0,
    }
