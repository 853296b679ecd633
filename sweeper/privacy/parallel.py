"""Map a pure function over items in worker processes (planning is CPU-bound Python).

Building one privacy-loss distribution takes dp_accounting about half a second here, and a
sweep plans one per calibration step of every grid: grids are independent, so they are
planned side by side, one process per core. Results are identical to a serial map.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
K = TypeVar("K", bound=Hashable)


def pmap(fn: Callable[[T], R], items: Sequence[T], *, processes: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, in up to ``processes`` forked processes (default: cores,
    or ``DPSWEEP_PLAN_PROCESSES``). Exceptions propagate as raised by ``fn``."""
    n = processes or int(os.environ.get("DPSWEEP_PLAN_PROCESSES", "0")) or os.cpu_count() or 1
    n = min(n, len(items))
    if n <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [fn(x) for x in items]
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("fork")) as ex:
        return list(ex.map(fn, items))


def pmap_distinct(
    fn: Callable[[T], R], items: Sequence[T], *, key: Callable[[T], K]
) -> list[tuple[T, R]]:
    """``[(x, fn(r)) for x in items]`` where ``r`` is the first item with ``x``'s key: ``fn``
    runs once per distinct key (in worker processes, as :func:`pmap`).

    For items whose result depends only on the key (grids whose accounting is the same, say
    the fixed and quantile grids of one level): the key must hold everything ``fn`` reads, so
    items that merely look alike never share a result. Exceptions propagate as :func:`pmap`'s,
    the first distinct item's first.
    """
    firsts: dict[K, T] = {}
    for x in items:
        firsts.setdefault(key(x), x)
    results = dict(zip(firsts, pmap(fn, list(firsts.values())), strict=True))
    return [(x, results[key(x)]) for x in items]
