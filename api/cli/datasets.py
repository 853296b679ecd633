"""``dpsweep datasets register | list | show | cap | delete``: names and their records' ledgers
(and ``grant | revoke | grants | audit | policy``: :mod:`api.cli.grants`).

The privacy ledger is keyed by the identity of a dataset's records (a hash of all of them,
:func:`workers.datasets.content_sha256`), not by a name: every name of the same records (a
registered file, an upload, the same records converted or shuffled) shares one lifetime cap
and one ledger. These commands are the operator's: they print the identity, which the API
never shows (a hash of every record lets someone who knows all records but one test guesses
of the last).

``register --public`` records the owner's declaration that a file's records are public: the
name may then be a sweep's public evaluation dataset (``eval: {mode: public, dataset: NAME}``)
and no epsilon covers its records. Registering again without ``--public`` withdraws it.
"""

from __future__ import annotations

import argparse
import json
from decimal import Decimal
from typing import Any

from rich.console import Console
from rich.table import Table

from api.cli import grants
from api.cli.arguments import key_value
from api.cli.common import (
    DB_HELP,
    EXIT_FAILURE,
    acting_as,
    add_owner_argument,
    check_owner,
    fail,
    local_command,
    open_engine,
    stdout_console,
)
from dpsweep.errors import ConfigError, DatasetError, DpsweepError

#: How many hex digits of an identity ``list`` shows.
PREFIX_DIGITS = 12


def add_parsers(sub: Any) -> None:
    """Register ``dpsweep datasets ...`` on the top-level subparsers.

    Args:
        sub: the top-level ``dpsweep`` subparsers action.
    """
    top = sub.add_parser(
        "datasets",
        help="dataset names and their records' lifetime privacy budgets",
        description="Register data files under names, and show or cap the lifetime ε/δ budget "
        "of their records. Budgets belong to the records, not to names: names of the same "
        "records (whatever the file's name, path, format or row order) share one cap and one "
        "ledger, and deleting a name keeps its records' ledger.",
    )
    dsub = top.add_subparsers(dest="datasets_command", metavar="ACTION")
    dsub.required = True
    _add_register_parser(dsub)
    _add_ledger_parsers(dsub)
    # Data owners and analysts: grant, revoke, grants, audit, policy.
    grants.add_parsers(dsub)


def _add_register_parser(dsub: Any) -> None:
    """Register ``register``: load and check a file, and name its records."""
    from sweeper.datasets.names import REGISTER_FORMATS  # deferred: SQLAlchemy

    r = dsub.add_parser(
        "register",
        help="load and check a file, and name its records",
        description="Load FILE exactly as a sweep will (NaN and inf are refused), and bind NAME "
        "to the identity of its records. A spec may then say `dataset: {name: NAME}`. Prints "
        "the identity and the other names that share its ledger.",
    )
    r.add_argument(
        "file",
        help="data file (CSV with a header row, NPZ with x and y, IDX), a folder of images "
        "(root/<label>/*.png), or a text CSV (--format text_csv)",
    )
    r.add_argument("--name", required=True, help="the name specs will use")
    r.add_argument(
        "--format",
        choices=REGISTER_FORMATS,
        help="default: from the file name (a folder: image_folder; text needs text_csv)",
    )
    r.add_argument("--label-column", help="the label column's header (CSV)")
    r.add_argument("--labels-path", help="the labels file (IDX)")
    r.add_argument(
        "--option",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a loader option, stored with the name (e.g. vocab=PATH, max_length=64, "
        "size=[32,32]; repeatable; see the format's options in `dpsweep plugins`)",
    )
    r.add_argument(
        "--public",
        action="store_true",
        help="the owner declares these records public: usable as a public evaluation dataset "
        "(eval: {mode: public, dataset: NAME}); no epsilon covers them. Registering again "
        "without --public withdraws the declaration",
    )
    r.add_argument(
        "--privacy-unit",
        metavar="COLUMN",
        help="the column (CSV) or array (NPZ) saying whose each row is, e.g. patient_id: every "
        "epsilon then protects a whole unit (all its rows), and the records' ledger counts "
        "units. Never a feature; fixed for every sweep. Default: each row its own unit",
    )
    add_owner_argument(r, "the name")
    r.add_argument("--db", help=DB_HELP)
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_register, subparser=r)


def _add_ledger_parsers(dsub: Any) -> None:
    """Register the commands on names and their records' ledgers: list, show, cap, delete."""
    local_command(dsub, "list", cmd_list, help="names, identities and budgets")
    local_command(
        dsub,
        "show",
        cmd_show,
        help="a name's records' ledger: cap, spent, reserved, entries",
        positionals=("name",),
    )
    ca = local_command(
        dsub,
        "cap",
        cmd_cap,
        help="set the lifetime ε (and δ) cap of a name's records",
        description="Set the lifetime cap of the records NAME reads (for every name of them). "
        "A cap below what is already spent plus reserved is refused.",
        positionals=("name",),
        json_output=False,
    )
    ca.add_argument("--epsilon", type=float, required=True, help="lifetime ε cap (>= 0)")
    ca.add_argument("--delta", type=float, help="lifetime δ cap in [0, 1) (default: unchanged)")
    local_command(
        dsub,
        "delete",
        cmd_delete,
        help="delete a name and its sweeps' kept models (never its records' ledger)",
        description="Delete NAME and the trained models its sweeps kept. Its records' cap, "
        "spend and entries stay: registering or uploading the same records again finds them. "
        "Refused while a sweep holds a reservation on the records.",
        positionals=("name",),
        json_output=False,
    )


def _num(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def _shown(value: Decimal | None) -> str:
    return "—" if value is None else f"{float(value):.6g}"


def cmd_register(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Register a data file under a name; print its identity."""
    from sweeper.datasets.registration import register_file  # deferred: SQLAlchemy

    try:
        engine = open_engine(args.db, migrate=True)
        check_owner(engine, args.owner, Console(stderr=True))
        binding, info = register_file(
            engine,
            args.file,
            name=args.name,
            fmt=args.format,
            label_column=args.label_column,
            labels_path=args.labels_path,
            public=args.public,
            options=dict(args.option),
            owner=args.owner,
            privacy_unit=args.privacy_unit,
        )
    except DatasetError as exc:  # the file's content: not a usage error
        return fail(exc)
    except ConfigError as exc:
        parser.error(str(exc))
    except DpsweepError as exc:
        return fail(exc)
    if args.json:
        print(
            json.dumps(
                {
                    "name": binding.name,
                    "owner": binding.owner,
                    "identity": binding.ledger_key,
                    "shares_ledger_with": list(binding.shared_with),
                    "previous_identity": (
                        f"sha256:{binding.previous_sha256}" if binding.previous_sha256 else None
                    ),
                    "carried_over": binding.carried is not None,
                    "inherited_caps": binding.inherited_caps,
                    **info,
                }
            )
        )
        return 0
    out = stdout_console()
    out.print(
        f"registered [bold]{binding.name}[/bold]: {info['n_examples']} examples "
        f"({info['kind']}, shape {tuple(info['input_shape'])}, {info['num_classes']} classes)"
    )
    out.print(f"identity {binding.ledger_key}")
    _print_unit(out, info)
    # Whose it is says who sees it through the API (GET /api/v1/datasets, the dashboard).
    out.print(f"registered {acting_as(binding.owner)}", soft_wrap=True)
    if info.get("public"):
        out.print(
            "declared [bold]public[/bold] by its owner: usable as a public evaluation dataset "
            "(eval.dataset); no epsilon covers these records"
        )
    else:
        out.print("private: not usable as a public evaluation dataset (register with --public)")
    if binding.shared_with:
        out.print(
            "shares one ledger and cap with: " + ", ".join(binding.shared_with) + " (same records)"
        )
    else:
        out.print("no other name reads these records: a ledger of its own")
    if binding.previous_sha256:
        out.print(
            f"[yellow]{binding.name} read other records before[/yellow] "
            f"(sha256:{binding.previous_sha256}); those keep their own ledger"
            + ("; the new records start with their caps" if binding.inherited_caps else "")
        )
    if binding.carried is not None:
        c = binding.carried
        out.print(
            f"carried over the ledger kept under the name {binding.name!r}: {c.entries} "
            f"entries, ε spent {_shown(c.epsilon_spent)}, reserved {_shown(c.epsilon_reserved)}"
            + ("; [yellow]cap clamped to what is committed[/yellow]" if c.cap_clamped else "")
        )
    return 0


def _print_unit(out: Console, info: dict[str, Any]) -> None:
    """What ``register`` says of the privacy unit (the operator is the owner: the count is
    theirs to see; rows per unit are never counted)."""
    unit = info.get("privacy_unit")
    if not unit:
        out.print("privacy unit: none (each row is its own unit; --privacy-unit COLUMN sets one)")
        return
    units = info.get("n_units")
    out.print(
        f"privacy unit: [bold]{unit}[/bold] ({'?' if units is None else units} units counted; "
        "every epsilon protects a whole unit, all its rows). Analysts see the number of units "
        f"once it is declared (`dpsweep datasets policy NAME --declare-counted`)"
    )


def _rows(engine: Any) -> list[dict[str, Any]]:
    from sqlalchemy import select  # deferred: SQLAlchemy
    from sqlalchemy.orm import Session  # deferred: SQLAlchemy

    from sweeper.datasets.resolution import public_builtin  # deferred: SQLAlchemy
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger  # deferred: SQLAlchemy
    from sweeper.privacy.ledger.keys import scoped_identity_key  # deferred: SQLAlchemy
    from sweeper.store import Dataset  # deferred: SQLAlchemy

    ledger = BudgetLedger(engine)
    with Session(engine) as session:
        rows = list(session.scalars(select(Dataset).order_by(Dataset.name)))
    out = []
    for r in rows:
        # Names stored before identities are shown with the ledger still kept under the name;
        # they are bound (and that ledger carried over) when next used, or by `show`.
        key = scoped_identity_key(r.content_sha256, owner=r.owner) if r.content_sha256 else r.name
        s = ledger.summary(key)
        out.append(
            {
                "name": r.name,
                "identity": key if r.content_sha256 else None,
                # A registered file its owner declared public, or a shared set declared
                # public (mnist1d-test).
                "public": (bool(r.storage_path) and bool((r.config or {}).get("public", False)))
                or public_builtin(r.name),
                "n_examples": r.n_examples,
                "privacy_unit": (r.config or {}).get("privacy_unit") if r.storage_path else None,
                "epsilon_cap": _num(s.epsilon_cap),
                "delta_cap": _num(s.delta_cap),
                "epsilon_spent": float(s.epsilon_spent),
                "epsilon_reserved": float(s.epsilon_reserved),
                "epsilon_left": _num(s.remaining.epsilon),
            }
        )
    return out


def cmd_list(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """List the dataset names with their identities and budgets."""
    try:
        rows = _rows(open_engine(args.db, migrate=True))
    except DpsweepError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title="datasets (names of the same identity share one ledger)")
    for col in ("name", "identity", "public", "N", "ε cap", "ε spent", "ε reserved"):
        table.add_column(col, justify="right" if col.startswith(("N", "ε")) else "left")
    for r in rows:
        ident = r["identity"]
        table.add_row(
            r["name"],
            ident[: len("sha256:") + PREFIX_DIGITS] + "…" if ident else "(not bound yet)",
            "public" if r["public"] else "—",
            "—" if r["n_examples"] is None else str(r["n_examples"]),
            "—" if r["epsilon_cap"] is None else f"{r['epsilon_cap']:.6g}",
            f"{r['epsilon_spent']:.6g}",
            f"{r['epsilon_reserved']:.6g}",
        )
    stdout_console().print(table)
    return 0


def ledger_view(engine: Any, name: str) -> dict[str, Any]:
    """What ``show --json`` prints: a name's records' ledger, with every entry."""
    from sweeper.datasets.identity import content_identity, owner_of  # deferred: SQLAlchemy
    from sweeper.datasets.registration import names_of  # deferred: SQLAlchemy
    from sweeper.datasets.resolution import is_public  # deferred: SQLAlchemy
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger  # deferred: SQLAlchemy
    from sweeper.privacy.ledger.keys import scoped_identity_key  # deferred: SQLAlchemy
    from sweeper.privacy.ledger.units import ledger_unit  # deferred: SQLAlchemy

    content = content_identity(engine, name)
    owner = owner_of(engine, name)
    key = scoped_identity_key(content, owner=owner)
    ledger = BudgetLedger(engine)
    s = ledger.summary(key)
    return {
        "name": name,
        "identity": key,
        "public": is_public(engine, name),
        "names": names_of(engine, content, owner=owner),
        # What one unit of the ledger's ε is: example (a row), a unit column, or None (unbound).
        "privacy_unit": ledger_unit(engine, key),
        "epsilon_cap": _num(s.epsilon_cap),
        "delta_cap": _num(s.delta_cap),
        "epsilon_spent": float(s.epsilon_spent),
        "delta_spent": float(s.delta_spent),
        "epsilon_reserved": float(s.epsilon_reserved),
        "delta_reserved": float(s.delta_reserved),
        "epsilon_left": _num(s.remaining.epsilon),
        "delta_left": _num(s.remaining.delta),
        "entries": [
            {
                "id": e.id,
                "kind": e.kind.value,
                "sweep": e.sweep_id,
                "trial": e.trial_id,
                "epsilon": float(e.epsilon),
                "delta": float(e.delta),
                "at": e.created_at.isoformat(),
                "note": e.note,
            }
            for e in ledger.entries(key)
        ],
    }


def cmd_show(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Print a name's records' ledger: caps, spend, reservations, entries."""
    try:
        view = ledger_view(open_engine(args.db, migrate=True), args.name)
    except DpsweepError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(view))
        return 0
    out = stdout_console()
    out.print(f"[bold]{view['name']}[/bold]: identity {view['identity']}")
    out.print(
        "declared public by its owner: usable as a public evaluation dataset"
        if view["public"]
        else "not declared public (private records)"
    )
    out.print("names of these records (one ledger): " + ", ".join(view["names"]))
    unit = view["privacy_unit"]
    if unit is None:
        out.print("no privacy unit bound yet (the first registration or reservation binds it)")
    elif unit == "example":
        out.print("budgeted per row (privacy unit example)")
    else:
        out.print(f"budgeted per {unit} (every ε protects a whole unit, all its rows)")

    def cell(v: float | None) -> str:
        return "no cap" if v is None else f"{v:.6g}"

    out.print(
        f"ε cap {cell(view['epsilon_cap'])}, spent {view['epsilon_spent']:.6g}, reserved "
        f"{view['epsilon_reserved']:.6g}, left {cell(view['epsilon_left'])}"
    )
    out.print(
        f"δ cap {cell(view['delta_cap'])}, spent {view['delta_spent']:.6g}, reserved "
        f"{view['delta_reserved']:.6g}, left {cell(view['delta_left'])}"
    )
    table = Table(title="ledger entries")
    for col in ("id", "kind", "sweep", "trial", "ε", "δ", "at", "note"):
        table.add_column(col, justify="right" if col in ("id", "ε", "δ") else "left")
    for e in view["entries"]:
        table.add_row(
            str(e["id"]),
            e["kind"],
            e["sweep"],
            e["trial"] or "",
            f"{e['epsilon']:.6g}",
            f"{e['delta']:.3g}",
            e["at"][:19],
            e["note"],
        )
    out.print(table)
    return 0


def cmd_cap(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Set the lifetime cap of a name's records."""
    from sweeper.datasets.identity import ledger_key_of  # deferred: SQLAlchemy
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger  # deferred: SQLAlchemy

    try:
        engine = open_engine(args.db, migrate=True)
        key = ledger_key_of(engine, args.name)
        ledger = BudgetLedger(engine)
        # Only the caps given change: a δ cap stays unless --delta is given.
        delta = args.delta if args.delta is not None else ledger.summary(key).delta_cap
        s = ledger.set_cap(key, epsilon_cap=args.epsilon, delta_cap=delta)
    except ConfigError as exc:
        # Below what is committed, or an invalid value: say it for the name.
        Console(stderr=True).print(
            f"[red]error:[/red] the cap of {args.name!r} was not changed: {exc}"
        )
        return EXIT_FAILURE
    except DpsweepError as exc:
        return fail(exc)
    left = s.remaining.epsilon
    stdout_console().print(
        f"{args.name}: lifetime ε cap {_shown(s.epsilon_cap)}, δ cap {_shown(s.delta_cap)} "
        f"(spent {_shown(s.epsilon_spent)}, reserved {_shown(s.epsilon_reserved)}, left "
        f"{_shown(left)}); it applies to every name of the same records"
    )
    return 0


def cmd_delete(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Delete a name and the models its sweeps kept (its records' ledger stays)."""
    from sweeper.datasets.registration import delete_name_and_models  # deferred: SQLAlchemy

    try:
        done = delete_name_and_models(open_engine(args.db, migrate=True), args.name)
    except DpsweepError as exc:
        return fail(exc)
    others = done.others
    tail = (
        f"; other names of the same records: {', '.join(others)}"
        if others
        else "; registering or uploading the same records again finds it"
    )
    models = (
        f" and {done.models_deleted} trained model(s) its sweeps kept"
        if done.models_deleted
        else ""
    )
    stdout_console().print(
        f"deleted the name {args.name!r}{models}; its records' ledger and cap stay{tail}"
    )
    return 0
