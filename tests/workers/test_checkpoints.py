"""Checkpoints round-trip: the module rebuilt from a card's ``model`` section and the safetensors
bytes computes what the trained pack computed for that trial.

For every registered architecture: K = 2 modules packed the way the training loop packs them
(``build_pack_model``), flat parameters perturbed as training would, ``to_module`` of one trial,
``weights_bytes``, the card's JSON, ``build_trained``; the rebuilt module's outputs equal
``to_module``'s and the pack's forward for that trial. Then end to end: ``train_pack`` with
``keep_weights`` hands back weights whose module gives exactly the recorded test accuracy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load
from torch import Tensor, nn

from dpsweep.errors import ConfigError
from workers.checkpoints import build_trained, load_weights, model_info, weights_bytes
from workers.datasets.loading import load_dataset
from workers.datasets.raw_records import raw_evaluation_inputs
from workers.datasets.records import DatasetSpec
from workers.generic.dispatch import build_pack_model
from workers.generic.model import GenericModel
from workers.models.descriptors import DESCRIPTORS, ModelSpec
from workers.models.pretrained_descriptors import CHECKPOINT_MODELS
from workers.models.registry import build_model, model_names
from workers.training.loop import train_pack
from workers.training.prepare import with_data_vocab
from workers.training.specs import PackSpec, TrialSpec

K = 2
CLASSES = 3
#: Data vocabulary size for token models (what ``with_data_vocab`` puts into the options).
DATA_VOCAB = 40

#: A small example shape per input kind (the built-in CNNs need 2 halvings at most).
SHAPES: dict[str, tuple[int, ...]] = {
    "flat": (12,),
    "image": (1, 12, 12),
    "any": (1, 6, 6),
    "tokens": (10,),
}

#: Small options for the big built-ins, so that every case takes well under a second.
SMALL: dict[str, tuple[dict[str, Any], tuple[int, ...] | None]] = {
    "wrn16_4": ({"depth": 10, "width": 1, "norm_groups": 4}, (3, 8, 8)),
    "res_cnn": ({"width": 8, "blocks": 1}, None),
    "text_classifier": (
        {"d_model": 16, "heads": 2, "layers": 1, "ff_mult": 2, "max_len": 16},
        None,
    ),
    "lip_mlp": ({"hidden": [8, 8], "temperature": 4.0}, None),
    "lip_cnn": ({"channels": [4], "input_bound": 2.0, "temperature": 2.0}, None),
    "mlp": ({"hidden": [16], "activation": "tanh"}, None),
}


def case(name: str) -> tuple[ModelSpec, tuple[int, ...]]:
    """The model spec (as the loop builds it, token vocabulary included) and example shape."""
    kind = DESCRIPTORS[name].input_kind
    options, shape = SMALL.get(name, ({}, None))
    spec = with_data_vocab(ModelSpec(name, dict(options)), DATA_VOCAB if kind == "tokens" else None)
    return spec, shape or SHAPES[kind]


def inputs(name: str, shape: tuple[int, ...], n: int = 5) -> Tensor:
    gen = torch.Generator().manual_seed(1)
    if DESCRIPTORS[name].input_kind == "tokens":
        # Ids past the data vocabulary read as unknown; row 1 padded at the end, row 2 all pad.
        ids = torch.randint(1, DATA_VOCAB + 10, (n, *shape), generator=gen)
        ids[1, shape[0] // 2 :] = 0
        ids[2] = 0
        return ids
    # Some examples outside the unit ball, so the Lipschitz input projection acts.
    return torch.rand(n, *shape, generator=gen) * torch.linspace(0.5, 3.0, n).view(
        n, *([1] * len(shape))
    )


# A checkpoint model (hf, timm, torchvision) needs its checkpoint: test_pretrained.py.
@pytest.mark.parametrize("name", [n for n in model_names() if n not in CHECKPOINT_MODELS])
def test_rebuilt_module_computes_what_the_trained_pack_computed(name: str) -> None:
    spec, shape = case(name)
    modules = [build_model(spec, input_shape=shape, num_classes=CLASSES, seed=s) for s in range(K)]
    descriptor = DESCRIPTORS[name]
    model, engine_path = build_pack_model(
        modules, batched_trials=descriptor.generic_packs == "batched"
    )
    if descriptor.engine_path != "auto":
        assert engine_path == descriptor.engine_path
    # Training moves the flat parameters (in place: the layers hold views into them).
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        model.flat.add_(0.05 * torch.randn(model.flat.shape, generator=gen))

    x = inputs(name, shape)
    with torch.no_grad():
        packed_out, _ = model.forward(x.unsqueeze(0).expand(K, *x.shape))
    for i in range(K):
        trained = model.to_module(i, model.flat[i].clone()).eval()
        info = model_info(
            trained,
            name=spec.name,
            options=spec.options,
            input_shape=shape,
            num_classes=CLASSES,
            engine_path=engine_path,
        )
        # The card is JSON: the model section must survive it (tuples become lists).
        info = json.loads(json.dumps(info))
        assert info["parameters"] == model.flat.shape[1]
        if descriptor.input_kind == "tokens":
            assert info["options"]["vocab_size"] == DATA_VOCAB
        data = weights_bytes(trained)
        rebuilt = build_trained(info, data)
        assert not rebuilt.training
        with torch.no_grad():
            expected = trained(x)
            got = rebuilt(x)
        assert torch.equal(got, expected), name
        assert torch.allclose(got, packed_out[i], rtol=1e-5, atol=1e-5), (
            name,
            i,
            float((got - packed_out[i]).abs().max()),
        )
        # The two trials differ, so trial i's weights are really trial i's.
        assert not torch.allclose(got, packed_out[1 - i]), name


def test_generic_module_buffers_travel_with_the_weights() -> None:
    class Shifted(nn.Module):
        """A module with a buffer (a fixed, non-trained offset) on the generic path."""

        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)
            self.norm = nn.LayerNorm(3)
            self.register_buffer("offset", torch.zeros(3))

        def forward(self, x: Tensor) -> Tensor:
            return self.norm(self.lin(x)) + self.offset

    mods = []
    for s in range(K):
        torch.manual_seed(s)
        m = Shifted()
        m.offset.fill_(float(s + 1))  # a per-trial buffer value
        mods.append(m)
    model, path = build_pack_model(mods)
    assert path == "generic" and isinstance(model, GenericModel)
    x = torch.randn(5, 4)
    with torch.no_grad():
        model.flat.add_(0.1)
        packed_out, _ = model.forward(x.unsqueeze(0).expand(K, *x.shape))
    for i in range(K):
        trained = model.to_module(i)
        data = weights_bytes(trained)
        assert torch.equal(load(data)["offset"], torch.full((3,), float(i + 1)))
        fresh = Shifted()
        load_weights(fresh, data)
        with torch.no_grad():
            assert torch.equal(fresh(x), trained(x))
            assert torch.allclose(fresh(x), packed_out[i], atol=1e-6)


def test_weights_that_do_not_fit_the_card_are_refused() -> None:
    small = build_model(ModelSpec("mlp", {"hidden": [8]}), input_shape=(12,), num_classes=3, seed=0)
    info = model_info(
        small,
        name="mlp",
        options={"hidden": [16]},
        input_shape=(12,),
        num_classes=3,
        engine_path="packed",
    )
    with pytest.raises(ConfigError, match="do not fit"):
        build_trained(info, weights_bytes(small))
    with pytest.raises(ConfigError, match="unknown model"):
        build_trained({**info, "name": "no_such_model"}, weights_bytes(small))


# ---------------------------------------------------------------------------------------------
# End to end through train_pack.


def accuracy(module: nn.Module, x: Tensor, y: Tensor) -> float:
    with torch.no_grad():
        pred = module(x).argmax(dim=-1)
    return float((pred == y).double().mean())


def keep_spec(
    dataset: DatasetSpec, model: ModelSpec, keep: bool, strategy: str = "fixed", **kw: Any
) -> PackSpec:
    # The lipschitz strategy has no clipping norm: its sensitivity comes from the model.
    params = {} if strategy == "lipschitz" else {"clip": 1.0}
    lrs = [0.01, 0.02] if strategy == "lipschitz" else [0.5, 1.0]
    base: dict[str, Any] = dict(
        dataset=dataset,
        model=model,
        strategy=strategy,
        trials=[
            TrialSpec(lr=lr, seed=s, noise_multiplier=1.0, target_delta=1e-3, params=params)
            for s, lr in enumerate(lrs)
        ],
        batch_size=64,
        steps=12,
        eval_every=4,
        randomness="reproducible",
        keep_weights=keep,
    )
    base.update(kw)
    return PackSpec(**base)


@pytest.mark.parametrize(
    ("model", "strategy"),
    [
        (ModelSpec("mlp", {"hidden": [32]}), "fixed"),
        # The projection after each step lives in the flat parameters the checkpoint copies.
        (
            ModelSpec("lip_cnn", {"channels": [8], "input_bound": 4.0, "temperature": 8.0}),
            "lipschitz",
        ),
    ],
)
def test_kept_weights_give_exactly_the_recorded_test_accuracy(
    model: ModelSpec, strategy: str
) -> None:
    dataset = DatasetSpec("digits")
    results = train_pack(keep_spec(dataset, model, keep=True, strategy=strategy))
    data = load_dataset(dataset)
    # The kept file carries the input transform (digits: the pixel format's), so the module
    # takes the raw records and scores exactly what the trainer measured on scaled ones.
    x, y = torch.from_numpy(raw_evaluation_inputs(dataset)), torch.from_numpy(data.y_test)
    assert float(x.max()) == 16.0
    for r in results:
        assert r.weights is not None and r.best_step is not None
        assert r.model_info["name"] == model.name and r.model_info["engine_path"] == "packed"
        module = build_trained(json.loads(json.dumps(r.model_info)), r.weights)
        assert accuracy(module, x, y) == r.metrics["accuracy"]
        # The weights are the best checkpoint the result describes.
        flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        assert torch.equal(flat, r.checkpoint)
    assert results[0].weights != results[1].weights

    for r in train_pack(keep_spec(dataset, model, keep=False, strategy=strategy)):
        assert r.weights is None
        assert r.model_info["name"] == model.name


def test_kept_token_model_uses_the_data_vocabulary(tmp_path: Path) -> None:
    rows = [f"great fun {i},pos" for i in range(30)] + [f"awful mess {i},neg" for i in range(30)]
    (tmp_path / "reviews.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    # The vocabulary is public: written by the test, never built from the records.
    (tmp_path / "vocab.txt").write_text("great\nfun\nawful\nmess\n")
    dataset = DatasetSpec(
        "text_csv",
        path=str(tmp_path / "reviews.csv"),
        label_column="label",
        options={"vocab": str(tmp_path / "vocab.txt"), "max_length": 6},
    )
    # vocab_size left out: the loop takes the dataset's (far below the 32768 default).
    model = ModelSpec("text_classifier", {"d_model": 16, "heads": 2, "layers": 1, "ff_mult": 2})
    results = train_pack(keep_spec(dataset, model, keep=True, batch_size=16, steps=6))
    data = load_dataset(dataset)
    assert data.vocab_size is not None and data.vocab_size < 100
    x, y = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    assert x.dtype == torch.int64 and np.all(data.x_test >= 0)
    for r in results:
        assert r.engine_path == "generic" and r.weights is not None
        assert r.model_info["options"]["vocab_size"] == data.vocab_size
        module = build_trained(json.loads(json.dumps(r.model_info)), r.weights)
        assert module.embed.num_embeddings == data.vocab_size  # type: ignore[union-attr]
        assert accuracy(module, x, y) == r.metrics["accuracy"]


def test_the_same_weights_give_the_same_bytes() -> None:
    """safetensors writes its metadata from a hash map, in an order that varies between calls;
    the store keys kept models by the SHA-256 of their bytes, so they must not vary."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    outputs = {weights_bytes(module) for _ in range(40)}
    assert len(outputs) == 1
    loaded = load(outputs.pop())
    assert torch.equal(loaded["0.weight"], module[0].weight.detach())
