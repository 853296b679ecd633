"""The catalog row of a dataset name: the one look-up both grants and the fixed view need.

Its own module, below both, so that ``fixed_view`` can read a stored file's row without
importing ``grants`` (which imports ``fixed_view``): that was an import cycle.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from sweeper.store import Dataset


def dataset_row(session: Session, name: str) -> Dataset | None:
    """The catalog row of a dataset name (None for built-in names and unknown ones)."""
    return session.scalars(select(Dataset).where(Dataset.name == name)).first()
