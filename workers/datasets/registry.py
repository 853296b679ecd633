"""The loader registry: dataset names and the functions that read their raw records.

A loader takes a :class:`~workers.datasets.records.DatasetSpec` and returns
:class:`~workers.datasets.records.RawData`; registered names are a stable contract (stored in
the database). Plug-ins (entry points of the group ``dpsweep.datasets``, see
:mod:`workers.plugins`) register theirs with :func:`register_dataset` and describe them with
:func:`workers.datasets.descriptors.register_dataset_descriptor`; they are loaded the first time
the names are listed or a name is not found.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from dpsweep.registry import Registry
from workers.datasets.records import DatasetSpec, RawData
from workers.plugins import load_plugins

Loader = Callable[[DatasetSpec], RawData]

#: The loaders by name; the installed plug-ins are loaded when the names are listed or a name
#: is not found.
DATASETS: Registry[str, Loader] = Registry(
    "dataset", field="dataset.name", load=functools.partial(load_plugins, "datasets")
)


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    """Register a loader under ``name`` (a stable contract: names are stored in the database)."""
    return DATASETS.registering(name)


def dataset_names() -> list[str]:
    """The registered loaders' names, plug-ins' included."""
    return DATASETS.names()


def has_loader(name: str) -> bool:
    """Whether a loader is registered as ``name`` (plug-ins are loaded on a miss)."""
    return DATASETS.has(name)
