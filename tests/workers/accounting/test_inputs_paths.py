"""The accountants take a run's AccountingInputs whole; the names' readers follow the one table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsweep.accountants import ACCOUNTANTS, LEGACY_NAMES
from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting import (
    calibrate_for,
    calibrate_noise_multiplier,
    compute_epsilon,
    epsilon_for,
)
from workers.accounting.registry import (
    get_accountant,
    plan_accountant,
    spec_accountant,
    trial_accountant_for_plan,
    worker_accountant,
)


@pytest.mark.parametrize("name", sorted(LEGACY_NAMES))
def test_each_reader_reads_a_legacy_name_as_the_table_says(name: str) -> None:
    legacy = LEGACY_NAMES[name]
    assert legacy.plan is not None  # every legacy name was a spec's or a plan's
    assert plan_accountant(name).name == legacy.plan == spec_accountant(name).name
    assert trial_accountant_for_plan(name) == ACCOUNTANTS[legacy.plan].trial_accountant
    if legacy.worker is None:
        with pytest.raises(ConfigError, match="unknown accountant"):
            worker_accountant(name)
    else:
        assert worker_accountant(name).name == legacy.worker


def test_no_choice_offered_is_a_legacy_name() -> None:
    with pytest.raises(ConfigError) as exc:
        worker_accountant("gdp")
    offered = str(exc.value).split("choose one of: ")[1].split(", ")
    assert offered and not set(offered) & set(LEGACY_NAMES)


@settings(max_examples=15, deadline=None)
@given(
    sigma=st.floats(0.6, 4.0),
    q=st.floats(0.001, 0.2),
    steps=st.integers(1, 400),
    evaluations=st.integers(0, 5),
    name=st.sampled_from(["pld", "dp-rdp"]),
)
def test_the_value_and_the_spelled_out_keywords_give_one_figure(
    sigma: float, q: float, steps: int, evaluations: int, name: str
) -> None:
    run = AccountingInputs(
        noise_multiplier=sigma,
        sample_rate=q,
        steps=steps,
        delta=1e-5,
        eval_noise_multiplier=30.0,
        evaluations=evaluations,
        accountant=name,
    )
    spelled = compute_epsilon(
        noise_multiplier=sigma,
        sample_rate=q,
        steps=steps,
        target_delta=1e-5,
        accountant=name,
        eval_noise_multiplier=30.0,
        eval_releases=evaluations,
    )
    assert epsilon_for(run) == spelled
    assert get_accountant(name).epsilon(**run.library_keywords()) == spelled


def test_calibration_is_the_same_either_way_and_fits() -> None:
    asked = AccountingInputs(noise_multiplier=None, sample_rate=0.01, steps=300, delta=1e-5)
    sigma = calibrate_for(asked, target_epsilon=2.0)
    assert sigma == calibrate_noise_multiplier(
        target_epsilon=2.0, target_delta=1e-5, sample_rate=0.01, steps=300, accountant="rdp"
    )
    assert 2.0 * 0.99 - 0.01 <= epsilon_for(asked.with_noise(sigma)) <= 2.0


def test_an_accountant_refuses_inputs_for_another() -> None:
    run = AccountingInputs(
        noise_multiplier=1.0, sample_rate=0.01, steps=10, delta=1e-5, accountant="dp-rdp"
    )
    with pytest.raises(PrivacyError, match="asked about inputs for 'dp-rdp'"):
        get_accountant("pld").epsilon_for(run)
    with pytest.raises(ConfigError, match="unknown accountant 'gdp'"):
        epsilon_for(run.with_accountant("gdp"))


def test_a_pack_reads_its_stored_worker_name_as_a_workers() -> None:
    from workers.datasets.records import DatasetSpec
    from workers.models.descriptors import ModelSpec
    from workers.training.specs import PackSpec, TrialSpec

    trial = TrialSpec(lr=0.1, noise_multiplier=1.2, target_delta=1e-6)
    pack = PackSpec(DatasetSpec("digits"), ModelSpec("mlp"), "fixed", [trial], accountant="rdp")
    run = pack.trial_inputs(trial, sample_rate=0.05, steps=20, evaluations=0)
    assert run.accountant == "opacus-rdp"  # a worker's rdp: Opacus's RDP, as it always was
    assert (run.sigma, run.delta) == (1.2, 1e-6)
    assert PackSpec(DatasetSpec("digits"), ModelSpec("mlp"), "fixed", []).accountant == (
        "opacus-rdp"
    )
