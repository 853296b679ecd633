"""Verification: every plan's epsilon recomputed by a second accountant that shares no code.

:func:`verify_plan` uses :mod:`workers.accounting.audit`: Gopi et al. (2021)'s PRV accountant
for compose and basic, an independent Rényi-DP implementation of Papernot & Steinke's theorems
for papernot-steinke. A plan is refused when the two disagree beyond their stated errors (the
planner under-states, or a PLD figure lies far above the PRV's upper bound) or when either
exceeds the budget.
"""

from __future__ import annotations

from dataclasses import replace

from dpsweep.errors import PrivacyError
from dpsweep.plan import GridPlan
from sweeper.privacy.evaluation_releases import plan_eval_releases
from workers.accounting import audit
from workers.accounting.audit.bounds import EpsilonBounds
from workers.accounting.audit.prv import PLD_STATED_ERROR, pld_overstatement
from workers.accounting.registry import plan_accountant

# The verifying PLD uses dp_accounting's default grid, finer than the calibrating one.
VERIFY_DISCRETIZATION = 1e-4


def verify_plan(plan: GridPlan) -> GridPlan:
    """Recompute a plan's epsilon with a second, independent accountant; refuse disagreement.

    Only the plan's own fields are used (sigma, q, T, K, delta, accounting, accountant and the
    papernot-steinke shape; the mean number of trials is ``trials``), so a stored or hand-made
    plan is checked for what it says, not for how it was made:

    * compose: Gopi et al.'s PRV accountant on K*T steps at delta;
    * basic: the PRV accountant on one trial's T steps at delta/K, times K;
    * papernot-steinke: :func:`workers.accounting.audit.papernot_steinke_bounds`.

    With DP evaluation (``eval_releases`` E and ``eval_noise_multiplier`` sigma_e) the second
    accountant charges them too: K*E plain Gaussians (q = 1) in the PRV composition (E per
    trial for basic), and ``E * alpha / (2 sigma_e^2)`` added to one run's independent RDP
    curve for papernot-steinke.

    Tolerance rules (the figures are upper bounds with different error models):

    * Every plan: its epsilon_total (and for basic K * epsilon_per_trial, what the ledger
      charges) must not lie below the verifier's lower bound. PRV's bounds are rigorous
      (once its mean is computed right, see workers.accounting.audit.prv._prv_bounds), so a
      figure below them under-states the cost. The independent RDP bound optimises over a
      superset of dp_accounting's orders with exact Rényi moments, so dp_accounting's figure
      can only be higher; its lower bar is the order-grid tolerance RDP_AGREEMENT (2 %).
    * PLD-calibrated compose and basic plans must also not lie above the PRV's upper bound
      by more than the PLD's own stated over-statement
      (:func:`workers.accounting.audit.pld_overstatement`): such a figure does not describe
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
    bounds, verified_by = _verify_grid(plan)
    where = f"arm {plan.arm!r} at epsilon {plan.epsilon_budget:g} ({plan.accounting})"
    claimed = [plan.epsilon_total]
    if plan.accounting == "basic":
        claimed.append(plan.trials * plan.epsilon_per_trial)
    sigma_e, releases = plan_eval_releases(plan)
    figures = _both_figures(plan, bounds, sigma_e, releases)
    if not min(claimed) >= bounds.lower:
        raise PrivacyError(
            f"{where}: {figures}: the plan under-states its privacy cost (below the verifier's "
            "lower bound); plan refused"
        )
    if plan_accountant(plan.accountant).tight and plan.accounting in ("compose", "basic"):
        _refuse_pld_above_upper(plan, bounds, max(claimed), sigma_e, f"{where}: {figures}")
    _refuse_over_budget(plan, bounds, max(claimed), where)
    return replace(
        plan,
        epsilon_verified=bounds.estimate,
        epsilon_verified_lower=bounds.lower,
        epsilon_verified_upper=bounds.upper,
        verifier=bounds.accountant,
        verified_by=verified_by,
    )


def _second_accountant(plan: GridPlan, bounds: EpsilonBounds) -> str:
    """The verifier's name as its figure was computed (per trial times K for basic)."""
    return bounds.accountant + (", per trial times K" if plan.accounting == "basic" else "")


def _both_figures(
    plan: GridPlan, bounds: EpsilonBounds, sigma_e: float | None, releases: int
) -> str:
    """Both accountants' figures, with the verifier's error bars and the plan's run, for a
    refusal's message."""
    evaluation = (
        f", {releases} noisy evaluation(s) per trial at sigma_e {sigma_e:.6g}"
        if sigma_e is not None
        else ""
    )
    return (
        f"the plan states epsilon {plan.epsilon_total:.4f} ({_calibrator_name(plan)}) but "
        f"{_second_accountant(plan, bounds)} gives "
        f"{bounds.estimate:.4f}, bounds {bounds.lower:.4f} to {bounds.upper:.4f}, at sigma "
        f"{plan.noise_multiplier:.6g}, q {plan.sample_rate:.6g}, {plan.trials} trial(s) of "
        f"{plan.steps_per_trial} steps{evaluation}, delta {plan.delta:.3g}"
    )


def _refuse_pld_above_upper(
    plan: GridPlan, bounds: EpsilonBounds, highest: float, sigma_e: float | None, context: str
) -> None:
    """A PLD-calibrated compose or basic plan's highest figure (``highest``) must not lie above
    the verifier's upper bound by more than the PLD's own stated over-statement.

    Raises:
        PrivacyError: it does (``context``: where, and both figures).
    """
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
    if not highest <= bounds.upper + slack:
        raise PrivacyError(
            f"{context}: the plan's PLD figure exceeds the verifier's upper bound "
            f"by more than the PLD's stated over-statement ({slack:.3g}: "
            f"{PLD_STATED_ERROR:.0%} plus the grid's share), so it does not describe this "
            "noise multiplier; plan refused"
        )


def _refuse_over_budget(plan: GridPlan, bounds: EpsilonBounds, highest: float, where: str) -> None:
    """The plan's highest figure (``highest``), and the verifier's lower bound, must both fit
    the budget.

    Raises:
        PrivacyError: either exceeds it.
    """
    budget = plan.epsilon_budget * (1 + 1e-9)
    if not highest <= budget:
        raise PrivacyError(
            f"{where}: the plan's epsilon {highest:.4f} ({_calibrator_name(plan)}) exceeds the "
            "budget; plan refused"
        )
    if not bounds.lower <= budget:
        raise PrivacyError(
            f"{where}: independently verified epsilon {bounds.lower:.4f} (the lower bound of "
            f"{_second_accountant(plan, bounds)}) exceeds the budget; plan rejected"
        )


def _verify_grid(plan: GridPlan) -> tuple[EpsilonBounds, str]:
    """The second accountant's epsilon bounds for a plan, and a readable name for it."""
    sigma_e, releases = plan_eval_releases(plan)  # refuses releases without a multiplier
    run = plan.run_inputs()  # one trial: sigma, q, T, delta and its E evaluations
    k = plan.trials

    def prv(n_trials: int, delta: float, eps_error: float) -> EpsilonBounds:
        # n_trials' steps and, with DP evaluation, their n_trials*E evaluations: plain
        # Gaussians (q = 1, which the PRV accountant takes as a Gaussian PRV).
        if sigma_e is None:
            return audit.prv_epsilon(
                noise_multiplier=run.sigma,
                sample_rate=run.sample_rate,
                steps=n_trials * run.steps,
                target_delta=delta,
                eps_error=eps_error,
            )
        return audit.prv_compose_epsilon(
            [
                (run.sigma, run.sample_rate, n_trials * run.steps),
                (sigma_e, 1.0, n_trials * releases),
            ],
            target_delta=delta,
            eps_error=eps_error,
        )

    if plan.accounting == "compose":
        bounds = prv(k, run.delta, audit.prv_error(plan.epsilon_total))
        return bounds, "PRV accountant, Gopi et al. 2021"
    if plan.accounting == "basic":
        # K times each trial's bars: the total gets compose's bars (2 %, at least 0.01).
        each = prv(1, run.delta / k, audit.prv_error(plan.epsilon_total) / k)
        return each.scaled(k), "PRV accountant, Gopi et al. 2021; per trial, times K"
    if plan.accounting == "papernot-steinke":
        if plan.distribution_shape is None:
            raise PrivacyError(
                f"arm {plan.arm!r}: the papernot-steinke plan does not record its distribution's "
                "shape, so its epsilon cannot be verified; plan refused"
            )
        bounds = audit.papernot_steinke_bounds(
            run, mean_trials=float(k), shape=float(plan.distribution_shape)
        )
        return bounds, "independent RDP, Papernot & Steinke 2022"
    raise PrivacyError(f"arm {plan.arm!r}: no verifier for accounting {plan.accounting!r}")


def _calibrator_name(plan: GridPlan) -> str:
    if plan.accounting == "papernot-steinke":
        return "dp_accounting RDP, RepeatAndSelect"
    return plan_accountant(plan.accountant).library
