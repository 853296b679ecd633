"""Privacy units (issue 54): the unit sampler and its row choice (:mod:`workers.units`).

Every draw here comes from the labelled reproducible streams (:mod:`tests.workers.streams`),
so a test can regenerate exactly what the engine would draw; production trials draw secrets.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsweep.errors import ConfigError
from tests.workers.streams import sample_stream
from workers.units import (
    UnitIndex,
    check_rows_per_unit,
    choose_rows,
    sample_units,
    sample_units_pack,
)


def _ids(sizes: list[int], seed: int = 0) -> np.ndarray:
    """Dense unit ids for units of ``sizes`` rows, the rows shuffled (units interleave)."""
    ids = np.repeat(np.arange(len(sizes)), sizes)
    return np.random.default_rng(seed).permutation(ids)


def test_the_index_groups_each_units_rows() -> None:
    ids = _ids([3, 1, 5, 2])
    index = UnitIndex.from_ids(ids)
    assert index.n_units == 4
    assert index.sizes.tolist() == [3, 1, 5, 2]
    for u in range(4):
        rows = index.order[index.offsets[u] : index.offsets[u + 1]]
        assert sorted(rows.tolist()) == np.flatnonzero(ids == u).tolist()
    assert "3" not in repr(index)  # sizes are private


@pytest.mark.parametrize(
    "ids", [np.array([0, 2, 2]), np.array([-1, 0]), np.array([[0, 1]]), np.array([0.0, 1.0])]
)
def test_ids_that_are_not_dense_are_refused(ids: np.ndarray) -> None:
    with pytest.raises(ConfigError) as err:
        UnitIndex.from_ids(ids)
    assert err.value.field == "dataset.privacy_unit"


def test_ids_must_match_the_rows() -> None:
    with pytest.raises(ConfigError) as err:
        UnitIndex.from_ids(np.array([0, 1, 1]), n_rows=4)
    assert err.value.field == "dataset.privacy_unit"
    assert "3" not in str(err.value) and "4" not in str(err.value)  # no count in the message


@pytest.mark.parametrize("bad", [0, 1025, -3, 2.5, True])
def test_rows_per_unit_out_of_range_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError) as err:
        check_rows_per_unit(bad)  # type: ignore[arg-type]
    assert err.value.field == "training.rows_per_unit"


def test_units_are_sampled_at_rate_q() -> None:
    sizes = np.random.default_rng(1).integers(1, 40, size=500).tolist()
    ids = _ids(sizes)
    index = UnitIndex.from_ids(ids)
    q, steps = 0.05, 400
    stream = sample_stream(3)
    counts = []
    hits = np.zeros(index.n_units)
    for _ in range(steps):
        rows, used = sample_units(index, sample_rate=q, rows_per_unit=4, stream=stream)
        counts.append(len(used))
        hits[ids[rows[:, 0]]] += 1  # a sampled unit's first slot is one of its rows
    mean, expected = float(np.mean(counts)), q * index.n_units
    sd = math.sqrt(index.n_units * q * (1 - q) / steps)
    assert abs(mean - expected) < 5 * sd
    # Units, not rows, are the sampled population: a unit of 39 rows is no likelier than one
    # of 1 (inclusion frequency of the large and the small half alike).
    big = np.array(sizes) > 20
    assert abs(hits[big].mean() - hits[~big].mean()) / steps < 0.015


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=15),
    r=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_each_unit_uses_at_most_r_distinct_rows_of_its_own(
    sizes: list[int], r: int, seed: int
) -> None:
    ids = _ids(sizes, seed)
    index = UnitIndex.from_ids(ids)
    units = np.arange(len(sizes))
    rows, counts = choose_rows(index, units, rows_per_unit=r, stream=sample_stream(seed))
    assert rows.shape == (len(sizes), r)
    for u, size in enumerate(sizes):
        m = int(counts[u])
        assert m == min(size, r)
        used = rows[u, :m]
        assert len(set(used.tolist())) == m  # distinct
        assert (ids[used] == u).all()  # the unit's own rows
        assert (rows[u, m:] == 0).all()  # unused slots are example 0 (masked)
        if size <= r:  # a small unit uses all its rows
            assert sorted(used.tolist()) == np.flatnonzero(ids == u).tolist()


def test_a_large_units_rows_are_a_uniform_subset() -> None:
    index = UnitIndex.from_ids(np.zeros(5, dtype=np.int64))
    stream = sample_stream(7)
    n = 6000
    pairs: Counter[tuple[int, ...]] = Counter()
    for _ in range(n):
        rows, _ = choose_rows(index, np.array([0]), rows_per_unit=2, stream=stream)
        pairs[tuple(sorted(rows[0].tolist()))] += 1
    assert len(pairs) == 10  # every 2-subset of 5 rows
    expected = n / 10
    chi2 = sum((c - expected) ** 2 / expected for c in pairs.values())
    assert chi2 < 33.7  # chi-square, 9 degrees of freedom, p = 1e-4


def test_the_row_choice_follows_the_secret_stream() -> None:
    index = UnitIndex.from_ids(np.zeros(1000, dtype=np.int64))
    unit = np.array([0])
    a, _ = choose_rows(index, unit, rows_per_unit=8, stream=sample_stream(1))
    again, _ = choose_rows(index, unit, rows_per_unit=8, stream=sample_stream(1))
    other, _ = choose_rows(index, unit, rows_per_unit=8, stream=sample_stream(2))
    assert (a == again).all()  # the same stream, the same rows
    assert set(a[0].tolist()) != set(other[0].tolist())  # another stream, other rows


@pytest.mark.parametrize("q", [0.1, 0.6])
def test_pack_row_k_is_the_single_trial_sampler_with_stream_k(q: float) -> None:
    sizes = np.random.default_rng(2).integers(1, 12, size=80).tolist()
    index = UnitIndex.from_ids(_ids(sizes))
    r, k = 5, 3
    pack_streams = [sample_stream(40 + t) for t in range(k)]
    alone = [sample_stream(40 + t) for t in range(k)]
    for _ in range(4):  # consecutive steps: each stream is read alike
        batch = sample_units_pack(index, sample_rate=q, rows_per_unit=r, streams=pack_streams)
        for t in range(k):
            rows, counts = sample_units(index, sample_rate=q, rows_per_unit=r, stream=alone[t])
            b = len(counts)
            assert torch.equal(batch.counts[t, :b], torch.from_numpy(counts).float())
            assert (batch.counts[t, b:] == 0).all()
            got = batch.idx[t].view(-1, r)[:b]
            assert torch.equal(got, torch.from_numpy(rows))
            mask = batch.mask[t].view(-1, r)
            assert torch.equal(mask[:b].sum(dim=1), batch.counts[t, :b])
            assert (mask[b:] == 0).all() and (batch.idx[t].view(-1, r)[b:] == 0).all()


def test_row_share_is_one_over_the_units_rows() -> None:
    index = UnitIndex.from_ids(_ids([1, 3, 9]))
    batch = sample_units_pack(index, sample_rate=1.0, rows_per_unit=4, streams=[sample_stream(0)])
    share = batch.row_share().view(3, 4)
    assert torch.allclose(share.sum(dim=1), torch.ones(3))
    assert share[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert torch.allclose(share[1], torch.tensor([1 / 3] * 3 + [0.0]))
    assert torch.allclose(share[2], torch.full((4,), 0.25))


def _numpy_choice(
    index: UnitIndex, units: np.ndarray, r: int, stream: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The row choice as numpy passes over the units (the compiled kernel's reference)."""
    starts = index.offsets[units]
    sizes = index.offsets[units + 1] - starts
    counts = np.minimum(sizes, r)
    slot = np.arange(r, dtype=np.int64)
    local = np.broadcast_to(slot, (len(units), r)).copy()
    big = np.flatnonzero(sizes > r)
    if len(big):
        words = stream.words(len(big) * r).view(np.uint64).reshape(len(big), r)
        chosen = np.empty((len(big), r), dtype=np.int64)
        for s in range(r):  # Floyd's algorithm, vectorised over the units
            j = sizes[big] - r + s
            t = (words[:, s] % (j + 1).astype(np.uint64)).astype(np.int64)
            taken = (chosen[:, :s] == t[:, None]).any(axis=1)
            chosen[:, s] = np.where(taken, j, t)
        local[big] = chosen
    used = slot < counts[:, None]
    rows = np.where(used, index.order[np.where(used, starts[:, None] + local, 0)], 0)
    return rows, counts


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    r=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_the_compiled_choice_is_the_numpy_choice_word_for_word(
    sizes: list[int], r: int, seed: int
) -> None:
    ids = np.random.default_rng(seed).permutation(np.repeat(np.arange(len(sizes)), sizes))
    index = UnitIndex.from_ids(ids)
    units = np.random.default_rng(seed + 1).permutation(len(sizes))[: max(1, len(sizes) // 2)]
    got = choose_rows(index, units, rows_per_unit=r, stream=sample_stream(seed))
    want = _numpy_choice(index, units, r, sample_stream(seed))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
