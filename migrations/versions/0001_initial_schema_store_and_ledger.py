"""initial schema: store and ledger

Revision ID: 0001
Revises:
Create Date: 2026-11-21 21:19:10.890457
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import sweeper.store.types

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "dataset_budgets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset", sa.String(length=200), nullable=False),
        sa.Column("epsilon_cap", sweeper.store.types.ExactDecimal(), nullable=True),
        sa.Column("delta_cap", sweeper.store.types.ExactDecimal(), nullable=True),
        sa.Column("epsilon_spent", sweeper.store.types.ExactDecimal(), nullable=False),
        sa.Column("delta_spent", sweeper.store.types.ExactDecimal(), nullable=False),
        sa.Column("epsilon_reserved", sweeper.store.types.ExactDecimal(), nullable=False),
        sa.Column("delta_reserved", sweeper.store.types.ExactDecimal(), nullable=False),
        sa.Column("created_at", sweeper.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sweeper.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_budgets")),
        sa.UniqueConstraint("dataset", name=op.f("uq_dataset_budgets_dataset")),
    )
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("n_examples", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
        sa.UniqueConstraint("name", name=op.f("uq_datasets_name")),
    )
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("dataset", sa.String(length=200), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=True),
        sa.Column(
            "state",
            sa.Enum(
                "pending",
                "running",
                "done",
                "failed",
                "cancelled",
                name="sweepstate",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sweeps_dataset"), ["dataset"], unique=False)
        batch_op.create_index(batch_op.f("ix_sweeps_owner"), ["owner"], unique=False)
        batch_op.create_index(batch_op.f("ix_sweeps_state"), ["state"], unique=False)

    op.create_table(
        "budget_ledger_entries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset", sa.String(length=200), nullable=False),
        sa.Column("sweep_id", sa.String(length=200), nullable=False),
        sa.Column("trial_id", sa.String(length=200), nullable=True),
        sa.Column(
            "kind",
            sa.Enum(
                "reserve",
                "charge",
                "release",
                name="ledger_entry_kind",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("epsilon", sweeper.store.types.ExactDecimal(), nullable=False),
        sa.Column("delta", sweeper.store.types.ExactDecimal(), nullable=False),
        sa.Column("created_at", sweeper.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.CheckConstraint(
            "(kind = 'charge') = (trial_id IS NOT NULL)",
            name=op.f("ck_budget_ledger_entries_trial_id_iff_charge"),
        ),
        sa.ForeignKeyConstraint(
            ["dataset"],
            ["dataset_budgets.dataset"],
            name=op.f("fk_budget_ledger_entries_dataset_dataset_budgets"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budget_ledger_entries")),
    )
    with op.batch_alter_table("budget_ledger_entries", schema=None) as batch_op:
        batch_op.create_index(
            "ix_budget_ledger_entries_dataset_sweep", ["dataset", "sweep_id"], unique=False
        )

    op.create_table(
        "trials",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("sweep_id", sa.String(length=32), nullable=False),
        sa.Column("arm", sa.String(length=200), nullable=False),
        sa.Column("strategy", sa.String(length=64), nullable=False),
        sa.Column("epsilon_budget", sa.Float(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("noise_multiplier", sa.Float(), nullable=True),
        sa.Column("target_delta", sa.Float(), nullable=True),
        sa.Column(
            "state",
            sa.Enum(
                "pending",
                "running",
                "done",
                "failed",
                "interrupted",
                "cancelled",
                name="trialstate",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("pack_id", sa.String(length=32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name=op.f("fk_trials_sweep_id_sweeps"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trials")),
    )
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_trials_pack_id"), ["pack_id"], unique=False)
        batch_op.create_index("ix_trials_sweep_state", ["sweep_id", "state"], unique=False)

    op.create_table(
        "metric_points",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["trials.id"],
            name=op.f("fk_metric_points_trial_id_trials"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric_points")),
    )
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.create_index(
            "ix_metric_points_trial_name_step", ["trial_id", "name", "step"], unique=False
        )

    op.create_table(
        "trial_results",
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("final_metrics", sa.JSON(), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=True),
        sa.Column("delta", sa.Float(), nullable=True),
        sa.Column("accountant", sa.String(length=32), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("best_step", sa.Integer(), nullable=True),
        sa.Column("reliability", sa.JSON(), nullable=True),
        sa.Column("trajectories", sa.JSON(), nullable=False),
        sa.Column("step_time_ms_median", sa.Float(), nullable=True),
        sa.Column("diverged_at", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["trials.id"],
            name=op.f("fk_trial_results_trial_id_trials"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("trial_id", name=op.f("pk_trial_results")),
    )


def downgrade() -> None:

    op.drop_table("trial_results")
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.drop_index("ix_metric_points_trial_name_step")

    op.drop_table("metric_points")
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_index("ix_trials_sweep_state")
        batch_op.drop_index(batch_op.f("ix_trials_pack_id"))

    op.drop_table("trials")
    with op.batch_alter_table("budget_ledger_entries", schema=None) as batch_op:
        batch_op.drop_index("ix_budget_ledger_entries_dataset_sweep")

    op.drop_table("budget_ledger_entries")
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sweeps_state"))
        batch_op.drop_index(batch_op.f("ix_sweeps_owner"))
        batch_op.drop_index(batch_op.f("ix_sweeps_dataset"))

    op.drop_table("sweeps")
    op.drop_table("datasets")
    op.drop_table("dataset_budgets")
