"""Marsaglia's polar method, vectorised over the K noise streams of a pack.

:func:`polar_rows` fills row k of an output with the standard normal draws that stream k alone
would give (:meth:`workers.randomness.RandomStream.standard_normal` is this function with one
row): the same keystream words, in the same order, mapped to the same float64 values. Only the
arithmetic is shared: one numpy call per stage for the whole pack instead of one per trial,
which on small models is most of the sampler's cost (a pack of 25 MLPs of 10k parameters
spent ~90 us per trial on per-call overheads). Nothing mixes rows: each row's words, acceptance
decisions and outputs come from its own stream only.

One round for ``n`` draws (``pairs = ceil(n / 2)``) takes ``2m`` words per stream, ``m``
candidate pairs with ``m`` a few standard deviations above ``pairs / (pi / 4)``: ``u`` from the
first ``m`` words, ``v`` from the next ``m``. Accepted pairs (``s = u^2 + v^2 < 1``) give
``u f, v f`` with ``f = sqrt(-2 ln s / s)``, in stream order; a trailing odd draw is not used.
A row that accepts fewer than ``pairs`` pairs (probability ~3e-5) continues with fresh rounds
from its own stream, exactly as a single stream does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Literal, Protocol

import numpy as np

# Exponent of [1, 2) with the lowest mantissa bit set: (w >> 12) | this is 1 + (2i + 1) 2**-52.
_MANTISSA = np.uint64(0x3FF0000000000001)
_SHIFT = np.uint64(12)


class WordSource(Protocol):
    """What the sampler needs of a stream: its next keystream words, written into a buffer."""

    def words_into(self, out: np.ndarray, n: int) -> None: ...


def candidates(pairs: int) -> int:
    """Candidate pairs per round: acceptance is pi/4; 4 standard deviations of margin."""
    return int(pairs / (math.pi / 4) + 4.0 * math.sqrt(pairs) + 8)


class Workspace:
    """Buffers kept between calls: fresh megabyte-sized temporaries cost more in page faults
    than the arithmetic (the sampler runs once or more per step)."""

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        size = math.prod(shape)
        buf = self._bufs.get(name)
        if buf is None or buf.dtype != dtype or buf.size < size:
            buf = self._bufs[name] = np.empty(size, dtype=dtype)
        return buf[:size].reshape(shape)


def jit_kernels() -> ModuleType | None:
    """The compiled kernels (:mod:`workers.polar_jit`), or None where numba is missing, the
    compiled path is turned off (``USE_JIT``), or they are not loaded yet inside
    :func:`kernels_for` a run too small to pay for loading them. Both paths give the same
    draws, bit for bit."""
    global _JIT
    if not USE_JIT:
        return None
    if _JIT is None:
        if _DEFER_LOAD:
            return None
        try:
            # optional: numba (the fallback below is the numpy path)
            import workers.polar_jit as jit
        except ImportError:  # numba is a server dependency; the numpy path is the fallback
            _JIT = False
        else:
            _JIT = jit
    return _JIT or None


# Tests turn this off to run the numpy path; production leaves it on.
USE_JIT = True
_JIT: ModuleType | Literal[False] | None = None

#: The fewest noise draws a run must make for loading the compiled kernels to pay. Loading
#: them (numba's import and its cached kernels) takes about 0.6 s in a fresh worker process;
#: they then save about 6 ns a draw over the numpy path (4.3-4.5 against 9.7-12.3 ns, measured
#: on 2 cores). A one-epoch MLP on digits draws about 0.2 M, `make demo`'s packs about 8 M
#: each, a WRN-16-4 step alone 2.7 M.
JIT_WORTHWHILE_DRAWS = 100_000_000

# Depth of kernels_for contexts of runs too small to load the kernels.
_DEFER_LOAD = 0


@contextmanager
def kernels_for(*, draws: int) -> Iterator[None]:
    """Within, the sampler serves a run of ``draws`` noise draws: it loads the compiled kernels
    now if the run is large enough to pay for them (:data:`JIT_WORTHWHILE_DRAWS`), else it uses
    them only if a run before already loaded them, and the numpy path otherwise (the same
    draws, bit for bit, so only the time differs)."""
    global _DEFER_LOAD
    if draws >= JIT_WORTHWHILE_DRAWS:
        jit_kernels()  # loaded before the first step, not inside its timing
        yield
        return
    _DEFER_LOAD += 1
    try:
        yield
    finally:
        _DEFER_LOAD -= 1


def polar_rows(
    streams: Sequence[WordSource],
    n: int,
    out: np.ndarray,
    ws: Workspace | None = None,
    *,
    keep_words: bool = False,
) -> np.ndarray:
    """``out[k, :n]`` <- ``n`` float64 standard normal draws from ``streams[k]``; returns ``out``.

    Args:
        streams: one word source per row.
        n: draws per row.
        out: ``[K, >= n]`` float64 (any row stride; columns need not be contiguous).
        ws: buffers to reuse between calls.
        keep_words: leave every keystream word a stream wrote (into the buffer it was given)
            untouched until the next call with ``ws``, for a read-ahead that may hand them back
            (:mod:`workers.noise_ahead`); costs one more buffer of words, no extra pass.
    """
    k = len(streams)
    if n <= 0 or k == 0:
        return out
    ws = ws if ws is not None else Workspace()
    jit = jit_kernels()
    if jit is not None:
        _compiled_rows(jit, streams, n, out, ws, keep_words)
    else:
        _numpy_rows(streams, n, out, ws, keep_words)
    return out


def _compiled_rows(
    jit: ModuleType,
    streams: Sequence[WordSource],
    n: int,
    out: np.ndarray,
    ws: Workspace,
    keep_words: bool,
) -> None:
    """:func:`polar_rows` through the compiled kernels: one round, then any short row alone."""
    # The compiled path never writes into the words, so keep_words holds as it is.
    rnd = accepted_pairs(jit, streams, n, ws)
    f = ws.get("f", ((n + 1) // 2 + 1,), np.float64)
    jit.finish(rnd.us, rnd.vs, rnd.ss, rnd.logs, rnd.full_rows, n, out, f)
    for r in rnd.short_rows:
        c = int(rnd.counts[r])
        jit.finish(rnd.us, rnd.vs, rnd.ss, rnd.logs, np.array([r]), 2 * c, out, f)
    # A short row (rare) continues from its own stream, in fresh buffers: the other rows'
    # words and accepted pairs stay as they were.
    for r in rnd.short_rows:
        c = int(rnd.counts[r])
        polar_rows([streams[r]], n - 2 * c, out[r : r + 1, 2 * c : n], keep_words=keep_words)


def _numpy_rows(
    streams: Sequence[WordSource],
    n: int,
    out: np.ndarray,
    ws: Workspace,
    keep_words: bool,
) -> None:
    """:func:`polar_rows` in numpy: one round of uniforms, its accepted pairs selected in
    stream order, the draws written; a row short of pairs continues from its own stream."""
    k = len(streams)
    pairs = (n + 1) // 2
    m = candidates(pairs)
    w, uv = _round_uniforms(streams, m, ws, keep_words)
    s, keep, bounds = _accepted(uv, m, ws)
    counts = np.diff(bounds)
    full = bool((counts >= pairs).all())
    if k == 1:
        got = min(pairs, len(keep))
        sel = keep[:got].reshape(1, got)
    elif not full:
        for r in range(k):
            row_keep = keep[bounds[r] : bounds[r + 1]] - r * m
            _row(streams[r], n, out[r : r + 1], row_keep, uv[r], keep_words)
        return
    else:
        got = pairs
        sel = ws.get("sel", (k, pairs), np.int64)
        np.add(bounds[:-1, None], np.arange(pairs), out=sel)
        np.take(keep, sel, out=sel, mode="clip")
    _write_draws(w, s, sel, m, got, n, out, ws)
    if not full:  # one stream (k == 1) short of pairs: continue from its own stream
        # With keep_words in fresh buffers (rare), so this round's words stay as they were read.
        more = Workspace() if keep_words else ws
        polar_rows(streams, n - 2 * got, out[:, 2 * got : n], more, keep_words=keep_words)


def _round_uniforms(
    streams: Sequence[WordSource], m: int, ws: Workspace, keep_words: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Read ``2m`` words per stream and map them to uniforms on (-1, 1), ``u`` then ``v``.

    Returns the padded ``[K, 2m + 2]`` word buffer the uniforms were written into (viewed as
    float64 they are the uniforms) and the ``[K, 2m]`` uniforms themselves.
    """
    k = len(streams)
    # Two spare words per row: room for a cipher block more than the input, as update_into
    # documents for ciphers (CTR writes exactly the input's length).
    raw = ws.get("raw", (k, 2 * m + 2), np.uint64)
    for r, stream in enumerate(streams):
        stream.words_into(raw[r], 2 * m)
    # With keep_words the first pass writes elsewhere (at no extra cost), so the words stay
    # as read.
    w = ws.get("w", (k, 2 * m + 2), np.uint64) if keep_words else raw
    bits = w[:, : 2 * m]
    # Uniforms on (-1, 1) straight from the bits: 51 random mantissa bits with the lowest set,
    # under the exponent of [1, 2), give x = 1 + (2i + 1) 2**-52; then u = 2x - 3: symmetric
    # about 0, never 0, exact.
    np.right_shift(raw[:, : 2 * m], _SHIFT, out=bits)
    np.bitwise_or(bits, _MANTISSA, out=bits)
    uv = bits.view(np.float64)
    uv *= 2.0
    uv -= 3.0
    return w, uv


def _accepted(uv: np.ndarray, m: int, ws: Workspace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The round's ``s = u^2 + v^2`` (``[K, m]``), the flat indices of its accepted pairs
    (``s < 1``) in stream order per row, and where each row's indices begin (``K + 1``)."""
    k = uv.shape[0]
    u, v = uv[:, :m], uv[:, m:]
    s = ws.get("s", (k, m), np.float64)
    t = ws.get("t", (k, m), np.float64)
    np.multiply(u, u, out=s)
    np.multiply(v, v, out=t)
    s += t
    ok = ws.get("ok", (k, m), np.bool_)
    np.less(s, 1.0, out=ok)
    keep = np.flatnonzero(ok)  # flat indices into [k, m], row-major: stream order per row
    bounds = np.searchsorted(keep, np.arange(k + 1) * m)
    return s, keep, bounds


def _write_draws(
    w: np.ndarray,
    s: np.ndarray,
    sel: np.ndarray,
    m: int,
    got: int,
    n: int,
    out: np.ndarray,
    ws: Workspace,
) -> None:
    """``out[:, :2 got]`` <- ``u f, v f`` of the ``got`` selected pairs per row (``sel``: flat
    indices into ``s``, overwritten), ``f = sqrt(-2 ln s / s)``; a trailing odd draw unused."""
    k = len(sel)
    pairs = (n + 1) // 2
    # The temporaries below reuse the buffers of s and t (:func:`_accepted`) once they are
    # spent: fresh arrays of this size cost page faults, and a small footprint stays in cache.
    t = ws.get("t", (k, m), np.float64)
    ss = t.reshape(-1)[: k * got].reshape(k, got)
    np.take(s, sel, out=ss, mode="clip")
    f = s.reshape(-1)[: k * got].reshape(k, got)
    np.log(ss, out=f)
    f *= -2.0
    f /= ss
    np.sqrt(f, out=f)
    # Flat indices of the accepted u's in the padded [k, 2m + 2] buffer: row r's word j sits
    # at (2m + 2) r + j, and sel holds m r + j (sel is ours to overwrite).
    flat = w.reshape(-1).view(np.float64)
    ui = sel
    if k > 1:
        ui += (np.arange(k) * (m + 2))[:, None]
    hi, lo = min(got, pairs), min(got, n // 2)
    np.take(flat, ui, out=ss, mode="clip")
    np.multiply(ss[:, :hi], f[:, :hi], out=out[:, 0 : 2 * hi : 2])
    ui += m
    np.take(flat, ui, out=ss, mode="clip")
    np.multiply(ss[:, :lo], f[:, :lo], out=out[:, 1 : 2 * lo : 2])


def polar_snap_rows(
    jit: ModuleType,
    streams: Sequence[WordSource],
    n: int,
    buf: np.ndarray,
    scale: np.ndarray,
    inv_grid: np.ndarray,
    grid: np.ndarray,
    ws: Workspace,
) -> None:
    """``buf[k, :n] <- rint(z_k scale_k + buf[k, :n] inv_grid_k) grid_k`` with ``z_k`` the
    draws :func:`polar_rows` gives for stream k (compiled path; see
    :func:`workers.randomness.add_snapped_noise` for why this is the snapped release).

    ``buf``: ``[K, >= n]`` float32 or float64, rows contiguous. The draws are never stored:
    each is added, snapped and cast where it is made.
    """
    rnd = accepted_pairs(jit, streams, n, ws)
    f = ws.get("f", ((n + 1) // 2 + 1,), np.float64)
    jit.finish_snapped(
        rnd.us, rnd.vs, rnd.ss, rnd.logs, rnd.full_rows, n, buf, scale, inv_grid, grid, f
    )
    for r in rnd.short_rows:  # rare: the row's draws in full, then snapped
        c = int(rnd.counts[r])
        z = np.empty((1, n), dtype=np.float64)
        one, first = slice(r, r + 1), np.zeros(1, dtype=np.int64)
        jit.finish(rnd.us[one], rnd.vs[one], rnd.ss[one], rnd.logs[one], first, 2 * c, z, f)
        polar_rows([streams[r]], n - 2 * c, z[:, 2 * c : n])
        jit.snap_row(z[0], buf[r], float(scale[r]), float(inv_grid[r]), float(grid[r]))


@dataclass
class Round:
    """One compiled round for ``K`` rows: the accepted pairs, in stream order, and ``ln s``.

    Rows in ``full_rows`` accepted at least ``pairs``; a row in ``short_rows`` (probability
    ~3e-5 each) accepted ``counts[r]`` and continues from its own stream.
    """

    us: np.ndarray
    vs: np.ndarray
    ss: np.ndarray
    logs: np.ndarray
    counts: np.ndarray
    full_rows: np.ndarray
    short_rows: list[int]


def accepted_pairs(jit: ModuleType, streams: Sequence[WordSource], n: int, ws: Workspace) -> Round:
    """Read one round of words per stream and keep its accepted pairs (compiled path).

    Each row reads exactly the ``2 m`` words of the numpy path's round, so the streams advance
    alike on both paths.
    """
    k = len(streams)
    pairs = (n + 1) // 2
    m = candidates(pairs)
    raw = ws.get("raw", (k, 2 * m + 2), np.uint64)
    for r, stream in enumerate(streams):
        stream.words_into(raw[r], 2 * m)
    us = ws.get("us", (k, pairs + 1), np.float64)
    vs = ws.get("vs", (k, pairs + 1), np.float64)
    ss = ws.get("ss", (k, pairs + 1), np.float64)
    counts = ws.get("counts", (k,), np.int64)
    jit.compact(raw, m, pairs, us, vs, ss, counts)
    logs = ws.get("logs", (k, pairs), np.float64)
    np.log(ss[:, :pairs], out=logs)  # numpy's SIMD log: the numpy path's very function
    if (counts[0] >= pairs) if k == 1 else bool((counts >= pairs).all()):
        return Round(us, vs, ss, logs, counts, np.arange(k, dtype=np.int64), [])
    short = [r for r in range(k) if counts[r] < pairs]
    full = np.array([r for r in range(k) if counts[r] >= pairs], dtype=np.int64)
    return Round(us, vs, ss, logs, counts, full, short)


def _row(
    stream: WordSource,
    n: int,
    out: np.ndarray,
    keep: np.ndarray,
    uv: np.ndarray,
    keep_words: bool,
) -> None:
    """One row of a round in which some row fell short (rare): emit, then continue alone.

    ``keep`` holds the row's accepted candidate indices, ``uv`` its ``2m`` uniforms.
    """
    pairs = (n + 1) // 2
    keep = keep[:pairs]
    m = len(uv) // 2
    u, v = uv[:m], uv[m:]
    uk, vk = u[keep], v[keep]
    s = uk * uk + vk * vk
    f = np.sqrt(-2.0 * np.log(s) / s) if len(s) else s
    got = min(2 * len(keep), n)
    hi, lo = (got + 1) // 2, got // 2
    out[0, 0:got:2] = uk[:hi] * f[:hi]
    out[0, 1:got:2] = vk[:lo] * f[:lo]
    if got < n:
        polar_rows([stream], n - got, out[:, got:n], keep_words=keep_words)
