"""The vectorised polar sampler and the fused snapped release equal their plain definitions.

The sampler runs once per step for the whole pack (:func:`workers.polar.polar_rows`); these
tests pin it bit for bit to the one-stream-at-a-time polar method it replaced
(:mod:`tests.workers.reference_polar`), including the rare rounds in which a stream accepts
too few pairs, and check the distribution on a million draws. Both of its paths are pinned:
the compiled kernels (:mod:`workers.polar_jit`, numba) and the numpy fallback. The snapped
release is pinned to ``round((buf + std z) / grid) * grid`` computed step by step, and the
source's fused release (:meth:`workers.randomness.NoiseSource.add_noise`, which never stores
the draws) to the snapped release of the source's own draws.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

import workers.polar
from tests.workers.reference_polar import reference_standard_normal
from workers.polar import Workspace, candidates, jit_kernels, polar_rows
from workers.randomness import (
    GRID_BITS,
    NoiseSource,
    RandomStream,
    TrialRandomness,
    add_snapped_noise,
    snap_grid,
)


def _stream(seed: int) -> RandomStream:
    return TrialRandomness.reproducible(seed).noise


@pytest.fixture(params=["compiled", "numpy"])
def sampler_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on the compiled kernels and on the numpy fallback."""
    monkeypatch.setattr(workers.polar, "USE_JIT", request.param == "compiled")
    return str(request.param)


def test_the_compiled_kernels_are_in_use() -> None:
    """numba is a server dependency: without it every step would silently take the slow path."""
    assert workers.polar.USE_JIT and jit_kernels() is not None


@pytest.mark.usefixtures("sampler_path")
@pytest.mark.parametrize("n", [1, 2, 3, 8, 1001, 20_001])
def test_one_stream_equals_the_reference_bit_for_bit(n: int) -> None:
    mine, ref = _stream(1), _stream(1)
    for _ in range(3):  # consecutive calls continue the same keystream
        assert np.array_equal(mine.standard_normal(n), reference_standard_normal(ref, n))


@pytest.mark.usefixtures("sampler_path")
@pytest.mark.parametrize(("k", "n"), [(2, 1), (3, 7), (25, 962), (4, 5001)])
def test_each_row_of_a_pack_is_its_own_stream_alone(k: int, n: int) -> None:
    """Row k is exactly what stream k gives by itself: packing shares arithmetic, not draws."""
    source = NoiseSource([_stream(s) for s in range(k)], "cpu")
    alone = [_stream(s) for s in range(k)]
    for _ in range(2):
        z = source.standard_normal(n).numpy().copy()
        assert z.shape == (k, n)
        for row, stream in zip(z, alone, strict=True):
            assert np.array_equal(row, reference_standard_normal(stream, n))
    assert len({z[r].tobytes() for r in range(k)}) == k


class _Rejecting(RandomStream):
    """A real keystream whose first ``bad`` words of each request are replaced by a candidate
    that the polar method rejects (u = v close to -1, so s > 1): the round falls short."""

    def __init__(self, seed: int, bad: int) -> None:
        super().__init__(bytes(32), 0)
        self._inner = _stream(seed)
        self._bad = bad

    def words_into(self, out: np.ndarray, n: int) -> None:
        self._inner.words_into(out, n)
        m = n // 2
        out.view(np.uint64)[: min(self._bad, m)] = np.uint64(0)  # u = -1 + 2**-51
        out.view(np.uint64)[m : m + min(self._bad, m)] = np.uint64(0)  # v likewise
        self._bad = 0  # only the first round


@pytest.mark.usefixtures("sampler_path")
@pytest.mark.parametrize("k", [1, 3])
def test_a_short_round_continues_from_the_same_stream(k: int) -> None:
    n = 2001
    bad = candidates((n + 1) // 2) // 2  # far fewer than n / 2 pairs accepted in round one
    streams = [_Rejecting(s, bad if s == 0 else 0) for s in range(k)]
    refs = [_Rejecting(s, bad if s == 0 else 0) for s in range(k)]
    out = np.full((k, n), np.nan)
    polar_rows(streams, n, out, Workspace())
    for row, ref in zip(out, refs, strict=True):
        assert np.array_equal(row, reference_standard_normal(ref, n))


@pytest.mark.usefixtures("sampler_path")
def test_a_million_draws_are_standard_normal() -> None:
    """Fixed tolerances (about 5 standard errors) on a million draws of a secret stream."""
    source = NoiseSource([TrialRandomness.secret().noise for _ in range(4)], "cpu")
    z = source.standard_normal(250_000).numpy().reshape(-1).copy()
    n = len(z)
    assert n == 1_000_000 and np.isfinite(z).all()
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1.0) < 5 * math.sqrt(2 / n)
    assert abs(stats.skew(z)) < 5 * math.sqrt(6 / n)
    assert abs(stats.kurtosis(z)) < 5 * math.sqrt(24 / n)
    assert stats.kstest(z, "norm").statistic < 1.63 / math.sqrt(n) * 1.5  # p ~ 1e-4 at 1.63
    # Tails: P(|z| > 3) = 0.0027 (~2,700 +- 52 expected).
    assert abs(int((np.abs(z) > 3).sum()) - 2700) < 5 * 52


def _plain_snap(buf: torch.Tensor, z: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """The release by its definition, one operation at a time."""
    std64 = std.to(torch.float64).unsqueeze(1)
    ok = torch.isfinite(std64) & (std64 > 0)
    grid = torch.where(
        ok,
        torch.exp2(torch.floor(torch.log2(torch.where(ok, std64, 1.0))) - GRID_BITS),
        1.0,
    )
    noised = (z * std64 + buf.to(torch.float64)) / grid
    return (noised.round() * grid).to(buf.dtype)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fused_snapped_release_equals_its_definition(k: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    specials = [0.0, math.inf, math.nan, 1e-45, 3e38, 1.0, 2.0**-20, -1.0, 0.37]
    for trial in range(120):
        scale = 10.0 ** torch.randint(-8, 8, (k, 1), generator=gen)
        buf = (torch.randn(k, 300, generator=gen) * scale).to(dtype)
        z = torch.randn(k, 300, generator=gen, dtype=torch.float64) * 3
        std = torch.rand(k, generator=gen) * 10.0 ** torch.randint(-30, 30, (k,), generator=gen)
        std = std.float()
        if trial < len(specials):
            std[0] = specials[trial]
        expected = _plain_snap(buf, z, std)
        got = add_snapped_noise(buf.clone(), z.clone(), std)
        assert torch.equal(got.nan_to_num(7.0), expected.nan_to_num(7.0))


def test_the_grid_is_exact_at_powers_of_two() -> None:
    std = torch.tensor([1.0, 2.0**-30, 3.0, 2.0**10 * (1 - 2.0**-24)], dtype=torch.float64)
    grid = snap_grid(std)
    expected = [2.0**-12, 2.0**-42, 2.0**-11, 2.0**-3]
    assert grid.tolist() == expected


_SPECIAL_STDS = [0.0, math.inf, math.nan, 1e-45, 3e38, 1.0, 2.0**-20, -1.0, 0.37]


@pytest.mark.usefixtures("sampler_path")
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 2, 7, 1001])
def test_the_sources_fused_release_equals_the_release_of_its_draws(
    k: int, dtype: torch.dtype, n: int
) -> None:
    """``add_noise`` (draws added, snapped and cast where they are made) gives the same bits
    as snapping the same source's stored draws, and leaves the streams at the same place."""
    gen = torch.Generator().manual_seed(n)
    for trial in range(len(_SPECIAL_STDS) + 3):
        fused = NoiseSource([_stream(100 * trial + s) for s in range(k)], "cpu")
        stored = NoiseSource([_stream(100 * trial + s) for s in range(k)], "cpu")
        scale = 10.0 ** torch.randint(-8, 8, (k, 1), generator=gen)
        buf = (torch.randn(k, n, generator=gen) * scale).to(dtype)
        if trial == 1:  # a diverged trial's sums
            buf[0, 0], buf[-1, -1] = math.nan, math.inf
        std = torch.rand(k, generator=gen) * 10.0 ** torch.randint(-30, 30, (k,), generator=gen)
        std = std.float()
        if trial < len(_SPECIAL_STDS):
            std[0] = _SPECIAL_STDS[trial]
        for _ in range(2):  # and the streams continue alike
            got = fused.add_noise(buf.clone(), std)
            expected = add_snapped_noise(buf.clone(), stored.standard_normal(n), std)
            assert got.dtype == dtype
            assert torch.equal(got.nan_to_num(7.0), expected.nan_to_num(7.0))


@pytest.mark.usefixtures("sampler_path")
def test_the_fused_release_of_a_short_round_continues_from_the_same_stream() -> None:
    n, k = 2001, 3
    bad = candidates((n + 1) // 2) // 2
    fused = NoiseSource([_Rejecting(s, bad if s == 1 else 0) for s in range(k)], "cpu")
    refs = [_Rejecting(s, bad if s == 1 else 0) for s in range(k)]
    buf = torch.randn(k, n, generator=torch.Generator().manual_seed(3))
    std = torch.tensor([0.5, 2.0, 1e-3])
    got = fused.add_noise(buf.clone(), std)
    z = torch.from_numpy(np.stack([reference_standard_normal(r, n) for r in refs]))
    assert torch.equal(got, add_snapped_noise(buf.clone(), z, std))


def test_the_fused_release_takes_the_plain_path_where_it_cannot_fuse() -> None:
    """A buffer the kernels cannot write in place (not contiguous, or one std for all rows)
    still gets exactly the snapped release of the source's draws."""
    k, n = 2, 300
    wide = torch.randn(k, 2 * n, generator=torch.Generator().manual_seed(4))
    fused = NoiseSource([_stream(s) for s in range(k)], "cpu")
    stored = NoiseSource([_stream(s) for s in range(k)], "cpu")
    for buf, std in [(wide[:, ::2], torch.tensor([0.3, 0.7])), (wide[:, :n], torch.tensor(0.3))]:
        expected = add_snapped_noise(buf.clone(), stored.standard_normal(n), std)
        assert torch.equal(fused.add_noise(buf.clone(), std), expected)


@pytest.mark.usefixtures("sampler_path")
def test_the_pack_memory_estimate_covers_the_samplers_buffers() -> None:
    """``workers.packing.SAMPLER_FLOATS`` (per parameter, in 4-byte units) bounds what the
    source keeps between steps, fused or not."""
    from workers.packing import SAMPLER_FLOATS

    k, n = 3, 20_001
    source = NoiseSource([_stream(s) for s in range(k)], "cpu")
    source.add_noise(torch.zeros(k, n), torch.ones(k))
    source.standard_normal(n)  # the unfused path's buffers too
    held = source._buf.nbytes + sum(b.nbytes for b in source._ws._bufs.values())
    assert held <= 4 * SAMPLER_FLOATS * k * n
    assert held >= 4 * (SAMPLER_FLOATS - 2) * k * n  # and is not far off


def test_a_stream_continues_exactly_across_the_two_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker may draw with numpy first and with the compiled kernels later (a small run, then
    a large one): the stream continues as if one path had drawn everything."""
    mine, ref = _stream(3), _stream(3)
    for compiled in (False, True, False, True):
        monkeypatch.setattr(workers.polar, "USE_JIT", compiled)
        assert np.array_equal(mine.standard_normal(2001), reference_standard_normal(ref, 2001))
    source = NoiseSource([_stream(s) for s in range(3)], "cpu")
    alone = [_stream(s) for s in range(3)]
    for compiled in (False, True):
        monkeypatch.setattr(workers.polar, "USE_JIT", compiled)
        z = source.standard_normal(777).numpy().copy()
        for row, stream in zip(z, alone, strict=True):
            assert np.array_equal(row, reference_standard_normal(stream, 777))


# In a fresh interpreter, where numba is not loaded yet.
_LOADING = """
import sys
import workers.polar as p

with p.kernels_for(draws=p.JIT_WORTHWHILE_DRAWS - 1):
    small = p.jit_kernels()
    numba_after_small = "numba" in sys.modules
with p.kernels_for(draws=p.JIT_WORTHWHILE_DRAWS):
    numba_at_large = "numba" in sys.modules
    large = p.jit_kernels()
with p.kernels_for(draws=1):
    after = p.jit_kernels()
print(small is None, numba_after_small, numba_at_large, large is not None, after is not None)
"""


def test_a_small_run_does_not_load_the_compiled_kernels() -> None:
    """Loading numba costs a fresh worker about 0.6 s: a run too small to pay for it takes the
    numpy path; a large run loads the kernels before its first step, and later runs reuse them."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _LOADING],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == ["True", "False", "True", "True", "True"]
