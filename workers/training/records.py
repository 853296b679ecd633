"""What a pack's trials remember while they train: the best checkpoint, history, trajectories.

One selection rule serves every checkpoint, raw or averaged (:meth:`PackRecords.consider`);
a trial whose weights or objective stop being finite is marked diverged at that step and is
never selected again from non-finite values.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class PackRecords:
    """Per trial: the best checkpoint and its metrics, the history and the trajectories.

    Args:
        k: the number of trials.
        objective: the metric that selects the best checkpoint.
        maximise: whether larger is better.
        flat: the pack's ``[K, P]`` weights at the start (the best checkpoint's buffer).
    """

    def __init__(self, k: int, *, objective: str, maximise: bool, flat: torch.Tensor) -> None:
        self.objective = objective
        self.maximise = maximise
        self.best_value = [-math.inf if maximise else math.inf] * k
        self.best_step: list[int | None] = [None] * k
        self.best_flat = flat.clone()
        self.best_metrics: list[dict[str, Any]] = [{} for _ in range(k)]
        self.best_kept: list[str | None] = [None] * k
        self.last_metrics: list[dict[str, Any]] = [{} for _ in range(k)]
        self.diverged_at: list[int | None] = [None] * k
        self.history: list[list[dict[str, Any]]] = [[] for _ in range(k)]
        self.traj: list[dict[str, list[float | None]]] = [{"step": [], "lr": []} for _ in range(k)]

    def consider(self, i: int, step: int, m: dict[str, Any], flat: torch.Tensor, kept: str) -> None:
        """Select ``flat`` (trial ``i``'s raw or averaged weights) if it beats the best so far."""
        v = m[self.objective]
        if (v > self.best_value[i]) if self.maximise else (v < self.best_value[i]):
            self.best_value[i] = v
            self.best_step[i] = step
            self.best_metrics[i] = m
            self.best_flat[i] = flat
            self.best_kept[i] = kept

    def record_trajectories(
        self, step: int, eff_lr: list[float], state: dict[str, list[float]]
    ) -> None:
        """Each trial's effective learning rate and strategy state (and diagnostics) at ``step``."""
        for i, traj in enumerate(self.traj):
            traj["step"].append(step)
            traj["lr"].append(eff_lr[i])
            for name, vals in state.items():
                v = vals[i]
                traj.setdefault(name, []).append(v if math.isfinite(v) else None)

    def record_evaluation(
        self, step: int, results: list[dict[str, Any]], finite: list[bool], flat: torch.Tensor
    ) -> None:
        """Each trial's evaluation at ``step``: history, last metrics, the best checkpoint."""
        for i, m in enumerate(results):
            if not (finite[i] and math.isfinite(m[self.objective])):
                if self.diverged_at[i] is None:
                    self.diverged_at[i] = step
                self.history[i].append({"step": step, "diverged": True})
                continue
            self.last_metrics[i] = m
            self.history[i].append(
                {"step": step, **{a: b for a, b in m.items() if a != "reliability"}}
            )
            self.consider(i, step, m, flat[i], "raw")

    def add_to_history(self, i: int, step: int, extra: dict[str, Any]) -> None:
        """Merge ``extra`` (the averaged weights' metrics) into trial ``i``'s entry at ``step``."""
        if self.history[i] and self.history[i][-1].get("step") == step and extra:
            self.history[i][-1].update(extra)
