"""``dpsweep token create | list | revoke``: the API's bearer tokens."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from api.cli.common import DB_HELP, fail, open_engine
from dpsweep.errors import DpsweepError


def add_parsers(sub: Any) -> None:
    """Register ``dpsweep token ...`` on the top-level subparsers."""
    t = sub.add_parser("token", help="API bearer tokens: create, list, revoke")
    tsub = t.add_subparsers(dest="token_command", metavar="ACTION")
    tsub.required = True
    c = tsub.add_parser(
        "create",
        help="create a token and print it once (only its hash is stored)",
        description="Create a bearer token for NAME: it sees and creates NAME's sweeps and "
        "datasets (an --admin token sees everyone's). The token is printed once.",
    )
    c.add_argument("--name", required=True, help="the owner name the token acts as")
    c.add_argument("--admin", action="store_true", help="sees every owner's objects")
    c.add_argument("--db", help=DB_HELP)
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_token, subparser=c)
    ls = tsub.add_parser("list", help="list tokens (never their secrets)")
    ls.add_argument("--db", help=DB_HELP)
    ls.add_argument("--json", action="store_true", help="print a JSON list")
    ls.set_defaults(func=cmd_token, subparser=ls)
    r = tsub.add_parser("revoke", help="revoke a token: requests with it get 401 from now on")
    r.add_argument("id", help="the token's id (see `dpsweep token list`)")
    r.add_argument("--db", help=DB_HELP)
    r.set_defaults(func=cmd_token, subparser=r)


def _info(t: Any) -> dict[str, Any]:
    from sweeper.store import iso  # deferred: SQLAlchemy

    return {
        "id": t.id,
        "name": t.name,
        "admin": t.admin,
        "created_at": iso(t.created_at),
        "last_used_at": iso(t.last_used_at),
        "revoked_at": iso(t.revoked_at),
    }


def _note_operators_work(engine: Any, name: str, err: Console) -> None:
    """Say, in one line, that a tenant's token does not see the operator's work (what the
    command line made without ``--owner``), and how to see it, when there is some."""
    from sqlalchemy import func, select  # deferred: SQLAlchemy
    from sqlalchemy.orm import Session  # deferred: SQLAlchemy

    from sweeper.store import Dataset, Sweep  # deferred: SQLAlchemy

    with Session(engine) as session:
        sweeps = session.scalar(select(func.count()).where(Sweep.owner.is_(None))) or 0
        names = (
            session.scalar(
                select(func.count()).where(
                    Dataset.owner.is_(None), Dataset.storage_path.is_not(None)
                )
            )
            or 0
        )
    made = [f"{n} {what}{'s' if n != 1 else ''}" for n, what in ((sweeps, "sweep"),
            (names, "registered dataset")) if n]  # fmt: skip
    if made:
        err.print(
            f"note: {name!r} sees only its own work; the {' and '.join(made)} made on the "
            "command line are the operator's, which admin tokens see: `dpsweep token create "
            f"--name {name} --admin`, or make them {name!r}'s with `--owner {name}` "
            "(`dpsweep run`, `dpsweep datasets register`)",
            soft_wrap=True,
        )


def cmd_token(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Create, list or revoke API tokens."""
    from sweeper.store.tokens import create_token, list_tokens, revoke_token  # deferred: SQLAlchemy

    err = Console(stderr=True)
    try:
        engine = open_engine(args.db)  # a fresh SQLite file is migrated, as by every command
        try:
            if args.token_command == "create":
                secret, info = create_token(engine, name=args.name, admin=args.admin)
                if args.json:
                    print(json.dumps({"token": secret, **_info(info)}))
                else:
                    print(secret)
                    kind = "admin token" if info.admin else "token"
                    err.print(
                        f"{kind} {info.id} for {info.name!r}: shown once, keep it secret; "
                        "send it as 'Authorization: Bearer <token>'"
                    )
                if not info.admin:  # on stderr: --json's stdout stays one object
                    _note_operators_work(engine, info.name, err)
            elif args.token_command == "list":
                rows = [_info(t) for t in list_tokens(engine)]
                if args.json:
                    print(json.dumps(rows, indent=2))
                else:
                    table = Table("id", "name", "admin", "created", "last used", "revoked")
                    for r in rows:
                        table.add_row(
                            r["id"],
                            r["name"],
                            "yes" if r["admin"] else "",
                            r["created_at"][:19],
                            (r["last_used_at"] or "")[:19],
                            (r["revoked_at"] or "")[:19],
                        )
                    Console().print(table)
            else:
                info = revoke_token(engine, args.id)
                print(f"revoked token {info.id} ({info.name})")
        finally:
            engine.dispose()
    except DpsweepError as exc:
        return fail(exc)
    return 0
