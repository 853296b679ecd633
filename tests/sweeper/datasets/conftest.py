"""Fixtures of the dataset tests: a migrated engine on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.conftest import fresh_postgres_database


@pytest.fixture(params=["sqlite", "postgresql"])
def both_engines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh database at head, once on SQLite and once on a throwaway PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'datasets.db'}"
    else:
        url = fresh_postgres_database(request.getfixturevalue("postgres_url"), str(tmp_path))
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()
