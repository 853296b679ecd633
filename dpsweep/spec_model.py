"""The spec's ``model`` section: the architecture, where its weights start, and what is trained.

A model starts from random weights (a registered name and its options), or from a checkpoint:
a Hugging Face ``transformers`` directory (``name: hf``), a ``timm`` or ``torchvision``
architecture with weights from a local file (``name: timm`` / ``torchvision``, the architecture
in ``options.arch``), a built-in architecture's own weights (a safetensors state dict), or a
``module:function`` factory (local command line only) that loads its own. On a server a
checkpoint is a *name* the operator registered, never a path; the checkpoint must not have seen
the private records, which its registration declares. What is trained (``trainable``) is part of
the spec: frozen parameters get no clipping and no noise, and the ε is the same (the frozen
values do not depend on the private records).

``pretrain_on`` names a dataset declared public: the model is first trained on it without noise
(ε 0, the recipe in ``pretrain``), and the private grid fine-tunes the result.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dpsweep.spec_base import StrictSection

#: What ``trainable`` may name besides a list of parameter-name patterns.
TRAINABLE_PARTS: tuple[str, ...] = ("all", "head", "lora")
#: The grid axis that sweeps LoRA's rank (``trainable: lora`` only).
LORA_RANK_AXIS = "lora_r"


class LoraConfig(StrictSection):
    """LoRA adapters (through ``peft``) on the frozen model's linear layers."""

    r: int = Field(
        default=8,
        ge=1,
        le=1024,
        description=f"each adapter's rank; an arm's grid may sweep it as `{LORA_RANK_AXIS}`",
    )
    alpha: float = Field(default=16.0, gt=0, description="the adapters' scale is alpha / r")
    target_modules: list[str] | None = Field(
        default=None,
        description="names (suffixes) of the linear layers to adapt, e.g. [query, value]; "
        "default: peft's choice for the architecture",
    )

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or any(not t.strip() for t in v)):
            raise ValueError("target_modules must be a non-empty list of layer names")
        return v


class PretrainConfig(StrictSection):
    """The non-private recipe of public pre-training (``pretrain_on``): ε 0, no noise."""

    epochs: float = Field(default=20.0, gt=0, le=10_000)
    lr: float = Field(default=0.05, gt=0)
    batch_size: int = Field(default=64, ge=1)
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(default=0.9, ge=0, lt=1)
    seed: int = Field(default=0, description="public seed of the pre-training (public data only)")


class ModelConfig(StrictSection):
    """The ``model`` section (docs/spec.md and docs/finetuning.md)."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)
    checkpoint: str | None = Field(
        default=None,
        min_length=1,
        description="where the weights start: a registered checkpoint's name (`dpsweep "
        "checkpoints list`); on the local command line also a directory or file path. Omitted: "
        "random initial weights",
    )
    checkpoint_digest: str | None = Field(
        default=None,
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="the checkpoint's content digest (sha256:<hex>); filled in when the sweep "
        "is submitted, and a given one must match, so a stored sweep names exactly the weights "
        "it started from",
    )
    trainable: Literal["all", "head", "lora"] | list[str] = Field(
        default="all",
        description="what DP-SGD trains: all, head (the output layer), lora (adapters, see "
        "`lora`) or a list of parameter-name patterns (fnmatch). Frozen parameters are neither "
        "clipped nor noised; the ε is unchanged",
    )
    lora: LoraConfig | None = Field(default=None, description="LoRA settings (trainable: lora)")
    pretrain_on: str | None = Field(
        default=None,
        min_length=1,
        description="a dataset declared public to pre-train on without noise (ε 0) before the "
        "private grid fine-tunes the result; recipe in `pretrain`",
    )
    pretrain: PretrainConfig | None = Field(
        default=None, description="the public pre-training's recipe (with pretrain_on)"
    )

    @field_validator("trainable")
    @classmethod
    def _patterns(cls, v: Any) -> Any:
        if isinstance(v, list) and (not v or any(not isinstance(p, str) or not p for p in v)):
            raise ValueError(
                "trainable must be all, head, lora or a non-empty list of parameter-name patterns"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.lora is not None and self.trainable != "lora":
            raise ValueError("lora settings need trainable: lora")
        if self.trainable == "lora" and self.lora is None:
            self.lora = LoraConfig()
        if self.pretrain is not None and self.pretrain_on is None:
            raise ValueError("pretrain (the recipe) needs pretrain_on (a public dataset's name)")
        if self.pretrain_on is not None and self.pretrain is None:
            self.pretrain = PretrainConfig()
        return self


__all__ = [
    "LORA_RANK_AXIS",
    "TRAINABLE_PARTS",
    "LoraConfig",
    "ModelConfig",
    "PretrainConfig",
]
