"""Shared fixtures: a real, throwaway PostgreSQL server started by the tests themselves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """In the main process, before any xdist worker starts: make Ray's token file.

    A local ``ray.init`` creates ``~/.ray/auth_token`` when it is missing, by truncating and
    writing the file. Two workers starting their first Ray at once on a fresh home directory
    would each write their own token, and one cluster's processes would read the other's.
    """
    import os

    if hasattr(config, "workerinput") or os.environ.get("RAY_AUTH_MODE", "token") != "token":
        return
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    if not (Path.home() / ".ray" / "auth_token").exists():
        from ray._private.authentication.authentication_token_setup import (
            generate_and_save_token,
        )

        generate_and_save_token()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1 for this test session (:mod:`api.testing.postgres`)."""
    from api.testing.postgres import pg_bin, throwaway_postgres

    if pg_bin("initdb") is None or pg_bin("pg_ctl") is None:
        pytest.fail(
            "PostgreSQL server binaries (initdb, pg_ctl) are missing; .ci/run installs "
            "them with apt-get install postgresql"
        )
    with throwaway_postgres() as url:
        yield url


def fresh_postgres_database(base_url: str, key: str) -> str:
    """A new, empty database on the session's PostgreSQL server; its URL."""
    import sqlalchemy as sa

    name = f"t{abs(hash(key)) % 10**8}"
    admin = sa.create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return base_url.rsplit("/", 1)[0] + f"/{name}"


def sqlite_or_postgres_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database at head for a fixture parametrized ``["sqlite", "postgresql"]``: a
    SQLite file in ``tmp_path``, or a new database on the session's PostgreSQL server."""
    from sweeper.store.schema import upgrade

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'test.db'}"
    else:
        url = fresh_postgres_database(request.getfixturevalue("postgres_url"), str(tmp_path))
    upgrade(url)
    return url
