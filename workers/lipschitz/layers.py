"""The parameter-free Lipschitz layers and their packed versions.

* :class:`InputBall` flattens each example and projects it onto the L2 ball of radius X:
  ``x <- x * min(1, X/||x||)``. Deterministic and per example, so it is fine under DP.
* :class:`GroupSort` with groups of two (MaxMin): each pair ``(a, b) -> (max, min)``. It permutes
  its input, so it is 1-Lipschitz, preserves the norm, and its Jacobian is a permutation.
  :class:`ChannelGroupSort` pairs the channels of an image the same way; :class:`ImageBall` is
  the input ball keeping each example's ``[C, H, W]`` shape (for ``lip_cnn``).
* :class:`LogitScale` (optional): a fixed temperature ``tau`` on the logits.

Their packed versions are registered with the packed engine's layer hook
(:func:`workers.packed.registry.register_packed_layer`) when this module is imported.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from dpsweep.errors import ConfigError
from workers.lipschitz.rounding import _gamma, _unit_roundoff
from workers.packed.layer import Act, PackedLayer
from workers.packed.parameter_free import PElementwise
from workers.packed.registry import register_packed_layer

# --------------------------------------------------------------------------------------------
# Modules


def group_sort(x: Tensor) -> Tensor:
    """GroupSort with groups of two (MaxMin) on the last dimension: ``(a, b) -> (max, min)``.

    Implemented as a gather with a per-pair permutation, so the output is an exact permutation
    of the input (norm preserved bit for bit) and the backward pass applies the same
    permutation to the cotangent: the Jacobian is a permutation matrix, spectral norm 1. (Ties
    keep the original order, which is still a permutation.) A gather is about 3x faster
    forward+backward than ``torch.maximum``/``torch.minimum``, whose backward splits ties.
    """
    if x.shape[-1] % 2:
        raise ValueError(f"GroupSort needs an even number of features; got {x.shape[-1]}")
    pairs = x.unflatten(-1, (-1, 2))
    swap = pairs[..., 0] < pairs[..., 1]
    index = torch.stack((swap, ~swap), dim=-1).long()
    return torch.gather(pairs, -1, index).flatten(-2)


class GroupSort(nn.Module):
    """MaxMin activation (GroupSort, group size 2) on the feature (last) dimension."""

    def forward(self, x: Tensor) -> Tensor:
        return group_sort(x)


def group_sort_dim(x: Tensor, dim: int) -> Tensor:
    """:func:`group_sort` on dimension ``dim``: pairs ``(2i, 2i + 1)`` along it sorted.

    The same gather, so again an exact permutation of the input with a permutation Jacobian.
    """
    dim = dim % x.dim()
    if x.shape[dim] % 2:
        raise ValueError(f"GroupSort needs an even number of channels; got {x.shape[dim]}")
    pairs = x.unflatten(dim, (-1, 2))
    swap = pairs.select(dim + 1, 0) < pairs.select(dim + 1, 1)
    index = torch.stack((swap, ~swap), dim=dim + 1).long()
    return torch.gather(pairs, dim + 1, index).flatten(dim, dim + 1)


class ChannelGroupSort(nn.Module):
    """MaxMin on the channels of ``[B, C, H, W]`` (C even): channels ``2i, 2i + 1`` paired."""

    def forward(self, x: Tensor) -> Tensor:
        return group_sort_dim(x, 1)


def safe_radius(radius: float, features: int, dtype: torch.dtype) -> float:
    """The radius :func:`project_to_ball` scales to, so that outputs provably have norm <= radius.

    With u the unit roundoff, the computed norm of a d-vector is ``n^ >= ||x|| sqrt(1 - gamma_d)
    (1 - u)`` (d rounded squares summed in any order, then a rounded square root); the radius
    R rounds to the tensor's dtype, the factor ``R / n^`` takes at most two roundings and each
    product one, so ``||output|| <= R (1 + u)^4 / ((1 - u) sqrt(1 - gamma_d))``; the same holds
    when the factor clamps to 1 (the example is then returned unchanged). That is at most
    ``radius`` for ``R = radius (1 - gamma_{d+8})`` (first order: ``(d/2 + 3) u`` to spare).
    The shrink is ~(d+8) u: 5e-5 for d = 784 in float32.
    """
    return radius * (1.0 - _gamma(features + 8, _unit_roundoff(dtype)))


def project_to_ball(x: Tensor, radius: float, batch_dims: int) -> Tensor:
    """Flatten each example (all dims after ``batch_dims``) and project it onto the L2 ball.

    ``x * min(1, R / ||x||)`` with R = :func:`safe_radius`; a zero example stays zero (R/0 = inf
    is clamped to 1), and an example so large that its norm overflows becomes zero (still in
    the ball). Returns ``[*batch, features]``.
    """
    flat = x.reshape(*x.shape[:batch_dims], -1)
    r = safe_radius(radius, flat.shape[-1], flat.dtype)
    norm = torch.linalg.vector_norm(flat, dim=-1, keepdim=True)
    return flat * torch.clamp(r / norm, max=1.0)


class InputBall(nn.Module):
    """Flattens each example and projects it onto the L2 ball of radius ``radius`` (X).

    This is what makes the input bound X of the sensitivity analysis hold for *any* finite
    input: a deterministic per-example transform, so it costs no privacy. Examples inside the
    ball pass unchanged (up to a relative shrink of ~(d+8)·2^-24 that absorbs float rounding).
    """

    def __init__(self, radius: float) -> None:
        super().__init__()
        if not (radius > 0 and math.isfinite(radius)):
            raise ConfigError(
                f"input_bound must be a positive finite number; got {radius!r}",
                field="model.options.input_bound",
            )
        self.radius = float(radius)

    def forward(self, x: Tensor) -> Tensor:
        return project_to_ball(x, self.radius, batch_dims=1)

    def extra_repr(self) -> str:
        return f"radius={self.radius}"


class ImageBall(InputBall):
    """:class:`InputBall` that keeps each example's shape (``[C, H, W]``) for convolutions."""

    def forward(self, x: Tensor) -> Tensor:
        return project_to_ball(x, self.radius, batch_dims=1).view(x.shape)


class LogitScale(nn.Module):
    """Multiplies its input by a fixed ``scale`` (a logit temperature). |scale|-Lipschitz."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        if not (scale > 0 and math.isfinite(scale)):
            raise ConfigError(
                f"temperature must be a positive finite number; got {scale!r}",
                field="model.options.temperature",
            )
        self.scale = float(scale)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale

    def extra_repr(self) -> str:
        return f"scale={self.scale}"


# --------------------------------------------------------------------------------------------
# Packed versions. Both act per example on the feature dimension, so they work on the packed
# [K, B, features] layout with the same code as the modules on [B, features].


class PGroupSort(PackedLayer):
    def __init__(self, m: GroupSort) -> None:
        pass

    def forward(self, x: Act) -> Act:
        return Act(group_sort(x.as_kb()), "kb", x.k)


class PInputBall(PackedLayer):
    def __init__(self, m: InputBall) -> None:
        self.radius = m.radius

    def forward(self, x: Act) -> Act:
        return Act(project_to_ball(x.as_kb(), self.radius, batch_dims=2), "kb", x.k)


class PChannelGroupSort(PackedLayer):
    def __init__(self, m: ChannelGroupSort) -> None:
        pass

    def forward(self, x: Act) -> Act:
        # In "bk" ([B, K*C, H, W]) pairs never straddle two trials, since C is even.
        return Act(group_sort_dim(x.t, 1 if x.layout == "bk" else 2), x.layout, x.k)


class PImageBall(PInputBall):
    def forward(self, x: Act) -> Act:
        t = x.as_kb()
        return Act(project_to_ball(t, self.radius, batch_dims=2).view(t.shape), "kb", x.k)


register_packed_layer(GroupSort)(PGroupSort)
register_packed_layer(ChannelGroupSort)(PChannelGroupSort)
register_packed_layer(InputBall)(PInputBall)
register_packed_layer(ImageBall)(PImageBall)
register_packed_layer(LogitScale)(PElementwise)
