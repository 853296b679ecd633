"""data owners and analysts: grants, principals on ledger entries, the release log

``dataset_grants``: an owner's grant of a dataset to an analyst with an ε allowance (revoked
grants stay). ``budget_ledger_entries.principal``: whose sweep reserved (an analyst's
allowance counts their reservations). ``datasets.public_info`` and
``datasets.analyst_eval_modes``: what the owner declares public, and which evaluation modes
analysts may use. ``release_records``: the append-only audit log of releases; triggers refuse
UPDATE and DELETE on it, on SQLite and PostgreSQL alike.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 09:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sweeper.store.types import ExactDecimal

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

APPEND_ONLY = "release_records is append-only: the audit log of releases cannot be changed"


def upgrade() -> None:
    op.create_table(
        "dataset_grants",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("dataset", sa.String(length=200), nullable=False),
        sa.Column("analyst", sa.String(length=200), nullable=False),
        sa.Column("epsilon_allowance", ExactDecimal(), nullable=False),
        sa.Column("granted_by", sa.String(length=200), nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_dataset_grants_analyst", "dataset_grants", ["analyst"])
    op.create_index(
        "ix_dataset_grants_dataset_analyst", "dataset_grants", ["dataset", "analyst"]
    )
    op.create_table(
        "release_records",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset", sa.String(length=200), nullable=False),
        sa.Column("dataset_name", sa.String(length=200), nullable=False),
        sa.Column("principal", sa.String(length=200), nullable=True),
        sa.Column("sweep_id", sa.String(length=32), nullable=False),
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("grid", sa.String(length=200), nullable=True),
        sa.Column("epsilon", ExactDecimal(), nullable=False),
        sa.Column("delta", ExactDecimal(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sweep_id", "trial_id", "kind", name="uq_release_records_what"),
    )
    op.create_index("ix_release_records_principal", "release_records", ["principal"])
    op.create_index("ix_release_records_dataset_id", "release_records", ["dataset", "id"])
    with op.batch_alter_table("budget_ledger_entries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("principal", sa.String(length=200), nullable=True))
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("public_info", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("analyst_eval_modes", sa.JSON(), nullable=True))
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        for event in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER release_records_no_{event.lower()} BEFORE {event} ON "
                f"release_records BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END"
            )
    elif bind.dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION release_records_append_only() RETURNS trigger AS $$ BEGIN "
            f"RAISE EXCEPTION '{APPEND_ONLY}'; END $$ LANGUAGE plpgsql"
        )
        op.execute(
            "CREATE TRIGGER release_records_append_only BEFORE UPDATE OR DELETE OR TRUNCATE "
            "ON release_records FOR EACH STATEMENT EXECUTE FUNCTION release_records_append_only()"
        )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS release_records_no_update")
        op.execute("DROP TRIGGER IF EXISTS release_records_no_delete")
    elif bind.dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS release_records_append_only ON release_records")
        op.execute("DROP FUNCTION IF EXISTS release_records_append_only()")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_column("analyst_eval_modes")
        batch_op.drop_column("public_info")
    with op.batch_alter_table("budget_ledger_entries", schema=None) as batch_op:
        batch_op.drop_column("principal")
    op.drop_index("ix_release_records_dataset_id", table_name="release_records")
    op.drop_index("ix_release_records_principal", table_name="release_records")
    op.drop_table("release_records")
    op.drop_index("ix_dataset_grants_dataset_analyst", table_name="dataset_grants")
    op.drop_index("ix_dataset_grants_analyst", table_name="dataset_grants")
    op.drop_table("dataset_grants")
