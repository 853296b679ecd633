"""A pack, ready to train: its settings checked, its privacy established, model and engine built.

:func:`prepare_pack` does everything :func:`workers.training.loop.train_pack` must do before its
first step, in the order privacy needs: the settings are checked and every private trial's
epsilon is computed from its planned noise *before* the data is touched; the data is loaded
and the plan checked against it; then the model, the optimizer, the trial's secret randomness
and the engine are built.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

import numpy as np
import torch

from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting import epsilon_for
from workers.augment_check import check_augment
from workers.canary_hook import GradientCanaryHook
from workers.chunked_step import augment_of, augmenter_for, physical_batch
from workers.datasets.loading import load_dataset
from workers.datasets.records import Dataset
from workers.devices import resolve_device, set_threads
from workers.engine import DPEngine, Task
from workers.factories import load_exported_factories
from workers.generic.dispatch import build_pack_model
from workers.models.descriptors import DESCRIPTORS, ModelSpec
from workers.models.registry import build_model, model_task
from workers.noise_ahead import NoiseAhead
from workers.optim import PackedOptimizer, WeightAverage
from workers.packed.model import PackedModel
from workers.plan_check import check_pack
from workers.pretraining import load_pretrained
from workers.randomness import NoiseSource, TrialRandomness
from workers.schedule import eval_releases
from workers.seeding import stream_seed
from workers.settings import WorkerSettings
from workers.strategies import get_descriptor, get_strategy
from workers.strategies.base import ClippingStrategy
from workers.training.evaluation import _dp_evaluation
from workers.training.specs import PackSpec

#: Builds an audit's gradient canaries for the pack's model (:mod:`workers.canary_audit`).
CanaryFactory = Callable[[PackedModel], GradientCanaryHook]


@dataclass
class PreparedPack:
    """Everything a pack's steps and evaluations use, built once before the first step."""

    spec: PackSpec
    data: Dataset
    device: torch.device
    task: Task
    sample_rate: float
    total_steps: int
    dp_eval: bool
    n_releases: int  # noisy evaluation releases the plan charged (DP evaluation), else 0
    private: bool
    sigmas: list[float]  # per trial, the planned noise multiplier (0 when not private)
    model_spec: ModelSpec
    engine_path: str
    model: PackedModel
    strategy: ClippingStrategy
    lr: torch.Tensor
    optimizer: PackedOptimizer
    average: WeightAverage | None
    x_test: torch.Tensor
    y_test: torch.Tensor
    engine: DPEngine
    count_noise: NoiseSource | None  # DP evaluation's noise, from each trial's secret

    @property
    def k(self) -> int:
        """The number of trials in the pack."""
        return len(self.spec.trials)


def prepare_pack(
    spec: PackSpec, *, dataset: Dataset | None, canaries: CanaryFactory | None
) -> PreparedPack:
    """Check, establish the privacy of, and build the pack ``spec`` (see the module docstring).

    Raises:
        ConfigError: invalid settings (the message names the field and what is allowed).
        DatasetError: a missing or malformed data file.
        PrivacyError: a private trial whose epsilon cannot be established.
    """
    # Factories a parent `dpsweep run` exported (module:function names in its spec): a Ray
    # worker registers them before it resolves the names (the local CLI only; never the API).
    load_exported_factories()
    _check_settings(spec)
    strategy_cls = get_strategy(spec.strategy)
    task: Task = model_task(spec.model.name)
    device = resolve_device(spec.device)
    set_threads(spec.threads, device)
    data = dataset if dataset is not None else load_dataset(spec.dataset)
    # Plan equals run, checked on the data actually loaded, before any step.
    q, total_steps = check_pack(spec, data)
    dp_eval = _dp_evaluation(spec, data, task)
    _check_evaluation(spec, dp_eval)
    n_releases = eval_releases(steps=total_steps, eval_every=spec.eval_every) if dp_eval else 0
    sigmas = _planned_sigmas(
        spec, private=strategy_cls.private, sample_rate=q, steps=total_steps, n_releases=n_releases
    )
    check_augment(
        augment_of(spec), input_shape=data.input_shape,
        ascent=get_descriptor(spec.strategy).gradient_passes > 1, audit=canaries is not None,
    )  # fmt: skip
    model_spec = with_data_vocab(spec.model, data.vocab_size)
    model, engine_path = _build_model(spec, model_spec, data, device, strategy_cls.name)
    strategy = strategy_cls(
        [t.params for t in spec.trials], n_layers=model.n_param_layers, device=device
    )
    lr = torch.tensor([t.lr for t in spec.trials], device=device)
    optimizer = _build_optimizer(spec, lr, total_steps)
    # Beside the raw weights, their moving average (post-processing: no epsilon).
    average = (
        WeightAverage(model.flat, spec.ema_decay, warmup=spec.ema_warmup)
        if spec.ema_decay is not None
        else None
    )
    engine, count_noise = _build_engine(
        spec, data, model, strategy, optimizer, task=task, device=device, sample_rate=q,
        sigmas=sigmas, dp_eval=dp_eval, canaries=canaries,
    )  # fmt: skip
    return PreparedPack(
        spec=spec, data=data, device=device, task=task, sample_rate=q, total_steps=total_steps,
        dp_eval=dp_eval, n_releases=n_releases, private=strategy_cls.private, sigmas=sigmas,
        model_spec=model_spec, engine_path=engine_path, model=model, strategy=strategy, lr=lr,
        optimizer=optimizer, average=average,
        x_test=torch.from_numpy(data.x_test).to(device),
        y_test=torch.from_numpy(data.y_test).to(device),
        engine=engine, count_noise=count_noise,
    )  # fmt: skip


def _check_settings(spec: PackSpec) -> None:
    """The pack's own settings, before anything is loaded or built."""
    if not spec.trials:
        raise ConfigError("a pack needs at least one trial", field="trials")
    if spec.eval_every < 1:
        raise ConfigError("eval_every must be >= 1", field="training.eval_every")
    if spec.randomness not in ("secret", "reproducible"):
        raise ConfigError(
            f"randomness must be 'secret' or 'reproducible'; got {spec.randomness!r}",
            field="privacy.reproducible",
        )
    for t in spec.trials:
        if not (t.lr > 0 and math.isfinite(t.lr)):
            raise ConfigError(f"lr must be > 0; got {t.lr}", field="lr")


def _check_evaluation(spec: PackSpec, dp_eval: bool) -> None:
    if dp_eval and spec.ema_decay is not None:
        # Fail closed: each measurement of the averaged weights would be one more noisy
        # release than the plan charged (workers.schedule.eval_releases counts the raw ones).
        raise ConfigError(
            "an average of the weights (training.ema) cannot be used with eval mode dp: its "
            "measurements would be noisy releases the plan does not charge",
            field="training.ema",
        )
    if spec.warmup_fraction is not None and not 0 <= spec.warmup_fraction < 1:
        raise ConfigError(
            f"warmup_fraction must be in [0, 1); got {spec.warmup_fraction}",
            field="training.warmup_fraction",
        )


def _build_optimizer(spec: PackSpec, lr: torch.Tensor, total_steps: int) -> PackedOptimizer:
    return PackedOptimizer(
        spec.optimizer,
        lr,
        momentum=spec.momentum,
        weight_decay=spec.weight_decay,
        schedule=spec.lr_schedule,
        total_steps=total_steps,
        warmup=_warmup(spec, total_steps),
    )


def _warmup(spec: PackSpec, total_steps: int) -> int:
    if spec.warmup_fraction is not None:
        return round(spec.warmup_fraction * total_steps)
    return spec.warmup_steps


def _planned_sigmas(
    spec: PackSpec, *, private: bool, sample_rate: float, steps: int, n_releases: int
) -> list[float]:
    """Each trial's planned noise multiplier, its epsilon established first (fail closed)."""
    sigmas: list[float] = []
    for t in spec.trials:
        if not private:
            sigmas.append(0.0)
            continue
        if t.noise_multiplier is None:
            raise PrivacyError(
                f"strategy {spec.strategy!r} is private: every trial needs a planned noise "
                "multiplier"
            )
        # Fail closed: establish epsilon before touching the data.
        epsilon_for(
            spec.trial_inputs(t, sample_rate=sample_rate, steps=steps, evaluations=n_releases)
        )
        sigmas.append(float(t.noise_multiplier))
    return sigmas


def _build_model(
    spec: PackSpec, model_spec: ModelSpec, data: Dataset, device: torch.device, strategy: str
) -> tuple[PackedModel, str]:
    """The K trials' models as one pack model, on the fast packed path where every layer
    converts, else on the generic (torch.func) path."""
    modules = [
        build_model(
            model_spec,
            input_shape=data.input_shape,
            num_classes=data.num_classes,
            seed=stream_seed(t.seed, "init"),
        )
        for t in spec.trials
    ]
    # Public pre-training (model.pretrain_on): every trial starts from the weights trained at
    # ε 0 on public records only (workers.pretraining), not from its own seed's.
    load_pretrained(modules, spec.pretrain, model_spec, data)
    descriptor = DESCRIPTORS.get(spec.model.name)
    built, engine_path = build_pack_model(
        modules,
        device=device,
        batched_trials=descriptor is None or descriptor.generic_packs == "batched",
    )
    if engine_path == "generic" and strategy == "lipschitz":
        raise ConfigError(
            "the lipschitz strategy needs a Lipschitz model the packed path covers (lip_mlp or "
            "lip_cnn); this model runs on the generic path",
            field="strategy",
        )
    # GenericModel implements, structurally, everything the engine, the strategies and the
    # evaluation use of a PackedModel (forward, flat, k, layer algebra).
    return cast(PackedModel, built), engine_path


def _build_engine(
    spec: PackSpec,
    data: Dataset,
    model: PackedModel,
    strategy: ClippingStrategy,
    optimizer: PackedOptimizer,
    *,
    task: Task,
    device: torch.device,
    sample_rate: float,
    sigmas: list[float],
    dp_eval: bool,
    canaries: CanaryFactory | None,
) -> tuple[DPEngine, NoiseSource | None]:
    """The engine, and DP evaluation's count noise, from each trial's fresh randomness."""
    x_train = torch.from_numpy(data.x_train).to(device)
    y_train = torch.from_numpy(data.y_train).to(device) if task == "classification" else None
    # Each trial's batches and noise: a fresh OS secret drawn now, as the trial starts (a re-run
    # draws a new one), held only by this task's local objects; never returned or logged.
    rands = [TrialRandomness.for_mode(spec.randomness, seed=t.seed) for t in spec.trials]
    engine = DPEngine(
        model=model,
        strategy=strategy,
        optimizer=optimizer,
        x=x_train,
        y=y_train,
        task=task,
        sample_rate=sample_rate,
        noise_multiplier=torch.tensor(sigmas, device=device),
        sample_streams=[r.sample for r in rands],
        # With the read-ahead (DPSWEEP_NOISE_AHEAD=1), the next step's draws come during this one.
        noise=(NoiseAhead if WorkerSettings().noise_ahead else NoiseSource)(
            [r.noise for r in rands], device
        ),
        canaries=canaries(model) if canaries is not None else None,
        # Logical batches in physical chunks, and augmentation multiplicity (both refused
        # with an audit's canaries, before anything ran: workers.augment.check_augment).
        physical_batch_size=physical_batch(spec, data, audit=canaries is not None),
        augmenter=augmenter_for(spec),
        # With a privacy unit, q samples units and each contributes one bounded vector.
        units=_units_of(data),
        unit_bounding=spec.unit_bounding,
        rows_per_unit=spec.rows_per_unit,
        # b = q N with the plan's N (declared, public), not the records' count (private).
        planning_n=data.planning_n_train,
    )
    # DP evaluation draws its count noise from a third stream of the same secret.
    count_noise = NoiseSource([r.evaluation for r in rands], device) if dp_eval else None
    del rands
    return engine, count_noise


def _units_of(data: Dataset) -> np.ndarray | None:
    """The training rows' privacy units (None: each row is its own unit).

    Raises:
        ConfigError: a dataset that declares a unit without one per row (field
            ``dataset.privacy_unit``): its q and T were planned over units, so running it
            row by row would spend what was never charged (fail closed).
    """
    if not data.has_units:
        return None
    if data.units_train is None:
        raise ConfigError(
            "the dataset declares a privacy unit but its loader gave no unit per training row",
            field="dataset.privacy_unit",
        )
    return data.units_train


def with_data_vocab(model: ModelSpec, vocab_size: int | None) -> ModelSpec:
    """A token model's ``vocab_size`` from its dataset's public tokenizer when the spec leaves
    it out (ids beyond a smaller table would all read as unknown)."""
    descriptor = DESCRIPTORS.get(model.name)
    if (
        vocab_size is None
        or "vocab_size" in model.options
        or descriptor is None
        or "vocab_size" not in descriptor.options
    ):
        return model
    # replace, not a new ModelSpec: the checkpoint and what is trained stay as they were
    return replace(model, options={**model.options, "vocab_size": int(vocab_size)})
