"""Models that start from a checkpoint, without torch: their descriptors, and a spec's model
section made into the worker's :class:`~workers.models.descriptors.ModelSpec`.

``hf`` (a Hugging Face ``transformers`` directory), ``timm`` and ``torchvision`` (an
architecture with weights from a local file) are described here so that submission and
planning check their options and resolve their checkpoint (:mod:`workers.checkpoint_store`)
before anything is reserved; their torch builders are in :mod:`workers.models.pretrained`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpsweep.errors import ConfigError
from dpsweep.spec_model import LORA_RANK_AXIS
from workers.checkpoint_store import resolve_checkpoint
from workers.models.descriptors import (
    LoraSpec,
    ModelDescriptor,
    ModelOption,
    ModelSpec,
    register_model_descriptor,
)

if TYPE_CHECKING:
    from dpsweep.spec_model import ModelConfig

#: The model names whose weights come from a checkpoint of their own kind.
CHECKPOINT_MODELS: dict[str, str] = {"hf": "hf", "timm": "timm", "torchvision": "torchvision"}

#: Architectures a ``torchvision`` checkpoint may name (no BatchNorm: it mixes records).
TORCHVISION_ARCHS: tuple[str, ...] = (
    "vit_b_16",
    "vit_b_32",
    "vit_l_16",
    "swin_t",
    "swin_s",
    "convnext_tiny",
    "convnext_small",
    "maxvit_t",
)
#: Architectures a ``timm`` checkpoint may name (GroupNorm / LayerNorm ones).
TIMM_ARCHS: tuple[str, ...] = (
    "vit_tiny_patch16_224",
    "vit_small_patch16_224",
    "vit_base_patch16_224",
    "deit_tiny_patch16_224",
    "deit_small_patch16_224",
    "convnext_atto",
    "convnext_nano",
    "convnext_tiny",
    "resnetv2_50x1_bit",
    "nf_resnet50",
)

HF = register_model_descriptor(
    ModelDescriptor(
        name="hf",
        engine_path="generic",
        # One trial after another: a vmap over a pack of transformers is not faster, and not
        # every transformers layer supports it.
        generic_packs="sequential",
        description=(
            "a Hugging Face transformers checkpoint (model.checkpoint) with a sequence "
            "classification head (token data) or an image classification head (image data), "
            "resized to the dataset's classes; loaded locally, never with remote code"
        ),
        options={
            "head": ModelOption(
                default="auto",
                kind="choice",
                choices=("auto", "sequence", "image"),
                help="the head: sequence or image classification (auto: from the data)",
            ),
        },
    )
)

TIMM = register_model_descriptor(
    ModelDescriptor(
        name="timm",
        engine_path="generic",
        generic_packs="sequential",
        input_kind="image",
        description="a timm architecture (options.arch) with weights from a local checkpoint",
        options={
            "arch": ModelOption(
                default=None,
                optional=True,
                kind="choice",
                choices=TIMM_ARCHS,
                help="the architecture (default: the checkpoint config.json's architecture)",
            ),
        },
    )
)

TORCHVISION = register_model_descriptor(
    ModelDescriptor(
        name="torchvision",
        engine_path="generic",
        generic_packs="sequential",
        input_kind="image",
        description=(
            "a torchvision architecture (options.arch) with weights from a local checkpoint"
        ),
        options={
            "arch": ModelOption(
                default="vit_b_16",
                kind="choice",
                choices=TORCHVISION_ARCHS,
                help="the architecture",
            ),
        },
    )
)


def checkpoint_kind(name: str) -> str | None:
    """The checkpoint kind a model needs: its own (``hf`` ...), ``state_dict`` for a built-in
    architecture, None for a ``module:function`` factory (it loads its own weights)."""
    if name in CHECKPOINT_MODELS:
        return CHECKPOINT_MODELS[name]
    return None if ":" in name else "state_dict"


def model_spec(
    model: ModelConfig,
    *,
    checkpoints_dir: str,
    allow_paths: bool,
    lora_r: int | None = None,
) -> ModelSpec:
    """The worker's model spec of a spec's ``model`` section, its checkpoint resolved.

    Every path that builds a model from a spec (planning's model check, the quota, the driver's
    packs, ``dpsweep train``) goes through here, so they all build the same module.

    Args:
        model: the spec's model section.
        checkpoints_dir: the operator's registered checkpoints (``DPSWEEP_CHECKPOINTS_DIR``).
        allow_paths: a checkpoint may be a path (the local command line only).
        lora_r: a trial's ``lora_r`` grid value (overrides ``lora.r``).

    Raises:
        ConfigError: a checkpoint :func:`~workers.checkpoint_store.resolve_checkpoint` refuses;
            a model that needs a checkpoint and has none; a factory given one; ``lora_r``
            without ``trainable: lora``.
    """
    kind = checkpoint_kind(model.name)
    ref = None
    if model.checkpoint is not None:
        if kind is None:
            raise ConfigError(
                f"model {model.name!r} is a module:function factory: it loads its own weights, "
                "so model.checkpoint is not used; leave it out",
                field="model.checkpoint",
            )
        ref = resolve_checkpoint(
            model.checkpoint,
            checkpoints_dir=checkpoints_dir,
            allow_paths=allow_paths,
            kind=kind,
            digest=model.checkpoint_digest,
        )
    elif model.name == "hf":
        raise ConfigError(
            "model 'hf' needs model.checkpoint: a registered checkpoint's name, or on the local "
            "command line a transformers directory",
            field="model.checkpoint",
        )
    lora = None
    if model.trainable == "lora":
        cfg = model.lora
        r = int(lora_r) if lora_r is not None else (cfg.r if cfg is not None else 8)
        lora = LoraSpec(
            r=r,
            alpha=float(cfg.alpha) if cfg is not None else 16.0,
            target_modules=tuple(cfg.target_modules)
            if cfg is not None and cfg.target_modules
            else None,
        )
    elif lora_r is not None:
        raise ConfigError(
            f"{LORA_RANK_AXIS} sweeps LoRA's rank: it needs model.trainable: lora",
            field=f"grid.{LORA_RANK_AXIS}",
        )
    trainable = model.trainable if isinstance(model.trainable, str) else tuple(model.trainable)
    return ModelSpec(
        model.name, dict(model.options), checkpoint=ref, trainable=trainable, lora=lora
    )


def spec_of(
    model: ModelConfig, *, lora_r: int | None = None, allow_paths: bool = True
) -> ModelSpec:
    """:func:`model_spec` with this process's checkpoints directory
    (``DPSWEEP_CHECKPOINTS_DIR``, :class:`workers.settings.WorkerSettings`).

    ``allow_paths`` is true by default because a server refuses a path at its edge (a stored
    spec names registered checkpoints only) and the local command line accepts one.
    """
    from workers.settings import WorkerSettings  # pydantic-settings: torch-free, small

    return model_spec(
        model,
        checkpoints_dir=WorkerSettings().checkpoints_dir,
        allow_paths=allow_paths,
        lora_r=lora_r,
    )


def check_lora_axis(model: ModelConfig, values: list[Any], *, field: str) -> None:
    """Refuse a ``lora_r`` grid axis (or param) that no trial could use, torch-free.

    Args:
        model: the spec's model section.
        values: the ranks the arm's trials may get.
        field: where the axis is (``arms.<arm>.grid.lora_r``).

    Raises:
        ConfigError: ``trainable`` is not ``lora``, or a rank is not a whole number in 1..1024.
    """
    if model.trainable != "lora":
        raise ConfigError(
            f"{LORA_RANK_AXIS} sweeps LoRA's rank: it needs model.trainable: lora "
            f"(trainable is {model.trainable!r})",
            field=field,
        )
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v):
            raise ConfigError(f"{LORA_RANK_AXIS} must be whole numbers; got {v!r}", field=field)
        if not 1 <= int(v) <= 1024:
            raise ConfigError(f"{LORA_RANK_AXIS} must be in 1..1024; got {v!r}", field=field)


__all__ = [
    "CHECKPOINT_MODELS",
    "HF",
    "TIMM",
    "TORCHVISION",
    "check_lora_axis",
    "checkpoint_kind",
    "model_spec",
    "spec_of",
]
