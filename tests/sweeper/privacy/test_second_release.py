"""The planner asks a strategy's descriptor whether it has a second release (issue 39).

A strategy that is not named ``quantile`` but whose descriptor declares an optional second
release (a noisy count sized by a hyperparameter a trial may leave out) gets the count noise
chosen by :func:`workers.count_noise.auto_count_noise` in its plan, through the same
:func:`~sweeper.sweeps.planning.plan_sweep` path as quantile; one whose second release is sized
by a required hyperparameter (online) or that has none gets nothing chosen.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from dpsweep.spec import load_spec
from sweeper.sweeps.planning import plan_sweep
from workers.count_noise import auto_count_noise
from workers.options import HParam
from workers.strategies.descriptors import (
    DESCRIPTORS,
    ONLINE,
    QUANTILE,
    NoiseSplit,
    StrategyDescriptor,
    register_descriptor,
    split_noise,
)

NAME = "test-counted"


def _counted_split(sigma: float, params: Mapping[str, Any], b: float) -> NoiseSplit:
    # A count of multiplier 2 * sigma_c, sigma_c chosen by the count-noise rule when left out.
    sigma_c = params.get("sigma_c")
    if sigma_c is None:
        sigma_c = auto_count_noise(noise_multiplier=sigma, expected_batch_size=b)
    second = 2.0 * float(sigma_c)
    return NoiseSplit(gradient=split_noise(sigma, second), second=second)


@pytest.fixture
def counted() -> Iterator[StrategyDescriptor]:
    descriptor = register_descriptor(
        StrategyDescriptor(
            name=NAME,
            description="a test strategy with a noisy count (not quantile)",
            hyperparameters={
                "clip": HParam(default=1.0, help="C"),
                "sigma_c": HParam(default=None, optional=True, help="the count's noise"),
            },
            split=_counted_split,
            second_release="sigma_c",
        )
    )
    try:
        yield descriptor
    finally:
        DESCRIPTORS.pop(NAME, None)


def _spec(arms: list[dict[str, Any]]) -> Any:
    return load_spec(
        {
            "name": "second-release",
            "dataset": {"name": "wine", "test_fraction": 0.2},
            "model": {"name": "logreg"},
            "training": {"epochs": 1, "batch_size": 32},
            "privacy": {"budgets": [4.0], "delta": 1e-5, "accounting": "compose"},
            "arms": arms,
            "seeds": 1,
        }
    )


def test_the_builtin_descriptors_declare_their_second_release() -> None:
    assert QUANTILE.second_release == "count_noise" and QUANTILE.derives_second_release
    # Online's ratio has a default: the plan never chooses it.
    assert ONLINE.second_release == "direction_noise_ratio"
    assert not ONLINE.derives_second_release
    assert DESCRIPTORS["fixed"].second_release is None
    assert not DESCRIPTORS["fixed"].derives_second_release


def test_a_second_release_must_be_a_hyperparameter_with_a_split() -> None:
    with pytest.raises(ValueError, match="not one of its hyperparameters"):
        StrategyDescriptor(name="x", split=_counted_split, second_release="nope")
    with pytest.raises(ValueError, match="needs a noise split"):
        StrategyDescriptor(name="x", hyperparameters={"s": HParam(default=1.0)}, second_release="s")


def test_the_planner_chooses_the_count_noise_the_descriptor_declares(
    counted: StrategyDescriptor,
) -> None:
    spec = _spec(
        [
            {"strategy": NAME, "name": "left-out", "grid": {"lr": [0.1, 0.5]}},
            {
                "strategy": NAME,
                "name": "set",
                "grid": {"lr": [0.1]},
                "params": {"sigma_c": 40.0},
            },
            # A grid axis that sets it for some trials only: the others still need the rule.
            {
                "strategy": NAME,
                "name": "mixed",
                "grid": {"lr": [0.1], "sigma_c": [None, 40.0]},
            },
            {"strategy": "quantile", "name": "quantile", "grid": {"lr": [0.1]}},
            {"strategy": "online", "name": "online", "grid": {"lr": [0.1]}},
            {"strategy": "fixed", "name": "fixed", "grid": {"lr": [0.1]}},
        ]
    )
    plan = plan_sweep(spec)
    grids = {g.arm: g for g in plan.grids}
    b = spec.training.batch_size
    for label in ("left-out", "mixed", "quantile"):
        g = grids[label]
        chosen = auto_count_noise(noise_multiplier=g.noise_multiplier, expected_batch_size=b)
        assert g.count_noise == pytest.approx(chosen), label
        assert g.gradient_noise_multiplier > g.noise_multiplier
    for label in ("set", "online", "fixed"):
        assert grids[label].count_noise is None, label
    # The split is the descriptor's: a set sigma_c sizes the count it takes from the gradient.
    g = grids["set"]
    assert g.gradient_noise_multiplier == pytest.approx(split_noise(g.noise_multiplier, 80.0))
