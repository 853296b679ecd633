"""How many parameters DP-SGD trains of a model, and of how many: for the plan and the card.

The model is built as a trial builds it (:func:`workers.models.registry.build_model`: its
checkpoint loaded, ``trainable`` applied, LoRA's adapters added), first on the meta device
(shapes only: no memory, no weights read), on the CPU where the builder cannot build there. A
trained parameter is one with ``requires_grad``: the engine clips and noises those only, so the
noise a trial adds is spread over this many coordinates.
"""

from __future__ import annotations

from typing import Any

from dpsweep.errors import ConfigError
from workers.models.descriptors import ModelSpec


def count_parameters(module: Any) -> tuple[int, int]:
    """``(trained, total)`` numbers of a built module's parameters (``requires_grad`` ones
    trained; a parameter shared by two modules counted once)."""
    trained = total = 0
    for p in module.parameters():  # parameters() yields a shared parameter once
        n = int(p.numel())
        total += n
        if p.requires_grad:
            trained += n
    return trained, total


def parameter_counts(
    model: ModelSpec,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    vocab_size: int | None = None,
) -> tuple[int, int]:
    """``(trained, total)`` parameters of ``model`` as a trial of this data builds it.

    Raises:
        ConfigError: the model cannot be built (as the model check would refuse it).
    """
    # deferred: torch is heavy, and only planning and cards count parameters
    import torch

    from workers.models.registry import build_model  # deferred: imports torch
    from workers.training.prepare import with_data_vocab  # deferred: imports torch

    spec = with_data_vocab(model, vocab_size)

    def build() -> Any:
        return build_model(
            spec, input_shape=tuple(input_shape), num_classes=int(num_classes), seed=0
        )

    try:
        with torch.device("meta"):
            return count_parameters(build())
    except ConfigError:
        raise
    except Exception:  # a builder that needs real tensors (loading a checkpoint): the CPU
        pass
    try:
        return count_parameters(build())
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"model {model.name!r} could not be built to count its parameters: "
            f"{type(exc).__name__}: {exc}",
            field="model.name",
        ) from None


__all__ = ["count_parameters", "parameter_counts"]
