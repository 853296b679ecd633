"""``dpsweep sweeps | show | export | cancel | delete``: stored sweeps, and how a sweep's
results print."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from api.cli.common import fail, local_command, open_engine, stdout_console
from dpsweep.errors import DpsweepError
from dpsweep.plan_fields import per_unit, unit_suffix


def add_parsers(sub: Any) -> None:
    """Register the commands on stored sweeps on the top-level subparsers."""
    local_command(sub, "sweeps", cmd_sweeps, help="list sweeps")
    local_command(
        sub,
        "show",
        cmd_show,
        help="show a sweep, its budget and its results",
        positionals=("sweep_id",),
    )
    ex = local_command(
        sub,
        "export",
        cmd_export,
        help="export a sweep's trials as CSV or JSON",
        positionals=("sweep_id",),
        json_output=False,
    )
    ex.add_argument("--format", choices=("csv", "json"), default="csv")
    ex.add_argument("--output", "-o", help="file to write (default: stdout)")
    local_command(
        sub,
        "cancel",
        cmd_cancel,
        help="cancel a sweep: unstarted trials release their budget, running ones stop",
        positionals=("sweep_id",),
        json_output=False,
    )
    local_command(
        sub,
        "delete",
        cmd_delete,
        help="delete an ended sweep and its kept models (what it spent stays spent)",
        positionals=("sweep_id",),
        json_output=False,
    )


def describe_scaling(scaling: dict[str, Any]) -> str:
    """One line on how a dataset's inputs are scaled and bounded (``Dataset.input_scaling``)."""
    lo, hi = scaling["clip"]
    return f"inputs: {scaling['method']}, clipped to [{lo:g}, {hi:g}] ({scaling['source']})"


def print_privacy(console: Console, p: dict[str, Any] | None) -> None:
    """One line per release: each epsilon with what it covers (sweeper/privacy/releases.py)."""
    if not p:
        return
    sw = p.get("sweep")
    # With a privacy unit each epsilon is per unit (a person): said with every figure.
    grids = p.get("grids") or []
    per = per_unit(grids[0].get("privacy_unit") if grids else None)
    if sw:
        console.print(
            f"ε {sw['epsilon']:.4g}{per} (δ {sw['delta']:.2g}) for the whole sweep: "
            f"{sw['covers']} [{sw['method']}; the grids' sum is {sw['epsilon_summed']:.4g}]"
        )
    for g in grids:
        console.print(f"  ε {g['epsilon']:.4g}{per} for grid {g['grid']}: {g['covers']}")
    life = p.get("dataset_lifetime")
    if life:
        cap = "no cap" if life["epsilon_cap"] is None else f"cap {life['epsilon_cap']:.4g}"
        console.print(
            f"ε {life['epsilon_spent']:.4g}{per} spent over the dataset's lifetime ({cap}): "
            f"{life['covers']}"
        )
    ev = p.get("evaluation")
    if ev:
        console.print(f"[bold]evaluation:[/bold] {ev['statement']}")


def print_results(console: Console, s: dict[str, Any]) -> None:
    """The results table of a sweep summary (`show` and the end of `run`)."""
    obj = s["objective"]
    b = s["budget"]
    console.print(
        f"sweep [bold]{s['id']}[/bold] {s['name']} on {s['dataset']}: [bold]{s['state']}"
        f"[/bold]; trials {', '.join(f'{k} {v}' for k, v in s['trials'].items() if v)}"
    )
    unit = next((g.get("privacy_unit") for g in s.get("plan") or []), None)
    console.print(
        f"privacy{unit_suffix(unit)}: ε reserved {b['epsilon_reserved']:.4g}, charged "
        f"{b['epsilon_charged']:.4g}, "
        f"released {b['epsilon_released']:.4g}, outstanding {b['epsilon_outstanding']:.4g}"
    )
    print_privacy(console, s.get("privacy"))
    scaling = next(
        (g["input_scaling"] for g in s.get("plan") or [] if g.get("input_scaling")), None
    )
    if scaling:  # sweeps planned before inputs were bounded have none
        console.print(describe_scaling(scaling))
    if s.get("warning"):
        console.print(f"[bold yellow]warning:[/bold yellow] {s['warning']}")
    front = {(p["arm"], p["x"]) for p in s["pareto"]["epsilon"] if not p["dominated"]}
    table = Table(title=f"best configuration per arm and ε ({obj['metric']}, {obj['mode']})")
    for col in ("arm", "strategy", "ε", "best params", obj["metric"], "± std", "ECE", "seeds"):
        table.add_column(
            col, justify="left" if col in ("arm", "strategy", "best params") else "right"
        )
    table.add_column("Pareto", justify="center")
    for r in s["results"]:
        params = ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in r["best_params"].items()
        )
        table.add_row(
            r["arm"],
            r["strategy"],
            f"{r['epsilon_budget']:g}",
            params,
            f"{r['objective_mean']:.4f}",
            # One seed has no spread: a dash, not a standard deviation of 0.
            "—"
            if r["objective_std"] is None or int(r["seeds"]) < 2
            else f"{r['objective_std']:.4f}",
            "—" if r["ece_mean"] is None else f"{r['ece_mean']:.4f}",
            str(r["seeds"]),
            "★" if (r["arm"], r["epsilon_budget"]) in front else "",
        )
    console.print(table)


def print_models(
    console: Console, models: list[dict[str, Any]], *, where: str | None = None
) -> None:
    """One line per kept model (``dpsweep show --json``'s ``models``), and how to get one out.

    Args:
        console: Where to print.
        models: :func:`sweeper.sweeps.summary.kept_models`; nothing is printed when empty.
        where: The artifact store holding them, if it is to be named.
    """
    from sweeper.sweeps.stored import grid_key  # deferred: SQLAlchemy

    if not models:
        return
    console.print(f"kept {len(models)} model(s)" + (f" in {where}:" if where else ":"))
    for m in models:
        value = "" if m["objective"] is None else f"objective {m['objective']:.4f}; "
        # Plain text, never wrapped: the trial id is to be copied.
        line = (
            f"  {grid_key(m['arm'], m['epsilon_budget'])}: trial {m['trial']} "
            f"({value}{m['size_bytes']:,} bytes)"
        )
        console.print(Text(line), soft_wrap=True)
    console.print(
        "  `dpsweep model TRIAL -o DIR` writes one out with its model card; `dpsweep serve` "
        "serves it at /api/v1/trials/TRIAL/model",
        soft_wrap=True,
    )


def cmd_sweeps(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """List the stored sweeps."""
    from sweeper.sweeps.summary import list_sweeps  # deferred: SQLAlchemy

    try:
        rows = list_sweeps(open_engine(args.db))
    except DpsweepError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title="sweeps")
    for col in ("id", "name", "dataset", "owner", "state", "created", "finished", "randomness"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["id"],
            r["name"],
            r["dataset"],
            r["owner"] or "operator",
            r["state"],
            r["created_at"][:19],
            (r["finished_at"] or "")[:19],
            r["randomness"],
        )
    stdout_console().print(table)
    return 0


def cmd_show(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Print a sweep's summary: budget, privacy, results and kept models."""
    from sweeper.sweeps.summary import show_summary  # deferred: SQLAlchemy

    try:
        summary = show_summary(open_engine(args.db), args.sweep_id)
    except DpsweepError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(summary))
    else:
        out = stdout_console()
        print_results(out, summary)
        print_models(out, summary["models"])
    return 0


def cmd_export(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Write a sweep's trials as CSV or JSON (to a file or stdout)."""
    from sweeper.sweeps.export import export_sweep  # deferred: SQLAlchemy

    try:
        text = export_sweep(open_engine(args.db), args.sweep_id, fmt=args.format)
    except DpsweepError as exc:
        return fail(exc)
    if args.output:
        Path(args.output).write_text(text)
        Console(stderr=True).print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_cancel(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Cancel a sweep and say what was released."""
    from sweeper.sweeps.lifecycle import cancel_sweep  # deferred: SQLAlchemy

    try:
        r = cancel_sweep(open_engine(args.db), args.sweep_id)
    except DpsweepError as exc:
        return fail(exc)
    Console().print(cancel_message(args.sweep_id, r))
    return 0


def cmd_delete(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Delete an ended sweep, its rows and its kept models; its ledger entries stay."""
    from sweeper.datasets.access import Viewer  # deferred: SQLAlchemy
    from sweeper.settings import SweeperSettings  # deferred: pydantic-settings
    from sweeper.store.artifact_files import store_for  # deferred: SQLAlchemy
    from sweeper.sweeps.deletion import delete_sweep  # deferred: SQLAlchemy

    try:
        engine = open_engine(args.db)
        # The store the sweep's driver wrote to: DPSWEEP_ARTIFACT_URL, else beside the
        # database file.
        store = store_for(engine, SweeperSettings())
        delete_sweep(engine, args.sweep_id, Viewer(owner=None, admin=True), store=store)
    except DpsweepError as exc:
        return fail(exc)
    Console().print(
        f"deleted sweep {args.sweep_id} and its kept models; what it spent on its dataset "
        "stays spent (the ledger keeps every charge)"
    )
    return 0


def cancel_message(sweep_id: str, r: dict[str, Any]) -> str:
    """What ``dpsweep cancel`` prints. Its counts leave papernot-steinke grids out (their
    number of runs is secret); for those it states the rule instead."""
    note = r.get("papernot_steinke")
    if note and not (r["cancelled_pending"] or r["stopped_running"]):
        return (
            f"cancelled sweep {sweep_id}: ε {r['released_epsilon']:.4g} released (grids whose "
            f"search had not started); papernot-steinke: {note}"
        )
    text = (
        f"cancelled sweep {sweep_id}: {r['cancelled_pending']} unstarted trial(s) "
        f"released ε {r['released_epsilon']:.4g}; {r['stopped_running']} running trial(s) "
        "stopped (they stay charged)"
    )
    return text + (f"; papernot-steinke grids (not counted): {note}" if note else "")
