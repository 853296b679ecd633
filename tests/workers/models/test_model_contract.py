"""The contract every registered model keeps: a new model is tested by registering it.

For each model descriptor (the built-in ones and any installed plug-in's): the torch builder is
registered under the same name; the model builds on its input kind and gives finite outputs of
the right shape; it packs (the packed forward equals the module's); the descriptor's defaults
validate and build the same model as no options at all; every option refuses an out-of-range
value naming the field, and so does ``build_model``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from dpsweep.errors import ConfigError, DatasetError
from workers.models import (
    ACTIVATION_NAMES,
    ModelDescriptor,
    ModelOption,
    ModelSpec,
    get_model_descriptor,
    model_descriptor_names,
)
from workers.models.blocks import ACTIVATIONS
from workers.models.pretrained_descriptors import CHECKPOINT_MODELS
from workers.models.registry import MODELS, build_model, model_names, model_task
from workers.packed import PackedModel

ROOT = Path(__file__).resolve().parents[2]
NAMES = model_descriptor_names()
#: The models built here from options alone: a checkpoint model (hf, timm, torchvision) needs
#: its checkpoint and optional extras; tests/workers/models/test_pretrained.py builds those.
BUILDABLE = [n for n in NAMES if n not in CHECKPOINT_MODELS]
CLASSES = 3

#: An example shape for each input kind (small, but large enough for the built-in CNNs).
SHAPES: dict[str, list[tuple[int, ...]]] = {
    "flat": [(12,)],
    "image": [(1, 12, 12)],
    "any": [(12,), (1, 6, 6)],
    "tokens": [(10,)],
}


def example_batch(d: ModelDescriptor, shape: tuple[int, ...], n: int = 4) -> torch.Tensor:
    """A batch of inputs of the descriptor's kind (token ids with trailing padding for tokens)."""
    if d.input_kind == "tokens":
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(1, 50, (n, *shape), generator=gen)
        ids[1, shape[0] // 2 :] = 0  # padding (id 0) at the end
        ids[2] = 0  # all padding
        return ids
    return torch.rand(n, *shape)


def shapes(d: ModelDescriptor) -> list[tuple[int, ...]]:
    return SHAPES[d.input_kind]


def build(name: str, shape: tuple[int, ...], options: dict[str, Any] | None = None) -> Any:
    return build_model(
        ModelSpec(name, options or {}), input_shape=shape, num_classes=CLASSES, seed=0
    )


def bad_values(opt: ModelOption) -> list[Any]:
    """Values outside an option's declared range (or type)."""
    if opt.kind == "choice":
        out: list[Any] = ["no-such-choice", True]
    else:
        out = ["not a number", float("nan"), float("inf")]
        if opt.low is not None:
            out.append(opt.low - 1 if opt.low_inclusive else opt.low)
        if opt.high is not None:
            out.append(opt.high + 1 if opt.high_inclusive else opt.high)
        if opt.kind == "int":
            out.append((opt.low or 0) + 1.5)
        if opt.multiple_of:
            out.append((int(opt.low or 0) // opt.multiple_of + 1) * opt.multiple_of + 1)
    return [[v] for v in out] + out if opt.sequence else out


def test_importing_models_imports_no_torch() -> None:
    code = "import sys, workers.models; assert 'torch' not in sys.modules, 'torch imported'"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_every_descriptor_has_a_builder_and_every_builder_a_descriptor() -> None:
    assert NAMES and set(model_names()) == set(NAMES)
    for name in NAMES:
        d = get_model_descriptor(name)
        assert MODELS[name].descriptor is d
        assert model_task(name) == d.task


def test_unknown_model_names_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        get_model_descriptor("no-such-model")
    assert err.value.field == "model.name"
    with pytest.raises(ConfigError) as err:
        build("no-such-model", (4,))
    assert err.value.field == "model.name"


def test_activation_names_match_the_modules() -> None:
    assert set(ACTIVATION_NAMES) == set(ACTIVATIONS)


@pytest.mark.parametrize("name", BUILDABLE)
def test_builds_on_its_input_kind_with_finite_outputs(name: str) -> None:
    d = get_model_descriptor(name)
    for shape in shapes(d):
        model = build(name, shape)
        x = example_batch(d, shape)
        with torch.no_grad():
            out = model(x)
        expected = (4, CLASSES) if d.task == "classification" else (4, *shape)
        assert tuple(out.shape) == expected, (name, shape)
        assert torch.isfinite(out).all(), name
        if not isinstance(model, nn.Sequential):
            continue  # residual / attention models: the generic per-sample path trains them
        # It packs: the engine's packed forward computes the same function.
        packed = PackedModel([model])
        with torch.no_grad():
            out_p, _ = packed.forward(x.unsqueeze(0))
        torch.testing.assert_close(out_p[0], out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", BUILDABLE)
def test_refuses_an_input_of_another_kind(name: str) -> None:
    d = get_model_descriptor(name)
    wrong = {"image": (12,), "flat": (1, 6, 6), "tokens": (1, 6, 6)}.get(d.input_kind)
    if wrong is None:
        pytest.skip("takes any input")
    with pytest.raises(DatasetError):
        build(name, wrong)


@pytest.mark.parametrize("name", BUILDABLE)
def test_defaults_validate_and_build_the_default_model(name: str) -> None:
    d = get_model_descriptor(name)
    defaults = d.validate({})
    assert set(defaults) == set(d.options)
    shape = shapes(d)[0]
    plain, explicit = build(name, shape), build(name, shape, defaults)
    assert str(plain) == str(explicit)
    for a, b in zip(plain.parameters(), explicit.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", BUILDABLE)
def test_refuses_unknown_and_out_of_range_options_naming_the_field(name: str) -> None:
    d = get_model_descriptor(name)
    shape = shapes(d)[0]
    with pytest.raises(ConfigError) as err:
        d.validate({"no_such_option": 1})
    assert err.value.field == "model.options.no_such_option"
    with pytest.raises(ConfigError):
        build(name, shape, {"no_such_option": 1})
    for option, opt in d.options.items():
        for bad in bad_values(opt):
            with pytest.raises(ConfigError) as err:
                d.validate({option: bad})
            assert err.value.field == f"model.options.{option}", (option, bad)
            with pytest.raises(ConfigError) as err:
                build(name, shape, {option: bad})
            assert err.value.field == f"model.options.{option}", (option, bad)


@pytest.mark.parametrize("name", BUILDABLE)
def test_the_declared_engine_path_is_the_one_taken(name: str) -> None:
    """The plan shows a model's declared engine path before anything is built: the built
    model must take that path (``auto`` defers to the build)."""
    from workers.generic import packable

    d = get_model_descriptor(name)
    module = build(name, shapes(d)[0])
    if d.engine_path != "auto":
        assert packable(module) == (d.engine_path == "packed")
