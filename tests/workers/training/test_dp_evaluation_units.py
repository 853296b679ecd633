"""DP evaluation by privacy unit (issue 54): each evaluation unit adds the mean of its rows'
correctness, so one unit, whatever its number of rows, moves the released count by at most 1;
without units the count is the rows' count as before."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import numpy as np
import pytest
import torch

from dpsweep.errors import PrivacyError
from tests.workers.training.test_dp_evaluation import _pack
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.models import ModelSpec, build_model
from workers.packed import PackedModel
from workers.randomness import NoiseSource, TrialRandomness
from workers.training.evaluation import (
    _correct_counts,
    _correct_unit_means,
    _dp_evaluation,
    _noisy_accuracy,
)

pytest.importorskip("mnist1d")

PEOPLE = DatasetSpec(
    "mnist1d-people", evaluation="public", eval_dataset=DatasetSpec("mnist1d-test")
)


def _model(k: int = 2) -> PackedModel:
    modules = [
        cast(
            torch.nn.Sequential,
            build_model(ModelSpec("logreg"), input_shape=(40,), num_classes=10, seed=s),
        )
        for s in range(k)
    ]
    return PackedModel(modules, device=torch.device("cpu"))


def _people() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mnist1d-people's records (all of them: mode public) and each row's person."""
    data = load_dataset(PEOPLE)
    assert data.units_train is not None
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    return x, y, torch.from_numpy(data.units_train)


def _without(
    x: torch.Tensor, y: torch.Tensor, units: torch.Tensor, unit: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The neighbouring records without one whole unit, ids made dense again."""
    keep = units != unit
    rest = units[keep]
    return x[keep], y[keep], torch.where(rest > unit, rest - 1, rest)


def _exact(model: PackedModel, x: torch.Tensor, y: torch.Tensor, units: torch.Tensor) -> float:
    return float(_correct_unit_means(model, x, y, units, 512)[0][0])


def test_a_unit_of_fifty_rows_moves_the_count_by_at_most_one() -> None:
    model = _model()
    x, y, units = _people()
    sizes = torch.bincount(units)
    big = int(sizes.argmax())
    assert int(sizes[big]) == 50
    # The worst case for a count of rows: every row of the 50-row person predicted right.
    with torch.no_grad():
        out, _ = model.forward(x.unsqueeze(0).expand(model.k, *x.shape))
    y = torch.where(units == big, out[0].argmax(dim=-1), y)
    full = _exact(model, x, y, units)
    rows = float(_correct_counts(model, x, y, 512)[0])
    x_rest, y_rest, _ = _without(x, y, units, big)
    assert rows - float(_correct_counts(model, x_rest, y_rest, 512)[0]) == 50
    # By unit the person adds its mean correctness, exactly 1 here.
    assert full - _exact(model, *_without(x, y, units, big)) == pytest.approx(1.0, abs=1e-9)
    # Any one person removed moves it by at most 1.
    for unit in range(0, int(units.max()) + 1, 7):
        assert abs(full - _exact(model, *_without(x, y, units, unit))) <= 1.0 + 1e-9


def test_the_count_by_unit_is_the_sum_of_each_units_mean() -> None:
    model = _model()
    x, y, units = _people()
    with torch.no_grad():
        out, _ = model.forward(x.unsqueeze(0).expand(model.k, *x.shape))
    ok = (out.argmax(dim=-1) == y.unsqueeze(0)).double().numpy()
    u = units.numpy()
    expect = [sum(ok[k, u == p].mean() for p in range(u.max() + 1)) for k in range(model.k)]
    got, n_units = _correct_unit_means(model, x, y, units, 300)  # chunks cut units apart
    assert n_units == int(u.max()) + 1
    np.testing.assert_allclose(got.numpy(), expect, rtol=1e-12)


def test_one_row_per_unit_releases_exactly_the_row_count() -> None:
    """With every row its own unit, the same noise gives bit-for-bit the row-level release."""
    model = _model()
    x, y, _ = _people()

    def release(units: torch.Tensor | None) -> list[float]:
        noise = NoiseSource([TrialRandomness.reproducible(s).evaluation for s in (1, 2)], "cpu")
        out = _noisy_accuracy(model, x, y, noise, noise_multiplier=3.0, n_records=4000, units=units)
        return [m["accuracy"] for m in out]

    assert release(torch.arange(len(x))) == release(None)


def test_the_denominator_is_the_number_of_units() -> None:
    model = _model(1)
    x, y, units = _people()
    noise = NoiseSource([TrialRandomness.reproducible(0).evaluation], "cpu")
    exact, n_units = _correct_unit_means(model, x, y, units, 2048)
    (got,) = _noisy_accuracy(model, x, y, noise, noise_multiplier=1e-6, units=units)
    assert got["accuracy"] == pytest.approx(float(exact[0]) / n_units, abs=1e-6)
    (declared,) = _noisy_accuracy(
        model, x, y, noise, noise_multiplier=1e-6, units=units, n_records=2 * n_units
    )
    assert declared["accuracy"] == pytest.approx(float(exact[0]) / (2 * n_units), abs=1e-6)


def test_units_that_are_not_one_per_row_are_refused() -> None:
    model = _model(1)
    x, y, units = _people()
    noise = NoiseSource([TrialRandomness.reproducible(0).evaluation], "cpu")
    for bad in (units[:-1], units - 1):
        with pytest.raises(PrivacyError, match="one unit id >= 0 per evaluation row"):
            _noisy_accuracy(model, x, y, noise, noise_multiplier=1.0, units=bad)


def test_dp_evaluation_with_units_needs_each_rows_unit() -> None:
    data = load_dataset(DatasetSpec("mnist1d-people", evaluation="dp"))
    assert data.units_test is not None and data.planning_n_eval == round(0.2 * 381)
    spec = _pack(dataset=DatasetSpec("mnist1d-people", evaluation="dp"))
    assert _dp_evaluation(spec, data, "classification")
    with pytest.raises(PrivacyError, match="not each row's unit"):
        _dp_evaluation(spec, replace(data, units_test=None), "classification")
    # Public evaluation records with units need no count at all.
    public = load_dataset(PEOPLE)
    assert not _dp_evaluation(replace(spec, eval_noise_multiplier=None), public, "classification")
