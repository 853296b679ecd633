"""Weight-standardised convolutions (``model.options.weight_standardization``) are exact on the
engine path each built-in model takes: per-example gradients equal ``torch.func``'s, and a pack
of two trials equals the two trials alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from dpsweep.errors import ConfigError
from workers.engine import per_sample_loss
from workers.generic import build_pack_model
from workers.models import ModelSpec, build_model
from workers.models.blocks import WSConv2d, standardize_weight
from workers.packed import PackedModel

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")

B, CLASSES = 4, 3

#: Small instances of the three convolutional built-ins, the engine path each takes.
CASES: dict[str, tuple[ModelSpec, tuple[int, ...], str]] = {
    "cnn": (ModelSpec("cnn", {"weight_standardization": True}), (1, 10, 10), "packed"),
    "res_cnn": (
        ModelSpec("res_cnn", {"weight_standardization": True, "width": 8, "blocks": 2}),
        (3, 8, 8),
        "generic",
    ),
    "wrn16_4": (
        ModelSpec(
            "wrn16_4",
            {"weight_standardization": True, "depth": 10, "width": 1, "norm_groups": 4},
        ),
        (3, 8, 8),
        "generic",
    ),
}


def _modules(name: str, seeds: list[int]) -> list[nn.Module]:
    spec, shape, _ = CASES[name]
    return [build_model(spec, input_shape=shape, num_classes=CLASSES, seed=s) for s in seeds]


def _torch_func_grads(module: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Flat per-example gradients ``[B, P]`` from ``vmap(grad)``, in ``parameters()`` order."""
    params = {n: p.detach() for n, p in module.named_parameters()}

    def loss(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        out = functional_call(module, p, (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0), reduction="sum")

    g = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([g[n].reshape(x.shape[0], -1) for n in params], dim=1)


def _engine_grads(modules: list[nn.Module], x: Tensor, y: Tensor) -> tuple[Tensor, str]:
    """The engine's per-example gradients ``[K, B, P]`` (every trial on the same examples)."""
    model, path = build_pack_model(modules)
    k = len(modules)
    xk = x.unsqueeze(0).expand(k, *x.shape).contiguous()
    out, cap = model.forward(xk, capture=True)
    assert cap is not None
    loss = per_sample_loss(out, y.unsqueeze(0).expand(k, -1), "classification")
    infos = model.layer_grads(loss.sum(), cap)
    return model.per_sample_grads(infos), path


def _data(shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(B, *shape, generator=gen), torch.randint(CLASSES, (B,), generator=gen)


def test_ws_conv_applies_the_standardised_weight() -> None:
    torch.manual_seed(0)
    conv = WSConv2d(3, 5, 3, padding=1)
    w_hat = standardize_weight(conv.weight.detach())
    flat = w_hat.reshape(5, -1)
    torch.testing.assert_close(flat.mean(dim=1), torch.zeros(5), atol=1e-6, rtol=0)
    # Unit variance up to eps: var / (var + eps), the weights' own variance being ~0.01 here.
    var = conv.weight.detach().reshape(5, -1).var(dim=1, correction=0)
    torch.testing.assert_close(flat.var(dim=1, correction=0), var / (var + 1e-5))
    x = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(conv(x), F.conv2d(x, w_hat, conv.bias, padding=1))


@pytest.mark.parametrize("name", sorted(CASES))
def test_per_example_gradients_equal_torch_func(name: str) -> None:
    _, shape, path = CASES[name]
    (module,) = _modules(name, [0])
    convs = [m for m in module.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(type(m) is WSConv2d for m in convs)  # every convolution standardised
    x, y = _data(shape)
    got, took = _engine_grads([module], x, y)
    assert took == path
    torch.testing.assert_close(got[0], _torch_func_grads(module, x, y), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_pack_of_two_equals_the_two_trials_alone(name: str) -> None:
    _, shape, _ = CASES[name]
    x, y = _data(shape)
    pack, _ = _engine_grads(_modules(name, [1, 2]), x, y)
    for t, seed in enumerate([1, 2]):
        alone, _ = _engine_grads(_modules(name, [seed]), x, y)
        torch.testing.assert_close(pack[t], alone[0], rtol=1e-4, atol=1e-6)


def test_packed_perturbed_pass_standardises_each_examples_weights() -> None:
    """BAM's pass at ``theta + s_i g_i``: example i's output is the model's at its own moved
    parameters, standardised (per example) before use."""
    (module,) = _modules("cnn", [3])
    x, y = _data(CASES["cnn"][1])
    model = PackedModel([module])  # type: ignore[list-item]
    out, cap = model.forward(x.unsqueeze(0), capture=True)
    assert cap is not None
    infos = model.layer_grads(per_sample_loss(out, y.unsqueeze(0), "classification").sum(), cap)
    scale = torch.linspace(0.01, 0.05, B).unsqueeze(0)
    moved, _ = model.forward(x.unsqueeze(0), perturb=(infos, scale))
    ps = model.per_sample_grads(infos)[0]
    names = [n for n, _ in module.named_parameters()]
    for i in range(B):
        flat = model.flat[0] + scale[0, i] * ps[i]
        params: dict[str, Any] = {}
        off = 0
        for n, p in zip(names, module.parameters(), strict=True):
            params[n] = flat[off : off + p.numel()].view_as(p)
            off += p.numel()
        want = functional_call(module, params, (x[i : i + 1],))
        torch.testing.assert_close(moved[0, i : i + 1], want, rtol=1e-4, atol=1e-5)


def test_default_models_keep_plain_convolutions() -> None:
    for name, (spec, shape, _) in CASES.items():
        options = {k: v for k, v in spec.options.items() if k != "weight_standardization"}
        module = build_model(ModelSpec(name, options), input_shape=shape, num_classes=3, seed=0)
        assert not any(isinstance(m, WSConv2d) for m in module.modules())


@pytest.mark.parametrize(
    ("name", "value"), [("logreg", True), ("mlp", True), ("cnn", 1), ("wrn16_4", "yes")]
)
def test_the_option_is_validated(name: str, value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        build_model(
            ModelSpec(name, {"weight_standardization": value}),
            input_shape=(1, 8, 8),
            num_classes=3,
            seed=0,
        )
    assert (err.value.field or "").startswith("model.options")
