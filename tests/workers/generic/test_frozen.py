"""Frozen parameters (``requires_grad == False``): constants of the pack, never noised.

Per rule (LoRA's low-rank pair on a peft BERT, embedding, LayerNorm, attention projections, a
head-only MLP, a tied weight), the book-keeping per-example norms and weighted sums of the
trained layers equal torch.func's ``vmap(grad)`` on the whole model with its frozen parts; the
engine's steps never move a frozen value (not even under enormous noise), draw noise for the
trained coordinates only, and a pack of three equals three single trials.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from dpsweep.errors import ConfigError
from tests.workers.generic.frozen_nets import (
    CLASSES,
    SEQ,
    VOCAB,
    EmbedNet,
    Logits,
    NormNet,
    TiedNet,
    any_match,
    bert,
    freeze_except,
    frozen_state,
    head_mlp,
    lora_bert,
)
from tests.workers.streams import noise_stream, normals, sample_stream
from workers.checkpoints import load_weights, weights_bytes
from workers.datasets.records import DatasetSpec
from workers.engine import DPEngine, per_sample_loss
from workers.generic import BookkeepingModel, GenericModel, build_pack_model
from workers.models.descriptors import DESCRIPTORS, ModelDescriptor, ModelSpec
from workers.models.registry import MODELS, ModelEntry
from workers.optim import PackedOptimizer
from workers.strategies import NoiseSource, get_strategy
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialSpec

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")

B = 5


def torch_func_grads(module: nn.Module, x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """Per-example gradients ``[B, *shape]`` of the trained parameters, by ``vmap(grad)`` on
    the whole module (frozen parameters and buffers as constants): the reference."""
    trained = {n: p.detach() for n, p in module.named_parameters() if p.requires_grad}
    consts = {n: p.detach() for n, p in module.named_parameters() if not p.requires_grad}
    consts.update(dict(module.named_buffers()))

    def loss(params: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        out = functional_call(module, (params, consts), (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0), reduction="sum")

    out: dict[str, Tensor] = vmap(grad(loss), in_dims=(None, 0, 0))(trained, x, y)
    return out


def layer_sq(grads: dict[str, Tensor], layers: list[list[str]]) -> Tensor:
    """``[B, L]`` per-example squared norms of each layer's per-example gradients."""
    return torch.stack(
        [
            torch.cat([grads[n].flatten(1) for n in names], dim=1).pow(2).sum(dim=1)
            for names in layers
        ],
        dim=-1,
    )


def check_against_torch_func(
    make: Callable[[], nn.Module], x: Tensor, classes: int = CLASSES
) -> BookkeepingModel:
    """Two steps (the first verifies the rules, the second runs them alone) of a pack of one:
    per-layer squared norms and both kinds of weighted sums equal torch.func's; every layer
    kept its rule and the rule ran (no materialised fallback)."""
    module = make()
    bk = BookkeepingModel([module])
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        y = torch.randint(classes, (B,), generator=gen)
        out, cap = bk.forward(x.unsqueeze(0), capture=True)
        assert cap is not None
        infos = bk.layer_grads(per_sample_loss(out, y.unsqueeze(0), "classification").sum(), cap)
        ref = torch_func_grads(module, x, y)
        want = layer_sq(ref, bk.layer_params)
        torch.testing.assert_close(bk.sq_norms(infos)[0], want, rtol=1e-4, atol=1e-9)
        for w in (torch.rand(1, B, 1, generator=gen), torch.rand(1, B, bk.n_param_layers)):
            got = torch.empty(1, bk.numel)
            bk.weighted_sum_into(got, infos, w)
            for li, names in enumerate(bk.layer_params):
                wl = w[0, :, 0 if w.shape[-1] == 1 else li]
                for n in names:
                    a, b = bk.slices[n]
                    expect = torch.einsum("b,b...->...", wl, ref[n]).reshape(-1)
                    torch.testing.assert_close(got[0, a:b], expect, rtol=1e-4, atol=1e-7)
        if any(r is not None for r in bk.rules):  # the rules ran, on every layer that has one
            covered = getattr(cap, "covered", None)
            assert covered == [r is not None for r in bk.rules]
    return bk


def ids(seed: int = 0) -> Tensor:
    x = torch.randint(1, VOCAB, (B, SEQ), generator=torch.Generator().manual_seed(seed))
    x[1, 5:] = 0  # padding
    x[2, 3] = x[2, 6]  # a repeated token
    return x


# -- per-rule exactness ---------------------------------------------------------------------


def test_lora_pair_matches_torch_func() -> None:
    bk = check_against_torch_func(lora_bert, ids())
    # peft's lora.Linear (lora_dropout=0) keeps lora_A / lora_B on the Linear rule.
    assert bk.rules == ["linear"] * bk.n_param_layers
    assert sum("lora_A" in n for n in bk.layer_names) == 4
    assert bk.frozen_shared and bk.trained_numel < bk.total_numel // 10


def test_attention_projections_match_torch_func() -> None:
    keep = any_match(["query", "key", "value", "attention.output.dense"])
    bk = check_against_torch_func(lambda: freeze_except(Logits(bert()), keep), ids())
    assert bk.rules == ["linear"] * 8 and bk.n_param_layers == 8  # q, k, v, o x 2 layers


def test_embedding_matches_torch_func() -> None:
    bk = check_against_torch_func(
        lambda: freeze_except(EmbedNet(), any_match(["emb."])), ids(1) % VOCAB
    )
    assert bk.layer_names == ["emb"] and bk.rules == ["embedding"]


def test_layernorm_matches_torch_func() -> None:
    bk = check_against_torch_func(lambda: freeze_except(NormNet(), any_match(["norm."])), ids(2))
    assert bk.layer_names == ["norm"] and bk.rules == ["layernorm"]


def test_bert_layernorms_and_embeddings_match_torch_func() -> None:
    keep = any_match(["LayerNorm", "word_embeddings", "classifier"])
    bk = check_against_torch_func(lambda: freeze_except(Logits(bert()), keep), ids(3))
    assert set(bk.rules) == {"embedding", "layernorm", "linear"}


def test_head_only_mlp_takes_the_generic_path_and_matches_torch_func() -> None:
    def make() -> nn.Module:
        return freeze_except(head_mlp(), any_match(["4."]))

    model, path = build_pack_model([make()])
    assert path == "generic"  # the packed path would train (and noise) every parameter
    assert model.trained_numel == 16 * CLASSES + CLASSES
    assert model.total_numel == 12 * 16 + 16 + 16 * 16 + 16 + model.trained_numel
    x = torch.randn(B, 12, generator=torch.Generator().manual_seed(4))
    bk = check_against_torch_func(make, x)
    assert bk.layer_names == ["4"] and bk.rules == ["linear"]


def test_bias_only_layers_fall_back_exactly() -> None:
    # BitFit-like: only the biases trained; no rule covers a lone bias, the fallback is exact.
    bk = check_against_torch_func(
        lambda: freeze_except(head_mlp(), any_match(["bias"])), torch.randn(B, 12)
    )
    assert bk.rules == [None, None, None]


def test_tied_weight_is_detected_and_exact() -> None:
    def make() -> nn.Module:
        torch.manual_seed(5)
        return freeze_except(TiedNet(), any_match(["emb.", "out."]))

    bk = check_against_torch_func(make, ids(5), classes=VOCAB)
    # Detection: one Parameter under two names, trained once, and no rule for it (its
    # per-example gradient sums both uses: the materialised torch.func path computes it).
    assert bk.tied == {"emb.weight": ["out.weight"]}
    assert bk.names == ["emb.weight"] and bk.rules == [None]
    # The outcome survives training: the module read back is still tied.
    m = bk.to_module(0, torch.zeros(bk.numel))
    assert isinstance(m, TiedNet) and m.out.weight is m.emb.weight


def test_a_model_with_nothing_trained_is_refused() -> None:
    with pytest.raises(ConfigError, match="frozen") as err:
        build_pack_model([freeze_except(head_mlp(), lambda _: False)])
    assert err.value.field == "model.trainable"


# -- the engine ------------------------------------------------------------------------------


def make_engine(
    model: Any,
    x: Tensor,
    y: Tensor,
    strategy: str,
    params: dict[str, Any],
    *,
    seeds: list[int],
    sigma: float = 1.0,
) -> DPEngine:
    k = model.k
    strat = get_strategy(strategy)([params] * k, n_layers=model.n_param_layers, device=model.device)
    return DPEngine(
        model=model,
        strategy=strat,
        optimizer=PackedOptimizer("sgd", torch.full((k,), 0.05)),
        x=x,
        y=y,
        task="classification",
        sample_rate=0.5,
        noise_multiplier=torch.full((k,), sigma),
        sample_streams=[sample_stream(10 + s) for s in seeds],
        noise=NoiseSource([noise_stream(20 + s) for s in seeds], model.device),
    )


def data(n: int = 16) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(7)
    return torch.randint(1, VOCAB, (n, SEQ), generator=gen), torch.randint(
        CLASSES, (n,), generator=gen
    )


@pytest.mark.parametrize(
    ("strategy", "params"),
    [
        ("fixed", {"clip": 0.5, "clip_style": "flat"}),
        ("fixed", {"clip": 0.5, "clip_style": "layerwise"}),
        ("automatic", {"clip": 0.5, "clip_style": "layerwise"}),
        ("bam", {"clip": 0.5, "bam_lambda": 0.1, "clip_style": "flat"}),
    ],
)
def test_frozen_values_never_move_even_under_huge_noise(
    strategy: str, params: dict[str, Any]
) -> None:
    modules = [lora_bert(s) for s in (1, 2)]
    before = [frozen_state(m) for m in modules]
    model, path = build_pack_model(modules)
    assert path == "generic"
    start = model.flat.clone()
    x, y = data()
    engine = make_engine(model, x, y, strategy, params, seeds=[0, 1], sigma=1e6)
    assert engine.grad.shape == (2, model.trained_numel)  # the noise's dimension
    for _ in range(3):
        engine.step()
    assert (model.flat - start).abs().amax() > 100.0  # the noise did reach the trained part
    for i in range(2):
        m = model.to_module(i)
        after = frozen_state(m)
        assert after.keys() == before[i].keys() and len(after) > 0
        for n, t in before[i].items():
            assert torch.equal(after[n], t), n  # bit for bit
        # The kept checkpoint (safetensors) carries the full model, frozen values intact.
        fresh = lora_bert(99)
        load_weights(fresh, weights_bytes(m))
        for n, t in frozen_state(fresh).items():
            assert torch.equal(t, before[i][n]), n
        assert torch.equal(
            torch.cat([p.detach().reshape(-1) for p in fresh.parameters() if p.requires_grad]),
            model.flat[i],
        )


def test_noise_is_drawn_for_the_trained_coordinates_only() -> None:
    model, _ = build_pack_model([lora_bert(1)])
    x, y = data()
    engine = make_engine(model, x, y, "fixed", {"clip": 0.5}, seeds=[3])
    engine.step()
    # The fixed strategy's one release drew exactly P_trained normals from the trial's noise
    # stream: its next draw is the stream's (P_trained + 1)-th.
    nxt = engine.noise.standard_normal(1)[0]
    torch.testing.assert_close(nxt, normals(23, model.trained_numel, 1)[1].to(nxt.dtype))


def test_a_pack_of_three_equals_three_single_trials() -> None:
    x, y = data()
    pack, _ = build_pack_model([lora_bert(s) for s in (1, 2, 3)])
    assert isinstance(pack, GenericModel) and pack.frozen_shared  # one backbone, held once
    engine = make_engine(pack, x, y, "fixed", {"clip": 0.5}, seeds=[0, 1, 2])
    for _ in range(3):
        engine.step()
    for i, s in enumerate((1, 2, 3)):
        single, _ = build_pack_model([lora_bert(s)])
        one = make_engine(single, x, y, "fixed", {"clip": 0.5}, seeds=[i])
        for _ in range(3):
            one.step()
        torch.testing.assert_close(pack.flat[i], single.flat[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", [GenericModel, BookkeepingModel])
@pytest.mark.parametrize("batched", [True, False])
def test_trials_with_different_frozen_values_keep_their_own(
    cls: type[GenericModel], batched: bool
) -> None:
    # Each trial's own frozen body (as if from two checkpoints): stacked, not shared.
    modules = [freeze_except(head_mlp(s), any_match(["2.", "4."])) for s in (0, 1)]
    model = cls(modules, batched_trials=batched)
    assert not model.frozen_shared and model.frozen["0.weight"].shape == (2, 16, 12)
    gen = torch.Generator().manual_seed(8)
    x, y = torch.randn(2, B, 12, generator=gen), torch.randint(CLASSES, (2, B), generator=gen)
    for _ in range(2):
        out, cap = model.forward(x, capture=True)
        assert cap is not None
        infos = model.layer_grads(per_sample_loss(out, y, "classification").sum(), cap)
        sq = model.sq_norms(infos)
        for i, m in enumerate(modules):
            torch.testing.assert_close(out[i].detach(), m(x[i]))
            ref = torch_func_grads(m, x[i], y[i])
            want = layer_sq(ref, model.layer_params)
            torch.testing.assert_close(sq[i], want, rtol=1e-4, atol=1e-9)
    for i, m in enumerate(modules):
        back = model.to_module(i)
        for n, t in frozen_state(m).items():
            assert torch.equal(frozen_state(back)[n], t)


FROZEN_MLP = "test_frozen_head_mlp"


def _frozen_head_mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A registered model whose hidden layers are a fixed "checkpoint" (seed 0, frozen) and
    whose head is drawn from the trial's seed (the registry seeds the builder)."""
    head = nn.Linear(16, num_classes)
    torch.manual_seed(0)
    body = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 16), nn.Tanh())
    return freeze_except(nn.Sequential(*body, head), any_match(["3."]))


def test_a_frozen_model_trains_end_to_end_with_an_average_and_kept_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    desc = ModelDescriptor(FROZEN_MLP, input_kind="any", description="frozen body, trained head")
    monkeypatch.setitem(DESCRIPTORS, FROZEN_MLP, desc)
    monkeypatch.setitem(MODELS, FROZEN_MLP, ModelEntry(desc, _frozen_head_mlp))
    spec = PackSpec(
        dataset=DatasetSpec("digits"),
        model=ModelSpec(FROZEN_MLP),
        strategy="fixed",
        trials=[
            TrialSpec(lr=0.5, seed=0, noise_multiplier=1.0, params={"clip": 1.0}),
            TrialSpec(lr=1.0, seed=1, noise_multiplier=100.0, params={"clip": 1.0}),
        ],
        batch_size=32,
        steps=6,
        eval_every=3,
        ema_decay=0.5,
        keep_weights=True,
        randomness="reproducible",
    )
    results = train_pack(spec)
    shape = (64,)
    reference = frozen_state(_frozen_head_mlp(shape, 10))
    for r in results:
        assert r.engine_path == "generic" and r.weights is not None
        m = _frozen_head_mlp(shape, 10)
        load_weights(m, r.weights)
        for n, t in frozen_state(m).items():
            assert torch.equal(t, reference[n]), n  # the kept file holds them untouched
        assert r.checkpoint is not None and r.checkpoint.numel() == 16 * 10 + 10
