"""The polar sampler as it was before vectorisation (one stream, one round at a time).

The vectorised sampler (:mod:`workers.polar`) must give exactly these values: tests compare the
two bit for bit on the same keystreams.
"""

from __future__ import annotations

import math

import numpy as np

from workers.randomness import RandomStream


def reference_standard_normal(stream: RandomStream, n: int) -> np.ndarray:
    """``n`` draws of Marsaglia's polar method from ``stream``, in stream order."""
    out = np.empty(n, dtype=np.float64)
    filled = 0
    while filled < n:
        pairs = (n - filled + 1) // 2
        m = int(pairs / (math.pi / 4) + 4.0 * math.sqrt(pairs) + 8)
        bits = stream.words(2 * m).view(np.uint64) >> np.uint64(12)
        uv = (bits | np.uint64(0x3FF0000000000001)).view(np.float64) * 2.0 - 3.0
        u, v = uv[:m], uv[m:]
        s = u * u + v * v
        keep = np.flatnonzero(s < 1.0)[:pairs]
        ss = s[keep]
        f = np.sqrt(-2.0 * np.log(ss) / ss)
        got = min(2 * len(keep), n - filled)
        hi, lo = (got + 1) // 2, got // 2
        out[filled : filled + got : 2] = u[keep[:hi]] * f[:hi]
        out[filled + 1 : filled + got : 2] = v[keep[:lo]] * f[:lo]
        filled += got
    return out
