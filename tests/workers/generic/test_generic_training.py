"""The engine picks its path per model: packed where every layer converts, else generic."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpsweep.errors import ConfigError
from tests.workers.generic.nets import FeatureMixer
from workers.datasets.records import DatasetSpec
from workers.generic import GenericModel, build_pack_model, packable
from workers.models import ModelSpec
from workers.packed import PackedModel
from workers.training.loop import train_pack, train_trial
from workers.training.specs import PackSpec, TrialSpec

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


def spec(model: str, strategy: str, trials: list[TrialSpec], **kw) -> PackSpec:  # type: ignore[no-untyped-def]
    base = dict(
        dataset=DatasetSpec("digits"),
        model=ModelSpec(model),
        strategy=strategy,
        trials=trials,
        batch_size=32,
        steps=6,
        eval_every=3,
        randomness="reproducible",
    )
    base.update(kw)
    return PackSpec(**base)


def test_generic_trial_in_a_pack_equals_the_trial_alone(mixer_model: str) -> None:
    trials = [
        TrialSpec(lr=0.3, seed=0, noise_multiplier=1.0, params={"clip": 0.5}),
        TrialSpec(lr=1.0, seed=7, noise_multiplier=2.0, params={"clip": 2.0}),
        TrialSpec(lr=0.1, seed=3, noise_multiplier=0.8, params={"clip": 1.0}),
    ]
    # Packed equals alone when both draw from the public seed (reproducible mode).
    packed = train_pack(spec(mixer_model, "fixed", trials))
    for t, res in zip(trials, packed, strict=True):
        assert res.engine_path == "generic"
        assert res.summary()["engine_path"] == "generic"
        alone = train_trial(spec(mixer_model, "fixed", [t]))
        assert res.best_step == alone.best_step
        assert res.epsilon == alone.epsilon
        for hp, ha in zip(res.history, alone.history, strict=True):
            assert hp["accuracy"] == pytest.approx(ha["accuracy"], abs=1e-9)
            assert hp["loss"] == pytest.approx(ha["loss"], rel=1e-4)
        assert res.checkpoint is not None and alone.checkpoint is not None
        assert (res.checkpoint - alone.checkpoint).abs().max() < 1e-4


def test_a_model_the_fast_path_covers_takes_it() -> None:
    r = train_trial(
        spec("mlp", "fixed", [TrialSpec(lr=0.5, noise_multiplier=1.0, params={"clip": 1.0})])
    )
    assert r.engine_path == "packed"
    assert r.to_dict()["engine_path"] == "packed"


def test_dispatch_per_model() -> None:
    seq = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2))
    assert packable(seq)
    model, path = build_pack_model([seq])
    assert path == "packed" and isinstance(model, PackedModel)
    # A layer without a packed implementation, or a module that is not a Sequential: generic.
    for m in (nn.Sequential(nn.Linear(4, 5), nn.LayerNorm(5)), FeatureMixer(16, 3, tokens=4)):
        assert not packable(m)
        model, path = build_pack_model([m])
        assert path == "generic" and isinstance(model, GenericModel)
    # The generic path refuses what neither path can train privately.
    with pytest.raises(ConfigError, match="BatchNorm1d at '1'"):
        build_pack_model([nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5))])


def test_generic_flat_layout_matches_the_modules() -> None:
    torch.manual_seed(0)
    mods = [FeatureMixer(16, 3, tokens=4) for _ in range(2)]
    model = GenericModel(mods)
    for i, m in enumerate(mods):
        assert torch.equal(model.flat[i], nn.utils.parameters_to_vector(m.parameters()))
        x = torch.randn(5, 16)
        torch.testing.assert_close(model.to_module(i)(x), m(x))
        out, _ = model.forward(x.unsqueeze(0).expand(2, 5, 16))
        torch.testing.assert_close(out[i], m(x), atol=1e-6, rtol=1e-5)


def test_lipschitz_needs_the_packed_path(mixer_model: str) -> None:
    with pytest.raises(ConfigError, match="lipschitz"):
        train_trial(spec(mixer_model, "lipschitz", [TrialSpec(lr=0.1, noise_multiplier=1.0)]))
