"""Compiled kernels (numba) for the polar sampler and the snapped release.

The numpy sampler (:mod:`workers.polar`) spends most of its time in passes that move data
rather than compute: building the uniforms, finding the accepted pairs (``flatnonzero``) and
gathering them (three ``take`` calls), then four more passes to add, snap and cast the noise.
These kernels do the same arithmetic in two compiled loops around numpy's own SIMD ``log``:

1. :func:`compact`: for each candidate pair, in stream order, the uniforms ``u, v`` straight
   from the keystream words and ``s = u^2 + v^2``; accepted pairs are written contiguously
   (branch-free: every pair is written, the position advances on acceptance), and the loop stops
   at the row's ``pairs``-th acceptance;
2. ``numpy.log`` of the accepted ``s`` (the very function the numpy sampler calls);
3. :func:`finish` / :func:`finish_snapped`: ``f = sqrt(-2 ln s / s)`` and the draws ``u f, v f``,
   either stored, or added to the private sum, snapped to the grid and cast, in the same pass.

Every operation is the numpy sampler's, in the same order, in IEEE float64 without fast-math
(no reassociation, no fused multiply-add), so the draws are the same bits: the tests pin them
to the numpy sampler and to the one-stream-at-a-time reference. The uniforms are computed
exactly: with ``i = (w >> 12) | 1`` (51 random bits, lowest bit set), ``u = (i - 2**51) 2**-51``
equals the numpy sampler's ``2 x - 3`` for ``x = 1 + i 2**-52``; both are exact.

The kernels are compiled on first use and cached on disk (``cache=True``), so a worker process
pays the compilation once per machine, not per trial. Nothing here reads a stream: the caller
hands the words in, so which words a row uses is decided in :mod:`workers.polar` alone.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_TWO_51 = float(2**51)
_INV_TWO_51 = 2.0**-51


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def compact(
    raw: np.ndarray,
    m: int,
    pairs: int,
    us: np.ndarray,
    vs: np.ndarray,
    ss: np.ndarray,
    counts: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Accepted pairs of each row, in stream order, into ``us, vs, ss[r, :counts[r]]``.

    Args:
        raw: ``[K, >= 2m]`` keystream words; row r's ``u`` words are ``raw[r, :m]``, its ``v``
            words ``raw[r, m:2m]``.
        m: candidate pairs per row.
        pairs: accepted pairs wanted per row (the loop stops there).
        us, vs, ss: ``[K, >= pairs + 1]`` float64 outputs (one spare column: every candidate is
            written before the position moves on).
        counts: ``[K]`` int64: accepted pairs found (``< pairs`` for a short row). A short row's
            unused slots up to ``pairs`` get ``s = 0.5``, so ``log`` over them is harmless.
    """
    k = raw.shape[0]
    for r in range(k):
        c = 0
        for j in range(m):
            iu = np.int64((raw[r, j] >> np.uint64(12)) | np.uint64(1))
            iv = np.int64((raw[r, m + j] >> np.uint64(12)) | np.uint64(1))
            u = float(iu - np.int64(2**51)) * _INV_TWO_51
            v = float(iv - np.int64(2**51)) * _INV_TWO_51
            s = u * u + v * v
            us[r, c] = u
            vs[r, c] = v
            ss[r, c] = s
            # The position moves on acceptance without a branch (a fifth of the candidates are
            # rejected, at random: a branch on it would be mispredicted that often).
            c += int(s < 1.0)
            if c == pairs:
                break
        counts[r] = c
        for j in range(c, pairs):
            ss[r, j] = 0.5


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def _factors(logs: np.ndarray, ss: np.ndarray, f: np.ndarray, hi: int) -> None:
    """``f[j] = sqrt(-2 ln s_j / s_j)``, in the numpy path's order: ``(ln s * -2) / s``.

    Its own loop, so that it compiles to SIMD division and square root (``error_model="numpy"``
    drops Python's zero-division check, which would keep it scalar; ``s`` is never 0 here).
    """
    for j in range(hi):
        f[j] = np.sqrt((logs[j] * -2.0) / ss[j])


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def finish(
    us: np.ndarray,
    vs: np.ndarray,
    ss: np.ndarray,
    logs: np.ndarray,
    rows: np.ndarray,
    n: int,
    out: np.ndarray,
    f: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """``out[r, :n]`` <- the polar draws ``u f, v f`` of the accepted pairs, for ``r`` in ``rows``.

    ``f`` is a work buffer of at least ``(n + 1) // 2`` float64.
    """
    hi = (n + 1) // 2
    lo = n // 2
    for r in rows:
        _factors(logs[r], ss[r], f, hi)
        u = us[r]
        v = vs[r]
        o = out[r]
        for j in range(lo):
            o[2 * j] = u[j] * f[j]
            o[2 * j + 1] = v[j] * f[j]
        if hi > lo:  # odd n: the last pair's v is not used
            o[2 * lo] = u[lo] * f[lo]


@njit(cache=True, nogil=True, error_model="numpy")
def _snapped(z: float, b: float, a: float, ig: float, g: float) -> float:
    """The snapped release of one coordinate: ``rint(z a + b ig) g`` (``a = std / grid``,
    ``ig = 1 / grid``); compiled into the loops that call it."""
    return np.rint(z * a + b * ig) * g


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def finish_snapped(
    us: np.ndarray,
    vs: np.ndarray,
    ss: np.ndarray,
    logs: np.ndarray,
    rows: np.ndarray,
    n: int,
    buf: np.ndarray,
    scale: np.ndarray,
    inv_grid: np.ndarray,
    grid: np.ndarray,
    f: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """``buf[r, i] <- rint(z_i scale_r + buf[r, i] inv_grid_r) grid_r``, cast to ``buf``'s dtype.

    ``z`` are the polar draws of :func:`finish`; ``scale_r = std_r / grid_r`` and ``inv_grid_r
    = 1 / grid_r``. With the grid a power of two, this is
    :func:`workers.randomness.add_snapped_noise` exactly: the same product and sum (the
    scaling of ``buf`` is exact), rounded half to even, then scaled back and cast.
    """
    hi = (n + 1) // 2
    lo = n // 2
    for r in rows:
        _factors(logs[r], ss[r], f, hi)
        u = us[r]
        v = vs[r]
        b = buf[r]
        a = scale[r]
        ig = inv_grid[r]
        g = grid[r]
        for j in range(lo):
            b[2 * j] = _snapped(u[j] * f[j], float(b[2 * j]), a, ig, g)
            b[2 * j + 1] = _snapped(v[j] * f[j], float(b[2 * j + 1]), a, ig, g)
        if hi > lo:
            b[2 * lo] = _snapped(u[lo] * f[lo], float(b[2 * lo]), a, ig, g)


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def snap_row(
    z: np.ndarray, buf: np.ndarray, a: float, ig: float, g: float
) -> None:  # pragma: no cover - compiled
    """``buf[i] <- rint(z_i a + buf[i] ig) g`` for one row (a short row's continuation)."""
    for i in range(z.shape[0]):
        buf[i] = _snapped(z[i], float(buf[i]), a, ig, g)
