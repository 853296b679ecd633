"""model artifacts: kept models and their staging

``model_artifacts``: a trained model kept in the artifact store (its key, content hash, size
and model card); a row is added only once its file is completely written. ``staged_models``:
a kept model's weights from its trial's result until its artifact is written, so that a driver
killed in between leaves them for the next one.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_artifacts",
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("sweep_id", sa.String(length=32), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("grid", sa.String(length=200), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("card", sa.JSON(), nullable=False),
        sa.Column("card_sha256", sa.String(length=64), nullable=False),
        sa.Column("card_size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("reproducible", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("trial_id"),
    )
    op.create_index("ix_model_artifacts_owner", "model_artifacts", ["owner"])
    op.create_index("ix_model_artifacts_sweep_grid", "model_artifacts", ["sweep_id", "grid"])
    op.create_table(
        "staged_models",
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("sweep_id", sa.String(length=32), nullable=False),
        sa.Column("grid", sa.String(length=200), nullable=False),
        sa.Column("weights", sa.LargeBinary(), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("trial_id"),
    )
    op.create_index("ix_staged_models_sweep_id", "staged_models", ["sweep_id"])


def downgrade() -> None:
    op.drop_index("ix_staged_models_sweep_id", table_name="staged_models")
    op.drop_table("staged_models")
    op.drop_index("ix_model_artifacts_sweep_grid", table_name="model_artifacts")
    op.drop_index("ix_model_artifacts_owner", table_name="model_artifacts")
    op.drop_table("model_artifacts")
