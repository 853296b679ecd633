"""``bow_fc``: the bag-of-words fully connected network of 004 (Table 7): 128-128, LeakyReLU."""

from __future__ import annotations

from torch import nn

from workers.models.blocks import flat_dim
from workers.models.descriptors import BOW_FC
from workers.models.registry import register_model


@register_model(BOW_FC)
def _bow_fc(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    # Table 7 also ends in LeakyReLU; the output layer is left linear as for 'cnn'.
    d = flat_dim(input_shape)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(d, 128),
        nn.LeakyReLU(),
        nn.Linear(128, 128),
        nn.LeakyReLU(),
        nn.Linear(128, num_classes),
    )
