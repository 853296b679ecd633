"""dataset identity: datasets.content_sha256, sweeps.ledger_key

The privacy ledger is keyed by the content of a dataset's records (``sha256:<hex>``), no
longer by its name. Each name (``datasets`` row) records the identity it is bound to, and each
sweep the ledger key it reserved under. Both columns are NULL for rows stored before: such a
sweep keeps using its name as its ledger key, and a name is bound (its old ledger row, if any,
carried over to the identity's) the next time it is used
(``sweeper.datasets.identity.bind_name``). A
migration cannot compute identities itself: that needs loading every dataset.

Downgrading drops both columns. Old code then keys the ledger by name again: rows keyed
``sha256:...`` stay in ``dataset_budgets`` (nothing spent is lost) but no name reaches them, so
their caps no longer bind new sweeps. Set the caps on the names again after a downgrade.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("content_sha256", sa.String(length=64), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_datasets_content_sha256"), ["content_sha256"], unique=False
        )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ledger_key", sa.String(length=200), nullable=True))
        batch_op.create_index(batch_op.f("ix_sweeps_ledger_key"), ["ledger_key"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sweeps_ledger_key"))
        batch_op.drop_column("ledger_key")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_datasets_content_sha256"))
        batch_op.drop_column("content_sha256")
