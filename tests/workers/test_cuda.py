"""The engine on a CUDA GPU: a pack trained there equals the same pack trained on the CPU.

These tests run only where ``torch.cuda.is_available()`` (marker ``cuda``); CI has no GPU and
skips them. They are run by hand on a GPU machine:
``pytest --noconftest -m cuda tests/workers/test_cuda.py`` (``--noconftest``: the suite's
conftest prepares Ray, which these tests do not use and a bare GPU image may lack).

What they pin: the device changes where the arithmetic runs, never what is sampled or added.
Poisson batches and Gaussian noise come from the same per-trial streams on the host in both
cases (reproducible mode here, so both runs draw the same ones), so any difference is float
rounding of the model's own kernels, and TF32 is switched off so that rounding stays at fp32's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from workers.datasets.records import DatasetSpec
from workers.models import ModelSpec
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialSpec

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CASES = [
    ("fixed", "mlp", [{"clip": 0.5}, {"clip": 2.0}, {"clip": 1.0}]),
    ("fixed", "cnn", [{"clip": 0.5}, {"clip": 2.0}, {"clip": 1.0}]),
    ("automatic", "mlp", [{"clip": 0.5}, {"clip": 2.0, "stability": 0.1}, {}]),
    ("quantile", "mlp", [{"target_quantile": 0.3}, {"target_quantile": 0.7}, {}]),
    ("online", "mlp", [{"clip_init": 0.1}, {"clip_init": 1.0, "lr_lr": 0.01}, {}]),
    ("bam", "cnn", [{"bam_lambda": 0.1}, {"bam_lambda": 0.3}, {}]),
    ("lipschitz", "lip_mlp", [{}, {}, {}]),
]


@pytest.fixture(autouse=True)
def fp32_kernels() -> Iterator[None]:
    """TF32 off, so the GPU's matmuls and convolutions round as fp32 does on the CPU."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def pack(strategy: str, model: str, params: list[dict], device: str, **kw) -> PackSpec:  # type: ignore[no-untyped-def]
    lrs = [0.02, 0.05, 0.01] if strategy == "lipschitz" else [0.5, 1.0, 0.2]
    trials = [
        TrialSpec(lr=lr, seed=10 + i, noise_multiplier=[0.8, 1.5, 3.0][i], params=p)
        for i, (lr, p) in enumerate(zip(lrs, params, strict=True))
    ]
    base: dict[str, Any] = dict(
        dataset=DatasetSpec("digits"),
        model=ModelSpec(model),
        strategy=strategy,
        trials=trials,
        batch_size=32,
        steps=12,
        eval_every=6,
        randomness="reproducible",
        device=device,
    )
    base.update(kw)
    return PackSpec(**base)


@pytest.mark.parametrize("strategy,model,params", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_pack_on_the_gpu_equals_the_pack_on_the_cpu(
    strategy: str, model: str, params: list[dict]
) -> None:
    gpu = train_pack(pack(strategy, model, params, "cuda"))
    cpu = train_pack(pack(strategy, model, params, "cpu"))
    for g, c in zip(gpu, cpu, strict=True):
        assert g.epsilon == c.epsilon
        assert g.checkpoint is not None and c.checkpoint is not None
        assert g.checkpoint.device.type == "cpu"  # results leave the worker on the host
        # A rounding difference that crosses a cell of the noise's snapping grid moves a
        # weight by one cell (2**-12 noise standard deviations): a few 1e-4 at most here.
        torch.testing.assert_close(g.checkpoint, c.checkpoint, rtol=1e-3, atol=2e-3)
        for hg, hc in zip(g.history, c.history, strict=True):
            assert hg["step"] == hc["step"]
            assert hg["accuracy"] == pytest.approx(hc["accuracy"], abs=0.02)
            assert hg["loss"] == pytest.approx(hc["loss"], rel=1e-2, abs=1e-3)


def test_secret_randomness_on_the_gpu_learns_and_never_repeats() -> None:
    from workers.accounting import calibrate_noise_multiplier
    from workers.datasets.loading import load_dataset
    from workers.schedule import plan_steps

    data = load_dataset(DatasetSpec("digits"))
    q, steps = plan_steps(n_train=data.n_train, batch_size=64, epochs=5, steps=None)
    sigma = calibrate_noise_multiplier(
        target_epsilon=8, target_delta=1e-5, sample_rate=q, steps=steps
    )

    def run() -> list[Any]:
        return train_pack(
            PackSpec(
                dataset=DatasetSpec("digits"),
                model=ModelSpec("mlp"),
                strategy="fixed",
                trials=[TrialSpec(lr=1.0, seed=1, noise_multiplier=sigma, params={"clip": 1.0})],
                batch_size=64,
                epochs=5,
                eval_every=50,
                device="cuda",
            )
        )

    (a,), (b,) = run(), run()
    assert a.epsilon <= 8 and math.isfinite(a.metrics["loss"])
    assert a.metrics["accuracy"] > 0.6  # chance is 0.1
    # A fresh OS secret per run: the same public seed gives other batches and noise.
    assert not bool((a.checkpoint == b.checkpoint).all())
