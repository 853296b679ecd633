"""Audits of real training runs: the real mechanism never shows more than it claims, and each
injected fault does (issues 38 and 49).

Every audit trains through the sweeps' own code (:func:`workers.training.loop.train_pack`):
every strategy, both engine paths, packs of one and of two. The faults are test fixtures that
patch the engine (:mod:`tests.workers.canary_audit.faults`), never options a user could set.

The honest runs are audited where the bound comes nearest the truth: full batches (q = 1) and
few steps, at a claimed epsilon of 8 (the bound reaches about 0.3 of it there; at q 0.045 every
bound is near 0 and proves nothing about soundness). A 95 % lower bound is above the truth 5 %
of the time at most, and the claim is an upper bound on the truth; the thousands-of-runs
soundness tests on simulated mechanisms are in ``test_soundness.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.workers.canary_audit.faults import inject, scale_noise
from workers.accounting.compute import calibrate_noise_multiplier
from workers.canary_audit.run import AuditResult, run_audit
from workers.datasets.loading import load_dataset
from workers.datasets.records import Dataset, DatasetSpec
from workers.models.descriptors import ModelSpec
from workers.training.specs import PackSpec, TrialSpec

DELTA = 1e-5


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset(DatasetSpec(name="digits"))


def audit(
    data: Dataset,
    *,
    strategy: str = "fixed",
    params: dict[str, Any] | None = None,
    model: ModelSpec | None = None,
    trials: int = 1,
    epsilon: float = 2.0,
    batch_size: int = 256,
    steps: int = 30,
    canaries: int = 1000,
    setting: str = "white-box",
    direction: str = "auto",
) -> AuditResult:
    q = batch_size / data.x_train.shape[0]
    sigma = calibrate_noise_multiplier(
        target_epsilon=epsilon,
        target_delta=DELTA,
        sample_rate=q,
        steps=steps * trials,
        accountant="rdp",
    )
    spec = PackSpec(
        dataset=DatasetSpec(name="digits"),
        model=model or ModelSpec("mlp", {}),
        strategy=strategy,
        trials=[
            TrialSpec(
                lr=0.3 + 0.1 * i,
                seed=i,
                noise_multiplier=sigma,
                target_delta=DELTA,
                params=dict(params or {}),
            )
            for i in range(trials)
        ],
        batch_size=batch_size,
        steps=steps,
        accountant="rdp",
    )
    return run_audit(
        spec,
        setting=setting,  # type: ignore[arg-type]
        canaries=canaries,
        direction=direction,  # type: ignore[arg-type]
        dataset=data,
        public_data=True,
    )


HONEST = [
    pytest.param("fixed", {"clip": 1.0}, None, 1, id="fixed-flat"),
    pytest.param("fixed", {"clip": 1.0, "clip_style": "layerwise"}, None, 1, id="fixed-layerwise"),
    pytest.param("automatic", {"clip": 1.0}, None, 1, id="automatic"),
    pytest.param("global", {"clip": 1.0, "global_threshold": 4.0}, None, 1, id="global"),
    pytest.param("quantile", {}, None, 1, id="quantile"),
    pytest.param("online", {}, None, 1, id="online"),
    pytest.param("bam", {"clip": 1.0}, None, 1, id="bam"),
    pytest.param("lipschitz", {}, ModelSpec("lip_mlp", {}), 1, id="lipschitz"),
    pytest.param("fixed", {"clip": 1.0}, None, 2, id="packed-k2"),
    pytest.param(
        "fixed", {"clip": 1.0}, ModelSpec("res_cnn", {"width": 8, "blocks": 1}), 2, id="generic-k2"
    ),
]


@pytest.mark.parametrize(("strategy", "params", "model", "trials"), HONEST)
def test_the_real_mechanism_never_shows_more_than_it_claims(
    digits: Dataset, strategy: str, params: dict[str, Any], model: ModelSpec | None, trials: int
) -> None:
    # Full batches, 10 steps, a claim of 8: where the bound comes nearest the truth.
    result = audit(
        digits,
        strategy=strategy,
        params=params,
        model=model,
        trials=trials,
        epsilon=8.0,
        batch_size=int(digits.x_train.shape[0]),
        steps=10,
    )
    assert result.strategy == strategy and result.trials == trials
    assert result.engine_path == ("generic" if model and model.name == "res_cnn" else "packed")
    assert result.epsilon_claimed == pytest.approx(8.0, rel=0.02)
    assert 0.0 < result.epsilon_lower_bound <= result.epsilon_claimed
    assert result.method == "one-run" and not result.exceeds_claim
    assert "no evidence of a leak" in result.verdict
    # The Gaussian estimate, where its check passed, does not exceed the claim either.
    assert not result.estimate_exceeds_claim, result


def test_the_default_sampling_rate_stays_below_the_claim(digits: Dataset) -> None:
    """Where users train (q 64/1437, 60 steps): the bound is small, and below the claim."""
    result = audit(digits, batch_size=64, steps=60)
    assert result.epsilon_claimed == pytest.approx(2.0, rel=0.02)
    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_claimed
    assert not result.exceeds_claim and result.false_alarm_rate == pytest.approx(0.05)


def test_white_box_detects_the_canaries_of_an_honest_run(digits: Dataset) -> None:
    """Not vacuous: full-batch white-box auditing finds a part of a claimed epsilon of 8 with
    no assumption (at m = 1000 the one-run bound sees about 0.3 of a Gaussian mechanism's
    epsilon), and the Gaussian estimate, whose check passes on these scores, most of it."""
    result = audit(digits, epsilon=8.0, batch_size=int(digits.x_train.shape[0]), steps=10)
    assert 1.5 < result.epsilon_lower_bound <= result.epsilon_claimed
    assert result.epsilon_estimate is not None
    assert result.epsilon_lower_bound < result.epsilon_estimate <= result.epsilon_claimed
    assert "Gaussian scores" in result.estimate_assumption
    assert set(result.to_dict()) >= {
        "epsilon_claimed",
        "epsilon_lower_bound",
        "confidence",
        "canaries",
        "setting",
        "strategy",
        "engine_path",
        "seconds",
        "exceeds_claim",
        "false_alarm_rate",
        "verdict",
        "epsilon_estimate",
        "estimate_assumption",
    }


def test_black_box_runs_and_stays_below_the_claim(digits: Dataset) -> None:
    result = audit(digits, epsilon=8.0, setting="black-box", canaries=200, steps=40)
    assert result.setting == "black-box" and result.direction is None
    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_claimed
    assert not result.exceeds_claim


# -- injected faults -------------------------------------------------------------------------


@pytest.fixture
def halved_noise(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    inject("halved_noise", monkeypatch)
    yield


@pytest.fixture
def shared_noise(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    inject("shared_noise", monkeypatch)
    yield


@pytest.fixture
def unclipped_example(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    inject("unclipped_example", monkeypatch)
    yield


@pytest.fixture
def doubled_rate(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    inject("doubled_rate", monkeypatch)
    yield


# Each fault is audited where the default m = 1000 canaries resolve it: full batches for the
# noise; a moderate rate and many steps (where the privacy loss grows with q) for the
# sampling; many steps for one unclipped example per step.
#
# Shared noise and an unclipped example make some canaries stand out without noise: the
# bound, which assumes nothing, exceeds the claim. Halved noise and a doubled rate leave the
# mechanism Gaussian-shaped at about twice its claimed epsilon, and at m = 1000 the one-run
# bound sees only about 0.3 of a Gaussian mechanism's epsilon (docs/auditing.md): the bound
# stays below the claim, and the Gaussian estimate, whose normality check passes on these
# scores, exceeds it. The verdict says so, and that the estimate is no guarantee.


def test_halved_noise_is_caught(digits: Dataset, halved_noise: None) -> None:
    result = audit(digits, epsilon=4.0, batch_size=int(digits.x_train.shape[0]), steps=10)
    assert result.estimate_exceeds_claim, result
    assert result.epsilon_estimate is not None and result.epsilon_estimate > 1.3 * 4.0
    assert "the Gaussian estimate does" in result.verdict


def test_noise_shared_between_trials_is_caught(digits: Dataset, shared_noise: None) -> None:
    result = audit(digits, epsilon=1.0, trials=2, batch_size=700, steps=20)
    assert result.exceeds_claim and result.epsilon_lower_bound > result.epsilon_claimed, result
    assert "exceeds the claimed epsilon" in result.verdict and "public data" in result.verdict


def test_an_unclipped_example_is_caught(digits: Dataset, unclipped_example: None) -> None:
    result = audit(digits, epsilon=1.0, batch_size=128, steps=300)
    assert result.exceeds_claim and result.epsilon_lower_bound > result.epsilon_claimed, result


def test_sampling_at_twice_the_rate_is_caught(digits: Dataset, doubled_rate: None) -> None:
    result = audit(digits, epsilon=4.0, batch_size=256, steps=100)
    assert result.estimate_exceeds_claim, result
    assert result.epsilon_estimate is not None and result.epsilon_estimate > 1.2 * 4.0


def test_noise_at_four_fifths_of_its_scale_is_caught(
    digits: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 49's subtle fault: noise at 0.8 of its planned scale (true epsilon about 9.8 for a
    claim of 8). Out of the bound's reach (its ceiling is about 3 at this m), it is caught by
    the Gaussian estimate with 5000 Dirac canaries (5 of 5 in bench/audit.py --noise-scale,
    estimates 9.1-9.8), which ``auto`` picks for the mlp's 9,738 parameters."""
    scale_noise(0.8, monkeypatch)
    n = int(digits.x_train.shape[0])
    result = audit(digits, epsilon=8.0, batch_size=n, steps=10, canaries=5000)
    assert result.direction == "dirac"
    assert result.epsilon_estimate is not None and result.estimate_exceeds_claim, result
    assert result.epsilon_lower_bound <= result.epsilon_claimed
