"""Public pre-tuning's centring rule (sweeper.sweeps.tuning): pure, no training."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsweep.spec import ArmConfig, Axis
from sweeper.sweeps.checks import check_arm
from sweeper.sweeps.tuning import (
    LR_RANGE,
    centre_axis,
    centre_grid,
    centred_arm,
    grid_json,
    tuned_arm,
)
from workers.strategies import get_descriptor

positive = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
quantile = st.floats(min_value=1e-6, max_value=1 - 1e-6)


def _gm(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def test_a_list_is_scaled_to_the_best_keeping_its_ratios() -> None:
    out = centre_axis([0.5, 2.0, 8.0], 4.0, LR_RANGE)
    assert out == pytest.approx([1.0, 4.0, 16.0])  # geometric mean 2 -> 4: times 2
    assert centre_axis([0.3], 7.0, LR_RANGE) == [7.0]


def test_intervals_are_shifted_to_centre_on_the_best() -> None:
    log = centre_axis(Axis(logspace=(-2, 0), k=3), 1.0, LR_RANGE)
    assert isinstance(log, Axis) and log.k == 3
    assert log.logspace == pytest.approx((-1.0, 1.0))
    lin = centre_axis(Axis(linspace=(0.1, 0.5), k=5), 0.5, None)
    assert isinstance(lin, Axis) and lin.linspace == pytest.approx((0.3, 0.7))


def test_what_the_rule_does_not_cover_is_unchanged() -> None:
    assert centre_axis(["a", "b"], "a", None) == ["a", "b"]
    assert centre_axis([0.0, 1.0], 1.0, None) == [0.0, 1.0]  # not all positive
    assert centre_axis([1.0, 2.0], "x", LR_RANGE) == [1.0, 2.0]  # the best is no number


def test_values_are_clamped_into_the_descriptors_range() -> None:
    hp = get_descriptor("quantile").hyperparameters["target_quantile"]  # (0, 1) exclusive
    out = centre_axis([0.5, 0.9], 0.95, hp)
    assert isinstance(out, list) and all(0 < v < 1 for v in out)
    log = centre_axis(Axis(logspace=(-1, -0.1), k=4), 0.9, hp)
    assert isinstance(log, Axis)
    assert all(hp.in_range(v) for v in log.values())


def test_a_centred_arm_is_valid_and_round_trips_through_json() -> None:
    arm = ArmConfig(strategy="fixed", grid={"lr": [0.5, 2.0], "clip": Axis(logspace=(-2, 0), k=3)})
    tuned = centred_arm(arm, {"lr": 2.0, "clip": 1.0})
    assert tuned.size() == arm.size()
    again = tuned_arm(arm, grid_json(tuned.grid))
    assert again.points() == tuned.points()  # JSON keeps every float exactly
    assert tuned_arm(arm, None) is arm


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(positive, min_size=1, max_size=6),
    best=positive,
    clips=st.lists(positive, min_size=1, max_size=4),
    best_clip=positive,
    quantiles=st.lists(quantile, min_size=1, max_size=4),
    best_q=quantile,
    ends=st.tuples(st.floats(min_value=-5, max_value=3), st.floats(min_value=-5, max_value=3)),
    k=st.integers(min_value=1, max_value=5),
)
def test_centring_keeps_size_ratios_and_ranges(
    values: list[float],
    best: float,
    clips: list[float],
    best_clip: float,
    quantiles: list[float],
    best_q: float,
    ends: tuple[float, float],
    k: int,
) -> None:
    arm = ArmConfig(
        strategy="quantile",
        grid={
            "lr": values,
            "clip_init": Axis(logspace=ends, k=k),
            "clip_lr": clips,
            "target_quantile": quantiles,
        },
    )
    check_arm(arm)
    best_point = {
        "lr": best,
        "clip_init": best_clip,
        "clip_lr": best_clip,
        "target_quantile": best_q,
    }
    grid = centre_grid(arm, best_point)
    tuned = centred_arm(arm, best_point)  # re-validated as submission validates arms
    assert tuned.grid == grid
    # The size never changes: K, and so every grid's plan, are the untuned spec's.
    assert tuned.size() == arm.size()
    for name, axis in grid.items():
        before = arm.grid[name]
        if isinstance(before, Axis):
            assert isinstance(axis, Axis) and axis.k == before.k
        else:
            assert isinstance(axis, list) and len(axis) == len(before)
    # lr has no upper bound: its list keeps its ratios and is centred on the best exactly.
    lr = grid["lr"]
    assert isinstance(lr, list)
    for a, b in zip(lr, values, strict=True):
        assert a / lr[0] == pytest.approx(b / values[0], rel=1e-9)
    assert _gm(lr) == pytest.approx(best, rel=1e-9)
    # A logspace axis without clamping is centred on the best (in log10).
    clip_init = grid["clip_init"]
    assert isinstance(clip_init, Axis) and clip_init.logspace is not None
    a, b = clip_init.logspace
    assert (a + b) / 2 == pytest.approx(math.log10(best_clip), abs=1e-9)
    assert b - a == pytest.approx(ends[1] - ends[0], abs=1e-9)
    # Every value lies inside the descriptor's range (the open (0, 1) of target_quantile).
    hps = get_descriptor("quantile").hyperparameters
    quantiles_out = grid["target_quantile"]
    assert isinstance(quantiles_out, list)
    for v in quantiles_out:
        assert hps["target_quantile"].in_range(v)
    for point in tuned.points():
        get_descriptor("quantile").validate({k: v for k, v in point.items() if k != "lr"})
        assert point["lr"] > 0


def test_the_axis_sizing_a_second_release_is_kept() -> None:
    # quantile's count_noise splits the planned sigma: the plan's split is the spec's values'.
    arm = ArmConfig(strategy="quantile", grid={"lr": [0.1, 1.0], "count_noise": [5.0, 10.0]})
    grid = centre_grid(arm, {"lr": 1.0, "count_noise": 10.0})
    assert grid["count_noise"] == [5.0, 10.0]
    assert grid["lr"] == pytest.approx([10**-0.5, 10**0.5])
