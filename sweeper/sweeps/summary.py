"""A sweep's results as shown: the list of sweeps, the best per arm and level, the summary.

What `dpsweep show --json`, the API and the export return for a sweep. Every figure is computed
from the *released* records (:func:`sweeper.sweeps.released.released_records`), so a
papernot-steinke grid contributes its selected trial only, and its number of runs is never
counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from dpsweep.plan import SweepPlan
from dpsweep.plan_fields import SUMMARY, public_view
from dpsweep.spec import ArmConfig, randomness_label
from sweeper.datasets.grants import dataset_row
from sweeper.datasets.names import BUILTIN
from sweeper.datasets.views import own_spending
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.reservations import principal_totals
from sweeper.privacy.ledger.rows import EntryKind, LedgerEntry
from sweeper.privacy.releases import (
    analyst_lifetime_release,
    evaluation_statement,
    grid_releases,
    lifetime_release,
    sweep_release_of,
)
from sweeper.store import ApiToken, DatasetGrant, Sweep, TrialState, iso, sweep_ledger_key
from sweeper.store.model_refs import model_refs
from sweeper.sweeps.released import released_records
from sweeper.sweeps.results import (
    ArmLevelResult,
    best_per_arm_level,
    calibration_front,
    epsilon_front,
)
from sweeper.sweeps.stored import (
    grid_key,
    hidden_grids,
    load_sweep,
    randomness_fields,
    typed_spec,
)


def list_sweeps(engine: Engine, *, limit: int = 100) -> list[dict[str, Any]]:
    """The newest ``limit`` sweeps, as `dpsweep sweeps` lists them."""
    with Session(engine) as session:
        rows = session.scalars(select(Sweep).order_by(Sweep.created_at.desc()).limit(limit))
        return [
            {
                "id": s.id,
                "name": s.name,
                "dataset": s.dataset,
                # None: the operator's (made on the command line without --owner).
                "owner": s.owner,
                "state": s.state.value,
                "created_at": iso(s.created_at),
                "finished_at": iso(s.finished_at),
                "randomness": randomness_label(s.spec or {}),
            }
            for s in rows
        ]


@dataclass(frozen=True)
class SweepResults:
    """A sweep's released records, the best configuration per arm and level over them, and
    the objective they were ranked by."""

    results: list[ArmLevelResult]
    records: list[dict[str, Any]]
    metric: str
    mode: str


def sweep_results(sweep: Sweep) -> SweepResults:
    """The :class:`SweepResults` of a sweep loaded with :func:`load_sweep`."""
    objective = typed_spec(sweep).objective
    metric, mode = objective.metric, objective.mode
    records = released_records(sweep, metric=metric, mode=mode)
    return SweepResults(
        best_per_arm_level(records, metric=metric, mode=mode), records, metric, mode
    )


TENANT_COVERS = (
    "what this tenant's sweeps have spent on this shared built-in set (charged) and still hold "
    "(reserved), under its lifetime cap; what other tenants spent is not shown"
)


def _lifetime(engine: Engine, sweep: Sweep, key: str) -> dict[str, Any]:
    """The dataset-lifetime release shown with a sweep: the records' total for their owner's
    (and local, and admins') sweeps; for an analyst's sweep, only what that analyst spent and
    holds (the total would tell them what other analysts spent); for a tenant's sweep on a
    built-in set, which every tenant shares, only what that tenant spent and holds."""
    tenant = sweep.owner
    with Session(engine) as session:
        row = dataset_row(session, sweep.dataset)
        if tenant is not None and row is not None and row.owner != tenant:
            allowance = session.scalar(
                select(DatasetGrant.epsilon_allowance)
                .where(DatasetGrant.dataset == sweep.dataset, DatasetGrant.analyst == tenant)
                .order_by(DatasetGrant.created_at.desc())
                .limit(1)
            )
            # An analyst: of someone else's upload, or of a name an admin registered and
            # granted them.
            if row.owner is not None or allowance is not None:
                spent, reserved = principal_totals(session, key, tenant)
                return analyst_lifetime_release(spent=spent, reserved=reserved, allowance=allowance)
        shared = (
            tenant is not None
            and sweep.dataset in BUILTIN
            and (row is None or row.owner is None)  # a built-in's row only binds its identity
            # An admin's sweep shows the totals, as the admin's budget page does.
            and session.scalar(
                select(ApiToken.id).where(ApiToken.name == tenant, ApiToken.admin).limit(1)
            )
            is None
        )
    if shared:
        assert tenant is not None
        mine = own_spending(engine, key, tenant)
        return {
            "epsilon_spent": float(mine.epsilon_spent),
            "delta_spent": float(mine.delta_spent),
            "epsilon_reserved": float(mine.epsilon_reserved),
            "epsilon_cap": None if mine.epsilon_cap is None else float(mine.epsilon_cap),
            "covers": TENANT_COVERS,
            "scope": "tenant",
        }
    return lifetime_release(BudgetLedger(engine).summary(key))


def summarize(engine: Engine, sweep_id: str, *, sweep: Sweep | None = None) -> dict[str, Any]:
    """What `dpsweep show --json` and the API return for a sweep (``sweep``: already loaded
    with :func:`load_sweep`)."""
    sweep = sweep or load_sweep(engine, sweep_id)
    res = sweep_results(sweep)
    hidden = hidden_grids(sweep)
    counts = {s.value: 0 for s in TrialState}
    for t in sweep.trials:
        if grid_key(t.arm, t.epsilon_budget) not in hidden:
            counts[t.state.value] += 1
    key = sweep_ledger_key(sweep)
    balance = BudgetLedger(engine).sweep_balance(key, sweep_id=sweep.id)
    with Session(engine) as session:
        n_charges = session.scalar(
            select(func.count(LedgerEntry.id)).where(
                LedgerEntry.dataset == key,
                LedgerEntry.sweep_id == sweep.id,
                LedgerEntry.kind == EntryKind.CHARGE,
            )
        )
    efront = epsilon_front(res.results, mode=res.mode)
    cfront = calibration_front(res.records, metric=res.metric, mode=res.mode)
    plan = SweepPlan.from_stored(sweep.plan).grids
    # One epsilon per release, each saying what it covers (sweeper/privacy/releases.py). Grid and
    # sweep figures are public (planned from public quantities); the lifetime figure is the
    # ledger's, and the hash-derived ledger key itself is never shown. The sweep's figure is the
    # one the driver stored for this very plan (its key checked), else computed (seconds).
    privacy = {
        "grids": grid_releases(plan),
        "sweep": sweep_release_of(sweep),
        "dataset_lifetime": _lifetime(engine, sweep, key),
        "evaluation": evaluation_statement(plan),
    }
    return {
        "id": sweep.id,
        "name": sweep.name,
        "dataset": sweep.dataset,
        "state": sweep.state.value,
        "owner": sweep.owner,
        "error": sweep.error,
        "created_at": iso(sweep.created_at),
        "started_at": iso(sweep.started_at),
        "finished_at": iso(sweep.finished_at),
        **randomness_fields(sweep.spec),
        "objective": {"metric": res.metric, "mode": res.mode},
        "arms": [
            {"name": arm.label, "strategy": arm.strategy} | _grid_and_params(arm)
            for arm in typed_spec(sweep).arms
        ],
        # Each grid's public fields (dpsweep/plan_fields.py; its charge schedule and the
        # records' hash stay inside), the number of stored runs only where it is not secret.
        "plan": [public_view(g, SUMMARY, hide_count=g.grid in hidden) for g in plan],
        "trials": counts,
        "privacy": privacy,
        "budget": {
            "epsilon_reserved": float(balance.epsilon_reserved),
            "epsilon_charged": float(balance.epsilon_charged),
            "epsilon_released": float(balance.epsilon_released),
            "epsilon_outstanding": float(balance.epsilon_outstanding),
            "delta_reserved": float(balance.delta_reserved),
            "delta_charged": float(balance.delta_charged),
            "charges": int(n_charges or 0) if not hidden else None,
        },
        "results": [r.to_dict() for r in res.results],
        "pareto": {
            "epsilon": [
                {"x": p.x, "y": p.y, "arm": p.label, "dominated": p.dominated} for p in efront
            ],
            "calibration": [
                {
                    "x": p.x,
                    "y": p.y,
                    "arm": p.label,
                    "trial": p.payload["id"],
                    "dominated": p.dominated,
                }
                for p in cfront
            ],
        },
    }


# How the command line writes a kept model out (api/cli/models.py); DIR is the user's folder.
MODEL_COMMAND = "dpsweep model {trial} -o DIR"


def local_model_ref(trial_id: str, ref: dict[str, Any]) -> dict[str, Any]:
    """A trial listing's ``model`` field (:func:`sweeper.store.model_refs.model_ref`: its hash,
    size, reproducible flag and the API's download URLs) with the trial it belongs to and the
    command that writes it out locally, for the command line's outputs."""
    return {"trial": trial_id, **ref, "cli": MODEL_COMMAND.format(trial=trial_id)}


def trial_models(engine: Engine, records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The kept model of each released record that has one (:func:`local_model_ref`), by
    trial id; one query.

    Only ``records``' trials are looked up: the released records of a sweep
    (:func:`sweeper.sweeps.released.released_records`), so a papernot-steinke grid shows the
    model of its selected trial only, exactly the trials whose model its download route serves
    (:func:`sweeper.artifacts.reads.kept_model`).
    """
    with Session(engine) as session:
        refs = model_refs(session, [r["id"] for r in records])
    return {tid: local_model_ref(tid, ref) for tid, ref in refs.items()}


def kept_models(
    engine: Engine, res: SweepResults, refs: dict[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The released trials' kept models, one dict per model in grid order: the trial's arm,
    strategy, epsilon level and objective (all shown in its released record), and the model's
    reference (:func:`local_model_ref`; ``refs``: :func:`trial_models` of ``res.records``,
    read when not given), less the file's hash: a sweep's summary names no hash (the trial
    listings and the downloads' ETag carry it)."""
    refs = trial_models(engine, res.records) if refs is None else refs
    out = []
    for r in res.records:
        ref = refs.get(r["id"])
        if ref is None:
            continue
        value = (r.get("metrics") or {}).get(res.metric)
        if not isinstance(value, int | float) or not math.isfinite(value):
            value = None
        out.append(
            {
                "arm": r["arm"],
                "strategy": r["strategy"],
                "epsilon_budget": r["epsilon_budget"],
                "objective": value,
            }
            | {k: v for k, v in ref.items() if k != "sha256"}
        )
    return out


def show_summary(engine: Engine, sweep_id: str) -> dict[str, Any]:
    """What `dpsweep show --json` prints: :func:`summarize` plus ``models``, the released
    trials' kept models (:func:`kept_models`; an empty list when none is kept).

    The API's sweep summary leaves ``models`` out (its cache follows the sweep's events, and
    models are written without one); its trial list carries each trial's ``model``.
    """
    sweep = load_sweep(engine, sweep_id)
    summary = summarize(engine, sweep_id, sweep=sweep)
    return summary | {"models": kept_models(engine, sweep_results(sweep))}


def _grid_and_params(arm: ArmConfig) -> dict[str, Any]:
    """An arm's grid and params as stored (JSON; an axis as its mapping), copied out of the
    shared typed spec."""
    return arm.model_dump(mode="json", include={"grid", "params"})
