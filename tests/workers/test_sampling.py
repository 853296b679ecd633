"""Poisson sampling: each example joins independently with probability q."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.workers.streams import sample_stream
from workers.sampling import poisson_sample


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 3000), q=st.floats(1e-4, 1.0), seed=st.integers(0, 2**31))
def test_sample_is_sorted_unique_and_in_range(n: int, q: float, seed: int) -> None:
    idx = poisson_sample(n, q, sample_stream(seed))
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
        idx = poisson_sample(n, q, gen)
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
    assert poisson_sample(10, 1e-9, gen).numel() == 0


def test_long_populations_need_several_chunks() -> None:
    gen = sample_stream(1)
    n, q = 100_000, 0.5
    idx = poisson_sample(n, q, gen)
    assert abs(len(idx) - n * q) < 6 * math.sqrt(n * q * (1 - q))
    assert idx.max() > n - 50  # the tail of the population is reachable


@pytest.mark.parametrize("chunk", [None, 3])  # 3 forces the multi-chunk continuation
def test_pack_rows_equal_single_samples(monkeypatch: pytest.MonkeyPatch, chunk: int | None) -> None:
    import workers.sampling as sampling

    if chunk is not None:
        monkeypatch.setattr(sampling, "_chunk", lambda n, q: chunk)
    for n, q in [(500, 0.05), (40, 0.3), (7, 0.9)]:
        seeds = [11, 12, 13, 14]
        idx, mask = sampling.poisson_sample_pack(n, q, [sample_stream(s) for s in seeds])
        for row, s in enumerate(seeds):
            alone = poisson_sample(n, q, sample_stream(s))
            m = mask[row] > 0
            assert torch.equal(idx[row][m], alone)
            assert int(m.sum()) == len(alone) and bool(m[: len(alone)].all())
            assert (idx[row][~m] == 0).all()
