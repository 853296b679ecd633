"""What datasets are made of: the spec of what to load, a loader's raw arrays, the split result.

:class:`DatasetSpec` says what to load and how to split it, :class:`RawData` is what a loader
returns (see :mod:`workers.datasets.registry`), and :class:`Dataset` is the split, normalised
result of :func:`workers.datasets.loading.load_dataset`. This module needs numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from workers.datasets.input_transform import InputTransform

Kind = Literal["image", "tabular", "tokens"]
#: How evaluation records are separated from training records (see the module docstring).
EVAL_MODES = ("carve-out", "public", "dp")


@dataclass(frozen=True)
class DatasetSpec:
    """What to load and how to split it.

    Args:
        name: registry name (``digits``, ``breast_cancer``, ``wine``, ``synthetic``, ``idx``,
            ``npz``, ``csv``, ``image_folder``, ``text_csv``).
        path: data file for ``idx`` (images), ``npz``, ``csv`` and ``text_csv``; the folder
            for ``image_folder``.
        labels_path: labels file for ``idx``.
        label_column: label column for ``csv`` and ``text_csv``.
        test_fraction: share of the examples held out as the evaluation split (modes
            ``carve-out`` and ``dp``; unused in mode ``public``).
        split_seed: seed of the train/test split (the key of the split in mode ``dp``);
            shared by every trial of a sweep.
        options: loader-specific options (for ``synthetic``: ``n_samples``, ``n_features``,
            ``n_classes``, ``n_informative``, ``seed``).
        input_bounds: bounds ``(lo, hi)`` of every raw input value, declared by the data owner;
            values outside are clipped. None: scale by the file format or public statistics.
        feature_clip: tabular features scaled by public statistics are clipped to
            ``[-feature_clip, feature_clip]``.
        evaluation: ``carve-out`` (a held-out split treated as public), ``public`` (every
            record trains; ``eval_dataset`` evaluates) or ``dp`` (a content-keyed held-out
            split that stays private). See :mod:`workers.datasets.loading`.
        eval_dataset: mode ``public``: the worker spec of the public evaluation dataset
            (loaded with its own loader; its split and scaling settings are not used).
        declared_size: the number of private records its owner declared public (a stored
            dataset's view); the sample rate, step count and the noisy accuracy's denominator
            come from it, never from counting the records. None: counted (local use).
        classes: the dataset's declared classes in their encoding order (class ``i`` is
            label ``classes[i]``), as canonical names
            (:func:`workers.datasets.loading.class_names`). Set, they fix the label encoding
            and the class count whatever labels the records hold: both are shown and shape
            the model's output layer, so they must come from the dataset's registered
            description, not from the private records (without a declaration, a neighbouring
            dataset lacking the only record of a class has one class fewer, and every later
            class another index). Stored files (uploads, registered names) carry the list
            computed at upload or registration. None: the sorted distinct labels of the
            records (built-ins, local files given by path, rows stored before declarations).
        privacy_unit: the column (``csv``, ``text_csv``) or array (``npz``) naming whose each
            row is; never a feature (:mod:`workers.units`). None: each row is its own unit,
            unless the loader has built-in units (``mnist1d-people``: ``person``). A name the
            loader cannot find, or another name than a built-in's, is a DatasetError.
        declared_units: the number of privacy units its owner declared public (a stored
            dataset's view): with a unit, the sample rate, the step count and DP evaluation's
            denominators come from it, as ``declared_size`` gives them without one. None:
            counted (local use).
        tune_datasets: the public datasets arms tune on before the private grid (an arm's
            ``tune_on``), as ``(name, worker spec)`` pairs, resolved where this spec is
            (:func:`sweeper.datasets.resolution.resolve`); only the planner reads them, workers
            never do.
    """

    name: str
    path: str | None = None
    labels_path: str | None = None
    label_column: str | None = None
    test_fraction: float = 0.2
    split_seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    input_bounds: tuple[float, float] | None = None
    feature_clip: float = 5.0
    evaluation: str = "carve-out"
    eval_dataset: DatasetSpec | None = None
    declared_size: int | None = None
    classes: tuple[str, ...] | None = None
    privacy_unit: str | None = None
    declared_units: int | None = None
    tune_datasets: tuple[tuple[str, DatasetSpec], ...] = ()


@dataclass
class RawData:
    """What a loader returns before splitting and normalisation.

    ``x`` keeps the file's dtype (uint8 stays uint8, floats stay as read): casting to float32
    before scaling would turn a finite extreme value into inf. Images are ``[N, H, W]`` or
    ``[N, C, H, W]``; kind ``tokens`` holds int64 token ids ``[N, T]`` (0 pads, 1 is unknown).
    """

    x: np.ndarray
    y: np.ndarray
    kind: Kind
    # Constant that maps pixels to [0, 1] (from the format, never from the data).
    pixel_max: float | None = None
    # For messages about bad values: the CSV line of each row and the feature column names.
    lines: list[int] | None = None
    columns: list[str] | None = None
    # Kind ``tokens``: the text of each record as read. The identity and the keyed split hash
    # it rather than the ids, so that the same records tokenized by another (public)
    # tokenizer are the same records, with one ledger.
    texts: list[str] | None = None
    # Kind ``tokens``: every id is below it (the public tokenizer's size, pad and unknown
    # included), and a public description of the tokenization (the tokenizer file's hash and
    # the length) that a public evaluation dataset must share.
    vocab_size: int | None = None
    encoding: str | None = None
    # With a privacy unit: each row's unit, as read (ints or strings, one per row; the
    # column itself is not in ``x``), and the unit's name (the column's, or a built-in's).
    units: np.ndarray | None = None
    privacy_unit: str | None = None


@dataclass
class Dataset:
    """A split, normalised dataset ready for training.

    ``x_*`` are float32 arrays shaped ``[N, *input_shape]``, every value inside
    ``input_scaling["clip"]``; ``y_*`` are int64 class indices. Images always carry a channel
    axis (``[C, H, W]``). Kind ``tokens``: ``x_*`` are int64 token ids ``[N, T]`` below
    ``vocab_size`` (0 pads, 1 is an unknown token), not scaled. ``input_scaling`` says how
    inputs were scaled (method, clip range, source); it holds no record's values and nothing
    computed from the training split, so it may be shown with the plan.

    ``content_sha256`` is the data's identity (:func:`content_sha256`): a hash of all its
    records, the same whatever the file's name, path, format or row order. It is the key of
    the dataset's privacy ledger. It holds no record's value, but it is still a deterministic
    function of every record: someone who knows all records but one could test guesses of
    the last one against it. Show it to the operator and the data owner only, never to
    analysts with released results. In mode ``public`` it is the identity of the private
    (training) records only, never of the public evaluation dataset.

    ``evaluation`` is the mode the records were separated by (``carve-out``, ``public``,
    ``dp``): in mode ``public`` ``x_test`` holds the public dataset's records, and
    :attr:`n_private` counts the training records only.
    """

    name: str
    kind: Kind
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    classes: list[str]
    input_scaling: dict[str, Any] = field(default_factory=dict)
    #: The transform that scaled the inputs (None: token ids), with whether it may travel
    #: with a kept model (:mod:`workers.datasets.input_transform`). Never in a plan or card.
    input_transform: InputTransform | None = None
    content_sha256: str = ""
    evaluation: str = "carve-out"
    #: Kind ``tokens``: the embedding size a model needs (the public tokenizer's); else None.
    vocab_size: int | None = None
    #: The class list an upload or registration declares for these records
    #: (:attr:`DatasetSpec.classes`): the spec's when it declares one, else the canonical
    #: names of the records' distinct labels (:func:`workers.datasets.loading.class_names`).
    #: It equals ``classes`` in length and order unless two labels spell one class
    #: differently (``"1"`` and ``"1.0"``), which a declared list merges.
    declared_classes: tuple[str, ...] = ()
    #: The number of private records its owner declared (``DatasetSpec.declared_size``);
    #: None: sizes are counted from the records (local use).
    declared_size: int | None = None
    #: The share of records held out for evaluation (modes ``carve-out`` and ``dp``).
    test_fraction: float = 0.2
    #: The privacy unit's name (None: example-level, each row its own unit).
    privacy_unit: str | None = None
    #: With a unit: each training row's unit, dense ids ``0 .. n_units_train - 1`` (int64,
    #: ``[n_train]``); each evaluation row's, ``0 .. n_units_test - 1`` (``[n_test]``; None in
    #: mode ``public``, whose evaluation records are another dataset's). No unit is on both
    #: sides of the split. Private: never shown, counted or logged.
    units_train: np.ndarray | None = None
    units_test: np.ndarray | None = None
    #: The number of units its owner declared (``DatasetSpec.declared_units``); None: counted.
    declared_units: int | None = None

    @property
    def has_units(self) -> bool:
        """Whether a privacy unit other than the row is declared."""
        return self.privacy_unit is not None

    @property
    def n_units_train(self) -> int:
        """The training units' number as counted (private; the engine samples over it)."""
        if self.units_train is None:
            return self.n_train
        return int(self.units_train.max()) + 1 if len(self.units_train) else 0

    @property
    def n_units_test(self) -> int:
        """The evaluation units' number as counted (private)."""
        if self.units_test is None:
            return int(self.x_test.shape[0])
        return int(self.units_test.max()) + 1 if len(self.units_test) else 0

    @property
    def planning_n_eval(self) -> int:
        """The evaluation units' number as plans and releases use it (rows without a unit):
        the declared number's share when one is declared (the records' own count is
        private), else the count."""
        declared = self.declared_units if self.has_units else self.declared_size
        if self.evaluation == "public":
            return int(self.x_test.shape[0])
        if declared is None:
            return self.n_units_test
        return max(1, round(declared * self.test_fraction))

    @property
    def planning_n_train(self) -> int:
        """The training units' number as plans use it (q = b / n, T; rows without a unit):
        from the declared number when there is one, never from the records, so that
        neighbouring datasets with one declaration get the same q, T and sigma; else the
        count."""
        declared = self.declared_units if self.has_units else self.declared_size
        if declared is None:
            return self.n_units_train
        if self.evaluation == "public":
            return declared
        return max(1, declared - self.planning_n_eval)

    @property
    def planning_n_private(self) -> int:
        """N as plans use it (delta's bound), in units: the declared number, else the count."""
        declared = self.declared_units if self.has_units else self.declared_size
        if declared is not None:
            return declared
        if not self.has_units:
            return self.n_private
        return self.n_units_train + (0 if self.evaluation == "public" else self.n_units_test)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.x_train.shape[1:])

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def n_private(self) -> int:
        """How many records of the (private) dataset were loaded: training plus carved-out
        evaluation records; in mode ``public`` the training records only (the evaluation
        records are another, public, dataset's)."""
        n_eval = 0 if self.evaluation == "public" else int(self.x_test.shape[0])
        return self.n_train + n_eval


# Records are converted (identity hash, keyed split) and scaled in chunks of about this many
# values, so the float64 working copy stays small (~32 MiB) whatever the size of the dataset.
_CHUNK_VALUES = 1 << 22
