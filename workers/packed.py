"""Packed models: K same-architecture trials as one batched computation.

A :class:`PackedModel` is compiled from K ``nn.Sequential`` models of the same architecture
(one per trial, each initialised from its own seed). Every tensor carries a leading trial
dimension: parameters live in one flat ``[K, P]`` buffer (layers hold views into it), and
activations are ``[K, B, ...]``. A single trial is a pack of one.

Per-sample gradients never go through autograd's parameter gradients. Parameters do not require
grad; the forward records each parametrised layer's input ``a`` and output ``z``, one
``autograd.grad`` call returns ``dL/dz`` for every layer, and each layer turns ``(a, dL/dz)``
into what DP-SGD needs:

* per-sample squared gradient norms, and
* weighted sums ``sum_i w_i g_i`` for per-sample weights ``w`` chosen by a clipping strategy.

Linear layers use the exact "ghost" identity ``||g_i a_i^T||^2 = ||g_i||^2 ||a_i||^2`` and one
batched matmul for the weighted sum, so the private step costs about what the non-private step
costs. Convolutions materialise exact per-sample gradients with one grouped weight-gradient call
(each example its own group): as many FLOPs as the ordinary weight gradient, and on the models
here (few channels, many positions) far cheaper than the ghost form, whose cost grows with the
square of the number of positions, and about 5x faster than unfold + batched matmul.

Convolutions run as grouped convolutions over the trial dimension, in the layout
``[B, K*C, H, W]`` ("bk"); linear layers use ``[K, B, ...]`` ("kb"). Activations carry their
layout along so consecutive convolutions never reshuffle memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.errors import ConfigError

Layout = Literal["kb", "bk"]


@dataclass
class Act:
    """An activation with its layout: ``kb`` = ``[K, B, ...]``; ``bk`` = ``[B, K*C, H, W]``."""

    t: Tensor
    layout: Layout
    k: int

    def as_kb(self) -> Tensor:
        if self.layout == "kb":
            return self.t
        b = self.t.shape[0]
        rest = self.t.shape[2:]
        return self.t.view(b, self.k, -1, *rest).transpose(0, 1)

    def as_bk(self) -> Tensor:
        if self.layout == "bk":
            return self.t
        k, b = self.t.shape[:2]
        c = self.t.shape[2]
        return self.t.transpose(0, 1).reshape(b, k * c, *self.t.shape[3:])


class PackedLayer:
    """A layer of a packed model. Parameter-free layers only implement :meth:`forward`."""

    param_shapes: tuple[tuple[int, ...], ...] = ()

    def forward(self, x: Act) -> Act:
        raise NotImplementedError

    @property
    def has_params(self) -> bool:
        return bool(self.param_shapes)


class ParamLayer(PackedLayer):
    """A layer with parameters. Subclasses implement the per-sample gradient algebra.

    ``bind`` receives views ``[K, *shape]`` into the flat parameter buffer. ``compute`` returns
    ``(a, z)``: the saved input and the raw output whose gradient ``autograd.grad`` returns;
    ``wrap`` turns ``z`` into the activation the next layer reads (views only), so that the
    model can mark ``z`` as a graph root *before* anything is derived from it.
    """

    params: list[Tensor]

    def bind(self, views: list[Tensor]) -> None:
        self.params = views

    def compute(self, x: Act) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def wrap(self, z: Tensor, x: Act) -> Act:
        raise NotImplementedError

    def forward(self, x: Act) -> Act:
        return self.wrap(self.compute(x)[1], x)

    def compute_perturbed(self, x: Act, info: Any, scale: Tensor) -> tuple[Tensor, Tensor]:
        """Like :meth:`compute`, with each example's parameters moved by ``scale_i * grad_i``.

        ``info`` is this layer's :meth:`grad_info` from a first pass on the same examples, so
        ``grad_i`` is example i's own gradient; ``scale`` is ``[K, B]``. Used by BAM (003).
        """
        raise ConfigError(f"{type(self).__name__} does not support per-example perturbation")

    def grad_info(self, a: Tensor, g: Tensor, k: int) -> Any:
        """Precompute whatever norms and weighted sums share (e.g. per-sample gradients)."""
        raise NotImplementedError

    def sq_norms(self, info: Any) -> Tensor:
        """Per-sample squared gradient norm of all this layer's parameters, ``[K, B]``."""
        raise NotImplementedError

    def weighted_sum(self, info: Any, w: Tensor) -> list[Tensor]:
        """``sum_i w[k, i] * grad_i`` for every parameter, each ``[K, *shape]``."""
        raise NotImplementedError

    def weighted_sum_into(self, info: Any, w: Tensor, out: list[Tensor]) -> None:
        """:meth:`weighted_sum` written into ``out`` (views of the flat gradient buffer)."""
        for dst, src in zip(out, self.weighted_sum(info, w), strict=True):
            dst.copy_(src)

    def weighted_sums_into(self, info: Any, ws: list[Tensor], outs: list[list[Tensor]]) -> None:
        """Several weightings of the same per-sample gradients at once (one per release)."""
        for w, out in zip(ws, outs, strict=True):
            self.weighted_sum_into(info, w, out)

    def per_sample_grads(self, info: Any) -> list[Tensor]:
        """Materialised per-sample gradients, each ``[K, B, *shape]`` (tests, diagnostics)."""
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# Linear


@dataclass
class _LinearInfo:
    a: Tensor  # [K, B, in] (one position per example) or [K, B, T, in]
    g: Tensor  # [K, B, out] or [K, B, T, out]
    ps: Tensor | None  # materialised per-sample weight gradients [K, B, out, in] (some T > 1)


class PLinear(ParamLayer):
    def __init__(self, m: nn.Linear) -> None:
        self.in_f, self.out_f = m.in_features, m.out_features
        self.bias = m.bias is not None
        self.param_shapes = ((self.out_f, self.in_f),) + (((self.out_f,),) if self.bias else ())

    def bind(self, views: list[Tensor]) -> None:
        super().bind(views)
        # Parameters are updated in place, so these views stay valid for the pack's lifetime.
        self._w_t = views[0].transpose(1, 2)
        self._b_row = views[1].unsqueeze(1) if self.bias else None

    def compute(self, x: Act) -> tuple[Tensor, Tensor]:
        a = x.as_kb()
        a3 = a if a.dim() == 3 else a.reshape(a.shape[0], -1, self.in_f)
        if self._b_row is not None:
            z = torch.baddbmm(self._b_row, a3, self._w_t)
        else:
            z = torch.bmm(a3, self._w_t)
        return a, z

    def wrap(self, z: Tensor, x: Act) -> Act:
        return Act(z.view(*x.as_kb().shape[:-1], self.out_f), "kb", x.k)

    def compute_perturbed(self, x: Act, info: _LinearInfo, scale: Tensor) -> tuple[Tensor, Tensor]:
        a, z = self.compute(x)
        if a.dim() != 3 or info.a.dim() != 3:
            raise ConfigError("per-example perturbation (bam) needs one position per example")
        # (W + s g a0^T) x + (b + s g) = W x + b + s (a0 . x + 1) g: a rank-one update per
        # example, from the first pass's input a0 and output gradient g.
        coef = torch.linalg.vecdot(info.a, a)
        if self.bias:
            coef = coef + 1.0
        return a, z + (scale * coef).unsqueeze(-1) * info.g

    def grad_info(self, a: Tensor, g: Tensor, k: int) -> _LinearInfo:
        if a.dim() == 3:
            return _LinearInfo(a, g.view(a.shape[0], a.shape[1], self.out_f), None)
        b = a.shape[1]
        a4 = a.reshape(k, b, -1, self.in_f)
        g4 = g.reshape(k, b, -1, self.out_f)
        t = a4.shape[2]
        ps = None
        # With extra positions (sequences) pick the cheaper exact form: ghost costs T^2 (in+out),
        # materialising costs T*in*out per sample.
        if t * (self.in_f + self.out_f) >= self.in_f * self.out_f:
            ps = torch.matmul(g4.transpose(2, 3), a4)
        return _LinearInfo(a4, g4, ps)

    def sq_norms(self, info: _LinearInfo) -> Tensor:
        a, g = info.a, info.g
        if a.dim() == 3:
            # Ghost norm: ||g_i a_i^T||^2 + ||g_i||^2 = ||g_i||^2 (||a_i||^2 + 1).
            gg = torch.linalg.vecdot(g, g)
            aa = torch.linalg.vecdot(a, a)
            return gg * (aa + 1.0) if self.bias else gg * aa
        if info.ps is not None:
            sq = info.ps.pow(2).sum(dim=(2, 3))
        else:
            aa = torch.matmul(a, a.transpose(2, 3))
            gg = torch.matmul(g, g.transpose(2, 3))
            sq = (aa * gg).sum(dim=(2, 3))
        if self.bias:
            sq = sq + g.sum(dim=2).pow(2).sum(dim=2)
        return sq

    def weighted_sum(self, info: _LinearInfo, w: Tensor) -> list[Tensor]:
        out = [
            torch.empty(w.shape[0], *s, device=w.device, dtype=info.a.dtype)
            for s in self.param_shapes
        ]
        self._weighted_sum(info, w, out)
        return out

    def weighted_sum_into(self, info: _LinearInfo, w: Tensor, out: list[Tensor]) -> None:
        if all(o.is_contiguous() for o in out):
            # A pack of one: its views of the flat buffer are contiguous, so the matmuls write
            # straight into the gradient buffer.
            self._weighted_sum(info, w, out)
        else:
            super().weighted_sum_into(info, w, out)

    def weighted_sums_into(
        self, info: _LinearInfo, ws: list[Tensor], outs: list[list[Tensor]]
    ) -> None:
        if len(ws) == 1 or info.a.dim() != 3:
            super().weighted_sums_into(info, ws, outs)
            return
        # Stack the weightings along the output axis: one matmul reads the activations once
        # for every release (OSO-DPSGD's two queries share one pass over ``a``).
        g = info.g
        stacked = torch.cat([g * w.unsqueeze(2) for w in ws], dim=2)
        sums = torch.bmm(stacked.transpose(1, 2), info.a)
        bias = torch.bmm(torch.stack(ws, dim=1), g) if self.bias else None
        for j, out in enumerate(outs):
            out[0].copy_(sums[:, j * self.out_f : (j + 1) * self.out_f])
            if bias is not None:
                out[1].copy_(bias[:, j])

    def split_sums_into(
        self,
        info: _LinearInfo,
        w_main: Tensor,
        w_extra: Tensor,
        rows: tuple[Tensor, Tensor],
        coef: float,
        outs: list[list[Tensor]],
    ) -> None:
        """See :meth:`PackedModel.split_sums_into` (pack of one, one position per example)."""
        (r_main, r_extra), (main, extra) = rows, outs
        if len(r_main) == 0:
            # Every example is on the extra side (often: all clipped): main = coef * extra.
            self._weighted_sum(info, w_extra, extra)
            for m, e in zip(main, extra, strict=True):
                torch.mul(e, coef, out=m)
            return
        if len(r_extra) == 0:
            for e in extra:
                e.zero_()
            self._weighted_sum(info, w_main, main)
            return
        g_e = info.g[:, r_extra] * w_extra[:, r_extra].unsqueeze(2)
        g_m = info.g[:, r_main] * w_main[:, r_main].unsqueeze(2)
        torch.bmm(g_e.transpose(1, 2), info.a[:, r_extra], out=extra[0])
        torch.bmm(g_m.transpose(1, 2), info.a[:, r_main], out=main[0])
        main[0].add_(extra[0], alpha=coef)
        if self.bias:
            extra[1].copy_(g_e.sum(dim=1))
            main[1].copy_(g_m.sum(dim=1)).add_(extra[1], alpha=coef)

    def _weighted_sum(self, info: _LinearInfo, w: Tensor, out: list[Tensor]) -> None:
        k, b = w.shape
        if info.ps is not None:
            torch.bmm(
                w.unsqueeze(1),
                info.ps.reshape(k, b, -1),
                out=out[0].view(k, 1, self.out_f * self.in_f),
            )
        elif info.a.dim() == 3:
            torch.bmm((info.g * w.unsqueeze(2)).transpose(1, 2), info.a, out=out[0])
        else:
            t = info.a.shape[2]
            g_scaled = info.g * w.view(k, b, 1, 1)
            torch.bmm(
                g_scaled.reshape(k, b * t, self.out_f).transpose(1, 2),
                info.a.reshape(k, b * t, self.in_f),
                out=out[0],
            )
        if self.bias:
            g_pos = info.g if info.g.dim() == 3 else info.g.sum(dim=2)
            torch.bmm(w.unsqueeze(1), g_pos, out=out[1].unsqueeze(1))

    def per_sample_grads(self, info: _LinearInfo) -> list[Tensor]:
        if info.ps is not None:
            ps = info.ps
        elif info.a.dim() == 3:
            ps = info.g.unsqueeze(3) * info.a.unsqueeze(2)
        else:
            ps = torch.matmul(info.g.transpose(2, 3), info.a)
        out = [ps]
        if self.bias:
            out.append(info.g if info.g.dim() == 3 else info.g.sum(dim=2))
        return out


# --------------------------------------------------------------------------------------------
# Convolutions (2-D), per-sample gradients materialised by one grouped weight-gradient call.


@dataclass
class _ConvInfo:
    # Per-sample weight gradients, one [B, rows, cols] tensor per trial: the convolution
    # library returns them per trial, and stacking would copy tens of MB each step.
    ps_w: list[Tensor]
    ps_b: Tensor | None  # [K, B, out]

    def stacked(self) -> Tensor:
        """``[K, B, rows, cols]`` (a copy for K > 1)."""
        return torch.stack(self.ps_w) if len(self.ps_w) > 1 else self.ps_w[0].unsqueeze(0)


class _PConvBase(ParamLayer):
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    bias: bool
    weight_shape: tuple[int, ...]

    def wrap(self, z: Tensor, x: Act) -> Act:
        return Act(z, "bk", x.k)

    def _conv(self, a: Tensor, w: Tensor, bias: Tensor | None, groups: int) -> Tensor:
        raise NotImplementedError

    def compute_perturbed(self, x: Act, info: _ConvInfo, scale: Tensor) -> tuple[Tensor, Tensor]:
        a = x.as_bk()
        k = len(info.ps_w)
        b = a.shape[0]
        # Each example gets its own weights W + s_i g_i: a grouped convolution with one group per
        # example applies them all. One call per trial, exactly as a pack of one computes it, so
        # a packed trial rounds like the trial alone (and per-trial calls are faster here).
        a5 = a.view(b, k, -1, *a.shape[2:])
        outs = []
        for t in range(k):
            w = self.params[0][t].reshape(1, *info.ps_w[t].shape[1:]) + info.ps_w[t] * scale[
                t
            ].view(b, 1, 1)
            bias = None
            if info.ps_b is not None:  # the layer has a bias
                bias = self.params[1][t].unsqueeze(0) + info.ps_b[t] * scale[t].unsqueeze(1)
                bias = bias.reshape(-1)
            z_t = self._conv(
                a5[:, t].reshape(1, -1, *a.shape[2:]),
                w.reshape(b * self.weight_shape[0], *self.weight_shape[1:]),
                bias,
                b,
            )
            outs.append(z_t.view(b, 1, -1, *z_t.shape[2:]))
        z = outs[0] if k == 1 else torch.cat(outs, dim=1)
        return a, z.view(b, -1, *z.shape[3:])

    def sq_norms(self, info: _ConvInfo) -> Tensor:
        # One fused reduction; pow(2).sum would first materialise every squared element.
        sq = torch.stack(
            [torch.linalg.vector_norm(p.reshape(p.shape[0], -1), dim=1) for p in info.ps_w]
        ).square()
        if info.ps_b is not None:
            sq = sq + torch.linalg.vector_norm(info.ps_b, dim=2).square()
        return sq

    def weighted_sum(self, info: _ConvInfo, w: Tensor) -> list[Tensor]:
        k = len(info.ps_w)
        # sum_b w[k, b] ps[k][b, :], trial by trial (the per-trial blocks are not contiguous).
        gw = torch.stack(
            [torch.matmul(w[t], p.reshape(p.shape[0], -1)) for t, p in enumerate(info.ps_w)]
        ).view(k, *self.weight_shape)
        out = [gw]
        if info.ps_b is not None:
            out.append(torch.bmm(w.unsqueeze(1), info.ps_b).squeeze(1))
        return out

    def weighted_sums_into(
        self, info: _ConvInfo, ws: list[Tensor], outs: list[list[Tensor]]
    ) -> None:
        if len(ws) == 1:
            super().weighted_sums_into(info, ws, outs)
            return
        k = len(info.ps_w)
        wst = torch.stack(ws, dim=1)  # [K, J, B]: one matmul reads the per-sample grads once
        sums = torch.stack(
            [torch.matmul(wst[t], p.reshape(p.shape[0], -1)) for t, p in enumerate(info.ps_w)]
        )
        bias = torch.bmm(wst, info.ps_b) if info.ps_b is not None else None
        for j, out in enumerate(outs):
            out[0].copy_(sums[:, j].view(k, *self.weight_shape))
            if bias is not None:
                out[1].copy_(bias[:, j])

    def per_sample_grads(self, info: _ConvInfo) -> list[Tensor]:
        ps = info.stacked()
        k, b = ps.shape[:2]
        out = [ps.reshape(k, b, *self.weight_shape)]
        if info.ps_b is not None:
            out.append(info.ps_b)
        return out


class PConv2d(_PConvBase):
    def __init__(self, m: nn.Conv2d) -> None:
        if m.groups != 1:
            raise ConfigError("grouped convolutions are not supported in DP models")
        if m.padding_mode != "zeros" or isinstance(m.padding, str):
            raise ConfigError("only numeric zero padding is supported for Conv2d in DP models")
        self.cin, self.cout = m.in_channels, m.out_channels
        self.kernel = _pair(m.kernel_size)
        self.stride = _pair(m.stride)
        self.padding = _pair(m.padding)
        self.dilation = _pair(m.dilation)
        self.bias = m.bias is not None
        self.weight_shape = (self.cout, self.cin, *self.kernel)
        self.param_shapes = (self.weight_shape,) + (((self.cout,),) if self.bias else ())

    def compute(self, x: Act) -> tuple[Tensor, Tensor]:
        a = x.as_bk()
        k = x.k
        w = self.params[0].reshape(k * self.cout, self.cin, *self.kernel)
        bias = self.params[1].reshape(k * self.cout) if self.bias else None
        return a, self._conv(a, w, bias, k)

    def _conv(self, a: Tensor, w: Tensor, bias: Tensor | None, groups: int) -> Tensor:
        return F.conv2d(a, w, bias, self.stride, self.padding, self.dilation, groups=groups)

    def grad_info(self, a: Tensor, g: Tensor, k: int) -> _ConvInfo:
        b = a.shape[0]
        ps_w = [
            p.view(b, self.cout, -1) for p in _grouped_weight_grad(self, a, g, k, transposed=False)
        ]
        ps_b = g.reshape(b, k, self.cout, -1).sum(dim=3).transpose(0, 1) if self.bias else None
        return _ConvInfo(ps_w, ps_b)


class PConvTranspose2d(_PConvBase):
    def __init__(self, m: nn.ConvTranspose2d) -> None:
        if m.groups != 1:
            raise ConfigError("grouped transposed convolutions are not supported in DP models")
        self.cin, self.cout = m.in_channels, m.out_channels
        self.kernel = _pair(m.kernel_size)
        self.stride = _pair(m.stride)
        self.padding = _pair(m.padding)
        self.output_padding = _pair(m.output_padding)
        self.dilation = _pair(m.dilation)
        self.bias = m.bias is not None
        self.weight_shape = (self.cin, self.cout, *self.kernel)
        self.param_shapes = (self.weight_shape,) + (((self.cout,),) if self.bias else ())

    def compute(self, x: Act) -> tuple[Tensor, Tensor]:
        a = x.as_bk()
        k = x.k
        w = self.params[0].reshape(k * self.cin, self.cout, *self.kernel)
        bias = self.params[1].reshape(k * self.cout) if self.bias else None
        return a, self._conv(a, w, bias, k)

    def _conv(self, a: Tensor, w: Tensor, bias: Tensor | None, groups: int) -> Tensor:
        return F.conv_transpose2d(
            a,
            w,
            bias,
            self.stride,
            self.padding,
            self.output_padding,
            groups=groups,
            dilation=self.dilation,
        )

    def grad_info(self, a: Tensor, g: Tensor, k: int) -> _ConvInfo:
        b = a.shape[0]
        ps_w = [
            p.view(b, self.cin, -1) for p in _grouped_weight_grad(self, a, g, k, transposed=True)
        ]
        ps_b = g.reshape(b, k, self.cout, -1).sum(dim=3).transpose(0, 1) if self.bias else None
        return _ConvInfo(ps_w, ps_b)


def _grouped_weight_grad(
    layer: Any, a: Tensor, g: Tensor, k: int, *, transposed: bool
) -> list[Tensor]:
    """Per-sample weight gradients of a convolution, one ``[B * rows, cols...]`` per trial.

    Folding the batch axis into the channel axis of a batch of one and treating each example as
    its own group makes the convolution library's weight gradient return one weight gradient
    per example, exactly, at close to the cost of the ordinary (summed) weight gradient, several
    times faster than unfold + batched matmul here. For a pack, one call per trial (B groups)
    is about 4x faster than one call with B*K groups, and the results stay per trial (stacking
    them would copy tens of MB per step).
    """
    b = a.shape[0]
    if k == 1:
        return [_weight_grad_call(layer, a, g, b, transposed=transposed)]
    a5 = a.view(b, k, -1, *a.shape[2:])
    g5 = g.view(b, k, -1, *g.shape[2:])
    return [
        _weight_grad_call(layer, a5[:, t], g5[:, t], b, transposed=transposed) for t in range(k)
    ]


def _weight_grad_call(layer: Any, a: Tensor, g: Tensor, groups: int, *, transposed: bool) -> Tensor:
    if transposed:
        w_shape = (groups * layer.cin, layer.cout, *layer.kernel)
        out_pad = list(layer.output_padding)
    else:
        w_shape = (groups * layer.cout, layer.cin, *layer.kernel)
        out_pad = [0, 0]
    # Only the weight's shape matters when just the weight gradient is requested.
    w = torch.empty(w_shape, device=a.device, dtype=a.dtype)
    _, gw, _ = torch.ops.aten.convolution_backward(
        g.reshape(1, -1, *g.shape[2:]),
        a.reshape(1, -1, *a.shape[2:]),
        w,
        None,
        list(layer.stride),
        list(layer.padding),
        list(layer.dilation),
        transposed,
        out_pad,
        groups,
        [False, True, False],
    )
    return gw


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, tuple | list):
        return int(v[0]), int(v[1])
    return int(v), int(v)


# --------------------------------------------------------------------------------------------
# Parameter-free layers


class PElementwise(PackedLayer):
    """Any example-wise, shape-preserving module (activations); works in either layout."""

    def __init__(self, m: nn.Module) -> None:
        self.m = m

    def forward(self, x: Act) -> Act:
        return Act(self.m(x.t), x.layout, x.k)


class PPool2d(PackedLayer):
    """Pooling acts per channel, so the ``bk`` layout ``[B, K*C, H, W]`` is valid input."""

    def __init__(self, m: nn.Module) -> None:
        self.m = m

    def forward(self, x: Act) -> Act:
        if x.layout == "bk":
            return Act(self.m(x.t), "bk", x.k)
        k, b = x.t.shape[:2]
        y = self.m(x.t.reshape(k * b, *x.t.shape[2:]))
        return Act(y.view(k, b, *y.shape[1:]), "kb", x.k)


class PFlatten(PackedLayer):
    def __init__(self, m: nn.Flatten) -> None:
        if m.start_dim != 1 or m.end_dim != -1:
            raise ConfigError("only nn.Flatten() with default dims is supported in DP models")

    def forward(self, x: Act) -> Act:
        t = x.as_kb()
        return Act(t.reshape(t.shape[0], t.shape[1], -1), "kb", x.k)


Converter = Callable[[Any], PackedLayer]
CONVERTERS: dict[type[nn.Module], Converter] = {
    nn.Linear: PLinear,
    nn.Conv2d: PConv2d,
    nn.ConvTranspose2d: PConvTranspose2d,
    nn.Flatten: PFlatten,
    nn.MaxPool2d: PPool2d,
    nn.AvgPool2d: PPool2d,
}
for _act in (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.GELU, nn.Identity, nn.SiLU):
    CONVERTERS[_act] = PElementwise


def register_packed_layer(module_type: type[nn.Module]) -> Callable[[Converter], Converter]:
    """Teach the packer a new module type (e.g. a Lipschitz layer)."""

    def deco(fn: Converter) -> Converter:
        CONVERTERS[module_type] = fn
        return fn

    return deco


# --------------------------------------------------------------------------------------------
# The packed model


@dataclass
class Captured:
    """What a capturing forward leaves for the backward pass."""

    acts: list[Tensor]
    outs: list[Tensor]


class PackedModel:
    """K trials of one architecture, with parameters in a flat ``[K, P]`` buffer.

    Args:
        modules: one ``nn.Sequential`` per trial, all of the same architecture. Their current
            parameter values become the pack's initial parameters.
        device: where the pack lives.
    """

    SUPPORTED: ClassVar[str] = "Linear, Conv2d, ConvTranspose2d, pooling, Flatten, activations"

    def __init__(self, modules: Sequence[nn.Sequential], device: torch.device | str = "cpu"):
        if not modules:
            raise ValueError("a pack needs at least one trial")
        self.k = len(modules)
        self.device = torch.device(device)
        self.template = modules[0]
        self.layers: list[PackedLayer] = [self._convert(m) for m in modules[0]]
        self.param_layers: list[ParamLayer] = [
            ly for ly in self.layers if isinstance(ly, ParamLayer)
        ]
        shapes = [s for ly in self.param_layers for s in ly.param_shapes]
        ref = [tuple(p.shape) for p in modules[0].parameters()]
        if [tuple(s) for s in shapes] != ref:
            raise ConfigError(f"model has parameters outside supported layers ({self.SUPPORTED})")
        self.numel = sum(math.prod(s) for s in shapes)
        self.flat = torch.empty(self.k, self.numel, device=self.device)
        for i, m in enumerate(modules):
            params = list(m.parameters())
            if [tuple(p.shape) for p in params] != ref:
                raise ValueError("all modules in a pack must share one architecture")
            self.flat[i] = torch.cat([p.detach().reshape(-1) for p in params]).to(self.device)
        self._views_key: tuple[int, torch.Size] | None = None
        self._views: list[list[Tensor]] = []
        # Views per layer into the flat buffer (and, via view_like, into any [K, P] buffer).
        self.slices: list[list[tuple[int, int, tuple[int, ...]]]] = []
        off = 0
        for ly in self.param_layers:
            sl = []
            for s in ly.param_shapes:
                n = math.prod(s)
                sl.append((off, off + n, s))
                off += n
            self.slices.append(sl)
            ly.bind(self.view_like(self.flat, len(self.slices) - 1))

    @staticmethod
    def _convert(m: nn.Module) -> PackedLayer:
        conv = CONVERTERS.get(type(m))
        if conv is None:
            raise ConfigError(
                f"layer {type(m).__name__} is not supported in DP models; supported: "
                f"{PackedModel.SUPPORTED}"
            )
        return conv(m)

    @property
    def n_param_layers(self) -> int:
        return len(self.param_layers)

    def view_like(self, buf: Tensor, layer: int) -> list[Tensor]:
        """Views ``[K, *shape]`` of ``buf`` (any ``[K, P]`` tensor) for one layer's params."""
        return [buf[:, a:b].view(self.k, *s) for a, b, s in self.slices[layer]]

    # -- forward ------------------------------------------------------------------------------

    def forward(
        self,
        x: Tensor,
        *,
        capture: bool = False,
        perturb: tuple[list[Any], Tensor] | None = None,
    ) -> tuple[Tensor, Captured | None]:
        """Run all trials on ``x`` ``[K, B, ...]``; returns output ``[K, B, ...]``.

        With ``capture``, also returns each parametrised layer's input and output so that
        :meth:`layer_grads` can recover per-sample gradients. With ``perturb=(infos, scale)``,
        example i runs at parameters ``theta + scale_i * g_i`` (``infos`` from a first pass).
        """
        h = Act(x, "kb", self.k)
        cap = Captured([], []) if capture else None
        li = 0
        for ly in self.layers:
            if isinstance(ly, ParamLayer):
                if perturb is None:
                    a, z = ly.compute(h)
                else:
                    a, z = ly.compute_perturbed(h, perturb[0][li], perturb[1])
                li += 1
                if cap is not None:
                    if not z.requires_grad:
                        # First parametrised layer: parameters never require grad, so mark its
                        # output as the root of the backward graph (no wasted input gradient).
                        z.requires_grad_(True)
                    cap.acts.append(a)
                    cap.outs.append(z)
                h = ly.wrap(z, h)
            else:
                h = ly.forward(h)
        return h.as_kb(), cap

    def layer_grads(self, loss_sum: Tensor, cap: Captured) -> list[Any]:
        """Backpropagate ``loss_sum`` (sum of per-sample losses) and build per-layer grad info."""
        gs = torch.autograd.grad(loss_sum, cap.outs)
        return [
            ly.grad_info(a.detach(), g, self.k)
            for ly, a, g in zip(self.param_layers, cap.acts, gs, strict=True)
        ]

    def sq_norms(self, infos: list[Any]) -> Tensor:
        """Per-sample, per-layer squared gradient norms ``[K, B, L]``."""
        return torch.stack(
            [ly.sq_norms(inf) for ly, inf in zip(self.param_layers, infos, strict=True)], dim=-1
        )

    def weighted_sum_into(self, out: Tensor, infos: list[Any], weights: Tensor) -> None:
        """Write ``sum_i w_i g_i`` into ``out`` ``[K, P]``.

        ``weights`` is ``[K, B, R]``: R = 1 applies one weight per example to every layer,
        R = L gives each layer its own weight (layerwise clipping).
        """
        r = weights.shape[-1]
        views = self._cached_views(out)
        w = weights[..., 0] if r == 1 else None
        for li, (ly, inf) in enumerate(zip(self.param_layers, infos, strict=True)):
            ly.weighted_sum_into(inf, w if w is not None else weights[..., li], views[li])

    def weighted_sums_into(
        self, outs: list[Tensor], infos: list[Any], weights: list[Tensor]
    ) -> None:
        """:meth:`weighted_sum_into` for several ``[K, B, R]`` weightings in one pass."""
        if len(outs) == 1:
            self.weighted_sum_into(outs[0], infos, weights[0])
            return
        views = [[self.view_like(o, li) for o in outs] for li in range(len(self.param_layers))]
        for li, (ly, inf) in enumerate(zip(self.param_layers, infos, strict=True)):
            ws = [w[..., 0 if w.shape[-1] == 1 else li] for w in weights]
            ly.weighted_sums_into(inf, ws, views[li])

    def split_sums_into(
        self,
        main: Tensor,
        extra: Tensor,
        infos: list[Any],
        w_main: Tensor,
        w_extra: Tensor,
        coef: Tensor,
    ) -> None:
        """Two releases whose weights cover disjoint rows, for a pack of one.

        ``w_main`` equals ``coef * w_extra`` wherever ``w_extra`` is non-zero. Then
        ``main = sum_{w_extra = 0} w_main g + coef * extra``: each example's gradient enters one
        matmul only. Layers without a cheaper split fall back to both weighted sums.
        """
        if self.k != 1 or w_main.shape[-1] != 1 or w_extra.shape[-1] != 1:
            self.weighted_sums_into([main, extra], infos, [w_main, w_extra])
            return
        wm, we = w_main[..., 0], w_extra[..., 0]
        on_extra = we[0] != 0
        rows = (on_extra.logical_not().nonzero().squeeze(1), on_extra.nonzero().squeeze(1))
        c = float(coef[0])
        for li, (ly, inf) in enumerate(zip(self.param_layers, infos, strict=True)):
            outs = [self.view_like(main, li), self.view_like(extra, li)]
            if isinstance(ly, PLinear) and inf.a.dim() == 3:
                ly.split_sums_into(inf, wm, we, rows, c, outs)
            else:
                ly.weighted_sums_into(inf, [wm, we], outs)

    def _cached_views(self, buf: Tensor) -> list[list[Tensor]]:
        # The engine reuses one gradient buffer per release; building its per-layer views once
        # saves a few dozen tiny ops per step (which matters for small models on CPU).
        key = (buf.data_ptr(), buf.shape)
        if self._views_key != key:
            self._views_key = key
            self._views = [self.view_like(buf, li) for li in range(len(self.param_layers))]
        return self._views

    def per_sample_grads(self, infos: list[Any]) -> Tensor:
        """Flat per-sample gradients ``[K, B, P]`` (for tests and small diagnostics only)."""
        parts = []
        for ly, inf in zip(self.param_layers, infos, strict=True):
            for t in ly.per_sample_grads(inf):
                parts.append(t.reshape(t.shape[0], t.shape[1], -1))
        return torch.cat(parts, dim=-1)

    # -- export -------------------------------------------------------------------------------

    def to_module(self, trial: int, flat_row: Tensor | None = None) -> nn.Sequential:
        """A standalone ``nn.Sequential`` holding trial ``trial``'s (or ``flat_row``'s) weights."""
        import copy

        m = copy.deepcopy(self.template).to(self.device)
        row = self.flat[trial] if flat_row is None else flat_row
        torch.nn.utils.vector_to_parameters(row.detach().clone(), m.parameters())
        return m
