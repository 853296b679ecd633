"""Poisson subsampling: every example joins a batch independently with probability q.

The amplification-by-subsampling analysis behind the accountants assumes exactly this, so the
batch size is random (possibly zero). Indices are generated as a Bernoulli process through its
geometric gaps, which costs O(qN) per step instead of O(N) coin flips and has exactly the same
distribution.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def poisson_sample(n: int, sample_rate: float, generator: torch.Generator) -> Tensor:
    """Sorted int64 indices of a Poisson sample of ``range(n)`` at rate ``sample_rate``."""
    if sample_rate >= 1.0:
        return torch.arange(n)
    if n == 0 or sample_rate <= 0.0:
        return torch.empty(0, dtype=torch.long)
    mean = n * sample_rate
    chunk = int(mean + 6.0 * math.sqrt(mean) + 16)
    parts: list[Tensor] = []
    last = -1
    while True:
        # Gaps between successive successes of a Bernoulli(q) process are i.i.d. Geometric(q)
        # on {1, 2, ...}.
        gaps = torch.empty(chunk, dtype=torch.long).geometric_(sample_rate, generator=generator)
        pos = torch.cumsum(gaps, 0).add_(last)
        keep = pos[pos < n]
        parts.append(keep)
        if len(keep) < chunk:
            break
        last = int(pos[-1])
    return parts[0] if len(parts) == 1 else torch.cat(parts)
