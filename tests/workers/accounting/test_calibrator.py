"""The one calibrator (workers.accounting.calibrator): never above the target, within slack.

Issue 41 gave it a model-guided second point (a Newton step with the mu-GDP slope); these
properties hold whatever the search does: the returned multiplier's epsilon is at most the
target and at least ``target * (1 - slack)``, and a larger multiplier does not fit worse.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.accounting.calibrator import CALIBRATION_SLACK, calibrate_sigma, gdp_slope
from workers.accounting.epsilon import dp_rdp_epsilon, pld_epsilon


def _counted(fn):  # type: ignore[no-untyped-def]
    calls: list[float] = []

    def wrapped(sigma: float) -> float:
        calls.append(sigma)
        return fn(sigma)

    return wrapped, calls


@settings(max_examples=40, deadline=None)
@given(
    scale=st.floats(0.05, 20.0),
    power=st.floats(0.3, 3.0),
    target=st.floats(0.1, 20.0),
    q=st.floats(1e-4, 0.5),
    steps=st.integers(1, 10**6),
)
def test_calibrated_sigma_fits_the_target_within_slack(
    scale: float, power: float, target: float, q: float, steps: int
) -> None:
    """Any decreasing epsilon curve, however far from the model the calibrator starts with."""

    def epsilon_of(sigma: float) -> float:
        return scale * sigma**-power

    fn, calls = _counted(epsilon_of)
    sigma = calibrate_sigma(
        fn,
        target_epsilon=target,
        target_delta=1e-5,
        sample_rate=q,
        steps=steps,
        max_noise_multiplier=1280.0,
    )
    if math.isinf(sigma):  # then even 8 * 1280 does not fit
        assert epsilon_of(8 * 1280.0) > target
        return
    eps = epsilon_of(sigma)
    assert eps <= target
    assert eps >= target * (1 - CALIBRATION_SLACK) or sigma <= 1e-3 * (1 + 1e-9)
    # More noise never fits worse (the curve is decreasing): sigma is the band's, not a fluke.
    assert epsilon_of(sigma * (1 + 1e-3)) <= target
    assert len(calls) <= 50


@settings(max_examples=6, deadline=None)
@given(
    q=st.floats(1e-3, 0.3),
    steps=st.integers(50, 20_000),
    target=st.floats(0.5, 12.0),
    eval_sigma=st.one_of(st.none(), st.floats(20.0, 100.0)),
)
def test_calibrating_the_rdp_accountant_never_overshoots(
    q: float, steps: int, target: float, eval_sigma: float | None
) -> None:
    def epsilon_of(sigma: float) -> float:
        return dp_rdp_epsilon(
            noise_multiplier=sigma,
            sample_rate=q,
            steps=steps,
            target_delta=1e-5,
            eval_noise_multiplier=eval_sigma,
            eval_releases=0 if eval_sigma is None else 1,
        )

    sigma = calibrate_sigma(
        epsilon_of,
        target_epsilon=target,
        target_delta=1e-5,
        sample_rate=q,
        steps=steps,
        max_noise_multiplier=1280.0,
        eval_noise_multiplier=eval_sigma,
    )
    assert math.isfinite(sigma)
    assert target * (1 - CALIBRATION_SLACK) <= epsilon_of(sigma) <= target


def test_a_large_grid_calibrates_in_two_accountant_calls() -> None:
    """The 10,000-trial bench grid (issue 41): the model's slope lands in the band at once."""

    def epsilon_of(sigma: float) -> float:
        return pld_epsilon(
            noise_multiplier=sigma, sample_rate=0.0445, steps=900_000, target_delta=1e-5
        )

    fn, calls = _counted(epsilon_of)
    sigma = calibrate_sigma(
        fn,
        target_epsilon=8.0,
        target_delta=1e-5,
        sample_rate=0.0445,
        steps=900_000,
        max_noise_multiplier=1280.0,
    )
    assert 8.0 * (1 - CALIBRATION_SLACK) <= epsilon_of(sigma) <= 8.0
    assert len(calls) == 2


@pytest.mark.parametrize("eval_sigma", [None, 30.0])
def test_the_models_slope_is_negative_or_nan(eval_sigma: float | None) -> None:
    slope = gdp_slope(
        sigma=1.0, target_delta=1e-5, sample_rate=0.01, steps=1000, eval_noise_multiplier=eval_sigma
    )
    assert slope < 0
    assert math.isnan(gdp_slope(sigma=1e-3, target_delta=1e-5, sample_rate=0.5, steps=10**6))
