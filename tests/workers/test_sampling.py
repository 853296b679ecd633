"""Poisson sampling: each example joins independently with probability q."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.workers.streams import sample_stream
from workers.sampling import poisson_sample


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 3000), q=st.floats(1e-4, 1.0), seed=st.integers(0, 2**31))
def test_sample_is_sorted_unique_and_in_range(n: int, q: float, seed: int) -> None:
    idx = poisson_sample(n, sample_rate=q, stream=sample_stream(seed))
    assert idx.dtype == torch.long
    if len(idx):
        assert idx.min() >= 0 and idx.max() < n
        assert (idx[1:] > idx[:-1]).all()
    if q >= 1.0:
        assert len(idx) == n


def test_inclusion_frequencies_and_size_distribution() -> None:
    n, q, draws = 200, 0.07, 4000
    gen = sample_stream(0)
    counts = torch.zeros(n)
    sizes = []
    for _ in range(draws):
        idx = poisson_sample(n, sample_rate=q, stream=gen)
        counts[idx] += 1
        sizes.append(len(idx))
    sizes_t = torch.tensor(sizes, dtype=torch.float64)
    mean, var = n * q, n * q * (1 - q)
    # Batch size ~ Binomial(n, q): mean and variance within 5 standard errors.
    assert abs(sizes_t.mean() - mean) < 5 * math.sqrt(var / draws)
    assert abs(sizes_t.var() - var) < 0.15 * var
    # Every example is included with probability q (no position bias).
    freq = counts / draws
    se = math.sqrt(q * (1 - q) / draws)
    assert (freq - q).abs().max() < 5 * se
    # Positions are independent: first and last halves are equally likely.
    assert abs(counts[: n // 2].sum() - counts[n // 2 :].sum()) / counts.sum() < 0.05
    # Empty batches happen (P = (1-q)^n), and must be representable.
    assert poisson_sample(10, sample_rate=1e-9, stream=gen).numel() == 0


def test_long_populations_need_several_chunks() -> None:
    gen = sample_stream(1)
    n, q = 100_000, 0.5
    idx = poisson_sample(n, sample_rate=q, stream=gen)
    assert abs(len(idx) - n * q) < 6 * math.sqrt(n * q * (1 - q))
    assert idx.max() > n - 50  # the tail of the population is reachable


@pytest.mark.parametrize("chunk", [None, 3])  # 3 forces the multi-chunk continuation
def test_pack_rows_equal_single_samples(monkeypatch: pytest.MonkeyPatch, chunk: int | None) -> None:
    import workers.sampling as sampling

    if chunk is not None:
        monkeypatch.setattr(sampling, "_chunk", lambda n, q: chunk)
    for n, q in [(500, 0.05), (40, 0.3), (7, 0.9)]:
        seeds = [11, 12, 13, 14]
        idx, mask = sampling.poisson_sample_pack(
            n, sample_rate=q, streams=[sample_stream(s) for s in seeds]
        )
        for row, s in enumerate(seeds):
            alone = poisson_sample(n, sample_rate=q, stream=sample_stream(s))
            m = mask[row] > 0
            assert torch.equal(idx[row][m], alone)
            assert int(m.sum()) == len(alone) and bool(m[: len(alone)].all())
            assert (idx[row][~m] == 0).all()


def test_pack_gaps_equal_each_streams_own_geometric_draws() -> None:
    """The batched words-to-gaps arithmetic gives every row its own stream's gaps, bit for bit,
    and leaves each stream exactly where its own ``geometric`` call would."""
    from workers.sampling import _geometric_rows

    for n, p in [(130, 0.0445), (7, 0.9), (1000, 1e-4), (64, 0.5), (1, 0.3)]:
        seeds = list(range(20, 37))
        streams = [sample_stream(s) for s in seeds]
        rows = _geometric_rows(streams, n, p)
        for row, (s, stream) in enumerate(zip(seeds, streams, strict=True)):
            alone = sample_stream(s)
            assert np.array_equal(rows[row], alone.geometric(n, p)), (n, p, s)
            # The stream continues exactly where its own call leaves it.
            assert np.array_equal(stream.words(5), alone.words(5))


def test_pack_rows_equal_per_stream_loop_over_many_steps() -> None:
    """Many consecutive pack samples equal the straightforward per-trial loop, step by step."""
    import workers.sampling as sampling

    n, q = 1438, 64 / 1438
    seeds = list(range(25))
    packed = [sample_stream(s) for s in seeds]
    alone = [sample_stream(s) for s in seeds]
    for _ in range(30):
        idx, mask = sampling.poisson_sample_pack(n, sample_rate=q, streams=packed)
        for row, stream in enumerate(alone):
            ref = poisson_sample(n, sample_rate=q, stream=stream)
            m = mask[row] > 0
            assert torch.equal(idx[row][m], ref)
