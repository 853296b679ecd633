"""sweep driver heartbeat, spec hash; trial numbers and training time

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("spec_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("driver", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f("ix_sweeps_spec_hash"), ["spec_hash"], unique=False)
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("number", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        batch_op.add_column(
            sa.Column("config", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        batch_op.add_column(sa.Column("train_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_column("train_seconds")
        batch_op.drop_column("config")
        batch_op.drop_column("number")
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sweeps_spec_hash"))
        batch_op.drop_column("heartbeat_at")
        batch_op.drop_column("driver")
        batch_op.drop_column("spec_hash")
