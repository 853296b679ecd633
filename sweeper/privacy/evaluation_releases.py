"""The DP evaluation's releases (spec ``eval: {mode: dp}``): their noise and their cost.

Each trial also releases E noisy counts of correct predictions
(``workers.schedule.eval_releases``), each a Gaussian of sensitivity 1 and multiplier
sigma_e, without subsampling. E such Gaussians are exactly one Gaussian of multiplier
sigma_e / sqrt(E) (mu-GDP with mu = sqrt(E) / sigma_e; Dong, Roth & Su 2019), and its
(epsilon, delta) profile is known in closed form (Balle & Wang 2018,
:func:`sweeper.privacy.gaussian_mechanism.gaussian_epsilon`). The training sigma is calibrated
so that training AND evaluation together fit the budget:

* compose: K*T subsampled steps + one Gaussian of multiplier sigma_e / sqrt(K*E);
* basic: per trial, T steps + sigma_e / sqrt(E), at epsilon/K and delta/K;
* papernot-steinke: each run of the RepeatAndSelect is its T steps composed with
  sigma_e / sqrt(E) (the selection uses every run's noisy evaluations).

Unless the spec gives sigma_e (``eval.noise_multiplier``), each grid gets the smallest one
whose evaluation releases ALONE cost at most ``eval.epsilon_share`` of its budget at its delta
(:func:`eval_noise_multiplier`); the verifier charges the evaluations too
(:func:`plan_eval_releases`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from dpsweep.errors import PrivacyError
from dpsweep.plan import GridPlan
from sweeper.privacy.gaussian_mechanism import gaussian_epsilon, gaussian_mu
from sweeper.privacy.grids import GridRequest, InfeasiblePlan


@functools.lru_cache(maxsize=1024)
def _ps_eval_epsilon(eval_sigma: float, mean: float, shape: float, delta: float) -> float:
    """Epsilon of a random search's evaluations alone: RepeatAndSelect of one Gaussian run."""
    # deferred: dp_accounting takes about a second to import; papernot-steinke plans alone use it
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant  # deferred: dp_accounting, as above

    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_event.RepeatAndSelectDpEvent(dp_event.GaussianDpEvent(eval_sigma), mean, shape))
    return float(acc.get_epsilon(delta))


def eval_epsilon(req: GridRequest, *, eval_noise_multiplier: float) -> float:
    """What a grid's evaluation releases ALONE cost at its delta, with sigma_e
    ``eval_noise_multiplier``.

    * compose: all K*E releases, one Gaussian of mu = sqrt(K*E) / sigma_e (exact);
    * basic: K times one trial's E releases at delta/K (exact per trial, summed as basic
      composition does);
    * papernot-steinke: a RepeatAndSelect (same mean and shape) of one run's E releases, by
      dp_accounting's RDP. The selection sees every run's evaluations, so this is what they
      cost; it is more than one run's E releases alone (the conservative choice).
    """
    k, e = req.trials, req.eval_releases
    eval_noise = eval_noise_multiplier
    if e <= 0:
        return 0.0
    if req.accounting == "basic":
        return k * gaussian_epsilon(mu=math.sqrt(e) / eval_noise, delta=req.delta / k)
    if req.accounting == "papernot-steinke" and req.distribution_shape is not None:
        return _ps_eval_epsilon(
            eval_noise / math.sqrt(e), float(k), float(req.distribution_shape), req.delta
        )
    return gaussian_epsilon(mu=math.sqrt(k * e) / eval_noise, delta=req.delta)


def eval_noise_multiplier(req: GridRequest) -> float | None:
    """sigma_e of each evaluation release: the spec's, or the smallest whose releases alone
    cost at most ``eval_epsilon_share * epsilon_budget`` (see :func:`eval_epsilon`).

    None without DP evaluation. compose and basic solve the closed form (then round up by
    1e-9 relative); papernot-steinke bisects the RDP figure on log sigma_e to 1e-4 relative,
    returning the end that fits.
    """
    k, e = req.trials, req.eval_releases
    if e <= 0:
        return None
    if req.eval_noise_multiplier is not None:
        return float(req.eval_noise_multiplier)
    target = req.eval_epsilon_share * req.epsilon_budget
    if req.accounting == "basic":
        mu = gaussian_mu(epsilon=target / k, delta=req.delta / k)
        return math.sqrt(e) / mu * (1 + 1e-9)
    if req.accounting == "papernot-steinke" and req.distribution_shape is not None:
        mean, shape = float(k), float(req.distribution_shape)
        # One run's releases at the whole target is a lower bound: repeating only adds.
        lo = math.log(1.0 / gaussian_mu(epsilon=target, delta=req.delta))
        hi = lo + math.log(2.0)
        while _ps_eval_epsilon(math.exp(hi), mean, shape, req.delta) > target:
            lo, hi = hi, hi + math.log(2.0)
        while _ps_eval_epsilon(math.exp(lo), mean, shape, req.delta) <= target:
            lo, hi = lo - math.log(2.0), lo
        while hi - lo > 1e-4:
            mid = (lo + hi) / 2
            if _ps_eval_epsilon(math.exp(mid), mean, shape, req.delta) > target:
                lo = mid
            else:
                hi = mid
        return math.exp(hi) * math.sqrt(e)
    mu = gaussian_mu(epsilon=target, delta=req.delta)
    return math.sqrt(k * e) / mu * (1 + 1e-9)


_solve_eval_noise = eval_noise_multiplier


def check_eval_fits(req: GridRequest, *, eval_noise_multiplier: float | None) -> float | None:
    """The evaluations' epsilon alone; refuse a grid where they leave nothing for training."""
    eval_noise = eval_noise_multiplier
    if eval_noise is None:
        return None
    eps_eval = eval_epsilon(req, eval_noise_multiplier=eval_noise)
    if eps_eval >= req.epsilon_budget:
        target = req.eval_epsilon_share * req.epsilon_budget
        # The module's function, which the keyword argument shadows here.
        suggest = _solve_eval_noise(replace(req, eval_noise_multiplier=None))
        raise InfeasiblePlan(
            f"arm {req.arm!r}: the {req.trials} trial(s)' noisy evaluations alone "
            f"({req.eval_releases} per trial at eval.noise_multiplier = {eval_noise:.4g}) cost "
            f"epsilon {eps_eval:.4g}, at least the whole budget {req.epsilon_budget:g}, leaving "
            f"nothing for training; raise eval.noise_multiplier (e.g. to {suggest:.4g}, where "
            f"they cost {target:.3g}, a share of {req.eval_epsilon_share:g}), or leave it out and "
            "set a small eval.epsilon_share, or evaluate less often (raise training.eval_every)"
        )
    return eps_eval


def eval_hint(req: GridRequest, *, epsilon_eval: float | None) -> str:
    """The end of an infeasibility message: what the evaluations already cost
    (``epsilon_eval``), and the knob that leaves training more ("" without DP evaluation)."""
    eps_eval = epsilon_eval
    if not eps_eval:
        return ""
    knob = (
        "raise eval.noise_multiplier"
        if req.eval_noise_multiplier is not None
        else "lower eval.epsilon_share"
    )
    return (
        f"; the noisy evaluations alone already cost epsilon {eps_eval:.3g} of "
        f"{req.epsilon_budget:g}: {knob} or raise training.eval_every to leave training more"
    )


def plan_eval_releases(plan: GridPlan) -> tuple[float | None, int]:
    """A plan's (sigma_e, E): its DP evaluation releases per trial, or (None, 0).

    Raises:
        PrivacyError: releases without a usable noise multiplier (fail closed).
    """
    releases = int(plan.eval_releases or 0)
    if releases <= 0:
        return None, 0
    sigma_e = plan.eval_noise_multiplier
    if sigma_e is None or not (sigma_e > 0 and math.isfinite(sigma_e)):
        raise PrivacyError(
            f"arm {plan.arm!r}: the plan has {releases} noisy evaluation(s) per trial but no "
            f"usable eval_noise_multiplier ({sigma_e}); plan refused"
        )
    return float(sigma_e), releases
