"""Issue 40: utility that costs no epsilon (an average of the weights, momentum, a learning-rate
schedule) and default grids that sweep well."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml

from dpsweep.errors import ConfigError
from dpsweep.spec import DEFAULT_GRIDS, LARGE_MODEL_LR_SCALE, load_spec
from tests.workers.generic.conftest import mixer_model  # noqa: F401 (a fixture)
from workers.datasets.records import DatasetSpec
from workers.models import ModelSpec
from workers.optim import PackedOptimizer, WeightAverage, lr_factor
from workers.strategies import get_descriptor
from workers.training import prepare
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialSpec


def _spec(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "t",
        "dataset": {"name": "digits"},
        "model": {"name": "mlp"},
        "privacy": {"budgets": [1.0], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.5]}}],
    }
    spec.update(over)
    return spec


# ---------------------------------------------------------------------------------------------
# The spec: validated once, bad values refused naming the field.


@pytest.mark.parametrize(
    ("training", "field"),
    [
        ({"momentum": 1.0}, "training.momentum"),
        ({"momentum": -0.1}, "training.momentum"),
        ({"momentum": "nan"}, "training.momentum"),
        ({"lr_schedule": "step"}, "training.lr_schedule"),
        ({"warmup_steps": -1}, "training.warmup_steps"),
        ({"warmup_fraction": 1.0}, "training.warmup_fraction"),
        ({"warmup_steps": 5, "warmup_fraction": 0.1}, "training"),
        ({"ema": {"decay": 1.0}}, "training.ema.decay"),
        ({"ema": {"decay": 0}}, "training.ema.decay"),
        ({"ema": {"decay": 0.9, "extra": 1}}, "training.ema.extra"),
        ({"average": "swa"}, "training.average"),
        ({"average": "none", "ema": {"decay": 0.9}}, "training"),
    ],
)
def test_bad_training_values_name_the_field(training: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_spec(_spec(training=training))
    assert err.value.field == field


def test_training_options_parse_and_default_to_the_old_behaviour() -> None:
    t = load_spec(_spec()).training
    assert (t.momentum, t.lr_schedule, t.warmup_steps, t.ema) == (0.0, "constant", 0, None)
    t = load_spec(_spec(training={"average": "ema"})).training
    assert t.ema is not None and (t.ema.decay, t.ema.warmup) == (0.99, True)
    t = load_spec(
        _spec(training={"momentum": 0.9, "lr_schedule": "cosine", "warmup_fraction": 0.1})
    ).training
    assert t.warmup_for(200) == 20 and t.momentum == 0.9


def test_ema_with_dp_evaluation_is_refused_naming_training_ema() -> None:
    # Each extra measurement would be a noisy release the plan does not charge.
    with pytest.raises(ConfigError) as err:
        load_spec(_spec(training={"ema": {"decay": 0.9}}, eval={"mode": "dp"}))
    assert err.value.field == "training.ema"
    assert "eval mode dp" in str(err.value)


def test_the_worker_refuses_ema_with_dp_evaluation_too() -> None:
    from workers.datasets.loading import load_dataset

    data = load_dataset(DatasetSpec("digits"))
    data.evaluation = "dp"  # type: ignore[misc]
    spec = PackSpec(
        dataset=DatasetSpec("digits"),
        model=ModelSpec("logreg"),
        strategy="fixed",
        trials=[TrialSpec(lr=0.5, noise_multiplier=1.0)],
        steps=2,
        ema_decay=0.9,
        eval_noise_multiplier=5.0,
    )
    with pytest.raises(ConfigError) as err:
        train_pack(spec, dataset=data)
    assert err.value.field == "training.ema"


# ---------------------------------------------------------------------------------------------
# Default grids.


def test_an_arm_with_a_strategy_only_gets_its_default_grid() -> None:
    spec = load_spec(_spec(arms=[{"strategy": "online"}]))
    assert spec.arms[0].grid == {"lr": [0.1, 0.5, 2.0]}
    assert spec.trials_per_grid(spec.arms[0]) == 3
    # The descriptor proposes the same grid; params it sets are not proposed.
    assert get_descriptor("online").propose_grid("mlp", {}) == {"lr": [0.1, 0.5, 2.0]}
    fixed = load_spec(_spec(arms=[{"strategy": "fixed", "params": {"clip": 1.0}}]))
    assert fixed.arms[0].grid == {"lr": [0.1, 0.5, 2.0]}
    # A large model gets smaller steps.
    big = load_spec(_spec(model={"name": "wrn16_4"}, arms=[{"strategy": "online"}]))
    assert big.arms[0].grid["lr"] == [
        float(f"{v * LARGE_MODEL_LR_SCALE:.6g}") for v in DEFAULT_GRIDS["online"]["lr"]
    ]


def test_dpsweep_plan_says_which_grid_is_the_default(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from api.cli import main

    path = tmp_path / "spec.yaml"
    spec = _spec(
        training={"steps": 8, "eval_every": 4},
        arms=[{"strategy": "online"}, {"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0]}}],
    )
    path.write_text(yaml.safe_dump(spec))
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "arm online: online's default grid for model mlp" in out
    assert "(what an arm without a grid gets): lr=[0.1, 0.5, 2]" in out
    assert "arm fixed:" not in out  # its own grid


def test_a_spec_that_gives_a_grid_or_an_lr_is_untouched() -> None:
    given = load_spec(_spec(arms=[{"strategy": "fixed", "grid": {"clip": [1.0, 2.0]}}]))
    assert given.arms[0].grid == {"clip": [1.0, 2.0]}  # no lr: refused later, as before
    one = load_spec(_spec(arms=[{"strategy": "fixed", "params": {"lr": 0.5}}]))
    assert one.arms[0].grid == {} and one.trials_per_grid(one.arms[0]) == 1
    # The stored (dumped) spec holds the chosen grid and re-reads to the same spec.
    spec = load_spec(_spec(arms=[{"strategy": "quantile"}]))
    assert load_spec(spec.model_dump(mode="json")) == spec


def test_every_builtin_default_grid_is_valid_for_its_strategy() -> None:
    from sweeper.sweeps.checks import check_spec

    for name in DEFAULT_GRIDS:
        if name == "nonprivate":
            continue
        model = "lip_mlp" if name == "lipschitz" else "mlp"
        spec = load_spec(_spec(model={"name": model}, arms=[{"strategy": name}]))
        check_spec(spec)
        assert get_descriptor(name).default_grid == DEFAULT_GRIDS[name]


def test_a_sweep_of_strategy_online_only_plans_and_runs(tmp_path: Any) -> None:
    from sweeper.driver.packs import pack_spec
    from sweeper.sweeps.planning import plan_sweep

    spec = load_spec(
        _spec(
            model={"name": "logreg"},
            training={"steps": 8, "eval_every": 4, "average": "ema", "momentum": 0.5},
            arms=[{"strategy": "online"}],
        )
    )
    plan = plan_sweep(spec)
    (grid,) = plan.grids
    assert grid.trials == 3
    trials = [
        SimpleNamespace(
            arm="online",
            strategy="online",
            seed=0,
            params={"lr": lr},
            noise_multiplier=grid.noise_multiplier,
            target_delta=None,
        )
        for lr in spec.arms[0].grid["lr"]  # type: ignore[union-attr]
    ]
    ps = pack_spec(spec, trials, dataset=DatasetSpec("digits"), accountant="rdp")
    assert (ps.ema_decay, ps.ema_warmup, ps.momentum) == (0.99, True, 0.5)
    results = train_pack(ps)
    assert [r.lr for r in results] == [0.1, 0.5, 2.0]
    assert all(r.weights_kept in ("raw", "ema") for r in results)


# ---------------------------------------------------------------------------------------------
# Momentum and schedules: post-processing that matches torch.optim.


@pytest.mark.parametrize("schedule", ["constant", "cosine", "linear"])
def test_momentum_and_schedule_match_torch_sgd(schedule: str) -> None:
    torch.manual_seed(0)
    steps, lrs, m = 12, [0.3, 0.05], 0.9
    params = torch.randn(2, 5, dtype=torch.float64)
    grads = [torch.randn(2, 5, dtype=torch.float64) for _ in range(steps)]
    packed = params.clone()
    opt = PackedOptimizer(
        "sgd",
        torch.tensor(lrs, dtype=torch.float64),
        momentum=m,
        schedule=schedule,
        total_steps=steps,
    )
    for g in grads:
        opt.step(packed, g)
    for i, lr in enumerate(lrs):
        w = params[i].clone().requires_grad_(True)
        sgd = torch.optim.SGD([w], lr=lr, momentum=m)
        sched: Any = {
            "constant": lambda o: torch.optim.lr_scheduler.ConstantLR(o, factor=1.0),
            "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=steps),
            "linear": lambda o: torch.optim.lr_scheduler.LinearLR(
                o, start_factor=1.0, end_factor=0.0, total_iters=steps
            ),
        }[schedule](sgd)
        for g in grads:
            w.grad = g[i].clone()
            sgd.step()
            sched.step()
        torch.testing.assert_close(packed[i], w.detach())


def test_warmup_then_cosine_matches_a_lambda_schedule() -> None:
    steps, warm = 10, 3

    def f(i: int) -> float:
        if i < warm:
            return (i + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (i - warm) / (steps - warm)))

    torch.manual_seed(1)
    params = torch.randn(1, 4, dtype=torch.float64)
    grads = [torch.randn(1, 4, dtype=torch.float64) for _ in range(steps)]
    packed = params.clone()
    opt = PackedOptimizer(
        "sgd",
        torch.tensor([0.2], dtype=torch.float64),
        momentum=0.5,
        schedule="cosine",
        total_steps=steps,
        warmup=warm,
    )
    for g in grads:
        opt.step(packed, g)
    w = params[0].clone().requires_grad_(True)
    sgd = torch.optim.SGD([w], lr=0.2, momentum=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(sgd, f)
    for g in grads:
        w.grad = g[0].clone()
        sgd.step()
        sched.step()
    torch.testing.assert_close(packed[0], w.detach())
    assert [lr_factor("constant", i, total_steps=steps) for i in range(3)] == [1.0] * 3


def test_bad_optimizer_settings_name_the_field() -> None:
    lr = torch.tensor([0.1])
    with pytest.raises(ConfigError) as err:
        PackedOptimizer("sgd", lr, schedule="step", total_steps=5)
    assert err.value.field == "training.lr_schedule"
    with pytest.raises(ConfigError) as err:
        WeightAverage(torch.zeros(1, 2), 1.0)
    assert err.value.field == "training.ema.decay"


# ---------------------------------------------------------------------------------------------
# The average of the weights: exact, measured beside the raw weights, the better one selected.


class _Recorder:
    """Spies on the engine's steps and the average (the weights after every step)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.initial: torch.Tensor | None = None
        self.after: list[torch.Tensor] = []
        self.ema: list[torch.Tensor] = []
        rec = self

        class Spy(WeightAverage):
            def __init__(self, params: torch.Tensor, decay: float, *, warmup: bool) -> None:
                super().__init__(params, decay, warmup=warmup)
                rec.initial = params.detach().clone()

            def update(self, params: torch.Tensor) -> None:
                super().update(params)
                rec.after.append(params.detach().clone())
                rec.ema.append(self.flat.clone())

        monkeypatch.setattr(prepare, "WeightAverage", Spy)


def _pack(model: str, **kw: Any) -> PackSpec:
    base: dict[str, Any] = dict(
        dataset=DatasetSpec("digits"),
        model=ModelSpec(model),
        strategy="fixed",
        trials=[
            TrialSpec(lr=0.5, seed=0, noise_multiplier=1.0, params={"clip": 1.0}),
            TrialSpec(lr=3.0, seed=1, noise_multiplier=3.0, params={"clip": 1.0}),
        ],
        batch_size=64,
        steps=30,
        eval_every=5,
        ema_decay=0.8,
        randomness="reproducible",
    )
    base.update(kw)
    return PackSpec(**base)


def _check_average_and_selection(
    rec: _Recorder, results: list[Any], decay: float, *, warmup: bool = False
) -> None:
    assert rec.initial is not None
    hand = rec.initial.clone()
    for t, w in enumerate(rec.after, start=1):  # a hand-computed EMA of the trained weights
        d = min(decay, (1 + t) / (10 + t)) if warmup else decay
        hand = d * hand + (1 - d) * w
    torch.testing.assert_close(rec.ema[-1], hand, rtol=1e-5, atol=1e-6)
    for i, r in enumerate(results):
        evals = [h for h in r.history if not h.get("diverged")]
        # Every evaluation point measured both, on the same split, with the same metrics.
        assert all("ema_accuracy" in h and "accuracy" in h for h in evals)
        candidates = [(h["accuracy"], h["step"], "raw") for h in evals] + [
            (h["ema_accuracy"], h["step"], "ema") for h in evals
        ]
        best = max(c[0] for c in candidates)
        assert r.metrics["accuracy"] == best
        # The first to reach the best wins; at one step the raw weights are measured first.
        first = min((c for c in candidates if c[0] == best), key=lambda c: (c[1], c[2] != "raw"))
        assert (r.best_step, r.weights_kept) == first[1:]
        assert r.metrics["weights_kept"] == r.weights_kept == r.model_info["weights_kept"]
        kept = rec.ema if r.weights_kept == "ema" else rec.after
        assert r.checkpoint is not None
        torch.testing.assert_close(r.checkpoint, kept[r.best_step - 1][i])


def test_ema_is_exact_and_the_better_of_raw_and_ema_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec = _Recorder(monkeypatch)
    results = train_pack(_pack("mlp"))
    assert {r.engine_path for r in results} == {"packed"}
    _check_average_and_selection(rec, results, 0.8)


def test_ema_warmup_is_the_num_updates_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _Recorder(monkeypatch)
    results = train_pack(_pack("mlp", ema_decay=0.95, ema_warmup=True))
    _check_average_and_selection(rec, results, 0.95, warmup=True)
    assert all(r.model_info["ema_warmup"] is True for r in results)


def test_ema_on_the_generic_path(monkeypatch: pytest.MonkeyPatch, mixer_model: str) -> None:  # noqa: F811
    rec = _Recorder(monkeypatch)
    results = train_pack(_pack(mixer_model, steps=12, eval_every=4, batch_size=32))
    assert {r.engine_path for r in results} == {"generic"}
    _check_average_and_selection(rec, results, 0.8)


def test_without_an_average_nothing_changes() -> None:
    a = train_pack(_pack("logreg", ema_decay=None, steps=10))
    assert all(r.weights_kept is None and "weights_kept" not in r.metrics for r in a)
    assert all(not any(k.startswith("ema_") for k in r.history[-1]) for r in a)
