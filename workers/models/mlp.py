"""``mlp``: a fully connected network (default one hidden layer of 128, ReLU)."""

from __future__ import annotations

from torch import nn

from dpsweep.errors import ConfigError
from workers.models.blocks import activation as make_activation
from workers.models.blocks import flat_dim
from workers.models.descriptors import MLP
from workers.models.registry import register_model


@register_model(MLP)
def _mlp(
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: list[int] | int = 128,
    activation: str = "relu",
) -> nn.Sequential:
    sizes = [hidden] if isinstance(hidden, int) else list(hidden)
    if any(int(h) < 1 for h in sizes):
        raise ConfigError(
            "mlp hidden sizes must be positive integers", field="model.options.hidden"
        )
    layers: list[nn.Module] = [nn.Flatten()]
    d = flat_dim(input_shape)
    for h in sizes:
        layers += [nn.Linear(d, int(h)), make_activation(activation)]
        d = int(h)
    layers.append(nn.Linear(d, num_classes))
    return nn.Sequential(*layers)
