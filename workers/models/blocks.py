"""Pieces the built-in architectures share: the flattened input size, activations by name."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

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
