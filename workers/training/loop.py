"""Train a pack of trials end to end: data, model, DP steps, evaluation, best checkpoint, epsilon.

:func:`train_pack` is the worker entry point: it gets plain configs (noise already planned) and
returns plain results; it never touches the database. A single trial is a pack of one
(:func:`train_trial`). Its parts, each in a module of its own:

* :mod:`workers.training.prepare`: settings, privacy established, model, optimizer, engine;
* :mod:`workers.training.measure`: evaluations (raw, averaged, DP evaluation's counted ones);
* :mod:`workers.training.records`: the best checkpoint, history and trajectories;
* :mod:`workers.training.results`: each trial's result and single-run epsilon.

An audit hands :func:`train_pack` a factory of gradient canaries
(:class:`workers.canary_hook.GradientCanaryHook`); the trainer never imports the audit.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from workers.datasets.records import Dataset
from workers.polar import kernels_for
from workers.training.measure import PackMeasure
from workers.training.prepare import CanaryFactory, PreparedPack, prepare_pack
from workers.training.records import PackRecords
from workers.training.results import pack_results
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
    canaries: CanaryFactory | None = None,
) -> list[TrialResult]:
    """Train every trial of ``spec`` as one batched computation.

    ``canaries`` (an audit only, :mod:`workers.canary_audit`): builds the gradient canaries for
    the pack's model; the engine trains them as records of the training set.

    Raises:
        ConfigError: invalid settings (the message names the field and what is allowed).
        DatasetError: a missing or malformed data file.
        PrivacyError: a private trial whose epsilon cannot be established (it does not run).
    """
    pack = prepare_pack(spec, dataset=dataset, canaries=canaries)
    objective, maximise = ("accuracy", True) if pack.task == "classification" else ("mse", False)
    records = PackRecords(pack.k, objective=objective, maximise=maximise, flat=pack.model.flat)
    measure = PackMeasure(pack, records)
    step_times = _run_steps(pack, measure, progress)
    if pack.dp_eval:
        measure.remeasure_selected()
    return pack_results(pack, records, step_times=step_times)


def _run_steps(
    pack: PreparedPack, measure: PackMeasure, progress: Callable[[Progress], None] | None
) -> list[float]:
    """Every DP step, with its evaluations; each step's wall time in milliseconds."""
    spec, engine, average = pack.spec, pack.engine, pack.average
    sync = pack.device.type == "cuda"
    step_times: list[float] = []
    # Every step draws K x P noise values: a small run takes the sampler's numpy path rather
    # than pay about 0.6 s to load its compiled kernels (the same draws either way).
    with kernels_for(draws=pack.model.flat.numel() * pack.total_steps):
        try:
            for step in range(1, pack.total_steps + 1):
                if sync:
                    torch.cuda.synchronize(pack.device)
                t0 = time.perf_counter()
                engine.step()
                if average is not None:
                    average.update(pack.model.flat)
                if sync:
                    torch.cuda.synchronize(pack.device)
                step_times.append((time.perf_counter() - t0) * 1000.0)
                evals = None
                if step % spec.eval_every == 0 or step == pack.total_steps:
                    evals = measure.evaluate(step)
                if progress is not None:
                    progress(Progress(step=step, total_steps=pack.total_steps, evals=evals))
        finally:
            engine.noise.close()  # joins a read-ahead thread, also when a step or callback raises
    return step_times
