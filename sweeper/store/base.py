"""The project's one declarative base: every table (store and ledger) shares its metadata.

The schema is created and upgraded only by Alembic migrations (:mod:`sweeper.store.schema`);
``migrations/env.py`` compares against :data:`metadata`.
"""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

__all__ = ["Base", "LedgerBase", "metadata"]


class Base(DeclarativeBase):
    """Declarative base of every table of the project (the store's and the ledger's)."""

    # Named constraints, so that Alembic migrations can refer to them by name later.
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


#: The base's first name: it began as the ledger's own and became the project's.
LedgerBase = Base

#: The metadata of every table, for migrations and for tests that create tables directly.
metadata = Base.metadata
