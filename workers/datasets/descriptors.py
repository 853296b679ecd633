"""The dataset descriptors by name: registration, listing and look-up, with the built-ins.

A :class:`DatasetDescriptor` (:mod:`workers.datasets.description`) is the torch-free half of a
dataset loader: the API, the planner and sweep submission read it to refuse an unknown dataset,
an unknown option or a bad option value before any budget is reserved, and to say which models
can take the records (``flat`` feature vectors, ``image`` arrays or ``tokens``, token ids). The
loader itself (:mod:`workers.datasets.registry`) is looked up by the same stable name.

Registration is a function call (:func:`register_dataset_descriptor`); the built-in datasets
and file formats (:mod:`workers.datasets.builtin_descriptors`) are registered when this module
is imported, and plug-ins (entry points of the group ``dpsweep.datasets``,
:mod:`workers.plugins`) are loaded the first time the names are listed or a name is not found.
Options are declared with the strategies' :class:`HParam` (default, kind, range), so both kinds
of descriptor read the same way. The descriptor types and the built-ins are re-exported here.
"""

from __future__ import annotations

import functools

from dpsweep.registry import Registry
from workers.datasets.builtin_descriptors import (
    BREAST_CANCER,
    BUILTIN_DESCRIPTORS,
    CSV,
    DIGITS,
    IDX,
    IMAGE_FOLDER,
    MNIST1D,
    MNIST1D_BOUNDS,
    MNIST1D_CLASSES,
    MNIST1D_PEOPLE,
    MNIST1D_PEOPLE_SEED,
    MNIST1D_PEOPLE_UNITS,
    MNIST1D_PUBLIC,
    MNIST1D_PUBLIC_SEED,
    MNIST1D_SHAPE,
    MNIST1D_TEST,
    NPZ,
    SYNTHETIC,
    TEXT_CSV,
    WINE,
)
from workers.datasets.description import (
    INPUT_KIND_OF,
    INPUT_KINDS,
    SPEC_FIELDS,
    STRING_KINDS,
    DatasetDescriptor,
    DatasetOption,
    check_option,
)
from workers.plugins import load_plugins

FIELD = "dataset.name"


#: The dataset descriptors by name, in registration order (the built-ins first); the installed
#: plug-ins are loaded when the names are listed or a name is not found.
DATASET_DESCRIPTORS: Registry[str, DatasetDescriptor] = Registry(
    "dataset",
    field=FIELD,
    load=functools.partial(load_plugins, "datasets"),
    verb="described",
    idempotent=True,
)


def register_dataset_descriptor(descriptor: DatasetDescriptor) -> DatasetDescriptor:
    """Register a descriptor under its name (a stable contract stored in the database).

    Registering the same object again is a no-op; another descriptor of a taken name is refused.
    """
    return DATASET_DESCRIPTORS.register(descriptor.name, descriptor)


def dataset_descriptor_names() -> list[str]:
    """The described datasets' names, plug-ins' included."""
    return DATASET_DESCRIPTORS.names()


def dataset_descriptors() -> list[DatasetDescriptor]:
    """Every descriptor in registration order (the built-ins first), plug-ins' included."""
    DATASET_DESCRIPTORS.load()
    return list(DATASET_DESCRIPTORS.values())


def get_dataset_descriptor(name: str) -> DatasetDescriptor:
    """The descriptor of a dataset (plug-ins are loaded on a miss).

    Raises:
        ConfigError: unknown name (field ``dataset.name``; the message lists the names).
    """
    return DATASET_DESCRIPTORS.lookup(name)


# The built-in sets and file formats, in their order (a file's format is the first that takes it).
for _builtin in BUILTIN_DESCRIPTORS:
    register_dataset_descriptor(_builtin)


__all__ = [
    "BREAST_CANCER",
    "BUILTIN_DESCRIPTORS",
    "CSV",
    "DATASET_DESCRIPTORS",
    "DIGITS",
    "IDX",
    "IMAGE_FOLDER",
    "INPUT_KINDS",
    "INPUT_KIND_OF",
    "MNIST1D",
    "MNIST1D_BOUNDS",
    "MNIST1D_CLASSES",
    "MNIST1D_PEOPLE",
    "MNIST1D_PEOPLE_SEED",
    "MNIST1D_PEOPLE_UNITS",
    "MNIST1D_PUBLIC",
    "MNIST1D_PUBLIC_SEED",
    "MNIST1D_SHAPE",
    "MNIST1D_TEST",
    "NPZ",
    "SPEC_FIELDS",
    "STRING_KINDS",
    "SYNTHETIC",
    "TEXT_CSV",
    "WINE",
    "DatasetDescriptor",
    "DatasetOption",
    "check_option",
    "dataset_descriptor_names",
    "dataset_descriptors",
    "get_dataset_descriptor",
    "register_dataset_descriptor",
]
