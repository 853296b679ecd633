"""The noise read-ahead draws exactly what the sequential source draws, and cleans up after itself.

:class:`workers.noise_ahead.NoiseAhead` makes the next step's standard normals on a background
thread. These tests pin it to the sequential :class:`~workers.randomness.NoiseSource` request
by request, bit for bit, including the requests it did not foresee (each forces it to hand the
words it read ahead back to the streams), rounds in which a stream accepts too few pairs, whole
DP runs of three strategies, thread errors and the thread's shutdown.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch

from workers.datasets.records import DatasetSpec
from workers.engine import DPEngine
from workers.models import ModelSpec, build_model
from workers.noise_ahead import THREAD_NAME, NoiseAhead
from workers.optim import PackedOptimizer
from workers.packed import PackedModel
from workers.polar import Workspace, candidates, polar_rows
from workers.randomness import NoiseSource, RandomStream, TrialRandomness
from workers.settings import WorkerSettings
from workers.strategies import get_strategy
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, Progress, TrialSpec

# Requests per step: the foreseen pattern, then a bigger and a smaller draw, an extra request,
# a missing one, a new size, and back (each change forces an undo of the read-ahead).
PLAN = [
    [300, 1],
    [300, 1],
    [300, 1],
    [301, 1],
    [300],
    [300, 1, 1],
    [300, 1],
    [50, 7],
    [50, 7],
    [],
    [300, 1],
]


def _noise(seed: int) -> RandomStream:
    return TrialRandomness.reproducible(seed).noise


def _ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]


def _same_draws(
    seq: NoiseSource, ahead: NoiseAhead, plan: list[list[int]], *, rounds: int = 1
) -> None:
    for _ in range(rounds):
        for step in plan:
            for n in step:
                a = seq.standard_normal(n).numpy().copy()
                b = ahead.standard_normal(n).numpy().copy()
                assert a.shape == b.shape == (len(seq.streams), n)
                assert np.array_equal(a, b)
            seq.step_done()
            ahead.step_done()


@pytest.mark.parametrize("k", [1, 3])
def test_draws_equal_the_sequential_source_request_by_request(k: int) -> None:
    seq = NoiseSource([_noise(s) for s in range(k)], "cpu")
    ahead = NoiseAhead([_noise(s) for s in range(k)], "cpu")
    _same_draws(seq, ahead, PLAN)
    ahead.close()
    assert not _ahead_threads()
    # The streams end where the sequential ones do: the draws made ahead were given back.
    assert np.array_equal(seq.standard_normal(99).numpy(), ahead.standard_normal(99).numpy())


def test_unread_words_come_back_in_order() -> None:
    plain, stream = _noise(4), _noise(4)
    expected = plain.words(900).copy()
    first = stream.words(300).copy()
    second = stream.words(200).copy()
    stream.unread([first[100:], second])  # the last 400 words read, in order
    middle = stream.words(150).copy()  # words() reuses its buffer
    got = np.concatenate([first[:100], middle, stream.words(650)])
    assert np.array_equal(got, expected)


class _Scripted:
    """A word source reading a fixed array in order: zero runs in it make the polar method
    reject every candidate of a round (u = v = -1 + 2**-51, so s > 1), forcing short rounds."""

    def __init__(self, words: np.ndarray) -> None:
        self.w = words
        self.pos = 0

    def words_into(self, out: np.ndarray, n: int) -> None:
        out.reshape(-1).view(np.uint64)[:n] = self.w[self.pos : self.pos + n]
        self.pos += n

    def unread(self, words: list[np.ndarray]) -> None:
        back = np.concatenate([np.asarray(w, dtype=np.uint64) for w in words])
        assert np.array_equal(back, self.w[self.pos - len(back) : self.pos])
        self.pos -= len(back)


def _scripted(seed: int) -> _Scripted:
    words = np.random.default_rng(seed).integers(0, 2**64, size=400_000, dtype=np.uint64)
    for start in range(seed * 700, len(words) - 2000, 17_000):
        words[start : start + 1200] = 0
    return _Scripted(words)


@pytest.mark.parametrize("k", [1, 3])
def test_short_rounds_keep_every_word_they_read(k: int) -> None:
    n = 2001
    streams = [_scripted(s) for s in range(k)]
    out = np.full((k, n), np.nan)
    polar_rows(streams, n, out, Workspace(), keep_words=True)
    ref = np.full((k, n), np.nan)
    polar_rows([_scripted(s) for s in range(k)], n, ref, Workspace())
    assert np.array_equal(out, ref)
    assert streams[0].pos > 2 * candidates((n + 1) // 2)  # it did take a second round


@pytest.mark.parametrize("k", [1, 3])
def test_read_ahead_with_short_rounds_equals_the_sequential_source(k: int) -> None:
    seq = NoiseSource([_scripted(s) for s in range(k)], "cpu")  # type: ignore[misc]
    ahead = NoiseAhead([_scripted(s) for s in range(k)], "cpu")  # type: ignore[misc]
    _same_draws(seq, ahead, [[2001, 1], [2001, 1], [1500], [2001, 1]], rounds=6)
    ahead.close()
    assert [s.pos for s in ahead.streams] == [s.pos for s in seq.streams]  # type: ignore[attr-defined]


def _engine(strategy: str, noise_cls: type[NoiseSource], k: int = 2) -> DPEngine:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(500, 1, 8, 8, generator=gen)
    y = torch.randint(10, (500,), generator=gen)
    modules = [
        build_model(ModelSpec("mlp"), input_shape=(1, 8, 8), num_classes=10, seed=i)
        for i in range(k)
    ]
    model = PackedModel(modules)
    params: dict[str, dict[str, Any]] = {
        "fixed": {"clip": 1.0},
        "online": {},
        "quantile": {"target_quantile": 0.5},
    }
    strat = get_strategy(strategy)(
        [params[strategy]] * k, n_layers=model.n_param_layers, device=model.device
    )
    rands = [TrialRandomness.reproducible(100 + i) for i in range(k)]
    return DPEngine(
        model=model,
        strategy=strat,
        optimizer=PackedOptimizer("sgd", torch.full((k,), 0.1)),
        x=x,
        y=y,
        task="classification",
        sample_rate=0.1,
        noise_multiplier=torch.full((k,), 1.0),
        sample_streams=[r.sample for r in rands],
        noise=noise_cls([r.noise for r in rands], "cpu"),
    )


@pytest.mark.parametrize("strategy", ["fixed", "online", "quantile"])
def test_dp_steps_with_the_read_ahead_give_bit_identical_parameters(strategy: str) -> None:
    """Fixed (one release), online (a second release), quantile (a scalar release)."""
    seq, ahead = _engine(strategy, NoiseSource), _engine(strategy, NoiseAhead)
    assert isinstance(ahead.noise, NoiseAhead)
    for _ in range(8):
        seq.step()
        ahead.step()
        assert torch.equal(seq.model.flat, ahead.model.flat)
        for name, v in seq.strategy.state().items():
            assert torch.equal(v, ahead.strategy.state()[name])
    ahead.noise.close()
    assert not _ahead_threads()


def test_a_thread_error_surfaces_and_the_source_then_refuses() -> None:
    class Failing(RandomStream):
        calls = 0

        def words_into(self, out: np.ndarray, n: int) -> None:
            Failing.calls += 1
            if Failing.calls == 2:  # the first draw made ahead
                raise OSError("keystream failure")
            super().words_into(out, n)

    ahead = NoiseAhead([Failing(bytes(32), 2)], "cpu")
    ahead.standard_normal(10)
    ahead.step_done()
    with pytest.raises(OSError, match="keystream failure"):
        ahead.standard_normal(10)
    with pytest.raises(RuntimeError, match="read-ahead failed"):
        ahead.standard_normal(10)
    ahead.close()
    assert not _ahead_threads()


def test_the_read_ahead_is_never_pickled() -> None:
    ahead = NoiseAhead([_noise(0)], "cpu")
    ahead.standard_normal(5)
    ahead.step_done()
    with pytest.raises(TypeError, match="never leaves"):
        pickle.dumps(ahead)
    with pytest.raises(TypeError, match="never leaves"):
        pickle.dumps(ahead._ahead[0].recorders)
    ahead.close()


def _spec(strategy: str, **kw: Any) -> PackSpec:
    params = {"fixed": {"clip": 1.0}, "online": {}}[strategy]
    return PackSpec(
        dataset=DatasetSpec("digits"),
        model=ModelSpec("mlp"),
        strategy=strategy,
        trials=[TrialSpec(lr=0.1, seed=s, noise_multiplier=1.0, params=params) for s in range(2)],
        batch_size=64,
        steps=12,
        eval_every=4,
        randomness="reproducible",
        keep_weights=True,
        **kw,
    )


@pytest.mark.parametrize("strategy", ["fixed", "online"])
def test_train_pack_results_do_not_depend_on_the_setting(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []

    def progress(p: Progress) -> None:
        seen.append(len(_ahead_threads()))

    results = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("DPSWEEP_NOISE_AHEAD", flag)
        assert WorkerSettings().noise_ahead is (flag == "1")
        seen.clear()
        results[flag] = train_pack(_spec(strategy), progress=progress)
        assert not _ahead_threads()  # joined when training ends
        # The thread runs during training with the setting on, never with it off.
        assert max(seen) == (1 if flag == "1" else 0)
    for on, off in zip(results["1"], results["0"], strict=True):
        assert on.weights is not None and off.weights is not None
        w_on, w_off = safetensors.torch.load(on.weights), safetensors.torch.load(off.weights)
        assert w_on.keys() == w_off.keys()
        assert all(torch.equal(w_on[name], w_off[name]) for name in w_on)
        assert on.history == off.history and on.trajectories == off.trajectories


def test_the_thread_is_joined_when_training_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSWEEP_NOISE_AHEAD", "1")

    def progress(p: Progress) -> None:
        if p.step == 3:
            assert _ahead_threads()
            raise KeyboardInterrupt  # a cancellation, say

    with pytest.raises(KeyboardInterrupt):
        train_pack(_spec("fixed"), progress=progress)
    assert not _ahead_threads()
