"""scikit-learn's bundled tables (digits, breast_cancer, wine), read without importing it.

Importing scikit-learn costs about a second (it pulls pandas), and every fresh process that
loads a built-in set paid it: the driver that plans a sweep and each new worker that trains
one. The tables are plain CSV files inside the installed package, so they are read here with
numpy, from the package's location found without importing it. Where the files are not where
this scikit-learn keeps them, the caller falls back to scikit-learn's own loader; the records
are the same either way (``tests/workers/datasets/test_bundled.py`` compares them).
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np


def _data_dir() -> Path | None:
    spec = importlib.util.find_spec("sklearn")  # finds the package; does not import it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data"


def read_digits() -> tuple[np.ndarray, np.ndarray] | None:
    """``(images [n, 8, 8] float64, target [n] int)``, or None when the file is missing."""
    d = _data_dir()
    path = d / "digits.csv.gz" if d is not None else None
    if path is None or not path.is_file():
        return None
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", ndmin=2)
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)


def read_table(filename: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``(data [n, d] float64, target [n] int)`` of a headed table (``breast_cancer.csv``,
    ``wine_data.csv``: a first line ``n, d, class names...``), or None when it is missing or
    not of that form."""
    d = _data_dir()
    path = d / filename if d is not None else None
    if path is None or not path.is_file():
        return None
    with path.open() as f:
        head = f.readline().split(",")
        try:
            n, width = int(head[0]), int(head[1])
        except (IndexError, ValueError):
            return None
        table = np.loadtxt(f, delimiter=",", ndmin=2)
    if table.shape != (n, width + 1):
        return None
    return table[:, :width], table[:, width].astype(int)
