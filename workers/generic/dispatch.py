"""The engine's choice of path per model: the fast packed path where it applies, else generic.

The packed path (:mod:`workers.packed`) covers ``nn.Sequential`` models whose every layer has a
registered packed implementation (:mod:`workers.packed.registry`); it computes per-example
gradients analytically and is much faster. Every other ``nn.Module`` takes the generic path
(:class:`~workers.generic.bookkeeping.BookkeepingModel`: book-keeping per-example norms where a
layer has a rule, materialised ``torch.func`` gradients where not), after the up-front check
of its layers.

A model with frozen parameters (``requires_grad == False``: a pretrained backbone under LoRA
adapters or a new head) takes the generic path, which keeps them out of the trained, clipped
and noised parameters (:class:`~workers.generic.model.GenericModel`); the packed path trains
every parameter of its layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeGuard

import torch
from torch import nn

from dpsweep.errors import ConfigError
from workers.generic.bookkeeping import BookkeepingModel
from workers.generic.model import GenericModel
from workers.packed.model import PackedModel
from workers.packed.registry import convert_layer

EnginePath = Literal["packed", "generic"]


def packable(module: nn.Module) -> TypeGuard[nn.Sequential]:
    """Whether the fast packed path covers ``module`` (an ``nn.Sequential`` of known layers,
    every parameter trained)."""
    if not isinstance(module, nn.Sequential):
        return False
    if any(not p.requires_grad for p in module.parameters()):
        return False  # frozen parameters: the generic path keeps them out of the noise
    try:
        for layer in module:
            convert_layer(layer)
    except ConfigError:
        return False
    return True


def build_pack_model(
    modules: Sequence[nn.Module],
    device: torch.device | str = "cpu",
    *,
    batched_trials: bool = True,
) -> tuple[PackedModel | GenericModel, EnginePath]:
    """The pack's model on the fastest path that covers it, and that path's name.

    ``batched_trials``: on the generic path, whether the K trials run as one ``vmap`` or one
    after another (the model descriptor's ``generic_packs``, measured by bench/generic_packs.py).

    A parameter with ``requires_grad == False`` in ``modules`` is frozen: not trained, clipped
    or noised, and kept as it is in every module read back (``to_module``). The model's
    ``trained_numel`` and ``total_numel`` count the trained and all parameters.

    Raises:
        ConfigError: a model the generic path refuses too (e.g. BatchNorm; the message names
            the layer and the fix), or one whose every parameter is frozen.
    """
    if not modules:
        raise ValueError("a pack needs at least one trial")
    if packable(modules[0]):
        try:
            return PackedModel(list(modules), device=device), "packed"  # type: ignore[arg-type]
        except ConfigError:
            # Parameters outside the converted layers (e.g. a bare nn.Parameter on the
            # Sequential itself): the generic path trains those too.
            pass
    # Book-keeping (ghost norms, one backward) for the layers with a rule; the others keep the
    # materialised torch.func per-example gradients (workers.generic.bookkeeping).
    return BookkeepingModel(modules, device=device, batched_trials=batched_trials), "generic"
