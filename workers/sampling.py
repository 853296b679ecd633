"""Poisson subsampling: every example joins a batch independently with probability q.

The amplification-by-subsampling analysis behind the accountants assumes exactly this, so the
batch size is random (possibly zero). Indices are generated as a Bernoulli process through its
geometric gaps, which costs O(qN) per step instead of O(N) coin flips and has exactly the same
distribution.

The gaps come from each trial's own :class:`~workers.randomness.RandomStream` (a secret
keystream, or the public seed's in reproducible mode), never from torch's global generator.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from workers.randomness import RandomStream


def poisson_sample(n: int, sample_rate: float, stream: RandomStream) -> Tensor:
    """Sorted int64 indices of a Poisson sample of ``range(n)`` at rate ``sample_rate``."""
    if sample_rate >= 1.0:
        return torch.arange(n)
    if n == 0 or sample_rate <= 0.0:
        return torch.empty(0, dtype=torch.long)
    return _continue(n, sample_rate, stream, [], -1)


def _chunk(n: int, sample_rate: float) -> int:
    mean = n * sample_rate
    return int(mean + 6.0 * math.sqrt(mean) + 16)


def _continue(
    n: int, sample_rate: float, stream: RandomStream, parts: list[Tensor], last: int
) -> Tensor:
    """Draw chunks of gaps until the process passes n (``parts`` holds what was kept so far)."""
    chunk = _chunk(n, sample_rate)
    while True:
        # Gaps between successive successes of a Bernoulli(q) process are i.i.d. Geometric(q)
        # on {1, 2, ...}.
        gaps = torch.from_numpy(stream.geometric(chunk, sample_rate))
        pos = torch.cumsum(gaps, 0).add_(last)
        keep = pos[pos < n]
        parts.append(keep)
        if len(keep) < chunk:
            break
        last = int(pos[-1])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def poisson_sample_pack(
    n: int, sample_rate: float, streams: list[RandomStream]
) -> tuple[Tensor, Tensor]:
    """Independent Poisson samples for K trials, padded: indices and mask ``[K, B_max]``.

    Row k is exactly ``poisson_sample(n, sample_rate, streams[k])`` (each row draws its gaps
    from its own stream in the same chunks), followed by zero-weight padding; only the
    cumulative sums and the padding are batched across trials.
    """
    if sample_rate >= 1.0 or n == 0 or sample_rate <= 0.0:
        return _pad([poisson_sample(n, sample_rate, g) for g in streams])
    chunk = _chunk(n, sample_rate)
    gaps = torch.from_numpy(np.stack([g.geometric(chunk, sample_rate) for g in streams]))
    pos = torch.cumsum(gaps, dim=1).sub_(1)
    valid = pos < n
    unfinished = valid[:, -1]
    if bool(unfinished.any()):
        # Rare: a trial's first chunk did not reach n; finish those rows one by one.
        picks = [
            _continue(n, sample_rate, g, [pos[r]], int(pos[r, -1]))
            if bool(unfinished[r])
            else pos[r][valid[r]]
            for r, g in enumerate(streams)
        ]
        return _pad(picks)
    b_max = int(valid.sum(dim=1).max())
    mask = valid[:, :b_max]
    idx = torch.where(mask, pos[:, :b_max], torch.zeros((), dtype=torch.long))
    return idx, mask.to(torch.float32)


def _pad(picks: list[Tensor]) -> tuple[Tensor, Tensor]:
    b_max = max(len(p) for p in picks)
    idx = torch.zeros(len(picks), b_max, dtype=torch.long)
    mask = torch.zeros(len(picks), b_max)
    for r, p in enumerate(picks):
        idx[r, : len(p)] = p
        mask[r, : len(p)] = 1.0
    return idx, mask
