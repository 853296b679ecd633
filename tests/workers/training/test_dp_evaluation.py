"""DP evaluation in the worker (``eval: {mode: dp}``): accuracy and the checkpoint choice come
from noisy counts, as many as the plan charged, and nothing exact about the private evaluation
records leaves (no loss, calibration, reliability bins or clipping diagnostics)."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting import compute_epsilon
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.models import ModelSpec, build_model
from workers.packed import PackedModel
from workers.plan_check import PlanMismatch, PlannedRun
from workers.randomness import NoiseSource, TrialRandomness
from workers.schedule import eval_releases, plan_steps
from workers.training.evaluation import _noisy_accuracy
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialSpec

DP_DIGITS = DatasetSpec("digits", evaluation="dp")
SIGMA_E = 4.0


def _pack(**changes: Any) -> PackSpec:
    spec = PackSpec(
        dataset=DP_DIGITS,
        model=ModelSpec("logreg"),
        strategy="fixed",
        trials=[
            TrialSpec(lr=0.5, seed=s, noise_multiplier=1.0, params={"clip": 1.0}) for s in (0, 1)
        ],
        batch_size=64,
        steps=20,
        eval_every=5,
        eval_noise_multiplier=SIGMA_E,
    )
    return replace(spec, **changes)


def _planned(spec: PackSpec, **changes: Any) -> PlannedRun:
    data = load_dataset(spec.dataset)
    q, steps = plan_steps(
        n_train=data.n_train, batch_size=spec.batch_size, epochs=spec.epochs, steps=spec.steps
    )
    planned = PlannedRun(
        strategy=spec.strategy,
        sample_rate=q,
        steps=steps,
        noise_multiplier=1.0,
        dataset_sha256=data.content_sha256,
        eval_mode="dp",
        eval_noise_multiplier=SIGMA_E,
        eval_releases=eval_releases(steps=steps, eval_every=spec.eval_every),
    )
    return replace(planned, **changes)


def test_dp_evaluation_releases_only_noisy_accuracy() -> None:
    spec = _pack()
    results = train_pack(replace(spec, planned=_planned(spec)))
    data = load_dataset(DP_DIGITS)
    n_eval = len(data.y_test)
    for r in results:
        assert r.evaluation == "dp"
        # The metrics are the noisy accuracy of a fresh measurement of the chosen checkpoint
        # (and the noisy value that chose it); nothing else about the evaluation records.
        assert set(r.metrics) == {"accuracy", "accuracy_at_selection"}
        assert set(r.final_metrics) == {"accuracy"}
        for h in r.history:
            assert set(h) <= {"step", "accuracy", "diverged"}
        # No clipping diagnostics: they would be computed on private evaluation records.
        assert not {"frac_clipped", "clip_bias", "grad_cos"} & set(r.trajectories)
        # Noise is there: an exact accuracy is a multiple of 1/n_eval.
        counts = [h["accuracy"] * n_eval for h in r.history if "accuracy" in h]
        assert any(abs(c - round(c)) > 1e-6 for c in counts)
        # The single run's epsilon includes its noisy evaluations.
        e = eval_releases(steps=20, eval_every=5)
        assert len(r.history) == e - 1
        without = compute_epsilon(
            noise_multiplier=1.0, sample_rate=r.sample_rate, steps=20, target_delta=1e-5
        )
        assert r.epsilon is not None and r.epsilon > without
        assert r.epsilon == pytest.approx(
            compute_epsilon(
                noise_multiplier=1.0,
                sample_rate=r.sample_rate,
                steps=20,
                target_delta=1e-5,
                eval_noise_multiplier=SIGMA_E,
                eval_releases=e,
            )
        )


def test_the_noisy_count_is_a_gaussian_of_sensitivity_one() -> None:
    """The mechanism itself: mean the exact accuracy, std sigma_e / M (the count's noise has
    std sigma_e, the sensitivity of a count being 1), and fresh secret noise every call."""
    data = load_dataset(DP_DIGITS)
    x = torch.from_numpy(data.x_test)
    y = torch.from_numpy(data.y_test)
    modules = [
        build_model(ModelSpec("logreg"), input_shape=data.input_shape, num_classes=10, seed=s)
        for s in (0, 1)
    ]
    model = PackedModel(modules, device=torch.device("cpu"))
    with torch.no_grad():
        out, _ = model.forward(x.unsqueeze(0).expand(2, *x.shape))
    # Labels that make trial 0 exactly half right, far from the clamps at 0 and 1.
    pred = out[0].argmax(dim=-1)
    half = torch.arange(len(y)) < len(y) // 2
    y = torch.where(half, pred, (pred + 1) % 10)
    exact = (out.argmax(dim=-1) == y).double().mean(dim=1).tolist()
    assert exact[0] == (len(y) // 2) / len(y)
    noise = NoiseSource([TrialRandomness.secret().evaluation for _ in range(2)], "cpu")
    sigma_e, m = 30.0, len(y)
    draws = [_noisy_accuracy(model, x, y, noise, noise_multiplier=sigma_e) for _ in range(400)]
    vals = [d[0]["accuracy"] for d in draws]
    # Mean within 4 standard errors; std sigma_e / M (std 0.084 here: no clamping at 0.5).
    assert statistics.fmean(vals) == pytest.approx(exact[0], abs=4 * sigma_e / m / 20)
    assert statistics.stdev(vals) == pytest.approx(sigma_e / m, rel=0.15)
    # Fresh noise every call (snapped to a grid of 2^-12 sigma: a few draws may coincide).
    assert len(set(vals)) > 380
    # Trial 1 draws from its own stream: not the same noise.
    assert [d[1]["accuracy"] - exact[1] for d in draws[:5]] != [v - exact[0] for v in vals[:5]]


def test_reproducible_mode_repeats_the_noisy_counts() -> None:
    spec = _pack(randomness="reproducible")
    spec = replace(spec, planned=_planned(spec))
    a, b = train_pack(spec), train_pack(spec)
    assert [h["accuracy"] for h in a[0].history] == [h["accuracy"] for h in b[0].history]


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"eval_noise_multiplier": SIGMA_E / 2}, "evaluation noise multiplier"),
        ({"eval_every": 4}, "noisy evaluations per trial"),
    ],
)
def test_a_run_other_than_its_planned_evaluation_is_refused(
    changes: dict[str, Any], says: str
) -> None:
    spec = _pack()
    planned = _planned(spec)
    with pytest.raises(PlanMismatch, match=says):
        train_pack(replace(spec, planned=planned, **changes))


def test_private_evaluation_records_need_planned_noise() -> None:
    with pytest.raises(PrivacyError, match="no evaluation noise was planned"):
        train_pack(_pack(eval_noise_multiplier=None))
    with pytest.raises(ConfigError, match="eval mode dp") as err:
        train_pack(_pack(dataset=DatasetSpec("digits")))
    assert err.value.field == "eval.mode"
    with pytest.raises(ConfigError, match="classification") as err:
        train_pack(_pack(model=ModelSpec("autoencoder")))
    assert err.value.field == "eval.mode"
    with pytest.raises(PrivacyError, match="no privacy guarantee"):
        train_pack(_pack(eval_noise_multiplier=math.inf))


def test_carve_out_metrics_are_unchanged() -> None:
    """The default mode keeps exact metrics and diagnostics (a regression guard)."""
    spec = _pack(dataset=DatasetSpec("digits"), eval_noise_multiplier=None)
    r = train_pack(spec)[0]
    assert r.evaluation == "carve-out"
    assert {"accuracy", "loss", "ece", "mce", "reliability"} <= set(r.metrics)
    data = load_dataset(DatasetSpec("digits"))
    acc = r.metrics["accuracy"] * len(data.y_test)
    assert abs(acc - round(acc)) < 1e-9
    assert np.isfinite(r.metrics["loss"])
