"""Data owners and analysts on real databases: grants, allowances, evaluation modes, who sees
which sweep, the append-only audit log, and revocation mid-sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from dpsweep.errors import (
    ConfigError,
    DatasetNotFound,
    IllegalState,
    NotFound,
    PermissionDenied,
    SweepNotFound,
)
from sweeper.datasets import grants
from sweeper.datasets.access import Viewer, check_access
from sweeper.datasets.uploads import store_upload
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.privacy.ledger.amounts import ZERO
from sweeper.privacy.ledger.errors import AllowanceExhausted
from sweeper.privacy.release_log import read_log
from sweeper.settings import SweeperSettings
from sweeper.store import ReleaseRecord, Sweep, Trial, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.sweep_pages import check_sweep_owner, page_sweeps, sweep_head

OWNER, ANALYST, OTHER = Viewer("olga"), Viewer("ana"), Viewer("mallory")


@pytest.fixture
def engine(both_engines: Any) -> Any:
    return both_engines


def _upload(engine: Any, tmp_path: Path, *, cap: float | None = 20.0, declare: bool = True) -> str:
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(size=(400, 4)), 3)
    y = (x[:, 0] > 0).astype(int)
    lines = ["a,b,c,d,label"] + [
        ",".join(repr(float(v)) for v in row) + f",{t}" for row, t in zip(x, y, strict=True)
    ]
    desc = store_upload(
        engine,
        owner=OWNER.owner,
        content=("\n".join(lines) + "\n").encode(),
        fmt="csv",
        data_dir=tmp_path,
        label_column="label",
        epsilon_cap=cap,
        declare_counted=declare,
    )
    # DP evaluation scales by declared bounds only: the owner declares them in the view.
    grants.set_policy(engine, str(desc["id"]), OWNER, view={"input_bounds": [-5.0, 5.0]})
    return str(desc["id"])


def _spec(name: str, *, budgets: list[float], mode: str = "dp", n_lr: int = 1) -> dict[str, Any]:
    return {
        "name": f"s-{name}",
        "dataset": {"name": name, "input_bounds": [-5.0, 5.0]},
        "model": {"name": "logreg"},
        "training": {"steps": 6, "batch_size": 32, "eval_every": 3},
        "privacy": {"budgets": budgets, "delta": 1e-5},
        "eval": {"mode": mode},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.3, 0.5][:n_lr], "clip": [1.0]}}],
    }


def test_grants_bind_analysts_to_their_allowance_and_eval_modes(
    engine: Any, tmp_path: Path
) -> None:
    ds = _upload(engine, tmp_path)
    # No grant: the analyst does not even see the dataset.
    with pytest.raises(ConfigError):
        check_access(engine, {"name": ds}, ANALYST)
    with pytest.raises(DatasetNotFound):
        grants.grant(engine, ds, "ana", epsilon_allowance=3, viewer=OTHER)
    g = grants.grant(engine, ds, "ana", epsilon_allowance=3, viewer=OWNER, confirm=True)
    assert g["active"] and g["epsilon_allowance"] == 3
    check_access(engine, {"name": ds}, ANALYST)  # now they may use it
    # An analyst may not manage grants (they see the dataset: 403, not 404).
    with pytest.raises(PermissionDenied):
        grants.grant(engine, ds, "mallory", epsilon_allowance=1, viewer=ANALYST)
    # Carve-out is the owner's alone unless they allow it.
    with pytest.raises(ConfigError) as exc:
        create_sweep(engine, _spec(ds, budgets=[1], mode="carve-out"), owner="ana")
    assert exc.value.field == "eval.mode"
    create_sweep(engine, _spec(ds, budgets=[1], mode="carve-out"), owner="olga")
    # Within the allowance; then past it, refused whole (nothing stored).
    first = create_sweep(engine, _spec(ds, budgets=[2]), owner="ana")
    with pytest.raises(AllowanceExhausted) as refused:
        create_sweep(engine, _spec(ds, budgets=[2]), owner="ana")
    assert "allowance" in str(refused.value) and "sha256" not in str(refused.value)
    with Session(engine) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Sweep)) == 2
    (listed,) = grants.list_grants(engine, ds, OWNER)
    assert 1.9 < listed["epsilon_used"] <= 2.0  # the planned ε of the grid (at most its budget)
    # The owner sees the analyst's sweep; the analyst sees only their own; others nothing.
    assert {s["owner"] for s in page_sweeps(engine, OWNER).items} == {"olga", "ana"}
    assert {s["owner"] for s in page_sweeps(engine, ANALYST).items} == {"ana"}
    assert page_sweeps(engine, OTHER).items == []
    sweep_head(engine, first, OWNER)
    with pytest.raises(PermissionDenied):
        check_sweep_owner(engine, first, OWNER)  # sees it, may not cancel it
    with pytest.raises(SweepNotFound):
        sweep_head(engine, first, OTHER)
    # Revoked: no new reservation; what was reserved stays.
    grants.revoke(engine, ds, "ana", viewer=OWNER)
    with pytest.raises(ConfigError):
        check_access(engine, {"name": ds}, ANALYST)
    with pytest.raises(NotFound):
        grants.revoke(engine, ds, "ana", viewer=OWNER)
    assert grants.list_grants(engine, ds, ANALYST)[0]["active"] is False


def test_the_release_log_is_append_only(engine: Any, tmp_path: Path) -> None:
    ds = _upload(engine, tmp_path)
    sid = create_sweep(engine, _spec(ds, budgets=[1]), owner="olga")
    from sweeper.privacy import release_log

    with Session(engine) as s, s.begin():
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        assert release_log.record(
            s, sweep, trial_id="t", kind="model", grid=None, epsilon=ZERO, delta=ZERO
        )
        # The same release is never logged twice.
        assert not release_log.record(
            s, sweep, trial_id="t", kind="model", grid=None, epsilon=ZERO, delta=ZERO
        )
    for stmt in (
        sa.update(ReleaseRecord).values(kind="trial"),
        sa.delete(ReleaseRecord),
    ):
        with pytest.raises(sa.exc.DBAPIError), Session(engine) as s, s.begin():
            s.execute(stmt)
    with Session(engine) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(ReleaseRecord)) == 1


@pytest.fixture(scope="module")
def local_ray() -> Any:
    import ray

    with ray_session(SweeperSettings(), workers=2):
        yield ray


def test_an_analysts_sweep_is_logged_release_by_release(local_ray: Any, tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    upgrade(str(engine.url))
    ds = _upload(engine, tmp_path)
    grants.grant(engine, ds, "ana", epsilon_allowance=5, viewer=OWNER, confirm=True)
    sid = create_sweep(engine, _spec(ds, budgets=[1], n_lr=2), owner="ana")
    assert run_sweep(engine, sid).state == "done"
    key = grants.list_grants(engine, ds, OWNER)[0]
    assert 0.9 < key["epsilon_used"] <= 1.0
    from sweeper.datasets.identity import view_key

    log = read_log(engine, view_key(engine, ds), everyone=True)
    with Session(engine) as s:
        done = {t.id for t in s.scalars(sa.select(Trial).where(Trial.state == TrialState.done))}
    trials = [e for e in log if e["kind"] == "trial"]
    assert {e["trial_id"] for e in trials} == done and len(trials) == 2
    assert all(e["principal"] == "ana" and e["sweep_id"] == sid for e in log)
    # Each trial's entry carries what the ledger charged it; together, the grid's ε.
    assert sum(e["epsilon"] for e in trials) == pytest.approx(key["epsilon_used"], rel=1e-9)
    # Each model kept (a better one may replace the grid's first) is logged after its trial;
    # the last one logged is the one kept now.
    from sweeper.store import ModelArtifact

    models = [e for e in log if e["kind"] == "model"]
    position = {(e["kind"], e["trial_id"]): i for i, e in enumerate(log)}
    assert models and all(
        position[("trial", m["trial_id"])] < position[("model", m["trial_id"])] for m in models
    )
    with Session(engine) as s:
        (kept,) = s.scalars(sa.select(ModelArtifact.trial_id))
    assert models[-1]["trial_id"] == kept
    assert [e["id"] for e in log] == sorted(e["id"] for e in log)
    # The analyst's sweep shows their own spending, not the records' total (which would
    # tell them what others spent): the owner spends on the same records meanwhile.
    from sweeper.sweeps.summary import summarize

    create_sweep(engine, _spec(ds, budgets=[1]), owner="olga")
    life = summarize(engine, sid)["privacy"]["dataset_lifetime"]
    assert life["scope"] == "analyst" and life["epsilon_cap"] == 5
    assert life["epsilon_spent"] == pytest.approx(key["epsilon_used"], rel=1e-9)
    assert life["epsilon_reserved"] == 0
    # An analyst reads their own entries; someone else none.
    assert read_log(engine, view_key(engine, ds), principal="ana", everyone=False) == log
    assert read_log(engine, view_key(engine, ds), principal="mallory", everyone=False) == []
    engine.dispose()


def test_revocation_mid_sweep_lets_running_trials_finish_and_starts_nothing(
    local_ray: Any, tmp_path: Path
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    upgrade(str(engine.url))
    ds = _upload(engine, tmp_path)
    grants.grant(engine, ds, "ana", epsilon_allowance=10, viewer=OWNER, confirm=True)
    spec = _spec(ds, budgets=[2], n_lr=3)
    spec["seeds"] = 2  # 6 trials, one at a time
    sid = create_sweep(engine, spec, owner="ana")
    revoked: list[int] = []

    def on_progress(snap: Any) -> None:
        # As soon as the first trial has finished, the owner revokes the grant.
        if not revoked and snap.counts.get("done", 0) >= 1:
            grants.revoke(engine, ds, "ana", viewer=OWNER)
            revoked.append(snap.counts.get("done", 0))

    settings = SweeperSettings(max_pack_size=1)
    out = run_sweep(engine, sid, settings=settings, workers=1, on_progress=on_progress)
    assert revoked and out.state == "cancelled"
    with Session(engine) as s:
        trials = list(s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)))
        sweep = s.get(Sweep, sid)
        assert sweep is not None and "revoked" in (sweep.error or "")
    ran = [t for t in trials if t.attempts > 0]
    stopped = [t for t in trials if t.state == TrialState.cancelled]
    assert stopped and all(t.attempts == 0 and "revoked" in (t.error or "") for t in stopped)
    # What ran finished and stays charged; nothing started after the revocation.
    assert all(t.state == TrialState.done for t in ran)
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger

    with Session(engine) as s:
        key = s.scalar(sa.select(Sweep.ledger_key).where(Sweep.id == sid))
    bal = BudgetLedger(engine).sweep_balance(str(key), sweep_id=sid)
    assert bal.epsilon_outstanding == 0 and bal.epsilon_charged > 0
    assert grants.list_grants(engine, ds, OWNER)[0]["epsilon_used"] == pytest.approx(
        float(bal.epsilon_charged)
    )
    engine.dispose()


def test_an_analyst_refused_by_the_cap_learns_no_totals(engine: Any, tmp_path: Path) -> None:
    from sweeper.privacy.ledger.errors import BudgetExhausted

    ds = _upload(engine, tmp_path, cap=3.0)
    create_sweep(engine, _spec(ds, budgets=[2]), owner="olga")  # the owner spends first
    grants.grant(engine, ds, "ana", epsilon_allowance=10, viewer=OWNER, confirm=True)
    with pytest.raises(BudgetExhausted) as exc:
        create_sweep(engine, _spec(ds, budgets=[2]), owner="ana")
    assert not isinstance(exc.value, AllowanceExhausted)
    text = str(exc.value)
    # Neither what the owner spent nor what remains: only that it does not fit.
    assert "ask its owner" in text and "spent" not in text and "remains of the" in text
    assert not any(ch.isdigit() for ch in text.split("lifetime cap")[1])
    # An owner with no modes for analysts means none, not the defaults.
    grants.set_policy(engine, ds, OWNER, analyst_eval_modes=[])
    terms = grants.analyst_terms(engine, ds, "ana")
    assert terms is not None and terms.eval_modes == ()


def test_a_dataset_is_granted_once_its_owner_declared_what_sizes_an_analysts_plan(
    engine: Any, tmp_path: Path
) -> None:
    """Counted from the records, N and the class list would tell analysts how many records
    there are and which classes occur: undeclared, no grant is made."""
    ds = _upload(engine, tmp_path, declare=False)
    with pytest.raises(IllegalState) as refused:
        grants.grant(engine, ds, "ana", epsilon_allowance=1, viewer=OWNER, confirm=True)
    for how in ("n_examples, classes, input_shape", "declare_counted", "--declare-counted"):
        assert how in str(refused.value)
    assert grants.list_grants(engine, ds, OWNER) == []
    # Declared by value (N need not be the count), the grant is made.
    grants.set_policy(
        engine, ds, OWNER, view={"n_examples": 100, "classes": ["0", "1"], "input_shape": [4]}
    )
    assert grants.grant(engine, ds, "ana", epsilon_allowance=1, viewer=OWNER, confirm=True)[
        "active"
    ]
