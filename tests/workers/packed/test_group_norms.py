"""A group's gradient norm without building the group's gradient (issue 54's ``capped``
units): ``||sum_r s_r g_r||^2`` from the rows' infos, against the rows' gradients built and
summed. Rows of share 0 count as zero gradients even when their info holds NaN."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from workers.packed.layer import ParamLayer
from workers.packed.linear import PLinear


def _built(layer: ParamLayer, info: object, share: Tensor, rows: int) -> Tensor:
    """The groups' weighted gradient sums built from the materialised per-row gradients."""
    k, n = share.shape
    total = torch.zeros(k, n // rows, dtype=torch.float64)
    for t in layer.per_sample_grads(info):
        t = t.reshape(k, n, -1).to(torch.float64)
        t = torch.where((share > 0).unsqueeze(-1), t, torch.zeros((), dtype=t.dtype))
        s = share.to(torch.float64).view(k, n // rows, rows, 1)
        total += (t.view(k, n // rows, rows, -1) * s).sum(dim=2).pow(2).sum(dim=-1)
    return total


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 3),
    groups=st.integers(1, 4),
    rows=st.integers(1, 5),
    positions=st.sampled_from([None, 1, 3]),  # None: one position per row ([K, B, in])
    size=st.sampled_from([(3, 2), (16, 12), (2, 40)]),
    bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_group_norms_equal_the_groups_gradients_built(
    k: int,
    groups: int,
    rows: int,
    positions: int | None,
    size: tuple[int, int],
    bias: bool,
    seed: int,
) -> None:
    d_in, d_out = size
    gen = torch.Generator().manual_seed(seed)
    layer = PLinear(nn.Linear(d_in, d_out, bias=bias))
    n = groups * rows
    shape = (k, n) if positions is None else (k, n, positions)
    a = torch.randn(*shape, d_in, generator=gen, dtype=torch.float64)
    g = torch.randn(*shape, d_out, generator=gen, dtype=torch.float64)
    share = torch.rand(k, n, generator=gen, dtype=torch.float64)
    share[torch.rand(k, n, generator=gen) < 0.3] = 0.0
    # A row nobody uses may hold anything: it must not reach a group's norm.
    unused = share == 0
    a[unused] = float("nan")
    g[unused] = float("inf")
    info = layer.grad_info(a, g, k)
    got = layer.group_sq_norms(info, share, rows)
    want = _built(layer, info, share, rows)
    assert got.shape == (k, groups)
    torch.testing.assert_close(got.to(torch.float64), want, rtol=1e-9, atol=1e-9)
    # The materialising default agrees (the form other layers use).
    default = ParamLayer.group_sq_norms(layer, info, share, rows)
    torch.testing.assert_close(default.to(torch.float64), want, rtol=1e-9, atol=1e-9)
