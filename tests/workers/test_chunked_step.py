"""Logical batches in physical chunks, and augmentation multiplicity: exactness.

A logical batch processed in chunks of 1, 7 and 64 releases the same noised update as the
one-piece step (the same draws: reproducible streams), on the packed and the generic path, in a
pack of K = 3, with the quantile and online strategies' extra releases, and with augmentation
multiplicity. Tolerance: float32 summation order only, atol 1e-5 and rtol 1e-4 on the updated
parameters (the released sums differ by a few ulps; the noise is the same draws).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.workers.generic.nets import ResidualConv
from tests.workers.streams import noise_stream, sample_stream
from workers.augment import Augmenter, DenseGrads, augmented_per_sample
from workers.chunked_step import chunk_count, logical_bound
from workers.engine import DPEngine
from workers.generic.dispatch import build_pack_model
from workers.optim import PackedOptimizer
from workers.strategies import NoiseSource, get_strategy

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")

N = 40
ATOL, RTOL = 1e-5, 1e-4


def _packed_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3 * 8 * 8, 4),
    )


def _generic_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return ResidualConv(classes=4)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 1, 8, 8, generator=g), torch.randint(0, 4, (N,), generator=g)


def _engine(
    path: str,
    strategy: str,
    params: dict[str, Any],
    k: int,
    *,
    physical: int | None = None,
    augmenter: Augmenter | None = None,
) -> DPEngine:
    make = _packed_net if path == "packed" else _generic_net
    model, got = build_pack_model([make(i) for i in range(k)])
    assert got == path
    x, y = _data()
    strat = get_strategy(strategy)([params] * k, n_layers=model.n_param_layers, device="cpu")
    return DPEngine(
        model=model,  # type: ignore[arg-type]
        strategy=strat,
        optimizer=PackedOptimizer("sgd", torch.full((k,), 0.5)),
        x=x,
        y=y,
        task="classification",
        sample_rate=0.3,
        noise_multiplier=torch.full((k,), 0.3),
        sample_streams=[sample_stream(10 + i) for i in range(k)],
        noise=NoiseSource([noise_stream(20 + i) for i in range(k)], "cpu"),
        physical_batch_size=physical,
        augmenter=augmenter,
    )


def _run(engine: DPEngine, steps: int = 2) -> torch.Tensor:
    for _ in range(steps):
        engine.step()
    return engine.model.flat.detach().clone()


CASES = [
    ("fixed", {"clip": 0.5, "clip_style": "flat"}),
    ("fixed", {"clip": 0.5, "clip_style": "layerwise"}),
    ("quantile", {"clip_init": 0.5}),
    ("online", {"clip_init": 0.5}),
    ("nonprivate", {}),
]


# Packs of 3 for every strategy; packs of 1 where the engine takes another route (a pack of one
# is never padded, and online's pack of one takes the split sums).
PACKS = [(*c, 3) for c in CASES] + [(*CASES[0], 1), (*CASES[3], 1)]


@pytest.mark.parametrize("path", ["packed", "generic"])
@pytest.mark.parametrize(("strategy", "params", "k"), PACKS)
def test_chunks_equal_one_piece(path: str, strategy: str, params: dict[str, Any], k: int) -> None:
    ref = _engine(path, strategy, params, k)
    whole = _run(ref)
    for physical in (1, 7, 64):
        engine = _engine(path, strategy, params, k, physical=physical)
        chunked = _run(engine)
        torch.testing.assert_close(chunked, whole, atol=ATOL, rtol=RTOL)
        # The strategy's state (its clip, from the noised quantile count) moved alike.
        for name, value in engine.strategy.state().items():
            torch.testing.assert_close(value, ref.strategy.state()[name], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("path", ["packed", "generic"])
def test_multiplicity_one_without_ops_is_the_plain_step(path: str) -> None:
    params = {"clip": 0.5, "clip_style": "flat"}
    whole = _run(_engine(path, "fixed", params, 3))
    aug = Augmenter(multiplicity=1, ops=[], seeds=[0, 1, 2])
    torch.testing.assert_close(
        _run(_engine(path, "fixed", params, 3, augmenter=aug)), whole, atol=ATOL, rtol=RTOL
    )


@pytest.mark.parametrize("path", ["packed", "generic"])
@pytest.mark.parametrize(("strategy", "params"), CASES[:4])
def test_augmented_chunks_equal_one_piece(path: str, strategy: str, params: dict[str, Any]) -> None:
    def aug() -> Augmenter:
        return Augmenter(multiplicity=4, ops=["crop", "flip"], seeds=[5, 6, 7])

    whole = _run(_engine(path, strategy, params, 3, augmenter=aug()))
    for physical in (1, 7, 64):
        chunked = _run(_engine(path, strategy, params, 3, physical=physical, augmenter=aug()))
        torch.testing.assert_close(chunked, whole, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("path", ["packed", "generic"])
def test_augmented_gradient_is_the_mean_of_copies_and_clipped(path: str) -> None:
    """Each example's gradient is the mean of its copies' exact gradients; clipped, its
    contribution has norm <= C (the sensitivity is unchanged)."""
    m = 3
    engine = _engine(path, "fixed", {"clip": 0.05, "clip_style": "flat"}, 2)
    engine.augmenter = Augmenter(multiplicity=m, ops=["crop", "flip"], seeds=[1, 2])
    engine.augmenter.begin_step(5)
    x, y = _data()
    xb = x[:5].unsqueeze(0).expand(2, -1, -1, -1, -1)
    yb = y[:5].unsqueeze(0).expand(2, -1)
    mask = torch.ones(2, 5)
    dense, sq, ctx = augmented_per_sample(engine, xb, yb, mask)
    assert isinstance(dense, DenseGrads) and sq is not None
    # The reference: the copies (same public generator draws) and their per-example gradients.
    ref_aug = Augmenter(multiplicity=m, ops=["crop", "flip"], seeds=[1, 2])
    ref_aug.begin_step(5)
    xa, ya, ma = ref_aug.copies(xb, yb, mask)
    infos, _, _ = engine.per_sample(xa, ya, ma)
    g = engine.model.per_sample_grads(infos).view(2, 5, m, -1).mean(dim=2)
    torch.testing.assert_close(dense.grads, g)
    torch.testing.assert_close(sq.sum(-1), g.pow(2).sum(-1), rtol=1e-5, atol=1e-7)
    clip = engine.strategy.clip(ctx)
    contrib = clip.weights[..., 0] * sq.sum(-1).sqrt()
    assert bool((contrib <= 0.05 * (1 + 1e-5)).all())
    assert bool((sq.sum(-1).sqrt() > 0.05).any())  # the bound was binding for some examples


def test_the_chunk_count_does_not_follow_the_realised_batch() -> None:
    b = 40.0
    bound = logical_bound(b)
    counts = {chunk_count(r, physical=16, expected_batch_size=b) for r in range(0, bound + 1)}
    assert counts == {-(-bound // 16)}
    assert chunk_count(bound + 100, physical=16, expected_batch_size=b) > -(-bound // 16)


@pytest.mark.parametrize("path", ["packed", "generic"])
@pytest.mark.parametrize(("k", "physical"), [(3, None), (1, 8), (3, 8)])
def test_a_hostile_example_0_does_not_poison_the_padding(
    path: str, k: int, physical: int | None
) -> None:
    # Packs and chunks pad with example 0 at weight 0. An input whose loss is not finite
    # there would make every slot's gradient NaN (0 * NaN is NaN), so whether one record is in
    # the data would decide whether every trial diverges: padding reads a zero input instead.
    engine = _engine(path, "fixed", CASES[0][1], k, physical=physical)
    engine.x[0] = float("inf")
    flat = _run(engine, steps=4)
    assert torch.isfinite(flat).all()
    assert not torch.equal(flat, _engine(path, "fixed", CASES[0][1], k).model.flat)
