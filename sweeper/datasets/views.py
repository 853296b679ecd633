"""Datasets as the API and the dashboard show them: descriptions, lists, budgets and caps.

A dataset's budget is that of its records (its identity, :mod:`sweeper.datasets.identity`):
every name of the same records shows the same totals and the same caps.

A built-in set is shared by every tenant, so its totals are everyone's: a tenant (not an
admin, not local use) sees its figures as their own spending only (:func:`own_spending`,
``scope: "yours"``), never the totals, which would tell them what other tenants did. Admins
and local use see the records' totals (``scope: "records"``).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, or_, select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DatasetNotFound, PermissionDenied
from sweeper.datasets.access import Viewer
from sweeper.datasets.analyst_views import (
    ANALYST,
    analyst_datasets,
    analyst_description,
    latest_grant,
    owner_fields,
)
from sweeper.datasets.budget_rows import budget_rows
from sweeper.datasets.files import builtin_description
from sweeper.datasets.fixed_view import view_of
from sweeper.datasets.identity import ledger_key_of, owner_of, view_key
from sweeper.datasets.names import BUILTIN, in_catalog, is_upload
from sweeper.datasets.privacy_units import unit_fields
from sweeper.privacy.ledger.amounts import ZERO, add_exact
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.records import BudgetSummary, SweepBalance
from sweeper.privacy.ledger.rows import EntryKind, LedgerEntry, SweepTotals
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
        # The owner's unit and counted number of units (never rows per unit, to anyone).
        **unit_fields(view_of(row)),
        # A registered file its owner declared public (usable as eval.dataset).
        **({} if is_upload(row.name) else {"public": bool(cfg.get("public", False))}),
    }


def describe(engine: Engine, dataset_id: str, viewer: Viewer) -> dict[str, Any]:
    """One dataset as the API shows it: in full to its owner (and admins), its public
    description and their allowance to its analysts
    (:func:`sweeper.datasets.analyst_views.analyst_description`).

    Raises:
        DatasetNotFound: no such dataset, or one the viewer may not see.
    """
    if dataset_id in BUILTIN:
        return builtin_description(dataset_id)
    if in_catalog(dataset_id):
        # Uploads, and names registered by the operator (no owner: admins see them).
        with Session(engine) as session:
            row = session.scalars(select(Dataset).where(Dataset.name == dataset_id)).first()
            g = None
            if row is not None and row.storage_path:
                if viewer.sees(row.owner):
                    return _stored_file(row) | owner_fields(session, [row])[row.name]
                g = latest_grant(session, row.name, viewer.owner) if viewer.owner else None
                if g is not None:
                    session.expunge_all()
        if row is not None and g is not None:
            # Outside the session: the allowance reads the ledger in sessions of its own (on
            # SQLite a second writer's BEGIN would wait on this one).
            return analyst_description(engine, row, g)
    raise DatasetNotFound(f"no dataset {dataset_id!r}; GET /api/v1/datasets lists yours")


def tenant_of(viewer: Viewer) -> str | None:
    """The tenant whose own figures the viewer sees of shared records (None: an admin or
    local use, who see the records' totals)."""
    return None if viewer.admin or viewer.owner is None else viewer.owner


def own_spending(engine: Engine, key: str, tenant: str) -> BudgetSummary:
    """The records' caps with only ``tenant``'s own figures: what their sweeps were charged
    on the records of ``key``, and what they still hold reserved (reserved less charged and
    released), exact. Deleted sweeps count (the ledger keeps their entries and totals).

    The caps are the operator's settings; the figures of everyone else never enter.
    """
    theirs = (
        select(LedgerEntry.sweep_id)
        .where(
            LedgerEntry.dataset == key,
            LedgerEntry.kind == EntryKind.RESERVE,
            or_(
                LedgerEntry.principal == tenant,
                # Entries from before principals were recorded: the sweep's owner says.
                LedgerEntry.sweep_id.in_(select(Sweep.id).where(Sweep.owner == tenant)),
            ),
        )
        .distinct()
    )
    caps = BudgetLedger(engine).summary(key)
    e_spent, d_spent, e_held, d_held = ZERO, ZERO, ZERO, ZERO
    with Session(engine) as session:
        for t in session.scalars(
            select(SweepTotals).where(SweepTotals.dataset == key, SweepTotals.sweep_id.in_(theirs))
        ):
            b = SweepBalance(
                key,
                t.sweep_id,
                epsilon_reserved=t.epsilon_reserved,
                delta_reserved=t.delta_reserved,
                epsilon_charged=t.epsilon_charged,
                delta_charged=t.delta_charged,
                epsilon_released=t.epsilon_released,
                delta_released=t.delta_released,
            )
            e_spent = add_exact(e_spent, b.epsilon_charged)
            d_spent = add_exact(d_spent, b.delta_charged)
            e_held = add_exact(e_held, max(b.epsilon_outstanding, ZERO))
            d_held = add_exact(d_held, max(b.delta_outstanding, ZERO))
    return BudgetSummary(key, caps.epsilon_cap, caps.delta_cap, e_spent, d_spent, e_held, d_held)


def _budget_summary(engine: Engine, dataset_id: str, viewer: Viewer) -> tuple[BudgetSummary, str]:
    """The figures a viewer sees of a (visible, non-analyst) dataset's budget, and their
    scope: ``records`` (the records' totals) or ``yours`` (a tenant on a built-in set)."""
    key = view_key(engine, dataset_id)
    tenant = tenant_of(viewer)
    if dataset_id in BUILTIN and tenant is not None:
        return own_spending(engine, key, tenant), "yours"
    return BudgetLedger(engine).summary(key), "records"


def list_datasets(engine: Engine, viewer: Viewer) -> list[dict[str, Any]]:
    """The built-in sets, then the viewer's stored files (uploads and registered names;
    everyone's for admins and local use), newest first, then the datasets of others the
    viewer is an analyst of (their public description and allowance, no budget: the records'
    totals include others' spending).

    A registered name is listed to whoever owns it: the operator's (registered without
    ``--owner``) to admins and local use, a tenant's (``--owner NAME``) to that tenant too.
    """
    out = [builtin_description(n) for n in BUILTIN]
    with Session(engine) as session:
        # A stored file has a path on the server: uploads and registered names. Names that
        # sweeps stored (csv:PATH, built-ins) have none and are not datasets of anyone's.
        stmt = select(Dataset).where(Dataset.storage_path.is_not(None))
        if not (viewer.admin or viewer.owner is None):
            stmt = stmt.where(Dataset.owner == viewer.owner)
        rows = list(session.scalars(stmt.order_by(Dataset.created_at.desc())))
        extra = owner_fields(session, rows)
        out.extend(_stored_file(r) | extra[r.name] for r in rows)
    for d in out:
        # One small read per dataset: the dashboard shows every set's budget bar. The bar is
        # the identity's: names of the same records show the same bar (a built-in's is the
        # tenant's own spending).
        s, scope = _budget_summary(engine, d["id"], viewer)
        d["budget"] = {
            "epsilon_cap": _num(s.epsilon_cap),
            "delta_cap": _num(s.delta_cap),
            "epsilon_committed": float(s.epsilon_spent),
            "epsilon_reserved": float(s.epsilon_reserved),
            "epsilon_remaining": _num(s.remaining.epsilon),
            "scope": scope,
        }
    return out + analyst_datasets(engine, viewer)


def _num(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def budget(engine: Engine, dataset_id: str, viewer: Viewer) -> dict[str, Any]:
    """A dataset's lifetime budget: caps, committed (charged), reserved, remaining, and the
    sweeps that spent or reserved it (the viewer's own and their analysts', unless an admin).

    The budget is that of the dataset's records (its identity): every name of the same
    records shows the same totals, and the sweeps of all of them.

    An analyst of the dataset gets their allowance instead (allowed, used, left, active) and
    their own sweeps: the lifetime totals include the owner's and other analysts' spending.
    A tenant reading a built-in set gets their own figures (``scope: "yours"``): committed
    and reserved by their sweeps, and what the cap leaves after them (others' spending may
    leave less; a reservation past the cap is refused).

    Raises:
        DatasetNotFound: no such dataset, or one the viewer may not see.
    """
    desc = describe(engine, dataset_id, viewer)  # existence and visibility
    key = view_key(engine, dataset_id)
    if desc.get("role") == ANALYST:
        return {
            "dataset": dataset_id,
            "role": ANALYST,
            **desc["allowance"],
            "sweeps": budget_rows(engine, key, viewer, own_only=True),
        }
    s, scope = _budget_summary(engine, dataset_id, viewer)
    rem = s.remaining
    return {
        "dataset": dataset_id,
        "scope": scope,
        "epsilon_cap": _num(s.epsilon_cap),
        "delta_cap": _num(s.delta_cap),
        "epsilon_committed": float(s.epsilon_spent),
        "delta_committed": float(s.delta_spent),
        "epsilon_reserved": float(s.epsilon_reserved),
        "delta_reserved": float(s.delta_reserved),
        "epsilon_remaining": _num(rem.epsilon),
        "delta_remaining": _num(rem.delta),
        "sweeps": budget_rows(engine, key, viewer, own_only=scope == "yours"),
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

    The caps are those of the owner's ledger of the records (:mod:`sweeper.datasets.identity`):
    they apply to every name of the same records *of the same owner*, and to nobody else's.
    Another tenant's upload of the same records has a ledger of its own, so nothing here
    depends on, or says, whether other tenants hold equal records.

    Raises:
        DatasetNotFound: not visible to the viewer.
        PermissionDenied: a built-in set by a non-admin, or a dataset the viewer is only an
            analyst of.
        ConfigError: a cap below what is committed.
    """
    describe(engine, dataset_id, viewer)
    admin = viewer.admin or viewer.owner is None
    if dataset_id in BUILTIN and not admin:
        raise PermissionDenied(
            f"the budget of the shared dataset {dataset_id!r} is set by an admin"
        )
    if not admin and owner_of(engine, dataset_id) != viewer.owner:
        raise PermissionDenied(
            f"the lifetime budget of dataset {dataset_id!r} is set by its owner; ask them"
        )
    key = ledger_key_of(engine, dataset_id)
    try:
        BudgetLedger(engine).set_cap(key, epsilon_cap=epsilon_cap, delta_cap=delta_cap)
    except ConfigError as exc:
        raise ConfigError(f"{dataset_id}: {exc}", field=exc.field) from None
    return budget(engine, dataset_id, viewer)
