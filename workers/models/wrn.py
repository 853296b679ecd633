"""``wrn16_4``: Wide-ResNet-16-4 with GroupNorm, the DP-SGD image benchmark of De et al. (2022).

Pre-activation residual blocks (Zagoruyko & Komodakis 2016) with every BatchNorm replaced by
GroupNorm (16 groups), since batch statistics mix examples and so break per-sample gradients.
De et al. also standardise the convolution weights: the option ``weight_standardization``
(:class:`~workers.models.blocks.WSConv2d` for every convolution; off by default, since plain
convolutions keep the model on the generic engine's cheaper book-keeping rules).
"""

from __future__ import annotations

from torch import Tensor, nn

from dpsweep.errors import ConfigError
from workers.models.blocks import conv2d_class
from workers.models.descriptors import WRN16_4
from workers.models.registry import register_model


class WideBlock(nn.Module):
    """GroupNorm, ReLU, 3x3 conv, GroupNorm, ReLU, 3x3 conv; 1x1 conv shortcut on a change."""

    def __init__(
        self, c_in: int, c_out: int, stride: int, groups: int, conv: type[nn.Conv2d]
    ) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c_in)
        self.conv1 = conv(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(groups, c_out)
        self.conv2 = conv(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.act = nn.ReLU()
        self.shortcut: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            self.shortcut = conv(c_in, c_out, 1, stride=stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        a = self.act(self.norm1(x))
        # Pre-activation: a projected shortcut reads the normalised input, as in the WRN paper.
        skip = x if self.shortcut is None else self.shortcut(a)
        out = self.conv1(a)
        out = self.conv2(self.act(self.norm2(out)))
        return out + skip


class WideResNet(nn.Module):
    """Stem conv, three groups of ``n = (depth - 4) / 6`` blocks (16k, 32k, 64k channels)."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        depth: int,
        width: int,
        groups: int,
        conv: type[nn.Conv2d] = nn.Conv2d,
    ) -> None:
        super().__init__()
        n = (depth - 4) // 6
        widths = [16, 16 * width, 32 * width, 64 * width]
        self.stem = conv(in_channels, widths[0], 3, padding=1, bias=False)
        blocks: list[nn.Module] = []
        c = widths[0]
        for stage, c_out in enumerate(widths[1:]):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(WideBlock(c, c_out, stride, groups, conv))
                c = c_out
        self.blocks = nn.Sequential(*blocks)
        self.norm = nn.GroupNorm(groups, c)
        self.act = nn.ReLU()
        # Adaptive pooling: 32x32 inputs end at 8x8 as in the paper; smaller images still fit.
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(c, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out = self.act(self.norm(self.blocks(self.stem(x))))
        return self.head(self.pool(out).flatten(1))


@register_model(WRN16_4)
def _wrn16_4(
    input_shape: tuple[int, ...],
    num_classes: int,
    depth: int = 16,
    width: int = 4,
    norm_groups: int = 16,
    weight_standardization: bool = False,
) -> nn.Module:
    if (int(depth) - 4) % 6:
        raise ConfigError(
            f"wrn16_4 depth must be 6n + 4 (10, 16, 22, 28, 34, 40); got {depth!r}",
            field="model.options.depth",
        )
    if 16 % int(norm_groups):
        raise ConfigError(
            f"wrn16_4 norm_groups must divide 16 (1, 2, 4, 8, 16); got {norm_groups!r}",
            field="model.options.norm_groups",
        )
    conv = conv2d_class(bool(weight_standardization))
    return WideResNet(input_shape[0], num_classes, int(depth), int(width), int(norm_groups), conv)
