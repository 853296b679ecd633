"""Book-keeping (ghost norms, one backward) equals the materialised torch.func path."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from torch import Tensor, nn

import workers.training.prepare as prepare
from tests.workers.generic.nets import FeatureMixer, ResidualConv, TiedLM, TinyTransformer
from workers.datasets.records import DatasetSpec
from workers.engine import per_sample_loss
from workers.generic import BookkeepingModel, GenericModel, bookkeeping, build_pack_model
from workers.models import ModelSpec, build_model
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialSpec

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")

K, B = 2, 5


class Scaled(nn.Module):
    """A parametrised layer without a rule (a bare parameter): the fallback must cover it."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(d))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale


class WithUnsupported(nn.Module):
    """Linear, an unsupported layer, a Conv1d, a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 5)
        self.odd = Scaled(5)
        self.conv = nn.Conv1d(1, 2, 3, padding=1)
        self.head = nn.Linear(10, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.odd(self.inp(x)))
        return self.head(self.conv(h.unsqueeze(1)).flatten(1))


def _per_example(
    model: GenericModel, x: Tensor, y: Tensor, weights: Sequence[Tensor]
) -> tuple[Tensor, list[Tensor]]:
    out, cap = model.forward(x, capture=True)
    assert cap is not None
    infos = model.layer_grads(per_sample_loss(out, y, "classification").sum(), cap)
    sums = []
    for w in weights:
        buf = torch.empty(model.k, model.numel)
        model.weighted_sum_into(buf, infos, w)
        sums.append(buf)
    return model.sq_norms(infos), sums


def _compare(make: Callable[[int], nn.Module], x: Tensor, classes: int = 3) -> BookkeepingModel:
    """Two steps' norms and weighted sums (R = 1 and R = L) on both paths."""
    modules = [make(i) for i in range(K)]
    ref = GenericModel(modules)
    bk = BookkeepingModel(modules)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):  # the first step verifies the rules, the second runs them alone
        y = torch.randint(classes, (K, B), generator=gen)
        w1 = torch.rand(K, B, 1, generator=gen)
        wl = torch.rand(K, B, ref.n_param_layers, generator=gen)
        sq_ref, sums_ref = _per_example(ref, x, y, [w1, wl])
        sq_bk, sums_bk = _per_example(bk, x, y, [w1, wl])
        torch.testing.assert_close(sq_bk, sq_ref, rtol=1e-4, atol=1e-6)
        for got, want in zip(sums_bk, sums_ref, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    return bk


def _seeded(factory: Callable[[], nn.Module]) -> Callable[[int], nn.Module]:
    def make(i: int) -> nn.Module:
        torch.manual_seed(100 + i)
        return factory()

    return make


def test_wrn_like_net_matches_materialised() -> None:
    spec = ModelSpec("wrn16_4", {"depth": 10, "width": 1, "norm_groups": 4})
    bk = _compare(
        lambda i: build_model(spec, input_shape=(3, 8, 8), num_classes=3, seed=i),
        torch.randn(K, B, 3, 8, 8),
    )
    assert set(bk.rules) == {"conv", "groupnorm", "linear"}  # every layer has its rule


def test_text_classifier_matches_materialised() -> None:
    spec = ModelSpec(
        "text_classifier", {"vocab_size": 40, "d_model": 16, "heads": 2, "layers": 2, "max_len": 12}
    )
    ids = torch.randint(2, 40, (K, B, 12), generator=torch.Generator().manual_seed(1))
    ids[:, 1, 5:] = 0  # padding (the embedding's padding row gets no gradient)
    ids[:, 2, 3] = ids[:, 2, 7]  # a repeated token (the embedding Gram's off-diagonal)
    bk = _compare(lambda i: build_model(spec, input_shape=(12,), num_classes=3, seed=i), ids)
    assert None not in bk.rules


def test_feature_mixer_matches_materialised() -> None:
    bk = _compare(_seeded(lambda: FeatureMixer(16, 3)), torch.randn(K, B, 16))
    # nn.MultiheadAttention has no rule (its fused kernel reads out_proj's weight itself).
    assert bk.rules[1] is None and bk.rules[0] == "linear"


def test_sequence_first_and_tied_layers_fall_back() -> None:
    ids = torch.randint(20, (K, B, 6), generator=torch.Generator().manual_seed(2))
    _compare(_seeded(TinyTransformer), ids)
    bk = _compare(_seeded(TiedLM), ids, classes=20)
    assert bk.rules[1] == "linear"


class ConvRoutes(nn.Module):
    """Convolutions that take each of the two conv routes (ghost norm and grouped, see
    ``BookkeepingModel._conv_grads``), with stride, dilation, groups and a missing bias."""

    def __init__(self) -> None:
        super().__init__()
        # 8x8 -> 4x4: L (d_in + d_out) = 16 x 59 > d_in d_out = 864: grouped (materialised).
        self.stem = nn.Conv2d(3, 32, 3, stride=2, padding=1)
        # 4x4, 32 -> 32: 16 x 320 < 9216: ghost norm.
        self.deep = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        # Conv1d over 16 positions, dilated, two groups: grouped.
        self.wide = nn.Conv1d(32, 32, 3, padding=2, dilation=2, groups=2)
        # Conv1d on 4 positions, stride 4: 4 x 128 < 3072: ghost norm.
        self.narrow = nn.Conv1d(32, 32, 3, stride=4, padding=1)
        self.head = nn.Linear(128, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.deep(torch.relu(self.stem(x))))  # [B, 32, 4, 4]
        h = torch.tanh(self.wide(h.flatten(2)))  # [B, 32, 16]
        return self.head(self.narrow(h).flatten(1))  # [B, 32, 4] -> 128


def _routes(bk: BookkeepingModel, x: Tensor) -> list[str]:
    out, cap = bk.forward(x, capture=True)
    assert cap is not None
    y = torch.zeros(x.shape[:2], dtype=torch.long)
    infos = bk.layer_grads(per_sample_loss(out, y, "classification").sum(), cap)
    return [type(i).__name__ if not isinstance(i, list) else "materialised" for i in infos]


def test_both_conv_routes_match_materialised() -> None:
    x = torch.randn(K, B, 3, 8, 8)
    bk = _compare(_seeded(ConvRoutes), x)
    assert bk.rules == ["conv"] * 4 + ["linear"]
    assert _routes(bk, x) == [
        "materialised",
        "_GhostConv",
        "materialised",
        "_GhostConv",
        "_GhostLinear",  # one position: ghost is exact and cheapest
    ]
    # Materialised from the ghost records (BAM's perturbed pass and diagnostics read these):
    # every example's full gradient, in the layer's own weight shape.
    ref = GenericModel([ConvRoutes() for _ in range(K)])
    ref.flat.copy_(bk.flat)
    y = torch.randint(3, (K, B), generator=torch.Generator().manual_seed(5))
    grads = []
    for model in (bk, ref):
        out, cap = model.forward(x, capture=True)
        assert cap is not None
        infos = model.layer_grads(per_sample_loss(out, y, "classification").sum(), cap)
        grads.append(model.per_sample_grads(infos))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def test_linear_gram_route_matches_materialised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear layers over positions materialise up to a memory bound, and use the Gram
    matrices beyond it: the Gram route must give the same norms and sums."""
    monkeypatch.setattr(bookkeeping, "_MATERIALISE_MAX", 0)
    spec = ModelSpec(
        "text_classifier", {"vocab_size": 40, "d_model": 16, "heads": 2, "layers": 1, "max_len": 12}
    )
    ids = torch.randint(2, 40, (K, B, 12), generator=torch.Generator().manual_seed(3))
    ids[:, 0, 7:] = 0
    bk = _compare(lambda i: build_model(spec, input_shape=(12,), num_classes=3, seed=i), ids)
    assert _routes(bk, ids).count("_GhostLinear") >= 4  # the projections and feed-forward


def test_unsupported_layer_falls_back() -> None:
    bk = _compare(_seeded(WithUnsupported), torch.randn(K, B, 6))
    assert bk.rules == ["linear", None, "conv", "linear"]
    _compare(_seeded(ResidualConv), torch.randn(K, B, 1, 8, 8))


def test_dispatch_picks_bookkeeping_for_generic_models() -> None:
    built, path = build_pack_model([FeatureMixer(16, 3)])
    assert path == "generic" and isinstance(built, BookkeepingModel)


@pytest.mark.parametrize("strategy", ["fixed", "bam"])
def test_pack_trained_on_bookkeeping_equals_materialised(
    mixer_model: str, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    trials = [
        TrialSpec(lr=0.3, seed=0, noise_multiplier=1.0, params={"clip": 0.5}),
        TrialSpec(lr=1.0, seed=7, noise_multiplier=2.0, params={"clip": 2.0}),
    ]
    spec = PackSpec(
        dataset=DatasetSpec("digits"),
        model=ModelSpec(mixer_model),
        strategy=strategy,
        trials=trials,
        batch_size=32,
        steps=4,
        eval_every=2,
        randomness="reproducible",
    )
    new = train_pack(spec)

    def materialised(modules, device="cpu", *, batched_trials=True):  # type: ignore[no-untyped-def]
        return GenericModel(modules, device=device, batched_trials=batched_trials), "generic"

    monkeypatch.setattr(prepare, "build_pack_model", materialised)
    old = train_pack(spec)
    for a, b in zip(new, old, strict=True):
        assert a.engine_path == b.engine_path == "generic"
        for ha, hb in zip(a.history, b.history, strict=True):
            assert ha["loss"] == pytest.approx(hb["loss"], rel=1e-4)
        assert a.checkpoint is not None and b.checkpoint is not None
        assert (a.checkpoint - b.checkpoint).abs().max() < 1e-4
