"""Datasets as the API and the dashboard show them: descriptions, lists, budgets and caps.

A dataset's budget is that of its records (its identity, :mod:`sweeper.datasets.identity`):
every name of the same records shows the same totals and the same caps.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DatasetNotFound, PermissionDenied
from sweeper.datasets.access import Viewer
from sweeper.datasets.files import builtin_description
from sweeper.datasets.identity import content_identity, view_key
from sweeper.datasets.names import BUILTIN, UPLOAD_PREFIX, in_catalog, is_upload
from sweeper.privacy.charges import EXACT, exact_sum
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.keys import identity_key
from sweeper.privacy.ledger.rows import EntryKind
from sweeper.store import Dataset, Sweep, iso


def _stored_file(row: Dataset) -> dict[str, Any]:
    """An upload or a registered file as the API shows it (never its path on the server)."""
    cfg = dict(row.config or {})
    return {
        "id": row.name,
        "name": row.label or row.name,
        "kind": "upload" if is_upload(row.name) else "registered",
        "format": row.format,
        "owner": row.owner,
        "size_bytes": row.size_bytes,
        "sha256": row.sha256,
        "label_column": cfg.get("label_column"),
        "created_at": iso(row.created_at),
        "n_examples": row.n_examples,
        "n_train": cfg.get("n_train"),
        "input_shape": cfg.get("input_shape"),
        "num_classes": cfg.get("num_classes"),
        "kind_of_data": cfg.get("kind"),
    }


def describe(engine: Engine, dataset_id: str, viewer: Viewer) -> dict[str, Any]:
    """One dataset as the API shows it.

    Raises:
        DatasetNotFound: no such dataset, or one the viewer may not see.
    """
    if dataset_id in BUILTIN:
        return builtin_description(dataset_id)
    if in_catalog(dataset_id):
        # Uploads, and names registered by the operator (no owner: admins see them).
        with Session(engine) as session:
            row = session.scalars(select(Dataset).where(Dataset.name == dataset_id)).first()
            if row is not None and row.storage_path and viewer.sees(row.owner):
                return _stored_file(row)
    raise DatasetNotFound(f"no dataset {dataset_id!r}; GET /api/v1/datasets lists yours")


def list_datasets(engine: Engine, viewer: Viewer) -> list[dict[str, Any]]:
    """The built-in sets, then the viewer's uploads (everyone's for admins), newest first."""
    out = [builtin_description(n) for n in BUILTIN]
    with Session(engine) as session:
        stmt = select(Dataset).where(Dataset.name.like(f"{UPLOAD_PREFIX}%"))
        if not (viewer.admin or viewer.owner is None):
            stmt = stmt.where(Dataset.owner == viewer.owner)
        out.extend(
            _stored_file(r) for r in session.scalars(stmt.order_by(Dataset.created_at.desc()))
        )
    ledger = BudgetLedger(engine)
    for d in out:
        # One small read per dataset: the dashboard shows every set's budget bar. The bar is
        # the identity's: names of the same records show the same bar.
        s = ledger.summary(view_key(engine, d["id"]))
        d["budget"] = {
            "epsilon_cap": _num(s.epsilon_cap),
            "delta_cap": _num(s.delta_cap),
            "epsilon_committed": float(s.epsilon_spent),
            "epsilon_reserved": float(s.epsilon_reserved),
            "epsilon_remaining": _num(s.remaining.epsilon),
        }
    return out


def _num(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def _left_of(acc: dict[str, Decimal], reserved: str, charged: str, released: str) -> Decimal:
    """What a sweep still holds: reserved - charged - released, exactly."""
    return EXACT.subtract(acc[reserved], exact_sum((acc[charged], acc[released])))


def budget(engine: Engine, dataset_id: str, viewer: Viewer) -> dict[str, Any]:
    """A dataset's lifetime budget: caps, committed (charged), reserved, remaining, and the
    sweeps that spent or reserved it (only the viewer's own, unless an admin).

    The budget is that of the dataset's records (its identity): every name of the same
    records shows the same totals, and the sweeps of all of them.

    Raises:
        DatasetNotFound: no such dataset, or one the viewer may not see.
    """
    describe(engine, dataset_id, viewer)  # existence and visibility
    key = view_key(engine, dataset_id)
    ledger = BudgetLedger(engine)
    s = ledger.summary(key)
    rem = s.remaining
    per_sweep: dict[str, dict[str, Decimal]] = {}
    for e in ledger.entries(key):
        acc = per_sweep.setdefault(
            e.sweep_id,
            {k: Decimal(0) for k in ("er", "ec", "erel", "dr", "dc", "drel")},
        )
        # Exact sums (the ledger's own context): Decimal's default 28 digits would round, and
        # a fully released sweep would show -7e-26 reserved.
        e_key, d_key = {
            EntryKind.RESERVE: ("er", "dr"),
            EntryKind.CHARGE: ("ec", "dc"),
        }.get(e.kind, ("erel", "drel"))
        acc[e_key] = exact_sum((acc[e_key], e.epsilon))
        acc[d_key] = exact_sum((acc[d_key], e.delta))
    sweeps = []
    with Session(engine) as session:
        rows = {
            r.id: r for r in session.scalars(select(Sweep).where(Sweep.id.in_(list(per_sweep))))
        }
    for sid, acc in per_sweep.items():
        row = rows.get(sid)
        if row is None or not viewer.sees(row.owner):
            continue
        sweeps.append(
            {
                "sweep": sid,
                "name": row.name,
                "state": row.state.value,
                "epsilon_charged": float(acc["ec"]),
                "epsilon_reserved": float(
                    EXACT.subtract(acc["er"], exact_sum((acc["ec"], acc["erel"])))
                ),
                "delta_charged": float(acc["dc"]),
                "delta_reserved": float(
                    EXACT.subtract(acc["dr"], exact_sum((acc["dc"], acc["drel"])))
                ),
            }
        )
    return {
        "dataset": dataset_id,
        "epsilon_cap": _num(s.epsilon_cap),
        "delta_cap": _num(s.delta_cap),
        "epsilon_committed": float(s.epsilon_spent),
        "delta_committed": float(s.delta_spent),
        "epsilon_reserved": float(s.epsilon_reserved),
        "delta_reserved": float(s.delta_reserved),
        "epsilon_remaining": _num(rem.epsilon),
        "delta_remaining": _num(rem.delta),
        "sweeps": sweeps,
    }


def set_caps(
    engine: Engine,
    dataset_id: str,
    viewer: Viewer,
    *,
    epsilon_cap: float | None,
    delta_cap: float | None,
) -> dict[str, Any]:
    """Set an upload's lifetime caps (its owner or an admin), or a built-in's (admins only).

    The caps are those of the dataset's records: they apply to every name of the same
    records. So a user may set them only if every such name is an upload of their own; the
    records of anyone else's dataset are capped by an admin (a re-upload must not be a way
    to lift someone else's cap).

    Raises:
        DatasetNotFound: not visible to the viewer.
        PermissionDenied: a built-in, or records that other datasets share, set by a non-admin.
        ConfigError: a cap below what is committed.
    """
    describe(engine, dataset_id, viewer)
    admin = viewer.admin or viewer.owner is None
    if dataset_id in BUILTIN and not admin:
        raise PermissionDenied(
            f"the budget of the shared dataset {dataset_id!r} is set by an admin"
        )
    content = content_identity(engine, dataset_id)
    if not admin:
        with Session(engine) as session:
            owners = set(
                session.scalars(select(Dataset.owner).where(Dataset.content_sha256 == content))
            )
        if owners != {viewer.owner}:
            raise PermissionDenied(
                f"the records of dataset {dataset_id!r} are also another dataset's; their "
                "lifetime budget is set by an admin"
            )
    try:
        BudgetLedger(engine).set_cap(
            identity_key(content), epsilon_cap=epsilon_cap, delta_cap=delta_cap
        )
    except ConfigError as exc:
        raise ConfigError(f"{dataset_id}: {exc}", field=exc.field) from None
    return budget(engine, dataset_id, viewer)
