"""What every command group shares: exit codes, the database flag, engines and error lines."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from rich.console import Console
from rich.text import Text

from dpsweep.errors import ConfigError

EXIT_USAGE = 2  # argparse's convention for bad arguments
EXIT_FAILURE = 1

DB_HELP = "database URL (default DPSWEEP_DATABASE_URL or sqlite:///dpsweep.db)"


# argparse's own messages that name no fix: they get a pointer to the command's help.
_ARGPARSE_MESSAGES = (
    "the following arguments are required",
    "unrecognized arguments",
    "argument ",
    "one of the arguments",
    "ambiguous option",
    "expected ",
)


class Parser(argparse.ArgumentParser):
    """``dpsweep``'s argument parser: a refusal is one line on stderr, never the usage.

    ``PROG: error: MESSAGE`` and exit code 2 (argparse's convention); the usage and the
    options are printed by ``-h`` only. The commands' subparsers are of this class too
    (``add_subparsers`` makes its parsers of the parent's class).
    """

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE`` (one line) and exit with code 2.

        Args:
            message: What is wrong and how to fix it; argparse's own messages (a missing or
                unknown argument) get a pointer to ``PROG -h``.
        """
        line = " ".join(message.split())
        if line.startswith(_ARGPARSE_MESSAGES) or "invalid choice" in line:
            line += f" (`{self.prog} -h` lists the options)"
        self.exit(EXIT_USAGE, f"{self.prog}: error: {line}\n")


def open_engine(url: str | None, *, migrate: bool = True) -> Any:
    """An engine on ``url`` (default: ``DPSWEEP_DATABASE_URL`` or the embedded SQLite file).

    Every command opens the database here, so all of them treat a fresh database alike: an
    embedded SQLite database is created and upgraded to head on first use; any other must
    already be at head (the error says to run ``dpsweep db upgrade``).

    Args:
        url: The ``--db`` flag's value, or None.
        migrate: Upgrade an embedded SQLite database to head first (the default); False only
            checks that the schema is at head.

    Raises:
        DpsweepError: the schema is behind head.
    """
    from sweeper.store.engine import database_url, make_engine  # deferred: SQLAlchemy
    from sweeper.store.schema import ensure_schema, require_head  # deferred: Alembic

    url = database_url(url)
    _check_url(url)
    if migrate:
        ensure_schema(url)
    else:
        require_head(url)
    return make_engine(url)


def _check_url(url: str) -> None:
    """Refuse a ``--db`` that is no database URL (a bare file path, say) with the fix."""
    from sqlalchemy.engine import make_url  # deferred: SQLAlchemy

    try:
        make_url(url)
    except Exception as exc:  # ArgumentError, ValueError: both mean a malformed URL
        raise ConfigError(
            "--db takes a database URL, not a path: a SQLite file is sqlite:///dpsweep.db "
            "(relative) or sqlite:////abs/path/dpsweep.db (absolute), PostgreSQL "
            "postgresql://user@host/name",
            field="db",
        ) from exc


def fail(exc: Exception) -> int:
    """Print ``error: MESSAGE`` on stderr, one line (never wrapped, no markup); the failure
    exit code."""
    line = " ".join(str(exc).split())
    Console(stderr=True).print(Text.assemble(("error:", "red"), " ", line), soft_wrap=True)
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


#: The environment variable that names the principal the command line acts as.
OWNER_ENV = "DPSWEEP_OWNER"


def add_owner_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """Add ``--owner NAME``: whose ``what`` the command makes (default ``DPSWEEP_OWNER``, else
    the operator).

    Args:
        parser: The command's parser.
        what: What the command makes ("the sweep", "the name"), for the help.
    """
    parser.add_argument(
        "--owner",
        default=os.environ.get(OWNER_ENV) or None,
        metavar="NAME",
        help=f"act as the tenant NAME (a token's name): {what} is NAME's, which NAME's token "
        f"sees through the API, and only what NAME may use is used (default: {OWNER_ENV}, else "
        "the operator, whose work admin tokens see)",
    )


def acting_as(owner: str | None) -> str:
    """Who the command line acted as, for its messages: the operator, or a tenant."""
    if owner is None:
        return (
            "as the operator (admin tokens see it through the API and the dashboard; --owner "
            "NAME acts as a tenant)"
        )
    return f"as {owner!r} (the token named {owner!r} sees it)"


def check_owner(engine: Any, owner: str | None, console: Console) -> None:
    """Check ``--owner``'s name, and say so when no token has it yet (a typo, or a token to
    create: until then nobody sees the owner's work through the API but admins).

    Raises:
        ConfigError: not a name a token could have.
    """
    if owner is None:
        return
    from sqlalchemy import select  # deferred: SQLAlchemy
    from sqlalchemy.orm import Session  # deferred: SQLAlchemy

    from sweeper.store import ApiToken  # deferred: SQLAlchemy
    from sweeper.store.tokens import check_name  # deferred: SQLAlchemy

    check_name(owner)
    with Session(engine) as session:
        known = session.scalar(select(ApiToken.id).where(ApiToken.name == owner).limit(1))
    if known is None:
        console.print(
            f"note: no token is named {owner!r} yet (a typo?); `dpsweep token create --name "
            f"{owner}` makes the one that sees what is made as {owner!r}",
            soft_wrap=True,
        )


def confirm_charge(cost: Any, *, yes: bool) -> None:
    """Go on only if a one-off run's charge on private records is confirmed: ``--yes``, or a
    yes typed at the prompt when stdin is a terminal. Such a charge spends the records'
    budget for good, so its cost is shown first (on stderr: stdout stays the result).

    Args:
        cost: The run's :class:`sweeper.runs.one_off_cost.OneOffCost`.
        yes: ``--yes`` was given.

    Raises:
        NotConfirmed: neither ``--yes`` nor a yes at the prompt (nothing was charged).
    """
    from sweeper.runs.one_off_cost import NotConfirmed  # deferred: SQLAlchemy

    if not cost.charged:
        return
    if yes:
        print(f"{cost.describe()}: confirmed by --yes", file=sys.stderr)
        return
    if sys.stdin.isatty():
        print(f"{cost.describe()}. Charge it? [y/N] ", end="", file=sys.stderr, flush=True)
        try:
            answer = input()
        except EOFError:
            answer = ""
        if answer.strip().lower() in {"y", "yes"}:
            return
    raise NotConfirmed(cost, how="Run again with --yes to charge it", nothing="nothing was charged")
