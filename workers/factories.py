"""Local ``module:function`` factories: the local CLI's models and datasets by import string.

``dpsweep train``, ``dpsweep plan`` and ``dpsweep run`` may name a model or dataset as
``package.module:function``; the factory is imported and registered under that string, in this
process only (and, for ``dpsweep run``, in the Ray workers it starts: they inherit
:data:`FACTORIES_ENV` and register the same factories when they start training, see
:func:`load_exported_factories`). The REST API never comes here: it resolves registered names
only, because an import string from a request would run a stranger's code on the server.

This module sits above the registries (it registers into them); the registries and
:mod:`workers.plugins` know nothing of it.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable

from dpsweep.errors import ConfigError
from workers.models.descriptors import DESCRIPTORS, ModelDescriptor

_lock = threading.RLock()


#: The registry kinds a ``module:function`` factory may add to.
FACTORY_KINDS: tuple[str, ...] = ("models", "datasets")


def is_factory_name(name: object) -> bool:
    """Whether ``name`` reads as a ``module:function`` import string (not a registered name)."""
    return isinstance(name, str) and ":" in name


#: How ``dpsweep run`` hands the factories its spec names to the Ray workers it starts (they
#: inherit its environment): ``kind=module:function`` items separated by ``;``. Set by the
#: local command line only (:func:`export_factories`); never read from a request.
FACTORIES_ENV = "DPSWEEP_LOCAL_FACTORIES"


def export_factories(factories: list[tuple[str, str]]) -> None:
    """Load ``(spec, kind)`` factories here and export them to this process's child processes.

    Raises:
        ConfigError: as :func:`load_factory`.
    """
    items = [i for i in os.environ.get(FACTORIES_ENV, "").split(";") if i]
    for spec, kind in factories:
        load_factory(spec, kind)
        if f"{kind}={spec}" not in items:
            items.append(f"{kind}={spec}")
    if items:
        os.environ[FACTORIES_ENV] = ";".join(items)


def load_exported_factories() -> list[str]:
    """Register the factories a parent ``dpsweep run`` exported (:data:`FACTORIES_ENV`): what a
    Ray worker it started does before it trains, so that it knows the names the spec uses.

    Returns:
        The factories' names (each registered once per process; again is a no-op).
    """
    names = []
    for item in os.environ.get(FACTORIES_ENV, "").split(";"):
        kind, _, spec = item.partition("=")
        if kind in FACTORY_KINDS and spec:
            names.append(load_factory(spec, kind))
    return names


def load_factory(spec: str, kind: str) -> str:
    """Import the factory ``module:function`` and register it under that string, in this process.

    A model factory is called like a model builder, ``fn(input_shape, num_classes)``, and
    returns a ``torch.nn.Module`` (an ``nn.Sequential`` of Linear / ReLU layers trains on the
    packed fast path). A dataset factory is called like a loader, ``fn(DatasetSpec)``, and
    returns :class:`~workers.datasets.records.RawData`. Neither takes declared options.

    Only the local command line calls this, for a name its own operator typed: the REST API
    resolves registered names only (an import string from a request would run a stranger's
    code on the server).

    Args:
        spec: ``"package.module:function"`` (the function may be a dotted attribute path).
        kind: ``"models"`` or ``"datasets"``.

    Returns:
        ``spec``, now a registered name of that kind (registering it again is a no-op).

    Raises:
        ConfigError: ``kind`` takes no factories, ``spec`` is not ``module:function``, or the
            import failed or did not give a callable; the message names ``spec``.
    """
    if kind not in FACTORY_KINDS:
        raise ConfigError(f"a {kind} name cannot be a module:function factory ({spec!r})")
    field = "model.name" if kind == "models" else "dataset.name"
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(
            f"the {kind[:-1]} factory {spec!r} must read module:function (e.g. my_models:build)",
            field=field,
        )
    with _lock:
        # deferred: workers.datasets loads numpy, and the CLI imports this module for
        # is_factory_name alone
        from workers.datasets import DATASET_DESCRIPTORS

        if spec in (DESCRIPTORS if kind == "models" else DATASET_DESCRIPTORS):
            return spec
        fn = _import_callable(spec, module_name, attr, kind, field)
        (_register_model_factory if kind == "models" else _register_dataset_factory)(spec, fn)
    return spec


def _import_callable(
    spec: str, module_name: str, attr: str, kind: str, field: str
) -> Callable[..., object]:
    what = f"the {kind[:-1]} factory {spec!r}"
    try:
        target: object = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as exc:
        raise ConfigError(
            f"{what} could not be imported: {type(exc).__name__}: {exc}. The module must be "
            "importable here (installed, or on PYTHONPATH)",
            field=field,
        ) from exc
    if not callable(target):
        raise ConfigError(f"{what} is not callable: it is a {type(target).__name__}", field=field)
    return target


def _register_model_factory(spec: str, fn: Callable[..., object]) -> None:
    # deferred: torch is heavy, and the CLI imports this module for is_factory_name alone
    from torch import nn

    from workers.models.registry import register_model  # deferred: imports torch

    def build(input_shape: tuple[int, ...], num_classes: int, **options: object) -> nn.Sequential:
        model = fn(input_shape, num_classes, **options)
        if not isinstance(model, nn.Module):
            raise ConfigError(
                f"the model factory {spec!r} returned a {type(model).__name__}, not a "
                "torch.nn.Module",
                field="model.name",
            )
        return model  # type: ignore[return-value]  # (any nn.Module once the generic path lands)

    register_model(ModelDescriptor(name=spec, description=f"local factory {spec}"))(build)


def _register_dataset_factory(spec: str, fn: Callable[..., object]) -> None:
    # deferred: workers.datasets loads numpy (as in load_factory)
    from workers.datasets import (
        DatasetDescriptor,
        DatasetSpec,
        RawData,
        register_dataset,
        register_dataset_descriptor,
    )

    def load(dataset: DatasetSpec) -> RawData:
        raw = fn(dataset)
        if not isinstance(raw, RawData):
            raise ConfigError(
                f"the dataset factory {spec!r} returned a {type(raw).__name__}, not "
                "workers.datasets.RawData",
                field="dataset.name",
            )
        return raw

    register_dataset_descriptor(
        DatasetDescriptor(name=spec, input_kind="any", description=f"local factory {spec}")
    )
    register_dataset(spec)(load)
