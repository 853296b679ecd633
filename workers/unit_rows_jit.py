"""Compiled kernel (numba): a sampled unit's rows (:func:`workers.units.choose_rows`).

One loop over the sampled units instead of numpy passes per row slot: the choice is the same,
word for word (Floyd's algorithm on the same stream words, in the same order), at a few
microseconds a step instead of a few hundred.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, boundscheck=False)
def choose_rows_kernel(
    starts: np.ndarray, sizes: np.ndarray, order: np.ndarray, words: np.ndarray, r: int
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """``rows`` ``[B, r]`` and ``counts`` ``[B]`` of the units ``starts`` / ``sizes``.

    Args:
        starts, sizes: ``[B]`` int64: each sampled unit's first position in ``order`` and its
            number of rows.
        order: the rows sorted by unit (int64).
        words: ``[n_big * r]`` uint64 stream words, ``r`` per unit larger than ``r``, in the
            units' order.
        r: rows per unit.
    """
    b = starts.shape[0]
    rows = np.zeros((b, r), dtype=np.int64)
    counts = np.empty(b, dtype=np.int64)
    chosen = np.empty(r, dtype=np.int64)
    w = 0
    for i in range(b):
        size = sizes[i]
        if size <= r:
            counts[i] = size
            for s in range(size):
                rows[i, s] = order[starts[i] + s]
            continue
        counts[i] = r
        # Floyd: for j = size - r .. size - 1, t uniform in [0, j]; t unless taken, else j.
        for s in range(r):
            j = size - r + s
            t = np.int64(words[w + s] % np.uint64(j + 1))
            taken = False
            for q in range(s):
                if chosen[q] == t:
                    taken = True
                    break
            chosen[s] = j if taken else t
        w += r
        for s in range(r):
            rows[i, s] = order[starts[i] + chosen[s]]
    return rows, counts
