"""A trained pack's results: one :class:`TrialResult` per trial, its epsilon from the noise used."""

from __future__ import annotations

import statistics
from typing import Any

from workers.accounting import epsilon_for
from workers.checkpoints import model_info, weights_bytes
from workers.datasets.input_transform import describe
from workers.pretraining import pretrained
from workers.training.prepare import PreparedPack
from workers.training.records import PackRecords
from workers.training.specs import TrialResult


def pack_results(
    pack: PreparedPack, records: PackRecords, *, step_times: list[float]
) -> list[TrialResult]:
    """Each trial's result: its best checkpoint, metrics, history and single-run epsilon."""
    if pack.average is not None:
        # Which weights were kept is part of the trial's record and of its model card.
        for i in range(pack.k):
            if records.best_kept[i] is not None:
                records.best_metrics[i] = {
                    **records.best_metrics[i],
                    "weights_kept": records.best_kept[i],
                }
    median_ms = statistics.median(step_times)
    return [
        _trial_result(pack, records, i, median_ms=median_ms) for i in range(len(pack.spec.trials))
    ]


def _trial_result(
    pack: PreparedPack, records: PackRecords, i: int, *, median_ms: float
) -> TrialResult:
    t = pack.spec.trials[i]
    best_module = pack.model.to_module(i, records.best_flat[i])
    info = _model_info(pack, records, i, best_module)
    # Only a checkpoint that was selected (a finite evaluation) is worth keeping.
    selected = records.best_step[i] is not None
    # The file carries the input transform when it may be released (fail closed otherwise),
    # so the kept model takes raw records.
    transform = getattr(pack.data, "input_transform", None)
    keep = pack.spec.keep_weights and selected
    weights = weights_bytes(best_module, transform) if keep else None
    eps = None
    if pack.private:
        # Epsilon from the noise, rate and steps this trial actually ran with.
        # A single run's epsilon, its noisy evaluations included (DP evaluation).
        ran = pack.spec.trial_inputs(
            t, sample_rate=pack.sample_rate, steps=pack.total_steps, evaluations=pack.n_releases
        )
        eps = epsilon_for(ran.with_noise(pack.sigmas[i]))
    return TrialResult(
        index=i,
        strategy=pack.spec.strategy,
        lr=t.lr,
        seed=t.seed,
        params=pack.strategy.params[i],
        private=pack.private,
        noise_multiplier=pack.sigmas[i] if pack.private else None,
        sample_rate=pack.sample_rate,
        steps=pack.total_steps,
        target_delta=t.target_delta if pack.private else None,
        epsilon=eps,
        accountant=pack.spec.accountant if pack.private else None,
        objective=records.objective,
        best_step=records.best_step[i],
        metrics=records.best_metrics[i],
        final_metrics=records.last_metrics[i],
        history=records.history[i],
        trajectories=records.traj[i],
        step_time_ms_median=median_ms,
        diverged_at=records.diverged_at[i],
        device=str(pack.device),
        randomness=pack.spec.randomness,
        engine_path=pack.engine_path,
        evaluation=getattr(pack.data, "evaluation", "carve-out"),
        weights_kept=records.best_kept[i] if pack.average is not None else None,
        model_info=info,
        checkpoint=records.best_flat[i].detach().cpu(),
        weights=weights,
    )


def _model_info(pack: PreparedPack, records: PackRecords, i: int, module: Any) -> dict[str, Any]:
    """What rebuilds the architecture (public facts only), and which weights were kept."""
    info = model_info(
        module,
        name=pack.model_spec.name,
        options=pack.model_spec.options,
        input_shape=pack.data.input_shape,
        num_classes=pack.data.num_classes,
        engine_path=pack.engine_path,
        spec=pack.model_spec,
    )
    # Whether the file holds the input transform (the model takes raw records), and if not
    # why: names and a formula, no value.
    data = pack.data
    info["input_transform"] = describe(getattr(data, "input_transform", None), data.kind)
    ref = pack.spec.pretrain
    if ref is not None:
        # Public facts: the public set's name, the recipe and the cached weights' digest (read
        # back from the cache the pack's model was built from; no private record involved).
        info["pretrained"] = {
            "dataset": ref.dataset.name,
            "digest": pretrained(pack.model_spec, ref).digest,
            "recipe": dict(ref.recipe),
        }
    if pack.average is not None:
        info["weights_kept"] = records.best_kept[i]
        info["ema_decay"] = pack.average.decay
        info["ema_warmup"] = pack.average.warmup
    return info
