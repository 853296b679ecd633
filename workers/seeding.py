"""Public per-trial seeds: initial weights and the evaluation-split diagnostics.

A trial's public seed spawns separate, stable streams, so that changing how often one is drawn
from never shifts another. Only what may be public is seeded here; Poisson sampling and noise
come from :mod:`workers.randomness` (a secret per trial).
"""

from __future__ import annotations

import numpy as np

# "diag" feeds only the public evaluation-split diagnostics, never training.
_STREAMS = {"init": 0, "diag": 3}


def stream_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for stream `init` or `diag` of trial `seed`."""
    ss = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, _STREAMS[stream]])
    return int(ss.generate_state(1, dtype=np.uint64)[0] & 0x7FFFFFFFFFFFFFFF)
