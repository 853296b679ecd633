"""Packed parameter-free layers: activations, pooling, flatten."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dpsweep.errors import ConfigError
from workers.packed.layer import Act, PackedLayer
from workers.packed.registry import register_packed_layer


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
        self._max = _MaxPoolArgs.of(m)

    def forward(self, x: Act) -> Act:
        if x.layout == "bk":
            if self._max is not None and x.t.dim() == 4 and x.t.device.type == "cpu":
                return Act(_ChannelsLastMaxPool.apply(x.t, self._max), "bk", x.k)
            return Act(self.m(x.t), "bk", x.k)
        k, b = x.t.shape[:2]
        y = self.m(x.t.reshape(k * b, *x.t.shape[2:]))
        return Act(y.view(k, b, *y.shape[1:]), "kb", x.k)


class _MaxPoolArgs:
    """A plain ``nn.MaxPool2d``'s arguments, as the aten max-pool kernels take them."""

    def __init__(self, m: nn.MaxPool2d) -> None:
        self.kernel = _pair(m.kernel_size)
        self.stride = _pair(m.stride if m.stride is not None else m.kernel_size)
        self.padding = _pair(m.padding)
        self.dilation = _pair(m.dilation)
        self.ceil_mode = bool(m.ceil_mode)

    @classmethod
    def of(cls, m: nn.Module) -> _MaxPoolArgs | None:
        if type(m) is not nn.MaxPool2d or m.return_indices:
            return None
        return cls(m)


class _ChannelsLastMaxPool(torch.autograd.Function):
    """``max_pool2d`` of an NCHW tensor on CPU, computed by the channels-last kernel.

    A pack's activations have many small planes (``B x K*C`` planes of a few pixels), where
    the NCHW kernel spends most of its time per plane; the channels-last kernel vectorises
    across channels and is ~10x faster here, conversions included. Both kernels scan each
    window in the same order with the same comparison, so values and argmax indices (ties,
    NaN) are identical; the backward is the NCHW kernel's, with those indices.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, args: _MaxPoolArgs) -> Tensor:
        out, idx = torch.ops.aten.max_pool2d_with_indices(
            x.contiguous(memory_format=torch.channels_last),
            list(args.kernel),
            list(args.stride),
            list(args.padding),
            list(args.dilation),
            args.ceil_mode,
        )
        ctx.save_for_backward(x, idx)
        ctx.args = args
        return out.contiguous()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        x, idx = ctx.saved_tensors
        a: _MaxPoolArgs = ctx.args
        gx = torch.ops.aten.max_pool2d_with_indices_backward(
            grad.contiguous(),
            x,
            list(a.kernel),
            list(a.stride),
            list(a.padding),
            list(a.dilation),
            a.ceil_mode,
            idx.contiguous(),
        )
        return gx, None


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, tuple | list):
        return int(v[0]), int(v[1])
    return int(v), int(v)


class PFlatten(PackedLayer):
    def __init__(self, m: nn.Flatten) -> None:
        if m.start_dim != 1 or m.end_dim != -1:
            raise ConfigError("only nn.Flatten() with default dims is supported in DP models")

    def forward(self, x: Act) -> Act:
        t = x.as_kb()
        return Act(t.reshape(t.shape[0], t.shape[1], -1), "kb", x.k)


register_packed_layer(nn.Flatten)(PFlatten)
register_packed_layer(nn.MaxPool2d)(PPool2d)
register_packed_layer(nn.AvgPool2d)(PPool2d)
for _act in (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.GELU, nn.Identity, nn.SiLU):
    register_packed_layer(_act)(PElementwise)
