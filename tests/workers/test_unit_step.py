"""User-level DP steps (issue 54, :mod:`workers.unit_step`): each sampled unit moves every
release by at most its sensitivity, whatever its rows; packs, chunks and both bounding modes.

The real engine on real models (packed and generic paths), no mocks. Pre-noise sums are read
with :func:`workers.unit_step.unit_sums` (what :func:`~workers.chunked_step.noised_totals`
then noises), on batches of units chosen by the test.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from dpsweep.errors import ConfigError, PrivacyError
from tests.workers.generic.nets import ResidualConv
from tests.workers.streams import noise_stream, sample_stream
from workers.augment import Augmenter
from workers.chunked_step import weighted_sums
from workers.engine import DPEngine
from workers.generic.dispatch import build_pack_model
from workers.optim import PackedOptimizer
from workers.release_checks import _ENFORCED
from workers.strategies import NoiseSource, get_strategy
from workers.unit_step import (
    _capped,
    _capped_dense,
    _check_unit_scalar,
    _check_unit_sum,
    _row_norms,
    unit_sums,
)
from workers.units import UnitBatch

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")

ATOL, RTOL = 1e-5, 1e-4
FIXED = {"clip": 0.5, "clip_style": "flat"}


def _packed_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(192, 4))


def _generic_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return ResidualConv(classes=4)


def _data(n: int = 60) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Images, labels and units of 1 to 9 rows (dense ids, rows interleaved)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)
    sizes = np.random.default_rng(0).integers(1, 10, size=n)
    ids = np.repeat(np.arange(n), sizes)[:n]
    return x, y, np.random.default_rng(1).permutation(ids)


def _engine(
    path: str,
    strategy: str,
    params: dict[str, Any],
    k: int,
    *,
    bounding: str = "mean",
    r: int = 3,
    physical: int | None = None,
    seeds: list[int] | None = None,
    data: tuple[torch.Tensor, torch.Tensor, np.ndarray] | None = None,
    nets: list[nn.Module] | None = None,
) -> DPEngine:
    make = _packed_net if path == "packed" else _generic_net
    seeds = seeds if seeds is not None else list(range(k))
    model, got = build_pack_model(nets if nets is not None else [make(s) for s in seeds])
    assert got == path
    x, y, units = data if data is not None else _data()
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
        sample_streams=[sample_stream(10 + s) for s in seeds],
        noise=NoiseSource([noise_stream(20 + s) for s in seeds], "cpu"),
        physical_batch_size=physical,
        units=units,
        unit_bounding=bounding,
        rows_per_unit=r,
    )


def _run(engine: DPEngine, steps: int = 2) -> torch.Tensor:
    for _ in range(steps):
        engine.step()
    return engine.model.flat.detach().clone()


CASES = [
    ("fixed", FIXED),
    ("fixed", {"clip": 0.5, "clip_style": "layerwise"}),
    ("quantile", {"clip_init": 0.5}),
    ("online", {"clip_init": 0.5}),
    ("nonprivate", {}),
]


# Every strategy on the packed path; the generic path (slower per chunk) with two.
CHUNKED = [("packed", *c) for c in CASES] + [("generic", *c) for c in (CASES[0], CASES[2])]


@pytest.mark.parametrize("bounding", ["mean", "capped"])
@pytest.mark.parametrize(("path", "strategy", "params"), CHUNKED)
def test_chunked_unit_step_equals_one_piece(
    path: str, strategy: str, params: dict[str, Any], bounding: str
) -> None:
    ref = _engine(path, strategy, params, 3, bounding=bounding)
    whole = _run(ref)
    # 1 and 2 units per chunk (R = 3)
    for physical in (1, 7) if path == "packed" else (7,):
        engine = _engine(path, strategy, params, 3, bounding=bounding, physical=physical)
        torch.testing.assert_close(_run(engine), whole, atol=ATOL, rtol=RTOL)
        for name, value in engine.strategy.state().items():
            torch.testing.assert_close(value, ref.strategy.state()[name], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("bounding", ["mean", "capped"])
@pytest.mark.parametrize("path", ["packed", "generic"])
@pytest.mark.parametrize(("strategy", "params"), [CASES[0], CASES[2]])
def test_a_pack_of_k_equals_k_single_trials(
    path: str, strategy: str, params: dict[str, Any], bounding: str
) -> None:
    pack = _run(_engine(path, strategy, params, 3, bounding=bounding), steps=3)
    for t in range(3):
        alone = _run(_engine(path, strategy, params, 1, bounding=bounding, seeds=[t]), steps=3)
        torch.testing.assert_close(pack[t], alone[0], atol=ATOL, rtol=RTOL)


# -- sensitivity: one unit moves each release by at most S ---------------------------------


def _linear(seed: int = 0, *, zero: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(6, 3, bias=False))
    if zero:
        nn.init.zeros_(net[1].weight)
    return net


def _hostile_data() -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Unit 0: one row; unit 1: 50 rows; units 2..9: two ordinary rows each. Units 0 and 1
    are hostile: huge inputs, all alike (so their rows' gradients align and add up)."""
    g = torch.Generator().manual_seed(3)
    big = torch.full((1, 6), 1e4)
    x = torch.cat([big, big.repeat(50, 1), torch.randn(16, 6, generator=g)])
    y = torch.cat([torch.zeros(51, dtype=torch.long), torch.randint(0, 3, (16,), generator=g)])
    ids = np.concatenate([[0], np.full(50, 1), np.repeat(np.arange(2, 10), 2)])
    return x, y, ids


def _batch(engine: DPEngine, units: list[int]) -> UnitBatch:
    """A batch of exactly ``units`` (their first R rows) for every trial of the pack, as the
    sampler lays it."""
    assert engine.units is not None
    index, r, k = engine.units.index, engine.units.rows_per_unit, engine.k
    idx = torch.zeros(k, len(units) * r, dtype=torch.long)
    mask = torch.zeros(k, len(units) * r)
    counts = torch.zeros(k, len(units))
    for j, u in enumerate(units):
        rows = index.order[index.offsets[u] : index.offsets[u + 1]][:r]
        idx[:, j * r : j * r + len(rows)] = torch.from_numpy(rows)
        mask[:, j * r : j * r + len(rows)] = 1.0
        counts[:, j] = len(rows)
    return UnitBatch(idx=idx, mask=mask, counts=counts, rows_per_unit=r)


def _sums(engine: DPEngine, units: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The pre-noise gradient sum (not over b) and the first scalar release's total."""
    _, totals, scalars = unit_sums(engine, _batch(engine, units))
    b = engine.expected_batch_size
    return totals[0][0] * b, (scalars[0][0, 0] if scalars else None)


@pytest.mark.parametrize("bounding", ["mean", "capped"])
@pytest.mark.parametrize("r", [1, 8, 64])
@pytest.mark.parametrize(("strategy", "params"), [CASES[0], CASES[1], CASES[2], CASES[3]])
def test_a_unit_of_1_or_50_hostile_rows_moves_the_sum_by_at_most_s(
    bounding: str, r: int, strategy: str, params: dict[str, Any]
) -> None:
    engine = _engine(
        "packed", strategy, params, 1, bounding=bounding, r=r, data=_hostile_data(),
        nets=[_linear()],
    )  # fmt: skip
    s = 0.5
    everyone = list(range(10))
    full, count_full = _sums(engine, everyone)
    for hostile in (0, 1):
        alone, count_alone = _sums(engine, [hostile])
        assert float(alone.norm()) <= s * _ENFORCED
        # Huge rows are clipped to S: the bound is reached (not a vacuous zero contribution).
        assert float(alone.norm()) >= 0.99 * s
        without, count_without = _sums(engine, [u for u in everyone if u != hostile])
        assert float((full - without).norm()) <= s * _ENFORCED * (1 + 1e-5)
        if count_full is not None:  # the quantile count: 1/2 per unit
            assert count_alone is not None and count_without is not None
            assert abs(float(count_alone)) <= 0.5 * _ENFORCED
            assert abs(float(count_full - count_without)) <= 0.5 * _ENFORCED


def test_capped_and_mean_differ_on_opposite_rows() -> None:
    """Rows with gradients 10 v and -v (a zero linear model, inputs 10 x and -x): mean of the
    clipped rows is C v^ - C v^ = 0; the clipped mean of 4.5 v is C v^."""
    x0 = torch.randn(1, 6, generator=torch.Generator().manual_seed(5))
    x = torch.cat([10 * x0, -x0, x0])
    y = torch.zeros(3, dtype=torch.long)
    ids = np.array([0, 0, 1])  # unit 0 the crafted pair; unit 1 the direction v alone
    got = {}
    for bounding in ("mean", "capped"):
        engine = _engine(
            "packed", "fixed", {"clip": 1e-3, "clip_style": "flat"}, 1, bounding=bounding,
            data=(x, y, ids), nets=[_linear(zero=True)],
        )  # fmt: skip
        got[bounding] = _sums(engine, [0])[0]
        direction = _sums(engine, [1])[0]  # C v^: the row x0 alone, clipped
    assert float(got["mean"].norm()) < 1e-8
    torch.testing.assert_close(got["capped"], direction, atol=1e-8, rtol=1e-4)
    assert abs(float(got["capped"].norm()) - 1e-3) < 1e-7


@pytest.mark.parametrize("bounding", ["mean", "capped"])
def test_a_unit_with_non_finite_rows_cannot_make_the_run_fail(bounding: str) -> None:
    x, y, ids = _hostile_data()
    x[1] = float("inf")  # one of unit 1's rows
    x[2] = float("nan")
    engine = _engine(
        "packed", "fixed", FIXED, 1, bounding=bounding, r=64, data=(x, y, ids), nets=[_linear()]
    )
    alone, _ = _sums(engine, [1])
    assert torch.isfinite(alone).all() and float(alone.norm()) <= 0.5 * _ENFORCED
    flat = _run(engine, steps=3)
    assert torch.isfinite(flat).all()


@pytest.mark.parametrize("bounding", ["mean", "capped"])
@pytest.mark.parametrize(("strategy", "params"), [CASES[0], CASES[2], CASES[4]])
def test_a_step_without_any_sampled_unit(
    bounding: str, strategy: str, params: dict[str, Any]
) -> None:
    engine = _engine("packed", strategy, params, 2, bounding=bounding)
    clip, totals, scalars = unit_sums(engine, _batch(engine, []).padded(0))
    assert all(float(t.abs().sum()) == 0.0 for t in totals)
    assert all(float(t.abs().sum()) == 0.0 for t in scalars)
    engine.sample_rate = 1e-9  # no unit sampled (q and b are otherwise public constants)
    before = engine.model.flat.detach().clone()
    flat = _run(engine, steps=2)  # noise only
    assert torch.isfinite(flat).all() and clip is not None
    if engine.strategy.private:
        assert not torch.equal(flat, before)


@pytest.mark.parametrize("bounding", ["mean", "capped"])
def test_a_hostile_example_0_does_not_poison_the_padding(bounding: str) -> None:
    """Unused row slots are padding; they must not read row 0's (non-finite) input."""
    x, y, ids = _hostile_data()
    x[0] = float("inf")  # unit 0's one row, and the row the padding would read
    engine = _engine(
        "packed", "fixed", FIXED, 2, bounding=bounding, r=4, data=(x, y, ids),
        nets=[_linear(0), _linear(1)],
    )  # fmt: skip
    ordinary, _ = _sums(engine, [2, 3])  # units of 2 rows: 2 padding slots each
    assert torch.isfinite(ordinary).all() and float(ordinary.norm()) > 0
    assert torch.isfinite(_run(engine, steps=3)).all()


def test_a_claim_the_unit_sum_breaks_is_refused_without_numbers() -> None:
    sq = torch.full((1, 4, 1), 4.0)  # rows of norm 2, two units of two rows
    weights = torch.full((1, 4, 1), 0.2)  # each row within 0.5 alone; each unit 0.8
    with pytest.raises(PrivacyError) as err:
        _check_unit_sum("grad", sq, weights, torch.tensor([0.5]), 2)
    assert "release 'grad' of trial 0" in str(err.value)
    assert not any(ch in str(err.value) for ch in "2345689")
    _check_unit_sum("grad", sq, weights, torch.tensor([0.8]), 2)  # within: no error
    with pytest.raises(PrivacyError):
        _check_unit_scalar("count", torch.full((1, 4), 0.3), torch.tensor([0.5]), 2)


def test_unsupported_unit_settings_are_refused_before_any_step() -> None:
    def build(**kw: Any) -> DPEngine:
        return _engine("packed", kw.pop("strategy", "fixed"), kw.pop("params", FIXED), 1, **kw)

    with pytest.raises(ConfigError) as err:
        build(r=0)
    assert err.value.field == "training.rows_per_unit"
    with pytest.raises(ConfigError) as err:
        build(bounding="median")
    assert err.value.field == "training.unit_bounding"
    with pytest.raises(ConfigError) as err:
        build(strategy="bam", params={"clip": 0.5, "bam_lambda": 0.1}, bounding="capped")
    assert err.value.field == "strategy"
    build(strategy="bam", params={"clip": 0.5, "bam_lambda": 0.1}).step()  # mean: supported
    x, y, ids = _data()
    with pytest.raises(ConfigError) as err:
        _engine("packed", "fixed", FIXED, 1, data=(x, y, ids[:-1]))
    assert err.value.field == "dataset.privacy_unit"


def test_augmentation_with_units_is_refused() -> None:
    model, _ = build_pack_model([_packed_net(0)])
    x, y, ids = _data()
    strat = get_strategy("fixed")([FIXED], n_layers=model.n_param_layers, device="cpu")
    with pytest.raises(ConfigError) as err:
        DPEngine(
            model=model,  # type: ignore[arg-type]
            strategy=strat,
            optimizer=PackedOptimizer("sgd", torch.full((1,), 0.5)),
            x=x, y=y, task="classification", sample_rate=0.3,
            noise_multiplier=torch.full((1,), 0.3),
            sample_streams=[sample_stream(1)],
            noise=NoiseSource([noise_stream(2)], "cpu"),
            augmenter=Augmenter(multiplicity=2, ops=[], seeds=[0]),
            units=ids,
        )  # fmt: skip
    assert err.value.field == "training.augment"


@pytest.mark.parametrize("path", ["packed", "generic"])
@pytest.mark.parametrize(("strategy", "params"), CASES[:3])
def test_capped_units_clipped_by_their_norms_equal_their_means_built(
    path: str, strategy: str, params: dict[str, Any]
) -> None:
    # Each unit is clipped by its mean gradient's norm computed from the rows' infos, and the
    # rows are weighed; the dense form builds every unit's mean. The same releases.
    engine = _engine(path, strategy, params, 2, bounding="capped", r=4)
    batch = _batch(engine, [0, 2, 3, 5, 8, 13])
    infos, _, ctx = _row_norms(engine, batch)
    clip, rows = _capped(engine, batch, infos, ctx.mask)
    assert rows is infos  # the rows' infos, no dense means
    dense_clip, dense = _capped_dense(engine, batch, infos, ctx.mask)
    assert dense is not infos
    got = [torch.zeros_like(engine.grad) for _ in range(1 + len(clip.extra))]
    want = [torch.zeros_like(engine.grad) for _ in got]
    weighted_sums(engine, got, rows, [clip.weights] + [e.weights for e in clip.extra])
    weighted_sums(engine, want, dense, [dense_clip.weights] + [e.weights for e in dense_clip.extra])
    for a, b in zip(got, want, strict=True):
        assert float(b.norm()) > 0
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)
    for a_sc, b_sc in zip(clip.scalars, dense_clip.scalars, strict=True):
        torch.testing.assert_close(a_sc.values, b_sc.values, atol=ATOL, rtol=RTOL)
