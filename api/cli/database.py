"""``dpsweep db upgrade | current``: the database schema (Alembic migrations)."""

from __future__ import annotations

import argparse
from typing import Any

from api.cli.common import DB_HELP, fail


def add_parsers(sub: Any) -> None:
    """Register ``dpsweep db ...`` on the top-level subparsers."""
    db = sub.add_parser("db", help="database schema (Alembic migrations)")
    dbsub = db.add_subparsers(dest="db_command", metavar="ACTION")
    dbsub.required = True
    for name, text in (
        ("upgrade", "create or upgrade the schema to head"),
        ("current", "print the schema revision and head"),
    ):
        c = dbsub.add_parser(name, help=text)
        c.add_argument("--db", help=DB_HELP)
        c.set_defaults(func=cmd_db, subparser=c)


def cmd_db(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Upgrade the schema (``upgrade``), then print its revision and head."""
    from sweeper.store.engine import database_url, display_url  # deferred: SQLAlchemy
    from sweeper.store.schema import current_revision, head_revision, upgrade  # deferred: Alembic

    url = database_url(args.db)
    try:
        if args.db_command == "upgrade":
            upgrade(url)
        shown = display_url(url)
        print(f"{shown}: schema revision {current_revision(url)} (head {head_revision()})")
    except Exception as exc:  # a driver or connection error: say which database failed
        return fail(RuntimeError(f"{display_url(url)}: {exc}"))
    return 0
