"""``dpsweep audit``: train once with canaries and bound the run's epsilon from below.

The bound holds for any mechanism at ``--confidence``; the verdict below the table (the API's
and the dashboard's words, :func:`dpsweep.audit.audit_verdict`) says whether it exceeds the
claim and how often an honest run's would.

The run is described by flags (as ``dpsweep train``'s) or is a finished trial's (``--trial``).
Public data (a built-in set such as ``digits`` or ``synthetic``, or a registered name its
owner declared public) spends no budget; a private dataset of ``--db`` is charged the claimed
epsilon (the K trials' T steps, composed) before anything trains, once confirmed: the charge
is shown first (ε and δ, the ledger, the ε left before and after), then ``--yes`` or a yes at
the prompt (stdin a terminal) lets it proceed; without either it is refused and nothing is
spent. The audit is stored in ``--db`` (``GET /api/v1/audits`` lists it).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from api.cli.arguments import delta, key_value, positive_float, positive_int, strategy_flags
from api.cli.common import EXIT_FAILURE, EXIT_USAGE, confirm_charge, open_engine
from dpsweep.accountants import DEFAULT_RUN_ACCOUNTANT, choices_text
from dpsweep.audit import AuditRequest
from dpsweep.errors import ConfigError, DpsweepError
from dpsweep.plan_fields import unit_suffix


def add_parsers(sub: Any) -> None:
    """Register ``dpsweep audit`` on the top-level subparsers."""
    a = sub.add_parser(
        "audit",
        help="train once with canaries and report an epsilon lower bound beside the claim",
        description="Audit a DP run empirically: train once with m canaries and report a "
        "lower bound on epsilon (at --confidence, for any mechanism) beside the epsilon the run "
        "claims, with a verdict that says its error rate; a Gaussian estimate is shown beside "
        "the bound where the scores pass a normality test. Give --epsilon or "
        "--noise-multiplier, or --trial TRIAL_ID to audit a finished trial's configuration.",
    )
    d = a.add_argument_group("what to audit")
    d.add_argument(
        "--trial",
        help="a finished trial: re-use its model, strategy, params, sigma, q, T and dataset",
    )
    d.add_argument(
        "--dataset",
        help="a built-in set (default synthetic; public: nothing is charged), a registered name "
        "or an upload id of --db (private: charged the claimed epsilon), or a module:function",
    )
    d.add_argument("--model", help="registry name (default mlp), or a module:function factory")
    d.add_argument(
        "--model-option",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="model builder option (repeatable)",
    )
    p = a.add_argument_group("privacy")
    p.add_argument("--strategy", help="clipping strategy (default fixed)")
    p.add_argument("--epsilon", type=positive_float("epsilon"), help="each trial's epsilon")
    p.add_argument("--noise-multiplier", type=positive_float("noise multiplier"), help="sigma")
    p.add_argument("--delta", type=delta, default=None, help="target delta (default 1e-5)")
    p.add_argument(
        "--accountant",
        help=f"accountant of the claim (default {DEFAULT_RUN_ACCOUNTANT}): {choices_text()}",
    )
    for flag, dest, kind, text in strategy_flags():
        p.add_argument(flag, dest=dest, type=kind, default=None, help=text)
    p.add_argument(
        "--param",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="other strategy hyperparameter (repeatable)",
    )
    o = a.add_argument_group("training")
    o.add_argument("--steps", type=positive_int("steps"), help="T (default 100)")
    o.add_argument("--batch-size", type=positive_int("batch size"), help="b (default 64)")
    o.add_argument("--sample-rate", type=positive_float("sample rate"), help="q (instead of b)")
    o.add_argument(
        "--lr",
        type=positive_float("lr"),
        action="append",
        dest="lrs",
        help="learning rate (default 0.5); repeat it for K trials trained as one pack",
    )
    o.add_argument("--seed", type=int, default=None)
    o.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    o.add_argument("--threads", type=positive_int("threads"), default=1)
    _audit_flags(a)
    a.set_defaults(func=cmd_audit, subparser=a)


def _audit_flags(a: argparse.ArgumentParser) -> None:
    """The audit's own flags, the outputs and the confirmation of a charge."""
    c = a.add_argument_group("audit")
    c.add_argument("--setting", choices=("white-box", "black-box"), default="white-box")
    c.add_argument("--canaries", type=positive_int("canaries"), default=1000, help="m")
    c.add_argument(
        "--direction",
        choices=("auto", "random", "dirac"),
        default="auto",
        help="white-box canaries: auto (default: dirac where the model has a coordinate for "
        "each canary, else random), random or dirac",
    )
    c.add_argument(
        "--canary-rows",
        type=positive_int("canary-rows"),
        default=None,
        help="on a dataset with a privacy unit, the rows of each canary unit (default 4; the "
        "audit is then per unit)",
    )
    c.add_argument(
        "--unit-bounding",
        choices=("mean", "capped"),
        default=None,
        help="how a sampled unit's rows make its one contribution (privacy unit only)",
    )
    c.add_argument(
        "--rows-per-unit",
        type=positive_int("rows-per-unit"),
        default=None,
        help="R, the most rows of a sampled unit used (privacy unit only)",
    )
    c.add_argument("--confidence", type=float, default=0.95)
    a.add_argument("--db", help="database of the datasets, ledger and stored audits")
    a.add_argument(
        "--yes",
        action="store_true",
        help="charge a private dataset without asking (the charge is shown first; on a "
        "terminal without --yes the audit asks, elsewhere it is refused)",
    )
    a.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _flag(field: str | None) -> str:
    return "--" + str(field or "request").split(".")[0].replace("_", "-")


def cmd_audit(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run one audit as the flags say (a charge on private data confirmed first); print its
    result."""
    from sweeper.runs.one_off_cost import NotConfirmed  # deferred: SQLAlchemy
    from workers.devices import DEVICES  # deferred: torch
    from workers.factories import is_factory_name, load_factory  # deferred: not for the parser

    if args.device not in DEVICES:
        parser.error(f"unknown device {args.device!r}; choose one of: {', '.join(DEVICES)}")
    try:
        for name, kind in ((args.dataset, "datasets"), (args.model, "models")):
            if name and is_factory_name(name):
                load_factory(name, kind)
    except ConfigError as exc:
        parser.error(str(exc))
    params: dict[str, Any] = dict(args.param)
    for _, dest, _, _ in strategy_flags():
        if getattr(args, dest) is not None:
            params[dest] = getattr(args, dest)
    fields = {
        "trial": args.trial,
        "dataset": args.dataset,
        "model": args.model,
        "model_options": dict(args.model_option) or None,
        "strategy": args.strategy,
        "params": params or None,
        "epsilon": args.epsilon,
        "noise_multiplier": args.noise_multiplier,
        "delta": args.delta,
        "accountant": args.accountant,
        "batch_size": args.batch_size,
        "sample_rate": args.sample_rate,
        "steps": args.steps,
        "lrs": args.lrs,
        "seed": args.seed,
        "setting": args.setting,
        "canaries": args.canaries,
        "direction": args.direction,
        "confidence": args.confidence,
        "canary_rows": args.canary_rows,
        "unit_bounding": args.unit_bounding,
        "rows_per_unit": args.rows_per_unit,
    }
    try:
        request = AuditRequest(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        parser.error(f"{_flag('.'.join(str(p) for p in first['loc']))}: {first['msg']}")
    err = Console(stderr=True)
    engine = open_engine(args.db, migrate=True)
    try:
        audit = _confirm_and_run(engine, request, args)
    except NotConfirmed as exc:
        # One line, unwrapped: the cost and how to go on.
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except ConfigError as exc:
        parser.error(f"{_flag(exc.field)}: {exc}" if exc.field else str(exc))
        return EXIT_USAGE  # unreachable: parser.error exits
    except DpsweepError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return EXIT_FAILURE
    finally:
        engine.dispose()
    if audit["state"] != "succeeded":
        err.print(f"[red]error:[/red] audit {audit['id']} failed: {audit['error']}")
        return EXIT_FAILURE
    result = audit["result"]
    if args.json:
        print(json.dumps(result))
        return 0
    _print_result(Console(), audit)
    return 0


def _confirm_and_run(engine: Any, request: AuditRequest, args: argparse.Namespace) -> Any:
    """Settle the audit, show what it charges and, on private data, ask; then run it.

    Raises:
        NotConfirmed: private data, neither ``--yes`` nor a yes at the prompt.
    """
    from sweeper.audits import audit_cost, prepare_audit, start_prepared  # deferred: SQLAlchemy
    from sweeper.datasets.access import Viewer  # deferred: SQLAlchemy

    viewer = Viewer(None)
    prepared = prepare_audit(engine, request, viewer, device=args.device, threads=args.threads)
    confirm_charge(audit_cost(engine, prepared), yes=args.yes)
    return start_prepared(engine, prepared, viewer, confirmed=True, background=False)


def _print_result(console: Any, audit: dict[str, Any]) -> None:
    """The result as a table, then the verdict in the words the API and the dashboard use."""
    r = audit["result"]
    table = Table(title=f"audit {audit['id']} · {r['setting']} · {audit['dataset']}")
    table.add_column("", style="bold")
    table.add_column("value")
    low = r["epsilon_lower_bound"]
    unit = r.get("privacy_unit") or "example"
    per = unit_suffix(unit)
    rows = [
        ("epsilon claimed", f"{r['epsilon_claimed']:.4g}{per}"),
        (
            f"epsilon lower bound ({r['confidence']:.0%}, any mechanism)",
            "-" if low is None else f"{low:.4g} ({r.get('method', 'one-run')})",
        ),
        ("epsilon estimate (Gaussian model)", _estimate(r)),
        (f"claimed curve ({r['confidence']:.0%} test, any mechanism)", _curve(r)),
        ("noise scale (upper bound)", _noise_scale(r)),
        ("delta", f"{r['delta']:g}"),
        (
            "canaries",
            str(r["canaries"])
            if not per
            else f"{r['canaries']} units of {r.get('canary_rows', 1)} rows (audit per unit)",
        ),
        ("privacy unit", unit),
        ("trials x steps", f"{r['trials']} x {r['steps']}"),
        ("sample rate", f"{r['sample_rate']:.4g}"),
        ("noise multiplier", f"{r['noise_multiplier']:.4g}"),
        ("strategy", f"{r['strategy']} ({r['engine_path']})"),
        ("seconds", f"{r['seconds']:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    if r.get("summary"):
        # The verdict in one line: what the bound shows (a bound near 0 shows nothing).
        console.print(f"verdict: {r['summary']}", style="bold", highlight=False, markup=False)
    if r.get("verdict"):
        alarm = r.get("exceeds_claim") or r.get("estimate_exceeds_claim") or r.get("claim_refuted")
        style = "red" if alarm else "green"
        console.print(f"[{style}]{r['verdict']}[/{style}]")
    charge = audit.get("charge")
    if charge:
        console.print(
            f"charged ε {charge['epsilon_charged']:.4g}{unit_suffix(charge.get('privacy_unit'))}, "
            f"δ {charge['delta_charged']:g} to the lifetime budget of {charge['dataset']}"
        )
    else:
        console.print("public data: nothing was charged")


def _curve(r: dict[str, Any]) -> str:
    """The curve test's outcome, its p-value, or '-' for a result stored before it."""
    refuted, p = r.get("claim_refuted"), r.get("claim_p_value")
    if not isinstance(refuted, bool):
        return "-"
    word = "refuted" if refuted else "not refuted"
    return word if not isinstance(p, int | float) else f"{word} (p {p:.2g})"


def _noise_scale(r: dict[str, Any]) -> str:
    """The noise's scale bound, as the curve test reads it ('-': none found or none stored)."""
    s = r.get("noise_scale_upper_bound")
    return "-" if not isinstance(s, int | float) else f"at most {s:.2f} x planned"


def _estimate(r: dict[str, Any]) -> str:
    """The estimate, or why it is withheld (its model's check refused the scores)."""
    est = r.get("epsilon_estimate")
    if est is not None:
        return f"{est:.4g} (not a bound: assumes Gaussian scores, checked)"
    p_in, p_out = r.get("normality_p_in"), r.get("normality_p_out")
    if isinstance(p_in, int | float) and isinstance(p_out, int | float):
        return f"- (withheld: normality test p {p_in:.2g} in, {p_out:.2g} out)"
    return "-"
