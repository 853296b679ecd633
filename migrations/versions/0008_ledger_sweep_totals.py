"""ledger sweep totals: one row of running totals per sweep and dataset

A charge used to sum every earlier entry of its sweep (each charge O(entries)); the totals
are now kept in ``ledger_sweep_totals``, updated in the same transaction as each entry, so a
charge reads one row. Existing entries are summed into it here.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 09:50:00
"""

from __future__ import annotations

from decimal import Decimal

import sqlalchemy as sa
from alembic import op

from sweeper.store.types import ExactDecimal

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

FIELDS = {"reserve": "reserved", "charge": "charged", "release": "released"}


def upgrade() -> None:
    op.create_table(
        "ledger_sweep_totals",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset", sa.String(length=200), nullable=False),
        sa.Column("sweep_id", sa.String(length=200), nullable=False),
        sa.Column("epsilon_reserved", ExactDecimal(), nullable=False),
        sa.Column("delta_reserved", ExactDecimal(), nullable=False),
        sa.Column("epsilon_charged", ExactDecimal(), nullable=False),
        sa.Column("delta_charged", ExactDecimal(), nullable=False),
        sa.Column("epsilon_released", ExactDecimal(), nullable=False),
        sa.Column("delta_released", ExactDecimal(), nullable=False),
        sa.Column("reservations", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["dataset"], ["dataset_budgets.dataset"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("dataset", "sweep_id", name="uq_ledger_sweep_totals_dataset_sweep"),
    )
    entries = sa.table(
        "budget_ledger_entries",
        sa.column("dataset", sa.String()),
        sa.column("sweep_id", sa.String()),
        sa.column("kind", sa.String()),
        sa.column("epsilon", ExactDecimal()),
        sa.column("delta", ExactDecimal()),
    )
    totals_table = sa.table(
        "ledger_sweep_totals",
        sa.column("dataset", sa.String()),
        sa.column("sweep_id", sa.String()),
        *(
            sa.column(f"{q}_{f}", ExactDecimal())
            for q in ("epsilon", "delta")
            for f in FIELDS.values()
        ),
        sa.column("reservations", sa.Integer()),
    )
    bind = op.get_bind()
    sums: dict[tuple[str, str], dict[str, object]] = {}
    for dataset, sweep_id, kind, eps, dlt in bind.execute(
        sa.select(
            entries.c.dataset,
            entries.c.sweep_id,
            entries.c.kind,
            entries.c.epsilon,
            entries.c.delta,
        )
    ):
        row = sums.setdefault(
            (dataset, sweep_id),
            {
                "dataset": dataset,
                "sweep_id": sweep_id,
                **{f"{q}_{f}": Decimal(0) for q in ("epsilon", "delta") for f in FIELDS.values()},
                "reservations": 0,
            },
        )
        name = FIELDS[str(kind)]
        row[f"epsilon_{name}"] = row[f"epsilon_{name}"] + Decimal(eps)  # type: ignore[operator]
        row[f"delta_{name}"] = row[f"delta_{name}"] + Decimal(dlt)  # type: ignore[operator]
        if kind == "reserve":
            row["reservations"] = int(row["reservations"]) + 1  # type: ignore[call-overload]
    if sums:
        op.bulk_insert(totals_table, list(sums.values()))


def downgrade() -> None:
    op.drop_table("ledger_sweep_totals")
