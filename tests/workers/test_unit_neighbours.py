"""Neighbouring datasets at the unit level (issue 54), at the worker: removing one whole unit
(every row of it) moves a step's pre-noise sums by at most the sensitivity C (times the
check's tolerance), whether the unit has 1 row or 50.

Reproducible streams (the labelled mode) and q = 1 make both worlds sample every unit, and
R = 64 uses every row of every unit, so the two steps differ only by the removed unit: what the
noise must hide. At the row level a 50-row person could move the sums by up to 50 C.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.workers.streams import noise_stream, sample_stream
from workers.engine import DPEngine
from workers.generic.dispatch import build_pack_model
from workers.optim import PackedOptimizer
from workers.release_checks import _ENFORCED
from workers.strategies import NoiseSource, get_strategy
from workers.unit_step import unit_sums

CLIP = 0.5
SMALL, BIG = 3, 7  # the unit of 1 row and the unit of 50 rows


def _data() -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """12 units of 1-6 rows, but unit SMALL of 1 row and unit BIG of 50; rows interleaved."""
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 7, size=12)
    sizes[SMALL], sizes[BIG] = 1, 50
    ids = rng.permutation(np.repeat(np.arange(12), sizes))
    g = torch.Generator().manual_seed(6)
    # Large inputs: every row's gradient is clipped, so each row moves the sums by C.
    x = 10 * torch.randn(len(ids), 6, generator=g)
    return x, torch.randint(0, 3, (len(ids),), generator=g), ids


def _without(
    data: tuple[torch.Tensor, torch.Tensor, np.ndarray], unit: int
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The neighbour: every row of ``unit`` removed, the other units' ids kept dense."""
    x, y, ids = data
    keep = ids != unit
    rest = ids[keep]
    return x[keep], y[keep], np.where(rest > unit, rest - 1, rest)


def _sums(data: tuple[torch.Tensor, torch.Tensor, np.ndarray], bounding: str) -> torch.Tensor:
    """One step's pre-noise gradient sum (not divided by b) at fixed parameters."""
    x, y, ids = data
    torch.manual_seed(0)
    model, _ = build_pack_model([torch.nn.Sequential(torch.nn.Linear(6, 3))])
    strategy = get_strategy("fixed")([{"clip": CLIP}], n_layers=model.n_param_layers, device="cpu")
    engine = DPEngine(
        model=model,  # type: ignore[arg-type]
        strategy=strategy,
        optimizer=PackedOptimizer("sgd", torch.full((1,), 0.1)),
        x=x,
        y=y,
        task="classification",
        sample_rate=1.0,
        noise_multiplier=torch.ones(1),
        sample_streams=[sample_stream(1)],
        noise=NoiseSource([noise_stream(2)], "cpu"),
        units=ids,
        unit_bounding=bounding,
        rows_per_unit=64,
    )
    assert engine.units is not None
    batch = engine.units.sample(1.0, engine.sample_streams, engine.device)
    _, totals, _ = unit_sums(engine, batch)
    return totals[0][0] * engine.expected_batch_size


@pytest.mark.parametrize("bounding", ["mean", "capped"])
@pytest.mark.parametrize("removed", [SMALL, BIG], ids=["unit-of-1-row", "unit-of-50-rows"])
def test_removing_a_whole_unit_moves_the_sums_by_at_most_c(bounding: str, removed: int) -> None:
    data = _data()
    assert int((data[2] == removed).sum()) == (1 if removed == SMALL else 50)
    diff = (_sums(data, bounding) - _sums(_without(data, removed), bounding)).norm()
    assert 0.0 < float(diff) <= CLIP * _ENFORCED + 1e-5
