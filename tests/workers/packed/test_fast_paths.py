"""The packed engine's fast paths equal the straightforward computations they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workers.packed import PackedModel
from workers.packed.layer import Act
from workers.packed.parameter_free import PPool2d


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN included."""
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
        torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0)
    )


@pytest.mark.parametrize(
    "pool",
    [
        nn.MaxPool2d(2, 1),
        nn.MaxPool2d(2),
        nn.MaxPool2d(3, 2, 1),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        nn.MaxPool2d(2, 1, dilation=2),
    ],
)
def test_packed_max_pool_equals_torch_values_and_gradients(pool: nn.MaxPool2d) -> None:
    """Values and argmax routing (ties after a ReLU, inf, NaN) are exactly nn.MaxPool2d's."""
    gen = torch.Generator().manual_seed(0)
    # Small integers after a ReLU: many ties, the case where kernels could route differently.
    x = torch.relu(torch.randint(-2, 3, (5, 12, 9, 9), generator=gen).float())
    x[0, 0, 0, 0] = float("nan")
    x[1, 2, 3, 3] = float("inf")
    x[2, 3, 4, 4] = -float("inf")
    x_ref = x.clone().requires_grad_(True)
    x_fast = x.clone().requires_grad_(True)
    y_ref = pool(x_ref)
    y_fast = PPool2d(pool).forward(Act(x_fast, "bk", 3)).t
    assert _same(y_fast, y_ref) and y_fast.is_contiguous()
    w = torch.randn(y_ref.shape, generator=gen)
    (g_ref,) = torch.autograd.grad((y_ref * w).sum(), x_ref)
    (g_fast,) = torch.autograd.grad((y_fast * w).sum(), x_fast)
    assert _same(g_fast, g_ref)


def _cnn(seed: int, c_in: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(c_in, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 5, 2), nn.Flatten()
    )


@pytest.mark.parametrize("c_in", [1, 3])
def test_per_trial_convolutions_equal_each_trial_alone(c_in: int) -> None:
    """Few input channels: a pack convolves trial by trial, each exactly as the trial alone,
    and agrees with the grouped convolution it replaces."""
    mods = [_cnn(s, c_in) for s in (1, 2, 3)]
    pack = PackedModel(mods)
    x = torch.randn(3, 6, c_in, 7, 7, generator=torch.Generator().manual_seed(4))
    out, cap = pack.forward(x, capture=True)
    assert cap is not None
    for t, m in enumerate(mods):
        alone, alone_cap = PackedModel([m]).forward(x[t : t + 1], capture=True)
        assert alone_cap is not None
        assert torch.equal(cap.outs[0].detach().view(6, 3, 4, 7, 7)[:, t], alone_cap.outs[0][:, :])
        torch.testing.assert_close(out[t], alone[0], rtol=1e-5, atol=1e-6)
    # The grouped convolution over the pack gives the same first-layer output.
    first = pack.param_layers[0]
    w = first.params[0].reshape(3 * 4, c_in, 3, 3)
    grouped = F.conv2d(
        x.transpose(0, 1).reshape(6, 3 * c_in, 7, 7), w, first.params[1].reshape(-1), 1, 1, 1, 3
    )
    torch.testing.assert_close(cap.outs[0].detach(), grouped, rtol=1e-5, atol=1e-6)


def test_linear_norms_round_alike_in_any_pack_and_match_per_sample_gradients() -> None:
    """The fused ghost norms of a linear layer fed a transposed (strided) activation: a trial's
    norms are bitwise the same packed or alone, and equal its materialised gradients' norms."""
    mods = []
    for s in (1, 2, 3):
        torch.manual_seed(s)
        mods.append(nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(100, 6)))
    x = torch.randn(3, 5, 2, 7, 7, generator=torch.Generator().manual_seed(8))
    target = torch.randint(6, (3, 5), generator=torch.Generator().manual_seed(9))

    def norms(pack: PackedModel, xs: torch.Tensor, ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, cap = pack.forward(xs, capture=True)
        assert cap is not None
        loss = F.cross_entropy(out.reshape(-1, 6), ts.reshape(-1), reduction="sum")
        infos = pack.layer_grads(loss, cap)
        return pack.sq_norms(infos), pack.per_sample_grads(infos)

    sq, grads = norms(PackedModel(mods), x, target)
    torch.testing.assert_close(sq.sum(dim=-1), grads.pow(2).sum(dim=-1), rtol=1e-4, atol=1e-6)
    for t, m in enumerate(mods):
        sq_alone, _ = norms(PackedModel([m]), x[t : t + 1], target[t : t + 1])
        assert torch.equal(sq[t, :, 1], sq_alone[0, :, 1])
