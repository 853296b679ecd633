"""A generous memory estimate for one trial on the generic path (for the packer's budget).

The generic path materialises every example's full gradient (``[B, P]`` per trial and gradient
pass, P the trained parameters) and, inside ``vmap(grad)``, every layer's activations and their
gradients per example.
:func:`generic_trial_floats` counts both, measuring the activations with forward hooks on one
example of zeros (public: no data is read).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def activation_floats(module: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Floats of every submodule's output for one example (input of zeros; ids if it needs)."""
    total = 0

    def hook(_m: nn.Module, _inp: object, out: object) -> None:
        nonlocal total
        outs = out if isinstance(out, tuple | list) else (out,)
        total += sum(t.numel() for t in outs if isinstance(t, Tensor))

    handles = [m.register_forward_hook(hook) for m in module.modules()]
    try:
        with torch.no_grad():
            for dtype in (torch.float32, torch.long):  # features, or token ids (embeddings)
                total = 0
                try:
                    module(torch.zeros(1, *input_shape, dtype=dtype))
                    break
                except (RuntimeError, TypeError):
                    continue
    finally:
        for h in handles:
            h.remove()
    return total


def generic_trial_floats(
    module: nn.Module,
    *,
    input_shape: tuple[int, ...],
    batch: int,
    passes: int,
    param_buffers: int,
) -> int:
    """Floats one trial of ``module`` needs on the generic path, for batches up to ``batch``.

    Args:
        module: one trial's module (its architecture is what counts).
        input_shape: one example's shape.
        batch: the largest batch to plan for.
        passes: gradient passes per step (2 for BAM's perturbed pass).
        param_buffers: parameter-sized buffers (parameters, gradient, noise, optimizer, ...).
    """
    # Only trained parameters have gradients, optimizer state and per-example gradients; a
    # frozen one is held once (counted per trial here: generous when the pack shares it).
    numel = sum(p.numel() for p in module.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in module.parameters() if not p.requires_grad)
    acts = activation_floats(module, input_shape)
    return frozen + param_buffers * numel + passes * batch * (2 * numel + 3 * acts)
