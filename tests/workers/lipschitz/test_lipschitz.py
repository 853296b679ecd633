"""Clipless DP-SGD (002): the Lipschitz model, the certified bound, projection and the strategy.

The bound is a privacy claim, so the central tests measure real per-sample gradient norms (from
the packed engine, which tests/workers/packed/test_per_sample.py checks against per-example
backward passes) and compare them with the computed sensitivity, including on inputs far
outside the ball and on weights that were never projected.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dpsweep.errors import ConfigError
from tests.workers.packed.test_per_sample import packed_infos
from tests.workers.streams import noise_stream, sample_stream
from workers.accounting import calibrate_noise_multiplier
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.engine import DPEngine
from workers.lipschitz.bound import CROSS_ENTROPY_LIPSCHITZ, LipschitzBound
from workers.lipschitz.layers import GroupSort, InputBall, group_sort, project_to_ball
from workers.lipschitz.spectral import certified_spectral_bound, gram_spectral_bound
from workers.models import ModelSpec, build_model
from workers.optim import PackedOptimizer
from workers.packed import PackedModel
from workers.schedule import plan_steps
from workers.strategies import NoiseSource, StepContext, get_strategy
from workers.training.loop import train_trial
from workers.training.specs import PackSpec, TrialSpec


def lip_pack(k: int, d: int, classes: int, **options: object) -> PackedModel:
    mods = [
        build_model(
            ModelSpec("lip_mlp", dict(options)), input_shape=(d,), num_classes=classes, seed=s
        )
        for s in range(k)
    ]
    return PackedModel(mods)


def exact_spectral(w: torch.Tensor) -> torch.Tensor:
    return torch.linalg.matrix_norm(w.double(), ord=2)


def linear_weights(model: PackedModel, flat: torch.Tensor | None = None) -> list[torch.Tensor]:
    flat = model.flat if flat is None else flat
    return [model.view_like(flat, li)[0] for li in range(model.n_param_layers)]


def per_sample_norms(model: PackedModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Measured norms ``[K, B]`` of every example's full gradient, from the packed engine."""
    infos = packed_infos(model, x, y, "classification")
    return model.per_sample_grads(infos).double().norm(dim=-1)


def randomise_(model: PackedModel, gen: torch.Generator, weight_scale: float, bias_scale: float):
    for li in range(model.n_param_layers):
        views = model.view_like(model.flat, li)
        views[0].copy_(torch.randn(views[0].shape, generator=gen) * weight_scale)
        if len(views) > 1:
            views[1].copy_(torch.randn(views[1].shape, generator=gen) * bias_scale)


# --------------------------------------------------------------------------------------------
# The bound


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    hidden=st.sampled_from([[8], [16, 16], [32, 8, 16], []]),
    x_bound=st.floats(0.1, 20.0),
    temperature=st.floats(0.2, 20.0),
    weight_scale=st.floats(0.01, 3.0),
    bias_scale=st.floats(0.0, 5.0),
    project=st.booleans(),
)
def test_measured_per_sample_norms_never_exceed_the_bound(
    seed: int,
    hidden: list[int],
    x_bound: float,
    temperature: float,
    weight_scale: float,
    bias_scale: float,
    project: bool,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    d, classes, b = 12, 5, 64
    model = lip_pack(2, d, classes, hidden=hidden, input_bound=x_bound, temperature=temperature)
    randomise_(model, gen, weight_scale, bias_scale)
    bound = LipschitzBound(model)
    # The bound holds for the weights as they are (projected or not): it is certified from
    # them, never assumed.
    s = bound.project_() if project else bound.sensitivity()
    # Inputs from tiny to far outside the ball (the input layer projects those).
    scales = torch.logspace(-3, 6, b, dtype=torch.float32)
    x = torch.randn(b, d, generator=gen) * scales[:, None]
    y = torch.randint(classes, (b,), generator=gen)
    norms = per_sample_norms(model, x, y)
    assert torch.isfinite(s).all() and (s > 0).all()
    assert (norms <= s[:, None]).all(), (norms.max(dim=1).values, s)


def test_bound_is_tight_on_an_adversarial_case() -> None:
    """Orthogonal layers, zero biases, inputs on the sphere, confidently wrong: ratio ~1."""
    torch.manual_seed(0)
    d, classes, b = 16, 4, 32
    # Widths >= d: orthogonal init preserves norms forward and (through the last layer's
    # orthonormal rows) backward, so every layer attains G_l X_l.
    model = lip_pack(1, d, classes, hidden=[32, 32], input_bound=3.0, temperature=50.0)
    s = LipschitzBound(model).project_()
    x = torch.randn(b, d)
    x = 3.0 * x / x.norm(dim=1, keepdim=True)  # on the sphere of radius X
    out, _ = model.forward(x.unsqueeze(0))
    y = out[0].argmin(dim=1)  # the least likely class: ||softmax - onehot|| -> sqrt(2)
    norms = per_sample_norms(model, x, y)
    ratio = float(norms.max() / s[0])
    assert ratio <= 1.0
    assert ratio > 0.9, ratio


def test_loss_constant_is_sqrt_two() -> None:
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(1000, 7, generator=gen, dtype=torch.float64) * 30
    y = torch.randint(7, (1000,), generator=gen)
    g = torch.softmax(z, dim=1) - nn.functional.one_hot(y, 7)
    norms = g.norm(dim=1)
    assert float(norms.max()) <= CROSS_ENTROPY_LIPSCHITZ
    assert float(norms.max()) > 0.999 * CROSS_ENTROPY_LIPSCHITZ  # attained when confidently wrong
    assert math.isclose(CROSS_ENTROPY_LIPSCHITZ, math.sqrt(2))


# --------------------------------------------------------------------------------------------
# Spectral bounds and projection


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    log_scale=st.floats(-4.0, 6.0),
    seed=st.integers(0, 10_000),
    flat_spectrum=st.booleans(),
)
def test_spectral_bounds_are_upper_bounds(
    m: int, n: int, log_scale: float, seed: int, flat_spectrum: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(3, m, n, generator=gen) * 10.0**log_scale
    if flat_spectrum and m > 1 and n > 1:
        # All singular values equal: the worst case for the Gram iteration.
        u, _, vh = torch.linalg.svd(w, full_matrices=False)
        w = (u @ vh) * 10.0**log_scale
    exact = exact_spectral(w)
    certified, _ = certified_spectral_bound(w)
    assert (certified >= exact).all()
    assert (certified <= exact * 1.02).all()  # and tight
    for iters in (1, 3, 6):
        gram = gram_spectral_bound(w, iters)
        assert (gram >= exact * (1 - 1e-12)).all()
        # sigma_max <= bound <= rank^(1/2^(iters+1)) sigma_max
        assert (gram <= exact * min(m, n) ** (1 / 2 ** (iters + 1)) * (1 + 1e-9)).all()


def test_certificate_forms_the_gram_matrix_in_float64_without_ieee_float32_matmuls() -> None:
    """With TF32/bf16 "fast float32" allowed, float32 rounding bounds no longer hold."""
    w = torch.randn(2, 30, 70)
    exact = exact_spectral(w)
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        certified, _ = certified_spectral_bound(w)
    finally:
        torch.set_float32_matmul_precision(previous)
    assert (certified >= exact).all() and (certified <= exact * 1.01).all()


def test_certified_bound_of_zero_and_non_finite_matrices() -> None:
    assert (certified_spectral_bound(torch.zeros(2, 5, 7))[0] < 1e-15).all()
    w = torch.randn(3, 6, 4)
    w[1, 2, 3] = math.nan
    w[2, 0, 0] = math.inf
    s, _ = certified_spectral_bound(w)
    assert math.isfinite(float(s[0])) and not math.isfinite(float(s[1]))
    assert not math.isfinite(float(s[2]))


def _linear_pack(ws: torch.Tensor) -> PackedModel:
    mods = []
    for w in ws:
        lin = nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(w)
        mods.append(nn.Sequential(InputBall(1.0), lin))
    return PackedModel(mods)


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 48),
    n=st.integers(1, 48),
    log_scale=st.floats(-2.0, 8.0),
    seed=st.integers(0, 10_000),
)
def test_projection_puts_every_layer_in_the_unit_ball(
    m: int, n: int, log_scale: float, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    ws = torch.randn(3, m, n, generator=gen) * 10.0**log_scale
    model = _linear_pack(ws)
    bound = LipschitzBound(model)
    bound.project_()
    w = linear_weights(model)[0]
    assert (exact_spectral(w) <= 1.0 + 1e-6).all()
    # The bound carried forward is certified and at most 1.
    assert all((s <= 1.0).all() for s in bound.spectral)
    # Projecting again changes them by at most the certificate's gap (about 0.1 %).
    before = model.flat.clone()
    bound.project_()
    torch.testing.assert_close(model.flat, before, rtol=1e-2, atol=0)


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_projection_leaves_matrices_inside_the_ball_unchanged(m: int, n: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    ws = torch.randn(2, m, n, generator=gen)
    ws = ws / exact_spectral(ws)[:, None, None].float() * torch.tensor([0.5, 0.99])[:, None, None]
    model = _linear_pack(ws)
    before = model.flat.clone()
    LipschitzBound(model).project_()
    assert torch.equal(model.flat, before)


def test_projection_of_huge_matrices() -> None:
    ws = torch.randn(2, 30, 50) * 1e15
    ws[1] = torch.outer(torch.ones(30), torch.ones(50)) * 3e17  # rank one, huge
    model = _linear_pack(ws)
    LipschitzBound(model).project_()
    norms = exact_spectral(linear_weights(model)[0])
    assert (norms <= 1.0 + 1e-6).all() and (norms > 0.95).all()


# --------------------------------------------------------------------------------------------
# Layers


def test_group_sort_is_a_sorting_permutation_with_permutation_jacobian() -> None:
    x = torch.randn(5, 3, 8)
    x[0, 0, 2] = x[0, 0, 3]  # a tie
    y = group_sort(x)
    pairs = y.unflatten(-1, (-1, 2))
    assert (pairs[..., 0] >= pairs[..., 1]).all()
    assert torch.equal(pairs.sort(dim=-1).values, x.unflatten(-1, (-1, 2)).sort(dim=-1).values)
    assert torch.equal(y.sort(dim=-1).values, x.sort(dim=-1).values)  # a permutation
    jac = torch.autograd.functional.jacobian(group_sort, x[0, 0])
    assert torch.equal(jac.abs().sum(0), torch.ones(8)) and torch.equal(jac.sum(1), torch.ones(8))
    with pytest.raises(ValueError, match="even"):
        GroupSort()(torch.randn(2, 5))


def test_input_ball_projects_and_flattens() -> None:
    scales = torch.tensor([0.0, 1e-3, 0.1, 10.0, 1e20, 1e30])
    x = torch.randn(6, 2, 3, 4) * scales[:, None, None, None]
    x[5, 0, 0, 0] = 3.4e38  # the largest finite float32 (data loaders reject non-finite)
    y = InputBall(2.0)(x)
    assert y.shape == (6, 24)
    assert (y.double().norm(dim=1) <= 2.0).all()
    assert torch.equal(y[0], torch.zeros(24))
    # Inside the ball: unchanged up to the rounding allowance (~(d+8) 2^-24).
    torch.testing.assert_close(y[1:3], x[1:3].reshape(2, -1), rtol=1e-5, atol=0)
    assert float(y[3].norm()) == pytest.approx(2.0, rel=1e-4)
    packed = project_to_ball(x.unsqueeze(0), 2.0, batch_dims=2)
    assert torch.equal(packed[0], y)


def test_lip_mlp_options_are_validated() -> None:
    for opts, field in [
        ({"hidden": [7]}, "hidden"),
        ({"input_bound": -1}, "input_bound"),
        ({"temperature": 0}, "temperature"),
    ]:
        with pytest.raises(ConfigError, match=field):
            build_model(ModelSpec("lip_mlp", opts), input_shape=(4,), num_classes=3, seed=0)
    m = build_model(ModelSpec("lip_mlp"), input_shape=(1, 8, 8), num_classes=10, seed=0)
    assert m[1].radius == 8.0  # sqrt(64): every [0, 1] image fits
    assert m(torch.rand(3, 1, 8, 8)).shape == (3, 10)


# --------------------------------------------------------------------------------------------
# The strategy


def make_strategy(model: PackedModel):  # type: ignore[no-untyped-def]
    return get_strategy("lipschitz")([{}] * model.k, n_layers=model.n_param_layers, device="cpu")


def test_strategy_refuses_models_without_a_known_bound() -> None:
    mlp = PackedModel([build_model(ModelSpec("mlp"), input_shape=(6,), num_classes=3, seed=0)])
    with pytest.raises(ConfigError, match="needs a Lipschitz model such as lip_mlp"):
        make_strategy(mlp).bind(mlp, expected_batch_size=8.0, task="classification")
    # A Lipschitz-looking stack with one unknown activation, or no input bound.
    for mods in (
        [InputBall(1.0), nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)],
        [nn.Linear(6, 4), GroupSort(), nn.Linear(4, 3)],
    ):
        model = PackedModel([nn.Sequential(*mods)])
        with pytest.raises(ConfigError, match="needs a Lipschitz model such as lip_mlp"):
            make_strategy(model).bind(model, expected_batch_size=8.0, task="classification")
    lip = lip_pack(1, 6, 3)
    with pytest.raises(ConfigError, match="needs a Lipschitz model such as lip_mlp"):
        make_strategy(lip).bind(lip, expected_batch_size=8.0, task="reconstruction")


def test_training_refuses_mlp_and_the_autoencoder() -> None:
    for model in ("mlp", "autoencoder"):
        spec = PackSpec(
            dataset=DatasetSpec("digits"),
            model=ModelSpec(model),
            strategy="lipschitz",
            trials=[TrialSpec(lr=0.1, noise_multiplier=1.0)],
            steps=2,
        )
        with pytest.raises(ConfigError, match="needs a Lipschitz model such as lip_mlp"):
            train_trial(spec)


def test_strategy_projects_at_bind_and_recertifies_changed_weights() -> None:
    torch.manual_seed(1)
    model = lip_pack(2, 10, 4, hidden=[16])
    randomise_(model, torch.Generator().manual_seed(3), 2.0, 1.0)
    strategy = make_strategy(model)
    strategy.bind(model, expected_batch_size=8.0, task="classification")
    assert all((exact_spectral(w) <= 1 + 1e-6).all() for w in linear_weights(model))
    mask = torch.ones(2, 8)
    ctx = StepContext(sq_norms=None, mask=mask, expected_batch_size=8.0, noise=None)  # type: ignore[arg-type]
    first = strategy.clip(ctx)
    assert torch.equal(first.weights, mask.unsqueeze(-1))
    assert torch.equal(first.sensitivity, strategy.state()["sensitivity"])
    # Weights changed behind the strategy's back (not through after_step): clip must certify
    # the weights in use, not reuse the stale bound.
    model.flat.mul_(3.0)
    second = strategy.clip(ctx).sensitivity
    assert (second > first.sensitivity * 2).all()
    x, y = torch.randn(8, 10) * 100, torch.randint(4, (8,))
    assert (per_sample_norms(model, x, y) <= second.double()[:, None]).all()


def test_engine_step_releases_with_the_bound() -> None:
    torch.manual_seed(2)
    model = lip_pack(1, 10, 4, hidden=[16])
    strategy = make_strategy(model)
    x, y = torch.randn(200, 10), torch.randint(4, (200,))
    engine = DPEngine(
        model=model,
        strategy=strategy,
        optimizer=PackedOptimizer("sgd", torch.tensor([0.5])),
        x=x,
        y=y,
        task="classification",
        sample_rate=0.1,
        noise_multiplier=torch.tensor([1.0]),
        sample_streams=[sample_stream(0)],
        noise=NoiseSource([noise_stream(1)], model.device),
    )
    for _ in range(5):
        s = strategy.state()["sensitivity"].double()
        assert (per_sample_norms(model, x, y) <= s[:, None]).all()
        engine.step()
        assert all((exact_spectral(w) <= 1 + 1e-6).all() for w in linear_weights(model))


def test_dp_lipschitz_training_on_digits_at_epsilon_8() -> None:
    data = load_dataset(DatasetSpec("digits"))
    batch, epochs = 256, 15
    q, steps = plan_steps(n_train=data.n_train, batch_size=batch, epochs=epochs, steps=None)
    sigma = calibrate_noise_multiplier(
        target_epsilon=8, target_delta=1e-5, sample_rate=q, steps=steps
    )
    spec = PackSpec(
        dataset=DatasetSpec("digits"),
        model=ModelSpec("lip_mlp", {"input_bound": 4.0}),
        strategy="lipschitz",
        trials=[TrialSpec(lr=0.05, noise_multiplier=sigma)],
        batch_size=batch,
        epochs=epochs,
        eval_every=20,
    )
    r = train_trial(spec)
    assert r.epsilon is not None and r.epsilon <= 8
    assert r.metrics["accuracy"] > 0.4  # chance is 0.1
    sens = r.trajectories["sensitivity"]
    assert len(sens) == len(r.trajectories["step"]) and all(0 < s < 100 for s in sens)
    # The released checkpoint satisfies the constraint, exactly.
    model = PackedModel(
        [build_model(spec.model, input_shape=data.input_shape, num_classes=10, seed=0)]
    )
    assert r.checkpoint is not None
    for w in linear_weights(model, r.checkpoint.unsqueeze(0)):
        assert (exact_spectral(w) <= 1.0 + 1e-6).all()
