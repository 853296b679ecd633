"""MNIST-1D as a built-in: generated deterministically and cached, its sizes, classes and input
bounds declared (never counted), its test part a public evaluation set; the ``cnn1d`` model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpsweep.errors import ConfigError, DatasetError
from sweeper.datasets.names import BUILTIN
from sweeper.datasets.resolution import is_public, public_eval_spec, resolve
from workers.datasets import builtin, data_cache
from workers.datasets.descriptors import MNIST1D, MNIST1D_TEST, DatasetDescriptor
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.models.descriptors import get_model_descriptor

pytest.importorskip("mnist1d")


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory and no records in memory, so the set is generated again."""
    monkeypatch.setenv(data_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(builtin, "_MNIST1D_PARTS", {})
    return tmp_path


def test_mnist1d_loads_4000_training_and_1000_public_test_records() -> None:
    data = load_dataset(
        DatasetSpec("mnist1d", evaluation="public", eval_dataset=DatasetSpec("mnist1d-test"))
    )
    assert (data.n_train, len(data.x_test)) == (4000, 1000)
    assert data.input_shape == (40,) and data.kind == "tabular"
    assert data.num_classes == 10 and data.classes == [str(d) for d in range(10)]
    assert set(np.unique(data.y_train)) == set(range(10))
    assert set(np.unique(data.y_test)) == set(range(10))
    # Declared, not counted: the plan's sizes and the scaling come from the descriptor.
    assert data.declared_size == 4000 and data.planning_n_train == 4000
    assert data.input_scaling["method"] == "declared"
    assert data.input_scaling["bounds"] == [-4.0, 4.0]
    for x in (data.x_train, data.x_test):
        assert x.dtype == np.float32 and x.min() >= -1.0 and x.max() <= 1.0


def test_carve_out_of_mnist1d_uses_the_declared_size() -> None:
    data = load_dataset(DatasetSpec("mnist1d"))
    assert (data.n_train, len(data.x_test)) == (3200, 800)
    assert (data.planning_n_train, data.planning_n_eval) == (3200, 800)


def test_generation_is_deterministic_cached_and_leaves_global_rngs_alone(
    fresh_cache: Path,
) -> None:
    import random

    np.random.seed(7)
    random.seed(7)
    expect_np, expect_py = np.random.random(), random.random()
    np.random.seed(7)
    random.seed(7)
    first = builtin.mnist1d_parts()
    # make_dataset seeds the global generators; loading must not move anyone else's draws.
    assert (np.random.random(), random.random()) == (expect_np, expect_py)
    cached = list(fresh_cache.glob("mnist1d-*.npz"))
    assert len(cached) == 1
    builtin._MNIST1D_PARTS.clear()
    second = builtin.mnist1d_parts()  # from the cache file this time
    builtin._MNIST1D_PARTS.clear()
    cached[0].unlink()
    third = builtin.mnist1d_parts()  # generated again
    for a, b, c in zip(first, second, third, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    assert [p.shape for p in first] == [(4000, 40), (4000,), (1000, 40), (1000,)]


def test_a_corrupt_cache_file_is_generated_again(fresh_cache: Path) -> None:
    first = builtin.mnist1d_parts()
    builtin._MNIST1D_PARTS.clear()
    (path,) = fresh_cache.glob("mnist1d-*.npz")
    path.write_bytes(b"not an npz")
    again = builtin.mnist1d_parts()
    np.testing.assert_array_equal(first[0], again[0])


def test_two_loads_give_the_same_records_and_identity() -> None:
    a, b = load_dataset(DatasetSpec("mnist1d")), load_dataset(DatasetSpec("mnist1d"))
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert a.content_sha256 == b.content_sha256
    test = load_dataset(DatasetSpec("mnist1d-test"))
    assert test.content_sha256 != a.content_sha256  # two sets, two ledgers


def test_mnist1d_is_a_listed_builtin_and_its_test_part_is_public() -> None:
    assert "mnist1d" in BUILTIN and "mnist1d-test" in BUILTIN
    assert MNIST1D.size == 4000 and MNIST1D_TEST.size == 1000
    assert MNIST1D_TEST.public and not MNIST1D.public
    assert is_public(None, "mnist1d-test") and not is_public(None, "mnist1d")  # type: ignore[arg-type]
    assert not is_public(None, "digits")  # type: ignore[arg-type]


def test_a_spec_evaluates_mnist1d_on_its_public_test_part() -> None:
    spec = resolve(None, {"name": "mnist1d"}, {"mode": "public", "dataset": "mnist1d-test"})
    assert spec.evaluation == "public" and spec.eval_dataset.name == "mnist1d-test"
    # Neither a loader not declared public nor the training set itself evaluates.
    with pytest.raises(ConfigError, match="loader of dpsweep"):
        public_eval_spec(None, "digits", training="mnist1d")
    with pytest.raises(ConfigError, match="is the training dataset"):
        public_eval_spec(None, "mnist1d-test", training="mnist1d-test")


def test_mnist1d_takes_no_options() -> None:
    with pytest.raises(ConfigError, match="takes no options"):
        load_dataset(DatasetSpec("mnist1d", options={"num_samples": 10}))
    with pytest.raises(ConfigError, match="unknown option"):
        resolve(None, {"name": "mnist1d", "options": {"seed": 1}})


def test_only_a_shared_set_declares_sizes_or_publicity() -> None:
    with pytest.raises(ValueError, match="only a shared set"):
        DatasetDescriptor(name="x", input_kind="flat", public=True)
    with pytest.raises(ValueError, match="only a shared set"):
        DatasetDescriptor(name="x", input_kind="flat", size=10, needs=("path",))
    with pytest.raises(ValueError, match="distinct"):
        DatasetDescriptor(name="x", input_kind="flat", shared=True, classes=("a", "a"))
    with pytest.raises(ValueError, match="lo < hi"):
        DatasetDescriptor(name="x", input_kind="flat", shared=True, input_bounds=(1.0, 1.0))


def test_cnn1d_descriptor_validates_its_options() -> None:
    d = get_model_descriptor("cnn1d")
    assert d.engine_path == "generic" and d.input_kind == "flat"
    assert d.validate({}) == {"channels": [32, 32], "kernel": 5, "norm": "group"}
    assert d.validate({"channels": 8, "norm": "none"})["channels"] == [8]
    for bad in ({"channels": [0]}, {"kernel": 0}, {"norm": "batch"}, {"width": 3}):
        with pytest.raises(ConfigError, match="cnn1d"):
            d.validate(bad)
    with pytest.raises(DatasetError, match="flat input"):
        d.check_input([1, 8, 8])


def test_cnn1d_builds_on_the_generic_path() -> None:
    torch = pytest.importorskip("torch")
    from workers.generic.dispatch import packable
    from workers.generic.validation import validate_module
    from workers.models import build_model
    from workers.models.descriptors import ModelSpec

    model = build_model(ModelSpec("cnn1d"), input_shape=(40,), num_classes=10, seed=0)
    assert not packable(model)
    validate_module(model)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert model(torch.zeros(3, 40)).shape == (3, 10)
    with pytest.raises(ConfigError, match="odd"):
        build_model(ModelSpec("cnn1d", {"kernel": 4}), input_shape=(40,), num_classes=10, seed=0)
    with pytest.raises(DatasetError, match="too short"):
        build_model(
            ModelSpec("cnn1d", {"channels": [4] * 6}), input_shape=(40,), num_classes=10, seed=0
        )
