"""``logreg``: multinomial logistic regression."""

from __future__ import annotations

from torch import nn

from workers.models.blocks import flat_dim
from workers.models.descriptors import LOGREG
from workers.models.registry import register_model


@register_model(LOGREG)
def _logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(flat_dim(input_shape), num_classes))
