"""``dpsweep plugins``: every registered model, dataset, strategy and accountant.

The same listing as the API's ``GET /api/v1/registry`` (:mod:`workers.listing`): names and
their torch-free descriptions, the installed plug-ins (entry points) included. Imports no torch.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from api.cli.common import fail, stdout_console
from dpsweep.errors import ConfigError


def add_parsers(sub: Any) -> None:
    """Register ``dpsweep plugins`` on the top-level subparsers."""
    p = sub.add_parser(
        "plugins",
        help="list the registered models, datasets, strategies and accountants (plug-ins too)",
        description="List every name a spec or `dpsweep train` may use, with its options, "
        "including what installed plug-ins (entry points dpsweep.models, dpsweep.datasets, "
        "dpsweep.strategies, dpsweep.accountants) register.",
    )
    p.add_argument(
        "--kind",
        choices=("models", "datasets", "strategies", "accountants"),
        help="list one registry only",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=cmd_plugins, subparser=p)


def _options_text(options: list[dict[str, Any]]) -> str:
    parts = []
    for o in options:
        what = " | ".join(o["choices"]) if o["kind"] == "choice" else f"{o['kind']} {o['range']}"
        if o["sequence"]:
            what = f"list of {what}"
        default = "derived" if o["default"] is None and o["optional"] else o["default"]
        parts.append(f"{o['name']}: {what}, default {default}")
    return "\n".join(parts) or "-"


def cmd_plugins(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Print the registries (tables, or JSON with ``--json``)."""
    from workers.listing import KINDS, registry_listing  # deferred: scipy

    try:
        listing = registry_listing()
    except ConfigError as exc:  # a broken plug-in: the message names it
        return fail(exc)
    kinds = [args.kind] if args.kind else list(KINDS)
    if args.json:
        print(json.dumps({k: listing[k] for k in kinds}))
        return 0
    console = stdout_console()
    for kind in kinds:
        table = Table(title=kind, title_justify="left")
        table.add_column("name", style="bold")
        table.add_column("description")
        if kind in ("models", "datasets"):
            table.add_column("input")
            table.add_column("options")
        elif kind == "strategies":
            table.add_column("private")
            table.add_column("hyperparameters")
        else:
            table.add_column("library")
            table.add_column("tight")
        for e in listing[kind]:
            if kind in ("models", "datasets"):
                extra = [e["input_kind"], _options_text(e["options"])]
            elif kind == "strategies":
                extra = ["yes" if e["private"] else "no", _options_text(e["hyperparameters"])]
            else:
                extra = [e["library"], "yes" if e["tight"] else "no"]
            table.add_row(e["name"], e["description"], *extra)
        console.print(table)
    return 0
