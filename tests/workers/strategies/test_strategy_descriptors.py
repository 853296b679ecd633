"""Strategy descriptors: the torch-free half of every strategy, and values checked at submission.

A contract suite runs over every registered strategy (descriptor and torch class agree, defaults
validate, every bound is enforced with the field named, the noise split is the one the class
uses); then submission: a spec with an out-of-range value is refused naming the arm's field,
before anything is planned, stored or reserved, and without importing torch.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import func, select
from sqlalchemy.orm import Session

import workers.strategies.base as strategies_base
import workers.strategies.descriptors as descriptors
from dpsweep.errors import ConfigError
from dpsweep.spec import load_spec
from sweeper.privacy.grids import InfeasiblePlan
from sweeper.privacy.ledger.rows import LedgerEntry
from sweeper.privacy.noise_split import gradient_noise_multiplier
from sweeper.store import Sweep, Trial
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.checks import check_spec
from sweeper.sweeps.create import create_sweep
from tests.sweeper.sweeps.test_sweep import tiny_spec
from workers.models import ModelSpec, build_model
from workers.packed import PackedModel
from workers.strategies import (
    DESCRIPTORS,
    STRATEGIES,
    ClippingStrategy,
    HParam,
    NoiseSplitInfeasible,
    StrategyDescriptor,
    get_descriptor,
    get_strategy,
    load_builtin_strategies,
    register_strategy,
)

ROOT = Path(__file__).resolve().parents[3]

load_builtin_strategies()
NAMES = sorted(set(DESCRIPTORS) | set(STRATEGIES))
BUILTIN = {"automatic", "bam", "fixed", "global", "lipschitz", "nonprivate", "online", "quantile"}


def bounded() -> list[tuple[str, str, str]]:
    """(strategy, hyperparameter, side) for every bound of a numeric hyperparameter."""
    out = []
    for name in NAMES:
        for hp_name, hp in get_descriptor(name).hyperparameters.items():
            if hp.numeric and hp.low is not None:
                out.append((name, hp_name, "low"))
            if hp.numeric and hp.high is not None:
                out.append((name, hp_name, "high"))
    return out


def outside(hp: HParam, side: str) -> float:
    """The value just past a bound (the bound itself where it is exclusive)."""
    if side == "low":
        assert hp.low is not None
        return math.nextafter(hp.low, -math.inf) if hp.low_inclusive else hp.low
    assert hp.high is not None
    return math.nextafter(hp.high, math.inf) if hp.high_inclusive else hp.high


def inside(hp: HParam, side: str) -> float:
    """The value just within a bound (the bound itself where it is inclusive)."""
    if side == "low":
        assert hp.low is not None
        return hp.low if hp.low_inclusive else math.nextafter(hp.low, math.inf)
    assert hp.high is not None
    return hp.high if hp.high_inclusive else math.nextafter(hp.high, -math.inf)


# ---------------------------------------------------------------------------------------------
# The contract, for every registered strategy.


def test_every_builtin_is_registered_on_both_sides() -> None:
    assert set(DESCRIPTORS) >= BUILTIN and set(STRATEGIES) >= BUILTIN
    assert set(DESCRIPTORS) == set(STRATEGIES)


@pytest.mark.parametrize("name", NAMES)
def test_descriptor_and_class_agree(name: str) -> None:
    d, cls = get_descriptor(name), get_strategy(name)
    assert d.name == cls.name == name
    assert cls.describe() is d
    assert list(cls.hyperparameters) == list(d.hyperparameters)
    assert cls.private == d.private
    assert cls.description == d.description and d.description
    assert d.gradient_passes >= 1


@pytest.mark.parametrize("name", NAMES)
def test_every_default_validates(name: str) -> None:
    d = get_descriptor(name)
    filled = d.validate({})
    assert set(filled) == set(d.hyperparameters)
    for hp_name, hp in d.hyperparameters.items():
        if hp.default is None:
            assert hp.optional, f"{name}.{hp_name} has no default and is not optional"
            continue
        assert filled[hp_name] == hp.default
        if hp.numeric:
            assert hp.in_range(filled[hp_name]), f"{name}.{hp_name}: default out of range"
    assert get_strategy(name).validate({}) == filled  # the worker's check is the same


@pytest.mark.parametrize("name,hp_name,side", bounded())
def test_a_value_just_outside_a_bound_is_refused(name: str, hp_name: str, side: str) -> None:
    d = get_descriptor(name)
    hp = d.hyperparameters[hp_name]
    bad = outside(hp, side)
    with pytest.raises(ConfigError, match=hp_name) as exc:
        d.validate({hp_name: bad})
    assert exc.value.field == f"params.{hp_name}"
    assert hp.range_text() in str(exc.value)
    # The worker refuses it the same way, and a value just inside passes both.
    with pytest.raises(ConfigError) as worker:
        get_strategy(name).validate({hp_name: bad})
    assert worker.value.field == f"params.{hp_name}"
    good = inside(hp, side)
    assert d.validate({hp_name: good})[hp_name] == good
    assert get_strategy(name).validate({hp_name: good})[hp_name] == good


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [math.nan, math.inf, "abc", True, None, [1.0]])
def test_non_numbers_and_non_finite_values_are_refused(name: str, bad: Any) -> None:
    d = get_descriptor(name)
    for hp_name, hp in d.hyperparameters.items():
        if not hp.numeric or (bad is None and hp.optional):
            continue
        with pytest.raises(ConfigError) as exc:
            d.validate({hp_name: bad})
        assert exc.value.field == f"params.{hp_name}"


@pytest.mark.parametrize("name", NAMES)
def test_unknown_hyperparameters_and_choices_are_refused(name: str) -> None:
    d = get_descriptor(name)
    with pytest.raises(ConfigError, match="unknown hyperparameter") as exc:
        d.validate({"nope": 1.0})
    assert exc.value.field == "params.nope"
    for hp_name, hp in d.hyperparameters.items():
        if hp.kind == "choice":
            with pytest.raises(ConfigError, match="must be one of") as exc:
                d.validate({hp_name: "nope"})
            assert exc.value.field == f"params.{hp_name}"


def test_the_chosen_ranges() -> None:
    def rng(name: str, hp: str) -> str:
        return get_descriptor(name).hyperparameters[hp].range_text()

    assert rng("fixed", "clip") == "> 0"
    assert rng("quantile", "target_quantile") == "in (0, 1)"
    assert rng("quantile", "clip_lr") == ">= 0"
    assert rng("quantile", "count_noise") == "> 0"
    assert rng("online", "clip_lr") == rng("online", "lr_lr") == ">= 0"
    assert rng("online", "direction_noise_ratio") == "> 1"
    assert get_descriptor("quantile").hyperparameters["count_noise"].optional
    assert get_descriptor("bam").gradient_passes == 2
    assert get_descriptor("fixed").gradient_passes == 1
    assert not get_descriptor("nonprivate").private


def test_hparam_positive_stays_a_shorthand() -> None:
    assert HParam(default=1.0).positive and HParam(default=1.0).range_text() == "> 0"
    assert not HParam(positive=False).positive and HParam(positive=False).low is None
    assert not HParam(low=0.0).positive and HParam(low=0.0).range_text() == ">= 0"
    assert HParam(low=1.0, low_inclusive=False).positive
    assert HParam(kind="int", low=1, high=4).range_text() == "in [1, 4]"
    d = StrategyDescriptor("t", hyperparameters={"n": HParam(default=2, kind="int", high=4)})
    assert d.validate({"n": 3.0}) == {"n": 3}
    for bad in (2.5, 5, 0):
        with pytest.raises(ConfigError, match=r"n must be|whole number"):
            d.validate({"n": bad})


# The split: per-strategy variants of the parameters (the defaults are always tried).
SPLIT_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "quantile": [{"count_noise": 3.0}, {"count_noise": 40.0, "target_quantile": 0.2}],
    "online": [{"direction_noise_ratio": 2.0}, {"direction_noise_ratio": 30.0, "clip_lr": 0.0}],
}


def _bound(name: str, params: list[dict[str, Any]], b: float) -> ClippingStrategy:
    """The strategy class on a small Lipschitz pack (every strategy's bind accepts it)."""
    modules = [
        build_model(ModelSpec("lip_mlp"), input_shape=(4,), num_classes=3, seed=i)
        for i in range(len(params))
    ]
    model = PackedModel(modules)
    strat = get_strategy(name)(params, n_layers=model.n_param_layers, device=model.device)
    strat.bind(model, expected_batch_size=b, task="classification")
    return strat


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("sigma", [0.3, 0.8, 2.5, 7.0])
@pytest.mark.parametrize("b", [16.0, 256.0])
def test_the_noise_split_is_the_one_the_class_uses(name: str, sigma: float, b: float) -> None:
    d = get_descriptor(name)
    cases = [{}, *SPLIT_VARIANTS.get(name, [])]
    strat = _bound(name, cases, b)
    sigmas = torch.tensor([sigma] * len(cases))
    try:
        want = [
            d.gradient_multiplier(p, noise_multiplier=float(sigmas[i]), expected_batch_size=b)
            for i, p in enumerate(cases)
        ]
    except NoiseSplitInfeasible:
        with pytest.raises(ConfigError, match="count_noise"):
            strat.gradient_noise_multiplier(sigmas)
        return
    got = strat.gradient_noise_multiplier(sigmas)
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-6, atol=0)
    if d.split is None:
        assert want == [float(sigmas[0])] * len(cases)
    else:  # the joint release costs exactly one Gaussian of multiplier sigma
        for i, p in enumerate(cases):
            s = d.noise_split(p, noise_multiplier=float(sigmas[i]), expected_batch_size=b)
            assert s.second is not None and s.gradient > float(sigmas[i])
            assert (s.gradient**-2 + s.second**-2) ** -0.5 == pytest.approx(float(sigmas[i]))
    # The planner uses the same split.
    for i, p in enumerate(cases):
        assert gradient_noise_multiplier(
            name, p, noise_multiplier=float(sigmas[i]), expected_batch_size=b
        ) == pytest.approx(want[i], rel=1e-12)


def test_an_infeasible_split_is_a_config_error_in_the_worker_and_infeasible_when_planning() -> None:
    d = get_descriptor("quantile")
    with pytest.raises(NoiseSplitInfeasible) as exc:
        d.noise_split({"count_noise": 3.0}, noise_multiplier=7.0, expected_batch_size=64)
    assert exc.value.field == "params.count_noise"
    with pytest.raises(InfeasiblePlan, match="count_noise"):
        gradient_noise_multiplier(
            "quantile", {"count_noise": 3.0}, noise_multiplier=7.0, expected_batch_size=64
        )


# ---------------------------------------------------------------------------------------------
# Registration: a class must agree with its descriptor; packing reads the descriptor.


@pytest.fixture
def scratch_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(descriptors, "DESCRIPTORS", descriptors.DESCRIPTORS.copy())
    monkeypatch.setattr(strategies_base, "DESCRIPTORS", descriptors.DESCRIPTORS)
    monkeypatch.setattr(strategies_base, "STRATEGIES", strategies_base.STRATEGIES.copy())


def test_registration_checks_the_class_against_its_descriptor(scratch_registries: None) -> None:
    from workers.strategies.fixed import FixedClipping

    class Plain(FixedClipping):  # declares no descriptor: one is derived and registered
        name = "plain-test"

    register_strategy(Plain)
    assert descriptors.get_descriptor("plain-test").hyperparameters.keys() == {
        "clip",
        "clip_style",
    }
    assert descriptors.get_descriptor("plain-test") is Plain.describe()

    descriptors.register_descriptor(StrategyDescriptor("mismatch-test", hyperparameters={}))

    class Mismatch(FixedClipping):
        name = "mismatch-test"

    with pytest.raises(ValueError, match="disagrees"):
        register_strategy(Mismatch)
    with pytest.raises(TypeError, match="disagree"):

        class Wrong(FixedClipping):
            descriptor = descriptors.FIXED
            hyperparameters = {"other": HParam()}  # noqa: RUF012


def test_packing_reads_the_descriptor(scratch_registries: None) -> None:
    from workers.datasets.records import DatasetSpec
    from workers.packing import max_pack_size
    from workers.training.specs import PackSpec, TrialSpec

    descriptors.DESCRIPTORS["fixed"] = dataclasses.replace(descriptors.FIXED, packable=False)
    spec = PackSpec(
        dataset=DatasetSpec("digits"),
        model=ModelSpec("logreg"),
        strategy="fixed",
        trials=[TrialSpec(lr=0.1, noise_multiplier=1.0) for _ in range(4)],
        batch_size=32,
        steps=2,
    )
    assert max_pack_size(spec, input_shape=(64,), num_classes=10) == 1


# ---------------------------------------------------------------------------------------------
# Submission: values are checked before anything is planned, stored or reserved.


def _arm_error(arm: dict[str, Any], **over: Any) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        check_spec(load_spec(tiny_spec(arms=[arm], **over)))
    return exc.value


@pytest.mark.parametrize(
    "arm,field",
    [
        ({"strategy": "fixed", "grid": {"lr": [0.1], "clip": [0, 1]}}, "arms.fixed.grid.clip"),
        (
            {"strategy": "fixed", "grid": {"lr": [0.1]}, "params": {"clip": -1}},
            "arms.fixed.params.clip",
        ),
        ({"strategy": "fixed", "grid": {"lr": [0.0, 0.1]}}, "arms.fixed.grid.lr"),
        ({"strategy": "fixed", "grid": {"lr": [float("nan")]}}, "arms.fixed.grid.lr"),
        ({"strategy": "fixed", "grid": {"lr": ["fast"]}}, "arms.fixed.grid.lr"),
        ({"strategy": "fixed", "params": {"lr": -0.1}}, "arms.fixed.params.lr"),
        (
            {"strategy": "fixed", "grid": {"lr": [0.1], "clip_style": ["flat", "perlayer"]}},
            "arms.fixed.grid.clip_style",
        ),
        (
            {"strategy": "quantile", "grid": {"lr": [0.1], "target_quantile": [0.5, 1.0]}},
            "arms.quantile.grid.target_quantile",
        ),
        (
            {
                "strategy": "quantile",
                "name": "q",
                "grid": {"lr": [0.1]},
                "params": {"count_noise": "x"},
            },
            "arms.q.params.count_noise",
        ),
        (
            {"strategy": "online", "grid": {"lr": [0.1]}, "params": {"direction_noise_ratio": 1}},
            "arms.online.params.direction_noise_ratio",
        ),
        (
            {"strategy": "online", "grid": {"lr": [0.1], "lr_lr": [-1e-3, 0.0]}},
            "arms.online.grid.lr_lr",
        ),
        # An interval axis: random and tpe search draw anywhere in it, k = 1 included.
        (
            {
                "strategy": "quantile",
                "grid": {"lr": [0.1], "target_quantile": {"linspace": [0.5, 1.0], "k": 1}},
            },
            "arms.quantile.grid.target_quantile",
        ),
        (
            {"strategy": "fixed", "grid": {"lr": {"linspace": [0.5, -0.5], "k": 1}}},
            "arms.fixed.grid.lr",
        ),
    ],
)
def test_check_spec_refuses_bad_values_naming_the_field(arm: dict[str, Any], field: str) -> None:
    assert _arm_error(arm).field == field


def test_check_spec_accepts_good_values() -> None:
    check_spec(load_spec(tiny_spec()))
    check_spec(load_spec(ROOT / "examples" / "digits-clipping.yaml"))
    ok = [
        {
            "strategy": "quantile",
            "grid": {"lr": ["1e-3"], "target_quantile": {"linspace": [0.1, 0.9], "k": 3}},
            "params": {"clip_lr": 0, "count_noise": 4},
        },
        {
            "strategy": "online",
            "grid": {"lr": {"logspace": [-3, 0], "k": 2}},
            "params": {"clip_lr": 0.0, "lr_lr": 0},
        },
        # A grid axis overrides the param of the same name: the param is never used.
        {
            "strategy": "fixed",
            "name": "f",
            "grid": {"lr": [0.1], "clip": [0.5]},
            "params": {"clip": 0.5},
        },
    ]
    check_spec(load_spec(tiny_spec(arms=ok)))


def test_checking_a_spec_imports_no_torch() -> None:
    bad = tiny_spec(arms=[{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [0, 1]}}])
    code = (
        "import sys\n"
        "from dpsweep.spec import load_spec\n"
        "from sweeper.sweeps.checks import check_spec\n"
        "from dpsweep.errors import ConfigError\n"
        f"check_spec(load_spec({str(ROOT / 'examples' / 'digits-clipping.yaml')!r}))\n"
        "try:\n"
        f"    check_spec(load_spec({bad!r}))\n"
        "except ConfigError as exc:\n"
        "    assert exc.field == 'arms.fixed.grid.clip', exc.field\n"
        "else:\n"
        "    raise AssertionError('not refused')\n"
        "from workers.strategies import get_descriptor\n"
        "get_descriptor('quantile').gradient_multiplier(\n"
        "    {}, noise_multiplier=2.0, expected_batch_size=64\n"
        ")\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def test_create_sweep_refuses_a_zero_clip_and_stores_and_reserves_nothing(engine: Any) -> None:
    spec = tiny_spec(arms=[{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [0, 1]}}])
    with pytest.raises(ConfigError, match="clip must be > 0") as exc:
        create_sweep(engine, spec)
    assert exc.value.field == "arms.fixed.grid.clip"
    with Session(engine) as s:
        assert s.scalar(select(func.count()).select_from(Sweep)) == 0
        assert s.scalar(select(func.count()).select_from(Trial)) == 0
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 0
