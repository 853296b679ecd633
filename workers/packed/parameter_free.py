"""Packed parameter-free layers: activations, pooling, flatten."""

from __future__ import annotations

from torch import nn

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


register_packed_layer(nn.Flatten)(PFlatten)
register_packed_layer(nn.MaxPool2d)(PPool2d)
register_packed_layer(nn.AvgPool2d)(PPool2d)
for _act in (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.GELU, nn.Identity, nn.SiLU):
    register_packed_layer(_act)(PElementwise)
