"""ledger privacy unit: each dataset ledger says what one unit of it is (a row or a person)

A ledger now records its privacy unit (``example``, or the name of the unit column its owner
declared, such as ``patient_id``) and refuses a reservation at another level, so the same
people's budget is never spent per row by one sweep and per person by another. Ledgers that
already hold entries were all spent at the example level (units did not exist): they are
bound to ``example``. The others stay unbound until their first registration or reservation.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dataset_budgets") as batch:
        batch.add_column(sa.Column("privacy_unit", sa.String(length=200), nullable=True))
    budgets = sa.table(
        "dataset_budgets", sa.column("dataset", sa.String()), sa.column("privacy_unit", sa.String())
    )
    entries = sa.table("budget_ledger_entries", sa.column("dataset", sa.String()))
    op.execute(
        budgets.update()
        .where(budgets.c.dataset.in_(sa.select(entries.c.dataset).distinct()))
        .values(privacy_unit="example")
    )


def downgrade() -> None:
    with op.batch_alter_table("dataset_budgets") as batch:
        batch.drop_column("privacy_unit")
