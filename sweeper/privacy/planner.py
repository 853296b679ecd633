"""The privacy planner: one noise multiplier per grid so that the whole grid fits its budget.

Each arm (one strategy's grid) at each epsilon level is a *grid* of K trials of T steps at
sample rate q (Mohapatra et al. 2022, the protocol of 004). Methods (stable registry names):

* ``compose``: one sigma such that K*T subsampled-Gaussian steps compose to <= epsilon at delta.
  Calibrated with dp_accounting's PLD (tight; pessimistic discretisation) by default, or RDP.
  Every trial's results may be released (:mod:`sweeper.privacy.composition`).
* ``basic``: each trial gets epsilon/K and delta/K (the naive baseline).
* ``papernot-steinke``: random search whose number of trials is random with mean K
  (logarithmic, geometric, truncated negative binomial or Poisson), accounted with
  dp_accounting's RdpAccountant on a RepeatAndSelectDpEvent. Only the selected trial may be
  released (:mod:`sweeper.privacy.papernot_steinke`).

Every plan is then **verified** by a second accountant that shares no code with the first
(:func:`sweeper.privacy.verification.verify_plan`, :mod:`workers.accounting.audit`): Gopi et
al. (2021)'s PRV accountant for compose and basic, an independent Rényi-DP implementation of
Papernot & Steinke's theorems for papernot-steinke. A plan is refused when the two disagree
beyond their stated errors (the planner under-states, or a PLD figure lies far above the PRV's
upper bound) or when either exceeds the budget. Strategies with a second query (quantile,
online) split the planned sigma themselves, so a step still costs one Gaussian of multiplier
sigma (:mod:`sweeper.privacy.noise_split`). Nothing here imports torch.

**DP evaluation** (spec ``eval: {mode: dp}``): each trial also releases E noisy counts, and
the training sigma is calibrated so that training AND evaluation together fit the budget
(:mod:`sweeper.privacy.evaluation_releases`).
"""

from __future__ import annotations

from typing import Any

from dpsweep.errors import ConfigError
from dpsweep.plan import GridPlan
from dpsweep.spec import DEFAULT_EVAL_EPSILON_SHARE
from sweeper.privacy.composition import plan_basic, plan_compose
from sweeper.privacy.grids import GridRequest, Planner
from sweeper.privacy.limits import (
    NO_SIGNAL_NOISE_MULTIPLIER,
    validate_request,
)
from sweeper.privacy.papernot_steinke import plan_papernot_steinke
from sweeper.privacy.verification import verify_plan
from workers.accounting.registry import accountant_names, get_accountant, spec_accountant
from workers.schedule import eval_releases, plan_steps

# The accounting methods by their stable names, in the order messages list them.
PLANNERS: dict[str, Planner] = {
    "compose": plan_compose,
    "basic": plan_basic,
    "papernot-steinke": plan_papernot_steinke,
}


def plan_grid(req: GridRequest) -> GridPlan:
    """Plan one grid, verify it, and refuse it if infeasible (fail closed).

    Raises:
        ConfigError: invalid inputs (the message names the field).
        InfeasiblePlan: the budget cannot be met with a usable noise multiplier.
        PrivacyError: the independent verification exceeds the budget.
    """
    validate_request(req)
    if req.accounting not in PLANNERS:
        raise ConfigError(
            f"unknown accounting {req.accounting!r}; choose one of: {', '.join(PLANNERS)}",
            field="privacy.accounting",
        )
    return verify_plan(PLANNERS[req.accounting](req))


def plan_accountant_name(spec_name: str) -> str:
    """The grid plan's accountant for a spec's ``privacy.accountant``: its canonical name.

    A legacy name (``prv`` = ``pld``, ``rdp`` = ``dp-rdp``) is read through
    :data:`dpsweep.accountants.LEGACY_ACCOUNTANTS`; any registered accountant that the planner
    may calibrate with (``pld``, ``dp-rdp``, plug-ins) is accepted.

    Raises:
        ConfigError: unknown (the message lists the names) or not for planning (Opacus's).
    """
    desc = spec_accountant(spec_name)
    if not desc.plannable:
        choices = [n for n in accountant_names() if get_accountant(n).plannable]
        raise ConfigError(
            f"accountant {spec_name!r} ({desc.library}) cannot calibrate a plan; use one of: "
            f"{', '.join(choices)}",
            field="privacy.accountant",
        )
    return desc.name


def grid_requests(spec: Any, *, dataset_size: int, n_train: int) -> list[GridRequest]:
    """One request per arm and epsilon level of a :class:`dpsweep.spec.SweepSpec`.

    With ``eval: {mode: dp}`` every trial is charged its E noisy evaluations
    (:func:`workers.schedule.eval_releases`) at the spec's ``eval.noise_multiplier``, or at
    the one its ``eval.epsilon_share`` picks. A spec without ``eval`` evaluates on a carve-out.
    """
    q, steps = plan_steps(
        n_train=n_train,
        batch_size=spec.training.batch_size,
        epochs=spec.training.epochs,
        steps=spec.training.steps,
    )
    evaluation = getattr(spec, "eval", None)
    n_eval_releases, eval_noise, eval_share = 0, None, DEFAULT_EVAL_EPSILON_SHARE
    if getattr(evaluation, "mode", "carve-out") == "dp":
        n_eval_releases = eval_releases(steps=steps, eval_every=spec.training.eval_every)
        eval_noise = getattr(evaluation, "noise_multiplier", None)
        eval_share = float(getattr(evaluation, "share", None) or eval_share)
    dist = spec.privacy.distribution
    return [
        GridRequest(
            arm=arm.label,
            strategy=arm.strategy,
            epsilon_budget=float(level),
            delta=spec.privacy.delta,
            trials=spec.trials_per_grid(arm) + spec.privacy.retries,
            steps_per_trial=steps,
            sample_rate=q,
            accounting=spec.privacy.accounting,
            accountant=plan_accountant_name(spec.privacy.accountant),
            distribution_shape=dist.shape if dist is not None else None,
            distribution_name=dist.name if dist is not None else None,
            max_noise_multiplier=spec.privacy.max_noise_multiplier or NO_SIGNAL_NOISE_MULTIPLIER,
            dataset_size=dataset_size,
            retries=spec.privacy.retries,
            eval_releases=n_eval_releases,
            eval_noise_multiplier=None if eval_noise is None else float(eval_noise),
            eval_epsilon_share=eval_share,
        )
        for arm in spec.arms
        for level in spec.privacy.budgets
    ]
