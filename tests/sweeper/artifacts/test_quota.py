"""The quota of kept models: the estimate, the count, the refusal at creation (before any
budget is reserved) and the write-time check of the driver's keeper (real SQLite, real store).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, QuotaExceeded
from dpsweep.spec import load_spec
from sweeper.artifacts.keeper import flush_staged
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.rows import DatasetBudget, LedgerEntry
from sweeper.store import (
    Dataset,
    ModelArtifact,
    StagedModel,
    Sweep,
    SweepState,
    Trial,
    TrialResultRow,
    TrialState,
)
from sweeper.store.artifact_files import ArtifactStore, sweep_prefix, usage_bytes
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.quota import (
    CARD_ALLOWANCE_BYTES,
    check_quota,
    estimate_model_bytes,
    kept_models,
)
from sweeper.sweeps.stored import grid_key


def small_spec(**over: Any) -> dict[str, Any]:
    """One arm at one ε level on digits: quick to plan."""
    spec: dict[str, Any] = {
        "name": "q",
        "dataset": {"name": "digits"},
        "model": {"name": "logreg"},
        "training": {"steps": 5, "batch_size": 64, "eval_every": 5},
        "privacy": {"budgets": [2.0], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0]}}],
    }
    spec.update(over)
    return spec


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'quota.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


@pytest.fixture(autouse=True)
def _no_quota_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPSWEEP_ARTIFACT_QUOTA_MB", raising=False)
    monkeypatch.delenv("DPSWEEP_ARTIFACT_URL", raising=False)


def keep_a_model(
    engine: Any, store: ArtifactStore, spec: dict[str, Any], *, owner: str | None = None
) -> tuple[str, str]:
    """A finished sweep with one trained trial whose model the keeper stages and writes.

    The sweep is created for real (plan, reservation); its first trial is then recorded as done
    with the weights of a freshly built model (no training: the keeper only needs bytes), and
    its reservation released, as a finished sweep's is.

    Returns:
        The sweep and the trial.
    """
    import torch

    from workers.checkpoints import model_info, weights_bytes
    from workers.models.descriptors import ModelSpec
    from workers.models.registry import build_model

    sweep_id = create_sweep(engine, spec, owner=owner)
    typed = load_spec(spec)
    module = build_model(
        ModelSpec(typed.model.name, typed.model.options),
        input_shape=(1, 8, 8),
        num_classes=10,
        seed=0,
    )
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.01)
    with Session(engine) as session, session.begin():
        sweep = session.get(Sweep, sweep_id)
        assert sweep is not None
        trial = sorted(sweep.trials, key=lambda t: t.number)[0]
        trial.state = TrialState.done
        trial.result = TrialResultRow(
            metrics={"accuracy": 0.5, "ece": 0.1, "loss": 1.0},
            final_metrics={"accuracy": 0.5},
            epsilon=1.0,
            delta=1e-5,
            accountant="pld",
            steps=5,
            best_step=5,
            reliability=None,
            trajectories={},
            objective=0.5,
        )
        for other in sweep.trials:
            if other is not trial:
                other.state = TrialState.cancelled
        sweep.state = SweepState.done
        key = sweep.ledger_key
        trial_id = trial.id
        session.add(
            StagedModel(
                trial_id=trial_id,
                sweep_id=sweep_id,
                grid=grid_key(trial.arm, trial.epsilon_budget),
                weights=weights_bytes(module),
                info=model_info(
                    module,
                    name=typed.model.name,
                    options=typed.model.options,
                    input_shape=(1, 8, 8),
                    num_classes=10,
                    engine_path="packed",
                ),
            )
        )
    assert key is not None
    BudgetLedger(engine).release(key, sweep_id=sweep_id, note="test: the sweep ended")
    assert flush_staged(engine, sweep_id, store=store) == 1
    return sweep_id, trial_id


# ---------------------------------------------------------------------------------------------
# The estimate and the count


@pytest.mark.parametrize(
    ("model", "options"), [("logreg", {}), ("mlp", {}), ("mlp", {"hidden": [64, 32]})]
)
def test_the_estimate_is_the_real_safetensors_size_plus_the_card_allowance(
    model: str, options: dict[str, Any]
) -> None:
    from workers.checkpoints import weights_bytes
    from workers.datasets.loading import load_dataset
    from workers.datasets.records import DatasetSpec
    from workers.models.descriptors import ModelSpec
    from workers.models.registry import build_model

    spec = load_spec(small_spec(model={"name": model, "options": options}))
    estimate = estimate_model_bytes(spec)
    module = build_model(ModelSpec(model, options), input_shape=(1, 8, 8), num_classes=10, seed=0)
    # The file carries digits' input transform beside the weights.
    real = len(weights_bytes(module, load_dataset(DatasetSpec("digits")).input_transform))
    # The weights' file exactly, up to the header's padding; the card's room on top.
    assert 0 <= estimate - CARD_ALLOWANCE_BYTES - real <= 16


def test_kept_models_counts_what_each_policy_may_keep() -> None:
    two_arms = small_spec(
        privacy={"budgets": [1.0, 3.0], "delta": 1e-5},
        arms=[
            {"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0, 2.0]}},
            {"strategy": "automatic", "grid": {"lr": [0.5]}},
        ],
        seeds=2,
    )
    assert kept_models(load_spec(two_arms)) == 4  # best_per_grid: 2 arms x 2 levels
    assert kept_models(load_spec({**two_arms, "artifacts": {"keep": "all"}})) == (4 + 1) * 2 * 2
    assert kept_models(load_spec({**two_arms, "artifacts": {"keep": "none"}})) == 0
    random = {**two_arms, "search": {"method": "random", "n": 3}, "artifacts": {"keep": "all"}}
    assert kept_models(load_spec(random)) == (3 + 3) * 2 * 2
    ps = small_spec(
        privacy={
            "budgets": [1.0, 3.0],
            "delta": 1e-5,
            "accounting": "papernot-steinke",
            "distribution": {"name": "poisson"},
        },
        artifacts={"keep": "all"},
    )
    assert kept_models(load_spec(ps)) == 2  # its selected trial per grid, whatever keep says


# ---------------------------------------------------------------------------------------------
# At creation: refused before anything is reserved


def _books(engine: Any) -> tuple[int, int, int, int]:
    with Session(engine) as s:
        return (
            s.scalar(sa.select(sa.func.count()).select_from(Sweep)) or 0,
            s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)) or 0,
            s.scalar(sa.select(sa.func.count()).select_from(DatasetBudget)) or 0,
            s.scalar(sa.select(sa.func.count()).select_from(Dataset)) or 0,
        )


def test_a_sweep_over_quota_is_refused_before_any_reservation(engine: Any) -> None:
    from api.errors import status_of

    before = _books(engine)
    spec = small_spec(artifacts={"keep": "all"})
    one = estimate_model_bytes(load_spec(spec))
    # Room for one model (best_per_grid) but not for both trials' (all).
    with pytest.raises(QuotaExceeded) as info:
        create_sweep(engine, spec, owner="ada", artifact_quota_mb=1.5 * one / 2**20)
    exc = info.value
    assert isinstance(exc, ConfigError) and exc.field == "artifacts.keep"
    assert status_of(exc) == (422, "quota-exceeded")
    text = str(exc)
    for says in ("2 model(s)", "quota", "best_per_grid", "dpsweep delete", "QUOTA_MB"):
        assert says in text, says
    assert _books(engine) == before  # no sweep, no ledger row or entry, no name bound
    # The same spec keeping each grid's best fits.
    assert create_sweep(engine, small_spec(), owner="ada", artifact_quota_mb=1.5 * one / 2**20)


def test_the_quota_counts_what_the_tenant_already_keeps(engine: Any, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    keep_a_model(engine, store, small_spec(), owner="ada")
    with Session(engine) as s:
        used = usage_bytes(s, "ada")
        assert usage_bytes(s, "bob") == 0
    spec = load_spec(small_spec())
    one = estimate_model_bytes(spec)
    quota = used + one - 1  # one more model would not fit beside ada's, fits alone
    with pytest.raises(QuotaExceeded, match="already kept"):
        check_quota(engine, "ada", spec, quota)
    check_quota(engine, "bob", spec, quota)  # another tenant's quota is its own
    check_quota(engine, "ada", load_spec(small_spec(artifacts={"keep": "none"})), quota)
    check_quota(engine, "ada", spec, None)  # no quota: nothing to check


# ---------------------------------------------------------------------------------------------
# At write time: the driver's keeper skips a model over quota


def test_the_keeper_skips_writing_a_model_over_quota(engine: Any, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    sweep_id, trial_id = keep_a_model(engine, store, small_spec(), owner="ada")
    with Session(engine) as s:
        row = s.get(ModelArtifact, trial_id)
        assert row is not None
        # The card fits the allowance the estimate makes for it.
        assert row.card_size_bytes <= CARD_ALLOWANCE_BYTES
        weights = store.get(row.key)
        info = dict(row.card["model"])
        trial = s.get(Trial, trial_id)
        assert trial is not None
        grid = grid_key(trial.arm, trial.epsilon_budget)
    # Stage the same trial's model again, as a driver would after a crash, with room for its
    # weights but not for its card beside them.
    with Session(engine) as s, s.begin():
        s.delete(s.get(ModelArtifact, trial_id))
        s.add(
            StagedModel(trial_id=trial_id, sweep_id=sweep_id, grid=grid, weights=weights, info=info)
        )
    store.delete_folder(sweep_prefix(sweep_id))
    assert flush_staged(engine, sweep_id, store=store, quota_bytes=len(weights)) == 0
    with Session(engine) as s:
        assert s.get(ModelArtifact, trial_id) is None
        assert s.get(StagedModel, trial_id) is None  # dropped, not retried forever
    assert store.folders(sweep_prefix(sweep_id)) == []  # nothing written
