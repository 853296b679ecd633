"""``dpsweep train``: one DP model (a single trial), charged to its dataset's ledger."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, NoReturn

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from api.cli.arguments import (
    delta,
    key_value,
    positive_float,
    positive_int,
    strategy_flags,
)
from api.cli.common import EXIT_FAILURE, EXIT_USAGE, open_engine
from dpsweep.errors import ConfigError, DpsweepError, PrivacyError
from dpsweep.spec import (
    ArmConfig,
    DatasetConfig,
    ModelConfig,
    PrivacyConfig,
    SweepSpec,
    TrainingConfig,
)

#: The learning rate of a run that names none.
DEFAULT_LR = 0.5
#: ... and under the ``lipschitz`` strategy, whose noise is sigma times a *worst-case* bound on
#: every per-sample gradient (S ~ 20 for lip_mlp on digits, against a typical clipping C <= 1):
#: at lr 0.5 those steps drive the network to chance. 0.01 is the best of {0.003, 0.007, 0.01,
#: 0.015, 0.02, 0.05} for lip_mlp on digits at epsilon = 8 with the other defaults (accuracy
#: 0.62-0.69 over five runs, against chance at 0.5); report/ experiment 4 (batch 128) found its
#: grids' best lrs at 0.001-0.006 too.
LIPSCHITZ_LR = 0.01


def default_lr(strategy: str) -> float:
    """The learning rate ``dpsweep train`` uses when ``--lr`` is not given."""
    return LIPSCHITZ_LR if strategy == "lipschitz" else DEFAULT_LR


def add_parsers(sub: Any) -> None:
    """Register ``dpsweep train`` on the top-level subparsers."""
    # Torch-free: the registry imports no accountant library.
    from workers.accounting.registry import WORKER_ALIASES, accountant_names, get_accountant

    t = sub.add_parser(
        "train",
        help="train one DP model (a single trial) and report its metrics and epsilon",
        description="Train one model with DP-SGD. Give --epsilon (the noise multiplier is "
        "calibrated to it) or --noise-multiplier (epsilon is computed from it).",
    )
    d = t.add_argument_group("data and model")
    d.add_argument(
        "--dataset",
        default="digits",
        help="loader name (default: digits; `dpsweep plugins` lists them), a name registered "
        "with `dpsweep datasets register` or an upload id (ds_...; read as its owner declared, "
        "charged to its ledger, as a spec's dataset.name), or a local module:function factory "
        "returning workers.datasets.RawData",
    )
    d.add_argument("--data-path", help="data file for idx (images), npz or csv datasets")
    d.add_argument("--labels-path", help="labels file for the idx dataset")
    d.add_argument("--label-column", help="label column for the csv dataset")
    d.add_argument(
        "--test-fraction",
        type=float,
        default=None,
        help="share held out as the public evaluation split (default 0.2; for a registered "
        "dataset, the one its owner set)",
    )
    d.add_argument(
        "--split-seed",
        type=int,
        default=None,
        help="seed of the train/test split (default 0; for a registered dataset, its owner's)",
    )
    d.add_argument(
        "--model",
        default="mlp",
        help="registry name (default: mlp; `dpsweep plugins` lists them), or a local "
        "module:function factory fn(input_shape, num_classes) -> torch.nn.Module",
    )
    d.add_argument(
        "--model-option",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="model builder option, e.g. hidden=[256,128] (repeatable)",
    )
    p = t.add_argument_group("privacy")
    p.add_argument("--strategy", default="fixed", help="clipping strategy (default: fixed)")
    p.add_argument("--epsilon", type=positive_float("epsilon"), help="target epsilon")
    p.add_argument(
        "--noise-multiplier",
        type=positive_float("noise multiplier"),
        help="noise multiplier sigma (instead of --epsilon)",
    )
    p.add_argument("--delta", type=delta, default=1e-5, help="target delta (default 1e-5)")
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
    o = t.add_argument_group("training")
    o.add_argument("--epochs", type=positive_float("epochs"), default=5.0)
    o.add_argument(
        "--steps", type=positive_int("steps"), help="number of steps (overrides --epochs)"
    )
    o.add_argument(
        "--batch-size",
        type=positive_int("batch size"),
        default=64,
        help="expected batch size b; the sample rate is b / n_train",
    )
    o.add_argument(
        "--lr",
        type=positive_float("lr"),
        default=None,
        help=f"learning rate (default {DEFAULT_LR:g}; {LIPSCHITZ_LR:g} with --strategy lipschitz)",
    )
    o.add_argument("--optimizer", default="sgd", help="sgd (default) or adam")
    o.add_argument("--momentum", type=float, default=0.0)
    o.add_argument("--eval-every", type=positive_int("eval every"), default=50)
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    o.add_argument(
        "--threads",
        type=positive_int("threads"),
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


def cmd_train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Train one model as the flags say; print its metrics and the epsilon charged."""
    # Loaded when the command runs, not with the parser (`dpsweep --help`): torch, numpy, scipy,
    # the database, and the torch-free registries the parser does not need.
    from workers.accounting import ACCOUNTANTS, calibrate_noise_multiplier  # deferred: scipy
    from workers.datasets.loading import load_dataset  # deferred: numpy
    from workers.datasets.records import DatasetSpec  # deferred: numpy
    from workers.datasets.registry import has_loader  # deferred: numpy
    from workers.devices import DEVICES  # deferred: torch
    from workers.factories import is_factory_name, load_factory  # deferred: not for the parser
    from workers.model_check import check_model  # deferred: not for the parser
    from workers.models import ModelSpec, get_model_descriptor, model_names  # deferred: as above
    from workers.optim import OPTIMIZERS  # deferred: torch
    from workers.plan_check import PlannedRun  # deferred: not for the parser
    from workers.schedule import plan_steps  # deferred: not for the parser
    from workers.strategies import STRATEGIES, strategy_names  # deferred: torch (its classes)
    from workers.training.specs import TrialSpec, training_pack  # deferred: numpy

    def usage(msg: str) -> NoReturn:
        parser.error(msg)  # exits with code 2

    # A local `module:function` factory is imported and registered under that string, in this
    # process only (the REST API never does this: it resolves registered names).
    try:
        for name, kind in ((args.dataset, "datasets"), (args.model, "models")):
            if is_factory_name(name):
                load_factory(name, kind)
    except ConfigError as exc:
        usage(str(exc))
    # A loader name (plug-ins and factories included) is read with the flags; any other name
    # is looked up in the catalog of --db (a registered name or an upload), as a spec's.
    stored = not has_loader(args.dataset)
    if stored and (args.data_path or args.labels_path or args.label_column):
        usage(
            f"--dataset {args.dataset!r} is not a loader, so it names a registered dataset: it "
            "reads the file it was registered with; leave out --data-path, --labels-path and "
            "--label-column"
        )
    if args.model not in model_names():  # (model_names() includes plug-ins)
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
    for flag, dest, _, _ in strategy_flags():
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

    # The same typed sections and the same builder as a sweep's packs: the flags are
    # validated by the spec's own models and the model's descriptor (a bad value is a usage
    # error naming the flag) before any data is read or any budget charged.
    try:
        model = ModelConfig(name=args.model, options=model_options)
        training = TrainingConfig(
            epochs=args.epochs,
            steps=args.steps,
            batch_size=args.batch_size,
            optimizer=args.optimizer,
            momentum=args.momentum,
            eval_every=args.eval_every,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = "--" + "-".join(str(p) for p in first["loc"]).replace("_", "-")
        usage(f"{flag}: {first['msg']}")
    try:
        get_model_descriptor(args.model).validate(model_options)
    except ConfigError as exc:
        usage(f"--model-option: {exc}")

    err = Console(stderr=True)
    try:
        strategy_cls.validate(params)
        if stored:
            dataset_spec = _stored_dataset(parser, args, model=model, training=training)
        else:
            dataset_spec = DatasetSpec(
                name=args.dataset,
                path=args.data_path,
                labels_path=args.labels_path,
                label_column=args.label_column,
                test_fraction=0.2 if args.test_fraction is None else args.test_fraction,
                split_seed=0 if args.split_seed is None else args.split_seed,
            )
        data = load_dataset(dataset_spec)
        # The model on this data, as the run would build it (the generic path's layer check
        # included: BatchNorm, Dropout), before anything is charged: a refused model costs
        # nothing. The same check as a sweep's planning (workers.model_check).
        check_model(
            ModelSpec(args.model, model_options),
            input_shape=tuple(data.input_shape),
            num_classes=int(data.num_classes),
            vocab_size=data.vocab_size,
            strategies=[args.strategy],
        )
        # N and q as a sweep's plan takes them: a stored dataset's size is its owner's
        # declaration (the records' own count is private), a loader's is counted.
        q, steps = plan_steps(
            n_train=data.planning_n_train,
            batch_size=args.batch_size,
            epochs=args.epochs,
            steps=args.steps,
        )
        n_records = data.planning_n_private
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
        charge = _charge_training_run(
            args, dataset_spec, data, stored=stored, q=q, steps=steps, sigma=sigma
        )
        spec = training_pack(
            model=model,
            training=training,
            strategy=args.strategy,
            trials=[
                TrialSpec(
                    lr=default_lr(args.strategy) if args.lr is None else args.lr,
                    seed=args.seed,
                    noise_multiplier=sigma,
                    target_delta=args.delta,
                    params=params,
                )
            ],
            dataset=dataset_spec,
            accountant=args.accountant,
            reproducible=args.reproducible,
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
            device=args.device,
            threads=args.threads,
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


def _stored_dataset(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *, model: Any, training: Any
) -> Any:
    """The worker spec of a registered name or an upload, resolved as a spec's ``dataset.name``.

    The run is admitted as the one-trial sweep it is (:func:`sweeper.sweeps.admission.admit`,
    local use: the owner's), so the owner's view of the records applies: loader options, label
    column, class list and declared size from the registration, and the split and scaling
    settings the owner set wherever the flags leave them out (``--test-fraction``,
    ``--split-seed``). Then :func:`sweeper.datasets.resolution.resolve` gives the stored file's
    worker spec, its declared size included, exactly as for a sweep.

    Raises:
        ConfigError: a setting out of range (the usage error names the field).
    """
    from sweeper.datasets.access import Viewer  # deferred: SQLAlchemy
    from sweeper.datasets.fixed_view import stored_row  # deferred: SQLAlchemy
    from sweeper.datasets.resolution import resolve  # deferred: SQLAlchemy
    from sweeper.sweeps.admission import admit  # deferred: SQLAlchemy
    from workers.datasets.registry import dataset_names  # deferred: numpy

    given = {
        field: value
        for field in ("test_fraction", "split_seed")
        if (value := getattr(args, field)) is not None
    }
    engine = open_engine(args.db, migrate=True)
    try:
        if stored_row(engine, args.dataset) is None:
            parser.error(
                f"unknown dataset {args.dataset!r}; choose one of: {', '.join(dataset_names())}, "
                "or a name registered with `dpsweep datasets register` in --db (`dpsweep "
                "datasets list` lists them)"
            )
        # Admission reads the dataset section (and reproducible mode) only; the other sections
        # are this run's own, so that the spec is a valid one.
        try:
            spec = SweepSpec(
                name="dpsweep-train",
                dataset=DatasetConfig(name=args.dataset, **given),
                model=model,
                training=training,
                privacy=PrivacyConfig(
                    budgets=[args.epsilon or 1.0],
                    delta=args.delta,
                    reproducible=args.reproducible,
                ),
                arms=[ArmConfig(strategy=args.strategy)],
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            parser.error(f"--{str(first['loc'][-1]).replace('_', '-')}: {first['msg']}")
        admitted = admit(engine, spec, Viewer(None))
        return resolve(engine, admitted.spec.dataset)
    finally:
        engine.dispose()


def _charge_training_run(
    args: argparse.Namespace,
    dataset_spec: Any,
    data: Any,
    *,
    stored: bool,
    q: float,
    steps: int,
    sigma: Any,
) -> dict[str, Any] | None:
    """Charge a `dpsweep train` run to its dataset's ledger, like a one-trial grid.

    The run reserves and is charged, before it touches the data, the epsilon of its own
    noise, rate and steps; a cap that cannot cover it refuses the run (BudgetExhausted). A
    non-private run has no finite epsilon to record, so it is refused on a dataset with an
    epsilon cap and, elsewhere, runs uncharged (the summary says so).

    A stored dataset (``stored``: a registered name or an upload) is charged on the ledger its
    name was bound to when it was registered, as a sweep is
    (:func:`sweeper.datasets.identity.ledger_key_of`); a loader name or a file path is bound
    here to the records the run read.

    Returns:
        What was charged (``None`` for a non-private run).
    """
    from sweeper.datasets.identity import bind_name, ledger_key_of  # deferred: SQLAlchemy
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger  # deferred: SQLAlchemy
    from sweeper.privacy.release_log import record_run  # deferred: SQLAlchemy
    from sweeper.store import new_id  # deferred: SQLAlchemy
    from workers.accounting import compute_epsilon  # deferred: scipy

    if stored:
        name = args.dataset
    elif dataset_spec.path is None:
        name = dataset_spec.name
    else:
        name = f"{dataset_spec.name}:{dataset_spec.path}"
    engine = open_engine(args.db, migrate=True)
    try:
        if stored:
            key = ledger_key_of(engine, name)
        else:
            key = bind_name(
                engine,
                name,
                data.content_sha256,
                new_row={"config": {"name": dataset_spec.name, "path": dataset_spec.path}},
            ).ledger_key
        ledger = BudgetLedger(engine)
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
        # Attributable: the charge is in the release log (kind train) before anything of the
        # run is shown.
        record_run(
            engine,
            ledger_key=key,
            dataset_name=name,
            principal=None,
            run_id=run_id.removeprefix("train_"),
            kind="train",
            epsilon=epsilon,
            delta=args.delta,
            detail={"released": ["model", "metrics"], "strategy": args.strategy},
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


def _run_with_progress(spec: Any, data: Any, *, show_bar: bool, console: Console) -> Any:
    from workers.training.loop import train_pack  # deferred: torch

    if not show_bar:
        return train_pack(spec, dataset=data)[0]

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
