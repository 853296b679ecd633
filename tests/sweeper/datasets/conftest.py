"""Fixtures of the dataset tests: a migrated engine on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sweeper.store.engine import make_engine
from tests.conftest import sqlite_or_postgres_url


@pytest.fixture(params=["sqlite", "postgresql"])
def both_engines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh database at head, once on SQLite and once on a throwaway PostgreSQL."""
    eng = make_engine(sqlite_or_postgres_url(request, tmp_path))
    yield eng
    eng.dispose()
