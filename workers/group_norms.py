"""The squared norm of each group's weighted gradient sum, ``||sum_r s_r grad_r||^2`` over the
row slots of a privacy unit (issue 54's ``capped`` bounding), from the rows' per-layer infos.

A ``capped`` unit contributes the mean of its rows' exact gradients, clipped once; the clip
needs only that mean's norm, and the release only the rows' weighted sum (each row weighed by
its unit's clip weight times its share). So the mean itself need never be built:

* :func:`gram_group_sq`: a layer that is a linear map of its inputs at P positions per row (a
  Linear layer, P = 1 or a sequence; a convolution over its input patches) gives the norm
  from two Gram matrices over the group's rows x P positions (the ghost norm of Li et al.
  2022, over a unit instead of an example), at ``(R P)^2 (d_in + d_out)`` per unit;
* :func:`summed_group_sq`: the same layers by building each group's gradient sum (one
  ``d_out x d_in`` matrix per group, never one per row), where a group has too many
  positions for the Gram route (:func:`group_sq` picks, by :func:`gram_is_cheaper`);
* :func:`materialised_group_sq`: any layer, from its per-row gradients (``[K, B, *shape]``),
  at one weighted sum's cost.

Rows whose share is 0 (padding, rows removed for a non-finite gradient) count as zero
gradients whatever their info holds (0 * NaN is NaN): the Gram route sets their pairs to 0;
the others set their rows to 0 and start again when a norm comes out non-finite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

__all__ = [
    "gram_group_sq",
    "gram_is_cheaper",
    "group_sq",
    "materialised_group_sq",
    "summed_group_sq",
]


def gram_is_cheaper(positions: int, d_in: int, d_out: int) -> bool:
    """Whether a group of ``positions`` (rows x positions per row) costs less by Gram
    matrices than by materialising its rows' ``d_out x d_in`` gradients."""
    return positions * (d_in + d_out) < d_in * d_out


def materialised_group_sq(tensors: Iterable[Tensor], share: Tensor, rows: int) -> Tensor:
    """``[K, B / rows]`` squared norms of each group's ``sum_r share_r grad_r`` from the
    rows' gradients ``tensors`` (each ``[K, B, *shape]``, one per parameter of a layer)."""
    tensors = list(tensors)
    k, n = share.shape
    w = share.view(k, n // rows, 1, rows)

    def norms(masked: bool) -> Tensor:
        total = torch.zeros(k, n // rows, device=share.device)
        for t in tensors:
            t = t.reshape(k, n, -1)
            if masked:
                t = _zero_unused(t, share)
            summed = torch.matmul(w.to(t.dtype), t.view(k, n // rows, rows, -1))
            total = total + summed.squeeze(2).pow(2).sum(dim=-1)
        return total

    return _finite_or_masked(norms)


def summed_group_sq(a: Tensor, g: Tensor, share: Tensor, rows: int, *, bias: bool) -> Tensor:
    """:func:`gram_group_sq`'s norms by building each group's gradient sum
    ``sum_q s_q g_q a_q^T`` (one ``d_out x d_in`` matrix per group, never one per row): the
    cheaper route where a group has more positions than :func:`gram_is_cheaper` allows."""
    k, n, p = a.shape[:3]
    u = n // rows

    def norms(masked: bool) -> Tensor:
        a3 = (_zero_unused(a, share) if masked else a).reshape(k * u, rows * p, a.shape[-1])
        g3 = (_zero_unused(g, share) if masked else g).reshape(k * u, rows * p, g.shape[-1])
        s_pos = share.to(g.dtype).unsqueeze(-1).expand(k, n, p).reshape(k * u, rows * p, 1)
        gs = g3 * s_pos
        sq = torch.bmm(gs.transpose(1, 2), a3).pow(2).sum(dim=(1, 2))
        if bias:
            sq = sq + gs.sum(dim=1).pow(2).sum(dim=-1)
        return sq.view(k, u)

    return _finite_or_masked(norms)


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


def group_sq(a: Tensor, g: Tensor, share: Tensor, rows: int, *, bias: bool) -> Tensor:
    """A linear map's group norms (``a`` ``[K, B, P, d_in]``, ``g`` ``[K, B, P, d_out]``) by
    Gram matrices or by the groups' sums, whichever costs less."""
    if gram_is_cheaper(rows * a.shape[2], a.shape[-1], g.shape[-1]):
        return gram_group_sq(a, g, share, rows, bias=bias)
    return summed_group_sq(a, g, share, rows, bias=bias)


def _zero_unused(t: Tensor, share: Tensor) -> Tensor:
    """``t`` (``[K, B, ...]``) with the rows of share 0 set to 0."""
    on = (share > 0).view(*share.shape, *([1] * (t.dim() - 2)))
    return torch.where(on, t, torch.zeros((), dtype=t.dtype, device=t.device))


def _finite_or_masked(norms: Callable[[bool], Tensor]) -> Tensor:
    """``norms(False)``, the rows as they are, unless a norm is not finite: then
    ``norms(True)``, the unused rows set to 0 first. An unused row's gradient is finite in
    every step the engine runs (a padding slot reads a zero input, a non-finite row is
    recomputed from one), so the masking pass is paid only where one was not."""
    fast = norms(False)
    if bool(torch.isfinite(fast).all()):
        return fast
    return norms(True)
