"""Packed weight-standardised convolutions (:class:`~workers.models.blocks.WSConv2d`).

The convolution applies ``W_hat = (W - mean) / sqrt(var + eps)`` (per output channel, over its
fan-in), a function of the trial's parameters alone. So the packed convolution's per-example
gradients with respect to ``W_hat`` (:class:`~workers.packed.conv.PConv2d`, exact) become those
with respect to ``W`` through one and the same linear map for every example of a trial, the
vector-Jacobian product of the standardisation at ``W``:

    dL_i/dW = (G_i - mean(G_i) - W_hat * mean(G_i * W_hat)) / sqrt(var + eps)

(each mean over the fan-in, ``G_i = dL_i/dW_hat``). A few element-wise passes over the
per-example gradients, exact up to float rounding (the tests compare with ``torch.func``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from workers.models.blocks import WSConv2d, standardize_weight
from workers.packed.conv import PConv2d, _ConvInfo
from workers.packed.registry import register_packed_layer


class PWSConv2d(PConv2d):
    """:class:`PConv2d` on the standardised weights, its gradients chained back to ``W``."""

    def __init__(self, m: WSConv2d) -> None:
        super().__init__(m)
        self.eps = float(m.eps)

    def _weight(self) -> Tensor:
        return standardize_weight(self.params[0], self.eps, lead=2)

    def _example_weight(self, w: Tensor) -> Tensor:
        # BAM's perturbed pass: each example standardises its own moved weights.
        return standardize_weight(w, self.eps, lead=2)

    def grad_info(self, a: Tensor, g: Tensor, k: int) -> _ConvInfo:
        info = super().grad_info(a, g, k)  # per-example gradients w.r.t. W_hat
        w = self.params[0].reshape(k, self.cout, -1)
        var, mean = torch.var_mean(w, dim=-1, keepdim=True, correction=0)
        inv = torch.rsqrt(var + self.eps)  # [K, out, 1]
        w_hat = (w - mean) * inv
        info.ps_w = [_standardization_vjp(p, w_hat[t], inv[t]) for t, p in enumerate(info.ps_w)]
        return info


def _standardization_vjp(g_hat: Tensor, w_hat: Tensor, inv: Tensor) -> Tensor:
    """Per-example ``dL_i/dW`` ``[B, out, n]`` from ``dL_i/dW_hat`` ``[B, out, n]``, given the
    trial's standardised weights ``w_hat`` ``[out, n]`` and ``1 / sqrt(var + eps)`` ``[out, 1]``
    (the module docstring's formula: the gradient of a normalisation, over the fan-in)."""
    proj = (g_hat * w_hat).mean(dim=-1, keepdim=True)
    return (g_hat - g_hat.mean(dim=-1, keepdim=True) - w_hat * proj) * inv


register_packed_layer(WSConv2d)(PWSConv2d)
