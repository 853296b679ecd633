"""A trained model's weights as safetensors bytes, and a module rebuilt from them.

The worker serialises the best checkpoint of each kept trial (:func:`weights_bytes`); whoever
downloads it rebuilds the architecture from the registry with the card's ``model`` section and
loads the weights (:func:`build_trained`). safetensors holds tensors only, so loading runs no
code from the file (unlike a pickled ``torch.save``).

The file also carries the input transform the trainer applied, when its constants may be
released (:mod:`workers.datasets.input_transform`): :func:`build_trained` then puts it in
front of the network (:class:`RawInputModel`), so the model takes raw records, as does its
ONNX export.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from safetensors.torch import load, save
from torch import nn

from dpsweep.errors import ConfigError
from workers.checkpoint_store import checkpoint_facts, resolve_checkpoint
from workers.datasets.input_transform import PREFIX, InputTransform, transform_tensors
from workers.models.descriptors import LoraSpec, ModelSpec
from workers.models.registry import build_model
from workers.settings import WorkerSettings


def weights_bytes(module: nn.Module, transform: InputTransform | None = None) -> bytes:
    """``module``'s state dict (parameters and buffers) as safetensors bytes, with
    ``transform``'s tensors when it may be exported (none otherwise: fail closed)."""
    tensors = {
        name: t.detach().to("cpu").contiguous().clone() for name, t in module.state_dict().items()
    }
    for name, array in transform_tensors(transform).items():
        if name in tensors:
            raise ConfigError(f"the model has a tensor named {name!r}, reserved by dpsweep")
        tensors[name] = torch.from_numpy(array.copy())
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
    tensors = {k: v for k, v in load(data).items() if not k.startswith(PREFIX)}
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
    spec: ModelSpec | None = None,
) -> dict[str, Any]:
    """What rebuilds ``module``'s architecture: the registered name and the options it was
    built with, the input shape and number of outputs, with its parameter count; with
    ``spec``, the checkpoint it started from (name, kind, digest and its registration's
    declaration), what was trained and how many parameters that is."""
    info: dict[str, Any] = {
        "name": name,
        "options": dict(options),
        "input_shape": [int(d) for d in input_shape],
        "num_classes": int(num_classes),
        "parameters": int(sum(p.numel() for p in module.parameters())),
        "engine_path": engine_path,
        "dtype": "float32",
    }
    if spec is not None and not spec.plain:
        info.update(starting_point(spec))
        info["trained_parameters"] = int(
            sum(p.numel() for p in module.parameters() if p.requires_grad)
        )
    return info


def starting_point(spec: ModelSpec) -> dict[str, Any]:
    """Public facts of where a model's weights started and what was trained (a card's)."""
    return {
        "checkpoint": checkpoint_facts(spec.checkpoint) if spec.checkpoint else None,
        "trainable": spec.trainable if isinstance(spec.trainable, str) else list(spec.trainable),
        "lora": asdict(spec.lora) if spec.lora is not None else None,
    }


def _card_spec(info: dict[str, Any]) -> ModelSpec:
    """The model spec a card describes; its checkpoint resolved by name (registered) and its
    digest checked, so a kept model rebuilds only on the weights it started from."""
    name, options = str(info["name"]), dict(info.get("options") or {})
    facts = info.get("checkpoint")
    if not facts and info.get("trainable", "all") == "all":
        return ModelSpec(name, options)
    ref = None
    if facts:
        where = facts.get("name") or facts.get("path")
        if not where:
            raise ConfigError("the card names no checkpoint to rebuild the model on")
        ref = resolve_checkpoint(
            str(where), checkpoints_dir=WorkerSettings().checkpoints_dir,
            allow_paths=facts.get("name") is None, kind=facts.get("kind"),
            digest=facts.get("digest"),
        )  # fmt: skip
    trainable = info.get("trainable", "all")
    lora = info.get("lora")
    return ModelSpec(
        name, options, checkpoint=ref,
        trainable=trainable if isinstance(trainable, str) else tuple(trainable),
        lora=LoraSpec(**{**lora, "target_modules": tuple(lora["target_modules"])
                         if lora.get("target_modules") else None}) if lora else None,
    )  # fmt: skip


class RawInputModel(nn.Module):
    """A kept model with its input transform in front: it takes raw records.

    The transform runs as the trainer's did (:func:`workers.datasets.scaling._scale`): in
    float64, the same operations in the same order, then float32, so a raw record gives the
    network the very input it was evaluated on.
    """

    centre: torch.Tensor
    scale: torch.Tensor

    def __init__(self, model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("centre", tensors[PREFIX + "centre"].to(torch.float64))
        self.register_buffer("scale", tensors[PREFIX + "scale"].to(torch.float64))
        lo, hi = (float(v) for v in tensors[PREFIX + "clip"])
        self.clip = (lo, hi)
        bounds = tensors.get(PREFIX + "bounds")
        self.bounds = None if bounds is None else (float(bounds[0]), float(bounds[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.flatten(1).to(torch.float64)
        if self.bounds is not None:
            z = z.clamp(self.bounds[0], self.bounds[1])
        z = ((z - self.centre) / self.scale).clamp(self.clip[0], self.clip[1])
        return self.model(z.to(torch.float32).reshape(x.shape))


def build_trained(info: dict[str, Any], data: bytes, *, raw_inputs: bool = True) -> nn.Module:
    """The model a card's ``model`` section describes, with ``data``'s weights, in eval mode.

    Args:
        info: The card's ``model`` section.
        data: The safetensors file.
        raw_inputs: With the file's input transform in front (:class:`RawInputModel`), when
            it has one; False gives the bare network, which takes scaled inputs (the trainer's
            own checks feed it the scaled records).

    Raises:
        ConfigError: the architecture is not registered here (a plug-in model needs its
            package installed) or the weights do not fit it.
    """
    # An unknown name is the registry's ConfigError (a plug-in model needs its package).
    module = build_model(
        _card_spec(info),
        input_shape=tuple(int(d) for d in info["input_shape"]),
        num_classes=int(info["num_classes"]),
        seed=0,
    )
    load_weights(module, data)
    transform = {k: v for k, v in load(data).items() if k.startswith(PREFIX)}
    if raw_inputs and transform:
        return RawInputModel(module, transform).eval()
    return module.eval()


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s state dict as float32 tensors (the bulk of its safetensors file)."""
    return int(sum(t.numel() * 4 for t in module.state_dict().values()))


__all__ = [
    "RawInputModel",
    "build_trained",
    "load_weights",
    "model_info",
    "parameter_bytes",
    "weights_bytes",
]
