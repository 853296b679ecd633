"""The rows of a dataset's budget: every run that reserved or spent ε on its ledger.

A ledger's entries belong to runs: sweeps (their id), canary audits (``audit_<id>``) and
one-off ``dpsweep train`` runs (``train_<id>``). Every one of them is a row, so the rows of a
ledger add up to what it has committed: an audit or a train charged and left out would be ε
spent that nobody could attribute. A sweep whose rows were deleted keeps its row too (the
ledger keeps its entries): ``state: "deleted"``, its owner the tenant that reserved.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from sweeper.datasets.grants import sees_sweep
from sweeper.datasets.viewer import Viewer
from sweeper.privacy.charges import EXACT, exact_sum
from sweeper.privacy.ledger.rows import EntryKind, LedgerEntry
from sweeper.store import Audit, Sweep

#: How a run's ledger id starts when it is not a sweep's (see the module docstring).
AUDIT_PREFIX, TRAIN_PREFIX = "audit_", "train_"

_FIELDS = ("er", "ec", "erel", "dr", "dc", "drel")


def _per_run(session: Session, key: str) -> dict[str, dict[str, Any]]:
    """Per run with entries on ``key``: its reserved, charged and released ε and δ (exact),
    and who reserved (the entries' principal)."""
    per_run: dict[str, dict[str, Any]] = {}
    for e in session.scalars(
        select(LedgerEntry).where(LedgerEntry.dataset == key).order_by(LedgerEntry.id)
    ):
        acc = per_run.setdefault(
            e.sweep_id, {**{k: Decimal(0) for k in _FIELDS}, "principal": None}
        )
        # Exact sums (the ledger's own context): Decimal's default 28 digits would round, and
        # a fully released sweep would show -7e-26 reserved.
        e_key, d_key = {
            EntryKind.RESERVE: ("er", "dr"),
            EntryKind.CHARGE: ("ec", "dc"),
        }.get(EntryKind(e.kind), ("erel", "drel"))
        acc[e_key] = exact_sum((acc[e_key], e.epsilon))
        acc[d_key] = exact_sum((acc[d_key], e.delta))
        if e.kind == EntryKind.RESERVE and e.principal is not None:
            acc["principal"] = e.principal
    return per_run


def _left_of(acc: dict[str, Any], reserved: str, charged: str, released: str) -> Decimal:
    """What a run still holds: reserved - charged - released, exactly."""
    return EXACT.subtract(acc[reserved], exact_sum((acc[charged], acc[released])))


def _describe(session: Session, run_id: str, acc: dict[str, Any]) -> dict[str, Any]:
    """A run's kind, name, state, owner and dataset name (None where unknown)."""
    sweep = session.get(Sweep, run_id)
    if sweep is not None:
        return {
            "kind": "sweep",
            "name": sweep.name,
            "state": sweep.state.value,
            "owner": sweep.owner,
            "dataset": sweep.dataset,
        }
    if run_id.startswith(AUDIT_PREFIX):
        audit = session.get(Audit, run_id.removeprefix(AUDIT_PREFIX))
        return {
            "kind": "audit",
            "name": "canary audit",
            "state": audit.state.value if audit is not None else "deleted",
            "owner": audit.owner if audit is not None else acc["principal"],
            "dataset": audit.dataset if audit is not None else None,
        }
    if run_id.startswith(TRAIN_PREFIX):
        return {"kind": "train", "name": "dpsweep train", "state": "done", "owner": None}
    return {"kind": "sweep", "name": None, "state": "deleted", "owner": acc["principal"]}


def budget_rows(
    engine: Engine, key: str, viewer: Viewer, *, own_only: bool
) -> list[dict[str, Any]]:
    """The runs that spent or reserved ε on ``key`` and that the viewer sees, in the order
    they first reserved: with ``own_only``, their own (an analyst's sweeps, a tenant's on a
    built-in set); otherwise (the dataset's owner, an admin) every run on the ledger but other
    tenants' sweeps the viewer may not see.

    Each row: ``sweep`` (the run's id on the ledger), ``kind`` (sweep, audit, train),
    ``name``, ``state``, ``owner``, and ε and δ charged and still reserved.
    """
    out = []
    with Session(engine) as session:
        for run_id, acc in _per_run(session, key).items():
            about = _describe(session, run_id, acc)
            dataset = about.pop("dataset", None)
            if own_only:
                if about["owner"] != viewer.owner:
                    continue
            elif (
                about["kind"] == "sweep"
                and dataset is not None
                and not sees_sweep(session, viewer, owner=about["owner"], dataset=dataset)
            ):
                continue
            out.append(
                {
                    "sweep": run_id,
                    **about,
                    "epsilon_charged": float(acc["ec"]),
                    "epsilon_reserved": float(_left_of(acc, "er", "ec", "erel")),
                    "delta_charged": float(acc["dc"]),
                    "delta_reserved": float(_left_of(acc, "dr", "dc", "drel")),
                }
            )
    return out
