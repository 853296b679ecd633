"""The one path of one-off runs (sweeper.runs.single_run) and their charge (one_off_charge).

``dpsweep train`` and an audit of new settings both go through it: the same checks, the same
plan (q, T, sigma) and the same charge, each refusal before anything is charged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpsweep.audit import AuditRequest
from dpsweep.errors import ConfigError, PrivacyError
from dpsweep.spec import DatasetConfig, ModelConfig, TrainingConfig
from sweeper.audits.prepare import prepare_audit
from sweeper.datasets.access import Viewer
from sweeper.datasets.identity import ledger_key_of
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.errors import BudgetExhausted
from sweeper.privacy.release_log import read_log
from sweeper.runs.one_off_charge import charge_training_run
from sweeper.runs.single_run import SingleRun, check_single_run, prepare_single_run
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from workers.accounting import compute_epsilon

LOCAL = Viewer(None)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Any]:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _run(**changes: Any) -> SingleRun:
    base: dict[str, Any] = {
        "dataset": DatasetConfig(name="digits"),
        "model": ModelConfig(name="logreg"),
        "training": TrainingConfig(steps=20, batch_size=64),
        "strategy": "fixed",
        "accountant": "opacus-rdp",
        "delta": 1e-5,
        "lrs": (0.5,),
        "epsilon": 2.0,
    }
    return SingleRun(**{**base, **changes})


def _prepared(engine: Any, run: SingleRun) -> Any:
    return prepare_single_run(engine, run, LOCAL, params=check_single_run(run))


def test_a_run_is_planned_as_a_one_trial_grid(engine: Any) -> None:
    prepared = _prepared(engine, _run())
    n_train = prepared.data.planning_n_train
    assert prepared.sample_rate == pytest.approx(64 / n_train) and prepared.steps == 20
    # sigma is calibrated to the epsilon asked for: its epsilon is that one, not above.
    eps = compute_epsilon(
        noise_multiplier=prepared.noise_multiplier,
        sample_rate=prepared.sample_rate,
        steps=prepared.steps,
        target_delta=1e-5,
        accountant="opacus-rdp",
    )
    assert 1.9 < eps <= 2.0
    # The worker refuses to train anything but what is charged.
    planned = prepared.pack.planned
    assert (planned.sample_rate, planned.steps, planned.noise_multiplier) == (
        prepared.sample_rate,
        prepared.steps,
        prepared.noise_multiplier,
    )
    assert planned.dataset_sha256 == prepared.data.content_sha256
    assert [t.lr for t in prepared.pack.trials] == [0.5]


def test_a_given_noise_multiplier_is_used_and_a_sample_rate_sets_the_batch(engine: Any) -> None:
    prepared = _prepared(engine, _run(epsilon=None, noise_multiplier=1.3, sample_rate=0.1))
    n_train = prepared.data.planning_n_train
    assert prepared.noise_multiplier == 1.3
    assert prepared.pack.batch_size == round(0.1 * n_train)
    assert prepared.sample_rate == pytest.approx(round(0.1 * n_train) / n_train)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"model": ModelConfig(name="resnet9000")}, "model", "unknown model 'resnet9000'"),
        ({"strategy": "magic"}, "strategy", "unknown strategy 'magic'"),
        ({"accountant": "abacus"}, "accountant", "unknown accountant 'abacus'"),
        ({"params": {"clip": -1.0}}, "params.clip", "clip"),
        ({"noise_multiplier": 1.0}, "epsilon", "give exactly one of"),
        ({"strategy": "nonprivate"}, "epsilon", "adds no noise"),
        (
            {"model": ModelConfig(name="mlp", options={"hidden": "wide"})},
            "model_options",
            "hidden",
        ),
    ],
)
def test_checks_name_the_request_field(changes: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        check_single_run(_run(**changes))
    assert caught.value.field == field


def test_an_audit_refuses_a_non_private_strategy() -> None:
    run = _run(strategy="nonprivate", epsilon=None)
    check_single_run(run)  # a train run may be non-private
    with pytest.raises(ConfigError, match="no epsilon to audit") as caught:
        check_single_run(run, require_private=True)
    assert caught.value.field == "strategy"


def test_plan_refusals_name_the_request_field(engine: Any) -> None:
    with pytest.raises(ConfigError, match=r"delta 0.001 is >= 1/N") as caught:
        _prepared(engine, _run(delta=1e-3))
    assert caught.value.field == "delta"
    with pytest.raises(ConfigError, match="exceeds the") as caught:
        _prepared(engine, _run(training=TrainingConfig(steps=5, batch_size=10**6)))
    assert caught.value.field == "batch_size"
    with pytest.raises(ConfigError) as caught:
        _prepared(engine, _run(epsilon=1e-9))
    assert caught.value.field == "epsilon"


def test_train_and_an_audit_of_the_same_settings_plan_the_same_noise(engine: Any) -> None:
    """One path: an audit of new settings is planned as ``dpsweep train`` plans them."""
    request = AuditRequest(
        dataset="digits",
        model="logreg",
        strategy="fixed",
        epsilon=2.0,
        delta=1e-5,
        steps=20,
        batch_size=64,
        lrs=[0.5],
        accountant="opacus-rdp",
        setting="white-box",
    )
    audit = prepare_audit(engine, request, LOCAL)
    train = _prepared(engine, _run())
    assert (audit.sample_rate, audit.steps, audit.noise_multiplier) == (
        train.sample_rate,
        train.steps,
        train.noise_multiplier,
    )


def test_the_charge_is_the_runs_epsilon_in_the_ledger_and_the_release_log(engine: Any) -> None:
    prepared = _prepared(engine, _run())
    charge = charge_training_run(engine, prepared, dataset="digits")
    assert charge is not None
    key = ledger_key_of(engine, "digits")
    spent = float(BudgetLedger(engine).summary(key).epsilon_spent)
    assert spent == pytest.approx(charge["epsilon_charged"]) and 1.9 < spent <= 2.0
    log = read_log(engine, key, everyone=True)
    assert [(e["kind"], e["epsilon"]) for e in log] == [("train", pytest.approx(spent))]
    # A cap that cannot cover the next run refuses it; nothing more is charged.
    BudgetLedger(engine).set_cap(key, epsilon_cap=spent + 0.5)
    with pytest.raises(BudgetExhausted):
        charge_training_run(engine, _prepared(engine, _run()), dataset="digits")
    assert float(BudgetLedger(engine).summary(key).epsilon_spent) == pytest.approx(spent)
    assert len(read_log(engine, key, everyone=True)) == 1


def test_a_non_private_run_is_refused_on_a_capped_dataset(engine: Any) -> None:
    run = _run(strategy="nonprivate", epsilon=None)
    assert charge_training_run(engine, _prepared(engine, run), dataset="digits") is None
    key = ledger_key_of(engine, "digits")
    BudgetLedger(engine).set_cap(key, epsilon_cap=10.0)
    with pytest.raises(PrivacyError, match="lifetime epsilon cap"):
        charge_training_run(engine, _prepared(engine, run), dataset="digits")
    assert float(BudgetLedger(engine).summary(key).epsilon_spent) == 0.0
