"""A model plug-in (entry-point group ``dpsweep.models``): a one-hidden-layer MLP."""

from __future__ import annotations

from typing import Any

from dpsweep_testplugins import MODEL


def register() -> None:
    """Register the descriptor and its builder (the entry point)."""
    from workers.models.descriptors import ModelDescriptor, ModelOption
    from workers.models.registry import register_model

    descriptor = ModelDescriptor(
        name=MODEL,
        input_kind="flat",
        description="a one-hidden-layer MLP (a test plug-in)",
        options={"width": ModelOption(default=8, kind="int", low=1, help="hidden width")},
    )

    @register_model(descriptor)
    def build(input_shape: tuple[int, ...], num_classes: int, width: int = 8) -> Any:
        # torch only when a model is built (listing the registry stays torch-free).
        from torch import nn

        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(input_shape[0], width),
            nn.ReLU(),
            nn.Linear(width, num_classes),
        )
