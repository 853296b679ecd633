"""The built-in strategies' default grids, and the grid proposed for an arm that gives none.

An arm that names a built-in strategy and gives neither a grid nor an ``lr`` sweeps its
strategy's default grid (:class:`dpsweep.spec.SweepSpec` fills it in), with a large model's
learning rates scaled down (:mod:`dpsweep.model_sizes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpsweep.model_sizes import LARGE_MODEL_LR_SCALE, model_size_class

#: The default learning rates of a small model (DP-SGD steps along the mean of clipped
#: gradients, so a step is at most lr * C: these bracket what trains digits and tabular data).
DEFAULT_LRS = (0.1, 0.5, 2.0)
_CLIPS = (0.5, 2.0)
#: The default grid of each built-in strategy, for a small model: what an arm that names the
#: strategy and gives neither a grid nor an lr sweeps. The strategies' torch-free descriptors
#: (``workers.strategies.descriptors``) declare these same tables as their ``default_grid``;
#: they live in the light dpsweep package because the spec, torch-free and without the server,
#: fills them in.
DEFAULT_GRIDS: dict[str, dict[str, tuple[Any, ...]]] = {
    "fixed": {"lr": DEFAULT_LRS, "clip": _CLIPS},
    "automatic": {"lr": DEFAULT_LRS, "clip": _CLIPS},
    "global": {"lr": DEFAULT_LRS, "clip": _CLIPS},
    "bam": {"lr": DEFAULT_LRS, "clip": _CLIPS},
    "quantile": {"lr": DEFAULT_LRS, "target_quantile": (0.5, 0.9)},
    # The clip and the learning rate adapt online: only the starting lr is swept.
    "online": {"lr": DEFAULT_LRS},
    "lipschitz": {"lr": DEFAULT_LRS},
    "nonprivate": {"lr": (0.01, 0.1, 0.5)},
}


def propose_grid(
    default_grid: Mapping[str, tuple[Any, ...]], model: str, params: Mapping[str, Any]
) -> dict[str, list[Any]]:
    """A strategy's default grid for ``model``: its axes the arm's ``params`` leave out.

    Args:
        default_grid: the strategy's axes for a small model (:data:`DEFAULT_GRIDS`).
        model: the registered model name; a large one's learning rates are scaled down.
        params: the arm's fixed params (an axis they set is not proposed).
    """
    scale = LARGE_MODEL_LR_SCALE if model_size_class(model) == "large" else 1.0
    out: dict[str, list[Any]] = {}
    for name, values in default_grid.items():
        if name in params:
            continue
        out[name] = [float(f"{v * scale:.6g}") for v in values] if name == "lr" else list(values)
    return out


__all__ = ["DEFAULT_GRIDS", "DEFAULT_LRS", "propose_grid"]
