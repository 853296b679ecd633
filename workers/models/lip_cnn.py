"""``lip_cnn``: a 1-Lipschitz CNN for clipless DP-SGD (002; :mod:`workers.lipschitz`).

``ImageBall(X)``, then per stage (``channels``) a bias-free kxk convolution (``kernel``, odd,
"same" padding) and a
bias-free 2x2 stride-2 convolution (halving the resolution), each followed by
:class:`ChannelGroupSort`; then ``Flatten`` and a linear head (``LogitScale(tau)`` if tau != 1).
A plain ``nn.Sequential``, so the packed engine trains it and the ``lipschitz`` strategy
certifies its per-sample gradient bound (:mod:`workers.lipschitz.bound`, "Convolutions"): a kxk
stride-1 kernel's im2col map has norm at most A = k, a 2x2 stride-2 one's A = 1, and the
projection keeps each kernel matrix within ``1 / A`` so every layer is 1-Lipschitz.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from dpsweep.errors import ConfigError, DatasetError
from workers.lipschitz.bound import conv_amplification
from workers.lipschitz.layers import ChannelGroupSort, ImageBall, LogitScale
from workers.models.blocks import flat_dim
from workers.models.descriptors import LIP_CNN
from workers.models.lip_mlp import _positive
from workers.models.registry import register_model


@register_model(LIP_CNN)
def _lip_cnn(
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: Sequence[int] | int = (64,),
    kernel: int = 3,
    input_bound: float | None = None,
    temperature: float = 1.0,
) -> nn.Sequential:
    """Weights start orthogonal (as matrices ``[out, in kh kw]``) scaled to ``1 / A``.

    One stage of 64 channels by default: every stage adds its layers' terms to the worst-case
    bound S (and so to the noise). On digits at epsilon = 8 (X = 4, tau = 8, lr 0.003-0.006)
    one stage of 64 reached 0.69-0.74 accuracy in single runs, two stages (16, 32) 0.25-0.36.

    ``input_bound`` X defaults to ``sqrt(C H W)``, the norm of an all-ones image (pixels in
    [0, 1] are never shrunk); it depends only on the input *shape*, never on the data.
    """
    sizes = [channels] if isinstance(channels, int | float) else list(channels)
    if not sizes or not all(
        isinstance(c, int | float) and c == int(c) and c >= 2 and c % 2 == 0 for c in sizes
    ):
        raise ConfigError(
            "lip_cnn channels must be one or more positive even integers (GroupSort pairs "
            f"channels); got {channels!r}",
            field="model.options.channels",
        )
    c_in, h, w = input_shape
    x_bound = (
        math.sqrt(flat_dim(input_shape))
        if input_bound is None
        else (_positive(input_bound, "input_bound"))
    )
    tau = _positive(temperature, "temperature")
    if int(kernel) % 2 == 0:
        raise ConfigError(
            f"lip_cnn kernel must be odd (padding keeps the size); got {kernel!r}",
            field="model.options.kernel",
        )
    k = int(kernel)
    layers: list[nn.Module] = [ImageBall(x_bound)]
    for c in (int(c) for c in sizes):
        if h < 2 or w < 2:
            raise DatasetError(
                f"images of size {input_shape[1]}x{input_shape[2]} are too small for "
                f"{len(sizes)} lip_cnn stages (each halves the resolution)"
            )
        layers += [_conv(c_in, c, k, 1, k // 2), ChannelGroupSort(), _conv(c, c, 2, 2, 0)]
        layers.append(ChannelGroupSort())
        c_in, h, w = c, h // 2, w // 2
    head = nn.Linear(c_in * h * w, num_classes)
    with torch.no_grad():
        nn.init.orthogonal_(head.weight)
        head.bias.zero_()
    layers += [nn.Flatten(), head]
    if tau != 1.0:
        layers.append(LogitScale(tau))
    return nn.Sequential(*layers)


def _conv(c_in: int, c_out: int, k: int, stride: int, padding: int) -> nn.Conv2d:
    conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=padding, bias=False)
    with torch.no_grad():
        matrix = conv.weight.view(c_out, -1)
        nn.init.orthogonal_(matrix)
        matrix.div_(conv_amplification((k, k), (stride, stride), (1, 1)))
    return conv
