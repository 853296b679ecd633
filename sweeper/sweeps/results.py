"""Sweep results: the best configuration per arm and level, and Pareto fronts.

Pure functions over plain trial records (dicts), so the store, the API and the CLI share them.
A trial record carries ``arm``, ``strategy``, ``epsilon_budget``, ``params`` (its grid point),
``seed``, ``state`` and ``metrics`` (best-checkpoint metrics on the public evaluation split).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class FrontPoint:
    x: float
    y: float
    label: str
    dominated: bool
    payload: dict[str, Any]


def pareto_mask(
    points: Sequence[tuple[float, float]], *, x_mode: str = "min", y_mode: str = "max"
) -> list[bool]:
    """For each point, whether it is non-dominated.

    A point is dominated when another is at least as good on both axes and strictly better on
    one (``x_mode``/``y_mode``: ``min`` or ``max``). Duplicates do not dominate each other.
    Non-finite points are never on the front.
    """
    sx = 1.0 if x_mode == "min" else -1.0
    sy = 1.0 if y_mode == "min" else -1.0
    keyed = [(sx * x, sy * y) for x, y in points]  # both minimised now
    finite = [math.isfinite(a) and math.isfinite(b) for a, b in keyed]
    order = sorted((i for i in range(len(keyed)) if finite[i]), key=lambda i: keyed[i])
    front = [False] * len(keyed)
    best_y = math.inf
    i = 0
    while i < len(order):
        # Points sharing an x are judged together: only the lowest y among them can survive.
        j = i
        while j < len(order) and keyed[order[j]][0] == keyed[order[i]][0]:
            j += 1
        group_best = min(keyed[order[k]][1] for k in range(i, j))
        if group_best < best_y:
            for k in range(i, j):
                if keyed[order[k]][1] == group_best:
                    front[order[k]] = True
            best_y = group_best
        i = j
    return front


@dataclass(frozen=True)
class ArmLevelResult:
    arm: str
    strategy: str
    epsilon_budget: float
    best_params: dict[str, Any]
    objective_mean: float
    objective_std: float
    ece_mean: float | None
    seeds: int
    trials_done: int
    trials_failed: int
    # The best of the best configuration's runs (over seeds): the trial a user opens for it.
    best_trial: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def best_per_arm_level(
    trials: Iterable[dict[str, Any]], *, metric: str = "accuracy", mode: str = "max"
) -> list[ArmLevelResult]:
    """Per arm and epsilon level: the configuration with the best mean objective over seeds.

    Only finished trials with a finite objective count; a configuration's mean and standard
    deviation are over its seeds (std 0 with one seed).
    """
    groups: dict[tuple[str, float], dict[str, list[dict[str, Any]]]] = {}
    meta: dict[tuple[str, float], dict[str, Any]] = {}
    for t in trials:
        k = (t["arm"], float(t["epsilon_budget"]))
        meta.setdefault(k, {"strategy": t["strategy"], "done": 0, "failed": 0})
        value = (t.get("metrics") or {}).get(metric)
        if t.get("state") in ("failed", "interrupted"):
            meta[k]["failed"] += 1
            continue
        if t.get("state") != "done" or value is None or not math.isfinite(value):
            continue
        meta[k]["done"] += 1
        groups.setdefault(k, {}).setdefault(_key(t["params"]), []).append(t)
    out: list[ArmLevelResult] = []
    sign = 1.0 if mode == "max" else -1.0
    for k, configs in groups.items():
        scored = []
        for pkey, runs in configs.items():
            vals = [float(r["metrics"][metric]) for r in runs]
            mean = statistics.fmean(vals)
            std = statistics.stdev(vals) if len(vals) > 1 else 0.0
            eces = [r["metrics"]["ece"] for r in runs if r["metrics"].get("ece") is not None]
            scored.append((sign * mean, pkey, mean, std, eces, runs))
        scored.sort(key=lambda s: (-s[0], s[1]))  # best mean first; ties broken stably
        _, _, mean, std, eces, runs = scored[0]
        out.append(
            ArmLevelResult(
                arm=k[0],
                strategy=meta[k]["strategy"],
                epsilon_budget=k[1],
                best_params=dict(runs[0]["params"]),
                objective_mean=mean,
                objective_std=std,
                ece_mean=statistics.fmean(eces) if eces else None,
                seeds=len(runs),
                trials_done=meta[k]["done"],
                trials_failed=meta[k]["failed"],
                best_trial=max(runs, key=lambda r: sign * float(r["metrics"][metric])).get("id"),
            )
        )
    out.sort(key=lambda r: (r.arm, r.epsilon_budget))
    return out


def epsilon_front(results: Sequence[ArmLevelResult], *, mode: str = "max") -> list[FrontPoint]:
    """epsilon (x, lower is better) vs the best objective (y), one series per strategy/arm."""
    pts = [(r.epsilon_budget, r.objective_mean) for r in results]
    mask = pareto_mask(pts, x_mode="min", y_mode=mode)
    return [
        FrontPoint(
            x=r.epsilon_budget,
            y=r.objective_mean,
            label=r.arm,
            dominated=not m,
            payload=r.to_dict(),
        )
        for r, m in zip(results, mask, strict=True)
    ]


def calibration_front(
    trials: Iterable[dict[str, Any]], *, metric: str = "accuracy", mode: str = "max"
) -> list[FrontPoint]:
    """Objective (x) vs ECE (y, lower is better) across all finished trials."""
    done = [
        t
        for t in trials
        if t.get("state") == "done"
        and (t.get("metrics") or {}).get("ece") is not None
        and (t.get("metrics") or {}).get(metric) is not None
    ]
    pts = [(float(t["metrics"][metric]), float(t["metrics"]["ece"])) for t in done]
    mask = pareto_mask(pts, x_mode=mode, y_mode="min")
    return [
        FrontPoint(x=x, y=y, label=t["arm"], dominated=not m, payload=t)
        for (x, y), t, m in zip(pts, done, mask, strict=True)
    ]
