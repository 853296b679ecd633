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

from workers.randomness import RandomStream, geometric_from_words


def poisson_sample(n: int, *, sample_rate: float, stream: RandomStream) -> Tensor:
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
    n: int, *, sample_rate: float, streams: list[RandomStream]
) -> tuple[Tensor, Tensor]:
    """Independent Poisson samples for K trials, padded: indices and mask ``[K, B_max]``.

    Row k is exactly ``poisson_sample(n, sample_rate=sample_rate, stream=streams[k])``: each
    row's gaps come from its own stream's next words, in the same chunks, mapped to gaps by the
    same float64
    arithmetic as :meth:`RandomStream.geometric`; only that arithmetic, the cumulative sums and
    the padding are batched across trials (one numpy call per stage instead of one per trial).
    """
    if sample_rate >= 1.0 or n == 0 or sample_rate <= 0.0:
        return _pad([poisson_sample(n, sample_rate=sample_rate, stream=g) for g in streams])
    chunk = _chunk(n, sample_rate)
    # Small arrays: numpy's per-call cost is a fraction of torch's (integer sums are exact).
    pos = np.cumsum(_geometric_rows(streams, chunk, sample_rate), axis=1)
    pos -= 1
    valid = pos < n
    unfinished = valid[:, -1]
    if unfinished.any():
        # Rare: a trial's first chunk did not reach n; finish those rows one by one.
        pos_t = torch.from_numpy(pos)
        picks = [
            _continue(n, sample_rate, g, [pos_t[r]], int(pos[r, -1]))
            if unfinished[r]
            else pos_t[r][torch.from_numpy(valid[r])]
            for r, g in enumerate(streams)
        ]
        return _pad(picks)
    # Positions increase along a row, so each row's sample is a prefix of it.
    b_max = int(valid.sum(axis=1).max())
    mask = valid[:, :b_max]
    idx = np.where(mask, pos[:, :b_max], 0)
    return torch.from_numpy(idx), torch.from_numpy(mask.astype(np.float32))


def _geometric_rows(streams: list[RandomStream], n: int, p: float) -> np.ndarray:
    """``[K, n]`` Geometric(p) draws, row k equal to ``streams[k].geometric(n, p)``.

    Each stream writes its next ``n`` keystream words into its own row (one cipher call per
    stream, as :meth:`RandomStream.words` makes); the words-to-gaps arithmetic is the one
    :meth:`RandomStream.geometric` uses, on the whole pack at once, so every value is
    bit-for-bit what the stream alone gives.
    """
    # Two spare words per row: ``words_into`` asks for room for one cipher block more.
    words = np.empty((len(streams), n + 2), dtype=np.int64)
    for row, stream in zip(words, streams, strict=True):
        stream.words_into(row, n)
    return geometric_from_words(words[:, :n], p)


def _pad(picks: list[Tensor]) -> tuple[Tensor, Tensor]:
    b_max = max(len(p) for p in picks)
    idx = torch.zeros(len(picks), b_max, dtype=torch.long)
    mask = torch.zeros(len(picks), b_max)
    for r, p in enumerate(picks):
        idx[r, : len(p)] = p
        mask[r, : len(p)] = 1.0
    return idx, mask
