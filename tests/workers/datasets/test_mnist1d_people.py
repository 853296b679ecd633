"""``mnist1d-people``: mnist1d's 4,000 records grouped into synthetic people (issue 54):
deterministic, skewed sizes within [1, 50], correlated rows per person, its unit ``person``,
its people declared, and the same records (one identity) as ``mnist1d``."""

from __future__ import annotations

import numpy as np
import pytest

from dpsweep.errors import DatasetError
from workers.datasets.descriptors import (
    MNIST1D_PEOPLE,
    MNIST1D_PEOPLE_SEED,
    MNIST1D_PEOPLE_UNITS,
    get_dataset_descriptor,
)
from workers.datasets.loading import load_dataset
from workers.datasets.people import MAX_ROWS, MIN_ROWS, group_people, mnist1d_people_units
from workers.datasets.records import DatasetSpec
from workers.datasets.registry import DATASETS

pytest.importorskip("mnist1d")

PUBLIC_EVAL = {"evaluation": "public", "eval_dataset": DatasetSpec("mnist1d-test")}


def test_every_record_belongs_to_one_person_of_1_to_50_rows() -> None:
    units = mnist1d_people_units()
    assert units.shape == (4000,) and units.dtype == np.int64 and units.min() == 0
    sizes = np.bincount(units)
    # Every id is a person with rows; the sizes sum to the 4,000 records.
    assert int(sizes.sum()) == 4000 and int(sizes.min()) >= MIN_ROWS
    assert int(sizes.max()) <= MAX_ROWS
    # The number of people is the descriptor's declaration (a constant of the seed).
    assert len(sizes) == MNIST1D_PEOPLE_UNITS == MNIST1D_PEOPLE.units
    assert str(MNIST1D_PEOPLE_UNITS) in MNIST1D_PEOPLE.description


def test_sizes_are_skewed() -> None:
    sizes = np.bincount(mnist1d_people_units())
    # A power law: many people of a row or two, a few of dozens of rows.
    assert int(np.count_nonzero(sizes == 1)) >= 40
    assert int(sizes.max()) >= 40
    assert float(np.median(sizes)) < float(sizes.mean())
    top = np.sort(sizes)[::-1]
    # The largest tenth of people hold over a third of the records.
    assert int(top[: len(top) // 10].sum()) > 4000 / 3


def test_a_persons_rows_are_mostly_of_one_or_two_classes() -> None:
    units = mnist1d_people_units()
    y = DATASETS["mnist1d"](DatasetSpec("mnist1d")).y
    in_top_two = 0
    for person in range(int(units.max()) + 1):
        counts = np.sort(np.bincount(y[units == person], minlength=10))[::-1]
        in_top_two += int(counts[:2].sum())
    # By class alone (ten balanced classes) two classes would hold about a fifth.
    assert in_top_two / len(y) > 0.8


def test_the_grouping_is_deterministic() -> None:
    y = DATASETS["mnist1d"](DatasetSpec("mnist1d")).y
    first = group_people(y, MNIST1D_PEOPLE_SEED)
    np.testing.assert_array_equal(first, group_people(y.copy(), MNIST1D_PEOPLE_SEED))
    np.testing.assert_array_equal(first, mnist1d_people_units())
    assert not np.array_equal(first, group_people(y, MNIST1D_PEOPLE_SEED + 1))


def test_it_loads_with_public_evaluation_on_mnist1d_test() -> None:
    data = load_dataset(DatasetSpec("mnist1d-people", **PUBLIC_EVAL))  # type: ignore[arg-type]
    assert data.privacy_unit == "person" and data.has_units
    assert (data.n_train, len(data.x_test)) == (4000, 1000)
    assert data.units_test is None and data.n_units_train == MNIST1D_PEOPLE_UNITS
    # Plans count people, from the declaration.
    assert data.declared_units == MNIST1D_PEOPLE_UNITS
    assert data.planning_n_train == data.planning_n_private == MNIST1D_PEOPLE_UNITS
    assert data.planning_n_eval == 1000
    # The same records as mnist1d: one identity, one ledger.
    plain = load_dataset(DatasetSpec("mnist1d", **PUBLIC_EVAL))  # type: ignore[arg-type]
    assert data.content_sha256 == plain.content_sha256
    np.testing.assert_array_equal(data.x_train, plain.x_train)


def test_its_unit_may_be_repeated_but_not_renamed() -> None:
    spec = DatasetSpec("mnist1d-people", privacy_unit="person", **PUBLIC_EVAL)  # type: ignore[arg-type]
    assert load_dataset(spec).privacy_unit == "person"
    with pytest.raises(DatasetError, match="own privacy unit 'person', not 'patient_id'"):
        load_dataset(DatasetSpec("mnist1d-people", privacy_unit="patient_id"))


@pytest.mark.parametrize("mode", ["carve-out", "dp"])
def test_splits_keep_each_person_on_one_side(mode: str) -> None:
    spec = DatasetSpec("mnist1d-people", evaluation=mode, split_seed=3)
    data = load_dataset(spec)
    units = mnist1d_people_units()
    y = DATASETS["mnist1d"](DatasetSpec("mnist1d")).y
    # Each side's people hold all their rows there: as many people as declared, with the
    # sizes they have in the whole set (a person cut in two would be one person more).
    assert data.units_train is not None and data.units_test is not None
    train_sizes, test_sizes = np.bincount(data.units_train), np.bincount(data.units_test)
    assert len(train_sizes) + len(test_sizes) == MNIST1D_PEOPLE_UNITS
    assert sorted([*train_sizes.tolist(), *test_sizes.tolist()]) == sorted(
        np.bincount(units).tolist()
    )
    assert data.n_train + len(data.x_test) == len(y)
    if mode == "carve-out":
        assert len(test_sizes) == round(MNIST1D_PEOPLE_UNITS * 0.2)
    # Planning counts people: the declared number's share.
    assert data.planning_n_eval == round(MNIST1D_PEOPLE_UNITS * 0.2)


def test_the_descriptor_declares_the_unit() -> None:
    d = get_dataset_descriptor("mnist1d-people")
    assert d.shared and not d.public and d.privacy_unit == "person"
    assert d.size == 4000 and d.input_bounds == (-4.0, 4.0)
