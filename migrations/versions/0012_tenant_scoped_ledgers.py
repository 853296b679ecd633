"""tenant-scoped ledgers: a tenant's uploads get a ledger of their own per content identity

Ledgers were keyed by the records' identity alone (``sha256:<hex>``), so a tenant who
uploaded a *guess* of another tenant's records joined that tenant's ledger: they read its
caps and spending (a membership test at no ε) and could lower its cap. Now a name with an
owner (a tenant's upload) is charged on ``sha256:<hex>/<owner>``; names without one
(built-ins, the operator's registered names, local use) keep ``sha256:<hex>``.

Every entry on a shared identity ledger moves, whole and once, to the ledger of the scope its
sweep (or audit, or ``dpsweep train`` run) belongs to: the owner of the name it was made on.
An entry whose name is gone goes by its reserving principal when that is one of the owners,
else to the unowned ledger when one exists, else to the first uploader's. Its sweep's totals
row, its release-log records and the sweep's ``ledger_key`` move with it; every ledger's
running totals are then recomputed from its entries. Each new ledger takes the old one's caps
(the stricter reading: no cap is lifted, even one another tenant lowered). Nothing is merged:
ledgers only split.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 19:00:00
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import Any

import sqlalchemy as sa
from alembic import op

from sweeper.store.types import ExactDecimal

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_S = sa.String()
DATASETS = sa.table(
    "datasets",
    sa.column("name", _S),
    sa.column("owner", _S),
    sa.column("content_sha256", _S),
    sa.column("created_at", sa.DateTime(timezone=True)),
)
SWEEPS = sa.table(
    "sweeps", sa.column("id", _S), sa.column("dataset", _S), sa.column("ledger_key", _S)
)
AUDITS = sa.table("audits", sa.column("id", _S), sa.column("dataset", _S))
BUDGETS = sa.table(
    "dataset_budgets",
    sa.column("dataset", _S),
    *(
        sa.column(f"{q}_{f}", ExactDecimal())
        for q in ("epsilon", "delta")
        for f in ("cap", "spent", "reserved")
    ),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("updated_at", sa.DateTime(timezone=True)),
)
ENTRIES = sa.table(
    "budget_ledger_entries",
    sa.column("id", sa.Integer()),
    sa.column("dataset", _S),
    sa.column("sweep_id", _S),
    sa.column("kind", _S),
    sa.column("epsilon", ExactDecimal()),
    sa.column("delta", ExactDecimal()),
    sa.column("principal", _S),
    sa.column("note", sa.Text()),
)
TOTALS = sa.table("ledger_sweep_totals", sa.column("dataset", _S), sa.column("sweep_id", _S))
RELEASES = sa.table("release_records", sa.column("dataset", _S), sa.column("sweep_id", _S))

# How `dpsweep train` and the audit named their dataset in an entry's note.
_NOTE_NAME = re.compile(r" on '([^']+)'")


def upgrade() -> None:
    bind = op.get_bind()
    owned = bind.execute(
        sa.select(DATASETS.c.content_sha256)
        .where(DATASETS.c.owner.is_not(None), DATASETS.c.content_sha256.is_not(None))
        .distinct()
    ).scalars()
    contents = sorted(set(owned))
    if not contents:
        return
    _drop_append_only(bind)
    for content in contents:
        _split(bind, content)
    _restore_append_only(bind)


def _split(bind: Any, content: str) -> None:
    """Split the ledger of one identity by the owners of its names."""
    old = f"sha256:{content}"
    names = bind.execute(
        sa.select(DATASETS.c.name, DATASETS.c.owner)
        .where(DATASETS.c.content_sha256 == content)
        .order_by(DATASETS.c.created_at, DATASETS.c.name)
    ).all()
    scope_of_name: dict[str, str | None] = {n: o for n, o in names}
    owners = [o for _, o in names if o is not None]
    unowned = any(o is None for _, o in names)
    fallback = None if unowned else owners[0]

    # Every sweep's sweep_id (and trial-less audits and trains) on the old ledger, with the
    # scope it belongs to.
    entries = bind.execute(
        sa.select(ENTRIES.c.sweep_id, ENTRIES.c.kind, ENTRIES.c.principal, ENTRIES.c.note).where(
            ENTRIES.c.dataset == old
        )
    ).all()
    by_sweep: dict[str, list[Any]] = defaultdict(list)
    for e in entries:
        by_sweep[e.sweep_id].append(e)
    sweep_names = dict(
        bind.execute(
            sa.select(SWEEPS.c.id, SWEEPS.c.dataset).where(SWEEPS.c.ledger_key == old)
        ).all()
    )
    audit_names = dict(bind.execute(sa.select(AUDITS.c.id, AUDITS.c.dataset)).all())
    moves: dict[str, str] = {}  # sweep id -> new key
    for sweep_id in set(by_sweep) | set(sweep_names):
        name = sweep_names.get(sweep_id)
        if name is None and sweep_id.startswith("audit_"):
            name = audit_names.get(sweep_id.removeprefix("audit_"))
        if name is None:
            name = next(
                (m.group(1) for e in by_sweep[sweep_id] if (m := _NOTE_NAME.search(e.note or ""))),
                None,
            )
        if name is not None and name in scope_of_name:
            scope = scope_of_name[name]
        else:
            principals = {e.principal for e in by_sweep[sweep_id] if e.kind == "reserve"}
            scope = next((o for o in owners if o in principals), fallback)
        if scope is not None:
            moves[sweep_id] = f"{old}/{scope}"
    budget = bind.execute(sa.select(BUDGETS).where(BUDGETS.c.dataset == old)).first()
    targets = {f"{old}/{o}" for o in owners}
    for key in sorted(targets):
        if bind.execute(sa.select(BUDGETS.c.dataset).where(BUDGETS.c.dataset == key)).first():
            continue
        now = datetime.now(UTC)
        zero = Decimal(0)
        bind.execute(
            BUDGETS.insert().values(
                dataset=key,
                epsilon_cap=budget.epsilon_cap if budget is not None else None,
                delta_cap=budget.delta_cap if budget is not None else None,
                epsilon_spent=zero,
                delta_spent=zero,
                epsilon_reserved=zero,
                delta_reserved=zero,
                created_at=now,
                updated_at=now,
            )
        )
    for sweep_id, key in sorted(moves.items()):
        for table in (ENTRIES, TOTALS, RELEASES):
            bind.execute(
                table.update()
                .where(table.c.dataset == old, table.c.sweep_id == sweep_id)
                .values(dataset=key)
            )
        bind.execute(
            SWEEPS.update()
            .where(SWEEPS.c.id == sweep_id, SWEEPS.c.ledger_key == old)
            .values(ledger_key=key)
        )
    for key in sorted(targets | {old}):
        _recompute_totals(bind, key)
    left = bind.execute(sa.select(ENTRIES.c.id).where(ENTRIES.c.dataset == old).limit(1)).first()
    if budget is not None and not unowned and left is None:
        # No name reads the old ledger any more and nothing is recorded on it.
        bind.execute(TOTALS.delete().where(TOTALS.c.dataset == old))
        bind.execute(BUDGETS.delete().where(BUDGETS.c.dataset == old))


def _recompute_totals(bind: Any, key: str) -> None:
    """A ledger's cached spent and reserved, from its entries (exact sums)."""
    sums = {
        (q, k): Decimal(0) for q in ("epsilon", "delta") for k in ("reserve", "charge", "release")
    }
    with localcontext() as ctx:
        ctx.prec = 200  # exact: every amount is a short decimal
        for kind, eps, dlt in bind.execute(
            sa.select(ENTRIES.c.kind, ENTRIES.c.epsilon, ENTRIES.c.delta).where(
                ENTRIES.c.dataset == key
            )
        ):
            sums["epsilon", kind] += Decimal(eps)
            sums["delta", kind] += Decimal(dlt)
        values = {f"{q}_spent": sums[q, "charge"] for q in ("epsilon", "delta")} | {
            f"{q}_reserved": sums[q, "reserve"] - sums[q, "charge"] - sums[q, "release"]
            for q in ("epsilon", "delta")
        }
    bind.execute(BUDGETS.update().where(BUDGETS.c.dataset == key).values(**values))


_APPEND_ONLY = "release_records is append-only: the audit log of releases cannot be changed"


def _drop_append_only(bind: Any) -> None:
    """Lift the release log's append-only triggers for this migration's re-keying only."""
    if bind.dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS release_records_no_update")
    elif bind.dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS release_records_append_only ON release_records")


def _restore_append_only(bind: Any) -> None:
    if bind.dialect.name == "sqlite":
        op.execute(
            "CREATE TRIGGER release_records_no_update BEFORE UPDATE ON release_records "
            f"BEGIN SELECT RAISE(ABORT, '{_APPEND_ONLY}'); END"
        )
    elif bind.dialect.name == "postgresql":
        op.execute(
            "CREATE TRIGGER release_records_append_only BEFORE UPDATE OR DELETE OR TRUNCATE "
            "ON release_records FOR EACH STATEMENT EXECUTE FUNCTION release_records_append_only()"
        )


def downgrade() -> None:
    # Merging the tenants' ledgers back would re-open the channel this revision closes; the
    # keys stay as they are (older code reads a scoped key as an unknown, empty ledger).
    pass
