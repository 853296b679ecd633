"""What a dataset *is*, without torch or numpy: its name, the inputs it gives, its options.

A :class:`DatasetDescriptor` is the torch-free half of a dataset loader: the API, the planner
and sweep submission read it to refuse an unknown dataset, an unknown option or a bad option
value before any budget is reserved, and to say which models can take the records (``flat``
feature vectors or ``image`` arrays). The loader itself (:mod:`workers.datasets.registry`) is
looked up by the same stable name.

Registration is a function call (:func:`register_dataset_descriptor`); the built-in datasets
and file formats are described when this module is imported, and plug-ins (entry points of the
group ``dpsweep.datasets``, :mod:`workers.plugins`) are loaded the first time the names are
listed or a name is not found. Options are declared with the strategies' :class:`HParam`
(default, kind, range), so both kinds of descriptor read the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dpsweep.errors import ConfigError
from workers.options import HParam, check_settings
from workers.plugins import load_plugins

#: What a dataset's records are for a model: ``flat`` feature vectors, ``image`` arrays
#: (``[C, H, W]`` once loaded), or ``any``: the file's own shape decides (the file formats).
INPUT_KINDS: tuple[str, ...] = ("flat", "image", "any")
#: A loaded dataset's ``kind`` (:attr:`workers.datasets.records.RawData.kind`) as an input kind.
INPUT_KIND_OF: Mapping[str, str] = MappingProxyType({"tabular": "flat", "image": "image"})
#: The :class:`~workers.datasets.records.DatasetSpec` fields a loader may need besides options.
SPEC_FIELDS: tuple[str, ...] = ("path", "labels_path", "label_column")

FIELD = "dataset.name"


@dataclass(frozen=True, eq=False)
class DatasetDescriptor:
    """The torch-free description of a dataset loader.

    Args:
        name: the stable name stored in the database and used in specs (the loader's name).
        input_kind: ``flat``, ``image`` or ``any`` (see :data:`INPUT_KINDS`).
        description: one line for listings.
        options: the loader's declared options (``dataset.options``), with defaults and
            ranges; a dataset without options refuses any.
        needs: the spec fields the loader requires (see :data:`SPEC_FIELDS`), e.g. ``path``.
    """

    name: str
    input_kind: str
    description: str = ""
    options: Mapping[str, HParam] = field(default_factory=dict)
    needs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(
                f"dataset {self.name!r}: input_kind must be one of {list(INPUT_KINDS)}; "
                f"got {self.input_kind!r}"
            )
        unknown = [f for f in self.needs if f not in SPEC_FIELDS]
        if unknown:
            raise ValueError(
                f"dataset {self.name!r}: needs names unknown spec field(s) {unknown}; "
                f"known: {list(SPEC_FIELDS)}"
            )
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        object.__setattr__(self, "needs", tuple(self.needs))

    def admits(self, kind: str) -> bool:
        """Whether loaded records of ``kind`` (``image`` or ``tabular``) are what it declares."""
        return self.input_kind == "any" or INPUT_KIND_OF.get(kind) == self.input_kind

    def defaults(self) -> dict[str, Any]:
        """Every declared option at its default."""
        return {name: option.default for name, option in self.options.items()}

    def validate(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Fill defaults and check every option value: type, finiteness, range and choices.

        Returns:
            Every declared option, with defaults filled and numbers as float / int.

        Raises:
            ConfigError: naming the field as ``dataset.options.<name>``.
        """
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"the options of dataset {self.name!r} must be a mapping of names to values; "
                f"got {type(options).__name__}",
                field="dataset.options",
            )
        return check_settings(
            self.options, options, owner=f"dataset {self.name!r}", field="dataset.options"
        )


DATASET_DESCRIPTORS: dict[str, DatasetDescriptor] = {}


def register_dataset_descriptor(descriptor: DatasetDescriptor) -> DatasetDescriptor:
    """Register a descriptor under its name (a stable contract stored in the database).

    Registering the same object again is a no-op; another descriptor of a taken name is refused.
    """
    known = DATASET_DESCRIPTORS.get(descriptor.name)
    if known is not None:
        if known is descriptor:
            return descriptor
        raise ValueError(f"dataset {descriptor.name!r} is described twice")
    DATASET_DESCRIPTORS[descriptor.name] = descriptor
    return descriptor


def dataset_descriptor_names() -> list[str]:
    """The described datasets' names, plug-ins' included."""
    load_plugins("datasets")
    return sorted(DATASET_DESCRIPTORS)


def get_dataset_descriptor(name: str) -> DatasetDescriptor:
    """The descriptor of a dataset (plug-ins are loaded on a miss).

    Raises:
        ConfigError: unknown name (field ``dataset.name``; the message lists the names).
    """
    if name not in DATASET_DESCRIPTORS:
        load_plugins("datasets")
    if name not in DATASET_DESCRIPTORS:
        raise ConfigError(
            f"unknown dataset {name!r}; choose one of: {', '.join(dataset_descriptor_names())}",
            field=FIELD,
        )
    return DATASET_DESCRIPTORS[name]


# ---------------------------------------------------------------------------------------------
# The built-in sets (workers.datasets.builtin) and file formats (workers.datasets.formats).

DIGITS = register_dataset_descriptor(
    DatasetDescriptor(
        name="digits",
        input_kind="image",
        description="8x8 grey-scale images of handwritten digits, 10 classes (scikit-learn)",
    )
)

BREAST_CANCER = register_dataset_descriptor(
    DatasetDescriptor(
        name="breast_cancer",
        input_kind="flat",
        description="30 features of breast tumours, 2 classes (scikit-learn)",
    )
)

WINE = register_dataset_descriptor(
    DatasetDescriptor(
        name="wine",
        input_kind="flat",
        description="13 chemical features of wines, 3 classes (scikit-learn)",
    )
)

SYNTHETIC = register_dataset_descriptor(
    DatasetDescriptor(
        name="synthetic",
        input_kind="flat",
        description="a seeded classification problem (scikit-learn make_classification)",
        options={
            "n_samples": HParam(default=2000, kind="int", help="number of records"),
            "n_features": HParam(default=20, kind="int", help="features per record"),
            "n_informative": HParam(default=10, kind="int", help="informative features"),
            "n_classes": HParam(default=4, kind="int", low=2.0, help="number of classes"),
            # make_classification's random_state: a 32-bit unsigned seed.
            "seed": HParam(default=0, kind="int", low=0.0, high=2.0**32 - 1, help="seed"),
        },
    )
)

IDX = register_dataset_descriptor(
    DatasetDescriptor(
        name="idx",
        input_kind="any",
        description="MNIST-format IDX files (images [N, H, W] or features [N, D], and labels)",
        needs=("path", "labels_path"),
    )
)

NPZ = register_dataset_descriptor(
    DatasetDescriptor(
        name="npz",
        input_kind="any",
        description="a NumPy .npz file with arrays x (features or images) and y (labels)",
        needs=("path",),
    )
)

CSV = register_dataset_descriptor(
    DatasetDescriptor(
        name="csv",
        input_kind="flat",
        description="a CSV file with a header row: numeric feature columns and a label column",
        needs=("path", "label_column"),
    )
)


__all__ = [
    "BREAST_CANCER",
    "CSV",
    "DATASET_DESCRIPTORS",
    "DIGITS",
    "IDX",
    "INPUT_KINDS",
    "INPUT_KIND_OF",
    "NPZ",
    "SPEC_FIELDS",
    "SYNTHETIC",
    "WINE",
    "DatasetDescriptor",
    "dataset_descriptor_names",
    "get_dataset_descriptor",
    "register_dataset_descriptor",
]
