"""The ``dpsweep`` command line: the sweeper's commands plus ``serve`` and ``scheduler``.

It lives here, in the top layer (presentation), so that the domain (``sweeper``) never imports
it. One module per command group:

* :mod:`api.cli.train`: ``train`` (one DP model, charged to its dataset's ledger);
* :mod:`api.cli.audit`: ``audit`` (a canary audit: an epsilon lower bound beside the claim);
* :mod:`api.cli.run`: ``plan`` and ``run`` (a sweep spec, planned; and run on Ray);
* :mod:`api.cli.sweeps`: ``sweeps``, ``show``, ``export``, ``cancel``;
* :mod:`api.cli.models`: ``model`` (a trial's kept model, its model card, ONNX);
* :mod:`api.cli.datasets`: ``datasets register | list | show | cap | delete``;
* :mod:`api.cli.plugins`: ``plugins`` (the registries, plug-ins included);
* :mod:`api.cli.tokens`: ``token create | list | revoke``;
* :mod:`api.serve`: ``serve`` and ``scheduler``;
* :mod:`api.cli.database`: ``db upgrade | current``.

A refusal is one line, ``dpsweep COMMAND: error: MESSAGE`` (exit 2, :class:`api.cli.common.Parser`),
or ``error: MESSAGE`` (exit 1) for a failure; the usage is printed by ``-h`` only. Every command
that opens the database migrates a fresh SQLite file (:func:`api.cli.common.open_engine`).

Commands import their heavy dependencies (torch, the workers, the database) only when they run,
so ``dpsweep --help`` stays fast on the light client install.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Sequence

from api.cli import (
    audit,
    checkpoints,
    database,
    datasets,
    models,
    plugins,
    run,
    sweeps,
    tokens,
    train,
)
from api.cli.common import EXIT_FAILURE, EXIT_USAGE, Parser, fail
from api.serve import add_parsers as add_serve_parsers
from dpsweep.errors import ConfigError, DpsweepError


def build_parser() -> argparse.ArgumentParser:
    """The ``dpsweep`` parser, with every command (in the order ``--help`` lists them)."""
    parser = Parser(
        prog="dpsweep",
        description="Hyperparameter sweeps for differentially private deep learning.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add_parsers in (
        train.add_parsers,
        audit.add_parsers,
        run.add_parsers,
        sweeps.add_parsers,
        models.add_parsers,
        datasets.add_parsers,
        checkpoints.add_parsers,
        plugins.add_parsers,
        tokens.add_parsers,
        add_serve_parsers,
        database.add_parsers,
    ):
        add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``dpsweep`` command; its exit code (2 for usage errors, as argparse)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args.subparser, args) or 0)
    except DpsweepError as exc:
        # The last net: a refusal a command did not render itself (a bad --db, say) is a
        # one-line error that says how to fix it, never a traceback.
        fail(exc)
        return EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_FAILURE


def entry() -> None:
    """The ``dpsweep`` console script: :func:`main`, then a quick exit.

    Once a command has returned, its exit handlers have run and its output is flushed, nothing
    is left to do but tear down the interpreter. With Ray, SQLAlchemy, scipy and dp_accounting
    loaded that takes about 0.6 s (measured after ``dpsweep run``), so the process ends there
    instead. A command that left a non-daemon thread running exits the ordinary way, which
    waits for it. An exception (argparse's exit included) also takes the ordinary way.
    """
    code = main()
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if any(t.is_alive() and not t.daemon for t in others):
        sys.exit(code)
    # Everything the ordinary exit would flush or close: the exit handlers (logging's, Ray's),
    # then the standard streams.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # A closed pipe or stream: nothing more can be written to it anyway.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
