"""sweep release: the sweep's audited epsilon stored with the key of the plan it came from

``sweeps.release``: the whole-sweep release (:func:`sweeper.privacy.releases.sweep_release`,
seconds of tight composition), computed once by the driver; ``sweeps.release_key``: the sha256
of exactly what it was computed from. Both NULL for existing sweeps: readers compute the
release as before until a driver stores it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("release_key", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("release", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_column("release")
        batch_op.drop_column("release_key")
