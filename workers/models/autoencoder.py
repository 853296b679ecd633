"""``autoencoder``: the convolutional autoencoder of 004 (Table 6), MSE objective."""

from __future__ import annotations

import itertools

from torch import nn

from workers.models.descriptors import AUTOENCODER
from workers.models.registry import register_model


@register_model(AUTOENCODER)
def _autoencoder(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    # 004 Table 6: four 3x3 convolutions (8-16-32-64) and four transposed ones back to the input
    # channels, LeakyReLU, sigmoid output. Padding 1 keeps the spatial size so the stack fits
    # any image size (the paper's 28x28 also works unpadded; the parameter count is the same).
    c = input_shape[0]
    chans = [c, 8, 16, 32, 64]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(chans):
        layers += [nn.Conv2d(a, b, 3, stride=1, padding=1), nn.LeakyReLU()]
    rev = chans[::-1]
    for i, (a, b) in enumerate(itertools.pairwise(rev)):
        layers.append(nn.ConvTranspose2d(a, b, 3, stride=1, padding=1))
        layers.append(nn.Sigmoid() if i == len(rev) - 2 else nn.LeakyReLU())
    return nn.Sequential(*layers)
