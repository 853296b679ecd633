"""``dpsweep train``: one DP model (a single trial), charged to its dataset's ledger."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any, NoReturn

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from api.cli.arguments import strategy_flags
from api.cli.common import EXIT_FAILURE, EXIT_USAGE, open_engine
from api.cli.train_flags import DEFAULT_LR, LIPSCHITZ_LR, add_train_parser, default_lr
from dpsweep.errors import ConfigError, DpsweepError
from dpsweep.spec import (
    ArmConfig,
    DatasetConfig,
    ModelConfig,
    PrivacyConfig,
    SweepSpec,
    TrainingConfig,
)

# Re-exported: the tests and the report import them from here.
__all__ = ["DEFAULT_LR", "LIPSCHITZ_LR", "add_parsers", "cmd_train", "default_lr"]


def add_parsers(sub: Any) -> None:
    """Register ``dpsweep train`` on the top-level subparsers."""
    add_train_parser(sub, func=cmd_train)


def cmd_train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Train one model as the flags say; print its metrics and the epsilon charged."""
    from workers.strategies import STRATEGIES  # deferred: torch (its classes)

    def usage(msg: str) -> NoReturn:
        parser.error(msg)  # exits with code 2

    stored = _check_names(args, usage)
    strategy_cls = STRATEGIES[args.strategy]
    params = _strategy_params(args, strategy_cls, usage)
    model, training = _typed_sections(args, usage)
    err = Console(stderr=True)
    try:
        strategy_cls.validate(params)
        dataset_spec = _dataset_spec(parser, args, stored=stored, model=model, training=training)
        result, charge = _plan_charge_and_train(
            args, usage, dataset_spec, stored=stored, private=strategy_cls.private,
            params=params, model=model, training=training, console=err,
        )  # fmt: skip
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


def _check_names(args: argparse.Namespace, usage: Callable[[str], NoReturn]) -> bool:
    """Every registry name the flags give, checked (a usage error otherwise); whether the
    dataset is a stored one (a registered name or an upload) rather than a loader."""
    # Loaded when the command runs, not with the parser (`dpsweep --help`).
    from workers.accounting import ACCOUNTANTS  # deferred: scipy
    from workers.datasets.registry import has_loader  # deferred: numpy
    from workers.devices import DEVICES  # deferred: torch
    from workers.factories import is_factory_name, load_factory  # deferred: not for the parser
    from workers.models import model_names  # deferred: not for the parser
    from workers.optim import OPTIMIZERS  # deferred: torch
    from workers.strategies import STRATEGIES, strategy_names  # deferred: torch

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
    for flag, value, known in (
        ("model", args.model, model_names()),  # (model_names() includes plug-ins)
        ("strategy", args.strategy, strategy_names()),
        ("accountant", args.accountant, list(ACCOUNTANTS)),
        ("optimizer", args.optimizer, list(OPTIMIZERS)),
        ("device", args.device, list(DEVICES)),
    ):
        if value not in known:
            usage(f"unknown {flag} {value!r}; choose one of: {', '.join(known)}")
    if STRATEGIES[args.strategy].private:
        if (args.epsilon is None) == (args.noise_multiplier is None):
            usage(
                f"strategy {args.strategy!r} is private: give exactly one of --epsilon or "
                "--noise-multiplier"
            )
    elif args.epsilon is not None or args.noise_multiplier is not None:
        usage("--strategy nonprivate adds no noise; drop --epsilon / --noise-multiplier")
    return stored


def _strategy_params(
    args: argparse.Namespace, strategy_cls: Any, usage: Callable[[str], NoReturn]
) -> dict[str, Any]:
    """The strategy's hyperparameters from its flags and ``--param``; a flag the strategy does
    not take is a usage error."""
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
    return params


def _typed_sections(
    args: argparse.Namespace, usage: Callable[[str], NoReturn]
) -> tuple[ModelConfig, TrainingConfig]:
    """The model and training sections, typed as a sweep's: the flags are validated by the
    spec's own models and the model's descriptor (a bad value is a usage error naming the
    flag) before any data is read or any budget charged."""
    from workers.models import get_model_descriptor  # deferred: not for the parser

    model_options: dict[str, Any] = dict(args.model_option)
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
    return model, training


def _dataset_spec(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    *,
    stored: bool,
    model: ModelConfig,
    training: TrainingConfig,
) -> Any:
    """The worker's dataset spec: a stored dataset's as its owner declared it, else the flags'."""
    from workers.datasets.records import DatasetSpec  # deferred: numpy

    if stored:
        return _stored_dataset(parser, args, model=model, training=training)
    return DatasetSpec(
        name=args.dataset,
        path=args.data_path,
        labels_path=args.labels_path,
        label_column=args.label_column,
        test_fraction=0.2 if args.test_fraction is None else args.test_fraction,
        split_seed=0 if args.split_seed is None else args.split_seed,
    )


def _plan_charge_and_train(
    args: argparse.Namespace,
    usage: Callable[[str], NoReturn],
    dataset_spec: Any,
    *,
    stored: bool,
    private: bool,
    params: dict[str, Any],
    model: ModelConfig,
    training: TrainingConfig,
    console: Console,
) -> tuple[Any, dict[str, Any] | None]:
    """Load the data, check the model on it, plan the noise, charge the run, then train it:
    everything that can be refused is checked before the charge, and the run refuses to start
    unless it is exactly what was charged."""
    from workers.datasets.loading import load_dataset  # deferred: numpy
    from workers.model_check import check_model  # deferred: not for the parser
    from workers.models import ModelSpec  # deferred: not for the parser
    from workers.plan_check import PlannedRun  # deferred: not for the parser
    from workers.training.specs import TrialSpec, training_pack  # deferred: numpy

    data = load_dataset(dataset_spec)
    # The model on this data, as the run would build it (the generic path's layer check
    # included: BatchNorm, Dropout), before anything is charged: a refused model costs
    # nothing. The same check as a sweep's planning (workers.model_check).
    check_model(
        ModelSpec(args.model, dict(args.model_option)),
        input_shape=tuple(data.input_shape),
        num_classes=int(data.num_classes),
        vocab_size=data.vocab_size,
        strategies=[args.strategy],
    )
    q, steps, sigma = _planned_noise(args, usage, data, private=private)
    charge = _charge(args, dataset_spec, data, stored=stored, q=q, steps=steps, sigma=sigma)
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
            strategy=args.strategy, sample_rate=q, steps=steps, noise_multiplier=sigma,
            dataset_sha256=data.content_sha256,
        ) if private and sigma is not None else None,
        device=args.device,
        threads=args.threads,
    )  # fmt: skip
    show_bar = not args.json or console.is_terminal
    return _run_with_progress(spec, data, show_bar=show_bar, console=console), charge


def _planned_noise(
    args: argparse.Namespace, usage: Callable[[str], NoReturn], data: Any, *, private: bool
) -> tuple[float, int, float | None]:
    """q and T as a sweep's plan takes them, and sigma (given, or calibrated to --epsilon)."""
    from workers.accounting import calibrate_noise_multiplier  # deferred: scipy
    from workers.schedule import plan_steps  # deferred: not for the parser

    # A stored dataset's size is its owner's declaration (the records' own count is private),
    # a loader's is counted.
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
    if private and args.epsilon is not None:
        sigma = calibrate_noise_multiplier(
            target_epsilon=args.epsilon,
            target_delta=args.delta,
            sample_rate=q,
            steps=steps,
            accountant=args.accountant,
        )
    return q, steps, sigma


def _charge(
    args: argparse.Namespace,
    dataset_spec: Any,
    data: Any,
    *,
    stored: bool,
    q: float,
    steps: int,
    sigma: float | None,
) -> dict[str, Any] | None:
    """Charge the run to its dataset's ledger in ``--db`` (:mod:`sweeper.runs.training_charge`)."""
    from sweeper.runs.training_charge import TrainingRun, charge_training_run  # deferred: DB

    if stored:
        name = args.dataset
    elif dataset_spec.path is None:
        name = dataset_spec.name
    else:
        name = f"{dataset_spec.name}:{dataset_spec.path}"
    run = TrainingRun(
        name=name,
        stored=stored,
        content_sha256=data.content_sha256,
        config={"name": dataset_spec.name, "path": dataset_spec.path},
        strategy=args.strategy,
        noise_multiplier=sigma,
        sample_rate=q,
        steps=steps,
        delta=args.delta,
        accountant=args.accountant,
    )
    engine = open_engine(args.db, migrate=True)
    try:
        return charge_training_run(engine, run)
    finally:
        engine.dispose()


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
