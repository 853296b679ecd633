"""``dpsweep checkpoints register | list``: the checkpoints a server's specs may start from.

On a server, a spec's ``model.checkpoint`` is a name the operator registered here, never a path
an analyst writes. ``register`` copies a checkpoint (a Hugging Face ``transformers`` directory,
a ``timm`` / ``torchvision`` weights file, or a built-in architecture's safetensors state dict)
into the checkpoints directory (``DPSWEEP_CHECKPOINTS_DIR``, default ``./dpsweep-checkpoints``)
under its name, after refusing one that holds code or unrestricted pickles, and writes its
manifest: its kind, the public data it was trained on (``--trained-on``), and the operator's
declaration that it has seen none of the private records (what makes its frozen weights free
of epsilon; every model card that starts from it repeats it). ``list`` prints each name's kind,
content digest and what it was trained on, as ``GET /api/v1/checkpoints`` does.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from api.cli.common import stdout_console
from dpsweep.errors import ConfigError


def add_parsers(sub: Any) -> None:
    """Register ``dpsweep checkpoints ...`` on the top-level subparsers.

    Args:
        sub: the top-level ``dpsweep`` subparsers action.
    """
    from workers.checkpoint_store import CHECKPOINT_KINDS  # deferred: not for --help's import

    top = sub.add_parser(
        "checkpoints",
        help="checkpoints a spec's model may start from (registered names)",
        description="Register checkpoints under names and list them. On a server a spec's "
        "model.checkpoint is a registered name, never a path. The directory is "
        "DPSWEEP_CHECKPOINTS_DIR (default ./dpsweep-checkpoints), or --dir.",
    )
    csub = top.add_subparsers(dest="checkpoints_command", metavar="ACTION")
    csub.required = True
    r = csub.add_parser(
        "register",
        help="copy a checkpoint in under a name, with its declaration",
        description="Copy SOURCE (a directory or one weights file) into the checkpoints "
        "directory as NAME. Refused: code (*.py, a config.json auto_map) and pickles (a timm "
        "or torchvision checkpoint may hold one .pt/.pth, read with weights_only). By "
        "registering you declare that the weights have seen none of the private records of any "
        "dataset this server holds; --trained-on says what public data they saw.",
    )
    r.add_argument("source", help="the checkpoint directory or weights file")
    r.add_argument("--name", required=True, help="the name specs will use (model.checkpoint)")
    r.add_argument("--kind", required=True, choices=CHECKPOINT_KINDS, help="what loads it")
    r.add_argument(
        "--trained-on",
        required=True,
        help="the public data the weights were trained on (shown on every model card)",
    )
    r.add_argument("--description", default="", help="one line for listings")
    r.add_argument("--dir", help="the checkpoints directory (default: DPSWEEP_CHECKPOINTS_DIR)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_register, subparser=r)
    ls = csub.add_parser(
        "list",
        help="registered checkpoints: name, kind, digest, trained on",
        description="Every registered checkpoint with its kind, content digest (sha256 of its "
        "files, as a sweep pins it) and the public data it was trained on.",
    )
    ls.add_argument("--dir", help="the checkpoints directory (default: DPSWEEP_CHECKPOINTS_DIR)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list, subparser=ls)


def _directory(args: argparse.Namespace) -> str:
    from sweeper.sweeps.checkpoints import configured_checkpoints_dir  # deferred: settings

    return configured_checkpoints_dir(args.dir)


def cmd_register(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``dpsweep checkpoints register SOURCE --name N --kind K --trained-on TEXT``."""
    from workers.checkpoint_store import register_checkpoint  # deferred: not for the parser

    try:
        ref = register_checkpoint(
            args.source,
            name=args.name,
            kind=args.kind,
            trained_on=args.trained_on,
            checkpoints_dir=_directory(args),
            description=args.description,
        )
    except ConfigError as exc:
        parser.error(str(exc))
        return 2  # unreachable
    row = {"name": ref.name, "kind": ref.kind, "digest": ref.digest, "trained_on": args.trained_on}
    if args.json:
        print(json.dumps(row))
    else:
        stdout_console().print(
            f"registered checkpoint [bold]{ref.name}[/bold] ({ref.kind}, {ref.digest}); "
            f"trained on: {args.trained_on}; declared to have seen no private record",
            soft_wrap=True,
        )
    return 0


def cmd_list(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``dpsweep checkpoints list``."""
    from sweeper.sweeps.checkpoints import checkpoint_rows  # deferred: not for the parser

    rows = checkpoint_rows(_directory(args))
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title=f"registered checkpoints ({_directory(args)})")
    for col in ("name", "kind", "digest", "trained on"):
        table.add_column(col)
    for row in rows:
        table.add_row(
            row["name"], row["kind"] or "", row["digest"] or "unreadable", row["trained_on"] or ""
        )
    stdout_console().print(table)
    return 0
