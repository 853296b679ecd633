"""Independent random streams per trial.

A trial's seed spawns separate, stable streams for initial weights, Poisson sampling and noise,
so that changing how often one is drawn from never shifts another, and a trial draws the same
numbers whether it runs alone or inside a pack.
"""

from __future__ import annotations

import numpy as np

# "diag" feeds only the public evaluation-split diagnostics, never training.
_STREAMS = {"init": 0, "sample": 1, "noise": 2, "diag": 3}


def stream_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for stream `init`, `sample`, `noise` or `diag` of trial `seed`."""
    ss = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, _STREAMS[stream]])
    return int(ss.generate_state(1, dtype=np.uint64)[0] & 0x7FFFFFFFFFFFFFFF)
