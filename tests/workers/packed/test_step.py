"""One DP-SGD step equals the hand computation and Opacus's DPOptimizer; optimizers match torch."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.workers.packed.test_per_sample import reference_per_sample
from tests.workers.streams import noise_stream, noised, normals, sample_stream
from workers.engine import _ENFORCED, DPEngine
from workers.models import ModelSpec, build_model
from workers.optim import PackedOptimizer
from workers.packed import PackedModel
from workers.sampling import poisson_sample
from workers.strategies import NoiseSource, get_strategy

N, D, C_OUT = 12, 4, 3
SAMPLE_SEED, NOISE_SEED = 11, 22


def make_engine(
    module: nn.Sequential,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    strategy: str = "fixed",
    params: dict | None = None,
    sample_rate: float = 0.5,
    noise_multiplier: float = 0.7,
    lr: float = 0.1,
    optimizer: str = "sgd",
) -> DPEngine:
    model = PackedModel([module])
    strat = get_strategy(strategy)(
        [params if params is not None else {"clip": 0.3}],
        n_layers=model.n_param_layers,
        device=model.device,
    )
    return DPEngine(
        model=model,
        strategy=strat,
        optimizer=PackedOptimizer(optimizer, torch.tensor([lr])),
        x=x,
        y=y,
        task="classification",
        sample_rate=sample_rate,
        noise_multiplier=torch.tensor([noise_multiplier]),
        sample_streams=[sample_stream(SAMPLE_SEED)],
        noise=NoiseSource([noise_stream(NOISE_SEED)], model.device),
    )


def tiny_problem() -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=gen) * 3.0  # large inputs: clipping is active
    y = torch.randint(C_OUT, (N,), generator=gen)
    module = build_model(
        ModelSpec("mlp", {"hidden": [5]}), input_shape=(D,), num_classes=C_OUT, seed=5
    )
    return module, x, y


def flat_params(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def expected_batch_and_noise(
    n_params: int, sample_rate: float
) -> tuple[torch.Tensor, torch.Tensor]:
    idx = poisson_sample(N, sample_rate=sample_rate, stream=sample_stream(SAMPLE_SEED))
    (xi,) = normals(NOISE_SEED, n_params)
    return idx, xi


@pytest.mark.parametrize("style", ["flat", "layerwise"])
def test_fixed_step_equals_hand_computation(style: str) -> None:
    module, x, y = tiny_problem()
    ref_module = build_model(
        ModelSpec("mlp", {"hidden": [5]}), input_shape=(D,), num_classes=C_OUT, seed=5
    )
    theta0 = flat_params(ref_module)
    q, sigma, clip, lr = 0.5, 0.7, 0.3, 0.1
    engine = make_engine(module, x, y, params={"clip": clip, "clip_style": style})
    engine.step()

    idx, xi = expected_batch_and_noise(theta0.numel(), q)
    assert 0 < len(idx) < N
    g = reference_per_sample(ref_module, x[idx], y[idx], "classification")  # [B, P]
    if style == "flat":
        n = g.norm(dim=1, keepdim=True)
        clipped = (torch.clamp(clip / n, max=1.0) * g).sum(0)
    else:
        sizes = [p.numel() for p in ref_module.parameters()]
        layer_sizes = [sizes[0] + sizes[1], sizes[2] + sizes[3]]  # (W, b) per Linear
        parts = torch.split(g, layer_sizes, dim=1)
        c_r = clip / math.sqrt(len(parts))
        clipped = torch.cat(
            [(torch.clamp(c_r / p.norm(dim=1, keepdim=True), max=1.0) * p).sum(0) for p in parts]
        )
        # Every clipped per-sample gradient has total norm <= C.
        for p in parts:
            assert ((torch.clamp(c_r / p.norm(dim=1), max=1.0) * p.norm(dim=1)) <= c_r + 1e-6).all()
    b = q * N
    expected = theta0 - lr * noised(clipped / b, xi, sigma * clip / b)
    torch.testing.assert_close(engine.model.flat[0], expected, rtol=1e-5, atol=1e-6)


def test_fixed_step_equals_opacus_dpoptimizer(monkeypatch: pytest.MonkeyPatch) -> None:
    import opacus.optimizers.optimizer as opacus_optimizer
    from opacus.optimizers import DPOptimizer

    module, x, y = tiny_problem()
    op_module = build_model(
        ModelSpec("mlp", {"hidden": [5]}), input_shape=(D,), num_classes=C_OUT, seed=5
    )
    q, sigma, clip, lr = 0.5, 0.7, 0.3, 0.1
    engine = make_engine(module, x, y, params={"clip": clip})
    engine.step()

    idx, xi = expected_batch_and_noise(sum(p.numel() for p in op_module.parameters()), q)
    g = reference_per_sample(op_module, x[idx], y[idx], "classification")
    # Hand Opacus the same per-sample gradients and the same noise.
    offsets = 0
    for p in op_module.parameters():
        p.grad_sample = g[:, offsets : offsets + p.numel()].reshape(len(idx), *p.shape).clone()
        offsets += p.numel()
    chunks = iter(torch.split(xi, [p.numel() for p in op_module.parameters()]))

    def same_noise(std: float, reference: torch.Tensor, **_: object) -> torch.Tensor:
        # dpsweep scales the noise to the sensitivity it enforces (C times 1 + 1e-4).
        return (std * _ENFORCED * next(chunks)).reshape(reference.shape).float()

    monkeypatch.setattr(opacus_optimizer, "_generate_noise", same_noise)
    opt = DPOptimizer(
        torch.optim.SGD(op_module.parameters(), lr=lr),
        noise_multiplier=sigma,
        max_grad_norm=clip,
        expected_batch_size=int(q * N),
    )
    assert q * N == int(q * N)
    opt.step()
    # dpsweep's release is snapped to a grid of 2**-12 noise standard deviations: at most
    # lr * 2**-13 * sigma * C / b = 4e-7 away from Opacus's unsnapped one.
    torch.testing.assert_close(engine.model.flat[0], flat_params(op_module), rtol=1e-5, atol=2e-6)


def test_empty_batch_releases_pure_noise() -> None:
    module, x, y = tiny_problem()
    theta0 = flat_params(module).clone()
    q = 1e-9  # essentially never samples anything
    engine = make_engine(module, x, y, sample_rate=q, noise_multiplier=0.7, lr=0.1)
    engine.step()
    _, xi = expected_batch_and_noise(theta0.numel(), q)
    expected = theta0 - 0.1 * noised(torch.zeros(theta0.numel()), xi, 0.7 * 0.3 / (q * N))
    torch.testing.assert_close(engine.model.flat[0], expected, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), 1e37])
def test_an_example_with_a_non_finite_gradient_gets_weight_zero(poison: float) -> None:
    """A record whose gradient is not finite is dropped from the step: the release equals the
    one without it (same noise), so a poisoned record cannot make a run fail."""
    module, x, y = tiny_problem()
    ref_module = build_model(
        ModelSpec("mlp", {"hidden": [5]}), input_shape=(D,), num_classes=C_OUT, seed=5
    )
    theta0 = flat_params(ref_module)
    x_poisoned = x.clone()
    x_poisoned[3] = poison
    if poison == 1e37:
        x_poisoned[3, 1:] = -1e37  # overflows the first layer to inf - inf = nan
    q, sigma, clip, lr = 1.0, 0.7, 0.3, 0.1  # q = 1: every example is in the batch
    engine = make_engine(module, x_poisoned, y, params={"clip": clip}, sample_rate=q)
    engine.step()
    others = [i for i in range(N) if i != 3]
    g = reference_per_sample(ref_module, x[others], y[others], "classification")
    clipped = (torch.clamp(clip / g.norm(dim=1, keepdim=True), max=1.0) * g).sum(0)
    (xi,) = normals(NOISE_SEED, theta0.numel())
    b = q * N  # the expected batch size is public and unchanged
    expected = theta0 - lr * noised(clipped / b, xi, sigma * clip / b)
    assert torch.isfinite(engine.model.flat).all()
    torch.testing.assert_close(engine.model.flat[0], expected, rtol=1e-5, atol=1e-6)


def test_sensitivity_errors_carry_no_private_value() -> None:
    """The fail-closed check names the release and trial, never a norm from private data."""
    from dpsweep.errors import PrivacyError
    from workers.engine import _check_sensitivity

    sq = torch.tensor([[[4.0], [9.0]]])  # norms 2 and 3
    with pytest.raises(PrivacyError) as err:
        _check_sensitivity("grad", sq, torch.ones(1, 2, 1), torch.tensor([1.0]))
    assert not any(v in str(err.value) for v in ("2", "3", "1.0"))


def test_nonprivate_step_is_plain_sgd() -> None:
    module, x, y = tiny_problem()
    ref = build_model(
        ModelSpec("mlp", {"hidden": [5]}), input_shape=(D,), num_classes=C_OUT, seed=5
    )
    engine = make_engine(module, x, y, strategy="nonprivate", params={}, lr=0.2)
    engine.step()
    idx, _ = expected_batch_and_noise(1, 0.5)
    opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    nn.functional.cross_entropy(ref(x[idx]), y[idx]).backward()
    opt.step()
    torch.testing.assert_close(engine.model.flat[0], flat_params(ref), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name,kwargs,torch_cls,torch_kwargs",
    [
        ("sgd", {"momentum": 0.9}, torch.optim.SGD, {"momentum": 0.9}),
        ("sgd", {"weight_decay": 0.01}, torch.optim.SGD, {"weight_decay": 0.01}),
        ("adam", {}, torch.optim.Adam, {}),
        ("adam", {"weight_decay": 0.1}, torch.optim.Adam, {"weight_decay": 0.1}),
    ],
)
def test_packed_optimizer_matches_torch(name, kwargs, torch_cls, torch_kwargs) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(0)
    lrs = [0.01, 0.3]
    p0 = torch.randn(2, 7, generator=gen)
    grads = [torch.randn(2, 7, generator=gen) for _ in range(4)]
    flat = p0.clone()
    opt = PackedOptimizer(name, torch.tensor(lrs), **kwargs)
    for g in grads:
        opt.step(flat, g.clone())
    for k, lr in enumerate(lrs):
        p = nn.Parameter(p0[k].clone())
        topt = torch_cls([p], lr=lr, **torch_kwargs)
        for g in grads:
            p.grad = g[k].clone()
            topt.step()
        torch.testing.assert_close(flat[k], p.detach(), rtol=1e-5, atol=1e-6)
