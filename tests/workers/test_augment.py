"""Augmentation multiplicity and physical chunks outside the step: the augmentations, the
refusals (before anything is reserved, naming ``training.augment``) and a pack that trains
with both end to end."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml

from dpsweep.errors import ConfigError
from dpsweep.spec import load_spec
from dpsweep.spec_training import AugmentConfig
from sweeper.sweeps.checks import check_model_on_data
from workers.augment import Augmenter, random_crop, random_flip
from workers.augment_check import check_augment
from workers.chunked_step import physical_batch
from workers.datasets.records import DatasetSpec
from workers.models import ModelSpec
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialSpec


def test_crop_and_flip() -> None:
    x = torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).view(2, 3, 5, 5)
    same = random_crop(x, torch.tensor([[4, 4], [4, 4]]))
    torch.testing.assert_close(same, x)  # offset 4 of padding 4: the image itself
    shifted = random_crop(x, torch.tensor([[0, 4], [4, 8]]))
    torch.testing.assert_close(shifted[0, :, 4:], x[0, :, :1])  # moved down by 4, zeros above
    assert float(shifted[0, :, :4].abs().sum()) == 0.0
    torch.testing.assert_close(shifted[1, :, :, :1], x[1, :, :, 4:])  # moved left by 4
    flipped = random_flip(x, torch.tensor([True, False]))
    torch.testing.assert_close(flipped[0], x[0].flip(-1))
    torch.testing.assert_close(flipped[1], x[1])


def test_copies_are_public_and_do_not_follow_the_chunking() -> None:
    x = torch.randn(2, 6, 1, 8, 8)
    y = torch.zeros(2, 6, dtype=torch.long)
    mask = torch.ones(2, 6)
    a = Augmenter(multiplicity=3, ops=["crop", "flip"], seeds=[0, 1])
    a.begin_step(6)
    whole, t, m = a.copies(x, y, mask)
    assert whole.shape == (2, 18, 1, 8, 8) and t.shape == (2, 18) and m.shape == (2, 18)
    b = Augmenter(multiplicity=3, ops=["crop", "flip"], seeds=[0, 1])
    b.begin_step(6)
    parts = [b.copies(x[:, i : i + 2], y[:, i : i + 2], mask[:, i : i + 2])[0] for i in (0, 2, 4)]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole)
    # Each trial's own public generator: the two trials' copies of the same images differ.
    same = Augmenter(multiplicity=3, ops=["crop", "flip"], seeds=[0, 0])
    same.begin_step(6)
    twin = same.copies(x[:1].expand(2, -1, -1, -1, -1), y, mask)[0]
    torch.testing.assert_close(twin[0], twin[1])


@pytest.mark.parametrize(
    ("shape", "ops", "ascent", "audit", "words"),
    [
        ((20,), ["crop"], False, False, "image data"),
        ((1, 8, 8), ["rotate"], False, False, "unknown augmentation"),
        ((1, 8, 8), ["crop"], True, False, "bam"),
        ((1, 8, 8), ["crop"], False, True, "audit"),
    ],
)
def test_augment_refusals(
    shape: tuple[int, ...], ops: list[str], ascent: bool, audit: bool, words: str
) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        check_augment(
            AugmentConfig(multiplicity=2, ops=ops), input_shape=shape, ascent=ascent, audit=audit
        )
    assert err.value.field == "training.augment"


def _spec(**training: Any) -> Any:
    return load_spec(
        yaml.safe_load(
            f"""
name: aug
dataset: {{name: synthetic}}
model: {{name: mlp}}
training: {json_of(training)}
privacy: {{budgets: [4], delta: 1.0e-5}}
arms: [{{strategy: fixed, grid: {{lr: [0.1], clip: [1.0]}}}}]
"""
        )
    )


def json_of(d: dict[str, Any]) -> str:
    import json  # local: only this helper writes the training section as YAML flow

    return json.dumps({"steps": 3, "batch_size": 16, **d})


def test_the_sweep_check_refuses_augment_on_tabular_data() -> None:
    spec = _spec(augment={"multiplicity": 4, "ops": ["flip"]}, physical_batch_size=8)
    assert spec.training.physical_batch_size == 8 and spec.training.augment.multiplicity == 4
    data = SimpleNamespace(input_shape=(20,), num_classes=2, vocab_size=None)
    with pytest.raises(ConfigError, match="image data") as err:
        check_model_on_data(spec, data)
    assert err.value.field == "training.augment"


def test_spec_fields_are_checked() -> None:
    with pytest.raises(ConfigError) as err:
        _spec(physical_batch_size=0)
    assert err.value.field == "training.physical_batch_size"
    with pytest.raises(ConfigError) as err:
        _spec(augment={"multiplicity": 0})
    assert err.value.field == "training.augment.multiplicity"


def _pack(**kw: Any) -> PackSpec:
    base: dict[str, Any] = dict(
        dataset=DatasetSpec("digits"),
        model=ModelSpec("cnn"),
        strategy="fixed",
        trials=[
            TrialSpec(lr=0.5, seed=0, noise_multiplier=1.0, params={"clip": 1.0}),
            TrialSpec(lr=1.0, seed=1, noise_multiplier=2.0, params={"clip": 1.0}),
        ],
        batch_size=48,
        steps=4,
        eval_every=2,
        randomness="reproducible",
    )
    base.update(kw)
    return PackSpec(**base)


def test_a_pack_trains_in_chunks_with_augmentation() -> None:
    """Physical chunks of 8 with 2 augmented copies each: the pack trains, with the plain
    pack's q, steps and epsilon (those of the logical batch); no chunk appears in its results."""
    spec = _pack(physical_batch_size=8, augment_multiplicity=2, augment_ops=["crop", "flip"])
    plain = train_pack(_pack())
    results = train_pack(spec)
    assert len(results) == 2
    for r, p in zip(results, plain, strict=True):
        assert r.diverged_at is None and 0.0 <= r.final_metrics["accuracy"] <= 1.0
        assert (r.sample_rate, r.steps, r.epsilon) == (p.sample_rate, p.steps, p.epsilon)
        assert set(vars(r)) == set(vars(p))
        assert "chunk" not in repr(r.history)


def test_the_default_physical_batch_follows_the_memory_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = SimpleNamespace(input_shape=(3, 32, 32), num_classes=10)
    spec = _pack(model=ModelSpec("wrn16_4"), batch_size=4096)
    monkeypatch.setenv("DPSWEEP_PACK_MEMORY_MB", "4096")
    small = physical_batch(spec, data)  # type: ignore[arg-type]
    assert small is not None and small & (small - 1) == 0  # a power of two under the bound
    assert physical_batch(_pack(model=ModelSpec("mlp"), batch_size=64), data) is None  # type: ignore[arg-type]
    assert physical_batch(spec, data, audit=True) is None  # an audit runs in one piece
    assert physical_batch(_pack(batch_size=4096, physical_batch_size=32), data) == 32  # type: ignore[arg-type]


def test_the_new_training_fields_at_their_defaults_keep_the_resume_hash() -> None:
    """A spec written before the fields existed hashes as it did (its sweeps still resume); a
    spec that sets one hashes differently."""
    import hashlib  # local: only the resume hash is recomputed here
    import json

    from sweeper.sweeps.create import spec_hash  # local: the sweeper's store, for this test

    spec = _spec()
    before = spec.model_dump(mode="json", exclude={"resources", "artifacts"})
    for arm in before["arms"]:
        del arm["tune_on"]
    for key in ("physical_batch_size", "augment", "tune_batch_scale"):
        del before["training"][key]
    # Fields of a later change (privacy units), absent from specs written before it too.
    for key in ("unit_bounding", "rows_per_unit"):
        del before["training"][key]
    del before["dataset"]["privacy_unit"]
    old = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    assert spec_hash(spec) == old
    assert spec_hash(_spec(physical_batch_size=8)) != old
    assert spec_hash(_spec(tune_batch_scale=4)) != old


def test_the_cifar10_example_asks_for_chunks_and_multiplicity_16() -> None:
    """examples/cifar10-wrn16-4.yaml (planned by tests/api/test_cifar_example.py) reaches the
    worker with its physical batch and augmentation."""
    root = Path(__file__).resolve().parents[2]
    spec = load_spec(root / "examples" / "cifar10-wrn16-4.yaml")
    pack = _pack(
        physical_batch_size=spec.training.physical_batch_size,
        augment_multiplicity=spec.training.augment.multiplicity,
        augment_ops=spec.training.augment.ops,
    )
    assert (pack.physical_batch_size, pack.augment_multiplicity) == (16, 16)
    assert pack.augment_ops == ["crop", "flip"]
    check_augment(spec.training.augment, input_shape=(3, 32, 32), ascent=False)
