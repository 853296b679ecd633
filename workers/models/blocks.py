"""Pieces the built-in architectures share: the flattened input size, activations by name, and
weight-standardised convolutions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from dpsweep.errors import ConfigError


def flat_dim(input_shape: tuple[int, ...]) -> int:
    """The number of features of one example once flattened."""
    n = 1
    for s in input_shape:
        n *= s
    return n


#: Activation modules by option name (the names are :data:`descriptors.ACTIVATION_NAMES`).
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "leaky_relu": nn.LeakyReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
}


def activation(name: str) -> nn.Module:
    """A fresh activation module; raises :class:`ConfigError` naming the option if unknown."""
    if name not in ACTIVATIONS:
        raise ConfigError(
            f"unknown activation {name!r}; choose one of: {', '.join(sorted(ACTIVATIONS))}",
            field="model.options.activation",
        )
    return ACTIVATIONS[name]()


#: The epsilon of weight standardisation (added to each output channel's weight variance).
WS_EPS = 1e-5


def standardize_weight(w: Tensor, eps: float = WS_EPS, lead: int = 1) -> Tensor:
    """``(w - mean) / sqrt(var + eps)`` over every dimension after the first ``lead`` ones.

    A convolution's weight ``[out, in, kh, kw]`` (``lead=1``) is standardised per output channel
    over its fan-in (Qiao et al. 2019). The packed engine standardises ``[K, out, ...]`` (one row
    of weights per trial) and ``[B, out, n]`` (one perturbed weight per example) with ``lead=2``.
    The variance is the biased one (divided by the fan-in), as in the paper.
    """
    flat = w.reshape(*w.shape[:lead], -1)
    var, mean = torch.var_mean(flat, dim=-1, keepdim=True, correction=0)
    return ((flat - mean) * torch.rsqrt(var + eps)).reshape(w.shape)


class WSConv2d(nn.Conv2d):
    """A 2-D convolution whose weight is standardised per output channel before every use.

    Its parameters are those of ``nn.Conv2d``; the standardisation is a function of the weight
    alone (no example enters it), so every example's gradient stays its own. A type of its own:
    the engines' exact-type rules never mistake it for a plain convolution (the packed engine
    has its own layer for it, :mod:`workers.packed.ws_conv`; the generic engine gives it the
    exact ``torch.func`` per-example gradients).
    """

    def __init__(self, *args: Any, eps: float = WS_EPS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.eps = float(eps)

    def forward(self, x: Tensor) -> Tensor:
        # nn.Conv2d's own call (padding modes included), on the standardised weight.
        return self._conv_forward(x, standardize_weight(self.weight, self.eps), self.bias)


def conv2d_class(weight_standardization: bool) -> type[nn.Conv2d]:
    """The convolution a built-in image model builds: :class:`WSConv2d` or ``nn.Conv2d``."""
    return WSConv2d if weight_standardization else nn.Conv2d
