"""The ``papernot-steinke`` method: random search with a random number of trials.

The number of trials is random with mean K (logarithmic, geometric, truncated negative
binomial or Poisson; Papernot & Steinke 2022), accounted with dp_accounting's RdpAccountant
on a RepeatAndSelectDpEvent. Only the selected trial may be released. With DP evaluation
each run's noisy evaluations are part of the run that RepeatAndSelect repeats. The plan is
verified by an independent Rényi-DP implementation of the theorems
(:mod:`sweeper.privacy.verification`).
"""

from __future__ import annotations

import functools
import math

from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.errors import ConfigError
from sweeper.privacy.calibration import CALIBRATION_SLACK, grid_inputs, planned_epsilon
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


def repeat_and_select_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    mean_trials: float,
    shape: float,
    target_delta: float,
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> float:
    """Epsilon of random search (Papernot & Steinke 2022) by dp_accounting's RDP accountant.

    With DP evaluation, each run is its steps composed with its ``eval_releases`` Gaussian
    releases of multiplier ``eval_noise_multiplier`` (one Gaussian of sigma_e / sqrt(E)).
    """
    # deferred: dp_accounting takes about a second to import; papernot-steinke plans alone use it
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant  # deferred: dp_accounting, as above

    one: dp_event.DpEvent = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier)),
        steps,
    )
    extra = composed_multiplier(eval_noise_multiplier=eval_noise_multiplier, releases=eval_releases)
    if extra is not None:
        one = dp_event.ComposedDpEvent([one, dp_event.GaussianDpEvent(extra)])
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_event.RepeatAndSelectDpEvent(one, mean_trials, shape))
    return float(acc.get_epsilon(target_delta))


@functools.lru_cache(maxsize=1024)
def _ps_epsilon(run: AccountingInputs, mean: float, shape: float) -> float:
    # run: one run of the search; its evaluations composed to one Gaussian (sigma_e /
    # sqrt(E), one release), or none.
    return repeat_and_select_epsilon(
        noise_multiplier=run.sigma,
        sample_rate=run.sample_rate,
        steps=run.steps,
        mean_trials=mean,
        shape=shape,
        target_delta=run.delta,
        eval_noise_multiplier=run.eval_noise_multiplier,
        eval_releases=run.evaluations,
    )


def plan_papernot_steinke(req: GridRequest) -> GridPlan:
    """The smallest sigma whose RepeatAndSelect (mean ``trials`` runs) fits the budget."""
    if req.distribution_shape is None:
        raise ConfigError("papernot-steinke needs a distribution", field="privacy.distribution")
    shape, mean = req.distribution_shape, float(req.trials)
    # DP evaluation: each run's E releases (one Gaussian of sigma_e / sqrt(E)) are part of
    # the run that RepeatAndSelect repeats.
    eval_noise = eval_noise_multiplier(req)
    eps_eval = check_eval_fits(req, eval_noise_multiplier=eval_noise)
    run_eval = composed_multiplier(eval_noise_multiplier=eval_noise, releases=req.eval_releases)

    # One run as the planner's accountant sees it (the per-trial figure's), and as the
    # RepeatAndSelect repeats it (dp_accounting RDP, whatever the spec's accountant).
    run = grid_inputs(req, steps=req.steps_per_trial, eval_noise=run_eval)

    def eps(sigma: float) -> float:
        return _ps_epsilon(run.with_noise(sigma), mean, shape)

    lo, hi = math.log(0.05), math.log(req.max_noise_multiplier * 8)
    if eps(math.exp(hi)) > req.epsilon_budget:
        raise InfeasiblePlan(
            f"arm {req.arm!r}: random search with mean {req.trials} trials needs sigma > "
            f"{req.max_noise_multiplier * 8:g} for epsilon={req.epsilon_budget:g}; shrink the "
            f"search or raise the budget{eval_hint(req, epsilon_eval=eps_eval)}"
        )
    for _ in range(40):  # bisection on log sigma for the RepeatAndSelect total
        mid = (lo + hi) / 2
        e = eps(math.exp(mid))
        if e > req.epsilon_budget:
            lo = mid
        else:
            hi = mid
            if e >= req.epsilon_budget * (1 - CALIBRATION_SLACK):
                break
    sigma = math.exp(hi)
    if sigma > req.max_noise_multiplier:
        raise InfeasiblePlan(
            f"arm {req.arm!r}: random search with mean {req.trials} trials needs sigma = "
            f"{sigma:.3g} > {req.max_noise_multiplier:g}; shrink the search or raise the budget"
            f"{eval_hint(req, epsilon_eval=eps_eval)}"
        )
    total = eps(sigma)
    # plan_grid fills the epsilon_verified fields in with verify_plan's independent RDP (the
    # old check repeated this very dp_accounting call, which could not catch its bugs).
    return build_grid_plan(
        req,
        noise_multiplier=sigma,
        eval_noise_multiplier=eval_noise,
        epsilon_eval=eps_eval,
        epsilon_per_trial=planned_epsilon(run.with_noise(sigma)),
        delta_per_trial=req.delta,
        epsilon_total=total,
        epsilon_verified=math.nan,
        accounting="papernot-steinke",
        accountant="rdp (RepeatAndSelect)",
        verified_by="unverified",
        release="selected-only",
        distribution_shape=shape,
    )
