"""Sweeps without Ray: charge schedules, run counts, creation, refusal and cancel (SQLite)."""

from __future__ import annotations

import math
import random
import statistics
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, IllegalState, PrivacyError
from dpsweep.plan import GridPlan
from dpsweep.spec import SearchDistribution, load_spec
from sweeper.datasets.identity import ledger_key_of
from sweeper.privacy.charges import EXACT, charge_schedule, exact_sum
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.errors import BudgetExhausted
from sweeper.privacy.ledger.rows import EntryKind
from sweeper.store import Sweep, Trial, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.lifecycle import cancel_sweep
from sweeper.sweeps.search import draw_run_count, random_points
from sweeper.sweeps.summary import summarize


def tiny_spec(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "tiny",
        "dataset": {"name": "digits"},
        "model": {"name": "logreg"},
        "training": {"steps": 20, "batch_size": 64, "eval_every": 10},
        "privacy": {"budgets": [2, 6], "delta": 1e-5},
        "arms": [
            {"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0]}},
            {"strategy": "automatic", "grid": {"lr": [0.5]}},
        ],
    }
    for k, v in over.items():
        spec[k] = v
    return spec


def _plan(**over: Any) -> GridPlan:
    base = dict(
        arm="a",
        strategy="fixed",
        epsilon_budget=4.0,
        delta=1e-5,
        trials=5,
        steps_per_trial=30,
        sample_rate=0.05,
        noise_multiplier=1.2,
        epsilon_per_trial=1.0,
        delta_per_trial=1e-5,
        epsilon_total=3.9,
        epsilon_verified=3.9,
        accounting="compose",
        accountant="pld",
        verified_by="x",
        release="all",
    )
    base.update(over)
    return GridPlan(**base)  # type: ignore[arg-type]


def digits_key(engine: Any) -> str:
    """The ledger key of the digits records (ledgers are keyed by content, not by name)."""
    return ledger_key_of(engine, "digits")


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def test_compose_schedule_charges_the_composed_cost_of_every_prefix() -> None:
    from workers.accounting import pld_epsilon

    five = pld_epsilon(noise_multiplier=1.2, sample_rate=0.05, steps=150, target_delta=1e-5)
    plan = _plan(epsilon_total=five)
    s = charge_schedule(plan)
    assert s.runs == 5 and not s.whole_grid
    # Marginal charges telescope exactly to the reservation.
    parts = [s.charge_for_run(j)[0] for j in range(1, 6)]
    assert exact_sum(parts) == s.reserved_epsilon
    assert all(p >= 0 for p in parts)
    # Every prefix is charged what j runs composed cost (the same PLD accountant), so a
    # cancelled sweep is never under-charged: here 1 run alone and 5 runs composed.
    one = pld_epsilon(noise_multiplier=1.2, sample_rate=0.05, steps=30, target_delta=1e-5)
    assert float(s.epsilon[0]) == pytest.approx(one, rel=1e-6)
    assert float(s.reserved_epsilon) == pytest.approx(five, rel=1e-6)
    assert float(s.epsilon[1]) > 2 * float(s.epsilon[0]) * 0.5  # sub-linear but growing
    # delta is the grid's from the first run; no more afterwards.
    assert s.charge_for_run(1)[1] == Decimal(1e-5) and s.charge_for_run(2)[1] == 0  # noqa: RUF032 (the float, exactly)
    with pytest.raises(PrivacyError, match="no budget is reserved"):
        s.charge_for_run(6)


def test_a_schedule_below_its_plan_is_refused() -> None:
    """A plan whose figure the runs' charges would not reach (a release the schedule leaves
    out) is refused: the ledger would be charged less than the plan says was spent."""
    with pytest.raises(PrivacyError, match="below the plan's"):
        charge_schedule(_plan(epsilon_total=3.9))


def test_schedule_above_the_budget_is_refused() -> None:
    with pytest.raises(PrivacyError, match="above the grid's budget"):
        charge_schedule(_plan(epsilon_budget=1.0, epsilon_total=0.9))


@settings(max_examples=30, deadline=None)
@given(
    per=st.floats(1e-6, 10, allow_nan=False),
    delta=st.floats(1e-12, 1e-3),
    runs=st.integers(1, 40),
)
def test_basic_schedule_is_exact(per: float, delta: float, runs: int) -> None:
    plan = _plan(
        accounting="basic",
        trials=runs,
        epsilon_per_trial=per,
        delta_per_trial=delta,
        epsilon_budget=per * runs * 2,
    )
    s = charge_schedule(plan)
    assert s.reserved_epsilon == EXACT.multiply(Decimal(per), runs)
    assert exact_sum([s.charge_for_run(j)[0] for j in range(1, runs + 1)]) == s.reserved_epsilon
    assert all(s.charge_for_run(j) == (Decimal(per), Decimal(delta)) for j in range(1, runs + 1))


def test_papernot_steinke_first_run_pays_for_the_search() -> None:
    s = charge_schedule(_plan(accounting="papernot-steinke", epsilon_total=3.5))
    assert s.whole_grid
    assert s.charge_for_run(1) == (Decimal(3.5), Decimal(1e-5))  # noqa: RUF032
    assert s.charge_for_run(50) == (0, 0)  # any number of runs: the count is random


@pytest.mark.parametrize(
    "name,eta",
    [
        ("logarithmic", None),
        ("geometric", None),
        ("poisson", None),
        ("truncated_negative_binomial", 0.5),
    ],
)
def test_run_counts_have_the_planned_mean(name: str, eta: float | None) -> None:
    d = SearchDistribution(name=name, eta=eta)  # type: ignore[arg-type]
    rng = random.Random(7)
    draws = [draw_run_count(d, mean=8.0, rng=rng) for _ in range(20_000)]
    assert statistics.fmean(draws) == pytest.approx(8.0, rel=0.05)
    assert min(draws) >= (0 if name == "poisson" else 1)


def test_random_points_follow_the_axes() -> None:
    spec = load_spec(
        tiny_spec(
            arms=[
                {
                    "strategy": "fixed",
                    "grid": {"lr": {"logspace": [-2, 0], "k": 3}, "clip": [0.5, 1.0]},
                }
            ]
        )
    )
    pts = random_points(spec.arms[0], 200, seed=3)
    assert pts == random_points(spec.arms[0], 200, seed=3)  # reproducible
    assert all(0.01 <= p["lr"] <= 1.0 and p["clip"] in (0.5, 1.0) for p in pts)
    logs = [math.log10(p["lr"]) for p in pts]
    assert statistics.fmean(logs) == pytest.approx(-1.0, abs=0.15)  # log-uniform


def test_create_reserves_exactly_the_schedules(engine: Any) -> None:
    sid = create_sweep(engine, tiny_spec())
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None and sweep.state.value == "pending"
        trials = list(s.scalars(select(Trial).where(Trial.sweep_id == sid)))
        plan = sweep.plan or []
    assert len(trials) == (2 + 1) * 2
    assert {t.state for t in trials} == {TrialState.pending}
    ledger = BudgetLedger(engine)
    (entry,) = ledger.entries(digits_key(engine), sid)
    assert entry.kind == EntryKind.RESERVE
    assert entry.epsilon == exact_sum([Decimal(g["charges"]["epsilon"][-1]) for g in plan])
    # Each grid's reservation is its composed total, within its budget.
    for g in plan:
        assert float(g["charges"]["epsilon"][-1]) == pytest.approx(g["epsilon_total"], rel=1e-6)
        assert float(g["charges"]["epsilon"][-1]) <= g["epsilon_budget"]


def test_refusals_store_nothing(engine: Any) -> None:
    with pytest.raises(ConfigError, match="charge_repeats"):
        create_sweep(
            engine,
            tiny_spec(seeds=2, privacy={"budgets": [2], "delta": 1e-5, "charge_repeats": False}),
        )
    with pytest.raises(ConfigError, match="no learning rate"):
        create_sweep(engine, tiny_spec(arms=[{"strategy": "fixed", "grid": {"clip": [1.0]}}]))
    with pytest.raises(ConfigError, match="unknown hyperparameter"):
        create_sweep(
            engine, tiny_spec(arms=[{"strategy": "fixed", "grid": {"lr": [1], "cilp": [1]}}])
        )
    BudgetLedger(engine).set_cap(digits_key(engine), epsilon_cap=5)
    with pytest.raises(BudgetExhausted):
        create_sweep(engine, tiny_spec())
    with Session(engine) as s:
        assert s.query(Sweep).count() == 0 and s.query(Trial).count() == 0
    assert BudgetLedger(engine).summary(digits_key(engine)).epsilon_reserved == 0


def test_cancel_before_running_releases_everything(engine: Any) -> None:
    sid = create_sweep(engine, tiny_spec())
    reserved = BudgetLedger(engine).sweep_balance(digits_key(engine), sweep_id=sid).epsilon_reserved
    r = cancel_sweep(engine, sid)
    assert r["cancelled_pending"] == 6 and r["stopped_running"] == 0
    bal = BudgetLedger(engine).sweep_balance(digits_key(engine), sweep_id=sid)
    assert bal.epsilon_released == reserved and bal.epsilon_outstanding == 0
    assert BudgetLedger(engine).summary(digits_key(engine)).epsilon_spent == 0
    s = summarize(engine, sid)
    assert s["state"] == "cancelled" and s["trials"]["cancelled"] == 6
    with pytest.raises(IllegalState, match="already cancelled"):
        cancel_sweep(engine, sid)


def test_papernot_steinke_sweeps_hide_their_count(engine: Any) -> None:
    spec = tiny_spec(
        privacy={
            "budgets": [4],
            "delta": 1e-5,
            "accounting": "papernot-steinke",
            "distribution": {"name": "logarithmic"},
        },
        search={"method": "random", "n": 3},
    )
    sid = create_sweep(engine, spec)
    s = summarize(engine, sid)
    assert all("trials" not in g for g in s["plan"])
    assert sum(s["trials"].values()) == 0  # counts withheld
    # One reservation per sweep: the sum of the grids' RepeatAndSelect totals.
    bal = BudgetLedger(engine).sweep_balance(digits_key(engine), sweep_id=sid)
    assert float(bal.epsilon_reserved) == pytest.approx(
        sum(g["epsilon_total"] for g in s["plan"]), rel=1e-12
    )


def test_plan_grid_retries_reserve_extra_runs(engine: Any) -> None:
    spec = tiny_spec(privacy={"budgets": [2], "delta": 1e-5, "retries": 1})
    sid = create_sweep(engine, spec)
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        for g in sweep.plan or []:
            assert g["retries"] == 1
            assert len(g["charges"]["epsilon"]) == g["planned_trials"] + 1
    with pytest.raises(ConfigError, match="retries do not apply"):
        load_spec(
            tiny_spec(
                privacy={
                    "budgets": [2],
                    "delta": 1e-5,
                    "retries": 1,
                    "accounting": "papernot-steinke",
                    "distribution": {"name": "geometric"},
                }
            )
        )


@pytest.mark.parametrize("name", ["demo.yaml", "004-protocol.yaml", "digits-clipping.yaml"])
def test_example_specs_are_valid_sweeps(name: str) -> None:
    from sweeper.sweeps.checks import _check_arms

    spec = load_spec(Path(__file__).resolve().parents[3] / "examples" / name)
    _check_arms(spec)  # strategies, learning rates and hyperparameter names
    if name == "004-protocol.yaml":
        assert [spec.trials_per_grid(a) for a in spec.arms][::3] == [125, 245, 405]
        assert spec.privacy.budgets == [3, 5, 7, 9] and spec.seeds == 5


def test_the_sweeper_layer_imports_no_torch_ray_or_matplotlib() -> None:
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys, sweeper, api.app\n"
        "for m in pkgutil.walk_packages(sweeper.__path__, 'sweeper.'):\n"
        "    importlib.import_module(m.name)\n"
        "print([m for m in ('torch', 'ray', 'matplotlib') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_layers_depend_one_way_api_sweeper_workers() -> None:
    import ast

    root = Path(__file__).resolve().parents[3]
    # dpsweep is the contract at the bottom (spec models, errors): every layer may import it,
    # and it imports none of them. The client talks to the server over HTTP only.
    forbidden = {
        "workers": ("sweeper", "api", "sqlalchemy", "fastapi"),
        "sweeper": ("api",),
        "dpsweep": (
            "api",
            "sweeper",
            "workers",
            "sqlalchemy",
            "fastapi",
            "torch",
            "ray",
            "numpy",
        ),
    }
    # The one exception: the SDK's Trial.load_model / export_onnx check inside the methods
    # (never at module level) that torch is installed, and say what to install when it is
    # missing. The model registry itself comes through the dpsweep.model_loaders entry points,
    # so dpsweep never imports workers.
    lazy_ok = {("trial.py", "torch")}
    bad = []
    for layer, banned in forbidden.items():
        for path in (root / layer).rglob("*.py"):
            tree = ast.parse(path.read_text())
            top_level = {id(n) for n in tree.body}
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                bad += [
                    f"{path.name}: {n}"
                    for n in names
                    if n.split(".")[0] in banned
                    and not (
                        layer == "dpsweep"
                        and id(node) not in top_level
                        and (path.name, n.split(".")[0]) in lazy_ok
                    )
                ]
    assert bad == []
