"""The privacy planner: one noise multiplier per grid so that the whole grid fits its budget.

Each arm (one strategy's grid) at each epsilon level is a *grid* of K trials of T steps at
sample rate q (Mohapatra et al. 2022, the protocol of 004). Methods (stable registry names):

* ``compose``: one sigma such that K*T subsampled-Gaussian steps compose to <= epsilon at delta.
  Calibrated with dp_accounting's PLD (tight; pessimistic discretisation) by default, or RDP.
  Every trial's results may be released.
* ``basic``: each trial gets epsilon/K and delta/K (the naive baseline).
* ``papernot-steinke``: random search whose number of trials is random with mean K
  (logarithmic, geometric, truncated negative binomial or Poisson), accounted with
  dp_accounting's RdpAccountant on a RepeatAndSelectDpEvent. Only the selected trial may be
  released.

Every plan is then **verified** by a second accountant that shares no code with the first
(:func:`verify_plan`, :mod:`workers.accounting_audit`): Gopi et al. (2021)'s PRV accountant
for compose and basic, an independent Rényi-DP implementation of Papernot & Steinke's theorems
for papernot-steinke. A plan is refused when the two disagree beyond their stated errors (the
planner under-states, or a PLD figure lies far above the PRV's upper bound) or when either
exceeds the budget. Strategies with a second query (quantile, online) split the planned sigma
themselves, so a step still costs one Gaussian of multiplier sigma. Nothing here imports torch.

**DP evaluation** (spec ``eval: {mode: dp}``): each trial also releases E noisy counts of
correct predictions (``workers.schedule.eval_releases``), each a Gaussian of sensitivity 1 and
multiplier sigma_e, without subsampling. E such Gaussians are exactly one Gaussian of
multiplier sigma_e / sqrt(E) (mu-GDP with mu = sqrt(E) / sigma_e; Dong, Roth & Su 2019), and
its (epsilon, delta) profile is known in closed form (Balle & Wang 2018,
:func:`gaussian_epsilon`). The training sigma is calibrated so that training AND evaluation
together fit the budget:

* compose: K*T subsampled steps + one Gaussian of multiplier sigma_e / sqrt(K*E);
* basic: per trial, T steps + sigma_e / sqrt(E), at epsilon/K and delta/K;
* papernot-steinke: each run of the RepeatAndSelect is its T steps composed with
  sigma_e / sqrt(E) (the selection uses every run's noisy evaluations).

Unless the spec gives sigma_e (``eval.noise_multiplier``), each grid gets the smallest one
whose evaluation releases ALONE cost at most ``eval.epsilon_share`` of its budget at its delta
(:func:`eval_noise_multiplier`); the verifier charges the evaluations too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from scipy.optimize import brentq
from scipy.stats import norm

from dpsweep.spec import DEFAULT_EVAL_EPSILON_SHARE
from workers.accountants import plan_accountant, spec_accountant
from workers.accounting_audit import EpsilonBounds
from workers.count_noise import auto_count_noise
from workers.errors import ConfigError, PrivacyError

# Above this sigma a plan carries a warning with an expected-utility hint: many models learn
# slowly or not at all there, yet some strategies (online clipping on digits) still do, so it
# is a judgement for the user, not a refusal. A spec may set a hard maximum.
HIGH_NOISE_MULTIPLIER = 10.0
# Without a hard maximum in the spec, plans above this are refused: at sigma = 100 the noise
# on a batch of 1000 clipped gradients is still 10x the largest possible signal per coordinate.
NO_SIGNAL_NOISE_MULTIPLIER = 100.0
# Calibrated grids land within this fraction below their budget (never above).
CALIBRATION_SLACK = 0.01
# The verifying PLD uses dp_accounting's default grid, finer than the calibrating one.
VERIFY_DISCRETIZATION = 1e-4


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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["distribution_shape"] is not None and math.isinf(d["distribution_shape"]):
            d["distribution_shape"] = "inf"  # float("inf") reads it back
        return d


Planner = Callable[[GridRequest], GridPlan]
PLANNERS: dict[str, Planner] = {}


def register_planner(name: str) -> Callable[[Planner], Planner]:
    def deco(fn: Planner) -> Planner:
        PLANNERS[name] = fn
        return fn

    return deco


def plan_grid(req: GridRequest) -> GridPlan:
    """Plan one grid, verify it, and refuse it if infeasible (fail closed).

    Raises:
        ConfigError: invalid inputs (the message names the field).
        InfeasiblePlan: the budget cannot be met with a usable noise multiplier.
        PrivacyError: the independent verification exceeds the budget.
    """
    _validate(req)
    if req.accounting not in PLANNERS:
        raise ConfigError(
            f"unknown accounting {req.accounting!r}; choose one of: {', '.join(PLANNERS)}",
            field="privacy.accounting",
        )
    return verify_plan(PLANNERS[req.accounting](req))


def verify_plan(plan: GridPlan) -> GridPlan:
    """Recompute a plan's epsilon with a second, independent accountant; refuse disagreement.

    Only the plan's own fields are used (sigma, q, T, K, delta, accounting, accountant and the
    papernot-steinke shape; the mean number of trials is ``trials``), so a stored or hand-made
    plan is checked for what it says, not for how it was made:

    * compose: Gopi et al.'s PRV accountant on K*T steps at delta;
    * basic: the PRV accountant on one trial's T steps at delta/K, times K;
    * papernot-steinke: :func:`workers.accounting_audit.papernot_steinke_bounds`.

    With DP evaluation (``eval_releases`` E and ``eval_noise_multiplier`` sigma_e) the second
    accountant charges them too: K*E plain Gaussians (q = 1) in the PRV composition (E per
    trial for basic), and ``E * alpha / (2 sigma_e^2)`` added to one run's independent RDP
    curve for papernot-steinke.

    Tolerance rules (the figures are upper bounds with different error models):

    * Every plan: its epsilon_total (and for basic K * epsilon_per_trial, what the ledger
      charges) must not lie below the verifier's lower bound. PRV's bounds are rigorous
      (once its mean is computed right, see workers.accounting_audit._prv_bounds), so a
      figure below them under-states the cost. The independent RDP bound optimises over a
      superset of dp_accounting's orders with exact Rényi moments, so dp_accounting's figure
      can only be higher; its lower bar is the order-grid tolerance RDP_AGREEMENT (2 %).
    * PLD-calibrated compose and basic plans must also not lie above the PRV's upper bound
      by more than the PLD's own stated over-statement
      (:func:`workers.accounting_audit.pld_overstatement`): such a figure does not describe
      the plan's sigma. RDP-calibrated plans (accountant rdp, and papernot-steinke) are only
      loose upper bounds, so the upper side does not apply to them.
    * epsilon_total, and the verifier's lower bound, must both fit the budget.

    Returns:
        The plan with ``epsilon_verified`` (the verifier's estimate), its lower and upper
        bounds, ``verifier`` (name and version) and ``verified_by`` filled in.

    Raises:
        PrivacyError: the accountants disagree, the budget is exceeded, or the verifier
            cannot compute (fail closed). The message names the arm, both figures, both
            accountants and the error bars.
    """
    from workers.accounting_audit import PLD_STATED_ERROR, pld_overstatement

    bounds, verified_by = _verify_grid(plan)
    where = f"arm {plan.arm!r} at epsilon {plan.epsilon_budget:g} ({plan.accounting})"
    claimed = [plan.epsilon_total]
    if plan.accounting == "basic":
        claimed.append(plan.trials * plan.epsilon_per_trial)
    calibrator = _calibrator_name(plan)
    second = bounds.accountant + (", per trial times K" if plan.accounting == "basic" else "")
    sigma_e, releases = _plan_eval(plan)
    evaluation = (
        f", {releases} noisy evaluation(s) per trial at sigma_e {sigma_e:.6g}"
        if sigma_e is not None
        else ""
    )
    figures = (
        f"the plan states epsilon {plan.epsilon_total:.4f} ({calibrator}) but {second} gives "
        f"{bounds.estimate:.4f}, bounds {bounds.lower:.4f} to {bounds.upper:.4f}, at sigma "
        f"{plan.noise_multiplier:.6g}, q {plan.sample_rate:.6g}, {plan.trials} trial(s) of "
        f"{plan.steps_per_trial} steps{evaluation}, delta {plan.delta:.3g}"
    )
    if not min(claimed) >= bounds.lower:
        raise PrivacyError(
            f"{where}: {figures}: the plan under-states its privacy cost (below the verifier's "
            "lower bound); plan refused"
        )
    if plan_accountant(plan.accountant).tight and plan.accounting in ("compose", "basic"):
        # The planner's PLD composes the evaluations as one more (Gaussian) loss.
        extra = 1 if sigma_e is not None else 0
        if plan.accounting == "compose":
            slack = pld_overstatement(
                epsilon=bounds.upper, steps=plan.trials * plan.steps_per_trial + extra
            )
        else:  # K separate PLD figures, each with its own over-statement
            slack = plan.trials * pld_overstatement(
                epsilon=bounds.upper / plan.trials, steps=plan.steps_per_trial + extra
            )
        if not max(claimed) <= bounds.upper + slack:
            raise PrivacyError(
                f"{where}: {figures}: the plan's PLD figure exceeds the verifier's upper bound "
                f"by more than the PLD's stated over-statement ({slack:.3g}: "
                f"{PLD_STATED_ERROR:.0%} plus the grid's share), so it does not describe this "
                "noise multiplier; plan refused"
            )
    budget = plan.epsilon_budget * (1 + 1e-9)
    if not max(claimed) <= budget:
        raise PrivacyError(
            f"{where}: the plan's epsilon {max(claimed):.4f} ({calibrator}) exceeds the budget; "
            "plan refused"
        )
    if not bounds.lower <= budget:
        raise PrivacyError(
            f"{where}: independently verified epsilon {bounds.lower:.4f} (the lower bound of "
            f"{second}) exceeds the budget; plan rejected"
        )
    return replace(
        plan,
        epsilon_verified=bounds.estimate,
        epsilon_verified_lower=bounds.lower,
        epsilon_verified_upper=bounds.upper,
        verifier=bounds.accountant,
        verified_by=verified_by,
    )


def _validate(req: GridRequest) -> None:
    if not (req.epsilon_budget > 0 and math.isfinite(req.epsilon_budget)):
        raise ConfigError("epsilon budget must be > 0", field="privacy.budgets")
    if not 0 < req.delta < 1:
        raise ConfigError("delta must be in (0, 1)", field="privacy.delta")
    if req.dataset_size is not None and req.delta >= 1.0 / req.dataset_size:
        raise ConfigError(
            f"delta {req.delta:g} is >= 1/N for a dataset of N = {req.dataset_size} examples: "
            f"such a guarantee allows releasing an example outright; use delta < "
            f"{1.0 / req.dataset_size:.2g} (e.g. {_suggest_delta(req.dataset_size):g})",
            field="privacy.delta",
        )
    if req.trials < 1 or req.steps_per_trial < 1:
        raise ConfigError("a grid needs at least one trial of at least one step", field="arms")
    if not 0 < req.sample_rate <= 1:
        raise ConfigError("sample rate must be in (0, 1]", field="training.batch_size")
    if req.eval_releases < 0:
        raise ConfigError("eval_releases must be >= 0", field="training.eval_every")
    if req.eval_noise_multiplier is not None and not (
        req.eval_noise_multiplier > 0 and math.isfinite(req.eval_noise_multiplier)
    ):
        raise ConfigError(
            "eval.noise_multiplier must be a finite number > 0", field="eval.noise_multiplier"
        )
    if not 0 < req.eval_epsilon_share < 1:
        raise ConfigError("eval.epsilon_share must be in (0, 1)", field="eval.epsilon_share")


def _plan_eval(plan: GridPlan) -> tuple[float | None, int]:
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


def _verify_grid(plan: GridPlan) -> tuple[EpsilonBounds, str]:
    """The second accountant's epsilon bounds for a plan, and a readable name for it."""
    from workers import accounting_audit as audit

    sigma, q, steps, k = (
        plan.noise_multiplier,
        plan.sample_rate,
        plan.steps_per_trial,
        plan.trials,
    )
    sigma_e, releases = _plan_eval(plan)

    def prv(n_trials: int, delta: float, eps_error: float) -> EpsilonBounds:
        # n_trials' steps and, with DP evaluation, their n_trials*E evaluations: plain
        # Gaussians (q = 1, which the PRV accountant takes as a Gaussian PRV).
        if sigma_e is None:
            return audit.prv_epsilon(
                noise_multiplier=sigma,
                sample_rate=q,
                steps=n_trials * steps,
                target_delta=delta,
                eps_error=eps_error,
            )
        return audit.prv_compose_epsilon(
            [(sigma, q, n_trials * steps), (sigma_e, 1.0, n_trials * releases)],
            target_delta=delta,
            eps_error=eps_error,
        )

    if plan.accounting == "compose":
        bounds = prv(k, plan.delta, audit.prv_error(plan.epsilon_total))
        return bounds, "PRV accountant, Gopi et al. 2021"
    if plan.accounting == "basic":
        # K times each trial's bars: the total gets compose's bars (2 %, at least 0.01).
        each = prv(1, plan.delta / k, audit.prv_error(plan.epsilon_total) / k)
        return each.scaled(k), "PRV accountant, Gopi et al. 2021; per trial, times K"
    if plan.accounting == "papernot-steinke":
        if plan.distribution_shape is None:
            raise PrivacyError(
                f"arm {plan.arm!r}: the papernot-steinke plan does not record its distribution's "
                "shape, so its epsilon cannot be verified; plan refused"
            )
        bounds = audit.papernot_steinke_bounds(
            noise_multiplier=sigma,
            sample_rate=q,
            steps=steps,
            mean_trials=float(k),
            shape=float(plan.distribution_shape),
            target_delta=plan.delta,
            eval_noise_multiplier=sigma_e,
            eval_releases=releases,
        )
        return bounds, "independent RDP, Papernot & Steinke 2022"
    raise PrivacyError(f"arm {plan.arm!r}: no verifier for accounting {plan.accounting!r}")


def _calibrator_name(plan: GridPlan) -> str:
    if plan.accounting == "papernot-steinke":
        return "dp_accounting RDP, RepeatAndSelect"
    return plan_accountant(plan.accountant).library


def _suggest_delta(n: int) -> float:
    return float(10 ** math.floor(math.log10(0.1 / n)))


# -------------------------------------------------------------------------------------------
# Calibration


def _gdp_guess(
    epsilon: float, delta: float, q: float, steps: int, eval_sigma: float | None = None
) -> float:
    """Initial sigma from the CLT limit of subsampled Gaussian composition (mu-GDP).

    With ``eval_sigma`` (the evaluations' one Gaussian, mu_e = 1 / eval_sigma), the steps get
    what is left of the budget's mu: mu_steps^2 = mu^2 - mu_e^2 (mu-GDP composes so).
    """

    def gdp_delta(mu: float) -> float:
        return float(
            norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
        )

    lo, hi = 1e-6, 50.0
    for _ in range(100):  # delta(mu) grows with mu: bisect for delta(mu) = delta
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if gdp_delta(mid) < delta else (lo, mid)
    mu = lo
    if eval_sigma is not None:
        # Little or nothing left for the steps: start from much noise (the secant corrects).
        mu = math.sqrt(max(mu * mu - eval_sigma**-2, (0.05 * mu) ** 2))
    ratio = mu / (q * math.sqrt(steps))
    return 1.0 / math.sqrt(math.log1p(ratio * ratio)) if ratio > 0 else 1e3


# -------------------------------------------------------------------------------------------
# The Gaussian mechanism in closed form (DP evaluation)


def gaussian_delta(*, mu: float, epsilon: float) -> float:
    """The exact delta(epsilon) of a Gaussian mechanism of mu = sensitivity / std.

    Balle & Wang (2018), Theorem 8: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2). n
    composed Gaussians of multiplier sigma_e are one of mu = sqrt(n) / sigma_e.
    """
    if not mu > 0:
        return 0.0
    first = float(norm.cdf(-epsilon / mu + mu / 2))
    second = math.exp(epsilon + float(norm.logcdf(-epsilon / mu - mu / 2)))
    return max(first - second, 0.0)


def gaussian_epsilon(*, mu: float, delta: float) -> float:
    """The smallest epsilon at which a Gaussian mechanism of ``mu`` is (epsilon, delta)-DP.

    Exact (Balle & Wang 2018's analytic Gaussian mechanism), to ~1e-12; never below the
    true value (the root is stepped up until its delta fits).
    """
    if not 0 < delta < 1:
        raise ConfigError(f"delta must be in (0, 1); got {delta}", field="privacy.delta")
    if gaussian_delta(mu=mu, epsilon=0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gaussian_delta(mu=mu, epsilon=hi) > delta:
        hi *= 2
    eps = float(brentq(lambda e: gaussian_delta(mu=mu, epsilon=e) - delta, 0.0, hi, xtol=1e-13))
    while gaussian_delta(mu=mu, epsilon=eps) > delta:
        eps = eps * (1 + 1e-12) + 1e-13
    return eps


def gaussian_mu(*, epsilon: float, delta: float) -> float:
    """The largest mu whose Gaussian mechanism is (epsilon, delta)-DP (never above it)."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ConfigError("a Gaussian mechanism needs epsilon > 0 and delta in (0, 1)")
    lo, hi = 1e-9, 1.0
    while gaussian_delta(mu=hi, epsilon=epsilon) <= delta:
        lo, hi = hi, hi * 2
    mu = float(brentq(lambda m: gaussian_delta(mu=m, epsilon=epsilon) - delta, lo, hi, xtol=1e-14))
    while gaussian_delta(mu=mu, epsilon=epsilon) > delta:
        mu *= 1 - 1e-12
    return mu


def _eval_single(sigma_e: float | None, releases: int) -> float | None:
    """The one Gaussian multiplier ``releases`` Gaussians of ``sigma_e`` compose to."""
    if sigma_e is None or releases <= 0:
        return None
    return sigma_e / math.sqrt(releases)


@functools.lru_cache(maxsize=1024)
def _ps_eval_epsilon(eval_sigma: float, mean: float, shape: float, delta: float) -> float:
    """Epsilon of a random search's evaluations alone: RepeatAndSelect of one Gaussian run."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_event.RepeatAndSelectDpEvent(dp_event.GaussianDpEvent(eval_sigma), mean, shape))
    return float(acc.get_epsilon(delta))


def eval_epsilon(req: GridRequest, eval_noise: float) -> float:
    """What a grid's evaluation releases ALONE cost at its delta, with sigma_e ``eval_noise``.

    * compose: all K*E releases, one Gaussian of mu = sqrt(K*E) / sigma_e (exact);
    * basic: K times one trial's E releases at delta/K (exact per trial, summed as basic
      composition does);
    * papernot-steinke: a RepeatAndSelect (same mean and shape) of one run's E releases, by
      dp_accounting's RDP. The selection sees every run's evaluations, so this is what they
      cost; it is more than one run's E releases alone (the conservative choice).
    """
    k, e = req.trials, req.eval_releases
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


def _check_eval_fits(req: GridRequest, eval_noise: float | None) -> float | None:
    """The evaluations' epsilon alone; refuse a grid where they leave nothing for training."""
    if eval_noise is None:
        return None
    eps_eval = eval_epsilon(req, eval_noise)
    if eps_eval >= req.epsilon_budget:
        target = req.eval_epsilon_share * req.epsilon_budget
        suggest = eval_noise_multiplier(replace(req, eval_noise_multiplier=None))
        raise InfeasiblePlan(
            f"arm {req.arm!r}: the {req.trials} trial(s)' noisy evaluations alone "
            f"({req.eval_releases} per trial at eval.noise_multiplier = {eval_noise:.4g}) cost "
            f"epsilon {eps_eval:.4g}, at least the whole budget {req.epsilon_budget:g}, leaving "
            f"nothing for training; raise eval.noise_multiplier (e.g. to {suggest:.4g}, where "
            f"they cost {target:.3g}, a share of {req.eval_epsilon_share:g}), or leave it out and "
            "set a small eval.epsilon_share, or evaluate less often (raise training.eval_every)"
        )
    return eps_eval


def _eval_hint(req: GridRequest, eps_eval: float | None) -> str:
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


@functools.lru_cache(maxsize=8192)
def _epsilon(
    sigma: float,
    q: float,
    steps: int,
    delta: float,
    accountant: str,
    eval_sigma: float | None = None,
) -> float:
    # The planner's accountants (pld, dp-rdp) are dp_accounting's: planning never imports
    # torch. ``eval_sigma``: the evaluations composed to one Gaussian (sigma_e / sqrt(number of
    # releases)), or None.
    fn = plan_accountant(accountant).epsilon
    if eval_sigma is None:
        return fn(noise_multiplier=sigma, sample_rate=q, steps=steps, target_delta=delta)
    return fn(
        noise_multiplier=sigma,
        sample_rate=q,
        steps=steps,
        target_delta=delta,
        eval_noise_multiplier=eval_sigma,
        eval_releases=1,
    )


@functools.lru_cache(maxsize=1024)
def calibrate(
    epsilon: float,
    delta: float,
    q: float,
    steps: int,
    accountant: str,
    max_sigma: float,
    eval_sigma: float | None = None,
) -> float:
    """The smallest sigma (to ~0.3 %) with ``eps(sigma) <= epsilon``, landing within
    :data:`CALIBRATION_SLACK` below it; ``inf`` if even ``max_sigma * 8`` is not enough.

    ``eval_sigma``: DP evaluation's releases composed to one Gaussian of this multiplier,
    charged with the steps (None: none).

    Secant steps on ``log eps`` against ``log sigma`` from the mu-GDP guess, then a bracketed
    bisection: a handful of accountant calls instead of a blind binary search.
    """

    def f(log_sigma: float) -> float:
        return math.log(
            _epsilon(math.exp(log_sigma), q, steps, delta, accountant, eval_sigma)
        ) - math.log(epsilon)

    target_hi, target_lo = 0.0, math.log1p(-CALIBRATION_SLACK)
    guess = _gdp_guess(epsilon, delta, q, steps, eval_sigma)
    x0 = math.log(min(max(guess, 0.05), max_sigma * 4))
    f0 = f(x0)
    x1 = x0 + (0.05 if f0 > 0 else -0.05)
    f1 = f(x1)
    lo = hi = None  # lo: a log-sigma whose eps is too high; hi: one that fits
    for _ in range(8):
        for x, fx in ((x0, f0), (x1, f1)):
            if fx > target_hi:
                lo = x if lo is None or x > lo else lo
            else:
                hi = x if hi is None or x < hi else hi
                if fx >= target_lo:
                    return math.exp(x)
        if f1 == f0:
            break
        x2 = x1 - (f1 - (target_lo + target_hi) / 2) * (x1 - x0) / (f1 - f0)
        if lo is not None and hi is not None and not lo < x2 < hi:
            x2 = (lo + hi) / 2
        x2 = max(min(x2, math.log(max_sigma * 8)), math.log(1e-3))
        x0, f0, x1, f1 = x1, f1, x2, f(x2)
        if x1 == math.log(max_sigma * 8) and f1 > target_hi:
            return math.inf
    # Bisection fallback inside the bracket (rarely needed).
    if hi is None:
        x = math.log(max_sigma * 8)
        if f(x) > target_hi:
            return math.inf
        hi = x
    if lo is None:
        lo = math.log(1e-3)
    for _ in range(40):
        mid = (lo + hi) / 2
        fm = f(mid)
        if fm > target_hi:
            lo = mid
        else:
            hi = mid
            if fm >= target_lo:
                break
    return math.exp(hi)


def _infeasible(
    req: GridRequest,
    sigma: float,
    per_trial_steps: Callable[[int], int],
    eval_noise: float | None = None,
    eps_eval: float | None = None,
) -> None:
    # Find the largest grid (number of trials) that keeps sigma within the allowed maximum
    # (with DP evaluation, its trials' evaluations at the same sigma_e).
    k = req.trials
    best = 0
    lo, hi = 1, k
    while lo <= hi:
        mid = (lo + hi) // 2
        s = calibrate(
            req.epsilon_budget,
            req.delta,
            req.sample_rate,
            per_trial_steps(mid),
            req.accountant,
            req.max_noise_multiplier,
            _eval_single(eval_noise, mid * req.eval_releases),
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
        f"charge fewer seeds, raise the budget, or use a larger batch{_eval_hint(req, eps_eval)}"
    )


def _grid_plan(
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


@register_planner("compose")
def _compose(req: GridRequest) -> GridPlan:
    total_steps = req.trials * req.steps_per_trial
    # DP evaluation: all K*E releases are one Gaussian of sigma_e / sqrt(K*E).
    eval_noise = eval_noise_multiplier(req)
    eps_eval = _check_eval_fits(req, eval_noise)
    grid_eval = _eval_single(eval_noise, req.trials * req.eval_releases)
    sigma = calibrate(
        req.epsilon_budget,
        req.delta,
        req.sample_rate,
        total_steps,
        req.accountant,
        req.max_noise_multiplier,
        grid_eval,
    )
    if sigma > req.max_noise_multiplier:
        _infeasible(req, sigma, lambda k: k * req.steps_per_trial, eval_noise, eps_eval)
    total = _epsilon(sigma, req.sample_rate, total_steps, req.delta, req.accountant, grid_eval)
    # plan_grid fills the epsilon_verified fields in with verify_plan's second accountant.
    return _grid_plan(
        req,
        sigma,
        eval_noise,
        eps_eval,
        epsilon_per_trial=_epsilon(
            sigma,
            req.sample_rate,
            req.steps_per_trial,
            req.delta,
            req.accountant,
            _eval_single(eval_noise, req.eval_releases),
        ),
        delta_per_trial=req.delta,
        epsilon_total=total,
        epsilon_verified=math.nan,
        accounting="compose",
        accountant=req.accountant,
        verified_by="unverified",
        release="all",
    )


@register_planner("basic")
def _basic(req: GridRequest) -> GridPlan:
    eps_t, delta_t = req.epsilon_budget / req.trials, req.delta / req.trials
    # DP evaluation: each trial's E releases are one Gaussian of sigma_e / sqrt(E).
    eval_noise = eval_noise_multiplier(req)
    eps_eval = _check_eval_fits(req, eval_noise)
    trial_eval = _eval_single(eval_noise, req.eval_releases)
    sigma = calibrate(
        eps_t,
        delta_t,
        req.sample_rate,
        req.steps_per_trial,
        req.accountant,
        req.max_noise_multiplier,
        trial_eval,
    )
    if sigma > req.max_noise_multiplier:
        raise InfeasiblePlan(
            f"arm {req.arm!r}: basic accounting gives each of {req.trials} trials epsilon "
            f"{eps_t:.3g}, which needs sigma > {req.max_noise_multiplier:g}; use compose "
            f"accounting or a smaller grid{_eval_hint(req, eps_eval)}"
        )
    per = _epsilon(sigma, req.sample_rate, req.steps_per_trial, delta_t, req.accountant, trial_eval)
    # plan_grid fills the epsilon_verified fields in with verify_plan's second accountant.
    return _grid_plan(
        req,
        sigma,
        eval_noise,
        eps_eval,
        epsilon_per_trial=per,
        delta_per_trial=delta_t,
        epsilon_total=req.trials * per,
        epsilon_verified=math.nan,
        accounting="basic",
        accountant=req.accountant,
        verified_by="unverified",
        release="all",
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
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    one: dp_event.DpEvent = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier)),
        steps,
    )
    extra = _eval_single(eval_noise_multiplier, eval_releases)
    if extra is not None:
        one = dp_event.ComposedDpEvent([one, dp_event.GaussianDpEvent(extra)])
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_event.RepeatAndSelectDpEvent(one, mean_trials, shape))
    return float(acc.get_epsilon(target_delta))


@functools.lru_cache(maxsize=1024)
def _ps_epsilon(
    sigma: float,
    q: float,
    steps: int,
    mean: float,
    shape: float,
    delta: float,
    eval_sigma: float | None = None,
) -> float:
    # eval_sigma: one run's evaluations composed to one Gaussian (sigma_e / sqrt(E)), or None.
    return repeat_and_select_epsilon(
        noise_multiplier=sigma,
        sample_rate=q,
        steps=steps,
        mean_trials=mean,
        shape=shape,
        target_delta=delta,
        eval_noise_multiplier=eval_sigma,
        eval_releases=0 if eval_sigma is None else 1,
    )


@register_planner("papernot-steinke")
def _papernot_steinke(req: GridRequest) -> GridPlan:
    if req.distribution_shape is None:
        raise ConfigError("papernot-steinke needs a distribution", field="privacy.distribution")
    shape, mean = req.distribution_shape, float(req.trials)
    # DP evaluation: each run's E releases (one Gaussian of sigma_e / sqrt(E)) are part of
    # the run that RepeatAndSelect repeats.
    eval_noise = eval_noise_multiplier(req)
    eps_eval = _check_eval_fits(req, eval_noise)
    run_eval = _eval_single(eval_noise, req.eval_releases)

    def eps(sigma: float) -> float:
        return _ps_epsilon(
            sigma, req.sample_rate, req.steps_per_trial, mean, shape, req.delta, run_eval
        )

    lo, hi = math.log(0.05), math.log(req.max_noise_multiplier * 8)
    if eps(math.exp(hi)) > req.epsilon_budget:
        raise InfeasiblePlan(
            f"arm {req.arm!r}: random search with mean {req.trials} trials needs sigma > "
            f"{req.max_noise_multiplier * 8:g} for epsilon={req.epsilon_budget:g}; shrink the "
            f"search or raise the budget{_eval_hint(req, eps_eval)}"
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
            f"{_eval_hint(req, eps_eval)}"
        )
    total = eps(sigma)
    # plan_grid fills the epsilon_verified fields in with verify_plan's independent RDP (the
    # old check repeated this very dp_accounting call, which could not catch its bugs).
    return _grid_plan(
        req,
        sigma,
        eval_noise,
        eps_eval,
        epsilon_per_trial=_epsilon(
            sigma, req.sample_rate, req.steps_per_trial, req.delta, req.accountant, run_eval
        ),
        delta_per_trial=req.delta,
        epsilon_total=total,
        epsilon_verified=math.nan,
        accounting="papernot-steinke",
        accountant="rdp (RepeatAndSelect)",
        verified_by="unverified",
        release="selected-only",
        distribution_shape=shape,
    )


@dataclass(frozen=True)
class SweepPlan:
    """Every grid's plan, and the identity of the data they were planned for.

    ``dataset_sha256`` is :attr:`workers.datasets.Dataset.content_sha256` of the loaded data
    (hex): the sweep reserves from the ledger of that content (``sha256:<hex>``), and every
    trial checks that it trains on the same records. ``None`` only for plans made without
    loading the data.
    """

    grids: list[GridPlan]
    dataset_sha256: str | None = None
    # The number of examples N (train + evaluation); public, as the planner treats it.
    n_examples: int | None = None

    @property
    def epsilon_total(self) -> float:
        """The sweep's whole cost: the sum over its grids (what a dataset budget is charged)."""
        return sum(g.epsilon_total for g in self.grids)

    @property
    def delta_total(self) -> float:
        return sum(g.delta for g in self.grids)


# What a new plan stores for each planning accountant: the planner's historical values ("rdp"
# is dp_accounting's RDP in plans; workers.accountants.PLAN_ALIASES reads it back).
_PLAN_STORED_NAME = {"pld": "pld", "dp-rdp": "rdp"}


def _plan_accountant_name(spec_name: str) -> str:
    """The grid plan's accountant for a spec's ``privacy.accountant`` (``prv`` = ``pld``)."""
    desc = spec_accountant(spec_name)
    if desc.name not in _PLAN_STORED_NAME:
        raise ConfigError(
            f"accountant {spec_name!r} ({desc.library}) cannot calibrate a plan; use pld or rdp",
            field="privacy.accountant",
        )
    return _PLAN_STORED_NAME[desc.name]


def grid_requests(spec: Any, *, dataset_size: int, n_train: int) -> list[GridRequest]:
    """One request per arm and epsilon level of a :class:`sweeper.spec.SweepSpec`.

    With ``eval: {mode: dp}`` every trial is charged its E noisy evaluations
    (:func:`workers.schedule.eval_releases`) at the spec's ``eval.noise_multiplier``, or at
    the one its ``eval.epsilon_share`` picks. A spec without ``eval`` evaluates on a carve-out.
    """
    from workers.schedule import eval_releases, plan_steps

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
            accountant=_plan_accountant_name(spec.privacy.accountant),
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


def high_noise_warning(noise_multiplier: float, *, expected_batch_size: float) -> str:
    """The warning (with an expected-utility hint) a plan above HIGH_NOISE_MULTIPLIER gets."""
    return (
        f"sigma = {noise_multiplier:.3g} is high: each step adds noise of std "
        f"{noise_multiplier / expected_batch_size:.3g} x C per coordinate to the averaged "
        f"gradient (b = {expected_batch_size:g}), so many models learn slowly or not at all. "
        "Larger batches, fewer trials or more epsilon lower it; online (adaptive) clipping has "
        "still learnt at such noise. Set privacy.max_noise_multiplier to refuse such plans"
    )


def gradient_noise_multiplier(
    strategy: str, params: dict[str, Any], *, noise_multiplier: float, expected_batch_size: float
) -> float:
    """sigma_g after a strategy's noise split: its descriptor's, which the workers use too.

    Raises:
        ConfigError: unknown strategy, or an invalid hyperparameter (``params.<name>``).
        InfeasiblePlan: quantile's count would need the whole budget (sigma >= 2 sigma_b).
    """
    from workers.strategies import NoiseSplitInfeasible, get_descriptor

    try:
        return get_descriptor(strategy).gradient_multiplier(
            noise_multiplier, params, expected_batch_size=expected_batch_size
        )
    except NoiseSplitInfeasible as exc:
        raise InfeasiblePlan(str(exc)) from None


def _split_points(arm: Any) -> list[dict[str, Any]]:
    """The arm's distinct trial parameters (grid points over its params, ``lr`` left out)."""
    out: dict[str, dict[str, Any]] = {}
    for point in arm.points() or [{}]:
        params = {k: v for k, v in {**arm.params, **point}.items() if k != "lr"}
        out.setdefault(repr(sorted(params.items(), key=lambda kv: kv[0])), params)
    return list(out.values())


def _arm_gradient_noise_multiplier(
    arm: Any, params: dict[str, Any], *, noise_multiplier: float, expected_batch_size: float
) -> float:
    try:
        return gradient_noise_multiplier(
            arm.strategy,
            params,
            noise_multiplier=noise_multiplier,
            expected_batch_size=expected_batch_size,
        )
    except InfeasiblePlan:
        raise
    except ConfigError as exc:  # name the arm's field (sweep submission checks this first)
        where = f"arms.{arm.label}.strategy"
        if (exc.field or "").startswith("params."):
            name = (exc.field or "").removeprefix("params.")
            where = f"arms.{arm.label}.{'grid' if name in arm.grid else 'params'}.{name}"
        raise ConfigError(f"arm {arm.label!r}: {exc}", field=where) from None


def plan_sweep(spec: Any, *, dataset: Any = None) -> SweepPlan:
    """Plan every grid of a spec (loads the dataset to learn N; trains nothing).

    Loading also checks the data (NaN and inf are refused, naming the file and rows) and gives
    each grid the dataset's ``input_scaling``.

    Args:
        spec: The sweep spec.
        dataset: The :class:`workers.datasets.DatasetSpec` to load, when the spec's dataset
            needs resolving (an upload, :func:`sweeper.catalog.resolve`); default: the spec's.
    """
    from sweeper.catalog import resolve
    from workers.datasets import load_dataset

    evaluation = getattr(spec, "eval", None)
    # Without a resolved dataset, a loader's (no catalog): it carries the evaluation mode.
    data = load_dataset(dataset or resolve(None, spec.dataset, evaluation))
    # N: the private records (in mode public the evaluation records are another dataset).
    n = data.n_private
    arms = {a.label: a for a in spec.arms}
    b = spec.training.batch_size
    from sweeper.parallel import pmap

    grids = []
    requests = grid_requests(spec, dataset_size=n, n_train=data.n_train)
    for req, g in zip(requests, pmap(plan_grid, requests), strict=True):
        arm = arms[req.arm]
        # A grid axis may set a split's parameter (count_noise, direction_noise_ratio) per
        # trial: the split must hold for every grid point; the plan shows the smallest sigma_g.
        points = _split_points(arm)
        values = [p.get("count_noise") for p in points]
        sigma_g = min(
            _arm_gradient_noise_multiplier(
                arm, p, noise_multiplier=g.noise_multiplier, expected_batch_size=b
            )
            for p in points
        )
        count_noise = None
        if arm.strategy == "quantile" and any(v is None for v in values):
            count_noise = auto_count_noise(
                noise_multiplier=g.noise_multiplier, expected_batch_size=b
            )
        warnings: list[str] = []
        if spec.privacy.max_noise_multiplier is None and g.noise_multiplier > HIGH_NOISE_MULTIPLIER:
            warnings.append(high_noise_warning(g.noise_multiplier, expected_batch_size=b))
        grids.append(
            replace(
                g,
                gradient_noise_multiplier=sigma_g,
                input_scaling=dict(data.input_scaling),
                count_noise=count_noise,
                warnings=tuple(warnings),
                n_train=data.n_train,
                n_eval=int(data.x_test.shape[0]),
                eval_mode=str(getattr(evaluation, "mode", None) or "carve-out"),
                eval_dataset=getattr(evaluation, "dataset", None),
            )
        )
    return SweepPlan(grids, dataset_sha256=data.content_sha256, n_examples=n)
