"""Train a pack of trials end to end: data, model, DP steps, evaluation, best checkpoint, epsilon.

:func:`train_pack` is the worker entry point: it gets plain configs (noise already planned) and
returns plain results; it never touches the database. A single trial is a pack of one
(:func:`train_trial`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import torch

from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting import compute_epsilon
from workers.canary_audit.canaries import GradientCanaries
from workers.checkpoints import model_info, weights_bytes
from workers.datasets.loading import load_dataset
from workers.datasets.records import Dataset
from workers.devices import resolve_device, set_threads
from workers.engine import DPEngine
from workers.factories import load_exported_factories
from workers.generic.dispatch import build_pack_model
from workers.models.descriptors import DESCRIPTORS, ModelSpec
from workers.models.registry import build_model, model_task
from workers.noise_ahead import NoiseAhead
from workers.optim import PackedOptimizer, WeightAverage
from workers.packed.model import PackedModel
from workers.plan_check import check_pack
from workers.polar import kernels_for
from workers.randomness import NoiseSource, TrialRandomness
from workers.schedule import eval_releases
from workers.seeding import stream_seed
from workers.settings import WorkerSettings
from workers.strategies import get_strategy
from workers.training.evaluation import (
    DIAGNOSTIC_BATCH,
    _dp_evaluation,
    _evaluate,
    _noisy_accuracy,
)
from workers.training.specs import PackSpec, Progress, TrialResult


def train_trial(
    spec: PackSpec, *, progress: Callable[[Progress], None] | None = None
) -> TrialResult:
    """Train the single trial of ``spec`` (a pack of one)."""
    if len(spec.trials) != 1:
        raise ValueError("train_trial takes a pack with exactly one trial")
    return train_pack(spec, progress=progress)[0]


def train_pack(
    spec: PackSpec,
    *,
    progress: Callable[[Progress], None] | None = None,
    dataset: Dataset | None = None,
    canaries: Callable[[PackedModel], GradientCanaries] | None = None,
) -> list[TrialResult]:
    """Train every trial of ``spec`` as one batched computation.

    ``canaries`` (an audit only, :mod:`workers.canary_audit`): builds the gradient canaries for
    the pack's model; the engine trains them as records of the training set.

    Raises:
        ConfigError: invalid settings (the message names the field and what is allowed).
        DatasetError: a missing or malformed data file.
        PrivacyError: a private trial whose epsilon cannot be established (it does not run).
    """
    # Factories a parent `dpsweep run` exported (module:function names in its spec): a Ray
    # worker registers them before it resolves the names (the local CLI only; never the API).
    load_exported_factories()
    if not spec.trials:
        raise ConfigError("a pack needs at least one trial", field="trials")
    if spec.eval_every < 1:
        raise ConfigError("eval_every must be >= 1", field="training.eval_every")
    if spec.randomness not in ("secret", "reproducible"):
        raise ConfigError(
            f"randomness must be 'secret' or 'reproducible'; got {spec.randomness!r}",
            field="privacy.reproducible",
        )
    strategy_cls = get_strategy(spec.strategy)
    task = model_task(spec.model.name)
    device = resolve_device(spec.device)
    set_threads(spec.threads, device)
    for t in spec.trials:
        if not (t.lr > 0 and math.isfinite(t.lr)):
            raise ConfigError(f"lr must be > 0; got {t.lr}", field="lr")
    data = dataset if dataset is not None else load_dataset(spec.dataset)
    # Plan equals run, checked on the data actually loaded, before any step.
    q, total_steps = check_pack(spec, data)
    dp_eval = _dp_evaluation(spec, data, task)
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
    warmup = (
        round(spec.warmup_fraction * total_steps)
        if spec.warmup_fraction is not None
        else spec.warmup_steps
    )
    n_releases = eval_releases(steps=total_steps, eval_every=spec.eval_every) if dp_eval else 0

    private = strategy_cls.private
    sigmas: list[float] = []
    for t in spec.trials:
        if private:
            if t.noise_multiplier is None:
                raise PrivacyError(
                    f"strategy {spec.strategy!r} is private: every trial needs a planned noise "
                    "multiplier"
                )
            # Fail closed: establish epsilon before touching the data.
            compute_epsilon(
                noise_multiplier=t.noise_multiplier,
                sample_rate=q,
                steps=total_steps,
                target_delta=t.target_delta,
                accountant=spec.accountant,
                eval_noise_multiplier=spec.eval_noise_multiplier,
                eval_releases=n_releases,
            )
            sigmas.append(float(t.noise_multiplier))
        else:
            sigmas.append(0.0)

    k = len(spec.trials)
    model_spec = _with_data_vocab(spec.model, data.vocab_size)
    modules = [
        build_model(
            model_spec,
            input_shape=data.input_shape,
            num_classes=data.num_classes,
            seed=stream_seed(t.seed, "init"),
        )
        for t in spec.trials
    ]
    # The fast packed path where every layer converts, else the generic (torch.func) path.
    descriptor = DESCRIPTORS.get(spec.model.name)
    built, engine_path = build_pack_model(
        modules,
        device=device,
        batched_trials=descriptor is None or descriptor.generic_packs == "batched",
    )
    if engine_path == "generic" and strategy_cls.name == "lipschitz":
        raise ConfigError(
            "the lipschitz strategy needs a Lipschitz model the packed path covers (lip_mlp or "
            "lip_cnn); this model runs on the generic path",
            field="strategy",
        )
    # GenericModel implements, structurally, everything the engine, the strategies and the
    # evaluation use of a PackedModel (forward, flat, k, layer algebra).
    model = cast(PackedModel, built)
    strategy = strategy_cls(
        [t.params for t in spec.trials], n_layers=model.n_param_layers, device=device
    )
    lr = torch.tensor([t.lr for t in spec.trials], device=device)
    optimizer = PackedOptimizer(
        spec.optimizer,
        lr,
        momentum=spec.momentum,
        weight_decay=spec.weight_decay,
        schedule=spec.lr_schedule,
        total_steps=total_steps,
        warmup=warmup,
    )
    # Beside the raw weights, their moving average (post-processing: no epsilon).
    average = (
        WeightAverage(model.flat, spec.ema_decay, warmup=spec.ema_warmup)
        if spec.ema_decay is not None
        else None
    )
    x_train = torch.from_numpy(data.x_train).to(device)
    y_train = torch.from_numpy(data.y_train).to(device) if task == "classification" else None
    x_test = torch.from_numpy(data.x_test).to(device)
    y_test = torch.from_numpy(data.y_test).to(device)
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
        sample_rate=q,
        noise_multiplier=torch.tensor(sigmas, device=device),
        sample_streams=[r.sample for r in rands],
        # With the read-ahead (DPSWEEP_NOISE_AHEAD=1), the next step's draws come during this one.
        noise=(NoiseAhead if WorkerSettings().noise_ahead else NoiseSource)(
            [r.noise for r in rands], device
        ),
        canaries=canaries(model) if canaries is not None else None,
    )
    # DP evaluation draws its count noise from a third stream of the same secret.
    count_noise = NoiseSource([r.evaluation for r in rands], device) if dp_eval else None
    del rands
    released = [0] * k

    def measure() -> list[dict[str, Any]]:
        if count_noise is None:
            return _evaluate(model, x_test, y_test, task)
        assert spec.eval_noise_multiplier is not None
        for i in range(k):
            released[i] += 1
        if max(released) > n_releases:  # never release more than the plan charged
            raise PrivacyError("DP evaluation would release more noisy counts than planned")
        return _noisy_accuracy(
            model,
            x_test,
            y_test,
            count_noise,
            noise_multiplier=spec.eval_noise_multiplier,
            n_records=data.planning_n_eval,
        )

    # Clipping diagnostics use a fixed batch of the public evaluation split (never training
    # data); with DP evaluation the evaluation records are private, so there are none.
    n_diag = 0 if dp_eval else min(int(x_test.shape[0]), DIAGNOSTIC_BATCH)
    x_diag = x_test[:n_diag]
    t_diag = y_test[:n_diag] if task == "classification" else x_diag
    diag_gens = [
        torch.Generator(device=device).manual_seed(stream_seed(t.seed, "diag")) for t in spec.trials
    ]

    objective, maximise = ("accuracy", True) if task == "classification" else ("mse", False)
    best_value = [-math.inf if maximise else math.inf] * k
    best_step: list[int | None] = [None] * k
    best_flat = model.flat.clone()
    best_metrics: list[dict[str, Any]] = [{} for _ in range(k)]
    best_kept: list[str | None] = [None] * k
    last_metrics: list[dict[str, Any]] = [{} for _ in range(k)]
    diverged_at: list[int | None] = [None] * k
    history: list[list[dict[str, Any]]] = [[] for _ in range(k)]
    traj: list[dict[str, list[float | None]]] = [{"step": [], "lr": []} for _ in range(k)]
    step_times: list[float] = []
    sync = device.type == "cuda"

    def consider(i: int, step: int, m: dict[str, Any], flat: torch.Tensor, kept: str) -> None:
        """Select ``flat`` (trial ``i``'s raw or averaged weights) if it beats the best so far:
        one selection rule for every checkpoint, raw or averaged."""
        v = m[objective]
        if (v > best_value[i]) if maximise else (v < best_value[i]):
            best_value[i] = v
            best_step[i] = step
            best_metrics[i] = m
            best_flat[i] = flat
            best_kept[i] = kept

    def evaluate_average(step: int) -> list[dict[str, Any] | None]:
        """Measure the averaged weights exactly as the raw ones (same split, same metrics)."""
        assert average is not None
        raw = model.flat.clone()
        with torch.no_grad():
            model.flat.copy_(average.flat)
        try:
            finite = torch.isfinite(model.flat).all(dim=1).tolist()
            results = measure()
        finally:
            with torch.no_grad():
                model.flat.copy_(raw)
        out: list[dict[str, Any] | None] = []
        for i in range(k):
            m = results[i]
            if finite[i] and math.isfinite(m[objective]):
                consider(i, step, m, average.flat[i], "ema")
                out.append(m)
            else:
                out.append(None)
        return out

    def evaluate(step: int) -> list[dict[str, Any]]:
        finite = torch.isfinite(model.flat).all(dim=1).tolist()
        results = measure()
        scale = strategy.lr_scale()
        eff_lr = (lr if scale is None else lr * scale).mul(optimizer.last_factor).tolist()
        state = {name: v.tolist() for name, v in strategy.state().items()}
        if n_diag:
            # Trials are computed independently, so a diverged trial's NaNs stay in its own row.
            diag = engine.diagnostics(x_diag, t_diag, diag_gens)
            state.update({name: v.tolist() for name, v in diag.items()})
        for i in range(k):
            traj[i]["step"].append(step)
            traj[i]["lr"].append(eff_lr[i])
            for name, vals in state.items():
                v = vals[i]
                traj[i].setdefault(name, []).append(v if math.isfinite(v) else None)
            m = results[i]
            ok = finite[i] and math.isfinite(m[objective])
            if not ok:
                if diverged_at[i] is None:
                    diverged_at[i] = step
                history[i].append({"step": step, "diverged": True})
                continue
            last_metrics[i] = m
            history[i].append({"step": step, **{a: b for a, b in m.items() if a != "reliability"}})
            consider(i, step, m, model.flat[i], "raw")
        if average is None:
            return results
        # The averaged weights at the same point, after the raw ones (a tie keeps the raw).
        averaged = evaluate_average(step)
        out = []
        for i in range(k):
            ema = averaged[i]
            extra = {} if ema is None else _prefixed(ema, "ema_")
            if history[i] and history[i][-1].get("step") == step and extra:
                history[i][-1].update(extra)
            out.append({**results[i], **extra})
        return out

    # Every step draws K x P noise values: a small run takes the sampler's numpy path rather
    # than pay about 0.6 s to load its compiled kernels (the same draws either way).
    with kernels_for(draws=model.flat.numel() * total_steps):
        try:
            for step in range(1, total_steps + 1):
                if sync:
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                engine.step()
                if average is not None:
                    average.update(model.flat)
                if sync:
                    torch.cuda.synchronize(device)
                step_times.append((time.perf_counter() - t0) * 1000.0)
                evals = None
                if step % spec.eval_every == 0 or step == total_steps:
                    evals = evaluate(step)
                if progress is not None:
                    progress(Progress(step=step, total_steps=total_steps, evals=evals))
        finally:
            engine.noise.close()  # joins a read-ahead thread, also when a step or callback raises

    if dp_eval:
        # The noisy value that won the selection over-states the checkpoint's accuracy (the
        # maximum of noisy values is biased upwards): measure the chosen checkpoints once more,
        # with fresh noise, and report that. The plan charged this release too.
        with torch.no_grad():
            model.flat.copy_(best_flat)
        fresh = measure()
        for i in range(k):
            if best_step[i] is not None:
                best_metrics[i] = {
                    **fresh[i],
                    "accuracy_at_selection": best_metrics[i].get("accuracy"),
                }
    if average is not None:
        # Which weights were kept is part of the trial's record and of its model card.
        for i in range(k):
            if best_kept[i] is not None:
                best_metrics[i] = {**best_metrics[i], "weights_kept": best_kept[i]}
    median_ms = statistics.median(step_times)
    results: list[TrialResult] = []
    for i, t in enumerate(spec.trials):
        best_module = model.to_module(i, best_flat[i])
        info = model_info(
            best_module,
            name=model_spec.name,
            options=model_spec.options,
            input_shape=data.input_shape,
            num_classes=data.num_classes,
            engine_path=engine_path,
        )
        if average is not None:
            info["weights_kept"] = best_kept[i]
            info["ema_decay"] = average.decay
            info["ema_warmup"] = average.warmup
        # Only a checkpoint that was selected (a finite evaluation) is worth keeping.
        weights = (
            weights_bytes(best_module) if spec.keep_weights and best_step[i] is not None else None
        )
        eps = None
        if private:
            # Epsilon from the noise, rate and steps this trial actually ran with.
            # A single run's epsilon, its noisy evaluations included (DP evaluation).
            eps = compute_epsilon(
                noise_multiplier=sigmas[i],
                sample_rate=q,
                steps=total_steps,
                target_delta=t.target_delta,
                accountant=spec.accountant,
                eval_noise_multiplier=spec.eval_noise_multiplier,
                eval_releases=n_releases,
            )
        results.append(
            TrialResult(
                index=i,
                strategy=spec.strategy,
                lr=t.lr,
                seed=t.seed,
                params=strategy.params[i],
                private=private,
                noise_multiplier=sigmas[i] if private else None,
                sample_rate=q,
                steps=total_steps,
                target_delta=t.target_delta if private else None,
                epsilon=eps,
                accountant=spec.accountant if private else None,
                objective=objective,
                best_step=best_step[i],
                metrics=best_metrics[i],
                final_metrics=last_metrics[i],
                history=history[i],
                trajectories=traj[i],
                step_time_ms_median=median_ms,
                diverged_at=diverged_at[i],
                device=str(device),
                randomness=spec.randomness,
                engine_path=engine_path,
                evaluation=getattr(data, "evaluation", "carve-out"),
                weights_kept=best_kept[i] if average is not None else None,
                model_info=info,
                checkpoint=best_flat[i].detach().cpu(),
                weights=weights,
            )
        )
    return results


def _prefixed(metrics: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The numeric metrics of ``metrics`` under prefixed names (the averaged weights')."""
    return {
        f"{prefix}{name}": v
        for name, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _with_data_vocab(model: ModelSpec, vocab_size: int | None) -> ModelSpec:
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
    return ModelSpec(model.name, {**model.options, "vocab_size": int(vocab_size)})
