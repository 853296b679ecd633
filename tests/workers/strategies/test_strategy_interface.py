"""The strategy interface carries what the next strategies need, without touching the step loop.

A test-only strategy uses every hook: a split gradient noise multiplier, an extra noised release,
state updated only from noised releases, a learning-rate scale, and a post-step projection.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from tests.workers.packed.test_per_sample import reference_per_sample
from tests.workers.packed.test_step import NOISE_SEED, SAMPLE_SEED, tiny_problem
from tests.workers.streams import noise_stream, noised, normals, sample_stream
from workers.engine import DPEngine
from workers.models import ModelSpec, build_model
from workers.optim import PackedOptimizer
from workers.packed import PackedModel
from workers.sampling import poisson_sample
from workers.strategies import (
    ClippingStrategy,
    ClipResult,
    ExtraRelease,
    HParam,
    NoiseSource,
    StepContext,
)


class ProbeStrategy(ClippingStrategy):
    name = "probe"
    hyperparameters: ClassVar = {"clip": HParam(default=0.3)}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.c = self.tensor("clip")
        self.seen: list[dict[str, Tensor]] = []
        self.projections = 0

    def gradient_noise_multiplier(self, noise_multiplier: Tensor) -> Tensor:
        return 2.0 * noise_multiplier

    def clip(self, ctx: StepContext) -> ClipResult:
        assert ctx.sq_norms is not None
        n = ctx.sq_norms.sum(-1).sqrt()
        w = torch.clamp(self.c[:, None] / n, max=1.0) * ctx.mask
        # A unit-norm direction sum (sensitivity 1), like OSO-DPSGD's second query.
        u = (1.0 / n) * ctx.mask
        extra = ExtraRelease(
            "direction", u.unsqueeze(-1), torch.ones(self.k), torch.full((self.k,), 3.0)
        )
        return ClipResult(weights=w.unsqueeze(-1), sensitivity=self.c, extra=(extra,))

    def observe(self, releases: Mapping[str, Tensor], noise: NoiseSource) -> None:
        self.seen.append({k: v.clone() for k, v in releases.items()})

    def lr_scale(self) -> Tensor | None:
        return torch.full((self.k,), 0.5)

    def after_step(self, flat_params: Tensor) -> None:
        self.projections += 1
        flat_params.clamp_(-10.0, 10.0)


def test_every_hook_is_honoured() -> None:
    module, x, y = tiny_problem()
    ref = build_model(ModelSpec("mlp", {"hidden": [5]}), input_shape=(4,), num_classes=3, seed=5)
    theta0 = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    model = PackedModel([module])
    strat = ProbeStrategy([{"clip": 0.3}], n_layers=model.n_param_layers, device=model.device)
    q, sigma, lr = 0.5, 0.7, 0.1
    engine = DPEngine(
        model=model,
        strategy=strat,
        optimizer=PackedOptimizer("sgd", torch.tensor([lr])),
        x=x,
        y=y,
        task="classification",
        sample_rate=q,
        noise_multiplier=torch.tensor([sigma]),
        sample_streams=[sample_stream(SAMPLE_SEED)],
        noise=NoiseSource([noise_stream(NOISE_SEED)], model.device),
    )
    engine.step()

    idx = poisson_sample(len(x), sample_rate=q, stream=sample_stream(SAMPLE_SEED))
    # The gradient's noise is drawn first, then the extra release's.
    xi_grad, xi_dir = normals(NOISE_SEED, theta0.numel(), theta0.numel())
    g = reference_per_sample(ref, x[idx], y[idx], "classification")
    n = g.norm(dim=1, keepdim=True)
    b = q * len(x)
    grad = noised((torch.clamp(0.3 / n, max=1.0) * g).sum(0) / b, xi_grad, 2.0 * sigma * 0.3 / b)
    direction = noised((g / n).sum(0) / b, xi_dir, 3.0 * 1.0 / b)

    assert len(strat.seen) == 1 and strat.projections == 1
    torch.testing.assert_close(strat.seen[0]["grad"], grad.unsqueeze(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        strat.seen[0]["direction"], direction.unsqueeze(0), rtol=1e-5, atol=1e-6
    )
    expected = (theta0 - 0.5 * lr * grad).clamp(-10.0, 10.0)
    torch.testing.assert_close(engine.model.flat[0], expected, rtol=1e-5, atol=1e-6)


class LyingStrategy(ClippingStrategy):
    """Claims sensitivity C but does not clip: the engine must refuse to release."""

    name = "liar"
    hyperparameters: ClassVar = {}

    def clip(self, ctx: StepContext) -> ClipResult:
        return ClipResult(weights=ctx.mask.unsqueeze(-1), sensitivity=torch.full((self.k,), 1e-3))


def test_an_understated_sensitivity_fails_closed() -> None:
    import pytest

    from dpsweep.errors import PrivacyError

    module, x, y = tiny_problem()
    model = PackedModel([module])
    theta0 = model.flat.clone()
    strat = LyingStrategy([{}], n_layers=model.n_param_layers, device=model.device)
    engine = DPEngine(
        model=model,
        strategy=strat,
        optimizer=PackedOptimizer("sgd", torch.tensor([0.1])),
        x=x,
        y=y,
        task="classification",
        sample_rate=0.5,
        noise_multiplier=torch.tensor([1.0]),
        sample_streams=[sample_stream(SAMPLE_SEED)],
        noise=NoiseSource([noise_stream(NOISE_SEED)], model.device),
    )
    with pytest.raises(PrivacyError, match="exceeds the strategy's claimed sensitivity"):
        engine.step()
    assert torch.equal(model.flat, theta0)  # nothing was released or applied


def test_sensitivity_check_tolerates_diverged_trials_but_not_finite_excess() -> None:
    import pytest

    from dpsweep.errors import PrivacyError
    from workers.engine import _check_sensitivity

    sq = torch.tensor([[[4.0], [1.0]], [[1.0], [1.0]]])  # [K=2, B=2, groups=1]
    sens = torch.tensor([1.0, 1.0])
    # Trial 0 diverged: NaN weights make its release NaN (no claim is false) -> no error.
    w = torch.tensor([[[float("nan")], [0.5]], [[1.0], [1.0]]])
    _check_sensitivity("grad", sq, w, sens)
    # A finite excess in trial 1 still fails closed, even beside a diverged trial 0.
    w_bad = torch.tensor([[[float("nan")], [0.5]], [[1.0], [1.5]]])
    with pytest.raises(PrivacyError, match="trial 1"):
        _check_sensitivity("grad", sq, w_bad, sens)
