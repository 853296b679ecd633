"""Sample rate and step count of a run (torch-free: the planner uses it too)."""

from __future__ import annotations

from workers.errors import ConfigError


def plan_steps(
    *, n_train: int, batch_size: int, epochs: float | None, steps: int | None
) -> tuple[float, int]:
    """Sample rate q = batch_size / n_train and the number of steps (``epochs / q`` rounded)."""
    if batch_size < 1:
        raise ConfigError("batch_size must be >= 1", field="training.batch_size")
    if batch_size > n_train:
        raise ConfigError(
            f"batch_size {batch_size} exceeds the {n_train} training examples",
            field="training.batch_size",
        )
    q = batch_size / n_train
    if steps is not None:
        if steps < 1:
            raise ConfigError("steps must be >= 1", field="training.steps")
        return q, int(steps)
    if epochs is None or not epochs > 0:
        raise ConfigError("epochs must be > 0", field="training.epochs")
    return q, max(1, round(epochs / q))
