"""Temporary re-exports (issue 21): URLs and engines moved to :mod:`sweeper.store.engine`,
migrations to :mod:`sweeper.store.schema`."""

from __future__ import annotations

from sweeper.store.engine import DEFAULT_URL, database_url, display_url, make_engine  # noqa: F401
from sweeper.store.schema import (  # noqa: F401
    MIGRATIONS,
    VERSION_TABLE,
    current_revision,
    downgrade,
    head_revision,
    require_head,
    upgrade,
)
