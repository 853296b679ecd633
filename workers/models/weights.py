"""A checkpoint's weights file read as tensors, and loaded into a built module.

safetensors, or (timm, torchvision) one ``.pt``/``.pth``/``.bin`` read with
``torch.load(weights_only=True)``: tensors only, never an object a pickle could build.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from dpsweep.errors import ConfigError
from workers.checkpoint_store import CheckpointRef

_FIELD = "model.checkpoint"


def read_weights(ref: CheckpointRef) -> dict[str, torch.Tensor]:
    """The checkpoint's one weights file as a state dict: safetensors, or a ``.pt``/``.pth``/
    ``.bin`` read with ``torch.load(weights_only=True)`` (tensors only; timm, torchvision).

    Raises:
        ConfigError: no weights file, several, or one that does not read as tensors.
    """
    root = Path(ref.path)
    if root.is_file():
        files = [root]
    else:
        files = sorted(root.glob("*.safetensors"))
        if not files and ref.kind in ("timm", "torchvision"):
            files = sorted(p for p in root.iterdir() if p.suffix in (".pt", ".pth", ".bin"))
    if len(files) != 1:
        raise ConfigError(
            f"checkpoint {ref.name or ref.path}: expected one weights file (*.safetensors), "
            f"found {[f.name for f in files]}",
            field=_FIELD,
        )
    file = files[0]
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file  # deferred: with torch

            return load_file(str(file))
        state = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as exc:  # safetensors and torch.load raise many kinds
        raise ConfigError(
            f"checkpoint {ref.name or ref.path}: {file.name} does not read as weights "
            f"({type(exc).__name__})",
            field=_FIELD,
        ) from None
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(
            f"checkpoint {ref.name or ref.path}: {file.name} is not a state dict of tensors",
            field=_FIELD,
        )
    return state


def load_strict(module: nn.Module, ref: CheckpointRef) -> nn.Module:
    """A built-in architecture's own weights, loaded strictly (every name and shape)."""
    state = read_weights(ref)
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ConfigError(
            f"checkpoint {ref.name or ref.path} does not fit this model and its options (the "
            f"same architecture, the same number of classes): {str(exc).splitlines()[0]}",
            field=_FIELD,
        ) from None
    return module


def load_with_new_head(module: nn.Module, ref: CheckpointRef, head: str) -> nn.Module:
    """Weights for everything but a head resized to the dataset's classes (timm,
    torchvision): the head keeps its fresh, seeded initialisation where its shape differs."""
    state = read_weights(ref)
    own = module.state_dict()
    fitting = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    missing = [k for k in own if k not in fitting and not k.startswith(f"{head}.")]
    if missing:
        raise ConfigError(
            f"checkpoint {ref.name or ref.path} lacks weights of this architecture (e.g. "
            f"{missing[:3]}); check options.arch",
            field=_FIELD,
        )
    module.load_state_dict(fitting, strict=False)
    return module


__all__ = ["load_strict", "load_with_new_head", "read_weights"]
