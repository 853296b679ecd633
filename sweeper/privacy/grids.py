"""What planning one grid takes and gives: GridRequest in, :class:`dpsweep.plan.GridPlan` out.

A *grid* is one arm (one strategy's grid of hyperparameters) at one epsilon level: K trials
of T steps at sample rate q. Each accounting method (``compose``, ``basic``,
``papernot-steinke``) is a :data:`Planner`, listed under its stable name in
:data:`sweeper.privacy.planner.PLANNERS`; :func:`sweeper.privacy.planner.plan_grid` picks one
by the request's ``accounting`` and verifies what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpsweep.accountants import DEFAULT_ACCOUNTANT
from dpsweep.errors import PrivacyError
from dpsweep.plan import GridPlan
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
    accountant: str = DEFAULT_ACCOUNTANT
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


# One accounting method: a request in, an unverified plan out (sweeper.privacy.planner.PLANNERS).
Planner = Callable[[GridRequest], GridPlan]


def build_grid_plan(
    req: GridRequest,
    *,
    noise_multiplier: float,
    eval_noise_multiplier: float | None = None,
    epsilon_eval: float | None = None,
    **fields: Any,
) -> GridPlan:
    """A plan for ``req`` at ``noise_multiplier``; ``fields`` are the method's figures.

    ``eval_noise_multiplier`` and ``epsilon_eval``: DP evaluation's noise and what its
    releases alone cost (None: no DP evaluation, and the plan carries no evaluation releases).
    """
    return GridPlan(
        arm=req.arm,
        strategy=req.strategy,
        epsilon_budget=req.epsilon_budget,
        delta=req.delta,
        trials=req.trials,
        steps_per_trial=req.steps_per_trial,
        sample_rate=req.sample_rate,
        noise_multiplier=noise_multiplier,
        retries=req.retries,
        eval_releases=req.eval_releases if eval_noise_multiplier is not None else 0,
        eval_noise_multiplier=eval_noise_multiplier,
        epsilon_eval=epsilon_eval,
        **fields,
    )
