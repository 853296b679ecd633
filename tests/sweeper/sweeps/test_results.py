"""Results: Pareto fronts (property-tested) and the best configuration per arm and level."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sweeper.sweeps.results import (
    best_per_arm_level,
    calibration_front,
    epsilon_front,
    pareto_mask,
)


def dominates(a: tuple[float, float], b: tuple[float, float], sx: float, sy: float) -> bool:
    ax, ay, bx, by = sx * a[0], sy * a[1], sx * b[0], sy * b[1]
    return ax <= bx and ay <= by and (ax < bx or ay < by)


@settings(max_examples=200, deadline=None)
@given(
    pts=st.lists(
        st.tuples(st.integers(0, 6).map(float), st.integers(0, 6).map(float)), max_size=25
    ),
    x_mode=st.sampled_from(["min", "max"]),
    y_mode=st.sampled_from(["min", "max"]),
)
def test_front_keeps_exactly_the_non_dominated_points(pts, x_mode, y_mode) -> None:  # type: ignore[no-untyped-def]
    sx = 1.0 if x_mode == "min" else -1.0
    sy = 1.0 if y_mode == "min" else -1.0
    mask = pareto_mask(pts, x_mode=x_mode, y_mode=y_mode)
    for i, p in enumerate(pts):
        dominated = any(dominates(q, p, sx, sy) for j, q in enumerate(pts) if j != i)
        assert mask[i] == (not dominated)  # kept iff no other point dominates it


def test_non_finite_points_are_never_on_the_front() -> None:
    assert pareto_mask([(1.0, math.nan), (2.0, 0.5)], x_mode="min", y_mode="max") == [False, True]


def _trial(arm, eps, params, seed, acc, ece=0.1, state="done"):  # type: ignore[no-untyped-def]
    return {
        "arm": arm,
        "strategy": arm,
        "epsilon_budget": eps,
        "params": params,
        "seed": seed,
        "state": state,
        "metrics": {"accuracy": acc, "ece": ece},
    }


def test_best_configuration_by_mean_over_seeds_on_a_hand_checked_fixture() -> None:
    trials = [
        # fixed @ eps 1: lr=0.1 averages 0.6 (0.5, 0.7); lr=1 averages 0.65 (0.9, 0.4) -> lr=1
        _trial("fixed", 1, {"lr": 0.1}, 0, 0.5, 0.2),
        _trial("fixed", 1, {"lr": 0.1}, 1, 0.7, 0.2),
        _trial("fixed", 1, {"lr": 1.0}, 0, 0.9, 0.1),
        _trial("fixed", 1, {"lr": 1.0}, 1, 0.4, 0.3),
        # fixed @ eps 3: one config, one failed seed
        _trial("fixed", 3, {"lr": 1.0}, 0, 0.8),
        _trial("fixed", 3, {"lr": 1.0}, 1, None, state="failed"),
        # online @ eps 1 and 3
        _trial("online", 1, {"lr": 1.0}, 0, 0.7),
        _trial("online", 3, {"lr": 1.0}, 0, 0.75),
    ]
    res = {(r.arm, r.epsilon_budget): r for r in best_per_arm_level(trials)}
    f1 = res[("fixed", 1.0)]
    assert f1.best_params == {"lr": 1.0}
    assert f1.objective_mean == pytest.approx(0.65)
    assert f1.objective_std == pytest.approx(math.sqrt(((0.9 - 0.65) ** 2 + (0.4 - 0.65) ** 2) / 1))
    assert f1.ece_mean == pytest.approx(0.2) and f1.seeds == 2
    f3 = res[("fixed", 3.0)]
    assert f3.objective_mean == 0.8 and f3.objective_std == 0.0 and f3.trials_failed == 1
    front = {(p.label, p.x): p for p in epsilon_front(list(res.values()))}
    # (1, 0.70 online) and (3, 0.80 fixed) are non-dominated; (1, 0.65 fixed) and (3, 0.75
    # online) are dominated.
    assert not front[("online", 1.0)].dominated and not front[("fixed", 3.0)].dominated
    assert front[("fixed", 1.0)].dominated and front[("online", 3.0)].dominated
    cal = calibration_front(trials)
    kept = sorted((p.x, p.y) for p in cal if not p.dominated)
    # (0.9 accuracy, 0.1 ECE) is at least as good as every other trial on both axes.
    assert kept == [(0.9, 0.1)]
    assert len(cal) == 7  # the failed trial has no metrics and is not plotted
