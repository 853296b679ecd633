"""What a dataset *is*, without torch or numpy: :class:`DatasetDescriptor` and its options.

A descriptor names a dataset loader (the stable name stored in the database), the inputs its
records give a model (:data:`INPUT_KINDS`), its declared options (:class:`DatasetOption`, the
strategies' :class:`HParam` with string and list kinds besides), the spec fields it needs, and,
for a file format or a shared set, what tells its files apart and what it declares. The
registry of descriptors, with the built-ins in it, is :mod:`workers.datasets.descriptors`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from types import MappingProxyType
from typing import Any

from dpsweep.errors import ConfigError
from workers.options import HParam, check_settings, check_value

#: What a dataset's records are for a model: ``flat`` feature vectors, ``image`` arrays
#: (``[C, H, W]`` once loaded), ``tokens`` (token ids ``[T]``, int64, padded with 0), or
#: ``any``: the file's own shape decides (the file formats).
INPUT_KINDS: tuple[str, ...] = ("flat", "image", "tokens", "any")
#: A loaded dataset's ``kind`` (:attr:`workers.datasets.records.RawData.kind`) as an input kind.
INPUT_KIND_OF: Mapping[str, str] = MappingProxyType(
    {"tabular": "flat", "image": "image", "tokens": "tokens"}
)
#: Kinds of :class:`DatasetOption` besides :class:`HParam`'s: a string (a column's name) and
#: the path of a *public* file the operator provides (a vocabulary, a tokenizer).
STRING_KINDS: tuple[str, ...] = ("text", "path")
#: The :class:`~workers.datasets.records.DatasetSpec` fields a loader may need besides options.
SPEC_FIELDS: tuple[str, ...] = ("path", "labels_path", "label_column")


@dataclass(frozen=True)
class DatasetOption(HParam):
    """A declared dataset option: an :class:`HParam`, or a string, or a list of numbers.

    Args:
        kind: besides ``float``, ``int`` and ``choice``: ``text`` (a non-empty string, e.g. a
            column's name) or ``path`` (the path of a public file the operator provides, e.g.
            a vocabulary; never one derived from the records).
        length: a list of exactly this many values of ``kind`` (e.g. ``size: [H, W]``);
            0: a single value.
    """

    length: int = 0

    def __post_init__(self) -> None:
        if self.kind in STRING_KINDS:
            object.__setattr__(self, "positive", False)
            return
        super().__post_init__()

    @property
    def numeric(self) -> bool:
        return self.kind in ("float", "int")

    def range_text(self) -> str:
        if self.kind == "path":
            return "the path of a file"
        if self.kind == "text":
            return "a non-empty string"
        text = super().range_text()
        return f"a list of {self.length} numbers, each {text}" if self.length else text


def check_option(name: str, option: HParam, value: Any, *, owner: str, field: str) -> Any:
    """One dataset option's value (see :class:`DatasetOption`); plain :class:`HParam` values
    go through :func:`workers.options.check_value`.

    Raises:
        ConfigError: naming ``field`` and what the value must be.
    """
    if option.kind in STRING_KINDS:
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            what = "the path of a file" if option.kind == "path" else "a non-empty string"
            raise ConfigError(f"{name} for {owner} must be {what}; got {value!r}", field=field)
        return value
    length = getattr(option, "length", 0)
    if not length:
        return check_value(option, value, name=name, owner=owner, field=field)
    if not isinstance(value, list | tuple) or len(value) != length:
        raise ConfigError(
            f"{name} for {owner} must be a list of {length} numbers; got {value!r}", field=field
        )
    return [check_value(option, v, name=name, owner=owner, field=field) for v in value]


@dataclass(frozen=True, eq=False)
class DatasetDescriptor:
    """The torch-free description of a dataset loader.

    Args:
        name: the stable name stored in the database and used in specs (the loader's name).
        input_kind: ``flat``, ``image``, ``tokens`` or ``any`` (see :data:`INPUT_KINDS`).
        description: one line for listings.
        options: the loader's declared options (``dataset.options``), with defaults and
            ranges; a dataset without options refuses any.
        needs: the spec fields the loader requires (see :data:`SPEC_FIELDS`), e.g. ``path``.
        registerable: a file format an operator may register (``dpsweep datasets register
            FILE --name NAME``); needs ``path``.
        uploadable: a file format a user may upload (``POST /api/v1/datasets``): one file,
            so it needs ``path`` and not ``labels_path``, and is not a directory.
        suffixes: the lower-case suffixes (``.csv``) of the files it takes. A file's last
            suffix tells its format (the first registered format that takes it: the built-ins
            come first), and an upload is stored under the first.
        name_marks: what else in a file's name tells the format when its last suffix does not:
            a suffix among the name's suffixes (``.idx`` of ``images.idx.gz``) or, without a
            leading dot, a part of the name (``ubyte`` of ``train-images-idx3-ubyte``).
        directory: the source is a directory (``image_folder``), told from a directory's path.
        shared: records bundled with dpsweep or a plug-in, no file (``digits``): every user
            may run sweeps on them (:data:`sweeper.datasets.names.BUILTIN`).
        size: a shared set's declared number of records: the sample rate, step count and
            delta's bound use it (:attr:`workers.datasets.records.DatasetSpec.declared_size`),
            never a count of the records at load. None: counted (the older built-ins).
        classes: a shared set's declared class list in encoding order (canonical names, as
            :attr:`~workers.datasets.records.DatasetSpec.classes`). None: the records'
            distinct labels.
        input_bounds: a shared set's declared bounds of every raw input value (as
            ``dataset.input_bounds``; a spec's own bounds take precedence). None: scaled by
            the format or public statistics.
        public: a shared set whose records are public (no epsilon covers them): a spec may
            name it as its public evaluation dataset (``eval: {mode: public, dataset:
            NAME}``), like a registered name declared public.
        privacy_unit: a shared set's own privacy unit (``mnist1d-people``: ``person``), the
            name its loader gives each row's unit (:attr:`~workers.datasets.records.RawData.
            units`). None: each row is its own unit.
        units: a shared set's declared number of privacy units (with ``privacy_unit``): the
            sample rate, step count and delta's bound use it
            (:attr:`~workers.datasets.records.DatasetSpec.declared_units`), as ``size`` gives
            them without a unit.
    """

    name: str
    input_kind: str
    description: str = ""
    options: Mapping[str, HParam] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    registerable: bool = False
    uploadable: bool = False
    suffixes: tuple[str, ...] = ()
    name_marks: tuple[str, ...] = ()
    directory: bool = False
    shared: bool = False
    size: int | None = None
    classes: tuple[str, ...] | None = None
    input_bounds: tuple[float, float] | None = None
    public: bool = False
    privacy_unit: str | None = None
    units: int | None = None

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
        object.__setattr__(self, "suffixes", tuple(self.suffixes))
        object.__setattr__(self, "name_marks", tuple(self.name_marks))
        bad = [x for x in self.suffixes if not x.startswith(".") or x != x.lower() or x == "."]
        if bad:
            raise ValueError(
                f"dataset {self.name!r}: suffixes must be lower-case and start with '.'; got {bad}"
            )
        if (self.registerable or self.uploadable) and "path" not in self.needs:
            raise ValueError(
                f"dataset {self.name!r}: a format that is registered or uploaded reads a file: "
                "it needs 'path'"
            )
        if self.uploadable and (self.directory or "labels_path" in self.needs):
            raise ValueError(
                f"dataset {self.name!r}: an upload is one file: an uploadable format can be "
                "neither a directory nor need labels_path"
            )
        if self.shared and (self.needs or self.registerable or self.uploadable):
            raise ValueError(
                f"dataset {self.name!r}: a shared set reads no file: it needs no spec field "
                "and is neither registered nor uploaded"
            )
        declares = self.size is not None or self.classes is not None
        if (declares or self.input_bounds is not None or self.public) and not self.shared:
            # A file's sizes and classes are declared by its owner when it is stored
            # (sweeper.datasets.fixed_view); only a shared set's are the loader's.
            raise ValueError(
                f"dataset {self.name!r}: only a shared set declares size, classes, "
                "input_bounds or public"
            )
        if (self.privacy_unit is not None or self.units is not None) and not self.shared:
            # A file's unit is its owner's declaration, stored with it (issue 54).
            raise ValueError(
                f"dataset {self.name!r}: only a shared set declares privacy_unit or units"
            )
        if self.units is not None and (self.privacy_unit is None or self.units < 1):
            raise ValueError(
                f"dataset {self.name!r}: units must be >= 1 and come with a privacy_unit"
            )
        if self.size is not None and self.size < 1:
            raise ValueError(f"dataset {self.name!r}: size must be >= 1; got {self.size}")
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))
            if len(set(self.classes)) != len(self.classes) or len(self.classes) < 2:
                raise ValueError(
                    f"dataset {self.name!r}: classes must be two or more distinct names"
                )
        if self.input_bounds is not None:
            lo, hi = (float(v) for v in self.input_bounds)
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"dataset {self.name!r}: input_bounds must be finite with lo < hi")
            object.__setattr__(self, "input_bounds", (lo, hi))

    def takes(self, file_name: str, *, last_only: bool) -> bool:
        """Whether a file's name says it is of this format: its last suffix is one of
        :attr:`suffixes` (``last_only``), else one of :attr:`name_marks` is in it."""
        suffixes = [x.lower() for x in PurePath(file_name).suffixes]
        if last_only:
            return bool(suffixes) and suffixes[-1] in self.suffixes
        lower = file_name.lower()
        return any(
            mark in suffixes if mark.startswith(".") else mark in lower for mark in self.name_marks
        )

    def admits(self, kind: str) -> bool:
        """Whether loaded records of ``kind`` (``image``, ``tabular``, ``tokens``) are what it
        declares."""
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
        owner = f"dataset {self.name!r}"
        return check_settings(
            self.options,
            options,
            owner=owner,
            field="dataset.options",
            check=lambda name, option, value: check_option(
                name, option, value, owner=owner, field=f"dataset.options.{name}"
            ),
        )

    def path_options(self) -> tuple[str, ...]:
        """The options that name a file on the server (kind ``path``): like ``dataset.path``,
        for admins and local use only."""
        return tuple(name for name, option in self.options.items() if option.kind == "path")


__all__ = [
    "INPUT_KINDS",
    "INPUT_KIND_OF",
    "SPEC_FIELDS",
    "STRING_KINDS",
    "DatasetDescriptor",
    "DatasetOption",
    "check_option",
]
