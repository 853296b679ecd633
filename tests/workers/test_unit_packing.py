"""The pack memory estimate counts a unit's row slots: with a privacy unit a batch of b units
holds up to b x rows_per_unit rows, and capped units hold every row's full gradient."""

from __future__ import annotations

from dataclasses import replace

from workers.datasets.records import DatasetSpec
from workers.models.descriptors import ModelSpec
from workers.packing import declares_units, estimate_trial_bytes
from workers.training.specs import PackSpec, TrialSpec

ROWS = PackSpec(
    dataset=DatasetSpec("mnist1d"),
    model=ModelSpec("mlp", {}),
    strategy="fixed",
    trials=[TrialSpec(lr=0.1)],
    batch_size=256,
)


def _bytes(spec: PackSpec) -> int:
    return estimate_trial_bytes(spec, input_shape=(40,), num_classes=10)


def test_units_are_declared_by_the_spec_or_by_a_shared_sets_descriptor() -> None:
    assert not declares_units(DatasetSpec("mnist1d"))
    assert declares_units(DatasetSpec("mnist1d-people"))
    assert declares_units(DatasetSpec("csv", path="x.csv", privacy_unit="patient_id"))


def test_a_unit_batch_is_sized_by_its_row_slots_and_capped_by_its_gradients() -> None:
    people = replace(ROWS, dataset=DatasetSpec("mnist1d-people"), rows_per_unit=8)
    rows, units = _bytes(ROWS), _bytes(people)
    assert units > rows
    assert _bytes(replace(people, rows_per_unit=16)) > units
    assert _bytes(replace(people, unit_bounding="capped")) > 4 * units
    # Without a unit, the unit settings change nothing.
    assert _bytes(replace(ROWS, rows_per_unit=64, unit_bounding="capped")) == rows
