"""``dpsweep plan | run``: a sweep spec's privacy plan, and the sweep run on Ray."""

from __future__ import annotations

import argparse
import importlib
import json
import threading
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from api.cli.common import (
    DB_HELP,
    EXIT_FAILURE,
    EXIT_USAGE,
    acting_as,
    add_owner_argument,
    check_owner,
    fail,
    open_engine,
    stdout_console,
)
from api.cli.live_view import LIVE_WIDTH, ProgressView, _progress_view
from api.cli.plan_view import PLAN_KEYS, plan_json, plan_table, print_plan_notes
from api.cli.sweeps import print_models, print_results
from dpsweep.errors import ConfigError, DpsweepError
from dpsweep.spec import load_spec

# Re-exported: the tests and the live display's users import them from here.
__all__ = ["LIVE_WIDTH", "PLAN_KEYS", "ProgressView", "_progress_view", "cmd_plan", "cmd_run"]


def add_parsers(sub: Any) -> None:
    """Register ``dpsweep plan`` and ``dpsweep run`` on the top-level subparsers."""
    pl = sub.add_parser(
        "plan",
        help="plan a sweep's privacy: one noise multiplier per grid, verified; trains nothing",
        description="Split each per-grid epsilon budget of a sweep spec across its trials and "
        "verify every grid with an independent accountant. Nothing is trained.",
    )
    pl.add_argument("spec", help="sweep spec file (YAML or JSON)")
    pl.add_argument("--json", action="store_true", help="print a JSON list, one object per grid")
    pl.add_argument(
        "--db",
        help="database URL, for registered dataset names and a public evaluation dataset "
        "(default: DPSWEEP_DATABASE_URL or the embedded SQLite file)",
    )
    add_owner_argument(pl, "the plan")
    pl.set_defaults(func=cmd_plan, subparser=pl)

    r = sub.add_parser(
        "run",
        help="plan and run a sweep on Ray (resumes an unfinished sweep of the same spec)",
        description="Plan a sweep spec (infeasible plans are refused before anything trains), "
        "reserve its budget, run its trials on Ray with a progress display, then print the "
        "results and write the Pareto plots. Running the same spec again resumes an unfinished "
        "sweep of it (after a crash, say). When the spec's newest sweep has finished, it is not "
        "run again: done, its results are shown (exit 0); failed or cancelled, its results so "
        "far are shown (exit 1). Nothing is reserved or spent; --new starts a fresh sweep, "
        "which spends its budget again.",
    )
    r.add_argument("spec", help="sweep spec file (YAML or JSON)")
    r.add_argument("--db", help=DB_HELP)
    r.add_argument("--workers", type=int, help="trials (packs) run at once (default: CPUs)")
    r.add_argument(
        "--new",
        action="store_true",
        help="always a new sweep, which spends the spec's budget again: never resume an "
        "unfinished sweep of the spec, nor show a finished one",
    )
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
    add_owner_argument(r, "the sweep")
    r.set_defaults(func=cmd_run, subparser=r)


def _admitted(spec: Any, url: str | None, owner: str | None = None) -> tuple[Any, Any]:
    """The spec as ``dpsweep run`` would plan it, and its worker dataset.

    A stored dataset's owner fixes how its records are read and split (the owner's view):
    the plan uses the admitted spec, as ``run`` and ``train`` do, so plan equals run. The
    database is opened only for catalog names. ``owner``: the tenant the command acts as
    (None: the operator), admitted as that tenant's sweep would be.
    """
    from sweeper.datasets.access import Viewer  # deferred: SQLAlchemy
    from sweeper.datasets.names import in_catalog  # deferred: SQLAlchemy
    from sweeper.datasets.resolution import resolve, tuning_names  # deferred: SQLAlchemy
    from sweeper.sweeps.admission import admit  # deferred: SQLAlchemy

    # The public datasets arms tune on (tune_on) resolve with the training dataset; a
    # registered one is in the catalog.
    tune_on = tuning_names(spec.arms)
    needs_db = (
        in_catalog(spec.dataset.name)
        or spec.eval.mode == "public"
        or any(in_catalog(name) for name in tune_on.values())
    )
    if not needs_db:
        return spec, resolve(None, spec.dataset, spec.eval, tune_on=tune_on)
    engine = open_engine(url, migrate=True)
    spec = admit(engine, spec, Viewer(owner)).spec  # local use (None): the owner
    return spec, resolve(engine, spec.dataset, spec.eval, tune_on=tuning_names(spec.arms))


def use_local_factories(spec: Any) -> None:
    """Register the ``module:function`` model / dataset a spec file names (local CLI only).

    They are imported here and exported to the Ray workers this process starts (which
    inherit its environment; a Ray cluster joined by address must import them itself). The
    REST API never does this: it resolves registered names only.

    Raises:
        ConfigError: a factory cannot be imported (the message names it).
    """
    from workers.factories import export_factories, is_factory_name  # deferred: not for the parser

    named = [(spec.model.name, "models"), (spec.dataset.name, "datasets")]
    export_factories([(name, kind) for name, kind in named if is_factory_name(name)])


def pin_local_checkpoint(spec: Any) -> Any:
    """The spec with its checkpoint resolved and digested, as the local command line resolves
    it: a registered name (``DPSWEEP_CHECKPOINTS_DIR``) or a path (stored absolute). The REST
    API never passes ``allow_paths``: on a server a checkpoint is a registered name.

    Raises:
        ConfigError: as :func:`sweeper.sweeps.checkpoints.pin_checkpoint`.
    """
    from sweeper.sweeps.checkpoints import pin_checkpoint  # deferred: not for the parser

    return pin_checkpoint(spec, allow_paths=True)


def cmd_plan(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Print a sweep spec's privacy plan (a table, or JSON with ``--json``)."""
    from sweeper.sweeps.planning import plan_sweep  # deferred: SQLAlchemy

    try:
        spec = load_spec(args.spec)
        use_local_factories(spec)
        spec = pin_local_checkpoint(spec)
        spec, dataset = _admitted(spec, getattr(args, "db", None), getattr(args, "owner", None))
        # The local command line: model.checkpoint may be a path (a server refuses paths).
        plan = plan_sweep(spec, dataset=dataset, allow_paths=True)
    except ConfigError as exc:
        parser.error(str(exc))
        return EXIT_USAGE  # unreachable
    except DpsweepError as exc:
        return fail(exc)
    rows = list(plan.grids)
    if args.json:
        print(plan_json(rows))
        return 0
    console = stdout_console()
    console.print(plan_table(f"privacy plan: {spec.name} ({spec.privacy.accounting})", rows))
    print_plan_notes(console, spec, plan, rows)
    return 0


def cmd_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Plan (or resume) a sweep, run it on Ray, print its results, write its plots."""
    # Ray's import (about half a second) starts now, beside the database's, so that Ray itself
    # can start as soon as the spec is known to need running (EarlyRay, below).
    threading.Thread(target=_import_quietly, args=(("ray",),), daemon=True).start()
    from sweeper.driver.ray_backend import EarlyRay  # deferred: the driver, for the command
    from sweeper.settings import SweeperSettings  # deferred: pydantic-settings
    from sweeper.sweeps.lifecycle import find_finished, find_resumable  # deferred: SQLAlchemy

    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be >= 1; got {args.workers}")
    console = Console(stderr=True)
    try:
        spec = load_spec(args.spec)
        use_local_factories(spec)
        # Pinned before the spec's hash finds a sweep to resume: the stored spec is pinned.
        spec = pin_local_checkpoint(spec)
    except ConfigError as exc:
        parser.error(str(exc))
    if args.reproducible:
        spec.privacy.reproducible = True
    if spec.privacy.reproducible:
        from workers.randomness import REPRODUCIBLE_WARNING  # deferred: numpy

        console.print(f"[bold yellow]warning:[/bold yellow] {REPRODUCIBLE_WARNING}")
    # Ray starts (seconds) while the database is opened and the sweep is planned and reserved,
    # not after: the first result comes that much sooner. It is shut down once the sweep has
    # run, while the results print, or at once when the spec's sweep has already finished (a
    # Ray started for nothing costs that command a shutdown, which is rare and quick).
    early = EarlyRay(SweeperSettings(), workers=args.workers)
    try:
        try:
            engine = open_engine(args.db, migrate=True)
            check_owner(engine, args.owner, console)
            # The principal's own sweeps of the spec only: another's is not theirs to resume.
            sweep_id = None if args.new else find_resumable(engine, spec, owner=args.owner)
            finished = (
                None if args.new or sweep_id else find_finished(engine, spec, owner=args.owner)
            )
            if finished:
                early.close(wait=False)
                return _show_finished(engine, *finished, args=args, console=console)
        except ConfigError as exc:
            parser.error(str(exc))
        except DpsweepError as exc:
            return fail(exc)
        return _plan_and_run(parser, args, spec, engine, sweep_id, early=early, console=console)
    finally:
        early.close()


def _plan_and_run(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    spec: Any,
    engine: Any,
    sweep_id: str | None,
    *,
    early: Any,
    console: Console,
) -> int:
    """``dpsweep run`` once the spec is known to need running: create (or resume) its sweep,
    run it on ``early``'s Ray, print its results and write its plots."""
    from sweeper.driver.loop import run_sweep  # deferred: SQLAlchemy
    from sweeper.sweeps.create import create_sweep  # deferred: SQLAlchemy
    from sweeper.sweeps.summary import show_summary  # deferred: SQLAlchemy

    try:
        if sweep_id:
            console.print(f"resuming sweep [bold]{sweep_id}[/bold] ({spec.name})")
        else:
            with console.status("planning the sweep's privacy (one noise multiplier per grid)"):
                sweep_id = create_sweep(engine, spec, owner=args.owner, allow_paths=True)
            console.print(
                f"sweep [bold]{sweep_id}[/bold] ({spec.name}) planned and reserved, "
                + acting_as(args.owner),
                soft_wrap=True,
            )
    except ConfigError as exc:
        parser.error(str(exc))
    except DpsweepError as exc:
        return fail(exc)

    live = None
    if not args.quiet:
        live = Live(console=console, refresh_per_second=4, transient=False)
        live.start()

    def on_progress(snap: Any) -> None:
        if live is not None:
            live.update(_progress_view(snap, spec.name))

    # The driver mostly waits on its workers while the sweep runs: the plots' matplotlib is
    # imported meanwhile, instead of after the last trial, on the way to the results.
    threading.Thread(target=_import_quietly, args=(_PLOT_MODULES,), daemon=True).start()
    try:
        early.ready()
        outcome = run_sweep(
            engine,
            sweep_id,
            workers=args.workers,
            on_progress=on_progress,
            size_packs_remotely=early.local,
        )
    except DpsweepError as exc:
        return fail(exc)
    finally:
        if live is not None:
            live.stop()
            if not console.is_terminal:
                # Off a terminal the live view's last frame ends without a newline; the
                # results (on stdout, often the same file) must start on a line of their own.
                console.line()
    early.close(wait=False)
    summary = show_summary(engine, sweep_id)
    out = stdout_console()
    if args.json:
        print(json.dumps(summary))
    else:
        print_results(out, summary)
    paths = _write_plots(engine, sweep_id, args.plots)
    for p in paths:
        console.print(f"wrote {p}")
    _print_kept_models(console, engine, summary)
    if outcome.state != "done":
        console.print(f"[red]sweep {sweep_id} ended {outcome.state}[/red]")
        return EXIT_FAILURE
    return 0


def _show_finished(
    engine: Any, sweep_id: str, state: str, *, args: argparse.Namespace, console: Console
) -> int:
    """The results of the spec's finished sweep, instead of running (and spending) it again.

    Args:
        engine: The database.
        sweep_id: The spec's newest sweep, finished.
        state: Its state: ``done``, ``failed`` or ``cancelled``.
        args: ``dpsweep run``'s arguments (``json``).
        console: The console of messages (stderr).

    Returns:
        0 for a done sweep; the failure exit code for a failed or cancelled one (as at the end
        of the run that ended it).
    """
    from sweeper.sweeps.summary import show_summary  # deferred: SQLAlchemy

    summary = show_summary(engine, sweep_id)
    if args.json:
        print(json.dumps(summary))
    else:
        print_results(stdout_console(), summary)
    _print_kept_models(console, engine, summary)
    how = "`dpsweep run SPEC --new` starts another sweep, which spends its budget again"
    if state == "done":
        console.print(f"sweep {sweep_id} of this spec is done; nothing was run or spent. {how}")
        return 0
    console.print(
        f"[red]sweep {sweep_id} of this spec ended {state}[/red]; nothing was run or spent. {how}"
    )
    return EXIT_FAILURE


def _print_kept_models(console: Console, engine: Any, summary: dict[str, Any]) -> None:
    """One line per kept model (the spec's ``artifacts.keep``), and how to get one out."""
    from sweeper.settings import SweeperSettings  # deferred: pydantic-settings
    from sweeper.store.artifact_files import store_for  # deferred: SQLAlchemy

    if summary["models"]:
        print_models(console, summary["models"], where=store_for(engine, SweeperSettings()).url)


#: What writing the plots imports (matplotlib's half second), warmed while a sweep runs.
_PLOT_MODULES = (
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "matplotlib.lines",
    "matplotlib.ticker",
    "api.plots",
)


def _import_quietly(names: tuple[str, ...]) -> None:
    """Import ``names`` ahead of need; one that fails is left for its real use to report."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # the import where the module is needed raises it again, with context
            return


def _write_plots(engine: Any, sweep_id: str, where: str | None) -> list[Path]:
    from api.plots import write_pareto_plots  # deferred: not for the parser
    from sweeper.sweeps.stored import load_sweep  # deferred: SQLAlchemy
    from sweeper.sweeps.summary import sweep_results  # deferred: SQLAlchemy

    res = sweep_results(load_sweep(engine, sweep_id))
    out = Path(where) if where else Path("dpsweep-results") / sweep_id
    return write_pareto_plots(res.records, out=out, metric=res.metric, mode=res.mode)
