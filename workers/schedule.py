"""Sample rate and step count of a run (torch-free: the planner uses it too)."""

from __future__ import annotations

from dpsweep.errors import ConfigError


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


def eval_releases(*, steps: int, eval_every: int) -> int:
    """How many noisy evaluations a trial releases in DP evaluation (``eval: {mode: dp}``).

    One per evaluation (every ``eval_every`` steps, and after the last step) plus one fresh
    measurement of the chosen checkpoint, so that the accuracy reported for it is not the
    maximum of noisy values (which is biased upwards). The planner charges exactly this many
    Gaussian releases per trial, and the trainer refuses to run if its own count differs.
    """
    if steps < 1 or eval_every < 1:
        raise ConfigError("steps and eval_every must be >= 1", field="training.eval_every")
    return -(-steps // eval_every) + 1
