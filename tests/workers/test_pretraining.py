"""Public pre-training (``model.pretrain_on``): trained once on public records at ε 0, cached by
the digest of its inputs, the start of every private trial, never reading a private record; and
refused before anything is reserved when the dataset is not public or does not fit the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from api.cli.plan_view import model_start_line
from dpsweep.errors import ConfigError
from dpsweep.spec import TrainingConfig, load_spec
from dpsweep.spec_model import ModelConfig, PretrainConfig
from sweeper.artifacts.card_finetuning import finetuning_markdown, finetuning_section
from sweeper.sweeps.planning import plan_sweep
from workers.datasets.builtin import mnist1d_parts
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.models.descriptors import ModelSpec
from workers.models.registry import build_model
from workers.pretraining import (
    CACHE_ENV,
    check_fits,
    load_pretrained,
    pretrain_ref,
    pretrained,
    pretrained_digest,
    public_spec,
)
from workers.training.loop import train_pack
from workers.training.specs import TrialSpec, training_pack

pytest.importorskip("mnist1d")

#: A quick recipe (10 epochs of the 1,000 public signals: 150 steps, under a second).
RECIPE = PretrainConfig(epochs=10, lr=0.05, batch_size=64)
MLP = ModelConfig(name="mlp", pretrain_on="mnist1d-public", pretrain=RECIPE)
PUBLIC_EVAL = DatasetSpec("mnist1d", evaluation="public", eval_dataset=DatasetSpec("mnist1d-test"))


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh pre-training cache per test."""
    path = tmp_path / "pretrained"
    monkeypatch.setenv(CACHE_ENV, str(path))
    return path


def _accuracy(state: dict[str, torch.Tensor]) -> float:
    data = load_dataset(PUBLIC_EVAL)
    net = build_model(ModelSpec("mlp"), input_shape=(40,), num_classes=10, seed=0)
    net.load_state_dict(state)
    with torch.no_grad():
        pred = net(torch.from_numpy(data.x_test)).argmax(1)
    return float((pred == torch.from_numpy(data.y_test)).float().mean())


def test_pretrained_once_then_read_back_from_the_cache(cache: Path) -> None:
    ref = pretrain_ref(MLP, PUBLIC_EVAL)
    assert ref is not None and ref.dataset.name == "mnist1d-public"
    first = pretrained(ModelSpec("mlp"), ref)
    files = list(cache.glob("*.safetensors"))
    assert files == [first.path] and first.path.stem == first.key
    stamp = first.path.stat().st_mtime_ns
    again = pretrained(ModelSpec("mlp"), ref)  # read, not trained again: the file is untouched
    assert again.digest == first.digest and again.path.stat().st_mtime_ns == stamp
    assert all(torch.equal(first.state[k], again.state[k]) for k in first.state)
    assert pretrained_digest(MLP, PUBLIC_EVAL) == first.digest
    assert first.digest.startswith("sha256:") and len(first.digest) == 71
    # Another recipe is other weights under another key.
    other = pretrain_ref(
        MLP.model_copy(update={"pretrain": RECIPE.model_copy(update={"seed": 1})}), PUBLIC_EVAL
    )
    assert other is not None and pretrained(ModelSpec("mlp"), other).key != first.key


def test_deterministic_given_the_public_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = pretrain_ref(MLP, PUBLIC_EVAL)
    assert ref is not None
    first = pretrained(ModelSpec("mlp"), ref)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "elsewhere"))  # made again from nothing
    again = pretrained(ModelSpec("mlp"), ref)
    assert again.path != first.path and again.digest == first.digest


def test_trials_start_from_the_pretrained_weights() -> None:
    ref = pretrain_ref(MLP, PUBLIC_EVAL)
    assert ref is not None
    start = _accuracy(pretrained(ModelSpec("mlp"), ref).state)
    assert start > 0.25  # far above chance (0.1): the public records taught it something
    pack = training_pack(
        model=MLP,
        training=TrainingConfig(steps=4, batch_size=64, eval_every=2),
        strategy="fixed",
        # A tiny lr: the weights hardly move, so the first evaluation is the start's.
        trials=[
            TrialSpec(lr=1e-9, seed=s, noise_multiplier=1.0, params={"clip": 1.0}) for s in (0, 1)
        ],
        dataset=PUBLIC_EVAL,
        accountant="pld",
        reproducible=True,
        planned=None,
    )
    assert pack.pretrain == ref
    digest = pretrained(ModelSpec("mlp"), ref).digest
    for result in train_pack(pack):
        # Each trial's seed no longer initialises the weights: both start where pre-training left.
        assert result.history[0]["accuracy"] == pytest.approx(start, abs=0.002)
        # The model's info (what its card is made from) names the public set and the weights.
        pre = result.model_info["pretrained"]
        assert pre["dataset"] == "mnist1d-public" and pre["digest"] == digest
        lines = finetuning_markdown(finetuning_section(
            checkpoint=None, trainable="all", lora_r=None, trained=None, total=None, pretrained=pre
        ))  # fmt: skip
        assert any("epsilon 0" in line and digest in line for line in lines)


def test_the_plan_says_the_weights_are_pretrained_at_no_cost(cache: Path) -> None:
    plan = plan_sweep(load_spec(_spec(pretrain_on="mnist1d-public")))
    assert {g.pretrained_on for g in plan.grids} == {"mnist1d-public"}
    assert "pre-trained at epsilon 0 on mnist1d-public" in model_start_line(plan.grids)
    plain = plan_sweep(load_spec(_spec()))
    assert {g.pretrained_on for g in plain.grids} == {None}
    assert model_start_line(plain.grids).startswith("weights start random")


def _private_npz(path: Path, drop: int | None) -> DatasetSpec:
    x, y, _, _ = mnist1d_parts()
    keep = np.arange(600) if drop is None else np.delete(np.arange(600), drop)
    np.savez(path, x=x[keep], y=y[keep])
    return DatasetSpec(
        "npz", path=str(path), input_bounds=(-4.0, 4.0), classes=tuple(str(c) for c in range(10))
    )


def test_pretraining_does_not_depend_on_the_private_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neighbouring private datasets (one record apart), each with an empty cache: the same
    pre-trained weights, under the same key."""
    starts: list[list[torch.Tensor]] = []
    keys = []
    for i, drop in enumerate((None, 17)):
        monkeypatch.setenv(CACHE_ENV, str(tmp_path / f"cache{i}"))
        spec = _private_npz(tmp_path / f"private{i}.npz", drop)
        data = load_dataset(spec)
        ref = pretrain_ref(MLP, spec)
        assert ref is not None
        net = build_model(ModelSpec("mlp"), input_shape=(40,), num_classes=10, seed=i)
        load_pretrained([net], ref, ModelSpec("mlp"), data)
        starts.append([p.detach().clone() for p in net.parameters()])
        keys.append(pretrained(ModelSpec("mlp"), ref).key)
    assert keys[0] == keys[1]
    assert all(torch.equal(a, b) for a, b in zip(*starts, strict=True))


def test_a_dataset_not_declared_public_is_refused_by_the_worker() -> None:
    for name in ("mnist1d", "digits", "no-such-set"):
        with pytest.raises(ConfigError) as err:
            public_spec(name, PUBLIC_EVAL)
        assert err.value.field == "model.pretrain_on" and "public" in str(err.value)


def test_records_of_another_shape_are_refused() -> None:
    digits = load_dataset(DatasetSpec("digits"))
    with pytest.raises(ConfigError) as err:
        check_fits(load_dataset(DatasetSpec("mnist1d-public")), digits)
    assert err.value.field == "model.pretrain_on" and "same shape" in str(err.value)


def _spec(**model: Any) -> dict[str, Any]:
    return {
        "name": "pretrain-refusal",
        "dataset": {"name": "mnist1d"},
        "eval": {"mode": "public", "dataset": "mnist1d-test"},
        "model": {"name": "mlp", **model},
        "training": {"epochs": 1, "batch_size": 64},
        "privacy": {"budgets": [1], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [1.0], "clip": [1.0]}}],
    }


@pytest.mark.parametrize(
    ("dataset", "pretrain_on", "words"),
    [
        ("mnist1d", "mnist1d", "training dataset"),
        ("mnist1d", "digits", "not a shared dataset declared public"),
        ("mnist1d", "ds_0123456789abcdef", "not a shared dataset declared public"),
        ("digits", "mnist1d-public", "same shape"),
    ],
)
def test_the_planner_refuses_before_anything_is_reserved(
    dataset: str, pretrain_on: str, words: str, cache: Path
) -> None:
    raw = _spec(pretrain_on=pretrain_on)
    raw["dataset"] = {"name": dataset}
    if dataset != "mnist1d":
        raw.pop("eval")
    with pytest.raises(ConfigError) as err:
        plan_sweep(load_spec(raw))
    assert err.value.field == "model.pretrain_on" and words in str(err.value)
    assert not cache.exists()  # nothing was pre-trained either
