"""The ``dpsweep`` command line.

Commands import their heavy dependencies (torch, the workers) only when they run, so
``dpsweep --help`` stays fast on the light client install.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

EXIT_USAGE = 2  # argparse's convention for bad arguments
EXIT_FAILURE = 1


def _positive_float(name: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number; got {text!r}") from None
        if not (v > 0 and math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number > 0; got {text}")
        return v

    return parse


def _delta(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"delta must be a number; got {text!r}") from None
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(
            f"delta must be strictly between 0 and 1 (typically below 1/n, e.g. 1e-5); got {text}"
        )
    return v


def _positive_int(name: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer; got {text!r}") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1; got {text}")
        return v

    return parse


def _key_value(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE; got {text!r}")
    k, v = text.split("=", 1)
    try:
        value: Any = json.loads(v)
    except json.JSONDecodeError:
        value = v
    return k.strip(), value


# Strategy hyperparameter flags: each maps to the hyperparameter of the same name, and is
# accepted only by strategies that declare it.
STRATEGY_FLAGS: list[tuple[str, str, Any, str]] = [
    (
        "--clip",
        "clip",
        _positive_float("clip"),
        "clipping threshold / scale C (fixed, automatic, global, bam; default 1.0)",
    ),
    ("--clip-style", "clip_style", str, "flat (default) or layerwise (fixed, automatic, bam)"),
    (
        "--stability",
        "stability",
        _positive_float("stability"),
        "gamma in C/(n + gamma) (automatic; default 0.01)",
    ),
    (
        "--global-threshold",
        "global_threshold",
        _positive_float("global threshold"),
        "threshold Z (global; default 1.0)",
    ),
    (
        "--target-quantile",
        "target_quantile",
        _positive_float("target quantile"),
        "quantile gamma tracked by C_t (quantile; default 0.5)",
    ),
    (
        "--clip-init",
        "clip_init",
        _positive_float("clip init"),
        "initial threshold C_0 (quantile, online; default 0.1)",
    ),
    (
        "--clip-lr",
        "clip_lr",
        _positive_float("clip lr"),
        "step of the C_t update (quantile: eta_C = 0.2; online: rho_c = 2.5e-3)",
    ),
    (
        "--count-noise",
        "count_noise",
        _positive_float("count noise"),
        "std sigma_b of the quantile count's noise (quantile; default b/20)",
    ),
    (
        "--lr-lr",
        "lr_lr",
        _positive_float("lr lr"),
        "step rho_r of the learning-rate update (online; default 2.5e-3)",
    ),
    (
        "--direction-noise-ratio",
        "direction_noise_ratio",
        _positive_float("direction noise ratio"),
        "nu_q / nu (online; default 7.124)",
    ),
    (
        "--bam-lambda",
        "bam_lambda",
        _positive_float("bam lambda"),
        "per-sample ascent step lambda (bam; default 0.1)",
    ),
]


def build_parser(*extensions: Callable[[Any], None]) -> argparse.ArgumentParser:
    """The ``dpsweep`` parser; each extension adds subcommands (the API layer adds ``serve``
    and ``scheduler`` this way, so this layer never imports it)."""
    # Torch-free: the registry imports no accountant library.
    from workers.accountants import WORKER_ALIASES, accountant_names, get_accountant

    parser = argparse.ArgumentParser(
        prog="dpsweep",
        description="Hyperparameter sweeps for differentially private deep learning.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    t = sub.add_parser(
        "train",
        help="train one DP model (a single trial) and report its metrics and epsilon",
        description="Train one model with DP-SGD. Give --epsilon (the noise multiplier is "
        "calibrated to it) or --noise-multiplier (epsilon is computed from it).",
    )
    d = t.add_argument_group("data and model")
    d.add_argument("--dataset", default="digits", help="registry name (default: digits)")
    d.add_argument("--data-path", help="data file for idx (images), npz or csv datasets")
    d.add_argument("--labels-path", help="labels file for the idx dataset")
    d.add_argument("--label-column", help="label column for the csv dataset")
    d.add_argument(
        "--test-fraction",
        type=float,
        default=0.2,
        help="share held out as the public evaluation split (default 0.2)",
    )
    d.add_argument("--split-seed", type=int, default=0, help="seed of the train/test split")
    d.add_argument("--model", default="mlp", help="registry name (default: mlp)")
    d.add_argument(
        "--model-option",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="model builder option, e.g. hidden=[256,128] (repeatable)",
    )
    p = t.add_argument_group("privacy")
    p.add_argument("--strategy", default="fixed", help="clipping strategy (default: fixed)")
    p.add_argument("--epsilon", type=_positive_float("epsilon"), help="target epsilon")
    p.add_argument(
        "--noise-multiplier",
        type=_positive_float("noise multiplier"),
        help="noise multiplier sigma (instead of --epsilon)",
    )
    p.add_argument("--delta", type=_delta, default=1e-5, help="target delta (default 1e-5)")
    p.add_argument(
        "--accountant",
        default="opacus-rdp",
        choices=(*accountant_names(), *WORKER_ALIASES),
        metavar="ACCOUNTANT",
        help="the accountant of the reported epsilon (and of --epsilon's calibration): "
        + ", ".join(f"{d.name} ({d.library})" for d in map(get_accountant, accountant_names()))
        + "; default opacus-rdp. Legacy names: rdp = opacus-rdp, prv = opacus-prv",
    )
    p.add_argument(
        "--reproducible",
        action="store_true",
        help="draw batches and noise from --seed instead of a fresh OS secret: same seed, same "
        "result (for debugging). NOT private against anyone who knows the seed",
    )
    for flag, dest, kind, text in STRATEGY_FLAGS:
        p.add_argument(flag, dest=dest, type=kind, default=None, help=text)
    p.add_argument(
        "--param",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="other strategy hyperparameter (repeatable)",
    )
    o = t.add_argument_group("training")
    o.add_argument("--epochs", type=_positive_float("epochs"), default=5.0)
    o.add_argument(
        "--steps", type=_positive_int("steps"), help="number of steps (overrides --epochs)"
    )
    o.add_argument(
        "--batch-size",
        type=_positive_int("batch size"),
        default=64,
        help="expected batch size b; the sample rate is b / n_train",
    )
    o.add_argument("--lr", type=_positive_float("lr"), default=0.5)
    o.add_argument("--optimizer", default="sgd", help="sgd (default) or adam")
    o.add_argument("--momentum", type=float, default=0.0)
    o.add_argument("--eval-every", type=_positive_int("eval every"), default=50)
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    o.add_argument(
        "--threads",
        type=_positive_int("threads"),
        default=1,
        help="CPU threads for this trial (default 1)",
    )
    t.add_argument(
        "--db",
        help="database whose privacy ledger this run is charged to (default "
        "DPSWEEP_DATABASE_URL or sqlite:///dpsweep.db): the run spends the dataset's lifetime "
        "budget like a one-trial grid, and is refused if the cap would be exceeded",
    )
    t.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    t.set_defaults(func=cmd_train, subparser=t)

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
    pl.set_defaults(func=cmd_plan, subparser=pl)

    from sweeper.cli_sweeps import add_parsers

    add_parsers(sub)

    from sweeper.cli_datasets import add_parsers as add_dataset_parsers

    add_dataset_parsers(sub)

    from sweeper.cli_tokens import add_parsers as add_token_parsers

    add_token_parsers(sub)
    for extend in extensions:
        extend(sub)

    db = sub.add_parser("db", help="database schema (Alembic migrations)")
    dbsub = db.add_subparsers(dest="db_command", metavar="ACTION")
    dbsub.required = True
    for name, text in (
        ("upgrade", "create or upgrade the schema to head"),
        ("current", "print the schema revision and head"),
    ):
        c = dbsub.add_parser(name, help=text)
        c.add_argument(
            "--db", help="database URL (default DPSWEEP_DATABASE_URL or sqlite:///dpsweep.db)"
        )
        c.set_defaults(func=cmd_db, subparser=c)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args.subparser, args) or 0)


def cmd_train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # Heavy imports only now: the client install has no torch.
    from workers.accounting import ACCOUNTANTS, calibrate_noise_multiplier
    from workers.datasets import DATASETS, DatasetSpec, dataset_names, load_dataset
    from workers.devices import DEVICES
    from workers.errors import ConfigError, DpsweepError
    from workers.models import MODELS, ModelSpec, model_names
    from workers.optim import OPTIMIZERS
    from workers.plan_check import PlannedRun
    from workers.strategies import STRATEGIES, strategy_names
    from workers.trainer import PackSpec, TrialSpec, plan_steps

    def usage(msg: str) -> None:
        parser.error(msg)  # exits with code 2

    if args.dataset not in DATASETS:
        usage(f"unknown dataset {args.dataset!r}; choose one of: {', '.join(dataset_names())}")
    if args.model not in MODELS:
        usage(f"unknown model {args.model!r}; choose one of: {', '.join(model_names())}")
    if args.strategy not in STRATEGIES:
        usage(f"unknown strategy {args.strategy!r}; choose one of: {', '.join(strategy_names())}")
    if args.accountant not in ACCOUNTANTS:
        usage(f"unknown accountant {args.accountant!r}; choose one of: {', '.join(ACCOUNTANTS)}")
    if args.optimizer not in OPTIMIZERS:
        usage(f"unknown optimizer {args.optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
    if args.device not in DEVICES:
        usage(f"unknown device {args.device!r}; choose one of: {', '.join(DEVICES)}")
    strategy_cls = STRATEGIES[args.strategy]
    if strategy_cls.private:
        if (args.epsilon is None) == (args.noise_multiplier is None):
            usage(
                f"strategy {args.strategy!r} is private: give exactly one of --epsilon or "
                "--noise-multiplier"
            )
    elif args.epsilon is not None or args.noise_multiplier is not None:
        usage("--strategy nonprivate adds no noise; drop --epsilon / --noise-multiplier")

    params: dict[str, Any] = dict(args.param)
    for flag, dest, _, _ in STRATEGY_FLAGS:
        value = getattr(args, dest)
        if value is None:
            continue
        if dest not in strategy_cls.hyperparameters:
            takes = (
                ", ".join(f"--{h.replace('_', '-')}" for h in strategy_cls.hyperparameters)
                or "no hyperparameters"
            )
            usage(f"{flag} does not apply to strategy {args.strategy!r}; it takes: {takes}")
        params[dest] = value
    model_options: dict[str, Any] = dict(args.model_option)

    err = Console(stderr=True)
    try:
        strategy_cls.validate(params)
        dataset_spec = DatasetSpec(
            name=args.dataset,
            path=args.data_path,
            labels_path=args.labels_path,
            label_column=args.label_column,
            test_fraction=args.test_fraction,
            split_seed=args.split_seed,
        )
        data = load_dataset(dataset_spec)
        q, steps = plan_steps(
            n_train=data.n_train, batch_size=args.batch_size, epochs=args.epochs, steps=args.steps
        )
        n_records = data.n_train + int(data.x_test.shape[0])
        if args.delta >= 1.0 / n_records:
            usage(
                f"--delta {args.delta:g} is >= 1/N for a dataset of N = {n_records} examples: "
                "such a guarantee allows releasing an example outright; use --delta "
                f"{10 ** math.floor(math.log10(0.1 / n_records)):g} or smaller"
            )
        sigma = args.noise_multiplier
        if strategy_cls.private and args.epsilon is not None:
            sigma = calibrate_noise_multiplier(
                target_epsilon=args.epsilon,
                target_delta=args.delta,
                sample_rate=q,
                steps=steps,
                accountant=args.accountant,
            )
        charge = _charge_training_run(args, dataset_spec, data, q=q, steps=steps, sigma=sigma)
        spec = PackSpec(
            dataset=dataset_spec,
            model=ModelSpec(args.model, model_options),
            strategy=args.strategy,
            trials=[
                TrialSpec(
                    lr=args.lr,
                    seed=args.seed,
                    noise_multiplier=sigma,
                    target_delta=args.delta,
                    params=params,
                )
            ],
            batch_size=args.batch_size,
            epochs=args.epochs,
            steps=args.steps,
            optimizer=args.optimizer,
            momentum=args.momentum,
            eval_every=args.eval_every,
            accountant=args.accountant,
            device=args.device,
            threads=args.threads,
            randomness="reproducible" if args.reproducible else "secret",
            # The run refuses to start unless it is exactly what was charged.
            planned=PlannedRun(
                strategy=args.strategy,
                sample_rate=q,
                steps=steps,
                noise_multiplier=sigma,
                dataset_sha256=data.content_sha256,
            )
            if strategy_cls.private
            else None,
        )
        show_bar = not args.json or err.is_terminal
        result = _run_with_progress(spec, data, show_bar=show_bar, console=err)
    except ConfigError as exc:
        usage(str(exc))
        return EXIT_USAGE  # unreachable: usage exits
    except DpsweepError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return EXIT_FAILURE

    summary = result.summary()
    summary["ledger"] = charge
    if args.json:
        summary.pop("reliability", None)
        summary.update(
            {"dataset": args.dataset, "model": args.model, "batch_size": args.batch_size}
        )
        print(json.dumps(summary))
    else:
        _print_summary(Console(), summary, args)
    return 0


def _charge_training_run(
    args: argparse.Namespace, dataset_spec: Any, data: Any, *, q: float, steps: int, sigma: Any
) -> dict[str, Any] | None:
    """Charge a `dpsweep train` run to its dataset's ledger, like a one-trial grid.

    The run reserves and is charged, before it touches the data, the epsilon of its own
    noise, rate and steps; a cap that cannot cover it refuses the run (BudgetExhausted). A
    non-private run has no finite epsilon to record, so it is refused on a dataset with an
    epsilon cap and, elsewhere, runs uncharged (the summary says so).

    Returns:
        What was charged (``None`` for a non-private run).
    """
    from sweeper.catalog import bind_name
    from sweeper.cli_sweeps import _engine
    from sweeper.ledger import BudgetLedger
    from sweeper.store import new_id
    from workers.accounting import compute_epsilon
    from workers.errors import PrivacyError

    name = (
        dataset_spec.name
        if dataset_spec.path is None
        else f"{dataset_spec.name}:{dataset_spec.path}"
    )
    engine = _engine(args.db, migrate=True)
    try:
        binding = bind_name(
            engine,
            name,
            data.content_sha256,
            new_row={"config": {"name": dataset_spec.name, "path": dataset_spec.path}},
        )
        ledger = BudgetLedger(engine)
        key = binding.ledger_key
        if sigma is None:
            if ledger.summary(key).epsilon_cap is not None:
                raise PrivacyError(
                    f"dataset {name!r} has a lifetime epsilon cap, and a non-private run would "
                    "spend without bound; train it with a private strategy"
                )
            return None
        epsilon = compute_epsilon(
            noise_multiplier=sigma,
            sample_rate=q,
            steps=steps,
            target_delta=args.delta,
            accountant=args.accountant,
        )
        run_id = f"train_{new_id()}"
        note = f"dpsweep train: one {args.strategy} run on {name!r}"
        ledger.reserve(key, sweep_id=run_id, epsilon=epsilon, delta=args.delta, note=note)
        ledger.charge(
            key, sweep_id=run_id, trial_id=run_id, epsilon=epsilon, delta=args.delta, note=note
        )
        return {
            "run": run_id,
            "dataset": name,
            "epsilon_charged": epsilon,
            "delta_charged": args.delta,
            "covers": "this one training run (a one-trial grid), charged to the dataset's "
            "lifetime budget",
        }
    finally:
        engine.dispose()


def cmd_db(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from sweeper import db

    url = db.database_url(args.db)
    try:
        if args.db_command == "upgrade":
            db.upgrade(url)
        shown = db.display_url(url)
        print(f"{shown}: schema revision {db.current_revision(url)} (head {db.head_revision()})")
    except Exception as exc:  # a driver or connection error: say which database failed
        Console(stderr=True).print(f"[red]error:[/red] {db.display_url(url)}: {exc}")
        return EXIT_FAILURE
    return 0


PLAN_KEYS = (
    "arm",
    "strategy",
    "epsilon_budget",
    "delta",
    "trials",
    "steps_per_trial",
    "sample_rate",
    "noise_multiplier",
    "epsilon_per_trial",
    "epsilon_total",
    "epsilon_verified",
    "accounting",
)


def _resolved_dataset(spec: Any, url: str | None) -> Any:
    """The spec's worker dataset; the database is opened only for catalog names."""
    from sweeper.catalog import in_catalog, resolve

    needs_db = in_catalog(spec.dataset.name) or spec.eval.mode == "public"
    if not needs_db:
        return resolve(None, spec.dataset, spec.eval)
    from sweeper.cli_sweeps import _engine

    return resolve(_engine(url, migrate=True), spec.dataset, spec.eval)


def cmd_plan(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from sweeper.planner import plan_sweep
    from sweeper.spec import load_spec
    from workers.errors import ConfigError, DpsweepError

    err = Console(stderr=True)
    try:
        spec = load_spec(args.spec)
        plan = plan_sweep(spec, dataset=_resolved_dataset(spec, getattr(args, "db", None)))
    except ConfigError as exc:
        parser.error(str(exc))
        return EXIT_USAGE  # unreachable
    except DpsweepError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return EXIT_FAILURE
    rows = [g.to_dict() for g in plan.grids]
    if args.json:
        extra = (
            "delta_per_trial",
            "gradient_noise_multiplier",
            "accountant",
            "verified_by",
            "release",
            "input_scaling",
            "count_noise",
            "warnings",
            "n_train",
            "n_eval",
            "eval_mode",
            "eval_dataset",
            "eval_releases",
            "eval_noise_multiplier",
            "epsilon_eval",
        )
        print(json.dumps([{k: r[k] for k in (*PLAN_KEYS, *extra)} for r in rows]))
        return 0
    table = Table(title=f"privacy plan: {spec.name} ({spec.privacy.accounting})")
    for col in (
        "arm",
        "level ε",
        "trials",
        "σ",
        "σ_g",
        "ε per trial",
        "grid ε",
        "verified ε",
        "steps",
        "q",
        "release",
    ):
        table.add_column(col, justify="left" if col in ("arm", "release") else "right")
    for r in rows:
        table.add_row(
            r["arm"],
            f"{r['epsilon_budget']:g}",
            str(r["trials"]),
            f"{r['noise_multiplier']:.4g}",
            f"{r['gradient_noise_multiplier']:.4g}",
            f"{r['epsilon_per_trial']:.4g}",
            f"{r['epsilon_total']:.4g}",
            f"{r['epsilon_verified']:.4g}",
            str(r["steps_per_trial"]),
            f"{r['sample_rate']:.4g}",
            r["release"],
        )
    console = Console() if sys.stdout.isatty() else Console(width=160)
    console.print(table)
    from sweeper.releases import evaluation_statement, sweep_release

    whole = sweep_release(rows)
    assert whole is not None
    console.print(
        f"whole sweep: epsilon {whole['epsilon']:.4g} at delta {whole['delta']:.3g} "
        f"({whole['method']}; the grids' sum, which the dataset's ledger is charged, is "
        f"{plan.epsilon_total:.4g}); grids verified by {rows[0]['verified_by']}"
    )
    for r in rows:
        if r.get("count_noise") is not None:
            console.print(
                f"{r['arm']} at ε {r['epsilon_budget']:g}: quantile count noise sigma_b = "
                f"{r['count_noise']:.4g} (chosen: the spec leaves count_noise out)"
            )
        if r.get("eval_releases"):
            console.print(
                f"{r['arm']} at ε {r['epsilon_budget']:g}: DP evaluation, {r['eval_releases']} "
                f"noisy counts per trial at sigma_e = {r['eval_noise_multiplier']:.4g} "
                f"(the evaluations alone: ε {r['epsilon_eval']:.4g}; included in the grid's ε)"
            )
        for w in r.get("warnings") or ():
            console.print(
                f"[bold yellow]warning[/bold yellow] ({r['arm']} at ε {r['epsilon_budget']:g}): {w}"
            )
    if rows[0].get("input_scaling"):
        from sweeper.cli_sweeps import describe_scaling

        console.print(describe_scaling(rows[0]["input_scaling"]))
    console.print(evaluation_statement(rows)["statement"])
    return 0


def _run_with_progress(spec: Any, data: Any, *, show_bar: bool, console: Console) -> Any:
    from workers.trainer import train_pack

    if not show_bar:
        return train_pack(spec, dataset=data)[0]
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]training[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("train", total=None, status="")

        def on_progress(p: Any) -> None:
            bar.update(task, completed=p.step, total=p.total_steps)
            if p.evals:
                m = p.evals[0]
                status = f"acc {m['accuracy']:.3f}" if "accuracy" in m else f"mse {m['mse']:.4f}"
                bar.update(task, status=status)

        return train_pack(spec, dataset=data, progress=on_progress)[0]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _print_summary(console: Console, s: dict[str, Any], args: argparse.Namespace) -> None:
    table = Table(title=f"{args.strategy} · {args.model} on {args.dataset}", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    rows = [
        ("accuracy", s["accuracy"]),
        ("loss", s["loss"]),
        ("mse", s["mse"]),
        ("ECE", s["ece"]),
        ("MCE", s["mce"]),
        ("best step", s["best_step"]),
        ("steps", s["steps"]),
        ("epsilon (this run alone)", s["epsilon"] if s["private"] else "inf (non-private)"),
        ("delta", s["delta"]),
        ("noise multiplier", s["noise_multiplier"]),
        ("sample rate", s["sample_rate"]),
        ("accountant", s["accountant"]),
        ("final clip C_t", s["clip_final"]),
        ("final learning rate", s["lr_final"]),
        ("step time (median ms)", s["step_time_ms_median"]),
        ("device", s["device"]),
        ("randomness", s["randomness"]),
    ]
    for name, v in rows:
        if v is not None:
            table.add_row(name, _fmt(v))
    if s.get("diverged_at") is not None:
        table.add_row("diverged at step", str(s["diverged_at"]))
    console.print(table)
    ledger = s.get("ledger")
    if ledger:
        console.print(
            f"charged ε {ledger['epsilon_charged']:.4g}, δ {ledger['delta_charged']:g} to the "
            f"lifetime budget of {ledger['dataset']} (run {ledger['run']})"
        )
    elif s["private"] is False:
        console.print("not private: nothing could be charged to the dataset's ledger")
    if s.get("warning"):
        console.print(f"[bold yellow]warning:[/bold yellow] {s['warning']}")


if __name__ == "__main__":
    sys.exit(main())
