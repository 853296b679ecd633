"""Loaders for files a user already has: IDX (MNIST format), NPZ and CSV.

Importing this module registers the ``idx``, ``npz`` and ``csv`` loaders. Each refuses a
malformed file with a :class:`~dpsweep.errors.DatasetError` that names the file and what is
wrong with it. NPZ images may be channels-first or channels-last (option ``layout``); they
are returned channels-first, so both layouts of the same images are the same records.
A declared privacy unit (``DatasetSpec.privacy_unit``) is a CSV column or an NPZ array, read
into :attr:`RawData.units` and never into the features; IDX files have none
(:mod:`workers.datasets.unit_values`).
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpsweep.errors import ConfigError, DatasetError
from workers.datasets.descriptors import NPZ
from workers.datasets.records import DatasetSpec, RawData
from workers.datasets.registry import register_dataset
from workers.datasets.unit_values import npz_units, unit_cell, unit_column


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
            # The unit array (issue 54) is read beside x, never into it.
            units = npz_units(z, spec, len(x) if x.ndim else 0, path)
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
    x = _channels_first(x, NPZ.validate(spec.options)["layout"], path)
    pixel_max = 255.0 if x.dtype == np.uint8 else None
    return RawData(
        x=x,
        y=y,
        kind="image" if x.ndim >= 3 else "tabular",
        pixel_max=pixel_max,
        units=units,
        privacy_unit=spec.privacy_unit if units is not None else None,
    )


def channels_last(shape: tuple[int, ...]) -> bool:
    """Whether 4-D images ``shape`` look channels-last: the last axis is 1 or 3 (grey, RGB)
    and the second is not (else they are read channels-first, as before layouts existed)."""
    return len(shape) == 4 and shape[3] in (1, 3) and shape[1] not in (1, 3)


def _channels_first(x: np.ndarray, layout: str, path: Path) -> np.ndarray:
    """``x`` with images as ``[N, C, H, W]`` (``layout``: ``auto``, ``nchw`` or ``nhwc``).

    Only the shape decides ``auto``, never a value. Features ``[N, D]`` and grey images
    ``[N, H, W]`` are returned as they are.

    Raises:
        ConfigError: ``nchw`` / ``nhwc`` declared for an ``x`` that is not 4-D.
    """
    if x.ndim != 4:
        if layout != "auto":
            raise ConfigError(
                f"layout {layout} applies to 4-D images; {path.name}'s 'x' has shape {x.shape}",
                field="dataset.options.layout",
            )
        return x
    if layout == "nhwc" or (layout == "auto" and channels_last(x.shape)):
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    return x


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
    # The privacy unit's column (issue 54) is never a feature: it leaves x like the label.
    ui = unit_column(spec, header, path, {spec.label_column: "label_column"})
    skip = {li} if ui is None else {li, ui}
    rows = _csv_rows(reader, path, header, li, ui)
    if len(header) - len(skip) < 1:
        raise DatasetError(
            f"{path}: needs at least one feature column besides {spec.label_column!r}"
            + ("" if ui is None else f" and the unit column {spec.privacy_unit!r}")
        )
    # float64: a value such as 1e300 is finite here (it would be inf in float32).
    return RawData(
        x=np.asarray(rows.x, dtype=np.float64),
        y=np.asarray(rows.labels),
        kind="tabular",
        lines=rows.lines,
        columns=[h for j, h in enumerate(header) if j not in skip],
        units=None if ui is None else np.asarray(rows.units),
        privacy_unit=spec.privacy_unit if ui is not None else None,
    )


@dataclass
class _CsvRows:
    """A CSV file's data rows: features, labels, units (when a unit column is declared) and
    each row's line."""

    x: list[list[float]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    units: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)


def _csv_rows(
    reader: Iterator[list[str]], path: Path, header: list[str], li: int, ui: int | None
) -> _CsvRows:
    """Read the data rows after the header (blank rows skipped).

    Raises:
        DatasetError: a row with another number of fields, a missing label or unit, or a
            non-numeric feature, naming the line.
    """
    out = _CsvRows()
    label_column = header[li]
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
                f"{label_column!r}; give every row a label or drop the row"
            )
        if ui is not None:
            out.units.append(unit_cell(row[ui], path, lineno, header[ui]))
        out.labels.append(label)
        out.lines.append(lineno)
        try:
            out.x.append([float(c) for j, c in enumerate(row) if j != li and j != ui])
        except ValueError:
            bad = next(c for j, c in enumerate(row) if j not in (li, ui) and not _is_float(c))
            raise DatasetError(
                f"{path}: line {lineno}: non-numeric feature value {bad!r}"
            ) from None
    if not out.x:
        raise DatasetError(f"{path}: no data rows")
    return out


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True
