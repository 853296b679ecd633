"""``dpsweep model TRIAL_ID -o DIR``: a trial's kept model, its model card, and (``--onnx``) ONNX;
``--check``: the model re-evaluated on its rebuilt evaluation split, against its card.

It reads the local database (``--db``, as ``dpsweep show``) and the artifact store of the
settings (``DPSWEEP_ARTIFACT_URL``; by default ``<db>-artifacts`` beside the SQLite file), and
writes into DIR:

* ``model.safetensors``: the weights of the trial's best checkpoint, with the input transform
  its trainer applied when that may be released (then the model takes raw records; a line
  says which it takes, :mod:`workers.datasets.input_transform`);
* ``card.json``: its model card, byte for byte as stored;
* ``README.md``: the card rendered for people;
* ``model.onnx`` with ``--onnx``: the same model exported to ONNX (any architecture torch's
  exporter can export, ``module:function`` factories included; needs the ``onnx`` package).
  The export runs first: when it cannot (a missing package, an operator ONNX lacks), the
  error says why and nothing is written.

``--check`` (with or without ``-o``) rebuilds the evaluation split from the card's
``dataset.split`` with the workers' loading code, evaluates the model on it (fed the raw
records when its file carries its input transform, as its user will feed it) and prints the
re-computed metrics beside the card's, with a verdict (exit code 1 when they differ):
:mod:`sweeper.artifacts.recheck`. ``--check FILE`` checks a downloaded copy (a safetensors
file, or a folder holding ``model.safetensors``) against the trial's stored card. The local
command line reads the data, so it is its owner: in eval mode ``dp`` the exact accuracy is
printed for that owner only, beside the card's noisy one, compared within the noise.

Both stored files are checked against the content hashes recorded when they were written
(:mod:`sweeper.artifacts.reads`). Local use sees every sweep of the database, as the other
local commands do; the ``module:function`` factories a card names (its model, its dataset)
are imported here, as ``dpsweep run`` imported them to train it.
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
from dpsweep.errors import DpsweepError, TrialNotFound
from dpsweep.plan_fields import per_unit
from dpsweep.trial import scaled_inputs_reason

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
    "nothing was written"
)


def add_parsers(sub: Any) -> None:
    """Register ``model`` on the top-level subparsers."""
    m = sub.add_parser(
        "model",
        help="write a trial's kept model (safetensors), its model card and README (and ONNX); "
        "--check re-evaluates it against its card",
    )
    m.add_argument("trial_id", metavar="TRIAL_ID")
    m.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="folder to write into (created); needed unless --check is given",
    )
    m.add_argument("--db", help=DB_HELP)
    m.add_argument(
        "--onnx", action="store_true", help="also write model.onnx (needs the onnx package)"
    )
    m.add_argument(
        "--check",
        nargs="?",
        const="",
        default=None,
        metavar="FILE",
        help="rebuild the evaluation split from the card, re-evaluate the model on it and "
        "compare with the card (exit 1 if they differ); FILE: check a downloaded copy (a "
        ".safetensors file or a folder holding model.safetensors) instead of the kept one",
    )
    m.set_defaults(func=cmd_model, subparser=m)


def cmd_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Write a trial's kept model, card and README into ``args.output``; say what ε it has;
    with ``--check``, re-evaluate it against its card."""
    from sweeper.artifacts.reads import kept_model, read_card, read_model  # deferred: SQLAlchemy
    from sweeper.datasets.access import Viewer  # deferred: SQLAlchemy
    from sweeper.settings import SweeperSettings  # deferred: pydantic-settings
    from sweeper.store.artifact_files import store_for  # deferred: SQLAlchemy

    if args.output is None and args.check is None:
        parser.error("give -o DIR (the folder to write the model into), or --check")
    if args.onnx and args.output is None:
        parser.error("--onnx writes model.onnx into -o DIR: give -o DIR")
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
    console = stdout_console()
    if args.output is not None:
        code = _write_files(Path(args.output), card, card_data, weights, console, onnx=args.onnx)
        if code:
            return code
    for line in privacy_lines(card):
        console.print(escape(line), soft_wrap=True)
    console.print(escape(inputs_line(card)), soft_wrap=True)
    for line in warning_lines(card, reproducible=kept.reproducible):
        console.print(f"[bold yellow]warning:[/bold yellow] {escape(line)}", soft_wrap=True)
    if args.check is not None:
        return _check(engine, kept.sweep_id, card, weights, args.check, console)
    return 0


def _write_files(
    out: Path,
    card: dict[str, Any],
    card_data: bytes,
    weights: bytes,
    console: Console,
    *,
    onnx: bool,
) -> int:
    """Write the model, card, README (and ONNX) into ``out``. The ONNX export runs first, in a
    temporary folder: when it fails nothing is written (no folder is created)."""
    files = [
        (MODEL_FILE, weights),
        (CARD_FILE, card_data),
        (README_FILE, render_readme(card).encode("utf-8")),
    ]
    if onnx:
        data = _onnx_bytes(card, weights)
        if isinstance(data, int):
            return data
        files.append((ONNX_FILE, data))
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = [_write(out / name, data) for name, data in files]
    except OSError as exc:
        return fail(ValueError(f"cannot write into {str(out)!r}: {exc}"))
    for path, size in written:
        console.print(f"wrote {escape(str(path))} ({size} bytes)", soft_wrap=True)
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
    from sweeper.artifacts.cards import render_card_markdown  # deferred: SQLAlchemy

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
    per = per_unit(p.get("privacy_unit"))  # with a privacy unit, every ε is per unit
    if p.get("epsilon") is not None:
        name = grid.get("grid") or (card.get("trial") or {}).get("arm", "")
        lines.append(
            f"ε {_num(p['epsilon'])}{per} (δ {_num(p.get('delta'))}) for this model's grid {name}: "
            f"{p.get('covers') or grid.get('covers', '')}"
        )
    sweep = p.get("sweep")
    if sweep and sweep.get("epsilon") is not None:
        lines.append(
            f"ε {_num(sweep['epsilon'])}{per} (δ {_num(sweep.get('delta'))}) for the whole sweep: "
            f"{sweep.get('covers', '')}"
        )
    return lines


def inputs_line(card: dict[str, Any]) -> str:
    """What the model takes: raw records (its file carries the input transform), token ids,
    or inputs scaled as its trainer scaled them, with why (the card's model.input_transform)."""
    reason = scaled_inputs_reason(card)
    if reason is not None:
        return f"inputs: scaled as the trainer scaled them, not raw records: {reason}"
    described = (card.get("model") or {}).get("input_transform") or {}
    if not described.get("in_model_file"):
        return f"inputs: raw records ({described.get('reason', '')})"
    return (
        f"inputs: raw records; the model file carries the trainer's input transform "
        f"({described.get('method')}: {described.get('applies')})"
    )


def warning_lines(card: dict[str, Any], *, reproducible: bool) -> list[str]:
    """The card's warnings, and always one for a reproducible-mode model."""
    warnings = [str(w) for w in card.get("warnings") or []]
    if reproducible and not any("reproducible" in w for w in warnings):
        warnings.append(REPRODUCIBLE_MODEL)
    return warnings


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else str(value)


def _onnx_bytes(card: dict[str, Any], weights: bytes) -> bytes | int:
    """The model rebuilt from the card and exported to ONNX, as bytes; or, when it cannot be,
    the failure exit code after a one-line error (nothing has been written then)."""
    try:
        # deferred: torch, and the optional [onnx] extra (a missing package is caught below)
        from workers.onnx_export import onnx_model_bytes, resolve_exporter

        # A missing package is said before anything is built or written.
        resolve_exporter("auto")
        _load_factories(card, model=True)
        # Rebuilt from the card's model section (token models take int64 ids).
        return onnx_model_bytes(card["model"], weights)
    except ImportError as exc:
        return fail(ValueError(_missing(exc)))
    except DpsweepError as exc:
        Console(stderr=True).print(
            f"[red]error:[/red] ONNX export failed: {escape(' '.join(str(exc).split()))}; "
            "nothing was written",
            soft_wrap=True,
        )
        return EXIT_FAILURE


def _load_factories(card: dict[str, Any], *, model: bool = False, data: bool = False) -> None:
    """Register the ``module:function`` factories the card names (its model; its dataset), as
    ``dpsweep run`` did to train it: the local user's own code, from the local database.

    Raises:
        ConfigError: a factory cannot be imported here (the message says to put its module
            on PYTHONPATH).
    """
    from workers.factories import is_factory_name, load_factory  # deferred: not for the parser

    names: list[tuple[str, str]] = []
    if model:
        names.append((str((card.get("model") or {}).get("name", "")), "models"))
    if data:
        split = (card.get("dataset") or {}).get("split") or {}
        names.append((str(split.get("loader") or ""), "datasets"))
    for name, kind in names:
        if is_factory_name(name):
            load_factory(name, kind)


def _check(
    engine: Any, sweep_id: str, card: dict[str, Any], weights: bytes, given: str, console: Console
) -> int:
    """``--check``: re-evaluate the model (the kept weights, or the file ``given``) on the
    rebuilt evaluation split and print the comparison with the card; 0 when it matches."""
    from sweeper.artifacts.recheck import check_model  # deferred: SQLAlchemy

    what = "the kept model"
    if given:
        path = Path(given)
        if path.is_dir():
            path = path / MODEL_FILE
        try:
            weights = path.read_bytes()
        except OSError as exc:
            return fail(ValueError(f"cannot read the model file {str(path)!r}: {exc}"))
        what = str(path)
    try:
        _load_factories(card, model=True, data=True)
        result = check_model(engine, card, weights, sweep_id=sweep_id)
    except ImportError as exc:
        return fail(
            ValueError(
                f"--check rebuilds the model and its data with torch ({exc}); it needs the "
                "server extra (pip install 'dpsweep[server]')"
            )
        )
    except (DpsweepError, ValueError) as exc:
        return fail(ValueError(f"--check could not re-evaluate the model: {exc}"))
    for line in check_lines(result, what=what):
        console.print(escape(line), soft_wrap=True)
    if result.matches and result.weights_match_card:
        console.print("[green]check: matches its card[/green]", soft_wrap=True)
        return 0
    console.print("[bold red]check: differs from its card[/bold red]", soft_wrap=True)
    return EXIT_FAILURE


def check_lines(result: Any, *, what: str) -> list[str]:
    """The lines ``--check`` prints: what was rebuilt, each metric beside the card's, notes."""
    lines = [
        f"check: {what} re-evaluated on the rebuilt evaluation split (eval mode "
        f"{result.eval_mode}, {result.n_records} records)"
    ]
    if not result.weights_match_card:
        lines.append(
            "the weights checked are not those the card describes (their sha256 differs from "
            "the card's model.weights.sha256)"
        )
    if result.same_records is False:
        lines.append(
            "the records read now are not those the sweep trained and evaluated on (the "
            "dataset changed since): a difference is then expected"
        )
    for c in result.comparisons:
        label = "card (noisy)" if c.noisy else "card"
        measured = "exact" if c.noisy else "re-computed"
        if c.card is None:
            verdict = "the card has no value"
        elif c.matches:
            verdict = f"match (within {c.tolerance:.3g})"
        else:
            verdict = f"DIFFERS by {abs(c.measured - c.card):.4g} (allowed {c.tolerance:.3g})"
        lines.append(
            f"  {c.metric}: {label} {_num(c.card)}, {measured} {_num(c.measured)}: {verdict}"
        )
    lines += [f"note: {n}" for n in result.notes]
    return lines


def _missing(exc: ImportError) -> str:
    """What to install for an ImportError of the ONNX path."""
    if (exc.name or "").split(".")[0] in ("torch", "safetensors"):
        return (
            "ONNX export rebuilds the model with torch: it needs the server extra "
            "(pip install 'dpsweep[server]'); nothing was written"
        )
    return ONNX_MISSING
