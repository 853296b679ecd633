"""The model check planning and ``dpsweep train`` run before any charge (workers.model_check)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from dpsweep.errors import ConfigError
from workers.model_check import check_model
from workers.models.descriptors import DESCRIPTORS, ModelDescriptor, ModelSpec
from workers.models.registry import MODELS, load_builtin_models, register_model


@pytest.fixture
def register() -> Iterator[Callable[[str, Callable[..., nn.Module]], None]]:
    """Register test models for one test; the registries are restored afterwards."""
    load_builtin_models()
    descriptors, builders = dict(DESCRIPTORS), dict(MODELS)

    def add(name: str, fn: Callable[..., nn.Module]) -> None:
        register_model(ModelDescriptor(name=name))(fn)

    yield add
    DESCRIPTORS.clear()
    DESCRIPTORS.update(descriptors)
    MODELS.clear()
    MODELS.update(builders)


def test_a_builder_that_needs_real_tensors_is_checked_on_the_cpu(register: Any) -> None:
    def build(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        linear = nn.Linear(input_shape[0], num_classes)
        linear.weight.detach().numpy()  # fails on the meta device (no data)
        return nn.Sequential(linear, nn.BatchNorm1d(num_classes))

    register("needs-real-tensors", build)
    with pytest.raises(ConfigError, match=r"BatchNorm1d at '1'.*GroupNorm") as caught:
        check_model(ModelSpec("needs-real-tensors"), input_shape=(4,), num_classes=3)
    assert caught.value.field == "model.name"


def test_a_model_built_on_meta_takes_the_path_a_trial_takes(register: Any) -> None:
    built: list[torch.device] = []

    def packed(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        linear = nn.Linear(input_shape[0], num_classes)
        built.append(linear.weight.device)
        return nn.Sequential(linear)

    register("plain-sequential", packed)
    register("grouped", lambda s, c: nn.Sequential(nn.Linear(s[0], 4), nn.GroupNorm(2, 4)))
    assert check_model(ModelSpec("plain-sequential"), input_shape=(4,), num_classes=3) == "packed"
    assert built == [torch.device("meta")]  # shapes only: nothing allocated or initialised
    assert check_model(ModelSpec("grouped"), input_shape=(4,), num_classes=3) == "generic"


def test_a_model_no_device_can_build_is_refused_naming_it(register: Any) -> None:
    def broken(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        raise RuntimeError("no such layer")

    register("broken", broken)
    with pytest.raises(ConfigError, match=r"'broken' could not be built.*no such layer") as caught:
        check_model(ModelSpec("broken"), input_shape=(4,), num_classes=3)
    assert caught.value.field == "model.name"
