"""The accountant registry (workers.accounting.registry): every accountant honours one contract."""

from __future__ import annotations

import math

import pytest

from dpsweep.errors import ConfigError
from workers.accounting import compute_epsilon
from workers.accounting.registry import (
    AccountantDescriptor,
    accountant_names,
    get_accountant,
    plan_accountant,
    spec_accountant,
    trial_accountant_for_plan,
    worker_accountant,
)

Q, T, DELTA = 0.01, 500, 1e-5
NAMES = accountant_names()


def _eps(name: str, sigma: float = 1.0, steps: int = T, **kw: object) -> float:
    return compute_epsilon(
        noise_multiplier=sigma,
        sample_rate=Q,
        steps=steps,
        target_delta=DELTA,
        accountant=name,
        **kw,  # type: ignore[arg-type]
    )


def test_the_registry_names_each_accountant_for_what_it_is() -> None:
    assert set(NAMES) == {"pld", "dp-rdp", "opacus-rdp", "opacus-prv"}
    for name in NAMES:
        d = get_accountant(name)
        assert isinstance(d, AccountantDescriptor) and d.name == name
        assert d.description and d.library
    assert get_accountant("pld").library == "dp_accounting PLD" and get_accountant("pld").tight
    assert not get_accountant("dp-rdp").tight and not get_accountant("opacus-rdp").tight
    assert get_accountant("opacus-prv").tight


@pytest.mark.parametrize("name", NAMES)
def test_contract(name: str) -> None:
    base = _eps(name)
    assert math.isfinite(base) and base > 0
    assert _eps(name, sigma=1.5) < base  # more noise, less epsilon
    assert _eps(name, steps=2 * T) > base  # more steps, more epsilon
    assert _eps(name, eval_noise_multiplier=20.0, eval_releases=10) > base
    # The descriptor's own epsilon is what compute_epsilon reports.
    direct = get_accountant(name).epsilon(
        noise_multiplier=1.0, sample_rate=Q, steps=T, target_delta=DELTA
    )
    assert direct == pytest.approx(base, rel=1e-12)


def test_tight_accountants_agree_and_rdp_ones_bound_them() -> None:
    tight = [_eps(n) for n in NAMES if get_accountant(n).tight]
    loose = [_eps(n) for n in NAMES if not get_accountant(n).tight]
    assert len(tight) >= 2 and len(loose) >= 2
    assert max(tight) <= min(tight) * 1.05
    assert min(loose) >= max(tight)


def test_legacy_worker_names_keep_their_meaning() -> None:
    assert worker_accountant("rdp").name == "opacus-rdp"
    assert worker_accountant("prv").name == "opacus-prv"
    assert _eps("rdp") == _eps("opacus-rdp")
    assert compute_epsilon(
        noise_multiplier=1.0, sample_rate=Q, steps=T, target_delta=DELTA
    ) == _eps("opacus-rdp")
    assert plan_accountant("rdp").name == "dp-rdp"
    assert plan_accountant("rdp (RepeatAndSelect)").name == "dp-rdp"
    assert spec_accountant("prv").name == "pld" and spec_accountant("pld").name == "pld"


@pytest.mark.parametrize(
    "call",
    [
        lambda: get_accountant("gdp"),
        lambda: worker_accountant("gdp"),
        lambda: plan_accountant("gdp"),
        lambda: _eps("gdp"),
    ],
)
def test_an_unknown_accountant_is_refused_by_field(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="unknown accountant 'gdp'") as exc:
        call()
    assert exc.value.field == "privacy.accountant"
    assert "pld" in str(exc.value)


def test_the_runner_maps_stored_plan_accountants_explicitly() -> None:
    assert trial_accountant_for_plan("pld") == "pld"
    # Single-run epsilons of RDP plans keep their historical accountant (Opacus RDP).
    assert trial_accountant_for_plan("rdp") == "opacus-rdp"
    assert trial_accountant_for_plan("rdp (RepeatAndSelect)") == "opacus-rdp"
    assert trial_accountant_for_plan("dp-rdp") == "opacus-rdp"
    # One table of legacy spec/plan names: "prv" is dp_accounting's PLD there too.
    assert trial_accountant_for_plan("prv") == "pld"
    for bad in ("gdp", "opacus-prv", "opacus-rdp", None):
        with pytest.raises(ConfigError) as exc:
            trial_accountant_for_plan(bad)  # type: ignore[arg-type]
        assert exc.value.field == "privacy.accountant"


def test_spec_pld_and_legacy_prv_plan_identically() -> None:
    from dpsweep.spec import PrivacyConfig
    from sweeper.privacy.grids import GridRequest
    from sweeper.privacy.planner import plan_accountant_name, plan_grid

    assert PrivacyConfig(budgets=[1.0], delta=1e-5, accountant="pld").accountant == "pld"
    # A legacy name is normalised to the canonical one when the spec is parsed.
    assert PrivacyConfig(budgets=[1.0], delta=1e-5, accountant="prv").accountant == "pld"
    assert PrivacyConfig(budgets=[1.0], delta=1e-5, accountant="rdp").accountant == "dp-rdp"
    assert PrivacyConfig(budgets=[1.0], delta=1e-5).accountant == "pld"
    assert plan_accountant_name("pld") == plan_accountant_name("prv") == "pld"
    assert plan_accountant_name("rdp") == plan_accountant_name("dp-rdp") == "dp-rdp"
    req = GridRequest(
        arm="a",
        strategy="fixed",
        epsilon_budget=2.0,
        delta=1e-5,
        trials=4,
        steps_per_trial=200,
        sample_rate=0.02,
        accountant=plan_accountant_name("prv"),
    )
    legacy = plan_grid(req)
    honest = plan_grid(GridRequest(**{**req.__dict__, "accountant": plan_accountant_name("pld")}))
    assert legacy == honest
    assert legacy.accountant == "pld"
