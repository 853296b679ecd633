"""The generic DP path: every strategy through the unchanged DPEngine, exact per-example
gradients (Opacus agrees), non-finite examples removed, layers that mix examples refused."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from dpsweep.errors import ConfigError
from tests.workers.generic.nets import CLASSES, TinyTransformer, token_problem, transformers
from tests.workers.streams import noise_stream, sample_stream
from workers.engine import DPEngine, per_sample_loss
from workers.generic import GenericModel, validate_module
from workers.optim import PackedOptimizer
from workers.strategies import NoiseSource, get_strategy
from workers.strategies.base import StepContext

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


def make_engine(
    model: GenericModel,
    x: torch.Tensor,
    y: torch.Tensor,
    strategy: str,
    params: dict[str, Any],
    *,
    sample_rate: float = 0.5,
) -> DPEngine:
    k = model.k
    strat = get_strategy(strategy)([params] * k, n_layers=model.n_param_layers, device=model.device)
    return DPEngine(
        model=model,  # type: ignore[arg-type]
        strategy=strat,
        optimizer=PackedOptimizer("sgd", torch.full((k,), 0.1)),
        x=x,
        y=y,
        task="classification",
        sample_rate=sample_rate,
        noise_multiplier=torch.full((k,), 1.0),
        sample_streams=[sample_stream(10 + i) for i in range(k)],
        noise=NoiseSource([noise_stream(20 + i) for i in range(k)], model.device),
    )


CASES = [
    ("fixed", {"clip": 0.5, "clip_style": "flat"}, 2),
    ("fixed", {"clip": 0.5, "clip_style": "layerwise"}, 2),
    ("automatic", {"clip": 0.5, "clip_style": "flat"}, 2),
    ("automatic", {"clip": 0.5, "clip_style": "layerwise"}, 2),
    ("global", {"clip": 0.5, "global_threshold": 1.0}, 2),
    ("quantile", {"clip_init": 0.5}, 2),
    ("online", {"clip_init": 0.5}, 2),
    ("online", {"clip_init": 0.5}, 1),  # a pack of one takes the engine's split sums
    ("bam", {"clip": 0.5, "bam_lambda": 0.1, "clip_style": "flat"}, 2),
    ("bam", {"clip": 0.5, "bam_lambda": 0.1, "clip_style": "layerwise"}, 2),
    ("nonprivate", {}, 2),
]


@pytest.mark.parametrize(("strategy", "params", "k"), CASES)
def test_every_strategy_trains_a_transformer(strategy: str, params: dict[str, Any], k: int) -> None:
    x, y = token_problem()
    model = GenericModel(transformers(k))
    assert model.layer_names == ["emb", "attn", "attn.out_proj", "norm", "head"]
    start = model.flat.clone()
    engine = make_engine(model, x, y, strategy, params)
    for _ in range(3):
        engine.step()
    assert torch.isfinite(model.flat).all()
    assert (model.flat != start).any(dim=1).all()  # every trial moved
    for name, value in engine.strategy.state().items():
        assert torch.isfinite(value).all(), name
    # The trained weights come back as a working module.
    out = model.to_module(0)(x[:4])
    assert out.shape == (4, CLASSES) and torch.isfinite(out).all()


def _dp_attention_grads(module: TinyTransformer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Opacus's per-sample gradients ``[B, P]`` (hooks mode), in ``module``'s parameter order.

    The module's activations are sequence-first, hence ``batch_first=False``.

    Opacus's hooks need its DPMultiheadAttention (separate q, k, v projections): its fixer
    builds one with the same weights, and the in-projection's gradient is their concatenation.
    """
    from opacus import GradSampleModule
    from opacus.validators import ModuleValidator

    fixed = ModuleValidator.fix(module)
    gsm = GradSampleModule(fixed, batch_first=False, loss_reduction="sum")
    loss = nn.functional.cross_entropy(gsm(x), y, reduction="sum")
    loss.backward()
    gs = {n: p.grad_sample for n, p in fixed.named_parameters()}
    gs["attn.in_proj_weight"] = torch.cat([gs.pop(f"attn.{q}linear.weight") for q in "qkv"], dim=1)
    gs["attn.in_proj_bias"] = torch.cat([gs.pop(f"attn.{q}linear.bias") for q in "qkv"], dim=1)
    b = x.shape[0]
    return torch.cat([gs[n].reshape(b, -1) for n, _ in module.named_parameters()], dim=1)


def test_clipped_per_example_gradients_equal_opacus() -> None:
    x, y = token_problem(n=10)
    (module,) = transformers(1, seed=3)
    model = GenericModel([module])
    out, cap = model.forward(x.unsqueeze(0), capture=True)
    assert cap is not None
    infos = model.layer_grads(per_sample_loss(out, y.unsqueeze(0), "classification").sum(), cap)
    clip = 0.3
    strat = get_strategy("fixed")(
        [{"clip": clip}], n_layers=model.n_param_layers, device=model.device
    )
    ctx = StepContext(
        sq_norms=model.sq_norms(infos),
        mask=torch.ones(1, 10),
        expected_batch_size=5.0,
        noise=NoiseSource([noise_stream(0)], model.device),
    )
    ours = model.per_sample_grads(infos)[0] * strat.clip(ctx).weights[0]

    ref = _dp_attention_grads(module, x, y)
    # Opacus's clipping factor: min(1, C / (||g_i|| + 1e-6)).
    factor = (clip / (ref.norm(dim=1, keepdim=True) + 1e-6)).clamp(max=1.0)
    assert (factor < 1).any()  # clipping is active
    torch.testing.assert_close(ours, ref * factor, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["tied", "conv"])
def test_per_example_gradients_equal_autograd_example_by_example(kind: str) -> None:
    from tests.workers.generic.nets import VOCAB, ResidualConv, TiedLM

    gen = torch.Generator().manual_seed(2)
    torch.manual_seed(4)
    module: nn.Module
    if kind == "tied":
        module, classes = TiedLM(), VOCAB
        x = torch.randint(VOCAB, (5, 4), generator=gen)
    else:
        module, classes = ResidualConv(), CLASSES
        x = torch.randn(5, 1, 8, 8, generator=gen)
    y = torch.randint(classes, (5,), generator=gen)
    model = GenericModel([module])
    out, cap = model.forward(x.unsqueeze(0), capture=True)
    assert cap is not None
    infos = model.layer_grads(per_sample_loss(out, y.unsqueeze(0), "classification").sum(), cap)
    ours = model.per_sample_grads(infos)[0]
    assert ours.shape == (5, model.numel)
    for i in range(5):
        module.zero_grad()
        nn.functional.cross_entropy(module(x[i : i + 1]), y[i : i + 1]).backward()
        ref = torch.cat([p.grad.reshape(-1) for p in module.parameters()])  # type: ignore[union-attr]
        torch.testing.assert_close(ours[i], ref, atol=1e-5, rtol=1e-4)


def test_bam_gradients_are_taken_at_each_examples_ascent_point() -> None:
    x, y = token_problem(n=4)
    (module,) = transformers(1, seed=5)
    model = GenericModel([module])
    engine = make_engine(model, x, y, "bam", {"clip": 0.5, "bam_lambda": 0.3})
    infos, _, _ = engine.per_sample(x.unsqueeze(0), y.unsqueeze(0), torch.ones(1, 4))
    ours = model.per_sample_grads(infos)[0]
    theta = model.flat[0].clone()
    for i in range(4):
        # theta'_i = theta + lambda g_i / ||g_i||, g_i the example's gradient at theta.
        m = model.to_module(0)
        m.zero_grad()
        nn.functional.cross_entropy(m(x[i : i + 1]), y[i : i + 1]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in m.parameters()])  # type: ignore[union-attr]
        shifted = model.to_module(0, theta + 0.3 * g / g.norm())
        shifted.zero_grad()
        nn.functional.cross_entropy(shifted(x[i : i + 1]), y[i : i + 1]).backward()
        ref = torch.cat([p.grad.reshape(-1) for p in shifted.parameters()])  # type: ignore[union-attr]
        assert not torch.allclose(ref, g, atol=1e-4)  # the ascent moved the gradient
        torch.testing.assert_close(ours[i], ref, atol=1e-5, rtol=1e-4)


def test_an_example_with_a_non_finite_gradient_gets_weight_zero() -> None:
    from tests.workers.generic.nets import FeatureMixer

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 16, generator=gen)
    y = torch.randint(3, (8,), generator=gen)
    x[2, 0] = math.inf
    torch.manual_seed(0)
    model = GenericModel([FeatureMixer(16, 3, tokens=4)])
    engine = make_engine(model, x, y, "fixed", {"clip": 1.0}, sample_rate=1.0)
    mask = torch.ones(1, 8)
    _, sq, ctx = engine.per_sample(x.unsqueeze(0), y.unsqueeze(0), mask)
    assert sq is not None and torch.isfinite(sq).all()
    assert ctx.mask[0].tolist() == [1, 1, 0, 1, 1, 1, 1, 1]
    engine.step()
    assert torch.isfinite(model.flat).all()


@pytest.mark.parametrize(
    ("layer", "kind"), [(nn.BatchNorm1d(8), "BatchNorm1d"), (nn.BatchNorm2d(8), "BatchNorm2d")]
)
def test_batch_norm_is_refused_with_the_fix(layer: nn.Module, kind: str) -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.ReLU(), layer), nn.Linear(8, 2))
    with pytest.raises(ConfigError) as err:
        GenericModel([net])
    msg = str(err.value)
    assert f"{kind} at '1.1'" in msg and "GroupNorm" in msg and "ModuleValidator.fix" in msg


def test_other_unsupported_layers_are_refused() -> None:
    with pytest.raises(ConfigError, match="track_running_stats=False"):
        validate_module(nn.Sequential(nn.InstanceNorm1d(4, track_running_stats=True)))
    with pytest.raises(ConfigError, match=r"Dropout at 'drop'.*set its dropout"):
        validate_module(nn.ModuleDict({"drop": nn.Dropout(0.1)}))
    # Opacus refuses attention only for its hooks; torch.func differentiates it exactly.
    validate_module(nn.MultiheadAttention(8, 2))
