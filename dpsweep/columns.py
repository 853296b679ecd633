"""Column names of a flat table of trials: one rule for CSV exports and the SDK's DataFrames.

A hyperparameter's column is its own name (``lr``, ``clip``), a metric's too (``accuracy``);
where that name is already another column's (a hyperparameter called ``seed``, a metric called
``steps``), it is prefixed: ``param_seed``, ``metric_steps``.
"""

from __future__ import annotations

from collections.abc import Collection


def param_column(name: str, taken: Collection[str]) -> str:
    """The column of hyperparameter ``name``, given the columns already ``taken``."""
    return f"param_{name}" if name in taken else name


def metric_column(name: str, taken: Collection[str]) -> str:
    """The column of metric ``name``, given the columns already ``taken`` (params included)."""
    return f"metric_{name}" if name in taken else name
