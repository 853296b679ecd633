"""``dpsweep run | sweeps | show | export | cancel``: sweeps from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

EXIT_USAGE = 2
EXIT_FAILURE = 1


def add_parsers(sub: Any) -> None:
    """Register the sweep commands on the top-level subparsers."""
    db_help = "database URL (default DPSWEEP_DATABASE_URL or sqlite:///dpsweep.db)"

    r = sub.add_parser(
        "run",
        help="plan and run a sweep on Ray (resumes an unfinished sweep of the same spec)",
        description="Plan a sweep spec (infeasible plans are refused before anything trains), "
        "reserve its budget, run its trials on Ray with a progress display, then print the "
        "results and write the Pareto plots. Running the same spec again resumes an unfinished "
        "sweep of it (after a crash, say); --new starts a fresh one.",
    )
    r.add_argument("spec", help="sweep spec file (YAML or JSON)")
    r.add_argument("--db", help=db_help)
    r.add_argument("--workers", type=int, help="trials (packs) run at once (default: CPUs)")
    r.add_argument("--new", action="store_true", help="never resume: always a new sweep")
    r.add_argument(
        "--plots",
        default=None,
        help="where to write the Pareto plots: a directory, or a .png/.svg/.pdf file "
        "(default: dpsweep-results/SWEEP_ID/)",
    )
    r.add_argument("--json", action="store_true", help="print `show --json` output at the end")
    r.add_argument("--quiet", action="store_true", help="no progress display")
    r.add_argument(
        "--reproducible",
        action="store_true",
        help="set privacy.reproducible: batches and noise from the public seeds (same spec, "
        "same result; for debugging). NOT private against anyone who knows the seeds",
    )
    r.set_defaults(func=cmd_run, subparser=r)

    ls = sub.add_parser("sweeps", help="list sweeps")
    ls.add_argument("--db", help=db_help)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_sweeps, subparser=ls)

    sh = sub.add_parser("show", help="show a sweep, its budget and its results")
    sh.add_argument("sweep_id")
    sh.add_argument("--db", help=db_help)
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_show, subparser=sh)

    ex = sub.add_parser("export", help="export a sweep's trials as CSV or JSON")
    ex.add_argument("sweep_id")
    ex.add_argument("--format", choices=("csv", "json"), default="csv")
    ex.add_argument("--output", "-o", help="file to write (default: stdout)")
    ex.add_argument("--db", help=db_help)
    ex.set_defaults(func=cmd_export, subparser=ex)

    ca = sub.add_parser(
        "cancel",
        help="cancel a sweep: unstarted trials release their budget, running ones stop",
    )
    ca.add_argument("sweep_id")
    ca.add_argument("--db", help=db_help)
    ca.set_defaults(func=cmd_cancel, subparser=ca)


def _engine(url: str | None, *, migrate: bool = False) -> Any:
    from sweeper import db

    url = db.database_url(url)
    if migrate and url.startswith("sqlite"):
        db.upgrade(url)  # the embedded database is migrated on first use
    db.require_head(url)
    return db.make_engine(url)


def _fail(exc: Exception) -> int:
    Console(stderr=True).print(f"[red]error:[/red] {exc}")
    return EXIT_FAILURE


def _progress_view(snap: Any, name: str) -> Group:
    """The live progress of ``dpsweep run``.

    A sweep with papernot-steinke grids shows elapsed time and which searches are under way,
    never done/running/failed counts or an ETA: each would follow the secret number of runs.
    """
    if snap.hidden_grids:
        from sweeper.runner import format_elapsed

        head = Table.grid(padding=(0, 2))
        head.add_row(f"[bold]{name}[/bold]", f"elapsed {format_elapsed(snap.elapsed)}")
        return Group(
            head,
            f"[dim]{snap.hidden_grids} papernot-steinke grid(s): the number of runs is private; "
            "each grid releases its selected trial when its search completes[/dim]",
            f"[dim]{snap.last_event}[/dim]",
        )
    c = snap.counts
    head = Table.grid(padding=(0, 2))
    eta = "—" if snap.eta is None else f"{snap.eta:,.0f} s"
    head.add_row(
        f"[bold]{name}[/bold]",
        f"done [green]{c.get('done', 0)}[/green]/{snap.total}",
        f"running [cyan]{c.get('running', 0)}[/cyan]",
        f"failed [red]{c.get('failed', 0)}[/red]",
        f"elapsed {snap.elapsed:,.0f} s",
        f"ETA {eta}",
    )
    best = Table(title=f"best {snap.metric} so far", title_justify="left", box=None)
    best.add_column("arm")
    best.add_column(snap.metric, justify="right")
    for arm, value in sorted(snap.best.items()):
        best.add_row(arm, f"{value:.4f}")
    parts: list[Any] = [head]
    if snap.best:
        parts.append(best)
    parts.append(f"[dim]{snap.last_event}[/dim]")
    return Group(*parts)


def cmd_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from sweeper.runner import run_sweep
    from sweeper.spec import load_spec
    from sweeper.sweeps import create_sweep, find_resumable, summarize
    from workers.errors import ConfigError, DpsweepError

    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be >= 1; got {args.workers}")
    console = Console(stderr=True)
    try:
        spec = load_spec(args.spec)
    except ConfigError as exc:
        parser.error(str(exc))
    if args.reproducible:
        spec.privacy.reproducible = True
    if spec.privacy.reproducible:
        from workers.randomness import REPRODUCIBLE_WARNING

        console.print(f"[bold yellow]warning:[/bold yellow] {REPRODUCIBLE_WARNING}")
    try:
        engine = _engine(args.db, migrate=True)
        sweep_id = None if args.new else find_resumable(engine, spec)
        if sweep_id:
            console.print(f"resuming sweep [bold]{sweep_id}[/bold] ({spec.name})")
        else:
            with console.status("planning the sweep's privacy (one noise multiplier per grid)"):
                sweep_id = create_sweep(engine, spec)
            console.print(f"sweep [bold]{sweep_id}[/bold] ({spec.name}) planned and reserved")
    except ConfigError as exc:
        parser.error(str(exc))
    except DpsweepError as exc:
        return _fail(exc)

    live = None
    if not args.quiet:
        live = Live(console=console, refresh_per_second=4, transient=False)
        live.start()

    def on_progress(snap: Any) -> None:
        if live is not None:
            live.update(_progress_view(snap, spec.name))

    try:
        outcome = run_sweep(engine, sweep_id, workers=args.workers, on_progress=on_progress)
    except DpsweepError as exc:
        return _fail(exc)
    finally:
        if live is not None:
            live.stop()
    summary = summarize(engine, sweep_id)
    out = Console() if sys.stdout.isatty() else Console(width=160)
    if args.json:
        print(json.dumps(summary))
    else:
        print_results(out, summary)
    paths = _write_plots(engine, sweep_id, args.plots)
    for p in paths:
        console.print(f"wrote {p}")
    if outcome.state != "done":
        console.print(f"[red]sweep {sweep_id} ended {outcome.state}[/red]")
        return EXIT_FAILURE
    return 0


def _write_plots(engine: Any, sweep_id: str, where: str | None) -> list[Path]:
    from sweeper.plots import write_pareto_plots
    from sweeper.sweeps import load_sweep, sweep_results

    res = sweep_results(load_sweep(engine, sweep_id))
    out = Path(where) if where else Path("dpsweep-results") / sweep_id
    return write_pareto_plots(res.records, out=out, metric=res.metric, mode=res.mode)


def describe_scaling(scaling: dict[str, Any]) -> str:
    """One line on how a dataset's inputs are scaled and bounded (``Dataset.input_scaling``)."""
    lo, hi = scaling["clip"]
    return f"inputs: {scaling['method']}, clipped to [{lo:g}, {hi:g}] ({scaling['source']})"


def print_privacy(console: Console, p: dict[str, Any] | None) -> None:
    """One line per release: each epsilon with what it covers (sweeper/releases.py)."""
    if not p:
        return
    sw = p.get("sweep")
    if sw:
        console.print(
            f"ε {sw['epsilon']:.4g} (δ {sw['delta']:.2g}) for the whole sweep: {sw['covers']} "
            f"[{sw['method']}; the grids' sum is {sw['epsilon_summed']:.4g}]"
        )
    for g in p.get("grids") or []:
        console.print(f"  ε {g['epsilon']:.4g} for grid {g['grid']}: {g['covers']}")
    life = p.get("dataset_lifetime")
    if life:
        cap = "no cap" if life["epsilon_cap"] is None else f"cap {life['epsilon_cap']:.4g}"
        console.print(
            f"ε {life['epsilon_spent']:.4g} spent over the dataset's lifetime ({cap}): "
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
    console.print(
        f"privacy: ε reserved {b['epsilon_reserved']:.4g}, charged {b['epsilon_charged']:.4g}, "
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
            f"{r['objective_std']:.4f}",
            "—" if r["ece_mean"] is None else f"{r['ece_mean']:.4f}",
            str(r["seeds"]),
            "★" if (r["arm"], r["epsilon_budget"]) in front else "",
        )
    console.print(table)


def cmd_sweeps(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from sweeper.sweeps import list_sweeps
    from workers.errors import DpsweepError

    try:
        rows = list_sweeps(_engine(args.db))
    except DpsweepError as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title="sweeps")
    for col in ("id", "name", "dataset", "state", "created", "finished", "randomness"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["id"],
            r["name"],
            r["dataset"],
            r["state"],
            r["created_at"][:19],
            (r["finished_at"] or "")[:19],
            r["randomness"],
        )
    (Console() if sys.stdout.isatty() else Console(width=160)).print(table)
    return 0


def cmd_show(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from sweeper.sweeps import summarize
    from workers.errors import DpsweepError

    try:
        summary = summarize(_engine(args.db), args.sweep_id)
    except DpsweepError as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps(summary))
    else:
        print_results(Console() if sys.stdout.isatty() else Console(width=160), summary)
    return 0


def cmd_export(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from sweeper.sweeps import export_sweep
    from workers.errors import DpsweepError

    try:
        text = export_sweep(_engine(args.db), args.sweep_id, fmt=args.format)
    except DpsweepError as exc:
        return _fail(exc)
    if args.output:
        Path(args.output).write_text(text)
        Console(stderr=True).print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_cancel(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from sweeper.sweeps import cancel_sweep
    from workers.errors import DpsweepError

    try:
        r = cancel_sweep(_engine(args.db), args.sweep_id)
    except DpsweepError as exc:
        return _fail(exc)
    Console().print(cancel_message(args.sweep_id, r))
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
