"""Models: torch-free descriptors, and their torch builders on first use.

Importing this package imports no torch: it registers the built-in *descriptors*
(:mod:`workers.models.descriptors`: names, input kinds, tasks, options and their ranges), which
is all that submission and planning need. The torch side (``build_model``, ``register_model``,
``MODELS``, ...; :mod:`workers.models.registry`) is loaded, with every built-in architecture
registered, the first time one of those names is used.

The built-in architectures are one file each (``workers.models.registry.BUILTIN_MODULES``). A
new model is a :class:`ModelDescriptor` registered with :func:`register_model_descriptor` plus a
builder registered with :func:`workers.models.registry.register_model`: in a file added to
``BUILTIN_MODULES``, or in an installed package whose entry point (group
``dpsweep.models``, :mod:`workers.plugins`) registers both. The contract tests
(``tests/workers/test_model_contract.py``) then run over it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from workers.models.descriptors import (
    ACTIVATION_NAMES,
    DESCRIPTORS,
    INPUT_KINDS,
    InputKind,
    ModelDescriptor,
    ModelOption,
    ModelSpec,
    Task,
    get_model_descriptor,
    model_descriptor_names,
    register_model_descriptor,
)
from workers.models.pretrained_descriptors import check_lora_axis, model_spec, spec_of

if TYPE_CHECKING:
    from workers.models.registry import (
        BUILTIN_MODULES,
        MODELS,
        Builder,
        ModelEntry,
        build_model,
        load_builtin_models,
        model_names,
        model_task,
        register_model,
    )

# Torch-side names, resolved on first access (module __getattr__, PEP 562).
_LAZY = {
    "BUILTIN_MODULES": "workers.models.registry",
    "load_builtin_models": "workers.models.registry",
    "MODELS": "workers.models.registry",
    "Builder": "workers.models.registry",
    "ModelEntry": "workers.models.registry",
    "build_model": "workers.models.registry",
    "model_names": "workers.models.registry",
    "model_task": "workers.models.registry",
    "register_model": "workers.models.registry",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        # The torch side, with every built-in architecture registered.
        importlib.import_module("workers.models.registry").load_builtin_models()
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ACTIVATION_NAMES",
    "BUILTIN_MODULES",
    "DESCRIPTORS",
    "INPUT_KINDS",
    "MODELS",
    "Builder",
    "InputKind",
    "ModelDescriptor",
    "ModelEntry",
    "ModelOption",
    "ModelSpec",
    "Task",
    "build_model",
    "check_lora_axis",
    "get_model_descriptor",
    "load_builtin_models",
    "model_descriptor_names",
    "model_names",
    "model_spec",
    "model_task",
    "register_model",
    "register_model_descriptor",
    "spec_of",
]
