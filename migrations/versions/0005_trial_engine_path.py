"""trial engine path: trial_results.engine_path

Which engine path trained a trial: ``packed`` (the fast batched path for an ``nn.Sequential``
of known layers) or ``generic`` (any ``nn.Module``, per-example gradients from torch.func).
NULL for results stored before: those were all trained on the packed path, the only one then.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 07:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trial_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engine_path", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trial_results", schema=None) as batch_op:
        batch_op.drop_column("engine_path")
