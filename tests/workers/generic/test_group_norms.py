"""A group's gradient norm from the generic path's book-keeping infos (issue 54's ``capped``
units): a convolution's and a Linear's Gram route against the rows' gradients built and
summed, with NaN in the rows nobody uses."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from workers.generic.ghost import (
    _GhostConv,
    _GhostLinear,
    as_materialised,
    conv_info,
    group_info_sq,
)
from workers.group_norms import gram_is_cheaper


def _built(tensors: list[Tensor], share: Tensor, rows: int) -> Tensor:
    k, n = share.shape
    total = torch.zeros(k, n // rows, dtype=torch.float64)
    for t in tensors:
        t = t.reshape(k, n, -1).to(torch.float64)
        t = torch.where((share > 0).unsqueeze(-1), t, torch.zeros((), dtype=t.dtype))
        s = share.to(torch.float64).view(k, n // rows, rows, 1)
        total += (t.view(k, n // rows, rows, -1) * s).sum(dim=2).pow(2).sum(dim=-1)
    return total


def _share(k: int, n: int, gen: torch.Generator) -> Tensor:
    share = torch.rand(k, n, generator=gen, dtype=torch.float64)
    share[:, 1::3] = 0.0
    return share


@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_a_convolutions_group_norm_equals_its_groups_gradients_built(rows: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    conv = nn.Conv2d(8, 16, 3, padding=1, bias=bias).double()
    k, n = 2, 4 * rows
    a = torch.randn(k, n, 8, 2, 2, generator=gen, dtype=torch.float64)
    g = torch.randn(k, n, 16, 2, 2, generator=gen, dtype=torch.float64)
    info = conv_info(conv, a, g, bias)
    assert isinstance(info, _GhostConv)  # 4 positions: the ghost route
    share = _share(k, n, gen)
    want = _built(as_materialised(info), share, rows)
    # Rows nobody uses may hold anything (their patches and output gradients).
    info.cols[share == 0] = float("nan")
    info.g.view(k, n, 16, -1)[share == 0] = float("inf")
    # rows 1 and 2 take the Gram route, 4 the materialised one.
    assert gram_is_cheaper(rows * 4, 72, 16) == (rows < 4)
    got = group_info_sq(info, share, rows)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("positions", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_a_linears_group_norm_equals_its_groups_gradients_built(positions: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(positions)
    k, n, rows = 2, 9, 3
    a = torch.randn(k, n, positions, 24, generator=gen, dtype=torch.float64)
    g = torch.randn(k, n, positions, 20, generator=gen, dtype=torch.float64)
    info = _GhostLinear("linear", a, g, bias)
    share = _share(k, n, gen)
    want = _built(info.materialise(), share, rows)
    a[share == 0] = float("nan")
    assert gram_is_cheaper(rows * positions, 24, 20)
    torch.testing.assert_close(group_info_sq(info, share, rows), want, rtol=1e-9, atol=1e-9)
