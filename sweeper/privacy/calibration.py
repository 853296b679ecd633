"""Calibration for the planner: the smallest noise multiplier whose composed steps fit a budget.

Used by the ``compose`` and ``basic`` methods (:mod:`sweeper.privacy.composition`). The
planner asks with one :class:`~dpsweep.accounting_inputs.AccountingInputs` per question
(:func:`grid_inputs`): its accountant is the plan's (a spec's or stored plan's name read by
:func:`workers.accounting.registry.plan_accountant`: dp_accounting's PLD or RDP, or a
plug-in's), and calibration is its descriptor's ``calibrate_for``: the one shared calibrator
(:mod:`workers.accounting.calibrator`) unless a plug-in brings its own, re-checked with the
accountant's epsilon. Planning never imports torch.
"""

from __future__ import annotations

import functools

from dpsweep.accounting_inputs import AccountingInputs
from sweeper.privacy.grids import GridRequest
from workers.accounting.calibrator import CALIBRATION_SLACK
from workers.accounting.registry import epsilon_of, get_accountant, plan_accountant

__all__ = ["CALIBRATION_SLACK", "calibrate", "grid_inputs", "planned_epsilon"]


def grid_inputs(
    req: GridRequest,
    *,
    steps: int,
    delta: float | None = None,
    eval_noise: float | None = None,
    noise_multiplier: float | None = None,
) -> AccountingInputs:
    """What the planner asks about ``steps`` steps of a grid, by the plan's accountant.

    Args:
        req: the grid (its sample rate, delta and accountant).
        steps: the steps the question covers (a trial's T, or the grid's K*T).
        delta: the delta to state epsilon at (default: the grid's).
        eval_noise: the evaluation releases the steps come with, composed to one Gaussian of
            this multiplier (sigma_e / sqrt(number of releases)); None: none.
        noise_multiplier: the grid's sigma, or None where it is what calibration solves for.
    """
    return AccountingInputs(
        noise_multiplier=noise_multiplier,
        sample_rate=req.sample_rate,
        steps=steps,
        delta=req.delta if delta is None else delta,
        eval_noise_multiplier=eval_noise,
        evaluations=0 if eval_noise is None else 1,
        accountant=plan_accountant(req.accountant).name,  # a legacy name read as a plan's
    )


def planned_epsilon(inputs: AccountingInputs) -> float:
    """Epsilon of ``inputs`` by the planner's accountant (cached with calibration's figures:
    the registry's cache)."""
    return epsilon_of(inputs)


@functools.lru_cache(maxsize=1024)
def calibrate(
    inputs: AccountingInputs, *, target_epsilon: float, max_noise_multiplier: float
) -> float:
    """The plan accountant's noise multiplier with ``eps <= target_epsilon``, landing within
    :data:`CALIBRATION_SLACK` below it; ``inf`` if even ``max_noise_multiplier * 8`` is not
    enough. ``inputs``' noise multiplier is the unknown, not read.
    """
    return get_accountant(inputs.accountant).calibrate_for(
        inputs, target_epsilon=target_epsilon, max_noise_multiplier=max_noise_multiplier
    )
