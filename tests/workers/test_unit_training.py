"""A pack trains end to end with privacy units (issue 54): the worker builds the unit step
from ``Dataset.units_train`` and the pack's unit settings, and refuses a unit it cannot use."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from dpsweep.errors import ConfigError
from workers.datasets.loading import load_dataset
from workers.datasets.records import Dataset, DatasetSpec
from workers.models import ModelSpec
from workers.strategies import get_strategy
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialSpec
from workers.unit_step import UnitSampling


def _pack(**kw: Any) -> PackSpec:
    base: dict[str, Any] = dict(
        dataset=DatasetSpec("digits"),
        model=ModelSpec("mlp", options={"hidden": [16]}),
        strategy="fixed",
        trials=[
            TrialSpec(lr=0.5, seed=0, noise_multiplier=1.0, params={"clip": 1.0}),
            TrialSpec(lr=1.0, seed=1, noise_multiplier=2.0, params={"clip": 1.0}),
        ],
        batch_size=16,
        steps=3,
        eval_every=3,
        randomness="reproducible",
    )
    base.update(kw)
    return PackSpec(**base)


def _with_units(data: Dataset) -> Dataset:
    """The digits with units of 1 to 7 rows (dense ids, rows interleaved)."""
    n = len(data.y_train)
    sizes = np.random.default_rng(0).integers(1, 8, size=n)
    ids = np.random.default_rng(1).permutation(np.repeat(np.arange(n), sizes)[:n])
    return replace(data, privacy_unit="person", units_train=ids.astype(np.int64))


@pytest.mark.parametrize(("bounding", "physical"), [("mean", None), ("capped", None), ("mean", 8)])
def test_a_pack_trains_with_units(bounding: str, physical: int | None) -> None:
    data = _with_units(load_dataset(DatasetSpec("digits")))
    spec = _pack(unit_bounding=bounding, rows_per_unit=4, physical_batch_size=physical)
    results = train_pack(spec, dataset=data)
    assert len(results) == 2
    for r in results:
        assert r.diverged_at is None and 0.0 <= r.final_metrics["accuracy"] <= 1.0
        # q samples units: b over the units' number, not the rows'
        assert r.sample_rate == 16 / data.n_units_train
        assert r.epsilon is not None and r.epsilon > 0


def test_a_declared_unit_without_ids_is_refused() -> None:
    data = replace(load_dataset(DatasetSpec("digits")), privacy_unit="person")
    with pytest.raises(ConfigError) as err:
        train_pack(_pack(), dataset=data)
    assert err.value.field == "dataset.privacy_unit"


def test_an_audits_canaries_are_units_after_the_datas() -> None:
    """Issue 54's audit seam (workers.unit_canaries): an audit's included canaries are units
    N_units .. of their own rows, sampled by the same unit sampler (no longer refused)."""
    strategy = get_strategy("fixed")([{"clip": 1.0}], n_layers=2, device="cpu")
    units = UnitSampling.build(
        np.array([0, 1, 1, 2], dtype=np.int64), n_rows=4, bounding="mean", rows_per_unit=8,
        strategy=strategy, augmented=False, canary_units=2, canary_rows=4,
    )  # fmt: skip
    assert units.index.n_units == 3 + 2
    assert list(units.index.sizes) == [1, 2, 1, 4, 4]
