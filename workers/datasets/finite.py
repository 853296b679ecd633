"""The refusal of non-finite values (NaN, inf), naming where they are in the user's file."""

from __future__ import annotations

import numpy as np

from dpsweep.errors import DatasetError
from workers.datasets.records import DatasetSpec, RawData

# How many offending positions a refusal of non-finite values lists.
_SHOW_BAD = 5


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
