"""What planning one grid takes and gives: GridRequest and GridPlan (and the methods' type).

A *grid* is one arm (one strategy's grid of hyperparameters) at one epsilon level: K trials
of T steps at sample rate q. Each accounting method (``compose``, ``basic``,
``papernot-steinke``) is a :data:`Planner`, listed under its stable name in
:data:`sweeper.privacy.planner.PLANNERS`; :func:`sweeper.privacy.planner.plan_grid` picks one
by the request's ``accounting`` and verifies what it returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from dpsweep.errors import PrivacyError
from dpsweep.spec import DEFAULT_EVAL_EPSILON_SHARE


class InfeasiblePlan(PrivacyError):
    """No usable noise multiplier fits the budget; the message says what to change."""


@dataclass(frozen=True)
class GridRequest:
    """What the planner needs to know about one grid (an arm at one epsilon level)."""

    arm: str
    strategy: str
    epsilon_budget: float
    delta: float
    trials: int
    steps_per_trial: int
    sample_rate: float
    accounting: str = "compose"
    accountant: str = "pld"
    distribution_shape: float | None = None  # papernot-steinke: RepeatAndSelect's shape
    distribution_name: str | None = None
    max_noise_multiplier: float = 10.0
    dataset_size: int | None = None
    # Of ``trials``, how many runs are reserved for re-running interrupted trials.
    retries: int = 0
    # DP evaluation: E noisy evaluations per trial (0: none), each a Gaussian of sensitivity 1
    # and multiplier eval_noise_multiplier (sigma_e; None: chosen so the evaluations alone
    # cost at most eval_epsilon_share of the budget).
    eval_releases: int = 0
    eval_noise_multiplier: float | None = None
    eval_epsilon_share: float = DEFAULT_EVAL_EPSILON_SHARE


@dataclass(frozen=True)
class GridPlan:
    """One grid's plan: its noise multiplier, its epsilon figures and how they were verified."""

    arm: str
    strategy: str
    epsilon_budget: float
    delta: float
    trials: int
    steps_per_trial: int
    sample_rate: float
    noise_multiplier: float
    epsilon_per_trial: float
    delta_per_trial: float
    epsilon_total: float
    epsilon_verified: float
    accounting: str
    accountant: str
    verified_by: str
    release: str  # "all" or "selected-only"
    # The gradient's own multiplier once strategies with a second query have split sigma
    # (quantile, online); equal to noise_multiplier for the others.
    gradient_noise_multiplier: float = 0.0
    # Of ``trials``, runs reserved for re-running interrupted trials (privacy.retries).
    retries: int = 0
    # How the dataset's inputs are scaled and bounded (workers.datasets.Dataset.input_scaling):
    # method, clip range and source, shown with the plan so users see what the model gets.
    input_scaling: dict[str, Any] | None = field(default=None, hash=False)
    # Quantile grids: the count noise sigma_b chosen when the spec leaves it out
    # (workers.count_noise); None where the spec sets it or the strategy has no count.
    count_noise: float | None = None
    # Judgements the user should see (high noise, with an expected-utility hint); no refusal.
    warnings: tuple[str, ...] = ()
    # Records the epsilon covers (training) and the evaluation carve-out (public sizes).
    n_train: int | None = None
    n_eval: int | None = None
    # The second accountant of verify_plan (name and version) and its error bars around
    # epsilon_verified (its estimate): for the PRV accountant, rigorous bounds on the true
    # epsilon; for the independent RDP, the order-grid agreement tolerance.
    verifier: str = ""
    epsilon_verified_lower: float | None = None
    epsilon_verified_upper: float | None = None
    # papernot-steinke: RepeatAndSelect's shape of the distribution of the number of trials
    # (whose mean is ``trials``), so the plan can be re-verified from its own fields.
    # math.inf (Poisson) is written "inf" by to_dict: JSON has no infinity.
    distribution_shape: float | None = None
    # How the evaluation records are protected (the spec's eval.mode: carve-out, public, dp)
    # and, for public, the registered name of the evaluation dataset.
    eval_mode: str = "carve-out"
    eval_dataset: str | None = None
    # DP evaluation: E noisy counts per trial, each a Gaussian of multiplier sigma_e
    # (eval_noise_multiplier); epsilon_total and epsilon_per_trial include them. epsilon_eval:
    # what the grid's evaluation releases alone cost at the grid's delta (for display).
    eval_releases: int = 0
    eval_noise_multiplier: float | None = None
    epsilon_eval: float | None = None
    # Which engine path trains the grid's model, as its descriptor declares it (packed,
    # generic, or auto: decided when built); each trial records the path it took.
    engine_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["distribution_shape"] is not None and math.isinf(d["distribution_shape"]):
            d["distribution_shape"] = "inf"  # float("inf") reads it back
        return d


# One accounting method: a request in, an unverified plan out (sweeper.privacy.planner.PLANNERS).
Planner = Callable[[GridRequest], GridPlan]


def build_grid_plan(
    req: GridRequest,
    sigma: float,
    eval_noise: float | None = None,
    eps_eval: float | None = None,
    **fields: Any,
) -> GridPlan:
    """A plan for ``req`` at noise multiplier ``sigma``; ``fields`` are the method's figures."""
    return GridPlan(
        arm=req.arm,
        strategy=req.strategy,
        epsilon_budget=req.epsilon_budget,
        delta=req.delta,
        trials=req.trials,
        steps_per_trial=req.steps_per_trial,
        sample_rate=req.sample_rate,
        noise_multiplier=sigma,
        retries=req.retries,
        eval_releases=req.eval_releases if eval_noise is not None else 0,
        eval_noise_multiplier=eval_noise,
        epsilon_eval=eps_eval,
        **fields,
    )
