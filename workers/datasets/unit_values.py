"""Privacy units as loaders read them (issue 54): whose each row is.

A dataset may declare a *privacy unit* (``DatasetSpec.privacy_unit``): a CSV column or an NPZ
array naming the person (``patient_id``) each row belongs to. Every epsilon then protects a
whole unit, all its rows. The unit is never a feature: loaders take it out of ``x`` and return
it in :attr:`RawData.units`, one value per row, as read (ints or strings).

This module holds what the loaders share: finding the unit column, reading a cell, reading the
NPZ array, the checks every load makes (:func:`check_units`), each unit's canonical bytes
(:func:`unit_keys`; what the keyed split of mode ``dp`` hashes) and dense ids per side of the
split (:func:`dense_ids`).

Privacy: which rows belong to which unit, and how many rows a unit has, are private. Messages
name lines, columns and array names, never a unit's value or its number of rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dpsweep.errors import DatasetError
from workers.datasets.identity import _canonical_labels
from workers.datasets.records import DatasetSpec, RawData

#: A cell that means "no unit": empty, or NaN as spreadsheets and pandas write a missing value.
_MISSING = frozenset({"", "nan", "+nan", "-nan"})
#: The canonical forms (:func:`unit_keys`, lower-cased) of a value that is no unit.
_MISSING_KEYS = frozenset({b"s:", b"s:nan", b"s:+nan", b"s:-nan", b"nan"})

_FIX = (
    "set dataset.privacy_unit to the name of the column (csv, text_csv) or array (npz) that "
    "says whose each row is, or leave privacy_unit out for example-level privacy"
)


def unit_column(
    spec: DatasetSpec, header: list[str], path: Path, taken: Mapping[str, str]
) -> int | None:
    """The index of the unit column in a CSV ``header``, or None when no unit is declared.

    Args:
        spec: its ``privacy_unit`` names the column.
        header: the file's column names, stripped.
        path: the file, for messages.
        taken: columns with another role (name -> the spec field that names it, e.g. the
            label column): the unit may not be one of them.

    Raises:
        DatasetError: no column of that name (listing the columns), or a column with another
            role.
    """
    name = spec.privacy_unit
    if name is None:
        return None
    if name in taken:
        raise DatasetError(
            f"{path}: privacy_unit {name!r} is also dataset.{taken[name]}; the unit column "
            "says whose each row is and is never a feature, label or text: name another column"
        )
    if name not in header:
        raise DatasetError(
            f"{path}: no column named {name!r} (dataset.privacy_unit); columns are {header}. {_FIX}"
        )
    return header.index(name)


def unit_cell(cell: str, path: Path, lineno: int, column: str) -> str:
    """One row's unit as read from a CSV cell (stripped).

    Raises:
        DatasetError: an empty or NaN cell, naming the line and the column.
    """
    value = cell.strip()
    if value.lower() in _MISSING:
        raise DatasetError(
            f"{path}: line {lineno}: missing privacy unit in column {column!r}; give every "
            "row its unit (whose row it is) or drop the row"
        )
    return value


def npz_units(z: Any, spec: DatasetSpec, n: int, path: Path) -> np.ndarray | None:
    """The unit array of an open NPZ file ``z`` (one value per row of ``x``), or None when no
    unit is declared.

    Raises:
        DatasetError: no array of that name (listing the arrays), ``x`` or ``y`` named, or an
            array that is not one integer or string per row.
    """
    name = spec.privacy_unit
    if name is None:
        return None
    if name in ("x", "y"):
        raise DatasetError(
            f"{path}: privacy_unit {name!r} names the {'features' if name == 'x' else 'labels'};"
            " the unit array says whose each row is and is never a feature or label: store it "
            "as its own array and name that"
        )
    if name not in z.files:
        raise DatasetError(
            f"{path}: NPZ file has no array named {name!r} (dataset.privacy_unit); arrays are "
            f"{sorted(z.files)}. {_FIX}"
        )
    units = np.asarray(z[name])
    if units.shape != (n,):
        raise DatasetError(
            f"{path}: the unit array {name!r} must be one value per row of 'x' (shape "
            f"[{n}]); got shape {list(units.shape)}"
        )
    if units.dtype.kind not in "biuUSf":
        raise DatasetError(
            f"{path}: the unit array {name!r} must hold integers or strings; got dtype "
            f"{units.dtype}"
        )
    return units


def check_units(raw: RawData, spec: DatasetSpec) -> None:
    """What every load checks of a loader's units (fail closed: a declared unit that the
    loader did not read must never load as example-level data).

    Raises:
        DatasetError: a unit declared for a format without a unit column; a built-in's units
            under another name; units that are not one per row; a missing unit value (by
            line or row, never by value).
    """
    where = spec.path or f"built-in dataset {spec.name!r}"
    if raw.units is None:
        if spec.privacy_unit is not None:
            raise DatasetError(
                f"{where}: dataset format {spec.name!r} has no unit column, so it cannot read "
                f"privacy_unit {spec.privacy_unit!r}; store the records as csv, text_csv or "
                "npz with a column or array that says whose each row is, or leave "
                "privacy_unit out for example-level privacy"
            )
        return
    name = raw.privacy_unit or spec.privacy_unit
    if spec.privacy_unit is not None and name != spec.privacy_unit:
        raise DatasetError(
            f"{where}: its privacy unit is {name!r}, not {spec.privacy_unit!r}; set "
            f"dataset.privacy_unit to {name!r} or leave it out"
        )
    if raw.units.shape != (len(raw.x),):
        raise DatasetError(
            f"{where}: the loader gave {len(raw.units)} unit values for {len(raw.x)} rows; "
            "every row needs exactly one unit"
        )
    for i, key in enumerate(unit_keys(raw.units)):
        if key.lower() in _MISSING_KEYS:
            at = f"line {raw.lines[i]}" if raw.lines is not None else f"row {i}"
            raise DatasetError(
                f"{where}: {at}: missing privacy unit; give every row its unit (whose row it "
                "is) or drop the row"
            )


def unit_keys(units: np.ndarray) -> list[bytes]:
    """Each row's unit as bytes that agree across formats, as labels do
    (:func:`workers.datasets.identity._canonical_labels`): ``7``, ``7.0`` and ``"7"`` are one
    unit, text is stripped. Two spellings of one value can only merge units, never split one:
    a coarser unit protects every row it holds."""
    return _canonical_labels(np.asarray(units))


def dense_ids(keys: list[bytes]) -> np.ndarray:
    """Dense int64 unit ids ``0 .. U - 1`` of rows with these canonical units, numbered in
    order of first appearance (deterministic for a given row order)."""
    ids: dict[bytes, int] = {}
    out = np.empty(len(keys), dtype=np.int64)
    for i, key in enumerate(keys):
        out[i] = ids.setdefault(key, len(ids))
    return out


__all__ = ["check_units", "dense_ids", "npz_units", "unit_cell", "unit_column", "unit_keys"]
