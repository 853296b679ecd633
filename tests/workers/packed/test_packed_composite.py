"""The packed engine's hook for composite layers, exercised with a small residual block.

A block of layers (issue 22's residual blocks) is one packed class plus one registry entry; the
engine must then give its inner layers exact per-sample gradients, as for top-level layers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.engine import per_sample_loss
from workers.packed import PackedModel
from workers.packed.layer import Act, CompositeLayer, PackedLayer
from workers.packed.registry import convert_layer, register_packed_layer


class Residual(nn.Module):
    """``x + W2 relu(W1 x + b1) + b2`` on feature vectors."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, d))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.inner(x)


class PResidual(CompositeLayer):
    def __init__(self, m: Residual) -> None:
        self.layers = [convert_layer(c) for c in m.inner]

    def run(self, x: Act, apply: Callable[[PackedLayer, Act], Act]) -> Act:
        h = x
        for ly in self.layers:
            h = apply(ly, h)
        return Act(x.as_kb() + h.as_kb(), "kb", x.k)


register_packed_layer(Residual)(PResidual)


def model(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(6, 8), nn.Tanh(), Residual(8, 5), nn.ReLU(), nn.Linear(8, 3)
    )


def reference(module: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    rows = []
    for i in range(x.shape[0]):
        module.zero_grad()
        F.cross_entropy(module(x[i : i + 1]), y[i : i + 1], reduction="sum").backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in module.parameters()]))
    return torch.stack(rows)


def test_a_composite_block_gets_exact_per_sample_gradients() -> None:
    modules = [model(s) for s in (0, 1)]
    packed = PackedModel(modules)
    assert packed.n_param_layers == 4
    assert isinstance(packed.layers[3], PResidual)
    x, y = torch.rand(5, 6), torch.randint(3, (5,))
    xk = x.unsqueeze(0).expand(2, *x.shape).contiguous()
    out, cap = packed.forward(xk, capture=True)
    for t, m in enumerate(modules):
        torch.testing.assert_close(out[t], m(x), rtol=1e-5, atol=1e-6)
    assert cap is not None
    loss = per_sample_loss(out, y.unsqueeze(0).expand(2, -1), "classification")
    infos = packed.layer_grads(loss.sum(), cap)
    ps = packed.per_sample_grads(infos)
    sq = packed.sq_norms(infos).sum(-1)
    for t, m in enumerate(modules):
        ref = reference(m, x, y)
        torch.testing.assert_close(ps[t], ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(sq[t], ref.pow(2).sum(-1), rtol=1e-4, atol=1e-6)
    # The exported module is the original architecture with the pack's weights.
    torch.testing.assert_close(packed.to_module(1)(x), modules[1](x))


def test_a_composite_runs_its_inner_layers_outside_the_model_too() -> None:
    block: PackedLayer = convert_layer(Residual(4, 2))
    assert isinstance(block, CompositeLayer) and len(block.param_layers()) == 2
