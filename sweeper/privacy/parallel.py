"""Map a pure function over items in worker processes (planning is CPU-bound Python).

Building one privacy-loss distribution takes dp_accounting about half a second here, and a
sweep plans one per calibration step of every grid: grids are independent, so they are
planned side by side, one process per core. Results are identical to a serial map.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def pmap(fn: Callable[[T], R], items: Sequence[T], *, processes: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, in up to ``processes`` forked processes (default: cores,
    or ``DPSWEEP_PLAN_PROCESSES``). Exceptions propagate as raised by ``fn``."""
    n = processes or int(os.environ.get("DPSWEEP_PLAN_PROCESSES", "0")) or os.cpu_count() or 1
    n = min(n, len(items))
    if n <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [fn(x) for x in items]
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("fork")) as ex:
        return list(ex.map(fn, items))
