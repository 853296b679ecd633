"""The schema's versions: Alembic migrations, driven programmatically.

The schema is created and upgraded only by migrations: ``dpsweep db upgrade`` (or
:func:`upgrade`). A database behind head is refused by :func:`require_head`. Every command
that opens the database goes through :func:`ensure_schema`: the embedded SQLite file is
migrated on first use; any other database must already be at head.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from dpsweep.errors import ConfigError
from sweeper.store.engine import DEFAULT_URL, database_url, display_url

__all__ = [
    "MIGRATIONS",
    "VERSION_TABLE",
    "current_revision",
    "downgrade",
    "ensure_schema",
    "head_revision",
    "require_head",
    "upgrade",
]

# Our own version table, so an Optuna storage (or anything else using Alembic) can share the
# database without clashing (docs/environment.md).
VERSION_TABLE = "dpsweep_alembic_version"
MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def _config(url: str) -> Config:
    if not (MIGRATIONS / "env.py").is_file():
        raise ConfigError(f"migrations not found at {MIGRATIONS}")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Upgrade the schema to ``revision`` (creating it on an empty database)."""
    command.upgrade(_config(database_url(url)), revision)


def downgrade(url: str | None = None, revision: str = "-1") -> None:
    command.downgrade(_config(database_url(url)), revision)


def current_revision(url: str | None = None) -> str | None:
    engine = create_engine(database_url(url))
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return ctx.get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(_config(DEFAULT_URL)).get_current_head()


def require_head(url: str | None = None) -> None:
    """Refuse a database whose schema is not at head, saying how to fix it."""
    cur, head = current_revision(url), head_revision()
    if cur != head:
        raise ConfigError(
            f"the database {display_url(database_url(url))!r} is at schema revision "
            f"{cur or 'none'}, not {head}; run `dpsweep db upgrade` first (with the same --db)",
            field="database",
        )


def ensure_schema(url: str | None = None) -> None:
    """Make the database usable by a command: upgrade an embedded SQLite database to head
    (a fresh file is created and migrated on first use); refuse any other database behind
    head, saying how to upgrade it (:func:`require_head`).

    Args:
        url: The database URL (default: :func:`~sweeper.store.engine.database_url`).

    Raises:
        ConfigError: a non-SQLite database is not at head.
    """
    url = database_url(url)
    if url.startswith("sqlite"):
        upgrade(url)
    require_head(url)
