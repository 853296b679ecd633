"""audits: canary audits of a run's epsilon (who asked, the data, the request, the result)

One row per audit (``dpsweep audit``, ``POST /api/v1/audits``): its owner, dataset name,
the sweep and trial it re-uses (audits of a trial), the request, its state (running,
succeeded, failed), the result (the worker's AuditResult), what it was charged, a fixed
public error reason, and its timestamps.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audits",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("dataset", sa.String(length=200), nullable=False),
        sa.Column("sweep_id", sa.String(length=32), nullable=True),
        sa.Column("trial_id", sa.String(length=32), nullable=True),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "running",
                "succeeded",
                "failed",
                name="auditstate",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("charge", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audits")),
    )
    with op.batch_alter_table("audits", schema=None) as batch_op:
        batch_op.create_index(
            "ix_audits_owner_created", ["owner", "created_at", "id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_audits_sweep_id"), ["sweep_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_audits_trial_id"), ["trial_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("audits", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audits_trial_id"))
        batch_op.drop_index(batch_op.f("ix_audits_sweep_id"))
        batch_op.drop_index("ix_audits_owner_created")
    op.drop_table("audits")
