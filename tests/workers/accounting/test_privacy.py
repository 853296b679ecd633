"""Reported epsilon comes from the noise actually used; calibration never overshoots."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import PRVAccountant, RDPAccountant

from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting import calibrate_noise_multiplier, compute_epsilon
from workers.datasets.records import DatasetSpec
from workers.models import ModelSpec
from workers.training.loop import train_trial
from workers.training.specs import PackSpec, TrialSpec


def opacus_epsilon(acc_cls, sigma: float, q: float, steps: int, delta: float) -> float:  # type: ignore[no-untyped-def]
    acc = acc_cls()
    acc.history = [(sigma, q, steps)]
    return float(acc.get_epsilon(delta=delta))


def spec(**kw) -> PackSpec:  # type: ignore[no-untyped-def]
    base = dict(
        dataset=DatasetSpec("wine"),
        model=ModelSpec("logreg"),
        strategy="fixed",
        trials=[TrialSpec(lr=0.5, noise_multiplier=1.3, target_delta=1e-5, params={"clip": 1.0})],
        batch_size=16,
        epochs=2,
        eval_every=5,
    )
    base.update(kw)
    return PackSpec(**base)


@pytest.mark.parametrize("accountant,acc_cls", [("rdp", RDPAccountant), ("prv", PRVAccountant)])
def test_reported_epsilon_is_the_accountants(accountant: str, acc_cls) -> None:  # type: ignore[no-untyped-def]
    r = train_trial(spec(accountant=accountant))
    assert r.private and r.accountant == accountant
    assert (
        r.sample_rate == 16 / 142
    )  # wine: 178 examples, 36 held out and r.steps == round(2 / r.sample_rate)
    expected = opacus_epsilon(acc_cls, 1.3, r.sample_rate, r.steps, 1e-5)
    assert r.epsilon == pytest.approx(expected, rel=1e-9)


def test_target_epsilon_run_ends_at_or_below_target() -> None:
    q, steps = 16 / 142, 18
    for target in (0.5, 2.0, 8.0):
        sigma = calibrate_noise_multiplier(
            target_epsilon=target, target_delta=1e-5, sample_rate=q, steps=steps
        )
        r = train_trial(spec(steps=steps, trials=[TrialSpec(lr=0.5, noise_multiplier=sigma)]))
        assert r.epsilon <= target
        assert r.epsilon > 0.95 * target  # calibration is tight, not wasteful


def test_prv_is_tighter_than_rdp() -> None:
    # The reference run of docs/environment.md: q = 256/60000, sigma = 1.1, 60 epochs, delta = 1e-5.
    q = 256 / 60000
    steps = int(60 / q)
    rdp = compute_epsilon(noise_multiplier=1.1, sample_rate=q, steps=steps, target_delta=1e-5)
    prv = compute_epsilon(
        noise_multiplier=1.1, sample_rate=q, steps=steps, target_delta=1e-5, accountant="prv"
    )
    assert rdp == pytest.approx(2.597, abs=0.01)
    assert prv == pytest.approx(2.39, abs=0.02)


@settings(max_examples=15, deadline=None)
@given(
    sigma=st.floats(0.5, 5.0),
    q=st.floats(0.001, 0.5),
    steps=st.integers(1, 2000),
)
def test_epsilon_decreases_with_noise_and_grows_with_steps(
    sigma: float, q: float, steps: int
) -> None:
    kw = dict(sample_rate=q, target_delta=1e-5)
    e = compute_epsilon(noise_multiplier=sigma, steps=steps, **kw)
    assert e > 0
    assert compute_epsilon(noise_multiplier=sigma * 1.5, steps=steps, **kw) <= e + 1e-9
    assert compute_epsilon(noise_multiplier=sigma, steps=steps * 2, **kw) >= e - 1e-9


def test_privacy_fails_closed() -> None:
    with pytest.raises(PrivacyError, match="needs a planned noise multiplier"):
        train_trial(spec(trials=[TrialSpec(lr=0.5, noise_multiplier=None)]))
    with pytest.raises(PrivacyError, match="no finite privacy guarantee"):
        train_trial(spec(trials=[TrialSpec(lr=0.5, noise_multiplier=0.0)]))
    with pytest.raises(ConfigError, match="delta must be in"):
        compute_epsilon(noise_multiplier=1.0, sample_rate=0.1, steps=10, target_delta=1.0)
    with pytest.raises(ConfigError, match="unknown accountant"):
        compute_epsilon(
            noise_multiplier=1.0, sample_rate=0.1, steps=10, target_delta=1e-5, accountant="gdp"
        )


def test_nonprivate_reports_no_epsilon() -> None:
    r = train_trial(spec(strategy="nonprivate", trials=[TrialSpec(lr=0.5, params={})]))
    assert not r.private and r.epsilon is None and r.noise_multiplier is None
