"""``dpsweep datasets grant | revoke | grants | audit | policy``: data owners and analysts,
on the local database.

The CLI acts locally, with the powers of every dataset's owner: it grants an analyst (another
tenant of the API) access to a dataset with an ε allowance, revokes it, lists the grants with
each analyst's use, reads the audit log of releases (never edits it: the database refuses),
and shows or sets what analysts may use and see (``policy``).
"""

from __future__ import annotations

import argparse
import json
from decimal import Decimal
from typing import Any

from rich.table import Table

from api.cli.common import fail, local_command, open_engine, stdout_console
from dpsweep.errors import ConfigError, DpsweepError


def add_parsers(dsub: Any) -> None:
    """Register the grant commands on ``dpsweep datasets``' subparsers.

    Args:
        dsub: the ``dpsweep datasets`` subparsers action.
    """
    _add_access_parsers(dsub)
    _add_policy_parser(dsub)


def _add_access_parsers(dsub: Any) -> None:
    """Register who may use a dataset: grant, revoke, grants and the release audit."""
    g = local_command(
        dsub,
        "grant",
        cmd_grant,
        help="grant an analyst access to a dataset with an ε allowance",
        description="Let ANALYST (a tenant: a token's name) submit sweeps on NAME and receive "
        "their DP outputs, holding at most EPSILON on its records in total. A grant they hold "
        "already is replaced (what they spent stays counted). The records' lifetime cap still "
        "bounds everyone together. A name no API token has is refused unless --confirm.",
        positionals=(
            ("name", "the dataset (an upload's id ds_... or a registered name)"),
            ("analyst", "the analyst's tenant name"),
        ),
    )
    g.add_argument("--epsilon", type=float, required=True, help="the ε allowance (>= 0)")
    g.add_argument("--note", default="", help="why (kept with the grant)")
    g.add_argument(
        "--confirm",
        action="store_true",
        help="grant ANALYST although no API token has that name yet (the name their token "
        "will have)",
    )
    local_command(
        dsub,
        "revoke",
        cmd_revoke,
        help="revoke an analyst's grant: nothing new starts, what ran stays charged",
        description="Stop ANALYST's use of NAME: no new reservation or trial; running trials "
        "finish and stay charged.",
        positionals=("name", "analyst"),
    )
    local_command(
        dsub,
        "grants",
        cmd_grants,
        help="a dataset's grants, with each analyst's use",
        positionals=("name",),
    )
    a = local_command(
        dsub,
        "audit",
        cmd_audit,
        help="the audit log of releases from a dataset's records (read-only)",
        description="Every release from the records NAME reads, oldest first: who received "
        "it, from which sweep and trial, what, at what ε, when.",
        positionals=("name",),
    )
    a.add_argument("--analyst", help="only this analyst's releases")


def _add_policy_parser(dsub: Any) -> None:
    """Register ``policy``: what analysts may use and see of a dataset, and its view."""
    p = local_command(
        dsub,
        "policy",
        cmd_policy,
        help="show or set what analysts may use and see of a dataset",
        description="Print NAME's policy for analysts; with options, change it first. "
        "A carve-out evaluation releases raw metrics on private records: leave it out of "
        "--analyst-eval-modes unless analysts may see them.",
        positionals=("name",),
    )
    p.add_argument(
        "--analyst-eval-modes",
        help="comma-separated evaluation modes analysts may use: public, dp, carve-out",
    )
    p.add_argument("--label-names", help="comma-separated class names, declared public")
    p.add_argument("--description", help="a public description of the dataset")
    p.add_argument(
        "--test-fraction", type=float, help="the view: share of records held out for evaluation"
    )
    p.add_argument("--split-seed", type=int, help="the view: seed (eval mode dp: key) of the split")
    p.add_argument(
        "--input-bounds",
        help="the view: bounds of every input value, LO,HI (or 'none' to withdraw them)",
    )
    p.add_argument(
        "--feature-clip", type=float, help="the view: clip of features scaled by statistics"
    )
    p.add_argument(
        "--n-examples",
        type=int,
        help="the view: the number of records, declared public (plans take N, q and T from it)",
    )
    p.add_argument(
        "--classes", help="the view: the class list in encoding order, comma-separated, declared"
    )
    p.add_argument(
        "--input-shape", help="the view: the shape of one record's features, e.g. 64 or 1,28,28"
    )
    p.add_argument(
        "--n-units",
        type=int,
        help="the view (a dataset with a privacy unit): the number of units, declared public "
        "(plans take q and N in units from it)",
    )
    p.add_argument(
        "--declare-counted",
        action="store_true",
        help="declare the counted number of records, class list and feature shape (and "
        "number of privacy units) public as they are (analysts see and plan with declared "
        "facts only; a grant needs them all)",
    )
    unit = p.add_mutually_exclusive_group()
    unit.add_argument(
        "--privacy-unit",
        metavar="COLUMN",
        help="set the unit column (e.g. patient_id: every epsilon then protects a whole unit); "
        "refused once the records' ledger has spent or reserved anything",
    )
    unit.add_argument(
        "--no-privacy-unit",
        action="store_true",
        help="remove the privacy unit (each row its own unit); refused as --privacy-unit is",
    )


def _local() -> Any:
    from sweeper.datasets.access import Viewer  # deferred: SQLAlchemy

    return Viewer(owner=None, admin=True)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _shown(v: float | None) -> str:
    return "—" if v is None else f"{v:.6g}"


def _print_grant(g: dict[str, Any], verb: str) -> None:
    stdout_console().print(
        f"{verb} [bold]{g['analyst']}[/bold] on {g['dataset']}: ε allowance "
        f"{_shown(g['epsilon_allowance'])}" + (f" ({g['note']})" if g.get("note") else "")
    )


def cmd_grant(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Grant an analyst access to a dataset with an ε allowance."""
    from sweeper.datasets.grants import grant  # deferred: SQLAlchemy

    try:
        g = grant(
            open_engine(args.db, migrate=True),
            args.name,
            args.analyst,
            epsilon_allowance=Decimal(repr(args.epsilon)),
            viewer=_local(),
            note=args.note,
            confirm=args.confirm,
        )
    except DpsweepError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(g))
    else:
        _print_grant(g, "granted")
    return 0


def cmd_revoke(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Revoke an analyst's grant on a dataset."""
    from sweeper.datasets.grants import revoke  # deferred: SQLAlchemy

    try:
        g = revoke(open_engine(args.db, migrate=True), args.name, args.analyst, viewer=_local())
    except DpsweepError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(g))
    else:
        _print_grant(g, "revoked")
        stdout_console().print("nothing new starts; running trials finish and stay charged")
    return 0


def cmd_grants(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """List a dataset's grants with each analyst's use."""
    from sweeper.datasets.grants import list_grants  # deferred: SQLAlchemy

    try:
        rows = list_grants(open_engine(args.db, migrate=True), args.name, _local())
    except DpsweepError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title=f"grants of {args.name} (newest first)")
    for col in ("analyst", "ε allowance", "ε used", "active", "granted", "revoked", "note"):
        table.add_column(col, justify="right" if col.startswith("ε") else "left")
    for g in rows:
        table.add_row(
            g["analyst"],
            _shown(g["epsilon_allowance"]),
            _shown(g["epsilon_used"]),
            "yes" if g["active"] else "no",
            (g["created_at"] or "")[:19],
            (g["revoked_at"] or "")[:19],
            g["note"],
        )
    stdout_console().print(table)
    return 0


def audit_entries(engine: Any, name: str, analyst: str | None) -> list[dict[str, Any]]:
    """Every entry of a dataset's audit log (local use: every release from its records)."""
    from sweeper.datasets.analyst_views import audit_page  # deferred: SQLAlchemy

    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = audit_page(engine, name, _local(), analyst=analyst, cursor=cursor, limit=1000)
        out += page.items
        cursor = page.next_cursor
        if cursor is None:
            return out


def cmd_audit(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Print a dataset's audit log of releases."""
    try:
        rows = audit_entries(open_engine(args.db, migrate=True), args.name, args.analyst)
    except DpsweepError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title=f"releases from the records of {args.name} (oldest first)")
    for col in ("id", "at", "to", "dataset", "sweep", "trial", "what", "ε", "δ"):
        table.add_column(col, justify="right" if col in ("id", "ε", "δ") else "left")
    for e in rows:
        table.add_row(
            str(e["id"]),
            (e["at"] or "")[:19],
            e["principal"] or "(local)",
            e["dataset"],
            e["sweep_id"],
            e["trial_id"] or "",
            e["kind"],
            f"{e['epsilon']:.6g}",
            f"{e['delta']:.3g}",
        )
    stdout_console().print(table)
    return 0


def cmd_policy(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Print (and with options, first change) what analysts may use and see of a dataset."""
    from sweeper.datasets.analyst_views import dataset_policy, update_policy  # deferred: SQLAlchemy

    try:
        changes = _policy_changes(args)
        engine = open_engine(args.db, migrate=True)
        if changes:
            view = update_policy(engine, args.name, _local(), **changes)
        else:
            view = dataset_policy(engine, args.name, _local())
    except DpsweepError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(view))
        return 0
    _print_policy(view)
    return 0


def _policy_changes(args: argparse.Namespace) -> dict[str, Any]:
    """What ``policy``'s options change (``update_policy``'s arguments); empty: nothing.

    Raises:
        ConfigError: malformed bounds or shape.
    """
    info: dict[str, Any] = {}
    if args.label_names is not None:
        info["label_names"] = _split(args.label_names) or None
    if args.description is not None:
        info["description"] = args.description or None
    modes = None if args.analyst_eval_modes is None else _split(args.analyst_eval_modes)
    settings: dict[str, Any] = {}
    for key in ("test_fraction", "split_seed", "feature_clip", "n_examples", "n_units"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if args.classes is not None:
        settings["classes"] = _split(args.classes)
    if args.input_bounds is not None:
        settings["input_bounds"] = _bounds(args.input_bounds)
    if args.input_shape is not None:
        settings["input_shape"] = _shape(args.input_shape)
    set_unit = args.privacy_unit is not None or args.no_privacy_unit
    if not (modes is not None or info or settings or args.declare_counted or set_unit):
        return {}
    return {
        "analyst_eval_modes": modes,
        "public_info": info or None,
        "view": settings or None,
        "declare_counted": args.declare_counted,
        "set_unit": set_unit,
        "privacy_unit": args.privacy_unit,
    }


def _print_policy(view: dict[str, Any]) -> None:
    """``policy``'s answer, for people."""
    out = stdout_console()
    out.print(f"[bold]{view['dataset']}[/bold]: what its analysts may use and see")
    out.print("evaluation modes: " + (", ".join(view["analyst_eval_modes"]) or "none"))
    public = view["public_info"]
    labels = public.get("label_names")
    out.print("label names: " + (", ".join(labels) if labels else "(not declared)"))
    out.print("description: " + (public.get("description") or "(none)"))
    fixed = view.get("view")
    if not fixed:
        return
    bounds = fixed["input_bounds"]
    out.print(
        f"view: test fraction {fixed['test_fraction']}, split seed {fixed['split_seed']}, "
        f"input bounds {bounds if bounds else '(none)'}, feature clip {fixed['feature_clip']}"
    )
    unit = fixed.get("privacy_unit")
    out.print(
        f"privacy unit: {unit} (every epsilon protects a whole {unit}, all its rows)"
        if unit
        else "privacy unit: none (each row is its own unit)"
    )
    declared = set(fixed.get("declared") or ())
    facts = [("n_examples", "records"), ("classes", "classes"), ("input_shape", "feature shape")]
    if unit:
        facts.append(("n_units", "units"))
    for fact, label in facts:
        value = fixed.get(fact)
        shown = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
        state = "declared public" if fact in declared else "not declared: analysts see none"
        out.print(f"{label}: {shown} ({state})")
    if declared != {fact for fact, _ in facts}:
        out.print(
            f"analysts can be granted once all {'four' if unit else 'three'} are declared: "
            "--declare-counted, "
            "or --n-examples, --classes, --input-shape" + (", --n-units" if unit else "")
        )


def _shape(text: str) -> list[int]:
    """``64`` or ``1,28,28`` as a list of integers."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"--input-shape takes integers separated by commas (e.g. 64 or 1,28,28); got {text!r}",
            field="--input-shape",
        ) from None


def _bounds(text: str) -> list[float] | None:
    """``LO,HI`` as two floats; ``none`` withdraws the bounds."""
    if text.strip().lower() == "none":
        return None
    try:
        lo, hi = (float(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(
            f"--input-bounds takes LO,HI (e.g. 0,255) or none; got {text!r}",
            field="--input-bounds",
        ) from None
    return [lo, hi]
