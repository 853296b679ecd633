"""Every registered name with its torch-free description: what ``dpsweep plugins`` and the API's
``GET /api/v1/registry`` list.

Reads only the descriptor registries (models, datasets, strategies, accountants), which load
the installed plug-ins (entry points, :mod:`workers.plugins`) when listed, so plug-ins appear
beside the built-ins. Imports no torch and no accountant library: the API process lists with it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from workers.accounting.registry import accountant_names, get_accountant
from workers.datasets.descriptors import dataset_descriptor_names, get_dataset_descriptor
from workers.models.descriptors import get_model_descriptor, model_descriptor_names
from workers.options import HParam
from workers.strategies.descriptors import descriptor_names, get_descriptor

#: The listing's sections, in the order they are shown.
KINDS: tuple[str, ...] = ("models", "datasets", "strategies", "accountants")


def _plain(value: Any) -> Any:
    """A JSON-ready default: tuples as lists, non-finite floats as their names."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def describe_option(name: str, option: HParam) -> dict[str, Any]:
    """One declared option or hyperparameter: kind, default, range or choices, help."""
    return {
        "name": name,
        "kind": option.kind,
        "default": _plain(option.default),
        "range": None if option.kind == "choice" else option.range_text(),
        "choices": list(option.choices),
        "optional": option.optional,
        "sequence": bool(getattr(option, "sequence", False)),
        "shared": option.shared,
        "help": option.help,
    }


def _options(options: Mapping[str, HParam]) -> list[dict[str, Any]]:
    return [describe_option(name, option) for name, option in options.items()]


def list_models() -> list[dict[str, Any]]:
    """Every model: its input kind, task, description and options."""
    out = []
    for name in model_descriptor_names():
        d = get_model_descriptor(name)
        out.append(
            {
                "name": name,
                "description": d.description,
                "input_kind": d.input_kind,
                "task": d.task,
                "options": _options(d.options),
            }
        )
    return out


def list_datasets() -> list[dict[str, Any]]:
    """Every dataset loader: the input kind it gives, the spec fields it needs, its options."""
    out = []
    for name in dataset_descriptor_names():
        d = get_dataset_descriptor(name)
        out.append(
            {
                "name": name,
                "description": d.description,
                "input_kind": d.input_kind,
                "needs": list(d.needs),
                "options": _options(d.options),
            }
        )
    return out


def list_strategies() -> list[dict[str, Any]]:
    """Every clipping strategy: whether it is private, and its hyperparameters."""
    out = []
    for name in descriptor_names():
        d = get_descriptor(name)
        out.append(
            {
                "name": name,
                "description": d.description,
                "private": d.private,
                "packable": d.packable,
                "hyperparameters": _options(d.hyperparameters),
            }
        )
    return out


def list_accountants() -> list[dict[str, Any]]:
    """Every accountant: the library behind it and whether it is tight."""
    out = []
    for name in accountant_names():
        d = get_accountant(name)
        out.append(
            {"name": name, "description": d.description, "library": d.library, "tight": d.tight}
        )
    return out


def registry_listing() -> dict[str, list[dict[str, Any]]]:
    """The four registries, plug-ins included: ``{"models": [...], "datasets": [...], ...}``.

    Raises:
        ConfigError: an installed plug-in failed to load (the message names it).
    """
    return {
        "models": list_models(),
        "datasets": list_datasets(),
        "strategies": list_strategies(),
        "accountants": list_accountants(),
    }
