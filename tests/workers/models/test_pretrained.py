"""Models from local checkpoints: a tiny BERT built from a config and saved to a temporary
directory (no network), what each ``trainable`` choice freezes, LoRA, and the refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dpsweep.errors import ConfigError
from dpsweep.spec_model import ModelConfig
from tests.workers.models.tiny_checkpoints import text_csv, tiny_bert
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.model_check import check_model, model_size
from workers.models import build_model, model_spec

pytest.importorskip("transformers")
pytest.importorskip("peft")


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("ckpt") / "tiny-bert")


def _spec(path: Path, **kw: object) -> object:
    cfg = ModelConfig(name="hf", checkpoint=str(path), **kw)  # type: ignore[arg-type]
    return model_spec(cfg, checkpoints_dir="/nonexistent", allow_paths=True)


def _trained(module: torch.nn.Module) -> set[str]:
    return {n for n, p in module.named_parameters() if p.requires_grad}


def _build(spec: object, seed: int = 0) -> torch.nn.Module:
    return build_model(spec, input_shape=(16,), num_classes=2, seed=seed)  # type: ignore[arg-type]


def test_loads_the_checkpoint_weights_locally(bert: Path) -> None:
    from safetensors.torch import load_file

    module = _build(_spec(bert))
    saved = load_file(str(bert / "model.safetensors"))
    key = "bert.encoder.layer.1.attention.self.query.weight"
    assert torch.equal(dict(module.named_parameters())[f"model.{key}"], saved[key])
    # The head is resized to the data's 2 classes, its new weights from the seed.
    assert module.model.classifier.out_features == 2  # type: ignore[union-attr]
    again = _build(_spec(bert))
    other = _build(_spec(bert), seed=1)
    w = module.model.classifier.weight  # type: ignore[union-attr]
    assert torch.equal(w, again.model.classifier.weight)  # type: ignore[union-attr]
    assert not torch.equal(w, other.model.classifier.weight)  # type: ignore[union-attr]
    logits = module(torch.tensor([[4, 7, 8, 1, 0, 0] + [0] * 10]))
    assert logits.shape == (1, 2)


def test_trainable_choices_freeze_exactly_what_they_say(bert: Path) -> None:
    every = {n for n, _ in _build(_spec(bert)).named_parameters()}
    assert _trained(_build(_spec(bert))) == every
    assert _trained(_build(_spec(bert, trainable="head"))) == {
        "model.classifier.weight",
        "model.classifier.bias",
    }
    layer1 = _trained(_build(_spec(bert, trainable=["model.bert.encoder.layer.1.*"])))
    assert layer1 and all(n.startswith("model.bert.encoder.layer.1.") for n in layer1)
    assert layer1 == {n for n in every if n.startswith("model.bert.encoder.layer.1.")}


def test_lora_trains_adapters_and_head_only(bert: Path) -> None:
    spec = model_spec(
        ModelConfig(name="hf", checkpoint=str(bert), trainable="lora", lora={"r": 4}),
        checkpoints_dir="/nonexistent",
        allow_paths=True,
    )
    module = _build(spec)
    trained = _trained(module)
    lora = {n for n in trained if ".lora_" in n}
    # peft's default targets for BERT: query and value of each of the 2 layers, A and B each.
    assert len(lora) == 8 and all(("query" in n or "value" in n) for n in lora)
    assert trained - lora == {"model.classifier.weight", "model.classifier.bias"}
    a = dict(module.named_parameters())[
        "model.bert.encoder.layer.0.attention.self.query.lora_A.default.weight"
    ]
    assert a.shape == (4, 32)
    frozen = {n for n, p in module.named_parameters() if not p.requires_grad}
    assert "model.bert.embeddings.word_embeddings.weight" in frozen
    # The rank sweeps: another rank, another architecture.
    r2 = model_spec(
        ModelConfig(name="hf", checkpoint=str(bert), trainable="lora"),
        checkpoints_dir="/nonexistent",
        allow_paths=True,
        lora_r=2,
    )
    assert r2.lora is not None and r2.lora.r == 2
    trained_r2, total = model_size(r2, input_shape=(16,), num_classes=2)
    trained_r4, _ = model_size(spec, input_shape=(16,), num_classes=2)
    assert trained_r2 < trained_r4 < total


def test_lora_rank_needs_trainable_lora(bert: Path) -> None:
    with pytest.raises(ConfigError, match=r"needs model\.trainable: lora"):
        model_spec(
            ModelConfig(name="hf", checkpoint=str(bert)),
            checkpoints_dir="/x",
            allow_paths=True,
            lora_r=4,
        )


def test_patterns_that_match_nothing_are_refused(bert: Path) -> None:
    with pytest.raises(ConfigError, match="match no parameter") as exc:
        check_model(
            _spec(bert, trainable=["encoder.layer.9.*"]),  # type: ignore[arg-type]
            input_shape=(16,),
            num_classes=2,
        )
    assert exc.value.field == "model.trainable"


def test_refused_before_anything_is_charged(bert: Path, tmp_path: Path) -> None:
    """The model check (planning, dpsweep train) refuses a changed, code-bearing or pickled
    checkpoint; no budget is reserved before it."""
    copy = shutil.copytree(bert, tmp_path / "copy")
    spec = _spec(copy)
    (copy / "model.safetensors").write_bytes((copy / "model.safetensors").read_bytes()[:-4])
    with pytest.raises(ConfigError, match="contents changed"):
        check_model(spec, input_shape=(16,), num_classes=2)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="its files changed"):
        model_spec(
            ModelConfig(name="hf", checkpoint=str(bert), checkpoint_digest="sha256:" + "1" * 64),
            checkpoints_dir="/x",
            allow_paths=True,
        )
    code = shutil.copytree(bert, tmp_path / "code")
    (code / "modeling_tiny.py").write_text("import os\n")
    with pytest.raises(ConfigError, match="holds code"):
        _spec(code)
    pickled = shutil.copytree(bert, tmp_path / "pickled")
    torch.save({"w": torch.zeros(1)}, pickled / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="pickle"):
        _spec(pickled)
    with pytest.raises(ConfigError, match=r"needs model\.checkpoint"):
        model_spec(ModelConfig(name="hf"), checkpoints_dir="/x", allow_paths=True)


def test_the_checkpoint_tokenizer_tokenizes_the_text(bert: Path, tmp_path: Path) -> None:
    csv_path = text_csv(tmp_path / "reviews.csv", rows=10)
    data = load_dataset(
        DatasetSpec(
            name="text_csv",
            path=str(csv_path),
            label_column="label",
            options={"tokenizer": str(bert), "max_length": 16},
        )
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bert), local_files_only=True)
    assert data.vocab_size == len(tok) + 2
    # The tokenizer's own ids + 2 (0 pads, 1 unknown), its special tokens included.
    expected = [i + 2 for i in tok("the movie was good")["input_ids"]]
    got = load_dataset(
        DatasetSpec(
            name="text_csv",
            path=str(_one_row(tmp_path / "one.csv")),
            label_column="label",
            options={"tokenizer": str(bert), "max_length": 16},
            test_fraction=0.5,
        )
    )
    rows = [list(r[: len(expected)]) for r in [*got.x_train, *got.x_test]]
    assert expected in rows
    assert (
        check_model(
            _spec(bert, trainable="lora"),  # type: ignore[arg-type]
            input_shape=tuple(data.input_shape),
            num_classes=data.num_classes,
            vocab_size=data.vocab_size,
        )
        == "generic"
    )
    with pytest.raises(ConfigError, match="tokenize the text with the checkpoint's own"):
        check_model(
            _spec(bert),  # type: ignore[arg-type]
            input_shape=(16,),
            num_classes=2,
            vocab_size=30522,
        )


def test_builtin_architecture_from_its_own_weights(tmp_path: Path) -> None:
    base = build_model(model_spec(ModelConfig(name="mlp", options={"hidden": [8]}),
                                  checkpoints_dir="/x", allow_paths=True),
                       input_shape=(4,), num_classes=3, seed=5)  # fmt: skip
    file = tmp_path / "mlp.safetensors"
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, str(file))
    cfg = ModelConfig(name="mlp", options={"hidden": [8]}, checkpoint=str(file), trainable="head")
    spec = model_spec(cfg, checkpoints_dir="/x", allow_paths=True)
    assert spec.checkpoint is not None and spec.checkpoint.kind == "state_dict"
    module = build_model(spec, input_shape=(4,), num_classes=3, seed=0)
    for (n, p), q in zip(module.named_parameters(), base.parameters(), strict=True):
        assert torch.equal(p, q), n
    assert _trained(module) == {"3.weight", "3.bias"}  # the last Linear: the head
    with pytest.raises(ConfigError, match="does not fit this model"):
        build_model(spec, input_shape=(4,), num_classes=5, seed=0)


def _one_row(path: Path) -> Path:
    path.write_text("text,label\nthe movie was good,pos\nthe film was bad,neg\n")
    return path


def test_a_lora_pack_trains_adapters_and_keeps_the_backbone(bert: Path, tmp_path: Path) -> None:
    """Two trials of one rank train as one pack: the adapters and the head move, every frozen
    weight is the checkpoint's bit for bit, and the kept model rebuilds from its card."""
    from safetensors.torch import load_file

    from workers.checkpoints import build_trained, load_weights
    from workers.training.loop import train_pack
    from workers.training.specs import PackSpec, TrialSpec

    csv_path = text_csv(tmp_path / "reviews.csv", rows=80)
    dataset = DatasetSpec(
        name="text_csv",
        path=str(csv_path),
        label_column="label",
        options={"tokenizer": str(bert), "max_length": 16},
    )
    model = model_spec(
        ModelConfig(name="hf", checkpoint=str(bert), trainable="lora", lora={"r": 2}),
        checkpoints_dir="/x",
        allow_paths=True,
    )
    trials = [
        TrialSpec(lr=0.5, seed=s, noise_multiplier=1.0, params={"clip": 1.0}) for s in range(2)
    ]
    spec = PackSpec(
        dataset=dataset, model=model, strategy="fixed", trials=trials, batch_size=16,
        steps=4, eval_every=2, device="cpu", keep_weights=True,
    )  # fmt: skip
    results = train_pack(spec)
    assert [r.engine_path for r in results] == ["generic", "generic"]
    info = results[0].model_info
    assert info["trainable"] == "lora" and info["lora"]["r"] == 2
    assert info["checkpoint"]["digest"] == model.checkpoint.digest  # type: ignore[union-attr]
    assert info["trained_parameters"] == 4 * (2 * 32 + 32 * 2) + 2 * 32 + 2
    weights = results[0].weights
    assert weights is not None
    rebuilt = build_trained(info, weights, raw_inputs=False)
    saved = load_file(str(bert / "model.safetensors"))
    params = dict(rebuilt.named_parameters())
    for key in (
        "bert.embeddings.word_embeddings.weight",
        "bert.encoder.layer.0.output.dense.weight",
    ):
        assert torch.equal(params[f"model.{key}"], saved[key])  # frozen: the checkpoint's
    b = params["model.bert.encoder.layer.0.attention.self.query.lora_B.default.weight"]
    assert b.abs().sum() > 0  # LoRA's B starts at zero: it was trained
    assert load_weights(_build(model), weights) is not None


def test_an_image_checkpoint_resizes_and_normalises_as_its_processor_says(
    tmp_path: Path,
) -> None:
    """One-channel 12x12 images in [0, 1] reach a 3-channel 8x8 ViT resized and normalised
    with the processor's mean and std; the head is resized to the data's classes."""
    import torch.nn.functional as F

    from tests.workers.models.tiny_checkpoints import tiny_vit

    vit = tiny_vit(tmp_path / "vit", mean=0.5, std=0.25)
    spec = model_spec(
        ModelConfig(name="hf", checkpoint=str(vit), trainable="head"),
        checkpoints_dir="/x",
        allow_paths=True,
    )
    module = build_model(spec, input_shape=(1, 12, 12), num_classes=3, seed=0)
    assert _trained(module) == {"model.classifier.weight", "model.classifier.bias"}
    x = torch.rand(2, 1, 12, 12)
    expected_input = F.interpolate(x.expand(-1, 3, -1, -1), size=(8, 8), mode="bilinear") - 0.5
    expected = module.model(pixel_values=expected_input / 0.25).logits  # type: ignore[operator]
    torch.testing.assert_close(module(x), expected)
    assert expected.shape == (2, 3)
    # The generic DP path takes it (the check run before anything is reserved).
    assert check_model(spec, input_shape=(1, 12, 12), num_classes=3) == "generic"


def test_timm_and_torchvision_load_their_weights(tmp_path: Path) -> None:
    """Needs the vision extra (no CPU build through pip here: skipped without it)."""
    timm = pytest.importorskip("timm")
    base = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10)
    file = tmp_path / "vit" / "model.safetensors"
    file.parent.mkdir()
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, str(file))
    cfg = ModelConfig(name="timm", options={"arch": "vit_tiny_patch16_224"},
                      checkpoint=str(file.parent), trainable="head")  # fmt: skip
    module = build_model(
        model_spec(cfg, checkpoints_dir="/x", allow_paths=True),
        input_shape=(3, 224, 224),
        num_classes=4,
        seed=0,
    )
    assert _trained(module) == {"head.weight", "head.bias"}
    assert torch.equal(module.patch_embed.proj.weight, base.patch_embed.proj.weight)
