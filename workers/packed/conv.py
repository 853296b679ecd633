"""Packed 2-D convolutions: per-sample gradients from one grouped weight-gradient call.

Convolutions materialise exact per-sample gradients with one grouped weight-gradient call
(each example its own group): as many FLOPs as the ordinary weight gradient, and on the models
here (few channels, many positions) far cheaper than the ghost form, whose cost grows with the
square of the number of positions, and 2-5x faster than unfold + batched matmul. On small
output maps (at most :data:`_PATCH_MAX_POSITIONS` positions, like the digits CNN's 3x3) the
grouped call is the slower one on CPU, and the gradients come from the input patches and one
batched matmul per trial instead.

Convolutions run as grouped convolutions over the trial dimension, in the layout
``[B, K*C, H, W]`` ("bk"), so consecutive convolutions never reshuffle memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpsweep.errors import ConfigError
from workers.packed.layer import Act, ParamLayer
from workers.packed.registry import register_packed_layer


@dataclass
class _ConvInfo:
    # Per-sample weight gradients, one [B, rows, cols] tensor per trial: the convolution
    # library returns them per trial, and stacking would copy tens of MB each step.
    ps_w: list[Tensor]
    ps_b: Tensor | None  # [K, B, out]

    def stacked(self) -> Tensor:
        """``[K, B, rows, cols]`` (a copy for K > 1)."""
        return torch.stack(self.ps_w) if len(self.ps_w) > 1 else self.ps_w[0].unsqueeze(0)


# Input channels per trial up to which a pack convolves trial by trial (measured on CPU: 1
# channel is ~2.5x faster per trial, 16 channels faster grouped).
_PER_TRIAL_MAX_CIN = 3


class _PConvBase(ParamLayer):
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    bias: bool
    weight_shape: tuple[int, ...]

    def wrap(self, z: Tensor, x: Act) -> Act:
        return Act(z, "bk", x.k)

    def _weight(self) -> Tensor:
        """The weights the convolution applies, ``[K, *weight_shape]``: the parameters here; a
        subclass may derive them from the parameters (weight standardisation)."""
        return self.params[0]

    def _example_weight(self, w: Tensor) -> Tensor:
        """The weights an example applies, ``[B, rows, cols]``, from its own (perturbed)
        parameters ``w`` of the same shape: ``w`` here, as :meth:`_weight` derives them."""
        return w

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
            w = self._example_weight(
                self.params[0][t].reshape(1, *info.ps_w[t].shape[1:])
                + info.ps_w[t] * scale[t].view(b, 1, 1)
            )
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
        w_k = self._weight()
        if k > 1 and self.cin <= _PER_TRIAL_MAX_CIN and a.device.type == "cpu":
            # Few input channels per trial (an image model's first layer): on CPU the grouped
            # kernel is ~2.5x slower here than one plain convolution per trial on its own
            # channels (which is also exactly how the trial alone computes it).
            b = a.shape[0]
            a5 = a.view(b, k, self.cin, *a.shape[2:])
            bias_k = self.params[1] if self.bias else None
            outs = [
                F.conv2d(
                    a5[:, t].contiguous(),
                    w_k[t],
                    None if bias_k is None else bias_k[t],
                    self.stride,
                    self.padding,
                    self.dilation,
                )
                for t in range(k)
            ]
            return a, torch.cat(outs, dim=1)
        w = w_k.reshape(k * self.cout, self.cin, *self.kernel)
        bias = self.params[1].reshape(k * self.cout) if self.bias else None
        return a, self._conv(a, w, bias, k)

    def _conv(self, a: Tensor, w: Tensor, bias: Tensor | None, groups: int) -> Tensor:
        return F.conv2d(a, w, bias, self.stride, self.padding, self.dilation, groups=groups)

    def grad_info(self, a: Tensor, g: Tensor, k: int) -> _ConvInfo:
        b = a.shape[0]
        if g.shape[2] * g.shape[3] <= _PATCH_MAX_POSITIONS and a.device.type == "cpu":
            ps_w = _patch_weight_grads(self, a, g, k)
        else:
            ps_w = [
                p.view(b, self.cout, -1)
                for p in _grouped_weight_grad(self, a, g, k, transposed=False)
            ]
        ps_b = g.reshape(b, k, self.cout, -1).sum(dim=3).transpose(0, 1) if self.bias else None
        return _ConvInfo(ps_w, ps_b)


# Output positions up to which a convolution's per-sample weight gradients come from its input
# patches (unfold, then one batched matmul per trial) instead of the grouped weight-gradient
# call. Measured on CPU with one thread: on few positions the grouped kernel is the slower one
# (4-5x on the digits CNN's second convolution, 3x3 outputs, at batch 32 to 512; 1.2-5.8x on
# 4x4 outputs), on many it is the faster one (2-5x at 5x5 to 16x16 outputs).
_PATCH_MAX_POSITIONS = 16


def _patch_weight_grads(layer: PConv2d, a: Tensor, g: Tensor, k: int) -> list[Tensor]:
    """Per-sample weight gradients ``[B, out, in * kh * kw]``, one per trial, as the product of
    each example's output gradients ``[out, L]`` with its input patches ``[L, in * kh * kw]``
    (the same values as :func:`_grouped_weight_grad`'s, summed in another order)."""
    b = a.shape[0]
    a5 = a.view(b, k, layer.cin, *a.shape[2:])
    g4 = g.reshape(b, k, layer.cout, -1)
    out = []
    for t in range(k):
        cols = F.unfold(
            a5[:, t],
            layer.kernel,
            dilation=layer.dilation,
            padding=layer.padding,
            stride=layer.stride,
        )
        out.append(torch.bmm(g4[:, t], cols.transpose(1, 2)))
    return out


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
    return per_example_weight_grad(
        a,
        g,
        weight_shape=w_shape,
        stride=layer.stride,
        padding=layer.padding,
        dilation=layer.dilation,
        groups=groups,
        transposed=transposed,
        output_padding=out_pad,
    )


def per_example_weight_grad(
    a: Tensor,
    g: Tensor,
    *,
    weight_shape: tuple[int, ...],
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
    transposed: bool = False,
    output_padding: Any = None,
) -> Tensor:
    """The weight gradient of a convolution whose examples are its groups (see
    :func:`_grouped_weight_grad`): ``a`` ``[N, C, *S]`` and ``g`` ``[N, O, *S']`` become a
    batch of one with ``N * C`` and ``N * O`` channels, and the library's weight-gradient
    kernel returns ``[*weight_shape]``, one block per group. 1-D and 2-D alike."""
    # Only the weight's shape matters when just the weight gradient is requested.
    w = torch.empty(weight_shape, device=a.device, dtype=a.dtype)
    dims = len(weight_shape) - 2
    _, gw, _ = torch.ops.aten.convolution_backward(
        g.reshape(1, -1, *g.shape[2:]),
        a.reshape(1, -1, *a.shape[2:]),
        w,
        None,
        list(stride),
        list(padding),
        list(dilation),
        transposed,
        list(output_padding) if output_padding is not None else [0] * dims,
        groups,
        [False, True, False],
    )
    return gw


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, tuple | list):
        return int(v[0]), int(v[1])
    return int(v), int(v)


register_packed_layer(nn.Conv2d)(PConv2d)
register_packed_layer(nn.ConvTranspose2d)(PConvTranspose2d)
