"""The model registry: torch builders by name, and :func:`build_model`.

A model is an ``nn.Module`` built for a given input shape. A plain ``nn.Sequential`` of the
layers :mod:`workers.packed` knows is compiled into a *packed* model with a leading trial
dimension; any other module (residual networks, transformers: ``wrn16_4``, ``res_cnn``,
``text_classifier``) is trained by the generic per-sample gradient path. The same ``nn.Module``
is what tests and benchmarks hand to Opacus, so both see one architecture.

Models must not mix examples (no batch norm): per-sample gradients rely on it.

A model is two registrations under one stable name: its torch-free
:class:`~workers.models.descriptors.ModelDescriptor` (input kind, task, options and their ranges)
and, here, its builder ``fn(input_shape, num_classes, **options) -> nn.Module``. The built-in
architectures live one per file in this package and register themselves when imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dpsweep.errors import ConfigError
from dpsweep.registry import Registry
from workers.checkpoint_store import verify_checkpoint
from workers.models.descriptors import (
    DESCRIPTORS,
    ModelDescriptor,
    ModelSpec,
    Task,
    register_model_descriptor,
)
from workers.models.pretrained_descriptors import CHECKPOINT_MODELS
from workers.models.trainable import apply_trainable
from workers.plugins import load_plugins

Builder = Callable[..., nn.Module]

#: The modules of the built-in architectures (each registers its builder when imported).
BUILTIN_MODULES = (
    "logreg",
    "mlp",
    "cnn",
    "cnn1d",
    "autoencoder",
    "bow_fc",
    "lip_mlp",
    "lip_cnn",
    "wrn",
    "res_cnn",
    "text_classifier",
    "pretrained",
)


@dataclass(frozen=True)
class ModelEntry:
    """A registered model: its descriptor and its torch builder."""

    descriptor: ModelDescriptor
    builder: Builder

    @property
    def name(self) -> str:
        return self.descriptor.name

    @property
    def task(self) -> Task:
        return self.descriptor.task

    @property
    def needs_image(self) -> bool:
        return self.descriptor.needs_image

    @property
    def option_names(self) -> frozenset[str]:
        return frozenset(self.descriptor.options)

    @property
    def description(self) -> str:
        return self.descriptor.description


def load_builtin_models() -> None:
    """Import (and so register) every built-in architecture."""
    for module in BUILTIN_MODULES:
        importlib.import_module(f"workers.models.{module}")


def _load_all() -> None:
    """Register the built-in architectures and the installed plug-ins (once per process)."""
    load_builtin_models()
    load_plugins("models")


#: The model builders by name; the built-in architectures and the installed plug-ins are loaded
#: when the names are listed or a name is not found.
MODELS: Registry[str, ModelEntry] = Registry("model", field="model.name", load=_load_all)


def register_model(model: ModelDescriptor | str) -> Callable[[Builder], Builder]:
    """Register a model builder ``fn(input_shape, num_classes, **options) -> nn.Module``.

    Args:
        model: the model's descriptor (registered here if it is not yet), or the name of a
            registered descriptor.
    """
    if isinstance(model, str):
        if model not in DESCRIPTORS:
            raise ValueError(f"model {model!r} has no descriptor; register_model_descriptor first")
        descriptor = DESCRIPTORS[model]
    else:
        descriptor = register_model_descriptor(model)

    def deco(fn: Builder) -> Builder:
        MODELS.register(descriptor.name, ModelEntry(descriptor, fn))
        return fn

    return deco


def model_names() -> list[str]:
    """The registered builders' names, the built-ins' and plug-ins' included. Imports torch."""
    return MODELS.names()


def model_task(name: str) -> Task:
    """The task of the model registered as ``name`` (raises as :func:`build_model` does)."""
    return MODELS.lookup(name).task


def build_model(
    spec: ModelSpec, *, input_shape: tuple[int, ...], num_classes: int, seed: int
) -> nn.Module:
    """Build a model; initial weights that are not a checkpoint's depend only on ``seed``.

    Where ``spec`` names a checkpoint its digest is checked again and its weights loaded (a
    built-in architecture's strictly; ``hf`` / ``timm`` / ``torchvision`` with the head
    resized to ``num_classes``, the new head from ``seed``), then ``spec.trainable`` freezes
    what DP-SGD does not train (:mod:`workers.models.trainable`, LoRA's adapters from
    ``seed`` too). Every user (trials, the model check, pack sizing, the quota, a kept
    model's rebuild) builds through here, so they all get the same module.

    Raises:
        ConfigError: unknown model, unknown option or an option value out of its range.
        DatasetError: the data's shape does not fit the model (e.g. a CNN on tabular data).
    """
    entry = MODELS.lookup(spec.name)
    unknown = set(spec.options) - entry.option_names
    if unknown:
        raise ConfigError(
            f"unknown option(s) {sorted(unknown)} for model {spec.name!r}; "
            f"allowed: {sorted(entry.option_names) or 'none'}",
            field="model.options",
        )
    # The same check as at planning (torch-free, on the descriptor).
    entry.descriptor.check_input(tuple(input_shape))
    # The same check as at submission; the builder gets the options as given (its own
    # defaults apply), so a model's weights do not depend on where it was validated.
    entry.descriptor.validate(spec.options)
    # Initialise from the trial's own seed without disturbing anyone else's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if spec.name in CHECKPOINT_MODELS:
            module = entry.builder(
                tuple(input_shape), num_classes, checkpoint=spec.checkpoint, **spec.options
            )
        else:
            module = entry.builder(tuple(input_shape), num_classes, **spec.options)
            if spec.checkpoint is not None:
                # deferred: the checkpoint loaders (safetensors) are needed with a checkpoint only
                from workers.models.weights import load_strict

                verify_checkpoint(spec.checkpoint)  # fail closed on changed files
                load_strict(module, spec.checkpoint)
        return apply_trainable(module, spec)
