"""``dpsweep train``'s flags: data and model, privacy, training; and its default learning rate."""

from __future__ import annotations

from typing import Any

from api.cli.arguments import delta, key_value, positive_float, positive_int, strategy_flags
from api.cli.common import add_owner_argument

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


def add_train_parser(sub: Any, *, func: Any) -> None:
    """Register ``dpsweep train`` on the top-level subparsers, running ``func``."""
    t = sub.add_parser(
        "train",
        help="train one DP model (a single trial) and report its metrics and epsilon",
        description="Train one model with DP-SGD. Give --epsilon (the noise multiplier is "
        "calibrated to it) or --noise-multiplier (epsilon is computed from it).",
    )
    _data_and_model_flags(t.add_argument_group("data and model"))
    _privacy_flags(t.add_argument_group("privacy"))
    _training_flags(t.add_argument_group("training"))
    t.add_argument(
        "--db",
        help="database whose privacy ledger this run is charged to (default "
        "DPSWEEP_DATABASE_URL or sqlite:///dpsweep.db): the run spends the dataset's lifetime "
        "budget like a one-trial grid, and is refused if the cap would be exceeded",
    )
    add_owner_argument(t, "the run's charge (and a file's name, bound here)")
    t.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    t.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="keep the model: write DIR/model.safetensors, DIR/card.json (its ε, what it "
        "covers, the input scaling, the split and metrics) and DIR/README.md, as `dpsweep "
        "model` does for a sweep's kept model",
    )
    t.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="charge the run to a private dataset's budget without asking (the charge is "
        "shown first; on a terminal without --yes the run asks, elsewhere it is refused)",
    )
    t.set_defaults(func=func, subparser=t)


def _data_and_model_flags(d: Any) -> None:
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
        "--privacy-unit",
        metavar="COLUMN",
        help="the column (csv, text_csv) or array (npz) that says whose each row is, e.g. "
        "patient_id: the run's ε is then per unit, all of its rows together, and q, T and δ's "
        "bound count units (a registered dataset's unit is its owner's: leave it out)",
    )
    d.add_argument(
        "--dataset-option",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="loader option, e.g. tokenizer=./tokenizer.json or max_length=64 for text_csv "
        "(repeatable); with --model hf and a local --checkpoint directory, text_csv's tokenizer "
        "defaults to the checkpoint's own",
    )
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
        default=None,
        help="registry name (default: mlp, or hf with a --checkpoint directory holding "
        "config.json; `dpsweep plugins` lists them), or a local module:function factory "
        "fn(input_shape, num_classes) -> torch.nn.Module",
    )
    d.add_argument(
        "--model-option",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="model builder option, e.g. hidden=[256,128] (repeatable)",
    )
    _finetune_flags(d)


def _finetune_flags(d: Any) -> None:
    """Where the weights start and what is trained (docs/finetuning.md)."""
    d.add_argument(
        "--checkpoint",
        metavar="NAME_OR_PATH",
        help="start from a checkpoint: a registered name (`dpsweep checkpoints list`) or a "
        "local path (a transformers directory for --model hf, a safetensors state dict for a "
        "built-in model); it must not have seen the private records",
    )
    d.add_argument(
        "--trainable",
        default=None,
        metavar="PART",
        help="what DP-SGD trains: all (default), head, lora, or comma-separated parameter-name "
        "patterns (fnmatch, e.g. 'model.bert.encoder.layer.1.*'); the rest is frozen (no "
        "clipping, no noise; the same ε)",
    )
    d.add_argument(
        "--lora-r",
        type=positive_int("LoRA rank"),
        default=None,
        help="LoRA's rank (implies --trainable lora; default 8)",
    )
    d.add_argument(
        "--lora-alpha",
        type=positive_float("LoRA alpha"),
        default=None,
        help="LoRA's alpha (the adapters' scale is alpha / r; default 16)",
    )
    d.add_argument(
        "--lora-target",
        action="append",
        default=[],
        metavar="LAYER",
        help="a layer name (suffix) LoRA adapts, e.g. query (repeatable; default: peft's "
        "choice for the architecture)",
    )


def _privacy_flags(p: Any) -> None:
    # Torch-free: the one table of names imports no accountant library.
    from dpsweep.accountants import DEFAULT_RUN_ACCOUNTANT, choices_text

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
        default=DEFAULT_RUN_ACCOUNTANT,
        metavar="ACCOUNTANT",
        help="the accountant of the reported epsilon (and of --epsilon's calibration): "
        f"{choices_text()}, or a plug-in's; default {DEFAULT_RUN_ACCOUNTANT}",
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


def _training_flags(o: Any) -> None:
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
    _unit_flags(o)
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


def _unit_flags(o: Any) -> None:
    """How a sampled unit's rows make its one contribution (datasets with a privacy unit)."""
    o.add_argument(
        "--unit-bounding",
        choices=("mean", "capped"),
        default=None,
        help="with a privacy unit: mean (default; each row clipped, then their mean) or capped "
        "(the rows' mean gradient, clipped once)",
    )
    o.add_argument(
        "--rows-per-unit",
        type=positive_int("rows per unit"),
        default=None,
        help="with a privacy unit: the most rows of one sampled unit a step uses (default 8; "
        "chosen at random); changes no ε",
    )
