"""Public pre-tuning: train an arm's grid points on public records and pick the best.

An arm that names a dataset declared public (``tune_on``) has its grid centred on what works
on those records at its grid's noise level (``sweeper.sweeps.tuning``). This module trains the
points: every point of the arm's grid, as one pack, on the public records only, at the grid's
*planned* noise multiplier and delta, for the grid's planned number of steps. No private record
is read, so no epsilon is spent and nothing is charged; the pack has no plan to check
(``planned=None``). Randomness is ``reproducible`` with one fixed seed for every point (the same
initial weights, batches and noise: the points differ only in their hyperparameters): the
records are public, so no privacy is at stake, and planning a spec twice (``dpsweep plan`` then
the submission) gives the same result. Workers never touch the database; the caller loads the
public data and hands it in.

Tuning small, then scaling (Sander et al. 2023, TAN): with ``training.tune_batch_scale: r`` the
points train at the logical batch ``B / r`` with the noise multiplier ``sigma / r``, so the
noise on the averaged gradient, ``sigma / B``, is the private run's and the best
hyperparameters carry over, at about ``1 / r`` of the cost per step. The step count is the
grid's, as without scaling. The private grid then runs at the full batch and its planned sigma.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpsweep.errors import ConfigError
from dpsweep.spec import ModelConfig, TrainingConfig
from workers.datasets.records import Dataset, DatasetSpec
from workers.training.loop import train_pack
from workers.training.specs import TrialSpec, training_pack

#: The public seed of every tuning trial (initial weights, batches and noise).
TUNING_SEED = 0


@dataclass(frozen=True)
class TuningResult:
    """The best point of a public tuning run.

    Attributes:
        best: The best point's hyperparameters (``lr`` included), as the grid gave them.
        score: Its objective on the public records' evaluation part (None: no point gave a
            finite value, e.g. every point diverged; ``best`` is then the first point).
        scores: Every point's objective, in grid order (None where it is not finite).
    """

    best: dict[str, Any]
    score: float | None
    scores: list[float | None] = field(default_factory=list)
    # The logical batch and noise multiplier the points trained at (the grid's divided by
    # training.tune_batch_scale: sigma / B as the private run's).
    batch_size: int | None = None
    noise_multiplier: float | None = None


def scaled_for_tuning(training: TrainingConfig, noise_multiplier: float) -> tuple[int, float]:
    """The tuning run's logical batch ``B / r`` and noise multiplier ``sigma / r`` (r the
    spec's ``training.tune_batch_scale``): sigma / B as the private run's."""
    r = int(training.tune_batch_scale)
    batch = max(1, round(training.batch_size / r))
    # Divided by the batch actually used, so sigma / B is kept exactly when r does not divide B.
    return batch, float(noise_multiplier) * batch / training.batch_size


def tune_on_public(
    data: Dataset,
    dataset: DatasetSpec,
    *,
    model: ModelConfig,
    training: TrainingConfig,
    strategy: str,
    points: Sequence[Mapping[str, Any]],
    noise_multiplier: float,
    delta: float,
    steps: int,
    metric: str,
    mode: str,
    accountant: str,
    device: str = "cpu",
    threads: int = 1,
) -> TuningResult:
    """Train every point on the public records and return the best by the objective.

    Args:
        data: The loaded public dataset (its own split: trained on its training part,
            measured on its evaluation part; both public).
        dataset: Its worker spec.
        model, training: The spec's model and training sections (the step count is
            ``steps``, the grid's planned T, whatever the section says; the logical batch and
            sigma are divided by its ``tune_batch_scale``).
        strategy: The arm's strategy.
        points: Each point's hyperparameters, ``lr`` included, the arm's fixed params merged
            under the grid's values.
        noise_multiplier, delta: The grid's planned sigma and per-trial delta.
        steps: The grid's planned steps per trial.
        metric, mode: The spec's objective (``accuracy``/``max``, ...).
        accountant: The worker accountant the pack reports its (meaningless, public)
            single-run epsilon with (``workers.accounting.registry``).
        device, threads: Where to train.

    Raises:
        ConfigError: a point without a learning rate, or settings the pack refuses.
    """
    if not points:
        raise ConfigError("public tuning needs at least one grid point", field="arms")
    batch, sigma = scaled_for_tuning(training, noise_multiplier)
    if batch != training.batch_size:
        training = training.model_copy(update={"batch_size": batch})
    pack = training_pack(
        model=model,
        training=training,
        strategy=strategy,
        trials=_tuning_trials(points, noise_multiplier=sigma, delta=delta),
        dataset=dataset,
        accountant=accountant,
        # Public records, public seeds: reproducible, so that plan and submit agree.
        reproducible=True,
        planned=None,
        device=device,
        threads=threads,
        steps=int(steps),
    )
    results = train_pack(pack, dataset=data)
    scores = [_finite(r.metrics.get(metric)) for r in results]
    i = _best_index(scores, mode)
    return TuningResult(
        best=dict(points[i]),
        score=scores[i],
        scores=scores,
        batch_size=batch,
        noise_multiplier=sigma,
    )


def _tuning_trials(
    points: Sequence[Mapping[str, Any]], *, noise_multiplier: float, delta: float
) -> list[TrialSpec]:
    """One trial per point, at the public seed and the tuning sigma (its ``lr`` taken out of
    its params)."""
    trials = []
    for p in points:
        params = dict(p)
        lr = params.pop("lr", None)
        if lr is None:
            raise ConfigError("every tuning point needs a learning rate", field="arms")
        trials.append(
            TrialSpec(
                lr=float(lr),
                seed=TUNING_SEED,
                noise_multiplier=noise_multiplier,
                target_delta=float(delta),
                params=params,
            )
        )
    return trials


def _best_index(scores: Sequence[float | None], mode: str) -> int:
    """The first best score's index by ``mode`` (``max`` or ``min``), skipping unmeasured
    points; 0 when none was measured."""
    best_i: int | None = None
    for i, s in enumerate(scores):
        if s is None:
            continue
        current = scores[best_i] if best_i is not None else None
        if current is None or (s > current if mode == "max" else s < current):
            best_i = i
    return 0 if best_i is None else best_i


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    x = float(v)
    return x if math.isfinite(x) else None
