"""``res_cnn``: a small residual CNN for 28x28 images (GroupNorm, no BatchNorm).

A 3x3 stem, then ``blocks`` residual blocks; the first block of the second half halves the
resolution and doubles the channels (28 -> 14 at the default 3 blocks: widths w, w, 2w),
GroupNorm of 8 groups throughout, global average pooling and a linear head. About 150k
parameters at the defaults, small enough for DP-SGD on MNIST-sized data.
"""

from __future__ import annotations

from torch import Tensor, nn

from workers.models.blocks import conv2d_class
from workers.models.descriptors import RES_CNN
from workers.models.registry import register_model

#: Groups of every GroupNorm (the widths are multiples of 8).
NORM_GROUPS = 8


class ResBlock(nn.Module):
    """conv3x3, GroupNorm, ReLU, conv3x3, GroupNorm, plus the shortcut, then ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int, conv: type[nn.Conv2d]) -> None:
        super().__init__()
        self.conv1 = conv(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(NORM_GROUPS, c_out)
        self.conv2 = conv(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(NORM_GROUPS, c_out)
        self.act = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                conv(c_in, c_out, 1, stride=stride, bias=False),
                nn.GroupNorm(NORM_GROUPS, c_out),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.act(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.act(out + self.shortcut(x))


class ResCNN(nn.Module):
    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width: int,
        blocks: int,
        conv: type[nn.Conv2d] = nn.Conv2d,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            conv(in_channels, width, 3, padding=1, bias=False),
            nn.GroupNorm(NORM_GROUPS, width),
            nn.ReLU(),
        )
        layers: list[nn.Module] = []
        c = width
        for i in range(blocks):
            down = blocks > 1 and i == blocks // 2
            c_out = 2 * c if down else c
            layers.append(ResBlock(c, c_out, 2 if down else 1, conv))
            c = c_out
        self.blocks = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(c, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.pool(self.blocks(self.stem(x))).flatten(1))


@register_model(RES_CNN)
def _res_cnn(
    input_shape: tuple[int, ...],
    num_classes: int,
    width: int = 32,
    blocks: int = 3,
    weight_standardization: bool = False,
) -> nn.Module:
    conv = conv2d_class(bool(weight_standardization))
    return ResCNN(input_shape[0], num_classes, int(width), int(blocks), conv)
