"""Datasets registry: built-in sets and loaders for files a user already has.

Every loader returns raw arrays; :func:`load_dataset` then splits them deterministically by
``split_seed`` and normalises the inputs.

Privacy note on normalisation: preprocessing must not depend on the *private* training split,
otherwise the released model leaks statistics that no noise covers. Image pixels are mapped to
[0, 1] with a constant known from the file format (no data involved). Tabular features are
standardised with the mean and standard deviation of the *evaluation* split, which dpsweep
treats as public (the same split that picks the best checkpoint).

This module needs numpy (and scikit-learn for the built-in sets) but not torch.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from workers.errors import ConfigError, DatasetError

Kind = Literal["image", "tabular"]


@dataclass(frozen=True)
class DatasetSpec:
    """What to load and how to split it.

    Args:
        name: registry name (``digits``, ``breast_cancer``, ``wine``, ``synthetic``, ``idx``,
            ``npz``, ``csv``).
        path: data file for ``idx`` (images), ``npz`` and ``csv``.
        labels_path: labels file for ``idx``.
        label_column: label column for ``csv``.
        test_fraction: share of the examples held out as the (public) evaluation split.
        split_seed: seed of the train/test split; shared by every trial of a sweep.
        options: loader-specific options (for ``synthetic``: ``n_samples``, ``n_features``,
            ``n_classes``, ``n_informative``, ``seed``).
    """

    name: str
    path: str | None = None
    labels_path: str | None = None
    label_column: str | None = None
    test_fraction: float = 0.2
    split_seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RawData:
    """What a loader returns before splitting and normalisation."""

    x: np.ndarray
    y: np.ndarray
    kind: Kind
    # Constant that maps pixels to [0, 1] (from the format, never from the data).
    pixel_max: float | None = None


@dataclass
class Dataset:
    """A split, normalised dataset ready for training.

    ``x_*`` are float32 arrays shaped ``[N, *input_shape]``; ``y_*`` are int64 class indices.
    Images always carry a channel axis (``[C, H, W]``).
    """

    name: str
    kind: Kind
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    classes: list[str]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.x_train.shape[1:])

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])


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
    return RawData(x=d.images.astype(np.float32), y=d.target, kind="image", pixel_max=16.0)


@register_dataset("breast_cancer")
def _breast_cancer(spec: DatasetSpec) -> RawData:
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    return RawData(x=d.data.astype(np.float32), y=d.target, kind="tabular")


@register_dataset("wine")
def _wine(spec: DatasetSpec) -> RawData:
    from sklearn.datasets import load_wine

    d = load_wine()
    return RawData(x=d.data.astype(np.float32), y=d.target, kind="tabular")


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
    return RawData(x=x.astype(np.float32), y=y, kind="tabular")


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
        x=images.astype(np.float32),
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
    if not np.issubdtype(x.dtype, np.number):
        raise DatasetError(f"{path}: 'x' must be numeric; got dtype {x.dtype}")
    pixel_max = 255.0 if x.dtype == np.uint8 else None
    return RawData(
        x=x.astype(np.float32),
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
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise DatasetError(
                f"{path}: line {lineno} has {len(row)} fields, header has {len(header)}"
            )
        labels.append(row[li].strip())
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
    return RawData(x=np.asarray(rows_x, dtype=np.float32), y=np.asarray(labels), kind="tabular")


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Splitting and normalisation.


def load_dataset(spec: DatasetSpec) -> Dataset:
    """Load, split (deterministically by ``spec.split_seed``) and normalise a dataset.

    Raises:
        ConfigError: unknown name or invalid settings (the message lists what is allowed).
        DatasetError: a missing or malformed file (the message names the file).
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
    raw = DATASETS[spec.name](spec)
    x = raw.x
    if not np.all(np.isfinite(x)):
        raise DatasetError(
            f"dataset {spec.name!r} ({spec.path or 'built-in'}) contains NaN or inf values"
        )
    classes, y = np.unique(raw.y, return_inverse=True)
    if len(classes) < 2:
        raise DatasetError(
            f"dataset {spec.name!r} ({spec.path or 'built-in'}) has fewer than two classes"
        )
    if raw.kind == "image" and x.ndim == 3:
        x = x[:, None, :, :]  # add the channel axis
    train_idx, test_idx = _split(len(x), y, spec.test_fraction, spec.split_seed)
    x_train, x_test = x[train_idx], x[test_idx]
    x_train, x_test = _normalise(raw, x_train, x_test)
    return Dataset(
        name=spec.name,
        kind=raw.kind,
        x_train=np.ascontiguousarray(x_train, dtype=np.float32),
        y_train=y[train_idx].astype(np.int64),
        x_test=np.ascontiguousarray(x_test, dtype=np.float32),
        y_test=y[test_idx].astype(np.int64),
        num_classes=len(classes),
        classes=[str(c) for c in classes],
    )


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


def _normalise(
    raw: RawData, x_train: np.ndarray, x_test: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    if raw.kind == "image":
        if raw.pixel_max is not None:
            return x_train / raw.pixel_max, x_test / raw.pixel_max
        # Float images of unknown range: min-max from the public evaluation split.
        lo, hi = float(x_test.min()), float(x_test.max())
        scale = hi - lo if hi > lo else 1.0
        return np.clip((x_train - lo) / scale, 0.0, 1.0), np.clip((x_test - lo) / scale, 0.0, 1.0)
    # Tabular: standardise with statistics of the public evaluation split only.
    mean = x_test.mean(axis=0)
    std = x_test.std(axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    return (x_train - mean) / std, (x_test - mean) / std
