"""Per-sample gradients of the packed engine equal per-example backward passes, on every model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from workers.engine import per_sample_loss
from workers.models import ModelSpec, build_model, model_names, model_task
from workers.packed import PackedModel
from workers.packed.conv import (
    _PATCH_MAX_POSITIONS,
    PConv2d,
    _grouped_weight_grad,
    _patch_weight_grads,
)

SHAPES = {
    "logreg": (20,),
    "mlp": (20,),
    "bow_fc": (30,),
    "cnn": (1, 12, 12),
    "autoencoder": (1, 10, 10),
    "lip_mlp": (20,),
    "lip_cnn": (1, 8, 8),
}


def reference_per_sample(
    module: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str
) -> torch.Tensor:
    """Flat per-example gradients by one ordinary backward pass per example."""
    rows = []
    for i in range(x.shape[0]):
        module.zero_grad()
        out = module(x[i : i + 1])
        if task == "classification":
            loss = F.cross_entropy(out, y[i : i + 1], reduction="sum")
        else:
            loss = (out - x[i : i + 1]).pow(2).mean()
        loss.backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in module.parameters()]))
    return torch.stack(rows)


def packed_infos(model: PackedModel, x: torch.Tensor, y: torch.Tensor, task: str):
    xk = x.unsqueeze(0).expand(model.k, *x.shape).contiguous()
    out, cap = model.forward(xk, capture=True)
    target = y.unsqueeze(0).expand(model.k, -1) if task == "classification" else xk
    loss = per_sample_loss(out, target, task)
    return model.layer_grads(loss.sum(), cap)


def test_every_registered_packed_model_is_covered() -> None:
    """Every model on the packed path is checked here; the generic path's models are checked
    against per-example backward passes in tests/workers/models/test_architectures.py."""
    from workers.models.descriptors import DESCRIPTORS

    packed = {n for n in model_names() if DESCRIPTORS[n].engine_path == "packed"}
    assert set(SHAPES) == packed


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("k", [1, 3])
def test_per_sample_gradients_match_per_example_backward(name: str, k: int) -> None:
    torch.manual_seed(0)
    shape = SHAPES[name]
    task = model_task(name)
    modules = [
        build_model(ModelSpec(name), input_shape=shape, num_classes=4, seed=s) for s in range(k)
    ]
    model = PackedModel(modules)
    b = 5
    x = torch.rand(b, *shape)
    y = torch.randint(4, (b,))
    infos = packed_infos(model, x, y, task)
    ps = model.per_sample_grads(infos)  # [K, B, P]
    sq = model.sq_norms(infos).sum(-1)  # [K, B]
    for t in range(k):
        ref = reference_per_sample(modules[t], x, y, task)
        torch.testing.assert_close(ps[t], ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(sq[t], ref.pow(2).sum(-1), rtol=1e-4, atol=1e-6)
        w = torch.rand(b)
        out = torch.zeros(k, model.numel)
        weights = torch.rand(k, b, 1)
        weights[t, :, 0] = w
        model.weighted_sum_into(out, infos, weights)
        torch.testing.assert_close(out[t], (w[:, None] * ref).sum(0), rtol=1e-4, atol=1e-5)


def test_layerwise_norms_split_by_layer() -> None:
    m = build_model(ModelSpec("mlp", {"hidden": [7, 5]}), input_shape=(6,), num_classes=3, seed=1)
    model = PackedModel([m])
    x, y = torch.rand(4, 6), torch.randint(3, (4,))
    infos = packed_infos(model, x, y, "classification")
    per_layer = model.sq_norms(infos)[0]  # [B, L]
    ref = reference_per_sample(m, x, y, "classification")
    sizes = [sum(p.numel() for p in lin.parameters()) for lin in m if isinstance(lin, nn.Linear)]
    chunks = torch.split(ref, sizes, dim=1)
    assert per_layer.shape == (4, 3)
    for li, c in enumerate(chunks):
        torch.testing.assert_close(per_layer[:, li], c.pow(2).sum(-1), rtol=1e-4, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(1, 3),
    b=st.integers(1, 6),
    t=st.integers(1, 4),
    fin=st.integers(1, 9),
    fout=st.integers(1, 9),
    bias=st.booleans(),
)
def test_linear_ghost_and_materialised_norms_agree(
    k: int, b: int, t: int, fin: int, fout: int, bias: bool
) -> None:
    """Linear layers over sequences: whichever exact form is picked, norms and sums are right."""
    torch.manual_seed(k * 1000 + b * 100 + t)
    mods = [nn.Sequential(nn.Linear(fin, fout, bias=bias)) for _ in range(k)]
    model = PackedModel(mods)
    x = torch.randn(k, b, t, fin)
    out, cap = model.forward(x, capture=True)
    loss = out.pow(2).sum(dim=(2, 3))  # per-sample loss [K, B]
    infos = model.layer_grads(loss.sum(), cap)
    sq = model.sq_norms(infos)[..., 0]
    for kk in range(k):
        for i in range(b):
            mods[kk].zero_grad()
            mods[kk](x[kk, i]).pow(2).sum().backward()
            ref = torch.cat([p.grad.reshape(-1) for p in mods[kk].parameters()])
            torch.testing.assert_close(sq[kk, i], ref.pow(2).sum(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("stride,padding,output_padding", [(1, 0, 0), (2, 1, 1), (2, 0, 0)])
def test_conv_transpose_geometries(stride: int, padding: int, output_padding: int) -> None:
    torch.manual_seed(3)
    m = nn.Sequential(
        nn.ConvTranspose2d(2, 3, 3, stride=stride, padding=padding, output_padding=output_padding),
        nn.Flatten(),
    )
    model = PackedModel([m])
    x = torch.randn(4, 2, 5, 5)
    out, cap = model.forward(x.unsqueeze(0), capture=True)
    infos = model.layer_grads(out.pow(2).sum(), cap)
    ps = model.per_sample_grads(infos)[0]
    for i in range(4):
        m.zero_grad()
        m(x[i : i + 1]).pow(2).sum().backward()
        ref = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
        torch.testing.assert_close(ps[i], ref, rtol=1e-4, atol=1e-4)


def test_strided_dilated_conv() -> None:
    torch.manual_seed(4)
    m = nn.Sequential(nn.Conv2d(2, 3, 3, stride=2, padding=1, dilation=2), nn.Tanh(), nn.Flatten())
    model = PackedModel([m])
    x = torch.randn(3, 2, 9, 9)
    out, cap = model.forward(x.unsqueeze(0), capture=True)
    infos = model.layer_grads(out.pow(2).sum(), cap)
    ps = model.per_sample_grads(infos)[0]
    for i in range(3):
        m.zero_grad()
        m(x[i : i + 1]).pow(2).sum().backward()
        ref = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
        torch.testing.assert_close(ps[i], ref, rtol=1e-4, atol=1e-4)


def test_packed_forward_matches_modules() -> None:
    mods = [
        build_model(ModelSpec("cnn"), input_shape=(1, 10, 10), num_classes=5, seed=s)
        for s in range(3)
    ]
    model = PackedModel(mods)
    x = torch.rand(3, 4, 1, 10, 10)
    out, _ = model.forward(x)
    for k, m in enumerate(mods):
        torch.testing.assert_close(out[k], m(x[k]), rtol=1e-5, atol=1e-5)
    # Exporting a trial gives back an equivalent module.
    torch.testing.assert_close(model.to_module(1)(x[1]), mods[1](x[1]))


def test_unsupported_layer_is_rejected_with_a_clear_message() -> None:
    from dpsweep.errors import ConfigError

    with pytest.raises(ConfigError, match="BatchNorm1d is not supported"):
        PackedModel([nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))])


@pytest.mark.parametrize("k", [1, 3])
def test_few_output_positions_take_the_patch_route_with_the_same_gradients(k: int) -> None:
    """The CNN on digits' 8x8 images: its second convolution has 3x3 outputs, few enough that
    its per-sample weight gradients come from the input patches (one batched matmul) rather
    than the grouped weight-gradient call. Both routes give the per-example backward's
    gradients, the norms and the weighted sums."""
    torch.manual_seed(5)
    modules = [
        build_model(ModelSpec("cnn"), input_shape=(1, 8, 8), num_classes=10, seed=s)
        for s in range(k)
    ]
    model = PackedModel(modules)
    convs = [layer for layer in model.layers if isinstance(layer, PConv2d)]
    b = 6
    x = torch.rand(b, 1, 8, 8)
    y = torch.randint(10, (b,))
    infos = packed_infos(model, x, y, "classification")
    ps = model.per_sample_grads(infos)
    for t in range(k):
        torch.testing.assert_close(
            ps[t], reference_per_sample(modules[t], x, y, "classification"), rtol=1e-4, atol=1e-5
        )
    # The second convolution's 3x3 outputs are under the bound; the routes agree directly.
    second = convs[1]
    a = torch.randn(b, k * second.cin, 6, 6)
    g = torch.randn(b, k * second.cout, 3, 3)
    assert _PATCH_MAX_POSITIONS >= 3 * 3
    patch = _patch_weight_grads(second, a, g, k)
    grouped = _grouped_weight_grad(second, a, g, k, transposed=False)
    for mine, theirs in zip(patch, grouped, strict=True):
        torch.testing.assert_close(mine, theirs.view(b, second.cout, -1), rtol=1e-5, atol=1e-5)
