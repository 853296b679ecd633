"""Every pluggable kind's registry is a dpsweep.registry.Registry with its old contract kept.

The names, messages and fields below are what the API, the CLI and stored sweeps rely on.
"""

from __future__ import annotations

import pytest
from torch import nn

from dpsweep.errors import ConfigError
from dpsweep.registry import Registry
from workers.datasets.descriptors import DATASET_DESCRIPTORS, get_dataset_descriptor
from workers.datasets.registry import DATASETS, has_loader, register_dataset
from workers.models.descriptors import DESCRIPTORS as MODEL_DESCRIPTORS
from workers.models.descriptors import get_model_descriptor
from workers.models.registry import MODELS, model_names, model_task
from workers.packed.registry import CONVERTERS, convert_layer, register_packed_layer
from workers.strategies.base import STRATEGIES, get_strategy, strategy_names
from workers.strategies.descriptors import DESCRIPTORS as STRATEGY_DESCRIPTORS
from workers.strategies.descriptors import descriptor_names, get_descriptor


def test_every_pluggable_kind_is_one_generic_registry() -> None:
    for registry in (
        STRATEGY_DESCRIPTORS,
        STRATEGIES,
        MODEL_DESCRIPTORS,
        MODELS,
        DATASET_DESCRIPTORS,
        DATASETS,
        CONVERTERS,
    ):
        assert isinstance(registry, Registry)


def test_strategies_keep_their_message_and_field() -> None:
    for lookup, names in ((get_descriptor, descriptor_names), (get_strategy, strategy_names)):
        with pytest.raises(ConfigError) as exc:
            lookup("nope")
        assert str(exc.value) == f"unknown strategy 'nope'; choose one of: {', '.join(names())}"
        assert exc.value.field == "strategy"
        assert "fixed" in names() and names() == sorted(names())
    assert get_strategy("fixed").descriptor is get_descriptor("fixed")


def test_models_keep_their_message_and_field() -> None:
    for lookup in (get_model_descriptor, model_task):
        with pytest.raises(ConfigError, match=r"^unknown model 'nope'; choose one of: .*mlp") as e:
            lookup("nope")
        assert e.value.field == "model.name"
    assert model_task("autoencoder") == "reconstruction"
    assert MODELS["mlp"].descriptor is get_model_descriptor("mlp") and "mlp" in model_names()


def test_datasets_keep_their_message_field_and_order() -> None:
    with pytest.raises(ConfigError, match=r"^unknown dataset 'nope'; choose one of: .*digits") as e:
        get_dataset_descriptor("nope")
    assert e.value.field == "dataset.name"
    assert has_loader("digits") and not has_loader("nope")
    with pytest.raises(ValueError, match=r"^dataset 'csv' is registered twice$"):
        register_dataset("csv")(DATASETS["csv"])


def test_a_layer_kind_is_looked_up_by_exact_type_and_may_be_replaced() -> None:
    class Odd(nn.Identity):  # a subclass of a supported layer is not silently supported
        pass

    with pytest.raises(ConfigError) as exc:
        convert_layer(Odd())
    assert str(exc.value).startswith("layer Odd is not supported in DP models; supported: Linear")
    try:
        register_packed_layer(Odd)(CONVERTERS[nn.Identity])
        register_packed_layer(Odd)(CONVERTERS[nn.Identity])  # again: replaced, as before
        assert type(convert_layer(Odd())) is type(convert_layer(nn.Identity()))
    finally:
        del CONVERTERS[Odd]
