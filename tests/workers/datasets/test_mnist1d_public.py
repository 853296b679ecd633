"""``mnist1d-public``: 1,000 MNIST-1D signals of another generation, declared public, of the
same shape, classes and bounds as mnist1d, and disjoint from mnist1d and mnist1d-test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sweeper.datasets.resolution import is_public, public_eval_spec
from workers.datasets import builtin, data_cache
from workers.datasets.descriptors import MNIST1D, MNIST1D_PUBLIC, get_dataset_descriptor
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec

pytest.importorskip("mnist1d")


def test_mnist1d_public_is_declared_public_with_mnist1d_s_shape_classes_and_bounds() -> None:
    d = get_dataset_descriptor("mnist1d-public")
    assert d is MNIST1D_PUBLIC and d.public and d.shared and d.size == 1000
    assert (d.classes, d.input_bounds) == (MNIST1D.classes, MNIST1D.input_bounds)
    assert is_public(None, "mnist1d-public")  # type: ignore[arg-type]
    # Usable wherever a public dataset is: eval.dataset, tune_on, pretrain_on.
    assert public_eval_spec(None, "mnist1d-public", training="mnist1d").name == "mnist1d-public"


def test_mnist1d_public_loads_1000_records_of_every_class() -> None:
    data = load_dataset(DatasetSpec("mnist1d-public"))
    assert data.n_train + len(data.x_test) == 1000
    assert data.input_shape == (40,) and data.classes == [str(c) for c in range(10)]
    assert data.input_scaling["method"] == "declared"
    assert set(np.unique(np.concatenate([data.y_train, data.y_test]))) == set(range(10))


def test_no_record_of_mnist1d_public_is_one_of_mnist1d_or_mnist1d_test() -> None:
    x_public, _ = builtin.mnist1d_public_parts()
    x, _, x_test, _ = builtin.mnist1d_parts()
    assert x_public.shape == (1000, 40)
    theirs = {row.tobytes() for row in np.concatenate([x, x_test])}
    assert not any(row.tobytes() in theirs for row in x_public)
    # Nor a near copy: the closest pair is far apart next to the signals' scale (std 1).
    theirs_arr = np.concatenate([x, x_test])
    nearest = min(float(np.abs(theirs_arr - row).max()) for row in x_public[:100])
    assert nearest > 1e-3


def test_mnist1d_public_is_generated_once_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(data_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(builtin, "_MNIST1D_PARTS", {})
    first, y = builtin.mnist1d_public_parts()
    cached = list(tmp_path.glob("mnist1d-*-seed1.npz"))
    assert len(cached) == 1
    monkeypatch.setattr(builtin, "_MNIST1D_PARTS", {})
    again, y_again = builtin.mnist1d_public_parts()  # read back from the file
    assert np.array_equal(first, again) and np.array_equal(y, y_again)
