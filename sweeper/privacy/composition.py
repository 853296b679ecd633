"""The ``compose`` and ``basic`` methods: a grid of K trials, every one of which may be released.

* ``compose``: one sigma such that K*T subsampled-Gaussian steps compose to <= epsilon at
  delta (dp_accounting's PLD, tight with pessimistic discretisation, by default; or RDP).
* ``basic``: each trial gets epsilon/K and delta/K (the naive baseline).

With DP evaluation the trials' noisy evaluations are charged with their steps
(:mod:`sweeper.privacy.evaluation_releases`). :func:`sweeper.privacy.planner.plan_grid` fills
the ``epsilon_verified`` fields in with the second accountant
(:mod:`sweeper.privacy.verification`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sweeper.privacy.calibration import calibrate, grid_inputs, planned_epsilon
from sweeper.privacy.evaluation_releases import (
    check_eval_fits,
    eval_hint,
    eval_noise_multiplier,
)
from sweeper.privacy.gaussian_mechanism import composed_multiplier
from sweeper.privacy.grids import (
    GridPlan,
    GridRequest,
    InfeasiblePlan,
    build_grid_plan,
)


def _refuse_infeasible(
    req: GridRequest,
    sigma: float,
    per_trial_steps: Callable[[int], int],
    eval_noise: float | None = None,
    eps_eval: float | None = None,
) -> None:
    """Refuse a compose grid whose sigma exceeds the maximum, naming the largest grid that fits.

    Raises:
        InfeasiblePlan: always.
    """
    # Find the largest grid (number of trials) that keeps sigma within the allowed maximum
    # (with DP evaluation, its trials' evaluations at the same sigma_e).
    k = req.trials
    best = 0
    lo, hi = 1, k
    while lo <= hi:
        mid = (lo + hi) // 2
        asked = grid_inputs(
            req,
            steps=per_trial_steps(mid),
            eval_noise=composed_multiplier(
                eval_noise_multiplier=eval_noise, releases=mid * req.eval_releases
            ),
        )
        s = calibrate(
            asked, target_epsilon=req.epsilon_budget, max_noise_multiplier=req.max_noise_multiplier
        )
        if s <= req.max_noise_multiplier:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    need = (
        "more than " + f"{req.max_noise_multiplier * 8:g}" if math.isinf(sigma) else f"{sigma:.3g}"
    )
    hint = (
        f"the largest grid that keeps sigma <= {req.max_noise_multiplier:g} has {best} trial(s)"
        if best
        else "even a single trial would need more noise: raise epsilon, train fewer steps or "
        "use a larger batch"
    )
    raise InfeasiblePlan(
        f"arm {req.arm!r}: epsilon={req.epsilon_budget:g} for {req.trials} trials of "
        f"{req.steps_per_trial} steps needs sigma={need}, which no model will learn with "
        f"(max_noise_multiplier = {req.max_noise_multiplier:g}); {hint}. Shrink the grid, "
        f"charge fewer seeds, raise the budget, or use a larger batch"
        f"{eval_hint(req, epsilon_eval=eps_eval)}"
    )


def plan_compose(req: GridRequest) -> GridPlan:
    """One sigma for the whole grid: K*T steps (and the evaluations) compose to the budget."""
    total_steps = req.trials * req.steps_per_trial
    # DP evaluation: all K*E releases are one Gaussian of sigma_e / sqrt(K*E).
    eval_noise = eval_noise_multiplier(req)
    eps_eval = check_eval_fits(req, eval_noise_multiplier=eval_noise)
    grid_eval = composed_multiplier(
        eval_noise_multiplier=eval_noise, releases=req.trials * req.eval_releases
    )
    grid = grid_inputs(req, steps=total_steps, eval_noise=grid_eval)
    sigma = calibrate(
        grid, target_epsilon=req.epsilon_budget, max_noise_multiplier=req.max_noise_multiplier
    )
    if sigma > req.max_noise_multiplier:
        _refuse_infeasible(req, sigma, lambda k: k * req.steps_per_trial, eval_noise, eps_eval)
    total = planned_epsilon(grid.with_noise(sigma))
    trial_eval = composed_multiplier(eval_noise_multiplier=eval_noise, releases=req.eval_releases)
    trial = grid_inputs(
        req, steps=req.steps_per_trial, eval_noise=trial_eval, noise_multiplier=sigma
    )
    # plan_grid fills the epsilon_verified fields in with verify_plan's second accountant.
    return build_grid_plan(
        req,
        noise_multiplier=sigma,
        eval_noise_multiplier=eval_noise,
        epsilon_eval=eps_eval,
        epsilon_per_trial=planned_epsilon(trial),
        delta_per_trial=req.delta,
        epsilon_total=total,
        epsilon_verified=math.nan,
        accounting="compose",
        accountant=req.accountant,
        verified_by="unverified",
        release="all",
    )


def plan_basic(req: GridRequest) -> GridPlan:
    """One sigma for each trial's share: T steps (and E evaluations) at epsilon/K, delta/K."""
    eps_t, delta_t = req.epsilon_budget / req.trials, req.delta / req.trials
    # DP evaluation: each trial's E releases are one Gaussian of sigma_e / sqrt(E).
    eval_noise = eval_noise_multiplier(req)
    eps_eval = check_eval_fits(req, eval_noise_multiplier=eval_noise)
    trial_eval = composed_multiplier(eval_noise_multiplier=eval_noise, releases=req.eval_releases)
    trial = grid_inputs(req, steps=req.steps_per_trial, delta=delta_t, eval_noise=trial_eval)
    sigma = calibrate(trial, target_epsilon=eps_t, max_noise_multiplier=req.max_noise_multiplier)
    if sigma > req.max_noise_multiplier:
        raise InfeasiblePlan(
            f"arm {req.arm!r}: basic accounting gives each of {req.trials} trials epsilon "
            f"{eps_t:.3g}, which needs sigma > {req.max_noise_multiplier:g}; use compose "
            f"accounting or a smaller grid{eval_hint(req, epsilon_eval=eps_eval)}"
        )
    per = planned_epsilon(trial.with_noise(sigma))
    # plan_grid fills the epsilon_verified fields in with verify_plan's second accountant.
    return build_grid_plan(
        req,
        noise_multiplier=sigma,
        eval_noise_multiplier=eval_noise,
        epsilon_eval=eps_eval,
        epsilon_per_trial=per,
        delta_per_trial=delta_t,
        epsilon_total=req.trials * per,
        epsilon_verified=math.nan,
        accounting="basic",
        accountant=req.accountant,
        verified_by="unverified",
        release="all",
    )
