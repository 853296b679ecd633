"""``lip_mlp``: a 1-Lipschitz MLP for clipless DP-SGD (002; :mod:`workers.lipschitz`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dpsweep.errors import ConfigError
from workers.lipschitz.layers import GroupSort, InputBall, LogitScale
from workers.models.blocks import flat_dim
from workers.models.descriptors import LIP_MLP
from workers.models.registry import register_model


@register_model(LIP_MLP)
def _lip_mlp(
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: Sequence[int] | int = (128, 128),
    input_bound: float | None = None,
    temperature: float = 1.0,
) -> nn.Sequential:
    """Flatten, InputBall(X), [Linear, GroupSort] per hidden width, Linear[, LogitScale(tau)].

    ``input_bound`` X defaults to ``sqrt(features)``: the largest norm of an image whose pixels
    are normalised to [0, 1] (so such data is never shrunk) and the typical norm of
    standardised tabular features. It depends only on the input *shape*, never on the data.
    Smaller X (or a larger ``temperature``) trades logit range against noise: S grows with X.
    Weights start orthogonal (every singular value 1: gradient norm preserving), biases zero.
    """
    sizes = [hidden] if isinstance(hidden, int | float) else list(hidden)
    if not all(isinstance(h, int | float) and h == int(h) and h >= 2 and h % 2 == 0 for h in sizes):
        raise ConfigError(
            "lip_mlp hidden sizes must be positive even integers (GroupSort pairs units); "
            f"got {hidden!r}",
            field="model.options.hidden",
        )
    sizes = [int(h) for h in sizes]
    d = flat_dim(input_shape)
    x_bound = math.sqrt(d) if input_bound is None else _positive(input_bound, "input_bound")
    tau = _positive(temperature, "temperature")
    layers: list[nn.Module] = [nn.Flatten(), InputBall(x_bound)]
    for h in sizes:
        layers += [_orthogonal_linear(d, h), GroupSort()]
        d = h
    layers.append(_orthogonal_linear(d, num_classes))
    if tau != 1.0:
        layers.append(LogitScale(tau))
    return nn.Sequential(*layers)


def _positive(v: Any, name: str) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        f = math.nan
    if not (f > 0 and math.isfinite(f)):
        raise ConfigError(
            f"lip_mlp {name} must be a positive finite number; got {v!r}",
            field=f"model.options.{name}",
        )
    return f


def _orthogonal_linear(d_in: int, d_out: int) -> nn.Linear:
    lin = nn.Linear(d_in, d_out)
    with torch.no_grad():
        nn.init.orthogonal_(lin.weight)
        lin.bias.zero_()
    return lin
