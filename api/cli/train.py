"""``dpsweep train``: one DP model (a single trial), charged to its dataset's ledger."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from api.cli.arguments import strategy_flags
from api.cli.common import EXIT_FAILURE, check_owner, confirm_charge, open_engine
from api.cli.train_flags import DEFAULT_LR, LIPSCHITZ_LR, add_train_parser, default_lr
from dpsweep.errors import ConfigError, DpsweepError
from dpsweep.plan_fields import unit_suffix
from dpsweep.spec import DatasetConfig, ModelConfig, TrainingConfig
from dpsweep.spec_model import LoraConfig

# Re-exported: the tests and the report import them from here.
__all__ = ["DEFAULT_LR", "LIPSCHITZ_LR", "add_parsers", "cmd_train", "default_lr"]


def add_parsers(sub: Any) -> None:
    """Register ``dpsweep train`` on the top-level subparsers."""
    add_train_parser(sub, func=cmd_train)


def cmd_train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Train one model as the flags say; print its metrics and the epsilon charged.

    The run goes through the one path of one-off runs (:mod:`sweeper.runs.single_run`): the
    same admission, checks and plan as a sweep's, then its charge
    (:func:`sweeper.runs.one_off_charge.charge_training_run`), before anything trains.
    """
    from sweeper.runs.one_off_cost import NotConfirmed  # deferred: SQLAlchemy
    from workers.strategies import STRATEGIES  # deferred: torch (its classes)

    def usage(msg: str) -> NoReturn:
        parser.error(msg)  # exits with code 2

    args.model = _model_name(args)
    stored = _check_names(args, usage)
    params = _strategy_params(args, STRATEGIES[args.strategy], usage)
    run = _single_run(args, usage, params)
    err = Console(stderr=True)
    try:
        prepared, charge, name = _prepare_and_charge(args, usage, run, stored=stored)
    except NotConfirmed as exc:
        # One line, unwrapped: the cost and how to go on.
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except ConfigError as exc:
        usage(_flag_message(exc))
    except DpsweepError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return EXIT_FAILURE
    show_bar = not args.json or err.is_terminal
    result = _run_with_progress(prepared.pack, prepared.data, show_bar=show_bar, console=err)
    summary = result.summary()
    summary["ledger"] = charge
    if args.output is not None:
        kept = _keep_model(Path(args.output), prepared, result, summary, charge, name)
        if kept is None:
            return EXIT_FAILURE
        summary["kept"] = kept
    if args.json:
        summary.pop("reliability", None)
        summary.update(
            {"dataset": args.dataset, "model": args.model, "batch_size": args.batch_size}
        )
        print(json.dumps(summary))
    else:
        _print_summary(Console(), summary, args)
    return 0


def _model_name(args: argparse.Namespace) -> str:
    """``--model``, or by default ``hf`` for a transformers ``--checkpoint`` directory (it
    holds config.json) and ``mlp`` otherwise."""
    if args.model is not None:
        return str(args.model)
    checkpoint = getattr(args, "checkpoint", None)
    if checkpoint and (Path(checkpoint).expanduser() / "config.json").is_file():
        return "hf"
    return "mlp"


def _model_config(args: argparse.Namespace, usage: Callable[[str], NoReturn]) -> ModelConfig:
    """The model section from ``--model``, ``--model-option``, ``--checkpoint``,
    ``--trainable`` and the ``--lora-*`` flags (a bad combination is a usage error)."""
    trainable: Any = args.trainable
    lora_given = args.lora_r is not None or args.lora_alpha is not None or args.lora_target
    if trainable is None:
        trainable = "lora" if lora_given else "all"
    elif trainable not in ("all", "head", "lora"):
        trainable = [p.strip() for p in trainable.split(",") if p.strip()]
    if lora_given and trainable != "lora":
        usage("--lora-r, --lora-alpha and --lora-target need --trainable lora")
    lora: LoraConfig | None = None
    if trainable == "lora":
        given: dict[str, Any] = {
            k: v
            for k, v in (
                ("r", args.lora_r),
                ("alpha", args.lora_alpha),
                ("target_modules", list(args.lora_target) or None),
            )
            if v is not None
        }
        lora = LoraConfig(**given)
    return ModelConfig(
        name=args.model,
        options=dict(args.model_option),
        checkpoint=args.checkpoint,
        trainable=trainable,
        lora=lora,
    )


def _dataset_options(args: argparse.Namespace, model: ModelConfig) -> dict[str, Any]:
    """``--dataset-option`` pairs; a ``text_csv`` file read for a transformers checkpoint
    (``--model hf``) is tokenized by the checkpoint's own tokenizer unless a vocabulary or
    tokenizer is given (a local directory: the checkpoint path itself)."""
    options: dict[str, Any] = dict(args.dataset_option)
    checkpoint = model.checkpoint
    if (
        args.dataset == "text_csv"
        and model.name == "hf"
        and checkpoint is not None
        and "vocab" not in options
        and "tokenizer" not in options
        and Path(checkpoint).expanduser().is_dir()
    ):
        options["tokenizer"] = str(Path(checkpoint).expanduser())
    return options


def _check_names(args: argparse.Namespace, usage: Callable[[str], NoReturn]) -> bool:
    """The flags' own checks (a usage error otherwise): factories loaded, the trainer's names
    known, the noise flags' shape; whether the dataset is a stored one (a registered name or an
    upload) rather than a loader. The registry names and options are the single-run service's
    to check (:func:`sweeper.runs.single_run.check_single_run`)."""
    # Loaded when the command runs, not with the parser (`dpsweep --help`).
    from workers.datasets.registry import has_loader  # deferred: numpy
    from workers.devices import DEVICES  # deferred: torch
    from workers.factories import is_factory_name, load_factory  # deferred: not for the parser
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
        ("strategy", args.strategy, strategy_names()),
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


def _single_run(
    args: argparse.Namespace, usage: Callable[[str], NoReturn], params: dict[str, Any]
) -> Any:
    """The flags as the single-run service's request, its sections typed by the spec's own
    models (a bad value is a usage error naming the flag) before any data is read or any
    budget charged. A stored dataset's split and scaling settings are the owner's wherever
    the flags leave them out."""
    from sweeper.runs.single_run import SingleRun  # deferred: not for the parser

    given = {
        name: value
        for name in (
            "path",
            "labels_path",
            "label_column",
            "privacy_unit",
            "test_fraction",
            "split_seed",
        )
        if (value := getattr(args, "data_path" if name == "path" else name)) is not None
    }
    try:
        model = _model_config(args, usage)
        options = _dataset_options(args, model)
        if options:
            given["options"] = options
        dataset = DatasetConfig(name=args.dataset, **given)
        # The unit flags only where given: data without a unit refuses them.
        units = {
            k: v
            for k in ("unit_bounding", "rows_per_unit")
            if (v := getattr(args, k, None)) is not None
        }
        training = TrainingConfig(
            epochs=args.epochs,
            steps=args.steps,
            batch_size=args.batch_size,
            optimizer=args.optimizer,
            momentum=args.momentum,
            eval_every=args.eval_every,
            **units,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        usage(f"--{str(first['loc'][-1]).replace('_', '-')}: {first['msg']}")
    return SingleRun(
        dataset=dataset,
        model=model,
        training=training,
        strategy=args.strategy,
        params=params,
        accountant=args.accountant,
        delta=args.delta,
        epsilon=args.epsilon,
        noise_multiplier=args.noise_multiplier,
        lrs=(default_lr(args.strategy) if args.lr is None else args.lr,),
        seed=args.seed,
        reproducible=args.reproducible,
    )


def _prepare_and_charge(
    args: argparse.Namespace, usage: Callable[[str], NoReturn], run: Any, *, stored: bool
) -> tuple[Any, dict[str, Any] | None, str]:
    """Check, admit, load and plan the run, then charge it to its dataset's ledger in
    ``--db``: everything that can be refused is checked before the charge, and the worker
    refuses to start unless it is exactly what was charged."""
    from sweeper.datasets.access import Viewer  # deferred: SQLAlchemy
    from sweeper.datasets.fixed_view import stored_row  # deferred: SQLAlchemy
    from sweeper.runs.one_off_charge import (  # deferred: DB
        charge_training_run,
        quote_training_run,
    )
    from sweeper.runs.single_run import check_single_run, prepare_single_run  # deferred: DB
    from workers.datasets.registry import dataset_names  # deferred: numpy

    params = check_single_run(run)
    engine = open_engine(args.db, migrate=True)
    try:
        if stored and stored_row(engine, args.dataset) is None:
            usage(
                f"unknown dataset {args.dataset!r}; choose one of: {', '.join(dataset_names())}, "
                "or a name registered with `dpsweep datasets register` in --db (`dpsweep "
                "datasets list` lists them)"
            )
        if args.output is not None:
            _check_output(Path(args.output), usage)
        check_owner(engine, args.owner, Console(stderr=True))
        # The operator (or --owner's tenant): a stored dataset read with its owner's view.
        prepared = prepare_single_run(
            engine, run, Viewer(args.owner), params=params, device=args.device,
            threads=args.threads, name="dpsweep-train", keep_weights=args.output is not None,
            # The local command line: --checkpoint may be a path (a server takes names only).
            allow_paths=True,
        )  # fmt: skip
        if stored or args.data_path is None:
            name = args.dataset
        else:
            name = f"{args.dataset}:{args.data_path}"
        quote = quote_training_run(engine, prepared, dataset=name, principal=args.owner)
        confirm_charge(quote, yes=args.yes)
        charge = charge_training_run(
            engine, prepared, dataset=name, quote=quote, principal=args.owner
        )
        return prepared, charge, name
    finally:
        engine.dispose()


def _check_output(out: Path, usage: Callable[[str], NoReturn]) -> None:
    """Refuse an output folder that cannot be written before anything is charged: the model
    of a charged run must not be lost to a typo."""
    if out.exists() and not out.is_dir():
        usage(f"--output {str(out)!r} is a file; give a folder (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        usage(f"--output {str(out)!r} cannot be created: {exc.strerror or exc}")
    if not os.access(out, os.W_OK):
        usage(f"--output {str(out)!r} is not writable")


def _keep_model(
    out: Path,
    prepared: Any,
    result: Any,
    summary: dict[str, Any],
    charge: dict[str, Any] | None,
    dataset: str,
) -> dict[str, Any] | None:
    """Write the run's best checkpoint, its card and README into ``out`` (the files of
    ``dpsweep model -o``); the paths written (None: no checkpoint to keep, said on stderr)."""
    from api.cli.models import CARD_FILE, MODEL_FILE, README_FILE, _write  # deferred: rich
    from sweeper.artifacts.cards import card_bytes  # deferred: SQLAlchemy
    from sweeper.artifacts.run_card import (  # deferred: SQLAlchemy
        render_run_card_markdown,
        training_run_card,
    )

    if result.weights is None:
        Console(stderr=True).print(
            "[red]error:[/red] the run has no best checkpoint to keep (it never evaluated); "
            "nothing was written"
        )
        return None
    card = training_run_card(
        prepared,
        summary,
        dataset=dataset,
        charge=charge,
        model=result.model_info,
        weights_sha256=hashlib.sha256(result.weights).hexdigest(),
        weights_size_bytes=len(result.weights),
    )
    files = {
        MODEL_FILE: result.weights,
        CARD_FILE: card_bytes(card),
        README_FILE: render_run_card_markdown(card).encode("utf-8"),
    }
    return {name: str(_write(out / name, data)[0]) for name, data in files.items()}


#: The model section's fields the fine-tuning flags set.
_MODEL_FLAGS = {
    "model.name": "--model",
    "model.checkpoint": "--checkpoint",
    "model.checkpoint_digest": "--checkpoint",
    "model.trainable": "--trainable",
    "model.lora.r": "--lora-r",
    "model.lora.alpha": "--lora-alpha",
    "model.lora.target_modules": "--lora-target",
}


def _flag_message(exc: ConfigError) -> str:
    """A refusal naming a request field (``delta``, ``params.clip``, ``model_options``) as the
    flag that sets it (``--delta``, ``--clip``, ``--model-option``)."""

    msg, name = str(exc), exc.field
    if not name:
        return msg
    head, _, sub = name.partition(".")
    if head == "params":
        dests = {dest for _, dest, _, _ in strategy_flags()}
        flag = f"--{sub.replace('_', '-')}" if sub in dests else "--param"
    elif head == "model_options":
        flag = "--model-option"
    elif name in _MODEL_FLAGS:
        flag = _MODEL_FLAGS[name]
    elif head == "dataset":
        flag = {"path": "--data-path", "name": "--dataset"}.get(sub, f"--{sub.replace('_', '-')}")
    else:
        flag = f"--{name.rsplit('.', 1)[-1].replace('_', '-')}"
    for lead in (f"{name} ", f"{name}: ", f"{name.rsplit('.', 1)[-1]} "):
        if msg.startswith(lead) and not msg.startswith(f"{flag}"):
            return f"{flag} {msg.removeprefix(lead).lstrip()}"
    return f"{flag}: {msg}"


def _run_with_progress(spec: Any, data: Any, *, show_bar: bool, console: Console) -> Any:
    """Train the pack, with a progress bar on the terminal."""
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
        per = unit_suffix(ledger.get("privacy_unit"))  # a unit dataset: ε per person
        console.print(
            f"charged ε {ledger['epsilon_charged']:.4g}{per}, δ {ledger['delta_charged']:g} to the "
            f"lifetime budget of {ledger['dataset']} (run {ledger['run']})"
        )
    elif s["private"] is False:
        console.print("not private: nothing could be charged to the dataset's ledger")
    if s.get("warning"):
        console.print(f"[bold yellow]warning:[/bold yellow] {s['warning']}")
    for path in (s.get("kept") or {}).values():
        console.print(f"wrote {escape(path)}", soft_wrap=True)
