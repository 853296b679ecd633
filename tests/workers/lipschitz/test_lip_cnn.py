"""``lip_cnn`` and the certified bound for convolutions (:mod:`workers.lipschitz.bound`).

As for ``lip_mlp``, the bound is a privacy claim: these tests measure real per-sample gradient
norms (from the packed engine) and compare them with the computed sensitivity, on weights that
were never projected, on inputs far outside the ball, and on convolutions of every geometry the
bound admits (strides, dilations, paddings, rectangular kernels).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dpsweep.errors import ConfigError
from tests.workers.lipschitz.test_lipschitz import exact_spectral, make_strategy, per_sample_norms
from workers.accounting import calibrate_noise_multiplier
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.lipschitz.bound import LipschitzBound, conv_amplification
from workers.lipschitz.layers import ChannelGroupSort, ImageBall, group_sort_dim
from workers.models import ModelSpec, build_model
from workers.packed import PackedModel
from workers.schedule import plan_steps
from workers.training.loop import train_trial
from workers.training.specs import PackSpec, TrialSpec


def cnn_pack(k: int, shape: tuple[int, ...], classes: int, **options: object) -> PackedModel:
    mods = [
        build_model(
            ModelSpec("lip_cnn", dict(options)), input_shape=shape, num_classes=classes, seed=s
        )
        for s in range(k)
    ]
    return PackedModel(mods)


def randomise_(model: PackedModel, gen: torch.Generator, weight_scale: float, bias_scale: float):
    for li in range(model.n_param_layers):
        views = model.view_like(model.flat, li)
        views[0].copy_(torch.randn(views[0].shape, generator=gen) * weight_scale)
        if len(views) > 1:
            views[1].copy_(torch.randn(views[1].shape, generator=gen) * bias_scale)


def kernel_matrices(model: PackedModel) -> list[torch.Tensor]:
    out = []
    for li in range(model.n_param_layers):
        w = model.view_like(model.flat, li)[0]
        out.append(w.reshape(*w.shape[:2], -1))
    return out


def images(gen: torch.Generator, b: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Images from tiny to far outside any ball (the input layer projects those)."""
    scales = torch.logspace(-3, 6, b)
    return torch.randn(b, *shape, generator=gen) * scales.view(b, *[1] * len(shape))


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    channels=st.sampled_from([[2], [4, 6], [8, 2]]),
    kernel=st.sampled_from([1, 3, 5]),
    size=st.sampled_from([(1, 8, 8), (3, 7, 9), (2, 12, 6)]),
    x_bound=st.floats(0.1, 20.0),
    temperature=st.floats(0.2, 20.0),
    weight_scale=st.floats(0.01, 3.0),
    bias_scale=st.floats(0.0, 5.0),
    project=st.booleans(),
)
def test_lip_cnn_per_sample_norms_never_exceed_the_bound(
    seed: int,
    channels: list[int],
    kernel: int,
    size: tuple[int, int, int],
    x_bound: float,
    temperature: float,
    weight_scale: float,
    bias_scale: float,
    project: bool,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    classes, b = 5, 48
    model = cnn_pack(
        2,
        size,
        classes,
        channels=channels,
        kernel=kernel,
        input_bound=x_bound,
        temperature=temperature,
    )
    randomise_(model, gen, weight_scale, bias_scale)
    bound = LipschitzBound(model)
    s = bound.project_() if project else bound.sensitivity()
    x, y = images(gen, b, size), torch.randint(classes, (b,), generator=gen)
    norms = per_sample_norms(model, x, y)
    assert torch.isfinite(s).all() and (s > 0).all()
    assert (norms <= s[:, None]).all(), (norms.max(dim=1).values, s)


#: (kernel, stride, padding, dilation) of convolutions the bound must cover.
GEOMETRIES = [
    ((3, 3), (1, 1), (1, 1), (1, 1)),
    ((2, 2), (2, 2), (0, 0), (1, 1)),
    ((4, 4), (2, 2), (1, 1), (1, 1)),
    ((3, 3), (2, 2), (2, 2), (2, 2)),
    ((1, 3), (1, 2), (0, 1), (1, 1)),
    ((5, 5), (3, 1), (2, 0), (1, 3)),
    ((3, 3), (3, 3), (0, 0), (1, 1)),
    ((1, 1), (1, 1), (0, 0), (1, 1)),
]


@pytest.mark.parametrize(("kernel", "stride", "padding", "dilation"), GEOMETRIES)
def test_im2col_amplification_bounds_every_patch_count(kernel, stride, padding, dilation) -> None:  # type: ignore[no-untyped-def]
    """A^2 bounds how many patches any pixel is in, so ``||unfold(a)|| <= A ||a||``."""
    a2 = conv_amplification(kernel, stride, dilation) ** 2
    h, w = 11, 13
    ones = torch.eye(h * w).view(h * w, 1, h, w)  # every one-pixel image
    patches = F.unfold(ones, kernel, dilation=dilation, padding=padding, stride=stride)
    counts = patches.sum(dim=(1, 2))
    assert counts.max() <= a2 + 1e-9
    # Stride 1 without dilation: interior pixels attain the bound.
    if stride == (1, 1) and dilation == (1, 1):
        assert counts.max() == a2
    x = torch.randn(20, 1, h, w, dtype=torch.float64)
    u = F.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)
    assert (u.norm(dim=(1, 2)) <= math.sqrt(a2) * x.flatten(1).norm(dim=1) * (1 + 1e-12)).all()


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), geometry=st.sampled_from(GEOMETRIES), project=st.booleans())
def test_bound_holds_for_every_conv_geometry(seed: int, geometry, project: bool) -> None:  # type: ignore[no-untyped-def]
    kernel, stride, padding, dilation = geometry
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    body = nn.Sequential(
        ImageBall(3.0),
        nn.Conv2d(2, 4, kernel, stride, padding, dilation, bias=False),
        ChannelGroupSort(),
        nn.Conv2d(4, 6, kernel, stride, padding, dilation, bias=False),
        nn.Flatten(),
    )
    shape = (2, 20, 30)  # large enough for two of the widest (dilated) kernels
    flat = body(torch.zeros(1, *shape)).shape[1]
    model = PackedModel([nn.Sequential(*body, nn.Linear(flat, 3))])
    randomise_(model, gen, 0.5, 1.0)
    bound = LipschitzBound(model)
    s = bound.project_() if project else bound.sensitivity()
    x, y = images(gen, 32, shape), torch.randint(3, (32,), generator=gen)
    assert (per_sample_norms(model, x, y) <= s[:, None]).all()


def test_bound_is_attained_within_a_small_factor_on_a_single_convolution() -> None:
    """One 1x1 convolution (A = 1) and a head: the bound is not absurdly loose."""
    torch.manual_seed(0)
    model = PackedModel(
        [
            nn.Sequential(
                ImageBall(2.0), nn.Conv2d(2, 4, 1, bias=False), nn.Flatten(), nn.Linear(64, 3)
            )
        ]
    )
    s = LipschitzBound(model).project_()
    x = torch.randn(64, 2, 4, 4)
    x = 2.0 * x / x.flatten(1).norm(dim=1).view(-1, 1, 1, 1)
    out, _ = model.forward(x.unsqueeze(0))
    y = out[0].argmin(dim=1)
    ratio = float(per_sample_norms(model, x, y).max() / s[0])
    assert 0.2 < ratio <= 1.0, ratio


def test_projection_keeps_each_kernel_within_one_over_its_amplification() -> None:
    model = cnn_pack(2, (1, 8, 8), 4, channels=[4, 6])
    randomise_(model, torch.Generator().manual_seed(1), 3.0, 1.0)
    LipschitzBound(model).project_()
    amps = [3.0, 1.0, 3.0, 1.0, 1.0]
    for m, amp in zip(kernel_matrices(model), amps, strict=True):
        assert (exact_spectral(m) <= (1.0 / amp) * (1 + 1e-6)).all()
    # The convolutions are then 1-Lipschitz as operators (power iteration on the real map).
    conv = model.view_like(model.flat, 0)[0][0]  # [4, 1, 3, 3]
    v = torch.randn(1, 1, 8, 8, dtype=torch.float64)
    for _ in range(200):
        v = F.conv_transpose2d(F.conv2d(v, conv.double(), padding=1), conv.double(), padding=1)
        v = v / v.norm()
    assert float(F.conv2d(v, conv.double(), padding=1).norm()) <= 1.0 + 1e-6


def test_convolutions_with_a_bias_or_without_an_input_ball_are_refused() -> None:
    for mods in (
        [ImageBall(1.0), nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 6 * 6, 3)],
        [nn.Conv2d(1, 2, 3, bias=False), nn.Flatten(), nn.Linear(2 * 6 * 6, 3)],
    ):
        model = PackedModel([nn.Sequential(*mods)])
        with pytest.raises(ConfigError, match="needs a Lipschitz model such as lip_mlp or lip_cnn"):
            make_strategy(model).bind(model, expected_batch_size=8.0, task="classification")


def test_channel_group_sort_is_a_permutation_of_channel_pairs() -> None:
    x = torch.randn(3, 6, 5, 7, requires_grad=True)
    y = ChannelGroupSort()(x)
    pairs = x.detach().view(3, 3, 2, 5, 7)
    torch.testing.assert_close(y.view(3, 3, 2, 5, 7)[:, :, 0], pairs.max(dim=2).values)
    torch.testing.assert_close(y.view(3, 3, 2, 5, 7)[:, :, 1], pairs.min(dim=2).values)
    assert torch.equal(y.flatten().sort().values, x.flatten().sort().values)  # a permutation
    (g,) = torch.autograd.grad(y, x, torch.arange(y.numel(), dtype=torch.float32).view_as(y))
    assert torch.equal(g.flatten().sort().values, torch.arange(y.numel(), dtype=torch.float32))
    with pytest.raises(ValueError):
        group_sort_dim(torch.randn(2, 3, 4, 4), 1)


def test_lip_cnn_options_are_validated() -> None:
    for bad in ({"channels": [3]}, {"channels": []}, {"input_bound": 0}, {"kernel": 2}):
        with pytest.raises(ConfigError):
            build_model(ModelSpec("lip_cnn", bad), input_shape=(1, 8, 8), num_classes=3, seed=0)


def test_dp_lip_cnn_trains_on_digits_with_the_checked_bound() -> None:
    """The engine trains it under the lipschitz strategy (measured norms checked each step)."""
    data = load_dataset(DatasetSpec("digits"))
    batch, epochs = 256, 15
    q, steps = plan_steps(n_train=data.n_train, batch_size=batch, epochs=epochs, steps=None)
    sigma = calibrate_noise_multiplier(
        target_epsilon=8, target_delta=1e-5, sample_rate=q, steps=steps
    )
    spec = PackSpec(
        dataset=DatasetSpec("digits"),
        model=ModelSpec("lip_cnn", {"input_bound": 4.0, "temperature": 8.0}),
        strategy="lipschitz",
        trials=[TrialSpec(lr=0.005, noise_multiplier=sigma)],
        batch_size=batch,
        epochs=epochs,
        eval_every=20,
    )
    r = train_trial(spec)
    assert r.epsilon is not None and r.epsilon <= 8
    assert math.isfinite(r.metrics["loss"]) and r.metrics["accuracy"] > 0.4  # chance 0.1
    model = PackedModel(
        [build_model(spec.model, input_shape=data.input_shape, num_classes=10, seed=0)]
    )
    assert r.checkpoint is not None
    for m, amp in zip(kernel_matrices_of(model, r.checkpoint), [3.0, 1.0, 1.0], strict=True):
        assert (exact_spectral(m) <= (1.0 / amp) * (1 + 1e-6)).all()


def kernel_matrices_of(model: PackedModel, flat: torch.Tensor) -> list[torch.Tensor]:
    out = []
    for li in range(model.n_param_layers):
        w = model.view_like(flat.unsqueeze(0), li)[0]
        out.append(w.reshape(*w.shape[:2], -1))
    return out
