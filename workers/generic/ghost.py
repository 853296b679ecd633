"""A rule layer's book-keeping info: per-example norms and weighted sums from its records.

From a layer's recorded inputs ``a`` and output gradients ``g`` (one backward), each info gives
the per-example squared norms ``[K, B]`` (Li et al. 2022's ghost norm: Gram matrices over
positions, never the per-example gradients), the weighted sum ``sum_i w_i grad_i`` written into
the flat parameters, and, where needed, the materialised per-example gradients:

* :class:`_GhostLinear`: a Linear layer over positions, or an Embedding (``[id_t == id_s]`` as
  the input Gram, the weighted sum an ``index_add``);
* :class:`_GhostConv`: a convolution, over its input patches (``unfold``);
* :func:`conv_info`: a convolution's info by whichever exact route costs less (ghost norm or
  every example's gradient as one grouped convolution);
* :func:`info_sq` and :func:`as_materialised`: the same for an info of either kind or a list
  of materialised per-example gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.generic.model import LayerInfo
from workers.group_norms import group_sq, materialised_group_sq
from workers.packed.conv import per_example_weight_grad


@dataclass
class _GhostLinear:
    """A Linear (or Embedding) layer's book-keeping info: inputs and output gradients."""

    kind: str  # "linear" or "embedding"
    a: Tensor  # [K, B, T, d_in] (linear) or [K, B, T] ids (embedding)
    g: Tensor  # [K, B, T, d_out]
    bias: bool
    padding_idx: int | None = None
    rows: int = 0  # embedding: the vocabulary size

    def sq_norm(self) -> Tensor:
        """``[K, B]`` per-example squared norms (ghost norm: Gram matrices over positions)."""
        g = self.g
        if self.kind == "embedding":
            ids = self.a
            same = ids.unsqueeze(-1) == ids.unsqueeze(-2)  # [K, B, T, T]
            if self.padding_idx is not None:
                # F.embedding never writes the padding row: those positions contribute nothing.
                real = ids != self.padding_idx
                same = same & real.unsqueeze(-1) & real.unsqueeze(-2)
            gg = g @ g.transpose(-1, -2)
            return (gg * same.to(g.dtype)).sum(dim=(-1, -2))
        a = self.a
        if a.shape[2] == 1:
            sq = a.pow(2).sum(dim=(2, 3)) * g.pow(2).sum(dim=(2, 3))
        else:
            aa = a @ a.transpose(-1, -2)
            gg = g @ g.transpose(-1, -2)
            sq = (aa * gg).sum(dim=(-1, -2))
        if self.bias:
            sq = sq + g.sum(dim=2).pow(2).sum(dim=-1)
        return sq

    def weighted_into(self, outs: list[Tensor], w: Tensor) -> None:
        """``sum_i w_i grad_i`` into ``outs`` (``[K, numel]`` per parameter); ``w`` ``[K, B]``."""
        k, b, t, d_out = self.g.shape
        wg = (self.g * w.view(k, b, 1, 1)).reshape(k, b * t, d_out)
        if self.kind == "embedding":
            out = outs[0].view(k, self.rows, d_out)
            ids = self.a.reshape(k, b * t)
            if self.padding_idx is not None:
                wg = wg * (ids != self.padding_idx).unsqueeze(-1).to(wg.dtype)
            out.zero_()
            for j in range(k):
                out[j].index_add_(0, ids[j], wg[j])
            return
        a = self.a.reshape(k, b * t, -1)
        torch.bmm(wg.transpose(1, 2), a, out=outs[0].view(k, d_out, a.shape[-1]))
        if self.bias:
            outs[1].copy_(wg.sum(dim=1))

    def materialise(self) -> LayerInfo:
        """Per-example gradients ``[K, B, *shape]`` of the layer's parameters."""
        if self.kind == "embedding":
            k, b, t, d = self.g.shape
            ids = self.a
            g = self.g
            if self.padding_idx is not None:
                g = g * (ids != self.padding_idx).unsqueeze(-1).to(g.dtype)
            out = g.new_zeros(k * b, self.rows, d)
            out.scatter_add_(
                1, ids.reshape(k * b, t, 1).expand(k * b, t, d), g.reshape(k * b, t, d)
            )
            return [out.view(k, b, self.rows, d)]
        w = torch.einsum("kbto,kbti->kboi", self.g, self.a)
        return [w, self.g.sum(dim=2)] if self.bias else [w]


@dataclass
class _GhostConv:
    """A conv layer's book-keeping info (ghost norm over its input patches)."""

    cols: Tensor  # [K, B, d_in, L]: each example's input patches (``unfold``)
    x: Tensor  # [K*B, C, *S]: the layer's input, for the weighted sum
    g: Tensor  # [K*B, O, *S']: the output gradients
    mod: Any  # the nn.Conv1d / nn.Conv2d (its geometry; its parameters are never read)
    bias: bool

    def sq_norm(self) -> Tensor:
        """``[K, B]`` per-example squared norms: ``<a a^T, g g^T>`` over output positions."""
        k, b = self.cols.shape[:2]
        cols = self.cols.flatten(0, 1)  # [n, d_in, L]
        gf = self.g.flatten(2)  # [n, O, L]
        aa = cols.transpose(1, 2) @ cols
        gg = gf.transpose(1, 2) @ gf
        sq = (aa * gg).sum(dim=(1, 2))
        if self.bias:
            sq = sq + gf.sum(dim=2).pow(2).sum(dim=1)
        return sq.view(k, b)

    def weighted_into(self, outs: list[Tensor], w: Tensor) -> None:
        """``sum_i w_i grad_i`` into ``outs``: the convolution's own weight gradient of the
        weighted output gradients, per trial."""
        k, b = self.cols.shape[:2]
        wg = self.g * w.reshape(k * b, *([1] * (self.g.dim() - 1)))
        m = self.mod
        weight = self.g.new_empty(m.weight.shape)  # only its shape is read
        for j in range(k):
            sl = slice(j * b, (j + 1) * b)
            _, gw, gb = torch.ops.aten.convolution_backward(
                wg[sl],
                self.x[sl],
                weight,
                [weight.shape[0]] if self.bias else None,
                list(m.stride),
                list(m.padding),
                list(m.dilation),
                False,
                [0] * len(m.kernel_size),
                1,
                [False, True, self.bias],
            )
            outs[0][j].copy_(gw.reshape(-1))
            if self.bias:
                outs[1][j].copy_(gb)

    def materialise(self) -> LayerInfo:
        """Per-example gradients ``[K, B, *shape]`` of the layer's parameters."""
        k, b = self.cols.shape[:2]
        gf = self.g.flatten(2).view(k, b, self.g.shape[1], -1)
        w = torch.einsum("kbol,kbil->kboi", gf, self.cols)
        w = w.reshape(k, b, *self.mod.weight.shape)
        return [w, gf.sum(dim=-1)] if self.bias else [w]


def info_sq(info: Any) -> Tensor:
    """``[K, B]`` per-example squared norms of a layer's info.

    Args:
        info: A :class:`_GhostLinear` or :class:`_GhostConv`, or the layer's materialised
            per-example gradients (a list of ``[K, B, *shape]`` tensors).
    """
    if isinstance(info, _GhostLinear | _GhostConv):
        return info.sq_norm()
    # One fused pass per tensor (pow then sum would write a temporary the size of the
    # per-example gradients: a third of WRN's book-keeping step).
    return sum(torch.linalg.vector_norm(t.flatten(2), dim=2).square() for t in info)


def group_info_sq(info: Any, share: Tensor, rows: int) -> Tensor:
    """``[K, B / rows]`` squared norms of each group's ``sum_r share_r grad_r`` from a layer's
    info (:mod:`workers.group_norms`): a Linear's or a convolution's from its inputs and
    output gradients (Gram matrices or each group's sum, whichever costs less), else from the
    rows' gradients."""
    if isinstance(info, _GhostLinear) and info.kind == "linear":
        return group_sq(info.a, info.g, share, rows, bias=info.bias)
    if isinstance(info, _GhostConv):
        k, b, _, positions = info.cols.shape
        a = info.cols.transpose(2, 3)  # [K, B, L, d_in]
        g = info.g.flatten(2).view(k, b, -1, positions).transpose(2, 3)  # [K, B, L, O]
        return group_sq(a, g, share, rows, bias=info.bias)
    return materialised_group_sq(as_materialised(info), share, rows)


def as_materialised(info: Any) -> LayerInfo:
    """A layer's per-example gradients ``[K, B, *shape]``, materialised from a ghost info
    (an info already materialised is returned as it is)."""
    return info.materialise() if isinstance(info, _GhostLinear | _GhostConv) else info


def conv_info(mod: Any, a: Tensor, g: Tensor, has_bias: bool) -> Any:
    """A conv layer's per-example info, by whichever of two exact routes costs less.

    * Ghost norm (Li et al. 2022's mixed rule): a conv is a linear map of its input
      patches, so the patches' and output gradients' Gram matrices over the ``L`` output
      positions give each example's norm at ``O(L^2 (d_in + d_out))``, and the weighted sum
      is one matmul. It wins where ``L (d_in + d_out) < d_in d_out``: the late, small
      feature maps of a ResNet.
    * Materialised, as one grouped convolution: the batch becomes the channel groups, so
      the convolution's own weight-gradient kernel computes every example's gradient at
      about the cost of one ordinary weight gradient (no ``unfold`` copy). The weighted sum
      is then a cheap ``[B] x [B, P]`` product.

    Args:
        mod: The ``nn.Conv1d`` / ``nn.Conv2d`` (its geometry; its parameters are never read).
        a: The layer's recorded inputs, ``[K, B, C, *S]``.
        g: The gradients of the loss with respect to its outputs, ``[K, B, O, *S']``.
        has_bias: Whether the layer has a bias.

    Returns:
        A :class:`_GhostConv`, or the materialised per-example gradients.
    """
    k, b = g.shape[:2]
    n = k * b
    one_d = isinstance(mod, nn.Conv1d)
    x = a.reshape(n, *a.shape[2:])
    gy = g.reshape(n, *g.shape[2:])
    ks = tuple(mod.kernel_size)
    st, pd, dl = list(mod.stride), list(mod.padding), list(mod.dilation)
    out_c, in_per_group = mod.weight.shape[0], mod.weight.shape[1]
    positions = math.prod(gy.shape[2:])
    d_in, d_out = in_per_group * math.prod(ks), out_c
    if mod.groups == 1 and positions * (d_in + d_out) < d_in * d_out:
        x2 = x.unsqueeze(-2) if one_d else x
        ks2 = (1, *ks) if one_d else ks
        lead = ((1,), (0,), (1,)) if one_d else ((), (), ())
        st2, pd2, dl2 = (tuple(h) + tuple(v) for h, v in zip(lead, (st, pd, dl), strict=True))
        cols = F.unfold(x2, ks2, dilation=dl2, padding=pd2, stride=st2)  # [n, d_in, L]
        return _GhostConv(cols.view(k, b, d_in, positions), x, gy, mod, has_bias)
    w = per_example_weight_grad(
        x,
        gy,
        weight_shape=(n * out_c, in_per_group, *ks),
        stride=st,
        padding=pd,
        dilation=dl,
        groups=n * mod.groups,
    ).view(k, b, *mod.weight.shape)
    return [w, gy.flatten(2).sum(dim=-1).reshape(k, b, -1)] if has_bias else [w]


__all__ = ["as_materialised", "conv_info", "group_info_sq", "info_sq"]
