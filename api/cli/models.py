"""``dpsweep model TRIAL_ID -o DIR``: a trial's kept model, its model card, and (``--onnx``) ONNX.

It reads the local database (``--db``, as ``dpsweep show``) and the artifact store of the
settings (``DPSWEEP_ARTIFACT_URL``; by default ``<db>-artifacts`` beside the SQLite file), and
writes into DIR:

* ``model.safetensors``: the weights of the trial's best checkpoint;
* ``card.json``: its model card, byte for byte as stored;
* ``README.md``: the card rendered for people;
* ``model.onnx`` with ``--onnx``: the same model exported to ONNX (built-in architectures; needs
  the ``onnx`` package).

Both stored files are checked against the content hashes recorded when they were written
(:mod:`sweeper.artifacts.reads`). Local use sees every sweep of the database, as the other
local commands do.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from api.cli.common import DB_HELP, EXIT_FAILURE, fail, open_engine, stdout_console

MODEL_FILE = "model.safetensors"
CARD_FILE = "card.json"
README_FILE = "README.md"
ONNX_FILE = "model.onnx"

REPRODUCIBLE_MODEL = (
    "this model was trained in reproducible mode: its noise and batches came from a public "
    "seed, so its ε holds only against someone who does not know that seed"
)
ONNX_MISSING = (
    "ONNX export needs the onnx package: pip install 'dpsweep[onnx]' (or pip install onnx); "
    "model.safetensors, card.json and README.md were written"
)


def add_parsers(sub: Any) -> None:
    """Register ``model`` on the top-level subparsers."""
    m = sub.add_parser(
        "model",
        help="write a trial's kept model (safetensors), its model card and README (and ONNX)",
    )
    m.add_argument("trial_id", metavar="TRIAL_ID")
    m.add_argument(
        "-o", "--output", required=True, metavar="DIR", help="folder to write into (created)"
    )
    m.add_argument("--db", help=DB_HELP)
    m.add_argument(
        "--onnx", action="store_true", help="also write model.onnx (needs the onnx package)"
    )
    m.set_defaults(func=cmd_model, subparser=m)


def cmd_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Write a trial's kept model, card and README into ``args.output``; say what ε it has."""
    from dpsweep.errors import DpsweepError, TrialNotFound
    from sweeper.artifacts.keeper import store_for
    from sweeper.artifacts.reads import kept_model, read_card, read_model
    from sweeper.datasets.access import Viewer
    from sweeper.settings import SweeperSettings

    try:
        engine = open_engine(args.db)
        kept = kept_model(engine, args.trial_id, Viewer(owner=None))
        store = store_for(engine, SweeperSettings())
        weights = read_model(store, kept)
        card_data = read_card(store, kept)
    except TrialNotFound:
        return fail(
            ValueError(
                f"no trial {args.trial_id!r} in this database; `dpsweep export SWEEP_ID` lists "
                "a sweep's trials with their ids (pass --db for another database)"
            )
        )
    except DpsweepError as exc:
        return fail(exc)
    card: dict[str, Any] = json.loads(card_data)
    out = Path(args.output)
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = [
            _write(out / MODEL_FILE, weights),
            _write(out / CARD_FILE, card_data),
            _write(out / README_FILE, render_readme(card).encode("utf-8")),
        ]
    except OSError as exc:
        return fail(ValueError(f"cannot write into {str(out)!r}: {exc}"))
    console = stdout_console()
    for path, size in written:
        console.print(f"wrote {escape(str(path))} ({size} bytes)", soft_wrap=True)
    for line in privacy_lines(card):
        console.print(escape(line), soft_wrap=True)
    for line in warning_lines(card, reproducible=kept.reproducible):
        console.print(f"[bold yellow]warning:[/bold yellow] {escape(line)}", soft_wrap=True)
    if args.onnx:
        return _write_onnx(out / ONNX_FILE, card, weights, console)
    return 0


def _write(path: Path, data: bytes) -> tuple[Path, int]:
    """Write ``data`` under a temporary name beside ``path``, then rename it into place (an
    interrupted download never leaves a partial file under the final name)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path, len(data)


def render_readme(card: dict[str, Any]) -> str:
    """The card rendered as Markdown (:func:`sweeper.artifacts.cards.render_card_markdown`)."""
    from sweeper.artifacts.cards import render_card_markdown

    return render_card_markdown(card)


def privacy_lines(card: dict[str, Any]) -> list[str]:
    """What the model's ε covers: its grid's release and the whole sweep's (from the card)."""
    p = card.get("privacy") or {}
    if not p:
        return []
    if not p.get("private", True):
        return []  # said by the card's warnings
    lines = []
    grid = p.get("grid") or {}
    if p.get("epsilon") is not None:
        name = grid.get("grid") or (card.get("trial") or {}).get("arm", "")
        lines.append(
            f"ε {_num(p['epsilon'])} (δ {_num(p.get('delta'))}) for this model's grid {name}: "
            f"{p.get('covers') or grid.get('covers', '')}"
        )
    sweep = p.get("sweep")
    if sweep and sweep.get("epsilon") is not None:
        lines.append(
            f"ε {_num(sweep['epsilon'])} (δ {_num(sweep.get('delta'))}) for the whole sweep: "
            f"{sweep.get('covers', '')}"
        )
    return lines


def warning_lines(card: dict[str, Any], *, reproducible: bool) -> list[str]:
    """The card's warnings, and always one for a reproducible-mode model."""
    warnings = [str(w) for w in card.get("warnings") or []]
    if reproducible and not any("reproducible" in w for w in warnings):
        warnings.append(REPRODUCIBLE_MODEL)
    return warnings


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else str(value)


def _write_onnx(path: Path, card: dict[str, Any], weights: bytes, console: Console) -> int:
    """Rebuild the model from the card and export it to ONNX."""
    from dpsweep.errors import DpsweepError

    try:
        from workers.onnx_export import export_trained
    except ImportError as exc:
        return fail(ValueError(_missing(exc)))
    try:
        # Rebuilt from the card's model section (token models take int64 ids).
        export_trained(card["model"], weights, path)
    except ImportError as exc:
        return fail(ValueError(_missing(exc)))
    except DpsweepError as exc:
        Console(stderr=True).print(f"[red]error:[/red] ONNX export failed: {escape(str(exc))}")
        return EXIT_FAILURE
    console.print(f"wrote {escape(str(path))} ({path.stat().st_size} bytes)", soft_wrap=True)
    return 0


def _missing(exc: ImportError) -> str:
    """What to install for an ImportError of the ONNX path."""
    if (exc.name or "").split(".")[0] in ("torch", "safetensors"):
        return (
            "ONNX export rebuilds the model with torch: it needs the server extra "
            "(pip install 'dpsweep[server]'); model.safetensors, card.json and README.md "
            "were written"
        )
    return ONNX_MISSING
