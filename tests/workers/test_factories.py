"""Local ``module:function`` factories (:func:`workers.plugins.load_factory`), in process.

A factory module is written to a temporary folder on ``sys.path``; its model and dataset
factories are registered under their import strings and then built / loaded through the
ordinary registries. Every way an import string can be wrong is refused naming it.
"""

from __future__ import annotations

import importlib
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from dpsweep.errors import ConfigError
from workers.datasets.descriptors import DATASET_DESCRIPTORS, get_dataset_descriptor
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.datasets.registry import DATASETS
from workers.factories import (
    FACTORIES_ENV,
    export_factories,
    is_factory_name,
    load_exported_factories,
    load_factory,
)
from workers.models.descriptors import DESCRIPTORS, ModelSpec
from workers.models.registry import MODELS, build_model

CODE = """
import numpy as np
from torch import nn

from workers.datasets.records import RawData

CALLS = []


def build(input_shape, num_classes):
    CALLS.append((tuple(input_shape), num_classes))
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], 4), nn.ReLU(),
                         nn.Linear(4, num_classes))


def data(spec):
    y = np.arange(60) % 3
    return RawData(x=np.random.default_rng(0).normal(size=(60, 5)) + y[:, None], y=y,
                   kind="tabular")


def not_a_model(input_shape, num_classes):
    return "a string"


def not_data(spec):
    return [1, 2, 3]


class Holder:
    @staticmethod
    def build(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], num_classes))


value = 3
"""


@pytest.fixture
def module(tmp_path: Path) -> Iterator[str]:
    """A fresh factory module on ``sys.path``; every registry restored afterwards."""
    name = f"dpsweep_factories_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(CODE)
    saved = [(r, dict(r)) for r in (DESCRIPTORS, MODELS, DATASET_DESCRIPTORS, DATASETS)]
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
        for registry, before in saved:
            registry.clear()  # type: ignore[attr-defined]
            registry.update(before)  # type: ignore[attr-defined]


def test_a_model_factory_builds_through_the_registry(module: str) -> None:
    spec = f"{module}:build"
    assert is_factory_name(spec) and not is_factory_name("mlp")
    assert load_factory(spec, "models") == spec
    assert load_factory(spec, "models") == spec  # again: a no-op
    a = build_model(ModelSpec(spec), input_shape=(5,), num_classes=3, seed=1)
    b = build_model(ModelSpec(spec), input_shape=(5,), num_classes=3, seed=1)
    assert isinstance(a, nn.Sequential)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert sys.modules[module].CALLS == [((5,), 3), ((5,), 3)]
    assert DESCRIPTORS[spec].input_kind == "any" and spec in DESCRIPTORS[spec].description
    # A factory takes no declared options.
    with pytest.raises(ConfigError, match="unknown option"):
        build_model(ModelSpec(spec, {"width": 3}), input_shape=(5,), num_classes=3, seed=1)
    # A dotted attribute path works too.
    holder = load_factory(f"{module}:Holder.build", "models")
    assert isinstance(
        build_model(ModelSpec(holder), input_shape=(5,), num_classes=2, seed=0), nn.Module
    )


def test_a_dataset_factory_loads_through_the_registry(module: str) -> None:
    spec = load_factory(f"{module}:data", "datasets")
    assert get_dataset_descriptor(spec).validate({}) == {}
    data = load_dataset(DatasetSpec(spec))
    assert data.n_train + int(data.x_test.shape[0]) == 60 and data.num_classes == 3


def test_a_factory_returning_the_wrong_thing_is_refused(module: str) -> None:
    model = load_factory(f"{module}:not_a_model", "models")
    with pytest.raises(ConfigError, match=r"returned a str, not a torch.nn.Module"):
        build_model(ModelSpec(model), input_shape=(5,), num_classes=3, seed=0)
    data = load_factory(f"{module}:not_data", "datasets")
    with pytest.raises(ConfigError, match=r"not_data'.*returned a list"):
        load_dataset(DatasetSpec(data))


@pytest.mark.parametrize(
    ("spec", "kind", "says"),
    [
        ("dpsweep_no_such_module_xyz:build", "models", "No module named"),
        ("{module}:missing", "models", "has no attribute 'missing'"),
        ("{module}:value", "datasets", "is not callable"),
        ("{module}:", "models", "must read module:function"),
        (":build", "datasets", "must read module:function"),
        ("{module}:build", "strategies", "cannot be a module:function factory"),
    ],
)
def test_a_bad_factory_is_refused_naming_it(module: str, spec: str, kind: str, says: str) -> None:
    spec = spec.format(module=module)
    with pytest.raises(ConfigError) as exc:
        load_factory(spec, kind)
    assert says in str(exc.value) and repr(spec) in str(exc.value)
    assert spec not in DESCRIPTORS and spec not in DATASET_DESCRIPTORS


def test_exported_factories_are_registered_by_a_child_process_before_it_trains(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `dpsweep run` exports is what its Ray workers register before they train."""
    monkeypatch.setenv(FACTORIES_ENV, "")  # (and removed again after the test)
    model, data = f"{module}:build", f"{module}:data"
    export_factories([(model, "models"), (data, "datasets"), (model, "models")])
    assert os.environ[FACTORIES_ENV] == f"models={model};datasets={data}"
    # A worker: nothing registered yet, then train_pack's first step registers them.
    for registry in (DESCRIPTORS, MODELS, DATASET_DESCRIPTORS, DATASETS):
        registry.pop(model, None)  # type: ignore[attr-defined]
        registry.pop(data, None)  # type: ignore[attr-defined]
    assert load_exported_factories() == [model, data]
    assert model in MODELS and data in DATASETS
