"""Loading a dataset: read its records, check them, separate evaluation records, normalise.

Every loader returns raw arrays; :func:`load_dataset` then separates training from evaluation
records (by ``DatasetSpec.evaluation``) and normalises the inputs.

Privacy note on evaluation records: evaluation records are never trained on. Three modes say
what they are and what epsilon covers:

* ``carve-out`` (default): ``test_fraction`` of the dataset is held out by a seeded, stratified
  shuffle (``split_seed``) and treated as *public*: metrics, the best checkpoint and the
  scaling statistics below come from it without DP; epsilon covers the training records only.
* ``public``: every record of the (private) dataset is a training record; the evaluation
  records are all records of ``eval_dataset``, a separate dataset its owner declared public.
  It must have the same kind and input shape, and only labels among the training classes.
  Epsilon covers every private record.
* ``dp``: a carve-out whose evaluation records stay *private* (their metrics must be released
  with DP, by the caller). The split is keyed by each record's own content and the public
  ``split_seed`` (:func:`_keyed_split`), so adding or removing one record moves no other
  record across the split: neighbouring datasets differ in one record on one side. No
  statistic of either side may be used for scaling: inputs need declared ``input_bounds`` or
  a format with a known pixel range.

With a privacy unit (``DatasetSpec.privacy_unit``, issue 54) the split is by unit: all of a
unit's rows are on one side (:func:`workers.datasets.splits._unit_split`, and in mode ``dp``
:func:`workers.datasets.splits._keyed_unit_split`, keyed by the unit's own value so that adding
or removing one unit moves no other). The unit is never a feature, and the identity hashes the
records without it.

Normalisation (:mod:`workers.datasets.scaling`) uses no training record, and bounds every input.

Privacy note on classes: the class count is shown and sets the model's output layer, and the
label encoding decides what every output unit means. Computed from the records (the sorted
distinct labels), both depend on which labels occur: a neighbouring dataset without the only
record of a class has one class fewer, and every later class another index. A stored file
(upload, registered name) therefore declares its class list once, at upload or registration,
as part of its registered description (:attr:`DatasetSpec.classes`, :func:`class_names`);
every load of it encodes labels by that list and never counts classes in the records.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from dpsweep.errors import ConfigError, DatasetError
from workers.datasets.descriptors import DATASET_DESCRIPTORS
from workers.datasets.finite import _check_finite
from workers.datasets.identity import _canonical_labels, _canonical_number, content_sha256
from workers.datasets.public_eval import _public_eval_records, _with_channel_axis
from workers.datasets.records import EVAL_MODES, Dataset, DatasetSpec, RawData
from workers.datasets.registry import DATASETS, dataset_names, has_loader
from workers.datasets.scaling import _normalise
from workers.datasets.splits import split_rows
from workers.datasets.unit_values import check_units, dense_ids, unit_keys


def load_dataset(spec: DatasetSpec) -> Dataset:
    """Load, split and normalise a dataset.

    How evaluation records are separated from training records follows ``spec.evaluation``
    (module docstring): ``carve-out`` splits by a seeded shuffle (``spec.split_seed``),
    ``dp`` by a keyed hash of each record's content (:func:`_keyed_split`), and ``public``
    trains on every record and evaluates on ``spec.eval_dataset``.

    Labels are encoded by the declared class list ``spec.classes`` when there is one (module
    docstring), else by the sorted distinct labels of the records.

    Raises:
        ConfigError: unknown name or invalid settings (the message lists what is allowed); in
            mode ``dp``, inputs that only public statistics could scale; in mode ``public``,
            an evaluation dataset of another kind or input shape.
        DatasetError: a missing or malformed file, or NaN / inf values (the message names the
            file and where the values are); a split that leaves a side empty; in mode
            ``public``, evaluation labels that are not training classes; a record whose label
            is not one of the declared classes.
    """
    _check_settings(spec)
    spec = with_declarations(spec)
    raw = read_records(spec)
    # The identity is taken from the records as parsed, before the split and the scaling:
    # those depend on the spec (seed, fraction, bounds), the records do not. It hashes
    # features and labels only, never the unit: the same records keep one ledger whatever
    # unit is declared.
    identity = content_sha256(raw)
    labels = _encode_labels(raw, spec)
    x = _with_channel_axis(raw.kind, raw.x)
    sides = _training_and_evaluation(spec, raw, x, labels)
    x_train, x_test, scaling, transform = _normalise(raw, spec, sides.x_train, sides.x_eval)
    return Dataset(
        name=spec.name,
        kind=raw.kind,
        x_train=x_train,
        y_train=sides.y_train.astype(np.int64),
        x_test=x_test,
        y_test=sides.y_eval.astype(np.int64),
        num_classes=len(labels.classes),
        classes=labels.classes,
        input_scaling=scaling,
        input_transform=transform,
        content_sha256=identity,
        evaluation=spec.evaluation,
        vocab_size=raw.vocab_size if raw.kind == "tokens" else None,
        declared_classes=labels.declared,
        declared_size=spec.declared_size,
        test_fraction=spec.test_fraction,
        privacy_unit=raw.privacy_unit if raw.units is not None else None,
        units_train=sides.units_train,
        units_test=sides.units_eval,
        declared_units=spec.declared_units if raw.units is not None else None,
    )


def read_records(spec: DatasetSpec) -> RawData:
    """The records ``spec`` names as its loader reads them, checked finite, with their units
    checked (:func:`workers.datasets.unit_values.check_units`); the name must be a loader's.

    Raises:
        DatasetError: a missing or malformed file, NaN / inf values, or a privacy unit the
            format cannot read or a row without its unit.
    """
    raw = DATASETS[spec.name](spec)
    _check_finite(raw, spec)
    check_units(raw, spec)
    if raw.units is not None and raw.privacy_unit is None:
        raw.privacy_unit = spec.privacy_unit
    return raw


def _check_settings(spec: DatasetSpec) -> None:
    """The spec's loader, test fraction and evaluation mode (with its evaluation dataset).

    Raises:
        ConfigError: what is wrong, and what is allowed.
    """
    if not has_loader(spec.name):
        raise ConfigError(
            f"unknown dataset {spec.name!r}; choose one of: {', '.join(dataset_names())}",
            field="dataset.name",
        )
    if not 0.0 < spec.test_fraction < 1.0:
        raise ConfigError(
            f"test_fraction must be strictly between 0 and 1; got {spec.test_fraction}",
            field="dataset.test_fraction",
        )
    mode = spec.evaluation
    if mode not in EVAL_MODES:
        raise ConfigError(
            f"unknown evaluation mode {mode!r}; choose one of: {', '.join(EVAL_MODES)}",
            field="eval.mode",
        )
    if mode == "public" and spec.eval_dataset is None:
        raise ConfigError(
            "eval mode public needs the public evaluation dataset (eval.dataset)",
            field="eval.dataset",
        )
    if mode != "public" and spec.eval_dataset is not None:
        raise ConfigError(
            f"an evaluation dataset applies to eval mode public only, not {mode}",
            field="eval.dataset",
        )


@dataclass(frozen=True)
class _Labels:
    """The records' labels encoded: the class names, canonical label to class index, each
    record's class index, and the class list the dataset declares (or the records' own)."""

    classes: list[str]
    index: dict[bytes, int]
    y: np.ndarray
    declared: tuple[str, ...]


def _encode_labels(raw: RawData, spec: DatasetSpec) -> _Labels:
    """Each record's class index: by the declared class list when there is one (module
    docstring), else by the records' sorted distinct labels.

    Raises:
        DatasetError: fewer than two classes; a record whose label is not declared.
    """
    labels, inverse = np.unique(raw.y, return_inverse=True)
    inverse = inverse.reshape(-1)
    if spec.classes is None:
        # Local use (a built-in, a file given by path): the records' sorted distinct labels.
        classes = [str(c) for c in labels]
        # Labels agree across formats as they do for the identity: 1, 1.0 and "1" are one
        # class (the first spelling's index, for mode public's evaluation labels).
        canonical = _canonical_labels(labels)
        index: dict[bytes, int] = {}
        for i, c in enumerate(canonical):
            index.setdefault(c, i)
        y = inverse
        declared = _names(canonical)
    else:
        # A stored file: its declared list, never what the records hold (module docstring).
        classes = list(spec.classes)
        index = _declared_index(spec.classes)
        y = _encode(labels, inverse, index)
        declared = tuple(spec.classes)
    if len(classes) < 2:
        declares = "declares" if spec.classes is not None else "has"
        raise DatasetError(
            f"dataset {spec.name!r} ({spec.path or 'built-in'}) {declares} fewer than two classes"
        )
    return _Labels(classes, index, y, declared)


class _Sides(NamedTuple):
    """Training and evaluation inputs and labels, with each row's dense unit id (None
    without a unit; the evaluation side's also in mode ``public``: another dataset's)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_eval: np.ndarray
    y_eval: np.ndarray
    units_train: np.ndarray | None = None
    units_eval: np.ndarray | None = None


def _training_and_evaluation(
    spec: DatasetSpec, raw: RawData, x: np.ndarray, labels: _Labels
) -> _Sides:
    """Training and evaluation records, by ``spec.evaluation``: every record and the public
    evaluation dataset's, a keyed split (``dp``), or a seeded one (``carve-out``); by unit
    when the records have units (:func:`workers.datasets.splits.split_rows`)."""
    y = labels.y
    keys = None if raw.units is None else unit_keys(raw.units)
    if spec.evaluation == "public":
        assert spec.eval_dataset is not None
        x_eval, y_eval = _public_eval_records(
            spec.eval_dataset,
            raw,
            x,
            labels.index,
            len(labels.classes),
            bounds=spec.input_bounds is not None,
        )
        return _Sides(x, y, x_eval, y_eval, None if keys is None else dense_ids(keys))
    train_idx, test_idx = split_rows(spec, raw, y, keys)
    sides = _Sides(x[train_idx], y[train_idx], x[test_idx], y[test_idx])
    if keys is None:
        return sides
    return sides._replace(
        units_train=dense_ids([keys[i] for i in train_idx]),
        units_eval=dense_ids([keys[i] for i in test_idx]),
    )


def with_declarations(spec: DatasetSpec) -> DatasetSpec:
    """``spec`` with what a shared set's descriptor declares (its size, number of units,
    class list and input bounds: :class:`workers.datasets.descriptors.DatasetDescriptor`)
    filled in where the spec sets none, so that plans and the label encoding come from the
    set's public description, never from counting its records (a spec's own
    ``input_bounds`` take precedence)."""
    d = DATASET_DESCRIPTORS.get(spec.name)
    if d is None or not d.shared:
        return spec
    return replace(
        spec,
        declared_size=spec.declared_size if spec.declared_size is not None else d.size,
        declared_units=spec.declared_units if spec.declared_units is not None else d.units,
        classes=spec.classes if spec.classes is not None else d.classes,
        input_bounds=spec.input_bounds if spec.input_bounds is not None else d.input_bounds,
    )


def class_names(labels: np.ndarray) -> tuple[str, ...]:
    """The class list an upload or registration declares for records with these labels
    (:attr:`DatasetSpec.classes`): their distinct labels as canonical names, in the order an
    undeclared load encodes them (sorted, as :func:`numpy.unique`).

    A canonical name is a label's canonical form (:func:`workers.datasets.identity.
    _canonical_labels`, the one the identity hashes): a number as the shortest form of its
    value (``1``, ``1.0`` and ``"1"`` give ``"1"``), text stripped. Labels that spell one
    class differently are one class (the first's place); otherwise the declared list encodes
    the records exactly as an undeclared load does (same indices, same count).

    Computed from the records: call it where their owner acts on them (an upload, a
    registration), never for a load whose outputs an analyst receives.
    """
    return _names(_canonical_labels(np.unique(np.asarray(labels))))


def _names(canonical: list[bytes]) -> tuple[str, ...]:
    """Canonical labels as names (text without its ``s:`` tag), duplicates dropped."""
    seen: dict[bytes, None] = dict.fromkeys(canonical)
    return tuple(c[2:].decode() if c.startswith(b"s:") else c.decode() for c in seen)


# A number's canonical name that is an integer (kept exact: an int64 label above 2**53 does
# not survive a float).
_INTEGER = re.compile(r"[+-]?[0-9]+")


def _declared_key(name: str) -> bytes:
    """The canonical label (:func:`_canonical_labels`) a declared class name stands for: the
    inverse of :func:`class_names`' naming, so a name it gave matches its labels exactly."""
    text = name.strip()
    try:
        number = float(text)
    except ValueError:
        return b"s:" + text.encode()
    if not math.isfinite(number):
        return b"s:" + text.encode()  # "inf" and "nan" are text labels (as the identity has it)
    if _INTEGER.fullmatch(text):
        return str(int(text)).encode()
    return _canonical_number(number)


def _declared_index(classes: tuple[str, ...]) -> dict[bytes, int]:
    """Canonical label to class index of a declared class list.

    Raises:
        DatasetError: two names of one class (``1`` and ``1.0``), by their places in the
            list, not their names: analysts may read the message.
    """
    index: dict[bytes, int] = {}
    for i, name in enumerate(classes):
        key = _declared_key(str(name))
        if key in index:
            raise DatasetError(
                f"the declared classes name one class twice (classes {index[key]} and {i}); "
                "declare each class once"
            )
        index[key] = i
    return index


def _encode(labels: np.ndarray, inverse: np.ndarray, index: dict[bytes, int]) -> np.ndarray:
    """Each record's class index under a declared list (``labels``, ``inverse``: the records'
    distinct labels and each record's place among them).

    Raises:
        DatasetError: a record's label is not declared. It names no label, row or count:
            the analyst may read it, and any of them would be the private records'.
    """
    lut = np.asarray([index.get(c, -1) for c in _canonical_labels(labels)], dtype=np.int64)
    if len(lut) and int(lut.min()) < 0:
        # Only a file edited after it was stored gets here: the list was computed from it.
        raise DatasetError(
            "a record's label is not one of the dataset's declared classes (its file changed "
            "after it was uploaded or registered); its owner uploads or registers it again"
        )
    return lut[inverse]


def dataset_content_sha256(spec: DatasetSpec) -> str:
    """The identity (:func:`content_sha256`) of the records ``spec`` names, without splitting
    or scaling them.

    The identity hashes features and labels only: a declared privacy unit (read, and
    checked, like every load's) is not part of it.

    Raises:
        ConfigError: unknown dataset name.
        DatasetError: a missing or malformed file, NaN / inf values, or a privacy unit the
            format cannot read.
    """
    if not has_loader(spec.name):
        raise ConfigError(
            f"unknown dataset {spec.name!r}; choose one of: {', '.join(dataset_names())}",
            field="dataset.name",
        )
    return content_sha256(read_records(spec))
