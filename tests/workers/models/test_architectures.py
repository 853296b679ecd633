"""The residual and transformer architectures (``wrn16_4``, ``res_cnn``, ``text_classifier``).

Each builds from its descriptor's defaults on the input it is meant for, gives finite logits of
the right shape, has no layer Opacus refuses (no BatchNorm, no nn.MultiheadAttention), and has
per-sample gradients through torch.func that equal per-example backward passes (what the
generic engine path relies on).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from opacus import GradSampleModule
from opacus.validators import ModuleValidator
from torch import nn
from torch.func import functional_call, grad, vmap

from dpsweep.errors import ConfigError, DatasetError
from workers.models import ModelSpec, build_model, get_model_descriptor

#: name -> the example shape it is built for
TARGETS: dict[str, tuple[int, ...]] = {
    "wrn16_4": (3, 32, 32),
    "res_cnn": (1, 28, 28),
    "text_classifier": (24,),
}


def build(name: str, shape: tuple[int, ...], classes: int = 10, **options: Any) -> nn.Module:
    return build_model(ModelSpec(name, options), input_shape=shape, num_classes=classes, seed=0)


def tokens(n: int, t: int, vocab: int = 1000, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, t), generator=gen)
    ids[0, t // 3 :] = 0
    return ids


def batch(name: str, n: int = 3) -> torch.Tensor:
    shape = TARGETS[name]
    if get_model_descriptor(name).input_kind == "tokens":
        return tokens(n, shape[0])
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_builds_from_its_defaults_with_finite_logits(name: str) -> None:
    d = get_model_descriptor(name)
    model = build(name, TARGETS[name], **d.validate({}))
    with torch.no_grad():
        out = model(batch(name))
    assert out.shape == (3, 10)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_no_batch_norm_or_other_layer_opacus_refuses(name: str) -> None:
    model = build(name, TARGETS[name])
    assert ModuleValidator.validate(model, strict=False) == []
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert not any(isinstance(m, nn.MultiheadAttention) for m in model.modules())


def test_wrn16_4_has_the_papers_size() -> None:
    model = build("wrn16_4", (3, 32, 32))
    n = sum(p.numel() for p in model.parameters())
    assert 2.6e6 < n < 2.8e6, n  # 2.75M, as WRN-16-4 on CIFAR-10
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert norms and all(m.num_groups == 16 for m in norms)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    # 6n + 1 = 13 (stem and blocks) and 3 projection shortcuts (the width changes at each stage)
    assert len(convs) == 13 + 3


def test_wrn_options_are_checked() -> None:
    deeper = build("wrn16_4", (3, 32, 32), depth=22, width=1)
    # 6n + 1 = 19, and 2 shortcuts: at width 1 the first stage keeps its 16 channels
    assert sum(isinstance(m, nn.Conv2d) for m in deeper.modules()) == 19 + 2
    for option, value in (("depth", 17), ("norm_groups", 3)):
        with pytest.raises(ConfigError) as err:
            build("wrn16_4", (3, 32, 32), **{option: value})
        assert err.value.field == f"model.options.{option}"
    with pytest.raises(DatasetError):
        build("wrn16_4", (3072,))


def test_text_classifier_masks_padding() -> None:
    model = build("text_classifier", (12,), vocab_size=100, d_model=32, heads=4)
    ids = tokens(4, 12, vocab=100)
    ids[:, 8:] = 0
    with torch.no_grad():
        out = model(ids)
        # More padding, and padding tokens' content, change nothing.
        longer = torch.cat([ids, torch.zeros(4, 5, dtype=torch.long)], dim=1)
        torch.testing.assert_close(model(longer), out, rtol=1e-5, atol=1e-5)
        # Token ids handed over as floats read the same.
        torch.testing.assert_close(model(ids.float()), out)
        # All padding and out-of-range ids give finite logits, not NaN or an index error.
        odd = torch.tensor([[0] * 12, [5, 10**6, -3] + [0] * 9])
        assert torch.isfinite(model(odd)).all()


def test_text_classifier_heads_must_divide_the_width() -> None:
    with pytest.raises(ConfigError) as err:
        build("text_classifier", (8,), d_model=24, heads=5)
    assert err.value.field == "model.options.heads"


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_per_sample_gradients_by_torch_func_equal_per_example_backward(name: str) -> None:
    model = build(name, TARGETS[name], **SMALL[name])
    x, y = batch(name, 2), torch.tensor([1, 7])
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, p, (xi.unsqueeze(0),))
        return nn.functional.cross_entropy(out, yi.unsqueeze(0))

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    for i in range(2):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for k, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(per_sample[k][i]).all()
            torch.testing.assert_close(per_sample[k][i], p.grad, rtol=1e-4, atol=1e-6)


SMALL: dict[str, dict[str, Any]] = {
    "wrn16_4": {"depth": 10, "width": 1},
    "res_cnn": {"width": 8, "blocks": 2},
    "text_classifier": {"vocab_size": 1000, "d_model": 16, "heads": 2},
}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_opacus_hooks_give_the_same_per_sample_gradients(name: str) -> None:
    """What bench/ compares against: Opacus's per-sample gradients on the very same module."""
    model = build(name, TARGETS[name], **SMALL[name])
    x, y = batch(name, 3), torch.tensor([1, 7, 2])
    gsm = GradSampleModule(model, loss_reduction="sum")
    nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
    hooked = {k: p.grad_sample.clone() for k, p in model.named_parameters()}  # type: ignore[union-attr]
    gsm._close()
    for i in range(3):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for k, p in model.named_parameters():
            assert hooked[k].shape[0] == 3, k
            torch.testing.assert_close(hooked[k][i], p.grad, rtol=1e-4, atol=1e-6)
