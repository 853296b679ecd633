"""The local data cache: generated built-in records and computed splits, kept between processes.

Every trial of a sweep loads its dataset in its own worker, so what is costly to compute from
public inputs (MNIST-1D's generation, scikit-learn's split) is written once here and read
back. Only the machine's own processes read it: nothing in it is ever released.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np

#: ``$DPSWEEP_DATA_CACHE``, else ``~/.cache/dpsweep``.
CACHE_ENV = "DPSWEEP_DATA_CACHE"


def data_cache_dir() -> Path:
    """The cache directory (``$DPSWEEP_DATA_CACHE``, else ``~/.cache/dpsweep``)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "dpsweep"


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write ``arrays`` to ``path`` atomically (a temporary file, then a rename): a reader sees
    the whole file or none. A cache that cannot be written (a read-only home) only costs the
    computation again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as tmp:
            np.savez(tmp, **arrays)  # type: ignore[arg-type]
        os.replace(tmp.name, path)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp.name)
