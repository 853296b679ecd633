"""What a pack is asked to train, and what each of its trials returns: plain dataclasses.

:class:`PackSpec` (with its :class:`TrialSpec` list) is what the sweeper and ``dpsweep train``
hand to :func:`workers.training.loop.train_pack`; :class:`TrialResult` is what comes back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dpsweep.accountants import DEFAULT_RUN_ACCOUNTANT, WORKER, resolve
from dpsweep.accounting_inputs import AccountingInputs
from workers.datasets.records import DatasetSpec
from workers.models.descriptors import ModelSpec
from workers.models.pretrained_descriptors import spec_of
from workers.plan_check import PlannedRun
from workers.pretraining import PretrainRef, pretrain_ref
from workers.randomness import REPRODUCIBLE_WARNING, Randomness

if TYPE_CHECKING:
    # Annotation only: the sweeper's driver builds pack specs and need not import torch.
    import torch

    from dpsweep.spec import ModelConfig, TrainingConfig


@dataclass
class TrialSpec:
    """One trial of a pack: what differs between trials of a grid.

    Args:
        lr: learning rate.
        seed: the public seed: initial weights (and, in reproducible mode only, Poisson
            sampling and noise).
        noise_multiplier: planned sigma (required for private strategies).
        target_delta: the delta the trial's epsilon is reported at.
        params: strategy hyperparameters (e.g. ``{"clip": 1.0}``).
    """

    lr: float
    seed: int = 0
    noise_multiplier: float | None = None
    target_delta: float = 1e-5
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class PackSpec:
    """Everything the trials of a pack share, plus the trials themselves."""

    dataset: DatasetSpec
    model: ModelSpec
    strategy: str
    trials: list[TrialSpec]
    batch_size: int = 64
    # Examples per physical chunk of a logical batch (workers.chunked_step); None: the whole
    # batch when it fits the pack's memory budget (workers.chunked_step.physical_batch).
    physical_batch_size: int | None = None
    # Augmentation multiplicity (workers.augment): copies per example (None: no augmentation)
    # and the augmentations applied to each copy.
    augment_multiplicity: int | None = None
    augment_ops: list[str] = field(default_factory=list)
    # With a privacy unit (the dataset's; workers.unit_step): how a sampled unit's rows make
    # its one bounded contribution, and the most rows of a unit a step uses (R). A pack has
    # one R: trials of an arm's rows_per_unit axis form a pack per value.
    unit_bounding: str = "mean"
    rows_per_unit: int = 8
    epochs: float = 5.0
    steps: int | None = None
    optimizer: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    eval_every: int = 50
    # The learning-rate schedule (workers.optim.lr_factor) and its warmup: warmup_steps, or a
    # fraction of the run's steps (resolved once the steps are known).
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    warmup_fraction: float | None = None
    # An exponential moving average of each trial's weights, measured beside the raw weights
    # at every evaluation; the better of the two is selected (None: no average).
    ema_decay: float | None = None
    ema_warmup: bool = False
    # The accountant of each trial's single-run epsilon: a canonical name (a legacy worker
    # name still reads as it did: dpsweep.accountants.WORKER_ALIASES).
    accountant: str = DEFAULT_RUN_ACCOUNTANT
    device: str = "auto"
    threads: int = 1
    # "secret": every trial draws a fresh OS secret for its batches and noise when it starts.
    # "reproducible": they come from the public seed (not private against anyone who knows it).
    randomness: Randomness = "secret"
    # What the trials' privacy budget was reserved for. A sweep always sets it, and the pack
    # refuses to run (PlanMismatch) unless q, T, sigma, strategy and the data equal it.
    planned: PlannedRun | None = None
    # DP evaluation (eval mode dp): the noise multiplier of each noisy count of correct
    # predictions on the private evaluation records. None: the evaluation records are public
    # (a carve-out declared unprotected, or a public dataset) and metrics are exact.
    eval_noise_multiplier: float | None = None
    # Hand back each trial's best checkpoint as safetensors bytes (TrialResult.weights), for
    # the sweep's artifact store (its spec's artifacts.keep is not "none").
    keep_weights: bool = False
    # Public pre-training (model.pretrain_on): the trials start from weights trained without
    # noise on these public records (workers.pretraining); None: from their own seeds.
    pretrain: PretrainRef | None = None

    def trial_inputs(
        self, trial: TrialSpec, *, sample_rate: float, steps: int, evaluations: int
    ) -> AccountingInputs:
        """What the accountant is asked about ``trial`` as this pack runs it.

        Its planned sigma and delta, the run's q, T and E noisy evaluations at the pack's
        ``eval_noise_multiplier``, and the pack's accountant: a legacy name read as a worker's
        (:func:`dpsweep.accountants.resolve` in ``WORKER``: ``rdp`` is Opacus's RDP here).

        Raises:
            ConfigError, PrivacyError: inputs no accountant may be asked about (fail closed).
        """
        return AccountingInputs(
            noise_multiplier=trial.noise_multiplier,
            sample_rate=sample_rate,
            steps=steps,
            delta=trial.target_delta,
            eval_noise_multiplier=self.eval_noise_multiplier,
            evaluations=evaluations,
            accountant=resolve(self.accountant, WORKER),
        )


@dataclass
class Progress:
    """A progress report: after every step, and with ``evals`` after every evaluation."""

    step: int
    total_steps: int
    evals: list[dict[str, Any]] | None = None


@dataclass
class TrialResult:
    """Outcome of one trial. ``metrics`` are those of the best checkpoint (004's protocol)."""

    index: int
    strategy: str
    lr: float
    seed: int
    params: dict[str, Any]
    private: bool
    noise_multiplier: float | None
    sample_rate: float
    steps: int
    target_delta: float | None
    epsilon: float | None
    accountant: str | None
    objective: str
    best_step: int | None
    metrics: dict[str, Any]
    final_metrics: dict[str, Any]
    history: list[dict[str, Any]]
    trajectories: dict[str, list[float | None]]
    step_time_ms_median: float
    diverged_at: int | None = None
    device: str = "cpu"
    randomness: Randomness = "secret"
    # How per-example gradients were computed: "packed" (the fast path for nn.Sequential models
    # of registered layers) or "generic" (any nn.Module, by torch.func).
    engine_path: str = "packed"
    # How the evaluation records were protected: "carve-out" and "public" give exact metrics;
    # "dp" gives noisy accuracy only (the metrics' values are noisy releases).
    evaluation: str = "carve-out"
    # With an average of the weights (PackSpec.ema_decay): which weights the best checkpoint
    # holds, "raw" or "ema"; None without an average.
    weights_kept: str | None = None
    # What rebuilds the architecture (workers.checkpoints.model_info): public facts only.
    model_info: dict[str, Any] = field(default_factory=dict)
    # Flat weights of the best checkpoint (CPU); not part of the serialised result.
    checkpoint: torch.Tensor | None = field(default=None, repr=False, compare=False)
    # The best checkpoint as safetensors bytes (PackSpec.keep_weights and a best step exists);
    # not part of the serialised result: the pack task hands them back beside it.
    weights: bytes | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("checkpoint", None)
        d.pop("weights", None)
        return d

    def summary(self) -> dict[str, Any]:
        """The flat summary printed by ``dpsweep train --json``."""
        m = self.metrics
        return {
            "strategy": self.strategy,
            "accuracy": m.get("accuracy"),
            "loss": m.get("loss"),
            "mse": m.get("mse"),
            "ece": m.get("ece"),
            "mce": m.get("mce"),
            "epsilon": self.epsilon,
            "delta": self.target_delta,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "best_step": self.best_step,
            "step_time_ms_median": self.step_time_ms_median,
            "lr": self.lr,
            "seed": self.seed,
            "params": self.params,
            "accountant": self.accountant,
            "private": self.private,
            "diverged_at": self.diverged_at,
            "device": self.device,
            "randomness": self.randomness,
            "engine_path": self.engine_path,
            "evaluation": self.evaluation,
            **({"warning": REPRODUCIBLE_WARNING} if self.randomness == "reproducible" else {}),
            "reliability": m.get("reliability"),
            "clip_final": self.trajectories.get("clip", [None])[-1],
            "lr_final": self.trajectories["lr"][-1] if self.trajectories.get("lr") else None,
            "trajectories": self.trajectories,
        }


def training_pack(
    *,
    model: ModelConfig,
    training: TrainingConfig,
    strategy: str,
    trials: Sequence[Any],
    dataset: Any | Callable[[], Any],
    accountant: str,
    reproducible: bool,
    planned: Any,
    eval_noise_multiplier: float | None = None,
    device: str = "cpu",
    threads: int = 1,
    keep_weights: bool = False,
    steps: int | None = None,
    lora_r: int | None = None,
    rows_per_unit: int | None = None,
    allow_checkpoint_paths: bool = True,
) -> PackSpec:
    """The :class:`workers.training.specs.PackSpec` of trials already resolved to their settings.

    The one place where the typed spec's model and training sections become what a worker
    trains: :func:`sweeper.driver.packs.pack_spec` (a sweep's trials), ``dpsweep train`` (one
    run from flags, validated by the same :class:`~dpsweep.spec.TrainingConfig`), canary
    audits and public pre-tuning (:mod:`workers.public_tuning`) all build through it.

    Args:
        model: The model section (registered name and options).
        training: The training section (steps or epochs, batch size, optimizer, evaluation).
        strategy: The pack's strategy (one per pack).
        trials: :class:`workers.training.specs.TrialSpec` of each trial (lr, seed, sigma, delta,
            params).
        dataset: The worker-side dataset, or a function returning it (called last).
        accountant: The worker's accountant of each trial's single-run epsilon.
        reproducible: Draw noise and sampling from the public seed (labelled, not private
            against whoever knows it) instead of a fresh OS secret per trial.
        planned: The :class:`workers.plan_check.PlannedRun` the worker enforces before its
            first step (``None``: not checked against a plan, e.g. a non-private run).
        eval_noise_multiplier: DP evaluation's noise per count, as planned (``None``: none).
        device: Where to train (``cpu``, ``cuda``, ...).
        threads: Torch threads of the worker.
        keep_weights: Hand back each trial's best checkpoint (safetensors bytes).
        steps: Train exactly this many steps, whatever the training section says (public
            pre-tuning trains the private grid's planned number on other records).
        lora_r: The trials' LoRA rank (their ``lora_r`` grid value; one per pack: trials of
            other ranks have other architectures). None: the model section's.
        rows_per_unit: The trials' most rows per privacy unit (their ``rows_per_unit`` grid
            value; one per pack). None: the training section's.
        allow_checkpoint_paths: ``model.checkpoint`` may be a path, not only a registered
            name (the local command line; a server refuses paths at its edge).

    Raises:
        ConfigError: a checkpoint that does not resolve, or whose digest differs from the
            spec's ``checkpoint_digest`` (:func:`workers.models.model_spec`).
    """
    # The checkpoint resolved (and its digest checked) here, where the pack is formed: the
    # worker checks the digest again before it loads anything.
    model_spec = spec_of(model, lora_r=lora_r, allow_paths=allow_checkpoint_paths)
    dataset = dataset() if callable(dataset) else dataset
    return PackSpec(
        dataset=dataset,
        model=model_spec,
        strategy=strategy,
        trials=list(trials),
        **_training_settings(training, steps=steps, rows_per_unit=rows_per_unit),
        accountant=accountant,
        device=device,
        threads=threads,
        randomness="reproducible" if reproducible else "secret",
        planned=planned,
        eval_noise_multiplier=eval_noise_multiplier,
        keep_weights=keep_weights,
        pretrain=pretrain_ref(model, dataset),
    )


def _training_settings(
    training: TrainingConfig, *, steps: int | None, rows_per_unit: int | None = None
) -> dict[str, Any]:
    """The training section's fields of a :class:`PackSpec` (``steps`` and ``rows_per_unit``,
    when given, override the section's)."""
    return {
        "batch_size": training.batch_size,
        "physical_batch_size": training.physical_batch_size,
        "augment_multiplicity": training.augment.multiplicity if training.augment else None,
        "augment_ops": list(training.augment.ops) if training.augment else [],
        "epochs": training.epochs if training.epochs is not None else 1.0,
        "steps": steps if steps is not None else training.steps,
        "optimizer": training.optimizer,
        "momentum": training.momentum,
        "weight_decay": training.weight_decay,
        "eval_every": training.eval_every,
        "lr_schedule": training.lr_schedule,
        "warmup_steps": training.warmup_steps,
        "warmup_fraction": training.warmup_fraction,
        "ema_decay": training.ema.decay if training.ema is not None else None,
        "ema_warmup": training.ema.warmup if training.ema is not None else False,
        "unit_bounding": training.unit_bounding,
        "rows_per_unit": rows_per_unit if rows_per_unit is not None else training.rows_per_unit,
    }
