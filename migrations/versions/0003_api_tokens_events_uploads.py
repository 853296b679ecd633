"""API: tokens, idempotency keys, events, scheduler heartbeats, uploads, trial objective

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 14:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trial_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("objective", sa.Float(), nullable=True))
    op.create_index(
        "ix_trials_sweep_order", "trials", ["sweep_id", "arm", "epsilon_budget", "number", "id"]
    )
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("owner", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("label", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("format", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("size_bytes", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("sha256", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("storage_path", sa.Text(), nullable=True))
        batch_op.create_index(batch_op.f("ix_datasets_owner"), ["owner"], unique=False)
    op.create_table(
        "sweep_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("trial_id", sa.String(length=32), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_sweep_events_sweep_id_id", "sweep_events", ["sweep_id", "id"])
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index(op.f("ix_api_tokens_name"), "api_tokens", ["name"])
    op.create_table(
        "idempotency_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("body", sa.Text(), nullable=True),
        sa.Column("location", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("owner", "key", name="uq_idempotency_owner_key"),
    )
    op.create_table(
        "service_heartbeats",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("beat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_index(op.f("ix_service_heartbeats_kind"), "service_heartbeats", ["kind"])


def downgrade() -> None:
    op.drop_index(op.f("ix_service_heartbeats_kind"), table_name="service_heartbeats")
    op.drop_table("service_heartbeats")
    op.drop_table("idempotency_keys")
    op.drop_index(op.f("ix_api_tokens_name"), table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_index("ix_sweep_events_sweep_id_id", table_name="sweep_events")
    op.drop_table("sweep_events")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_datasets_owner"))
        batch_op.drop_column("storage_path")
        batch_op.drop_column("sha256")
        batch_op.drop_column("size_bytes")
        batch_op.drop_column("format")
        batch_op.drop_column("label")
        batch_op.drop_column("owner")
    op.drop_index("ix_trials_sweep_order", table_name="trials")
    with op.batch_alter_table("trial_results", schema=None) as batch_op:
        batch_op.drop_column("objective")
