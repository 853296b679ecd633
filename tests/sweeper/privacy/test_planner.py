"""The privacy planner: calibration, verification, infeasibility; and `dpsweep plan`."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.errors import ConfigError, PrivacyError
from dpsweep.plan_fields import CLI, public_fields
from dpsweep.spec import load_spec
from sweeper.privacy import noise_split as planner
from sweeper.privacy.calibration import calibrate
from sweeper.privacy.grids import GridRequest, InfeasiblePlan
from sweeper.privacy.papernot_steinke import repeat_and_select_epsilon
from sweeper.privacy.planner import plan_grid
from workers.accounting import pld_epsilon

REF_Q = 256 / 60000
REF_STEPS = int(60 / REF_Q)
ROOT = Path(__file__).resolve().parents[3]
DPSWEEP = shutil.which("dpsweep", path=str(Path(sys.executable).parent)) or "dpsweep"


def req(**kw) -> GridRequest:  # type: ignore[no-untyped-def]
    base = dict(
        arm="fixed",
        strategy="fixed",
        epsilon_budget=3.0,
        delta=1e-5,
        trials=25,
        steps_per_trial=100,
        sample_rate=0.05,
        max_noise_multiplier=1000.0,
    )
    base.update(kw)
    return GridRequest(**base)


def test_reference_values() -> None:
    assert pld_epsilon(
        noise_multiplier=1.1, sample_rate=REF_Q, steps=REF_STEPS, target_delta=1e-5
    ) == pytest.approx(2.39, abs=0.01)
    total = repeat_and_select_epsilon(
        noise_multiplier=1.1,
        sample_rate=REF_Q,
        steps=REF_STEPS,
        mean_trials=10,
        shape=0.0,
        target_delta=1e-5,
    )
    assert total == pytest.approx(4.29, abs=0.01)


def test_papernot_steinke_sigma_matches_the_repeat_and_select_total() -> None:
    plan = plan_grid(
        req(
            accounting="papernot-steinke",
            distribution_shape=0.0,
            trials=10,
            steps_per_trial=REF_STEPS,
            sample_rate=REF_Q,
            epsilon_budget=4.294,
        )
    )
    assert plan.noise_multiplier == pytest.approx(1.1, rel=0.01)
    assert plan.release == "selected-only"
    assert 0.97 * 4.294 <= plan.epsilon_verified <= 4.294


def test_compose_is_tighter_than_basic_and_both_fit() -> None:
    c = plan_grid(req(accounting="compose"))
    b = plan_grid(req(accounting="basic"))
    assert c.noise_multiplier < b.noise_multiplier  # honest composition wastes less noise
    assert c.epsilon_verified <= 3.0 and b.epsilon_verified <= 3.0
    assert b.delta_per_trial == pytest.approx(1e-5 / 25)
    assert c.epsilon_per_trial < c.epsilon_total


@settings(max_examples=12, deadline=None)
@given(
    eps=st.floats(0.5, 10.0),
    k=st.integers(1, 60),
    steps=st.integers(20, 400),
    q=st.floats(0.005, 0.2),
    method=st.sampled_from(["compose", "papernot-steinke"]),
)
def test_plans_use_between_97_and_100_percent_of_the_budget(
    eps: float, k: int, steps: int, q: float, method: str
) -> None:
    r = req(
        epsilon_budget=eps,
        trials=k,
        steps_per_trial=steps,
        sample_rate=q,
        accounting=method,
        distribution_shape=1.0 if method != "compose" else None,
    )
    try:
        p = plan_grid(r)
    except InfeasiblePlan:
        return  # beyond the allowed noise: refused, which is the point
    assert 0.97 * eps <= p.epsilon_total <= eps
    # The second accountant's figure may be lower (PRV is tight; dp_accounting's RDP over-
    # states fractional orders near 1), never beyond its error bars (verify_plan refuses).
    assert p.epsilon_verified_lower is not None and p.epsilon_verified_lower <= eps


@settings(max_examples=10, deadline=None)
@given(eps=st.floats(0.5, 10.0), k=st.integers(1, 40), steps=st.integers(20, 300))
def test_basic_trials_sum_within_budget(eps: float, k: int, steps: int) -> None:
    try:
        p = plan_grid(req(accounting="basic", epsilon_budget=eps, trials=k, steps_per_trial=steps))
    except InfeasiblePlan:
        return
    verified_each = p.epsilon_verified / k
    assert k * verified_each <= eps * (1 + 1e-9)


@settings(max_examples=6, deadline=None)
@given(sigma=st.floats(0.6, 5.0), steps=st.integers(10, 300), q=st.floats(0.01, 0.2))
def test_epsilon_rises_with_steps_and_trials(sigma: float, steps: int, q: float) -> None:
    e1 = pld_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, target_delta=1e-5)
    e2 = pld_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps * 2, target_delta=1e-5)
    assert e2 >= e1
    grid = plan_grid(req(trials=10, steps_per_trial=steps, sample_rate=q, epsilon_budget=5.0))
    bigger = plan_grid(req(trials=20, steps_per_trial=steps, sample_rate=q, epsilon_budget=5.0))
    assert bigger.noise_multiplier >= grid.noise_multiplier  # more trials, more noise each


@settings(max_examples=10, deadline=None)
@given(e1=st.floats(0.3, 10.0), e2=st.floats(0.3, 10.0))
def test_sigma_falls_as_epsilon_rises(e1: float, e2: float) -> None:
    lo, hi = sorted((e1, e2))
    asked = AccountingInputs(
        noise_multiplier=None, sample_rate=0.05, steps=500, delta=1e-5, accountant="pld"
    )
    s_lo = calibrate(asked, target_epsilon=lo, max_noise_multiplier=1000.0)
    s_hi = calibrate(asked, target_epsilon=hi, max_noise_multiplier=1000.0)
    assert s_hi <= s_lo * (1 + 1e-6)


def test_infeasible_plans_say_what_to_change() -> None:
    r = req(
        epsilon_budget=0.5,
        trials=75,
        steps_per_trial=112,
        sample_rate=64 / 1437,
        max_noise_multiplier=10.0,
    )
    with pytest.raises(InfeasiblePlan) as exc:
        plan_grid(r)
    msg = str(exc.value)
    assert "needs sigma=" in msg and "no model will learn with" in msg
    n = int(msg.split("largest grid that keeps sigma <= 10 has ")[1].split(" ")[0])
    assert n >= 1
    assert (
        plan_grid(
            req(
                epsilon_budget=0.5,
                trials=n,
                steps_per_trial=112,
                sample_rate=64 / 1437,
                max_noise_multiplier=10.0,
            )
        ).noise_multiplier
        <= 10
    )
    with pytest.raises(InfeasiblePlan):
        plan_grid(
            req(
                epsilon_budget=0.5,
                trials=n + 1,
                steps_per_trial=112,
                sample_rate=64 / 1437,
                max_noise_multiplier=10.0,
            )
        )


def test_delta_must_be_below_one_over_n() -> None:
    with pytest.raises(ConfigError, match=r"delta 0.001 is >= 1/N for a dataset of N = 1797"):
        plan_grid(req(delta=1e-3, dataset_size=1797))


def test_a_plan_that_fails_verification_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.accounting import audit

    real = audit.prv_epsilon

    def pessimistic(**kw):  # type: ignore[no-untyped-def]
        # The second accountant (PRV) disagrees upward: the plan must not go through.
        return real(**kw).scaled(1.2)

    monkeypatch.setattr(audit, "prv_epsilon", pessimistic)
    with pytest.raises(PrivacyError, match=r"under-states its privacy cost.*plan refused"):
        plan_grid(req())


def test_quantile_split_is_checked_when_planning() -> None:
    assert planner.gradient_noise_multiplier(
        "online", {}, noise_multiplier=2.0, expected_batch_size=64
    ) == pytest.approx((2.0**-2 - (7.124 * 2.0) ** -2) ** -0.5)
    assert (
        planner.gradient_noise_multiplier("fixed", {}, noise_multiplier=2.0, expected_batch_size=64)
        == 2.0
    )
    with pytest.raises(InfeasiblePlan, match="count_noise"):
        planner.gradient_noise_multiplier(
            "quantile", {"count_noise": 3.0}, noise_multiplier=7.0, expected_batch_size=64
        )


@pytest.mark.parametrize("sigma", [0.5, 2.0, 7.0, 12.6, 40.0])
@pytest.mark.parametrize("b", [16, 64, 256])
def test_quantile_count_noise_is_chosen_when_left_out(sigma: float, b: int) -> None:
    # b/20 where it costs the gradient at most 10 % more noise, else the most accurate count
    # that keeps it within 10 %: the plan is never refused for the count's sake.
    from workers.count_noise import auto_count_noise

    sigma_b = auto_count_noise(noise_multiplier=sigma, expected_batch_size=b)
    sigma_g = planner.gradient_noise_multiplier(
        "quantile", {}, noise_multiplier=sigma, expected_batch_size=b
    )
    assert sigma < sigma_g <= 1.1 * sigma * (1 + 1e-12)
    assert sigma_b >= b / 20
    if sigma_b > b / 20:  # raised: exactly the 10 % bound, not more
        assert sigma_g == pytest.approx(1.1 * sigma, rel=1e-9)


def test_planning_imports_no_torch() -> None:
    code = (
        "import sys; from sweeper.sweeps.planning import plan_sweep;"
        "from dpsweep.spec import load_spec;"
        f"plan_sweep(load_spec({str(ROOT / 'examples' / 'digits-clipping.yaml')!r}));"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_cli_plan_json_and_table(tmp_path: Path) -> None:
    p = subprocess.run(
        [DPSWEEP, "plan", str(ROOT / "examples" / "digits-clipping.yaml"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    spec = load_spec(ROOT / "examples" / "digits-clipping.yaml")
    assert len(rows) == len(spec.arms) * len(spec.privacy.budgets)
    for r in rows:
        assert list(r) == [f.name for f in public_fields(CLI)]
        assert r["epsilon_verified"] <= r["epsilon_budget"]
        assert r["epsilon_verified"] >= 0.97 * r["epsilon_budget"]
    t = subprocess.run(
        [DPSWEEP, "plan", str(ROOT / "examples" / "digits-clipping.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert t.returncode == 0 and "verified ε" in t.stdout and "quantile" in t.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\ndataset: {name: digits}\nmodel: {name: mlp}\n"
        "privacy: {budgets: [0], delta: 1e-5}\narms: [{strategy: fixed}]\n"
    )
    e = subprocess.run(
        [DPSWEEP, "plan", str(bad)],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert e.returncode == 2 and "privacy.budgets" in e.stderr
    assert math.isfinite(rows[0]["noise_multiplier"])
