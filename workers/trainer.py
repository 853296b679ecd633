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
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from workers.accounting import compute_epsilon
from workers.datasets import Dataset, DatasetSpec, load_dataset
from workers.devices import resolve_device, set_threads
from workers.engine import DPEngine
from workers.errors import ConfigError, PrivacyError
from workers.metrics import classification_metrics, reconstruction_metrics
from workers.models import ModelSpec, build_model, model_task
from workers.optim import PackedOptimizer
from workers.packed import PackedModel
from workers.plan_check import PlannedRun, check_plan
from workers.randomness import REPRODUCIBLE_WARNING, NoiseSource, Randomness, TrialRandomness
from workers.schedule import plan_steps
from workers.seeding import stream_seed
from workers.strategies import get_strategy

# Size of the evaluation-split batch on which clipping diagnostics are measured.
DIAGNOSTIC_BATCH = 512


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
    epochs: float = 5.0
    steps: int | None = None
    optimizer: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    eval_every: int = 50
    accountant: str = "rdp"
    device: str = "auto"
    threads: int = 1
    # "secret": every trial draws a fresh OS secret for its batches and noise when it starts.
    # "reproducible": they come from the public seed (not private against anyone who knows it).
    randomness: Randomness = "secret"
    # What the trials' privacy budget was reserved for. A sweep always sets it, and the pack
    # refuses to run (PlanMismatch) unless q, T, sigma, strategy and the data equal it.
    planned: PlannedRun | None = None


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
    # Flat weights of the best checkpoint (CPU); not part of the serialised result.
    checkpoint: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("checkpoint", None)
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
            **({"warning": REPRODUCIBLE_WARNING} if self.randomness == "reproducible" else {}),
            "reliability": m.get("reliability"),
            "clip_final": self.trajectories.get("clip", [None])[-1],
            "lr_final": self.trajectories["lr"][-1] if self.trajectories.get("lr") else None,
            "trajectories": self.trajectories,
        }


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
) -> list[TrialResult]:
    """Train every trial of ``spec`` as one batched computation.

    Raises:
        ConfigError: invalid settings (the message names the field and what is allowed).
        DatasetError: a missing or malformed data file.
        PrivacyError: a private trial whose epsilon cannot be established (it does not run).
    """
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
    q, total_steps = plan_steps(
        n_train=data.n_train, batch_size=spec.batch_size, epochs=spec.epochs, steps=spec.steps
    )
    if spec.planned is not None:
        # Plan equals run, checked on the data actually loaded, before any step.
        check_plan(
            spec.planned,
            strategy=spec.strategy,
            sample_rate=q,
            steps=total_steps,
            noise_multipliers=[t.noise_multiplier for t in spec.trials],
            dataset_sha256=data.content_sha256,
        )

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
            )
            sigmas.append(float(t.noise_multiplier))
        else:
            sigmas.append(0.0)

    k = len(spec.trials)
    modules = [
        build_model(
            spec.model,
            input_shape=data.input_shape,
            num_classes=data.num_classes,
            seed=stream_seed(t.seed, "init"),
        )
        for t in spec.trials
    ]
    model = PackedModel(modules, device=device)
    strategy = strategy_cls(
        [t.params for t in spec.trials], n_layers=model.n_param_layers, device=device
    )
    lr = torch.tensor([t.lr for t in spec.trials], device=device)
    optimizer = PackedOptimizer(
        spec.optimizer, lr, momentum=spec.momentum, weight_decay=spec.weight_decay
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
        noise=NoiseSource([r.noise for r in rands], device),
    )
    del rands

    # Clipping diagnostics use a fixed batch of the public evaluation split (never training data).
    n_diag = min(int(x_test.shape[0]), DIAGNOSTIC_BATCH)
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
    last_metrics: list[dict[str, Any]] = [{} for _ in range(k)]
    diverged_at: list[int | None] = [None] * k
    history: list[list[dict[str, Any]]] = [[] for _ in range(k)]
    traj: list[dict[str, list[float | None]]] = [{"step": [], "lr": []} for _ in range(k)]
    step_times: list[float] = []
    sync = device.type == "cuda"

    def evaluate(step: int) -> list[dict[str, Any]]:
        finite = torch.isfinite(model.flat).all(dim=1).tolist()
        results = _evaluate(model, x_test, y_test, task)
        scale = strategy.lr_scale()
        eff_lr = (lr if scale is None else lr * scale).tolist()
        state = {name: v.tolist() for name, v in strategy.state().items()}
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
            v = m[objective]
            if (v > best_value[i]) if maximise else (v < best_value[i]):
                best_value[i] = v
                best_step[i] = step
                best_metrics[i] = m
                best_flat[i] = model.flat[i]
        return results

    for step in range(1, total_steps + 1):
        if sync:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        engine.step()
        if sync:
            torch.cuda.synchronize(device)
        step_times.append((time.perf_counter() - t0) * 1000.0)
        evals = None
        if step % spec.eval_every == 0 or step == total_steps:
            evals = evaluate(step)
        if progress is not None:
            progress(Progress(step=step, total_steps=total_steps, evals=evals))

    median_ms = statistics.median(step_times)
    results: list[TrialResult] = []
    for i, t in enumerate(spec.trials):
        eps = None
        if private:
            # Epsilon from the noise, rate and steps this trial actually ran with.
            eps = compute_epsilon(
                noise_multiplier=sigmas[i],
                sample_rate=q,
                steps=total_steps,
                target_delta=t.target_delta,
                accountant=spec.accountant,
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
                checkpoint=best_flat[i].detach().cpu(),
            )
        )
    return results


@torch.no_grad()
def _evaluate(
    model: PackedModel, x: torch.Tensor, y: torch.Tensor, task: str, chunk: int = 2048
) -> list[dict[str, Any]]:
    outs = []
    for start in range(0, x.shape[0], chunk):
        xb = x[start : start + chunk]
        xk = xb.unsqueeze(0).expand(model.k, *xb.shape)
        out, _ = model.forward(xk)
        outs.append(out)
    full = torch.cat(outs, dim=1)
    if task == "classification":
        return classification_metrics(full, y)
    return reconstruction_metrics(full, x)


def results_to_json(results: list[TrialResult]) -> list[dict[str, Any]]:
    return [r.to_dict() for r in results]


__all__ = [
    "PackSpec",
    "Progress",
    "TrialResult",
    "TrialSpec",
    "plan_steps",
    "train_pack",
    "train_trial",
]
