"""Models that start from a local checkpoint (the torch side of
:mod:`workers.models.pretrained_descriptors`).

Every builder here re-computes the checkpoint's digest and compares it with the one resolved
before anything was reserved (:func:`workers.checkpoint_store.verify_checkpoint`): a checkpoint
whose files changed since is refused, and nothing is loaded. Weights are read as safetensors, or
(timm, torchvision) with ``torch.load(weights_only=True)``; transformers loads with
``local_files_only=True`` and ``trust_remote_code=False``, so a checkpoint is never code and
nothing comes from the network.

A transformers model is wrapped so that it takes what the trainer feeds every model:

* token ids ``[T]`` as :mod:`workers.datasets.text` writes them (0 pads, 1 is unknown, a
  tokenizer's id ``i`` is ``i + 2``): the wrapper maps them back to the tokenizer's ids and
  masks the padding (tokenize the data with the checkpoint's own tokenizer:
  ``dataset.options.tokenizer`` naming the checkpoint directory);
* images ``[C, H, W]`` in [0, 1]: the wrapper resizes and normalises them as the checkpoint's
  ``preprocessor_config.json`` says (size, ``image_mean``, ``image_std``); one channel is
  repeated where the model takes three.

The classification head is resized to the dataset's classes; a new head's weights come from
the trial's public init seed (the caller seeds torch's generator, :func:`build_model`).
Dropout is switched off (the generic DP path refuses random layers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dpsweep.errors import ConfigError
from workers.checkpoint_store import CheckpointRef, verify_checkpoint
from workers.models.pretrained_descriptors import HF, TIMM, TORCHVISION
from workers.models.registry import register_model
from workers.models.trainable import head_module
from workers.models.weights import load_with_new_head

_FIELD = "model.checkpoint"
#: The attributes of a transformers model that hold its classification head, in order.
HF_HEADS = ("classifier", "score", "classification_head", "head")


def _transformers() -> Any:
    try:
        # optional extra (finetune): only a model from a transformers checkpoint needs it
        import transformers
    except ImportError:
        raise ConfigError(
            "model 'hf' needs the transformers package: pip install 'dpsweep[finetune]'",
            field="model.name",
        ) from None
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _no_dropout(config: Any) -> None:
    """Every dropout probability of a transformers config set to 0 (see the module doc)."""
    for key, value in list(config.to_dict().items()):
        if "dropout" in key and isinstance(value, float):
            setattr(config, key, 0.0)


def _zero_dropout_modules(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0


class _Wrapper(nn.Module):
    """A transformers model behind dpsweep's inputs; LoRA adapts the transformers model (its
    config names the layers peft targets by default)."""

    model: nn.Module

    @property
    def lora_base(self) -> nn.Module:
        # A property, not an attribute: a second registration of the model as a submodule
        # would give every parameter two names (twice in the state dict, and torch.func's
        # functional_call would swap them back wrongly).
        return self.model


class HFTextClassifier(_Wrapper):
    """A transformers sequence classifier on dpsweep's token ids (see the module doc)."""

    def __init__(self, model: nn.Module, *, pad_id: int, unk_id: int) -> None:
        super().__init__()
        self.model = model
        self.pad_id = int(pad_id)
        self.unk_id = int(unk_id)
        self.dpsweep_head = f"model.{_hf_head_name(model)}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x.long()
        mask = ids != 0
        hf = torch.where(ids >= 2, ids - 2, torch.full_like(ids, self.unk_id))
        hf = torch.where(mask, hf, torch.full_like(ids, self.pad_id))
        # The 4-D additive mask, prepared here: transformers then uses it as it is, instead of
        # inspecting the padding (data-dependent control flow, which per-example gradients by
        # torch.func's vmap cannot trace).
        blocked = (~mask)[:, None, None, :].to(torch.float32)
        additive = blocked * torch.finfo(torch.float32).min
        out = self.model(input_ids=hf, attention_mask=additive)
        return out.logits


class HFImageClassifier(_Wrapper):
    """A transformers image classifier on images in [0, 1], resized and normalised as its
    processor says."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self,
        model: nn.Module,
        *,
        size: tuple[int, int] | None,
        mean: list[float] | None,
        std: list[float] | None,
        channels: int,
    ) -> None:
        super().__init__()
        self.model = model
        self.size = size
        self.channels = channels
        # Buffers, not parameters: public constants of the checkpoint, never trained.
        self.register_buffer("mean", torch.tensor(mean or [0.0] * channels).view(-1, 1, 1))
        self.register_buffer("std", torch.tensor(std or [1.0] * channels).view(-1, 1, 1))
        self.dpsweep_head = f"model.{_hf_head_name(model)}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1 and self.channels == 3:
            x = x.expand(-1, 3, -1, -1)
        if self.size is not None and tuple(x.shape[-2:]) != self.size:
            x = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False)
        x = (x - self.mean) / self.std
        return self.model(pixel_values=x).logits


def _hf_head_name(model: nn.Module) -> str:
    for name in HF_HEADS:
        if isinstance(getattr(model, name, None), nn.Module):
            return name
    raise ConfigError(
        f"{type(model).__name__} has no classification head named {list(HF_HEADS)}",
        field=_FIELD,
    )


def _hf_kwargs() -> dict[str, Any]:
    # Never the network, never code from the checkpoint, weights as safetensors only.
    return {"local_files_only": True, "trust_remote_code": False}


def _head_kind(option: str, input_shape: tuple[int, ...]) -> str:
    if option != "auto":
        return option
    if len(input_shape) == 1:
        return "sequence"
    if len(input_shape) == 3:
        return "image"
    raise ConfigError(
        f"model 'hf' takes token ids [T] or images [C, H, W]; these examples have shape "
        f"{list(input_shape)}",
        field="model.name",
    )


def build_hf(
    ref: CheckpointRef, options: dict[str, Any], input_shape: tuple[int, ...], num_classes: int
) -> nn.Module:
    """A transformers classifier from a checkpoint directory, its head sized to the classes."""
    tf = _transformers()
    path = Path(ref.path)
    if not path.is_dir() or not any(path.glob("*.safetensors")):
        raise ConfigError(
            f"checkpoint {ref.name or ref.path}: a transformers checkpoint is a directory with "
            "config.json and safetensors weights (save_pretrained writes them)",
            field=_FIELD,
        )
    try:
        config = tf.AutoConfig.from_pretrained(str(path), **_hf_kwargs())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"checkpoint {ref.name or ref.path}: {exc}", field=_FIELD) from None
    _no_dropout(config)
    config.num_labels = int(num_classes)
    kind = _head_kind(str(options.get("head") or "auto"), input_shape)
    auto = (
        tf.AutoModelForSequenceClassification
        if kind == "sequence"
        else tf.AutoModelForImageClassification
    )
    try:
        model = auto.from_pretrained(
            str(path), config=config, ignore_mismatched_sizes=True, use_safetensors=True,
            attn_implementation="eager",
            **_hf_kwargs(),
        )  # fmt: skip
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"checkpoint {ref.name or ref.path} has no {kind} classification model: {exc}",
            field=_FIELD,
        ) from None
    _zero_dropout_modules(model)
    model.train()
    if kind == "sequence":
        return _text_wrapper(tf, path, model, config, input_shape)
    return _image_wrapper(path, model, config, input_shape)


def _text_wrapper(
    tf: Any, path: Path, model: nn.Module, config: Any, input_shape: tuple[int, ...]
) -> nn.Module:
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and input_shape[0] > int(limit):
        raise ConfigError(
            f"the checkpoint takes sequences of at most {limit} tokens; the data's are "
            f"{input_shape[0]}: lower dataset.options.max_length",
            field="dataset.options.max_length",
        )
    pad = getattr(config, "pad_token_id", None)
    unk = None
    try:
        tok = tf.AutoTokenizer.from_pretrained(str(path), **_hf_kwargs())
        pad = tok.pad_token_id if tok.pad_token_id is not None else pad
        unk = tok.unk_token_id
    except (OSError, ValueError):
        pass  # no tokenizer in the checkpoint: padding from the config
    pad = int(pad) if pad is not None else 0
    return HFTextClassifier(model, pad_id=pad, unk_id=int(unk) if unk is not None else pad)


def _image_wrapper(
    path: Path, model: nn.Module, config: Any, input_shape: tuple[int, ...]
) -> nn.Module:
    processor: dict[str, Any] = {}
    file = path / "preprocessor_config.json"
    if file.is_file():
        try:
            processor = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise ConfigError(
                f"checkpoint {path}: preprocessor_config.json is not JSON", field=_FIELD
            ) from None
    size = _processor_size(processor) or _config_size(config)
    if processor.get("do_resize") is False:
        size = None
    normalise = processor.get("do_normalize", True)
    channels = int(getattr(config, "num_channels", input_shape[0]))
    if input_shape[0] not in (channels, 1):
        raise ConfigError(
            f"the checkpoint takes {channels}-channel images; the data's have {input_shape[0]}",
            field="model.name",
        )
    return HFImageClassifier(
        model,
        size=size,
        mean=processor.get("image_mean") if normalise else None,
        std=processor.get("image_std") if normalise else None,
        channels=channels,
    )


def _processor_size(processor: dict[str, Any]) -> tuple[int, int] | None:
    size = processor.get("size")
    if isinstance(size, int):
        return (size, size)
    if isinstance(size, dict):
        if "height" in size and "width" in size:
            return (int(size["height"]), int(size["width"]))
        if "shortest_edge" in size:
            edge = int(size["shortest_edge"])
            return (edge, edge)
    return None


def _config_size(config: Any) -> tuple[int, int] | None:
    size = getattr(config, "image_size", None)
    if isinstance(size, int):
        return (size, size)
    if isinstance(size, list | tuple) and len(size) == 2:
        return (int(size[0]), int(size[1]))
    return None


def build_timm(ref: CheckpointRef | None, options: dict[str, Any], num_classes: int) -> nn.Module:
    """A timm architecture (``options.arch`` or the checkpoint's config.json), its weights."""
    try:
        import timm  # optional extra (vision)
    except ImportError:
        raise ConfigError(
            "model 'timm' needs the timm package: pip install 'dpsweep[vision]'", field="model.name"
        ) from None
    arch = options.get("arch")
    if arch is None and ref is not None and (Path(ref.path) / "config.json").is_file():
        arch = json.loads((Path(ref.path) / "config.json").read_text()).get("architecture")
    if not arch:
        raise ConfigError("model 'timm' needs options.arch", field="model.options.arch")
    module = timm.create_model(str(arch), pretrained=False, num_classes=int(num_classes))
    if ref is None:
        return module
    name, _ = _classifier_name(module)
    return load_with_new_head(module, ref, name)


def _classifier_name(module: nn.Module) -> tuple[str, nn.Module]:
    return head_module(module)  # the one head rule (trainable: head)


def build_torchvision(
    ref: CheckpointRef | None, options: dict[str, Any], num_classes: int
) -> nn.Module:
    """A torchvision architecture (``options.arch``), its weights from the checkpoint."""
    try:
        import torchvision  # optional extra (vision)
    except ImportError:
        raise ConfigError(
            "model 'torchvision' needs the torchvision package: pip install 'dpsweep[vision]'",
            field="model.name",
        ) from None
    arch = str(options.get("arch") or "vit_b_16")
    module = torchvision.models.get_model(arch, weights=None, num_classes=int(num_classes))
    if ref is None:
        return module
    name, _ = _classifier_name(module)
    return load_with_new_head(module, ref, name)


def build_from_checkpoint(
    name: str,
    ref: CheckpointRef | None,
    options: dict[str, Any],
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
) -> nn.Module:
    """The module of a checkpoint model (``hf``, ``timm``, ``torchvision``), its digest checked
    first (fail closed: a changed checkpoint is refused before anything is loaded)."""
    if ref is not None:
        verify_checkpoint(ref)
    if name == "hf":
        if ref is None:
            raise ConfigError("model 'hf' needs model.checkpoint", field=_FIELD)
        return build_hf(ref, options, input_shape, num_classes)
    if name == "timm":
        return build_timm(ref, options, num_classes)
    return build_torchvision(ref, options, num_classes)


__all__ = [
    "HFImageClassifier",
    "HFTextClassifier",
    "build_from_checkpoint",
    "build_hf",
]


def _register() -> None:
    """The builders of ``hf``, ``timm`` and ``torchvision``: they take the checkpoint too."""
    for descriptor in (HF, TIMM, TORCHVISION):

        def builder(
            input_shape: tuple[int, ...],
            num_classes: int,
            *,
            checkpoint: CheckpointRef | None = None,
            _name: str = descriptor.name,
            **options: Any,
        ) -> nn.Module:
            return build_from_checkpoint(
                _name, checkpoint, options, input_shape=input_shape, num_classes=num_classes
            )

        register_model(descriptor)(builder)


_register()
