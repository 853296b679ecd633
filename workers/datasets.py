"""Datasets registry: built-in sets and loaders for files a user already has.

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

Privacy note on normalisation: preprocessing must not depend on the *private* training split,
otherwise the released model leaks statistics that no noise covers. And every scaled input must
be *bounded*: DP-SGD bounds a record's gradient by clipping, but a record whose features are
huge can still overflow float32 and turn a whole trial into NaN, so whether a trial fails would
reveal whether that record is in the data. Inputs are therefore scaled in float64 by rules that
use no training record, then clipped to a fixed range, then cast to float32:

1. bounds declared by the data owner (``input_bounds``): clip to them, map to [0, 1] (images)
   or [-1, 1] (tabular);
2. images with a known pixel format (``pixel_max``: 255 for uint8, 16 for digits): divide, clip
   to [0, 1];
3. other float images: a robust range from the public evaluation records (the carve-out or
   the public evaluation dataset; refused in mode ``dp``), clip to [0, 1];
4. other tabular data: robust standardisation (median, IQR) from the public evaluation
   records (likewise; refused in mode ``dp``), clip to [-feature_clip, feature_clip].

Robust statistics keep one extreme *evaluation* record from squashing every feature to ~0.
Non-finite values (NaN, inf) are refused with their positions, for the data owner to fix.

This module needs numpy (and scikit-learn for the built-in sets) but not torch.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from workers.errors import ConfigError, DatasetError

Kind = Literal["image", "tabular"]
#: How evaluation records are separated from training records (see the module docstring).
EVAL_MODES = ("carve-out", "public", "dp")


@dataclass(frozen=True)
class DatasetSpec:
    """What to load and how to split it.

    Args:
        name: registry name (``digits``, ``breast_cancer``, ``wine``, ``synthetic``, ``idx``,
            ``npz``, ``csv``).
        path: data file for ``idx`` (images), ``npz`` and ``csv``.
        labels_path: labels file for ``idx``.
        label_column: label column for ``csv``.
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
            split that stays private). See the module docstring.
        eval_dataset: mode ``public``: the worker spec of the public evaluation dataset
            (loaded with its own loader; its split and scaling settings are not used).
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


@dataclass
class RawData:
    """What a loader returns before splitting and normalisation.

    ``x`` keeps the file's dtype (uint8 stays uint8, floats stay as read): casting to float32
    before scaling would turn a finite extreme value into inf.
    """

    x: np.ndarray
    y: np.ndarray
    kind: Kind
    # Constant that maps pixels to [0, 1] (from the format, never from the data).
    pixel_max: float | None = None
    # For messages about bad values: the CSV line of each row and the feature column names.
    lines: list[int] | None = None
    columns: list[str] | None = None


@dataclass
class Dataset:
    """A split, normalised dataset ready for training.

    ``x_*`` are float32 arrays shaped ``[N, *input_shape]``, every value inside
    ``input_scaling["clip"]``; ``y_*`` are int64 class indices. Images always carry a channel
    axis (``[C, H, W]``). ``input_scaling`` says how inputs were scaled (method, clip range,
    source); it holds no record's values and nothing computed from the training split, so it
    may be shown with the plan.

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
    content_sha256: str = ""
    evaluation: str = "carve-out"

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


Loader = Callable[[DatasetSpec], RawData]
DATASETS: dict[str, Loader] = {}


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    """Register a loader under ``name`` (a stable contract: names are stored in the database)."""

    def deco(fn: Loader) -> Loader:
        if name in DATASETS:
            raise ValueError(f"dataset {name!r} is registered twice")
        DATASETS[name] = fn
        return fn

    return deco


def dataset_names() -> list[str]:
    return sorted(DATASETS)


# --------------------------------------------------------------------------------------------
# Built-in sets (bundled with scikit-learn, no download).


@register_dataset("digits")
def _digits(spec: DatasetSpec) -> RawData:
    from sklearn.datasets import load_digits

    d = load_digits()
    # 8x8 images with intensities 0..16 (a property of the data set's format).
    return RawData(x=d.images, y=d.target, kind="image", pixel_max=16.0)


@register_dataset("breast_cancer")
def _breast_cancer(spec: DatasetSpec) -> RawData:
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    return RawData(x=d.data, y=d.target, kind="tabular")


@register_dataset("wine")
def _wine(spec: DatasetSpec) -> RawData:
    from sklearn.datasets import load_wine

    d = load_wine()
    return RawData(x=d.data, y=d.target, kind="tabular")


_SYNTHETIC_DEFAULTS: dict[str, int] = {
    "n_samples": 2000,
    "n_features": 20,
    "n_informative": 10,
    "n_classes": 4,
    "seed": 0,
}


@register_dataset("synthetic")
def _synthetic(spec: DatasetSpec) -> RawData:
    from sklearn.datasets import make_classification

    unknown = set(spec.options) - set(_SYNTHETIC_DEFAULTS)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {sorted(unknown)} for dataset 'synthetic'; "
            f"allowed: {sorted(_SYNTHETIC_DEFAULTS)}",
            field="dataset.options",
        )
    o = {**_SYNTHETIC_DEFAULTS, **spec.options}
    try:
        x, y = make_classification(
            n_samples=int(o["n_samples"]),
            n_features=int(o["n_features"]),
            n_informative=int(o["n_informative"]),
            n_redundant=0,
            n_classes=int(o["n_classes"]),
            random_state=int(o["seed"]),
        )
    except ValueError as exc:
        raise ConfigError(f"invalid options for dataset 'synthetic': {exc}") from exc
    return RawData(x=x, y=y, kind="tabular")


# --------------------------------------------------------------------------------------------
# Loaders for the user's own files.


def _require_path(spec: DatasetSpec, attr: str, what: str) -> Path:
    value = getattr(spec, attr)
    if not value:
        raise ConfigError(f"dataset {spec.name!r} needs {attr} ({what})", field=f"dataset.{attr}")
    path = Path(value)
    if not path.is_file():
        raise DatasetError(f"{path}: file not found ({what} for dataset {spec.name!r})")
    return path


_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: Path) -> np.ndarray:
    """Read an MNIST-format IDX file, plain or gzip-compressed.

    Raises:
        DatasetError: naming the file and what is wrong with it.
    """
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DatasetError(f"{path}: corrupt gzip stream ({exc})") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DatasetError(
            f"{path}: not an IDX file (the magic number must start with two zero bytes)"
        )
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise DatasetError(f"{path}: unknown IDX data type code 0x{code:02x}")
    if ndim == 0:
        raise DatasetError(f"{path}: IDX file declares zero dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: truncated IDX header")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DatasetError(
            f"{path}: IDX header declares shape {dims} ({expected} data bytes) "
            f"but the file holds {len(raw) - header}"
        )
    return (
        np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))
    )


@register_dataset("idx")
def _idx(spec: DatasetSpec) -> RawData:
    images = read_idx(_require_path(spec, "path", "IDX images file"))
    labels_path = _require_path(spec, "labels_path", "IDX labels file")
    labels = read_idx(labels_path)
    if images.ndim not in (2, 3, 4):
        raise DatasetError(
            f"{spec.path}: IDX images must be [N, H, W] or [N, D]; got {images.shape}"
        )
    if labels.ndim != 1:
        raise DatasetError(f"{labels_path}: IDX labels must be one-dimensional; got {labels.shape}")
    if len(labels) != len(images):
        raise DatasetError(
            f"{labels_path}: {len(labels)} labels for {len(images)} images in {spec.path}"
        )
    is_image = images.ndim >= 3
    pixel_max = float(np.iinfo(images.dtype).max) if images.dtype == np.uint8 else None
    return RawData(
        x=images,
        y=labels,
        kind="image" if is_image else "tabular",
        pixel_max=pixel_max,
    )


@register_dataset("npz")
def _npz(spec: DatasetSpec) -> RawData:
    path = _require_path(spec, "path", "NPZ file with arrays 'x' and 'y'")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = {"x", "y"} - set(z.files)
            if missing:
                raise DatasetError(
                    f"{path}: NPZ file lacks array(s) {sorted(missing)}; it must hold 'x' "
                    f"(features or images) and 'y' (labels); found {sorted(z.files)}"
                )
            x, y = z["x"], z["y"]
    except DatasetError:
        raise
    except Exception as exc:  # np.load raises several unrelated types on bad files
        raise DatasetError(f"{path}: not a readable NPZ file ({exc})") from exc
    if y.ndim != 1 or len(y) != len(x):
        raise DatasetError(
            f"{path}: 'y' must be one label per row of 'x'; got x{x.shape}, y{y.shape}"
        )
    if x.ndim < 2:
        raise DatasetError(f"{path}: 'x' must be [N, D] or images [N, H, W] / [N, C, H, W]")
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise DatasetError(f"{path}: 'x' must be real numbers; got dtype {x.dtype}")
    pixel_max = 255.0 if x.dtype == np.uint8 else None
    return RawData(
        x=x,
        y=y,
        kind="image" if x.ndim >= 3 else "tabular",
        pixel_max=pixel_max,
    )


@register_dataset("csv")
def _csv(spec: DatasetSpec) -> RawData:
    path = _require_path(spec, "path", "CSV file with a header row")
    if not spec.label_column:
        raise ConfigError(
            "dataset 'csv' needs label_column (the name of the label column)",
            field="dataset.label_column",
        )
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not a text CSV file ({exc})") from exc
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise DatasetError(f"{path}: empty CSV file") from None
    header = [h.strip() for h in header]
    if spec.label_column not in header:
        raise DatasetError(f"{path}: no column named {spec.label_column!r}; columns are {header}")
    li = header.index(spec.label_column)
    rows_x: list[list[float]] = []
    labels: list[str] = []
    lines: list[int] = []
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise DatasetError(
                f"{path}: line {lineno} has {len(row)} fields, header has {len(header)}"
            )
        label = row[li].strip()
        if not label or (_is_float(label) and not np.isfinite(float(label))):
            # An empty or NaN label is a missing value, not a class of its own.
            raise DatasetError(
                f"{path}: line {lineno}: missing label ({row[li]!r}) in column "
                f"{spec.label_column!r}; give every row a label or drop the row"
            )
        labels.append(label)
        lines.append(lineno)
        try:
            rows_x.append([float(c) for j, c in enumerate(row) if j != li])
        except ValueError:
            bad = next(c for j, c in enumerate(row) if j != li and not _is_float(c))
            raise DatasetError(
                f"{path}: line {lineno}: non-numeric feature value {bad!r}"
            ) from None
    if not rows_x:
        raise DatasetError(f"{path}: no data rows")
    if len(header) < 2:
        raise DatasetError(
            f"{path}: needs at least one feature column besides {spec.label_column!r}"
        )
    # float64: a value such as 1e300 is finite here (it would be inf in float32).
    return RawData(
        x=np.asarray(rows_x, dtype=np.float64),
        y=np.asarray(labels),
        kind="tabular",
        lines=lines,
        columns=[h for j, h in enumerate(header) if j != li],
    )


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Content identity.

# Names the canonical form below; a new form gets a new tag, so identities of two forms can
# never be mistaken for each other (and a ledger keyed by an old one is not silently reused).
_IDENTITY_TAG = b"dpsweep-dataset-content-v1\0"


def content_sha256(raw: RawData) -> str:
    """The identity of a dataset's records: a SHA-256 over all of them, as lowercase hex.

    Two files hold the same records when they give the same identity, whatever their name,
    path, format (CSV, NPZ, IDX) or row order. The privacy ledger is keyed by it: ε spent on
    records is spent whatever name they were registered under, so the same records uploaded
    again or registered under another name must find the same ledger.

    Canonical form of a record: its inputs as little-endian float64 (``-0.0`` as ``0.0``; a
    uint8 pixel and the float 3.0 agree), followed by its label canonicalised so that ``1``,
    ``1.0`` and ``"1"`` agree (:func:`_canonical_labels`). Each record is hashed on its own;
    the digests are sorted (a multiset: duplicates count) and hashed together with the
    record shape (as trained: images with their channel axis) and the number of records.
    Call it after the finite check and before the split and the scaling (which depend on the
    spec, not on the records).

    The result holds no record's value, but it is a deterministic function of every record:
    see :class:`Dataset` on who may see it.

    Args:
        raw: What a loader returned.

    Returns:
        64 hex digits.
    """
    x = raw.x
    n = len(x)
    shape = tuple(int(s) for s in x.shape[1:])
    if raw.kind == "image" and x.ndim == 3:
        shape = (1, *shape)  # load_dataset adds this channel axis: [H, W] and [1, H, W] agree
    sha = hashlib.sha256
    digests: list[bytes] = []
    for inputs, label in _canonical_records(raw):
        h = sha(inputs)
        # Every row has the same length, so inputs || label is unambiguous.
        h.update(label)
        digests.append(h.digest())
    digests.sort()
    total = sha(_IDENTITY_TAG)
    total.update(repr(shape).encode() + b"\0" + n.to_bytes(8, "little"))
    total.update(b"".join(digests))
    return total.hexdigest()


def _canonical_records(raw: RawData) -> Iterator[tuple[memoryview, bytes]]:
    """Each record in its canonical form (see :func:`content_sha256`), in file order: its
    inputs as little-endian float64 bytes (``-0.0`` as ``0.0``) and its canonical label.

    Converted in chunks of about ``_CHUNK_VALUES`` values; the caller's array is not touched.
    """
    x = raw.x
    n = len(x)
    labels = _canonical_labels(raw.y)
    flat = x.reshape(n, -1)
    width = flat.shape[1] if flat.ndim == 2 else 0
    row_bytes = 8 * width
    step = max(1, _CHUNK_VALUES // max(1, width))
    for start in range(0, n, step):
        # astype always copies: the canonicalisation below must not touch the caller's array.
        chunk = flat[start : start + step].astype("<f8")
        chunk += 0.0  # -0.0 + 0.0 == +0.0: one byte form per number
        buf = memoryview(chunk.reshape(-1).view(np.uint8).tobytes())
        for j in range(len(chunk)):
            yield buf[j * row_bytes : (j + 1) * row_bytes], labels[start + j]


def _canonical_labels(y: np.ndarray) -> list[bytes]:
    """Each label as bytes that agree across formats: numbers as the shortest form of their
    value (``1``, ``1.0``, ``"1"``, ``" 1.0 "`` all give ``b"1"``; ``0.5`` gives ``b"0.5"``),
    other text stripped. A text label is never the canonical form of a number (that would
    parse), so a class named ``"1"`` cannot collide with a class named ``"one"``."""
    if y.dtype.kind in "biu":
        return [str(int(v)).encode() for v in y.tolist()]
    if y.dtype.kind == "f":
        return [_canonical_number(float(v)) for v in y.tolist()]
    out: list[bytes] = []
    for v in y.tolist():
        text = (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)).strip()
        try:
            number = float(text)
        except ValueError:
            out.append(b"s:" + text.encode())
            continue
        out.append(_canonical_number(number) if math.isfinite(number) else b"s:" + text.encode())
    return out


def _canonical_number(v: float) -> bytes:
    if v == 0.0:
        return b"0"  # also -0.0
    if v.is_integer():
        return str(int(v)).encode()
    return repr(v).encode()


def dataset_content_sha256(spec: DatasetSpec) -> str:
    """The identity (:func:`content_sha256`) of the records ``spec`` names, without splitting
    or scaling them.

    Raises:
        ConfigError: unknown dataset name.
        DatasetError: a missing or malformed file, or NaN / inf values.
    """
    if spec.name not in DATASETS:
        raise ConfigError(
            f"unknown dataset {spec.name!r}; choose one of: {', '.join(dataset_names())}",
            field="dataset.name",
        )
    raw = DATASETS[spec.name](spec)
    _check_finite(raw, spec)
    return content_sha256(raw)


# --------------------------------------------------------------------------------------------
# Splitting and normalisation.


# Rows are scaled in chunks of about this many values, so the float64 working copy stays small
# (~32 MiB) whatever the size of the dataset.
_CHUNK_VALUES = 1 << 22
# How many offending positions a refusal of non-finite values lists.
_SHOW_BAD = 5
_FLOAT_MAX = float(np.finfo(np.float64).max)


def load_dataset(spec: DatasetSpec) -> Dataset:
    """Load, split and normalise a dataset.

    How evaluation records are separated from training records follows ``spec.evaluation``
    (module docstring): ``carve-out`` splits by a seeded shuffle (``spec.split_seed``),
    ``dp`` by a keyed hash of each record's content (:func:`_keyed_split`), and ``public``
    trains on every record and evaluates on ``spec.eval_dataset``.

    Raises:
        ConfigError: unknown name or invalid settings (the message lists what is allowed); in
            mode ``dp``, inputs that only public statistics could scale; in mode ``public``,
            an evaluation dataset of another kind or input shape.
        DatasetError: a missing or malformed file, or NaN / inf values (the message names the
            file and where the values are); a split that leaves a side empty; in mode
            ``public``, evaluation labels that are not training classes.
    """
    if spec.name not in DATASETS:
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
    raw = DATASETS[spec.name](spec)
    _check_finite(raw, spec)
    # The identity is taken from the records as parsed, before the split and the scaling:
    # those depend on the spec (seed, fraction, bounds), the records do not.
    identity = content_sha256(raw)
    classes, y = np.unique(raw.y, return_inverse=True)
    if len(classes) < 2:
        raise DatasetError(
            f"dataset {spec.name!r} ({spec.path or 'built-in'}) has fewer than two classes"
        )
    x = raw.x
    if raw.kind == "image" and x.ndim == 3:
        x = x[:, None, :, :]  # add the channel axis
    if mode == "public":
        assert spec.eval_dataset is not None
        x_fit, y_fit = x, y
        x_eval, y_eval = _public_eval_records(
            spec.eval_dataset, raw, x, classes, bounds=spec.input_bounds is not None
        )
    else:
        if mode == "dp":
            train_idx, test_idx = _keyed_split(raw, spec.test_fraction, spec.split_seed)
        else:
            train_idx, test_idx = _split(len(x), y, spec.test_fraction, spec.split_seed)
        x_fit, y_fit = x[train_idx], y[train_idx]
        x_eval, y_eval = x[test_idx], y[test_idx]
    x_train, x_test, scaling = _normalise(raw, spec, x_fit, x_eval)
    return Dataset(
        name=spec.name,
        kind=raw.kind,
        x_train=x_train,
        y_train=y_fit.astype(np.int64),
        x_test=x_test,
        y_test=y_eval.astype(np.int64),
        num_classes=len(classes),
        classes=[str(c) for c in classes],
        input_scaling=scaling,
        content_sha256=identity,
        evaluation=mode,
    )


def _public_eval_records(
    eval_spec: DatasetSpec, raw: RawData, x: np.ndarray, classes: np.ndarray, *, bounds: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Mode ``public``: the records of the public evaluation dataset, with channel axis, and
    their labels as indices into the training ``classes``.

    Its kind and input shape must be the training data's (both are public: the model's input),
    and so must its pixel format unless ``bounds`` (declared ``input_bounds``) scale both.
    Messages never name a training label or class: those are the private data's.

    Raises:
        ConfigError: an unknown loader, or another kind, input shape or pixel format.
        DatasetError: a missing or malformed file, NaN / inf, no records, or labels that are
            not training classes.
    """
    if eval_spec.name not in DATASETS:
        raise ConfigError(
            f"unknown loader {eval_spec.name!r} for the evaluation dataset; choose one of: "
            f"{', '.join(dataset_names())}",
            field="eval.dataset",
        )
    where = eval_spec.path or f"built-in dataset {eval_spec.name!r}"
    pub = DATASETS[eval_spec.name](eval_spec)
    _check_finite(pub, eval_spec)
    if len(pub.x) < 1:
        raise DatasetError(f"evaluation dataset {where}: no records")
    if pub.kind != raw.kind:
        raise ConfigError(
            f"the evaluation dataset holds {pub.kind} records but the training dataset "
            f"{raw.kind} records; evaluate on a dataset of the same kind",
            field="eval.dataset",
        )
    x_pub = pub.x
    if pub.kind == "image" and x_pub.ndim == 3:
        x_pub = x_pub[:, None, :, :]
    if x_pub.shape[1:] != x.shape[1:]:
        raise ConfigError(
            f"the evaluation dataset's records have input shape {tuple(x_pub.shape[1:])} but "
            f"the training dataset's {tuple(x.shape[1:])}; evaluate on records of the same "
            "shape (the model's input)",
            field="eval.dataset",
        )
    if raw.kind == "image" and not bounds and pub.pixel_max != raw.pixel_max:
        # Both splits are scaled by one rule chosen from the training data's format: a pixel
        # constant that is not the evaluation data's would scale its records wrongly (declared
        # bounds apply to both alike).
        def fmt(p: float | None) -> str:
            return "no known pixel range" if p is None else f"pixel maximum {p:g}"

        raise ConfigError(
            f"the evaluation dataset's pixel format ({fmt(pub.pixel_max)}) is not the "
            f"training dataset's ({fmt(raw.pixel_max)}); store both in the same format (e.g. "
            "uint8), or declare dataset.input_bounds",
            field="eval.dataset",
        )
    # Labels agree across formats as they do for the identity: 1, 1.0 and "1" are one class.
    index: dict[bytes, int] = {}
    for i, c in enumerate(_canonical_labels(np.asarray(classes))):
        index.setdefault(c, i)
    mapped = [index.get(c, -1) for c in _canonical_labels(pub.y)]
    y_pub = np.asarray(mapped, dtype=np.int64)
    unknown = int(np.count_nonzero(y_pub < 0))
    if unknown:
        # Neither the training classes nor the offending labels are named: which labels are
        # missing from the training data would say which classes it has.
        raise DatasetError(
            f"evaluation dataset {where}: {unknown} of its {len(y_pub)} records have a label "
            f"that is not one of the training dataset's {len(classes)} classes; label the "
            "evaluation records with the training dataset's label values (same spelling), or "
            "drop records of other classes"
        )
    return x_pub, y_pub


def _check_finite(raw: RawData, spec: DatasetSpec) -> None:
    """Refuse NaN and inf in the inputs or labels, saying where they are.

    A non-finite value cannot be clipped to anything meaningful, and silently replacing it would
    hide a broken file; finite extremes (1e300) are accepted and clipped by :func:`_normalise`.
    The message is for the data owner, who may see their own rows.

    Raises:
        DatasetError: naming the file, how many values, and the first few positions.
    """
    where = spec.path or f"built-in dataset {spec.name!r}"
    for arr, what in ((raw.x, "input"), (raw.y, "label")):
        if not np.issubdtype(arr.dtype, np.inexact):
            continue  # integers and strings are always finite
        rows = arr.reshape(len(arr), -1)
        bad_rows = np.flatnonzero(~np.isfinite(rows).all(axis=1))
        if not len(bad_rows):
            continue
        count = int(np.count_nonzero(~np.isfinite(rows)))
        shown = []
        for r in bad_rows[:_SHOW_BAD]:
            c = int(np.flatnonzero(~np.isfinite(rows[r]))[0])
            shown.append(f"{_position(raw, arr, int(r), c, what)}: {rows[r, c]}")
        raise DatasetError(
            f"{where}: {count} non-finite {what} value(s) (NaN or inf) in {len(bad_rows)} "
            f"row(s), first at {'; '.join(shown)}. Replace them with finite numbers or drop "
            "those rows: dpsweep refuses NaN and inf (finite extreme values are clipped)"
        )


def _position(raw: RawData, arr: np.ndarray, row: int, col: int, what: str) -> str:
    """Where a value is, in the file's own terms (CSV line and column, or array index)."""
    if what == "input" and raw.lines is not None and raw.columns is not None:
        return f"line {raw.lines[row]}, column {raw.columns[col]!r}"
    if arr.ndim == 1:
        return f"row {row}"
    idx = tuple(int(i) for i in np.unravel_index(col, arr.shape[1:]))
    return f"row {row}, position {idx if len(idx) > 1 else idx[0]}"


def _split(n: int, y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    n_test = round(n * test_fraction)
    if n_test < 1 or n - n_test < 1:
        raise DatasetError(f"{n} examples cannot be split with test_fraction={test_fraction}")
    from sklearn.model_selection import train_test_split

    idx = np.arange(n)
    counts = np.bincount(y)
    # Stratify when every class can appear on both sides; it keeps small sets balanced.
    stratify = y if counts.min() >= 2 and n_test >= len(counts) else None
    train_idx, test_idx = train_test_split(
        idx, test_size=n_test, random_state=seed, shuffle=True, stratify=stratify
    )
    return np.sort(train_idx), np.sort(test_idx)


# The keyed split's hash: personalised, so its values are unrelated to any other use of the
# same bytes (content_sha256 uses SHA-256, unkeyed).
_KEYED_SPLIT_PERSON = b"dpsweep-evalsplt"


def _keyed_split(raw: RawData, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Mode ``dp``: each record's side from its own content and the public ``seed`` only.

    A record is an evaluation record iff ``BLAKE2b(key=seed)`` of its canonical form (the
    one :func:`content_sha256` hashes: float64 inputs and canonical label), read as a number
    in [0, 1), is below ``test_fraction``. Adding or removing a record therefore moves no
    other record across the split (neighbouring datasets differ in one record on one side),
    and equal records fall on the same side. The share of evaluation records is
    ``test_fraction`` only on average; classes are not stratified.

    Raises:
        DatasetError: either side empty, saying how to fix it.
    """
    key = str(int(seed)).encode()
    threshold = test_fraction * 2.0**64
    blake = hashlib.blake2b
    to_eval: list[bool] = []
    for inputs, label in _canonical_records(raw):
        h = blake(inputs, digest_size=8, key=key, person=_KEYED_SPLIT_PERSON)
        h.update(label)
        to_eval.append(int.from_bytes(h.digest(), "big") < threshold)
    mask = np.asarray(to_eval, dtype=bool).reshape(len(raw.x))
    test_idx, train_idx = np.flatnonzero(mask), np.flatnonzero(~mask)
    if len(test_idx) == 0 or len(train_idx) == 0:
        empty = "evaluation" if len(test_idx) == 0 else "training"
        raise DatasetError(
            f"eval mode dp splits each record by its own content: {len(mask)} records with "
            f"test_fraction={test_fraction} and split_seed={seed} leave no {empty} record; "
            "use more records, a test_fraction further from "
            f"{'0' if empty == 'evaluation' else '1'} or another dataset.split_seed"
        )
    return train_idx, test_idx


def _normalise(
    raw: RawData, spec: DatasetSpec, x_train: np.ndarray, x_test: np.ndarray
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Scale both splits by one rule that uses no training record, and bound the result.

    ``x_test`` holds the evaluation records: the public carve-out, the public evaluation
    dataset (mode ``public``) or private records (mode ``dp``, whose statistics are never
    used: only declared bounds or a pixel format may scale it).

    Returns:
        float32 ``x_train`` and ``x_test`` with every value inside ``scaling["clip"]``, and
        ``scaling``: the method, that clip range and where the scaling came from. It holds no
        record's values (only declared bounds or a format's constant), so it can be shown.

    Raises:
        ConfigError: ``input_bounds`` that are not two finite numbers lo < hi.
    """
    image = raw.kind == "image"
    out: tuple[float, float] = (0.0, 1.0) if image else (-1.0, 1.0)
    centre: float | np.ndarray
    scale: float | np.ndarray
    raw_clip: tuple[float, float] | None = None
    # Only constants that are no record's value: declared bounds or a format's pixel maximum.
    extra: dict[str, Any] = {}
    if spec.input_bounds is not None:
        lo, hi = (float(v) for v in spec.input_bounds)
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi and np.isfinite(hi - lo)):
            raise ConfigError(
                f"input_bounds must be two finite numbers [lo, hi] with lo < hi; got "
                f"{list(spec.input_bounds)}",
                field="dataset.input_bounds",
            )
        # Data-independent: clip to the owner's bounds, then map them onto the output range.
        raw_clip = (lo, hi)
        centre, scale = (lo, hi - lo) if image else (lo / 2 + hi / 2, (hi - lo) / 2)
        method, source, extra = "declared", "data owner", {"bounds": [lo, hi]}
    elif image and raw.pixel_max is not None:
        # Data-independent: the pixel format's constant; a pixel above it is clipped too.
        centre, scale = 0.0, float(raw.pixel_max)
        method, source, extra = "pixel", "file format", {"pixel_max": scale}
    else:
        if spec.evaluation == "dp":
            raise ConfigError(
                "with eval mode dp the evaluation records are private: no statistic of "
                "them (or of the training records) may scale the inputs. Declare "
                "dataset.input_bounds (the range of every raw input value), or use a format "
                "with a known pixel range (uint8 images, digits)",
                field="dataset.input_bounds",
            )
        if not (0 < spec.feature_clip < float("inf")):
            raise ConfigError(
                f"feature_clip must be a finite number > 0; got {spec.feature_clip}",
                field="dataset.feature_clip",
            )
        if image:
            lo, hi = _public_image_range(x_test)
            centre, scale = lo, _finite_scale(hi - lo)
        else:
            out = (-float(spec.feature_clip), float(spec.feature_clip))
            centre, scale = _robust_centre_scale(x_test)
        # The statistics are left out of the record: per feature they can be many numbers,
        # and each is an order statistic, i.e. one evaluation record's value.
        method = "public-robust"
        source = (
            "public evaluation dataset"
            if spec.evaluation == "public"
            else "public evaluation split"
        )
    scaling = {"method": method, "clip": list(out), "source": source, **extra}
    return (
        _scale(x_train, centre, scale, out, raw_clip),
        _scale(x_test, centre, scale, out, raw_clip),
        scaling,
    )


def _scale(
    x: np.ndarray,
    centre: float | np.ndarray,
    scale: float | np.ndarray,
    out: tuple[float, float],
    raw_clip: tuple[float, float] | None,
) -> np.ndarray:
    """``clip((clip(x, raw_clip) - centre) / scale, out)`` in float64, chunked, as float32.

    ``centre`` and ``scale`` are finite (scale > 0), so an extreme ``x`` gives at worst +-inf,
    never NaN, and the final clip bounds it before the float32 cast.
    """
    result = np.empty(x.shape, dtype=np.float32)
    n = len(x)
    src, dst = x.reshape(n, -1), result.reshape(n, -1)
    step = max(1, _CHUNK_VALUES // max(1, src.shape[1]))
    with np.errstate(over="ignore"):
        for i in range(0, n, step):
            z = src[i : i + step].astype(np.float64)
            if raw_clip is not None:
                np.clip(z, raw_clip[0], raw_clip[1], out=z)
            z -= centre
            z /= scale
            np.clip(z, out[0], out[1], out=z)
            dst[i : i + step] = z
    return result


def _inner_rank(n: int, q: float) -> int:
    """0-based rank of the ``q``-quantile of ``n`` sorted values, kept off both ends (n >= 3).

    Interpolated quantiles of a small split are dominated by one record (with n = 3, the 75th
    percentile is half the maximum); an order statistic at least one step inside the ends moves
    by at most one rank whatever a single record holds.
    """
    r = round(q * (n - 1))
    return min(max(r, 1), n - 2) if n >= 3 else r


def _sorted_median(s: np.ndarray) -> np.ndarray:
    """Median along axis 0 of values already sorted along it (halves first: no overflow)."""
    n = len(s)
    return np.asarray(s[(n - 1) // 2] / 2 + s[n // 2] / 2)


def _finite_scale(scale: Any) -> Any:
    """A spread made usable as a divisor: 0 becomes 1, an overflowed one the largest float."""
    scale = np.where(scale > 0, scale, 1.0)
    return np.where(np.isfinite(scale), scale, _FLOAT_MAX)


def _robust_centre_scale(x_public: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature centre (median) and scale (IQR / 1.349) of the public split.

    Where the IQR is 0, the median absolute deviation * 1.4826; where that is 0 too, 1. Both
    are robust: one extreme evaluation record moves them by at most one order statistic, so it
    cannot squash every other record's features to ~0 (as it would a mean and a std).
    """
    n = len(x_public)
    s = np.sort(x_public.reshape(n, -1).astype(np.float64), axis=0)
    centre = np.clip(_sorted_median(s), -_FLOAT_MAX, _FLOAT_MAX)
    with np.errstate(over="ignore"):
        iqr = s[_inner_rank(n, 0.75)] - s[_inner_rank(n, 0.25)]
        mad = _sorted_median(np.sort(np.abs(s - centre), axis=0)) * 1.4826
    scale = np.where(iqr > 0, iqr / 1.349, mad)
    return centre, _finite_scale(scale)


def _public_image_range(x_public: np.ndarray) -> tuple[float, float]:
    """A robust raw range [lo, hi] of float images, from the public split only.

    Order statistics of the per-record minima and maxima (about the 5th and 95th percentile,
    see :func:`_inner_rank`): a record counts once however many of its pixels are extreme, so
    one record of 1e37 moves the range by at most one rank.
    """
    n = len(x_public)
    flat = x_public.reshape(n, -1)
    lows = np.sort(flat.min(axis=1).astype(np.float64))
    highs = np.sort(flat.max(axis=1).astype(np.float64))
    lo, hi = float(lows[_inner_rank(n, 0.05)]), float(highs[_inner_rank(n, 0.95)])
    return (lo, hi) if hi > lo else (lo, lo + 1.0)
