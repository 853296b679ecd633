"""Response models of the plug-in registry (re-exported by :mod:`api.schemas`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RegistryOption(_Out):
    name: str
    kind: str = Field(description="float, int or choice")
    default: Any = None
    range: str | None = Field(description="the allowed range in words; null for a choice")
    choices: list[str]
    optional: bool = Field(description="null is allowed and means: derive it")
    sequence: bool = Field(description="a list of such values (e.g. hidden layer widths)")
    shared: bool = Field(description="every trial of a pack must share it")
    help: str


class RegistryModel(_Out):
    name: str
    description: str
    input_kind: str = Field(description="flat, image or any")
    task: str
    options: list[RegistryOption]


class RegistryDataset(_Out):
    name: str
    description: str
    input_kind: str = Field(description="flat, image or any")
    needs: list[str] = Field(description="the spec fields it requires, e.g. path")
    options: list[RegistryOption]


class RegistryStrategy(_Out):
    name: str
    description: str
    private: bool
    packable: bool
    hyperparameters: list[RegistryOption]


class RegistryAccountant(_Out):
    name: str
    description: str
    library: str
    tight: bool = Field(description="a numerically tight estimate, not a loose upper bound")


class RegistryOut(_Out):
    models: list[RegistryModel]
    datasets: list[RegistryDataset]
    strategies: list[RegistryStrategy]
    accountants: list[RegistryAccountant]


class CheckpointOut(_Out):
    name: str = Field(description="what a spec's model.checkpoint names")
    kind: str | None = Field(description="hf, timm, torchvision or state_dict")
    digest: str | None = Field(
        description="sha256:<hex> of its files, as a sweep pins it in model.checkpoint_digest; "
        "null: the checkpoint no longer reads (a spec naming it is refused)"
    )
    description: str
    trained_on: str | None = Field(description="the public data it was trained on, as registered")
    private_records_seen: bool | None = Field(
        description="false: its registration declares it has seen no private record"
    )


class CheckpointsOut(_Out):
    checkpoints: list[CheckpointOut]
