"""``cnn1d``: a small 1-D CNN for flat inputs read as one-channel signals (MNIST-1D).

Per stage a ``kernel``-wide Conv1d (padding keeps the length), GroupNorm (no BatchNorm: its
batch statistics mix records, which per-example clipping cannot bound), ReLU and a max-pool of
2; then a linear head. At the defaults (channels 32, 32; kernel 5) it has 8,682 parameters
on 40 inputs and 10 classes. Conv1d and GroupNorm are not among the packed path's layers, so
it trains on the generic path (per-example gradients from torch.func).
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from dpsweep.errors import ConfigError, DatasetError
from workers.models.descriptors import CNN1D
from workers.models.registry import register_model


def norm_groups(channels: int) -> int:
    """GroupNorm's groups for ``channels``: the largest of 8, 4, 2, 1 that divides it (so any
    width the descriptor allows gets a valid layer)."""
    return next(g for g in (8, 4, 2, 1) if channels % g == 0)


class CNN1d(nn.Module):
    """The stages over a one-channel view of the input, then the linear head.

    A module of its own rather than an ``nn.Sequential``: the packed path converts any
    Sequential layer by layer, and it has no Conv1d, GroupNorm or Unflatten; the generic path
    trains any module.
    """

    def __init__(self, stages: nn.Sequential, head: nn.Linear, length: int) -> None:
        super().__init__()
        self.stages = stages
        self.head = head
        self.length = length

    def forward(self, x: Tensor) -> Tensor:
        h = self.stages(x.reshape(x.shape[0], 1, self.length))
        return self.head(h.flatten(1))


@register_model(CNN1D)
def _cnn1d(
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: list[int] | tuple[int, ...] | int = (32, 32),
    kernel: int = 5,
    norm: str = "group",
) -> CNN1d:
    if kernel % 2 == 0:
        # An odd kernel with padding kernel // 2 keeps the length, which the head's size uses.
        raise ConfigError(
            f"kernel for model 'cnn1d' must be odd; got {kernel}", field="model.options.kernel"
        )
    widths = [channels] if isinstance(channels, int) else [int(c) for c in channels]
    length = math.prod(input_shape)
    # Each stage halves the length (floor); a signal shorter than 2 ** stages has nothing left.
    if length >> len(widths) < 1:
        raise DatasetError(
            f"inputs of {length} values are too short for 'cnn1d' with {len(widths)} stages "
            "(each halves the length); use fewer channels entries"
        )
    layers: list[nn.Module] = []
    c_in, out_len = 1, length
    for c in widths:
        layers.append(nn.Conv1d(c_in, c, kernel_size=kernel, padding=kernel // 2))
        if norm == "group":
            layers.append(nn.GroupNorm(norm_groups(c), c))
        layers += [nn.ReLU(), nn.MaxPool1d(2)]
        c_in, out_len = c, out_len // 2
    return CNN1d(nn.Sequential(*layers), nn.Linear(c_in * out_len, num_classes), length)
