"""A trained model's weights as safetensors bytes, and a module rebuilt from them.

The worker serialises the best checkpoint of each kept trial (:func:`weights_bytes`); whoever
downloads it rebuilds the architecture from the registry with the card's ``model`` section and
loads the weights (:func:`build_trained`). safetensors holds tensors only, so loading runs no
code from the file (unlike a pickled ``torch.save``).
"""

from __future__ import annotations

from typing import Any

from safetensors.torch import load, save
from torch import nn

from dpsweep.errors import ConfigError
from workers.models.descriptors import ModelSpec
from workers.models.registry import build_model


def weights_bytes(module: nn.Module) -> bytes:
    """``module``'s state dict (parameters and buffers) as safetensors bytes."""
    tensors = {
        name: t.detach().to("cpu").contiguous().clone() for name, t in module.state_dict().items()
    }
    data = bytes(save(tensors, metadata=_METADATA))
    # safetensors writes the metadata from a hash map, in an order that changes from process
    # to process; the same weights must give the same bytes (and so the same SHA-256 in the
    # store), so the metadata object is rewritten in one order. It has the same length.
    size = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + size]
    for variant in _METADATA_VARIANTS:
        if variant in header:
            return data[:8] + header.replace(variant, _METADATA_TEXT, 1) + data[8 + size :]
    return data


_METADATA = {"format": "pt", "producer": "dpsweep"}
_METADATA_TEXT = b'"__metadata__":{"format":"pt","producer":"dpsweep"}'
_METADATA_VARIANTS = (_METADATA_TEXT, b'"__metadata__":{"producer":"dpsweep","format":"pt"}')


def load_weights(module: nn.Module, data: bytes) -> nn.Module:
    """Load safetensors ``data`` into ``module`` (every tensor must match; strict).

    Raises:
        ConfigError: the weights do not fit the module's architecture.
    """
    tensors = load(data)
    try:
        module.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        raise ConfigError(
            f"the weights do not fit the model built from the card: {exc}", field="model"
        ) from exc
    return module


def model_info(
    module: nn.Module,
    *,
    name: str,
    options: dict[str, Any],
    input_shape: tuple[int, ...],
    num_classes: int,
    engine_path: str,
) -> dict[str, Any]:
    """What rebuilds ``module``'s architecture: the registered name and the options it was
    built with, the input shape and number of outputs, with its parameter count."""
    return {
        "name": name,
        "options": dict(options),
        "input_shape": [int(d) for d in input_shape],
        "num_classes": int(num_classes),
        "parameters": int(sum(p.numel() for p in module.parameters())),
        "engine_path": engine_path,
        "dtype": "float32",
    }


def build_trained(info: dict[str, Any], data: bytes) -> nn.Module:
    """The model a card's ``model`` section describes, with ``data``'s weights, in eval mode.

    Raises:
        ConfigError: the architecture is not registered here (a plug-in model needs its
            package installed) or the weights do not fit it.
    """
    # An unknown name is the registry's ConfigError (a plug-in model needs its package).
    module = build_model(
        ModelSpec(str(info["name"]), dict(info.get("options") or {})),
        input_shape=tuple(int(d) for d in info["input_shape"]),
        num_classes=int(info["num_classes"]),
        seed=0,
    )
    load_weights(module, data)
    return module.eval()


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s state dict as float32 tensors (the bulk of its safetensors file)."""
    return int(sum(t.numel() * 4 for t in module.state_dict().values()))


__all__ = ["build_trained", "load_weights", "model_info", "parameter_bytes", "weights_bytes"]
