"""Which registered models are large: their default grids get smaller learning rates.

A name list, torch-free: the spec (:mod:`dpsweep.default_grids`) reads it without the model
registry. Every other model, plug-ins' included, is small.
"""

from __future__ import annotations

#: Registered models whose default grids get smaller learning rates: deep networks with many
#: layers (the noise grows with the parameter count; a large step diverges there). Every other
#: model, plug-ins' included, is treated as small (an MLP, a small CNN, a linear model).
LARGE_MODELS = frozenset({"wrn16_4", "res_cnn", "text_classifier"})
#: How much smaller a large model's default learning rates are.
LARGE_MODEL_LR_SCALE = 0.2


def model_size_class(model: str) -> str:
    """``large`` for the deep registered models (:data:`LARGE_MODELS`), else ``small``."""
    return "large" if model in LARGE_MODELS else "small"


__all__ = ["LARGE_MODELS", "LARGE_MODEL_LR_SCALE", "model_size_class"]
