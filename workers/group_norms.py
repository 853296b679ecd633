"""The squared norm of each group's weighted gradient sum, ``||sum_r s_r grad_r||^2`` over the
row slots of a privacy unit (issue 54's ``capped`` bounding), from the rows' per-layer infos.

A ``capped`` unit contributes the mean of its rows' exact gradients, clipped once; the clip
needs only that mean's norm, and the release only the rows' weighted sum (each row weighed by
its unit's clip weight times its share). So the mean itself need never be built:

* :func:`gram_group_sq`: a layer that is a linear map of its inputs at P positions per row (a
  Linear layer, P = 1 or a sequence; a convolution over its input patches) gives the norm
  from two Gram matrices over the group's rows x P positions (the ghost norm of Li et al.
  2022, over a unit instead of an example), at ``(R P)^2 (d_in + d_out)`` per unit;
* :func:`materialised_group_sq`: any layer, from its per-row gradients (``[K, B, *shape]``),
  at one weighted sum's cost; :func:`gram_is_cheaper` picks between the two.

Rows whose share is 0 (padding, rows removed for a non-finite gradient) count as zero
gradients whatever their info holds: their values are set to 0, never multiplied by 0
(0 * NaN is NaN).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["gram_group_sq", "gram_is_cheaper", "materialised_group_sq"]


def gram_is_cheaper(positions: int, d_in: int, d_out: int) -> bool:
    """Whether a group of ``positions`` (rows x positions per row) costs less by Gram
    matrices than by materialising its rows' ``d_out x d_in`` gradients."""
    return positions * (d_in + d_out) < d_in * d_out


def materialised_group_sq(tensors: Iterable[Tensor], share: Tensor, rows: int) -> Tensor:
    """``[K, B / rows]`` squared norms of each group's ``sum_r share_r grad_r`` from the
    rows' gradients ``tensors`` (each ``[K, B, *shape]``, one per parameter of a layer)."""
    k, n = share.shape
    on = share > 0
    w = torch.where(on, share, 0.0).view(k, n // rows, 1, rows)
    total: Tensor | None = None
    for t in tensors:
        t = t.reshape(k, n, -1)
        t = torch.where(on.unsqueeze(-1), t, torch.zeros((), dtype=t.dtype, device=t.device))
        summed = torch.matmul(w.to(t.dtype), t.view(k, n // rows, rows, -1))  # [K, U, 1, p]
        sq = summed.squeeze(2).pow(2).sum(dim=-1)
        total = sq if total is None else total + sq
    if total is None:
        return torch.zeros(k, n // rows, device=share.device)
    return total


def gram_group_sq(a: Tensor, g: Tensor, share: Tensor, rows: int, *, bias: bool) -> Tensor:
    """``[K, B / rows]`` squared norms of each group's ``sum_r share_r grad_r`` for a layer
    whose row gradient is ``sum_p g_p a_p^T`` (plus ``sum_p g_p`` for a bias).

    ``||sum_q s_q g_q a_q^T||^2 = sum_{q,q'} s_q s_q' (g_q . g_q')(a_q . a_q')`` over the
    group's positions q (a row's share on each of its positions), and the bias adds
    ``sum s_q s_q' g_q . g_q'``. The Gram matrices are taken of the rows as they are and the
    shares applied to their products (small), not to the activations; a pair with an unused
    row is set to 0, so whatever that row's info holds only reaches its own pairs.

    Args:
        a: The layer's inputs, ``[K, B, P, d_in]``.
        g: The gradients of its outputs, ``[K, B, P, d_out]``.
        share: Each row's share of its group, ``[K, B]`` (0: unused).
        rows: Rows per group (B is a multiple).
        bias: Whether the layer has a bias.
    """
    k, n, p = a.shape[:3]
    u = n // rows
    s_pos = share.to(a.dtype).unsqueeze(-1).expand(k, n, p).reshape(k * u, rows * p)
    ss = s_pos.unsqueeze(2) * s_pos.unsqueeze(1)
    a3 = a.reshape(k * u, rows * p, a.shape[-1])
    g3 = g.reshape(k * u, rows * p, g.shape[-1])
    pair = torch.bmm(a3, a3.transpose(1, 2))
    if bias:
        pair.add_(1.0)
    pair.mul_(torch.bmm(g3, g3.transpose(1, 2)))
    pair = torch.where(ss > 0, pair * ss, torch.zeros((), dtype=pair.dtype, device=pair.device))
    return pair.sum(dim=(1, 2)).view(k, u)
