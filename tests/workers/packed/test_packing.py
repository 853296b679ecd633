"""Packs: a trial packed equals the trial alone, for every strategy; padding, independence, NaN."""

from __future__ import annotations

import math

import pytest
import torch

from tests.workers.streams import noise_stream, sample_stream
from workers.datasets.records import DatasetSpec
from workers.engine import DPEngine
from workers.models import ModelSpec, build_model
from workers.optim import PackedOptimizer
from workers.packed import PackedModel
from workers.packing import estimate_trial_bytes, form_packs, max_pack_size, pack_key
from workers.settings import WorkerSettings
from workers.strategies import NoiseSource, get_strategy
from workers.training.loop import train_pack, train_trial
from workers.training.specs import PackSpec, TrialSpec

# (strategy, model, three trials' (lr, params)) -- per-trial hyperparameters differ on purpose.
CASES = [
    ("fixed", "mlp", [(0.5, {"clip": 0.5}), (1.0, {"clip": 2.0}), (0.2, {"clip": 1.0})]),
    ("fixed", "cnn", [(0.5, {"clip": 0.5}), (1.0, {"clip": 2.0}), (0.2, {"clip": 1.0})]),
    ("automatic", "mlp", [(0.5, {"clip": 0.5}), (1.0, {"clip": 2.0, "stability": 0.1}), (0.2, {})]),
    (
        "global",
        "mlp",
        [(1.0, {"global_threshold": 5.0}), (2.0, {"global_threshold": 30.0}), (0.5, {})],
    ),
    (
        "quantile",
        "mlp",
        [(0.5, {"target_quantile": 0.3}), (1.0, {"target_quantile": 0.7}), (0.3, {})],
    ),
    (
        "online",
        "mlp",
        [(0.5, {"clip_init": 0.1}), (1.0, {"clip_init": 1.0, "lr_lr": 0.01}), (2.0, {})],
    ),
    ("bam", "mlp", [(0.5, {"bam_lambda": 0.1}), (1.0, {"bam_lambda": 0.3}), (0.2, {})]),
    ("bam", "cnn", [(0.5, {"bam_lambda": 0.1}), (1.0, {"bam_lambda": 0.3}), (0.2, {})]),
    ("lipschitz", "lip_mlp", [(0.02, {}), (0.05, {}), (0.01, {})]),
]


def spec_for(strategy: str, model: str, trials: list[TrialSpec]) -> PackSpec:
    # Convolution kernels for a pack of K round differently (~1e-8) from those for a pack of
    # one, and non-smooth layers (max-pool ties, ReLU at 0) can turn that into a discrete flip
    # after enough steps; 12 steps stay short of any flip for these seeds.
    return PackSpec(
        dataset=DatasetSpec("digits"),
        model=ModelSpec(model),
        strategy=strategy,
        trials=trials,
        batch_size=32,
        steps=12 if model == "cnn" else 24,
        eval_every=8,
        # Packed equals alone only when both draw the same batches and noise: the public-seed
        # mode. (With secret randomness every run draws fresh ones; see tests/test_randomness.)
        randomness="reproducible",
    )


@pytest.mark.parametrize("strategy,model,hps", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_trial_packed_equals_the_trial_alone(strategy: str, model: str, hps: list) -> None:
    trials = [
        TrialSpec(lr=lr, seed=10 + i, noise_multiplier=[0.8, 1.5, 3.0][i], params=p)
        for i, (lr, p) in enumerate(hps)
    ]
    packed = train_pack(spec_for(strategy, model, trials))
    for t, res in zip(trials, packed, strict=True):
        alone = train_trial(spec_for(strategy, model, [t]))
        assert res.epsilon == alone.epsilon and res.best_step == alone.best_step
        assert res.checkpoint is not None and alone.checkpoint is not None
        # Convolutions packed round ~1e-8 differently; where that crosses a boundary of the
        # noise's snapping grid (2**-12 noise standard deviations) a weight moves by one cell.
        atol = 2e-4 if model == "cnn" else 1e-5
        torch.testing.assert_close(res.checkpoint, alone.checkpoint, rtol=1e-4, atol=atol)
        for hp, ha in zip(res.history, alone.history, strict=True):
            assert hp["accuracy"] == pytest.approx(ha["accuracy"], abs=1e-9)
            assert hp["loss"] == pytest.approx(ha["loss"], rel=1e-4, abs=1e-6)
        for key, values in alone.trajectories.items():
            assert res.trajectories[key] == pytest.approx(values, rel=1e-3, abs=1e-5), key


def _engine(k: int, seeds: list[int], strategy: str = "fixed") -> DPEngine:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 6, generator=gen), torch.randint(3, (200,), generator=gen)
    mods = [
        build_model(ModelSpec("mlp", {"hidden": [8]}), input_shape=(6,), num_classes=3, seed=s)
        for s in seeds
    ]
    model = PackedModel(mods)
    strat = get_strategy(strategy)(
        [{"clip": 0.5}] * k, n_layers=model.n_param_layers, device=model.device
    )
    return DPEngine(
        model=model,
        strategy=strat,
        optimizer=PackedOptimizer("sgd", torch.full((k,), 0.1)),
        x=x,
        y=y,
        task="classification",
        sample_rate=0.1,
        noise_multiplier=torch.ones(k),
        sample_streams=[sample_stream(100 + s) for s in seeds],
        noise=NoiseSource([noise_stream(200 + s) for s in seeds], model.device),
    )


def test_padding_and_masking_change_nothing() -> None:
    engine = _engine(2, [1, 2])
    idx, mask = engine.sample()
    pad = torch.randint(200, (2, 7))  # extra padded slots pointing at arbitrary real examples
    idx_p = torch.cat([idx, pad], dim=1)
    mask_p = torch.cat([mask, torch.zeros(2, 7)], dim=1)
    plain = {k: v.clone() for k, v in engine._releases(idx, mask).items()}
    # Replay the same noise: fresh streams of the same (public) seeds.
    engine.noise = NoiseSource([noise_stream(200 + s) for s in (1, 2)], engine.device)
    padded = engine._releases(idx_p, mask_p)
    for k in plain:
        torch.testing.assert_close(padded[k], plain[k], rtol=1e-5, atol=1e-7)


def test_trials_draw_independent_batches_and_noise_at_rate_q() -> None:
    engine = _engine(2, [1, 2])
    sizes: list[list[float]] = [[], []]
    same_batches = 0
    for _ in range(400):
        idx, mask = engine.sample()
        picked = [set(idx[k][mask[k] > 0].tolist()) for k in range(2)]
        same_batches += picked[0] == picked[1]
        for k in range(2):
            sizes[k].append(len(picked[k]))
    assert same_batches < 5
    n, q = 200, 0.1
    for k in range(2):
        mean = sum(sizes[k]) / len(sizes[k])
        assert abs(mean - n * q) < 5 * math.sqrt(n * q * (1 - q) / 400)
    xi = engine.noise.standard_normal(1000)
    assert not torch.allclose(xi[0], xi[1])
    assert abs(float(torch.corrcoef(xi)[0, 1])) < 0.15


def test_a_diverging_trial_fails_alone() -> None:
    good = [
        TrialSpec(lr=0.5, seed=1, noise_multiplier=1.0, params={"clip": 1.0}),
        TrialSpec(lr=0.2, seed=2, noise_multiplier=2.0, params={"clip": 0.5}),
    ]
    bad = TrialSpec(lr=1e38, seed=3, noise_multiplier=1.0, params={"clip": 1e30})
    packed = train_pack(spec_for("fixed", "mlp", [good[0], bad, good[1]]))
    assert packed[1].diverged_at is not None
    for t, res in zip(good, (packed[0], packed[2]), strict=True):
        alone = train_trial(spec_for("fixed", "mlp", [t]))
        assert res.diverged_at is None
        torch.testing.assert_close(res.checkpoint, alone.checkpoint, rtol=1e-4, atol=1e-5)
        assert res.metrics["accuracy"] == pytest.approx(alone.metrics["accuracy"], abs=1e-9)


# ---------------------------------------------------------------------------------------------
# Forming packs.


def _single(**kw) -> PackSpec:  # type: ignore[no-untyped-def]
    base = dict(
        dataset=DatasetSpec("digits"),
        model=ModelSpec("mlp"),
        strategy="fixed",
        trials=[TrialSpec(lr=0.1, seed=0, noise_multiplier=1.0, params={"clip": 1.0})],
        batch_size=64,
        epochs=2,
    )
    trial = kw.pop("trial", None)
    base.update(kw)
    if trial is not None:
        base["trials"] = [trial]
    return PackSpec(**base)


def test_pack_key_groups_only_compatible_trials() -> None:
    a = _single(trial=TrialSpec(lr=0.1, seed=1, noise_multiplier=1.0, params={"clip": 0.1}))
    b = _single(trial=TrialSpec(lr=3.0, seed=2, noise_multiplier=2.0, params={"clip": 10.0}))
    assert pack_key(a) == pack_key(b)  # per-trial knobs differ: compatible
    for other in (
        _single(batch_size=32),
        _single(model=ModelSpec("cnn")),
        _single(epochs=3),
        _single(optimizer="adam"),
        _single(dataset=DatasetSpec("digits", split_seed=1)),
        _single(trial=TrialSpec(lr=0.1, noise_multiplier=1.0, params={"clip_style": "layerwise"})),
        _single(strategy="automatic"),
    ):
        assert pack_key(other) != pack_key(a)


def test_form_packs_respects_the_memory_budget_and_keeps_every_trial() -> None:
    trials = [TrialSpec(lr=0.1 * (i + 1), seed=i, noise_multiplier=1.0) for i in range(10)]
    specs = [_single(trial=t) for t in trials] + [_single(batch_size=32, trial=trials[0])]
    per_trial = estimate_trial_bytes(specs[0], input_shape=(1, 8, 8), num_classes=10)
    budget_mb = 3.5 * per_trial / 2**20  # room for three trials
    packs = form_packs(
        specs,
        input_shape=(1, 8, 8),
        num_classes=10,
        settings=WorkerSettings(pack_memory_mb=budget_mb),
    )
    sizes = sorted(len(p.trials) for p in packs)
    assert sizes == [1, 1, 3, 3, 3]  # 10 compatible trials in threes, the b=32 one apart
    assert sum(sizes) == 11
    assert all(len({pack_key(p)}) == 1 for p in packs)
    big = form_packs(
        specs[:10],
        input_shape=(1, 8, 8),
        num_classes=10,
        settings=WorkerSettings(pack_memory_mb=1e6, max_pack_size=4),
    )
    assert [len(p.trials) for p in big] == [4, 4, 2]
    assert [t.seed for p in big for t in p.trials] == list(range(10))


def test_memory_estimate_grows_with_batch_and_model() -> None:
    shape = (1, 8, 8)
    small = estimate_trial_bytes(_single(batch_size=16), input_shape=shape, num_classes=10)
    large = estimate_trial_bytes(_single(batch_size=1024), input_shape=shape, num_classes=10)
    cnn = estimate_trial_bytes(_single(model=ModelSpec("cnn")), input_shape=shape, num_classes=10)
    mlp = estimate_trial_bytes(_single(), input_shape=shape, num_classes=10)
    assert large > small and cnn > mlp
    assert (
        max_pack_size(
            _single(),
            input_shape=shape,
            num_classes=10,
            settings=WorkerSettings(pack_memory_mb=1e-6),
        )
        == 1
    )


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSWEEP_PACK_MEMORY_MB", "123")
    monkeypatch.setenv("DPSWEEP_MAX_PACK_SIZE", "7")
    s = WorkerSettings()
    assert s.pack_memory_mb == 123 and s.max_pack_size == 7
