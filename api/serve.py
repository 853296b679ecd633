"""``dpsweep serve``: migrations, then the API (uvicorn) and a scheduler in one process tree.

The scheduler is a child process (``python -m sweeper.driver.scheduler``) that exits when this
process does; on SIGTERM/SIGINT the server stops taking requests and the scheduler drains
(running trials may finish for ``DPSWEEP_DRAIN_SECONDS``) before it exits.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import subprocess
import sys
from typing import Any

from rich.console import Console

from dpsweep.errors import ConfigError

EXIT_USAGE = 2


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def add_parsers(sub: Any) -> None:
    s = sub.add_parser(
        "serve",
        help="run the REST API and a scheduler (SQLite + local Ray by default)",
        description="Upgrade the database schema, then serve the REST API under /api/v1 and "
        "run a scheduler that drives submitted sweeps on Ray. DPSWEEP_DATABASE_URL and "
        "DPSWEEP_RAY_ADDRESS point it at PostgreSQL and a Ray cluster.",
    )
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    s.add_argument(
        "--db", help="database URL (default DPSWEEP_DATABASE_URL or sqlite:///dpsweep.db)"
    )
    s.add_argument(
        "--no-auth",
        action="store_true",
        help="no bearer tokens (only on a loopback address): every request acts as the local user",
    )
    s.add_argument(
        "--no-migrate",
        action="store_true",
        help="do not upgrade the schema; refuse a database behind head",
    )
    s.add_argument(
        "--no-scheduler",
        action="store_true",
        help="serve the API only (run `dpsweep scheduler` elsewhere)",
    )
    s.add_argument("--workers", type=int, help="trials (packs) run at once (default: CPUs)")
    s.add_argument(
        "--api-workers",
        type=int,
        default=1,
        help="API server processes (default 1); more serve more concurrent readers",
    )
    s.set_defaults(func=cmd_serve, subparser=s)

    sc = sub.add_parser(
        "scheduler",
        help="run a scheduler alone: it drives the sweeps submitted to the database",
    )
    sc.add_argument("--db", help="database URL (default DPSWEEP_DATABASE_URL)")
    sc.add_argument("--workers", type=int, help="trials (packs) run at once (default: CPUs)")
    sc.set_defaults(func=cmd_scheduler, subparser=sc)


def cmd_scheduler(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from sweeper.driver.scheduler import main  # deferred: SQLAlchemy, for this command only

    argv = (["--db", args.db] if args.db else []) + (
        ["--workers", str(args.workers)] if args.workers else []
    )
    return main(argv)


def cmd_serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # The server's stack loads when `serve` runs, not with the parser (this module's
    # add_parsers is part of `dpsweep --help`).
    import uvicorn  # deferred: the ASGI server, for `serve` only

    from api.app import create_app  # deferred: FastAPI

    # deferred: api.cli's __init__ imports this module (for add_parsers), so a module-level
    # import of api.cli.common would find api.serve half-initialised when it is imported first
    from api.cli.common import fail
    from api.settings import ApiSettings  # deferred: pydantic-settings
    from sweeper.store.engine import database_url, display_url  # deferred: SQLAlchemy
    from sweeper.store.schema import require_head, upgrade  # deferred: Alembic

    err = Console(stderr=True)
    settings = ApiSettings()
    if args.no_auth:
        if not _loopback(args.host):
            parser.error(
                f"--no-auth is allowed only on a loopback address, not {args.host!r}: "
                "bind --host 127.0.0.1, or create tokens with `dpsweep token create`"
            )
        settings = settings.model_copy(update={"auth": False})
    url = database_url(args.db or settings.database_url)
    try:
        _check_secrets(settings, url)
        if args.no_migrate:
            require_head(url)
        else:
            upgrade(url)
    except ConfigError as exc:
        return fail(exc)
    except Exception as exc:  # a driver or connection error: say which database failed
        return fail(RuntimeError(f"{display_url(url)}: {exc}"))
    _announce_auth(err, settings, url, base=f"http://{args.host}:{args.port}")
    child = None
    if not args.no_scheduler:
        cmd = [sys.executable, "-m", "sweeper.driver.scheduler", "--db", url]
        cmd += ["--parent-pid", str(os.getpid())]
        if args.workers:
            cmd += ["--workers", str(args.workers)]
        child = subprocess.Popen(cmd)
    if args.api_workers < 1:
        parser.error("--api-workers must be at least 1")
    _announce_urls(err, url, base=f"http://{args.host}:{args.port}", no_auth=args.no_auth)
    # uvicorn re-raises the signal that stopped it once it has shut down; with the default
    # handler that would kill this process before the scheduler is drained. A no-op handler
    # lets uvicorn.run return instead.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    common: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "log_level": "warning",
        "access_log": False,
    }
    try:
        if args.api_workers == 1:
            uvicorn.run(create_app(settings, database_url=url, freeze_gc=True), **common)
        else:
            # Worker processes build the app from the environment (uvicorn's factory).
            os.environ["DPSWEEP_DATABASE_URL"] = url
            os.environ["DPSWEEP_AUTH"] = "true" if settings.auth else "false"
            uvicorn.run("api.app:app_from_env", factory=True, workers=args.api_workers, **common)
    finally:
        if child is not None:
            _stop(child)
    return 0


def _announce_auth(err: Console, settings: Any, url: str, *, base: str) -> None:
    """Say that auth is off, or set up the bootstrap admin token and say whether any token
    exists yet (every /api/v1 route needs one)."""
    if not settings.auth:
        err.print(
            "[yellow]auth is OFF[/yellow] (--no-auth): every request to "
            f"{base} acts as the local user"
        )
        return
    from sweeper.store.engine import make_engine  # deferred: SQLAlchemy
    from sweeper.store.tokens import list_tokens  # deferred: SQLAlchemy

    engine = make_engine(url)
    if settings.admin_token is not None:
        from sweeper.store.tokens import ensure_token  # deferred: SQLAlchemy

        info = ensure_token(
            engine, name="admin", secret=settings.admin_token.get_secret_value(), admin=True
        )
        state = "revoked" if info.revoked_at else "valid"
        err.print(f"bootstrap admin token (DPSWEEP_ADMIN_TOKEN): id {info.id}, {state}")
    if not list_tokens(engine, include_revoked=False):
        err.print(
            "no API tokens yet: create one with `dpsweep token create --name NAME` "
            "(every /api/v1 route needs one)"
        )
    engine.dispose()


def _announce_urls(err: Console, url: str, *, base: str, no_auth: bool) -> None:
    """Where the API is (and its database), and where the dashboard is and how to sign in."""
    from sweeper.store.engine import display_url  # deferred: SQLAlchemy

    err.print(f"dpsweep API on {base}/api/v1 (database {display_url(url)})")
    sign_in = (
        "no sign-in (--no-auth)" if no_auth else "sign in with a token from `dpsweep token create`"
    )
    err.print(f"dashboard: {base}/ ({sign_in})")


def _check_secrets(settings: Any, url: str) -> None:
    """Outside dev mode, refuse to serve with the example secrets of ``.env.example``."""
    # deferred: SQLAlchemy, for `serve` only
    from sweeper.store.tokens import EXAMPLE_DB_PASSWORD, EXAMPLE_RAY_TOKEN, check_bootstrap_secret

    if settings.admin_token is not None:
        check_bootstrap_secret(settings.admin_token.get_secret_value(), dev=settings.dev)
    if not settings.dev and EXAMPLE_DB_PASSWORD in url:
        raise ConfigError(
            "the database password is still the example value from .env.example: set "
            "POSTGRES_PASSWORD (and DPSWEEP_DATABASE_URL) to your own, or DPSWEEP_DEV=true "
            "for a throwaway local deployment",
            field="DPSWEEP_DATABASE_URL",
        )
    if not settings.dev and os.environ.get("RAY_AUTH_TOKEN") == EXAMPLE_RAY_TOKEN:
        raise ConfigError(
            "RAY_AUTH_TOKEN is still the example value from .env.example: set your own shared "
            "Ray cluster token, or DPSWEEP_DEV=true for a throwaway local deployment",
            field="RAY_AUTH_TOKEN",
        )


def _stop(child: subprocess.Popen[bytes]) -> None:
    from sweeper.settings import SweeperSettings  # deferred: pydantic-settings

    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=SweeperSettings().drain_seconds + 20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
