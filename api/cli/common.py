"""What every command group shares: exit codes, the database flag, engines and error lines."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

EXIT_USAGE = 2  # argparse's convention for bad arguments
EXIT_FAILURE = 1

DB_HELP = "database URL (default DPSWEEP_DATABASE_URL or sqlite:///dpsweep.db)"


def open_engine(url: str | None, *, migrate: bool = False) -> Any:
    """An engine on ``url`` (default: ``DPSWEEP_DATABASE_URL`` or the embedded SQLite file).

    Args:
        url: The ``--db`` flag's value, or None.
        migrate: Upgrade an embedded SQLite database to head first (it is migrated on first
            use); any other database must already be at head.

    Raises:
        DpsweepError: the schema is behind head.
    """
    from sweeper.store.engine import database_url, make_engine
    from sweeper.store.schema import require_head, upgrade

    url = database_url(url)
    if migrate and url.startswith("sqlite"):
        upgrade(url)  # the embedded database is migrated on first use
    require_head(url)
    return make_engine(url)


def fail(exc: Exception) -> int:
    """Print ``error: ...`` on stderr; the failure exit code."""
    Console(stderr=True).print(f"[red]error:[/red] {exc}")
    return EXIT_FAILURE


def stdout_console() -> Console:
    """The console of tables on stdout: the terminal's width, or 160 columns when piped."""
    return Console() if sys.stdout.isatty() else Console(width=160)


def local_command(
    sub: Any,
    name: str,
    func: Any,
    *,
    help: str,
    description: str | None = None,
    positionals: tuple[str | tuple[str, str], ...] = (),
    json_output: bool = True,
) -> Any:
    """Add a command that acts on the local database: its positionals, ``--db``, ``--json``.

    Args:
        sub: The subparsers to add it to.
        name: The command's name.
        func: ``func(parser, args) -> exit code``.
        help: The one-line help in the group's listing.
        description: The command's own help text.
        positionals: Positional arguments, each a name or ``(name, help)``.
        json_output: Whether it takes ``--json`` (print JSON instead of tables).

    Returns:
        The command's parser, for its other options.
    """
    p = sub.add_parser(name, help=help, description=description)
    for pos in positionals:
        if isinstance(pos, tuple):
            p.add_argument(pos[0], help=pos[1])
        else:
            p.add_argument(pos)
    p.add_argument("--db", help=DB_HELP)
    if json_output:
        p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=func, subparser=p)
    return p
