"""What a worker builds: a registered model's name and options, the weights it starts from and
what DP-SGD trains (:class:`ModelSpec`, with its LoRA adapters, :class:`LoraSpec`).

Torch-free plain data, made from a spec's model section by
:func:`workers.models.pretrained_descriptors.model_spec`; re-exported by
:mod:`workers.models.descriptors`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workers.checkpoint_store import CheckpointRef

#: What ``trainable`` names besides a tuple of parameter-name patterns (dpsweep.spec_model).
TRAINABLE_CHOICES: tuple[str, ...] = ("all", "head", "lora")


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapters a worker adds (through ``peft``): rank, alpha, the layers they adapt."""

    r: int = 8
    alpha: float = 16.0
    target_modules: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A registry name plus builder options (e.g. ``{"hidden": [128]}`` for ``mlp``).

    Args:
        name: the registered model (or ``module:function`` factory).
        options: the builder's options.
        checkpoint: where the weights start (:class:`~workers.checkpoint_store.CheckpointRef`,
            resolved and digested before anything is reserved); None: random initial weights.
        trainable: what DP-SGD trains: ``all``, ``head``, ``lora`` or a tuple of fnmatch
            patterns of parameter names; every other parameter is frozen (``requires_grad``
            false: neither clipped nor noised).
        lora: the adapters (``trainable == "lora"``).
    """

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    checkpoint: CheckpointRef | None = None
    trainable: str | tuple[str, ...] = "all"
    lora: LoraSpec | None = None

    @property
    def plain(self) -> bool:
        """Random initial weights, every parameter trained: a model as it always was."""
        return self.checkpoint is None and self.trainable == "all"
