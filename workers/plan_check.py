"""Plan equals run: a trial touches data only with the q, T, sigma and data it was planned for.

A sweep reserves privacy budget for a plan: each grid's sample rate q, step count T, noise
multiplier sigma, strategy, and the content of the dataset (its hash, see
:attr:`workers.datasets.Dataset.content_sha256`). If anything differs when a trial starts (a
data file edited between plan and run changes N and so q; a stored trial row whose sigma was
altered; another strategy), the reservation says nothing about what the trial would spend, so
the trial must not run. :func:`check_plan` is that refusal; the worker calls it after loading
the data and before the first step, so that nothing is computed from a record first.

Comparisons are exact. q and T are recomputed by the same pure function
(:func:`workers.schedule.plan_steps`) from the same integers, and floats survive the JSON
round trip of the stored plan exactly, so an honest run always matches to the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpsweep.errors import PrivacyError
from dpsweep.plan import GridPlan
from workers.schedule import eval_releases, plan_steps


class PlanMismatch(PrivacyError):
    """A trial's run would differ from the plan its budget was reserved for; it does not run.

    The message names what differs and how to fix it. It carries no record's value: the
    dataset's hash is never printed (a hash of the records would let anyone who can guess all
    of them but one test candidates for the last).
    """


@dataclass(frozen=True)
class PlannedRun:
    """What a grid's reservation was planned for (copied from the stored plan).

    Args:
        strategy: the strategy's registry name.
        sample_rate: Poisson sampling rate q.
        steps: steps per trial T.
        noise_multiplier: sigma of every trial of the grid.
        dataset_sha256: the content hash of the planned data; ``None`` only for sweeps planned
            before the hash existed (their q and T are still checked, which catches a change
            in N).
        eval_mode: how the evaluation records are protected (``carve-out``, ``public``, ``dp``).
        eval_noise_multiplier: DP evaluation: the planned noise multiplier of each noisy count.
        eval_releases: DP evaluation: the planned number of noisy counts per trial.
    """

    strategy: str
    sample_rate: float
    steps: int
    noise_multiplier: float
    dataset_sha256: str | None = None
    eval_mode: str = "carve-out"
    eval_noise_multiplier: float | None = None
    eval_releases: int = 0

    @classmethod
    def of_grid(cls, grid: GridPlan) -> PlannedRun:
        """The planned run of a stored grid plan (:meth:`dpsweep.plan.GridPlan.from_stored`)."""
        return cls(
            strategy=grid.strategy,
            sample_rate=grid.sample_rate,
            steps=grid.steps_per_trial,
            noise_multiplier=grid.noise_multiplier,
            dataset_sha256=grid.dataset_sha256,
            eval_mode=grid.eval_mode or "carve-out",
            eval_noise_multiplier=grid.eval_noise_multiplier,
            eval_releases=grid.eval_releases or 0,
        )


def check_pack(spec: Any, data: Any) -> tuple[float, int]:
    """Check a :class:`workers.training.specs.PackSpec` against its plan, on the data it would load.

    The runner calls it before charging and the worker after loading, before the first step.

    Returns:
        The run's sample rate q and steps T.

    Raises:
        ConfigError: settings that give no q or T (e.g. a batch larger than the data).
        PlanMismatch: the run differs from its plan (a pack without a plan is not checked).
    """
    q, steps = plan_steps(
        # The size the plan used: declared by the owner for a stored dataset (the records'
        # own count is private), counted otherwise.
        n_train=data.planning_n_train,
        batch_size=spec.batch_size,
        epochs=spec.epochs,
        steps=spec.steps,
    )
    if spec.planned is not None:
        dp_eval = spec.eval_noise_multiplier is not None
        check_plan(
            spec.planned,
            strategy=spec.strategy,
            sample_rate=q,
            steps=steps,
            noise_multipliers=[t.noise_multiplier for t in spec.trials],
            dataset_sha256=data.content_sha256,
            eval_mode=getattr(data, "evaluation", "carve-out"),
            eval_noise_multiplier=spec.eval_noise_multiplier,
            eval_releases=eval_releases(steps=steps, eval_every=spec.eval_every) if dp_eval else 0,
        )
    return q, steps


def check_plan(
    planned: PlannedRun,
    *,
    strategy: str,
    sample_rate: float,
    steps: int,
    noise_multipliers: list[float | None],
    dataset_sha256: str | None,
    eval_mode: str = "carve-out",
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> None:
    """Refuse a run whose parameters or data differ from its plan.

    Args:
        planned: what the reservation covers.
        strategy, sample_rate, steps: what the run would use.
        noise_multipliers: each trial's sigma.
        dataset_sha256: the content hash of the data the run loaded.
        eval_mode: how the loaded data's evaluation records are protected.
        eval_noise_multiplier, eval_releases: the run's noisy evaluation counts (DP evaluation).

    Raises:
        PlanMismatch: naming every difference (never the data's hash).
    """
    problems: list[str] = []
    if strategy != planned.strategy:
        problems.append(f"strategy {strategy!r} differs from the planned {planned.strategy!r}")
    if planned.dataset_sha256 is not None and dataset_sha256 != planned.dataset_sha256:
        problems.append("the dataset's records differ from the records the plan was made for")
    if sample_rate != planned.sample_rate:
        problems.append(
            f"sample rate q = {sample_rate!r} differs from the planned {planned.sample_rate!r}"
        )
    if steps != planned.steps:
        problems.append(f"{steps} steps differ from the planned {planned.steps}")
    wrong = [i for i, s in enumerate(noise_multipliers) if s != planned.noise_multiplier]
    if wrong:
        problems.append(
            f"the noise multiplier of {len(wrong)} trial(s) differs from the planned "
            f"{planned.noise_multiplier!r}"
        )
    if eval_mode != planned.eval_mode:
        problems.append(
            f"evaluation mode {eval_mode!r} differs from the planned {planned.eval_mode!r}"
        )
    if eval_noise_multiplier != planned.eval_noise_multiplier:
        problems.append(
            f"the evaluation noise multiplier {eval_noise_multiplier!r} differs from the planned "
            f"{planned.eval_noise_multiplier!r}"
        )
    if eval_releases != planned.eval_releases:
        problems.append(
            f"{eval_releases} noisy evaluations per trial differ from the planned "
            f"{planned.eval_releases}"
        )
    if problems:
        raise PlanMismatch(
            "refused before touching the data: this run is not the one its privacy budget was "
            f"reserved for ({'; '.join(problems)}). Nothing was trained. If the data changed on "
            "purpose, submit the sweep again so that it is planned (and charged) for the new data"
        )
