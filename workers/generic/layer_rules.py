"""Which layers book-keeping covers, and the fail-closed watch on how their parameters are used.

:func:`rule_of` gives a layer its rule (``linear``, ``conv``, ``embedding``, ``layernorm``,
``groupnorm``) by its exact type and parameters; :data:`RULE_OPS` names the one op each rule's
module applies its parameters with; :class:`UsageMode` records every op that touches a watched
parameter during a capturing forward, so :class:`~workers.generic.bookkeeping.BookkeepingModel`
keeps a layer's rule only when the layer was used exactly as the rule assumes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

_NDQ = getattr(nn.modules.linear, "NonDynamicallyQuantizableLinear", None)


def rule_of(module: nn.Module, names: list[str]) -> str | None:
    """The rule for a layer (the module owning ``names``, its parameters' local names), if any.

    Exact types only: a subclass may use its parameters differently in its own ``forward``.

    Args:
        module: The layer's module.
        names: Its parameters' names (local or dotted).

    Returns:
        ``linear``, ``conv``, ``embedding``, ``layernorm`` or ``groupnorm``; None when no rule
        covers the layer (it takes the materialised fallback).
    """
    local = [n.rpartition(".")[2] for n in names]
    t = type(module)
    if t is nn.Linear or (_NDQ is not None and t is _NDQ):
        return "linear" if local in (["weight"], ["weight", "bias"]) else None
    if t in (nn.Conv1d, nn.Conv2d):
        c: Any = module
        ok = c.padding_mode == "zeros" and not isinstance(c.padding, str)
        return "conv" if ok and local in (["weight"], ["weight", "bias"]) else None
    if t is nn.Embedding:
        e: Any = module
        ok = e.max_norm is None and not e.sparse and not e.scale_grad_by_freq
        return "embedding" if ok and local == ["weight"] else None
    if t is nn.LayerNorm:
        return "layernorm" if local in (["weight"], ["weight", "bias"]) else None
    if t is nn.GroupNorm:
        return "groupnorm" if local == ["weight", "bias"] else None
    return None


# The one op each rule's module applies its parameters with.
RULE_OPS: dict[str, Any] = {
    "linear": F.linear,
    "conv": (F.conv1d, F.conv2d),
    "embedding": F.embedding,
    "layernorm": F.layer_norm,
    "groupnorm": F.group_norm,
}


# Reads of a tensor's metadata, not of its values: no gradient flows through them, so they are
# no use of a parameter (peft's lora.Linear reads ``lora_A.weight.dtype`` from its own forward
# to cast the input; that must not send the adapter to the materialised fallback).
_METADATA_READS: frozenset[Any] = frozenset(
    [
        *(
            getattr(Tensor, a).__get__
            for a in ("dtype", "shape", "device", "ndim", "requires_grad", "layout", "is_cuda")
        ),
        Tensor.size,
        Tensor.dim,
    ]
)


class UsageMode(TorchFunctionMode):
    """Records, for every op touching a watched tensor, the op and the innermost module
    (metadata reads such as ``.dtype`` or ``.shape`` excepted: they read no value)."""

    def __init__(self, watched: dict[int, str], stack: list[nn.Module]) -> None:
        super().__init__()
        self.watched = watched
        self.stack = stack
        self.uses: list[tuple[str, Any, nn.Module | None]] = []

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if self.watched and func not in _METADATA_READS:
            for leaf in _tensors((args, kwargs)):
                name = self.watched.get(id(leaf))
                if name is not None:
                    self.uses.append((name, func, self.stack[-1] if self.stack else None))
        return func(*args, **kwargs)


def _tensors(tree: Any) -> Iterator[Tensor]:
    """Every tensor in ``tree``, an op's arguments: nested tuples, lists and dicts are walked,
    and any other container goes through pytree (slower, but nothing is missed)."""
    if isinstance(tree, Tensor):
        yield tree
    elif isinstance(tree, tuple | list):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)
    elif tree is None or isinstance(tree, int | float | bool | str | torch.dtype | torch.device):
        return
    else:
        for leaf in tree_flatten(tree)[0]:
            if isinstance(leaf, Tensor):
                yield leaf


__all__ = ["RULE_OPS", "UsageMode", "rule_of"]
