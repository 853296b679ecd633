"""Calibration for the planner: the smallest noise multiplier whose composed steps fit a budget.

Used by the ``compose`` and ``basic`` methods (:mod:`sweeper.privacy.composition`). The
accountant is the plan's (:func:`workers.accounting.registry.plan_accountant`: dp_accounting's
PLD or RDP, or a plug-in's), and calibration is its descriptor's ``calibrate``: the one shared
calibrator (:mod:`workers.accounting.calibrator`) unless a plug-in brings its own, re-checked
with the accountant's epsilon. Planning never imports torch.
"""

from __future__ import annotations

import functools

from workers.accounting.calibrator import CALIBRATION_SLACK
from workers.accounting.registry import cached_epsilon, plan_accountant

__all__ = ["CALIBRATION_SLACK", "calibrate", "planned_epsilon"]


def planned_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    target_delta: float,
    accountant: str,
    eval_noise_multiplier: float | None = None,
) -> float:
    """Epsilon of ``steps`` steps at ``noise_multiplier`` and ``sample_rate``, by the planner's
    ``accountant`` (cached with calibration's figures: the registry's cache).

    ``eval_noise_multiplier``: the evaluations composed to one Gaussian (sigma_e / sqrt(number
    of releases)), or None; as for :func:`calibrate`.
    """
    return cached_epsilon(
        plan_accountant(accountant).name,
        noise_multiplier=noise_multiplier,
        sample_rate=sample_rate,
        steps=steps,
        target_delta=target_delta,
        eval_noise_multiplier=eval_noise_multiplier,
        eval_releases=0 if eval_noise_multiplier is None else 1,
    )


@functools.lru_cache(maxsize=1024)
def calibrate(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    accountant: str,
    max_noise_multiplier: float,
    eval_noise_multiplier: float | None = None,
) -> float:
    """The plan accountant's noise multiplier with ``eps <= target_epsilon``, landing within
    :data:`CALIBRATION_SLACK` below it; ``inf`` if even ``max_noise_multiplier * 8`` is not
    enough.

    ``eval_noise_multiplier``: DP evaluation's releases composed to one Gaussian of this
    multiplier, charged with the steps (None: none).
    """
    return plan_accountant(accountant).calibrate(
        target_epsilon=target_epsilon,
        target_delta=target_delta,
        sample_rate=sample_rate,
        steps=steps,
        max_noise_multiplier=max_noise_multiplier,
        eval_noise_multiplier=eval_noise_multiplier,
        eval_releases=0 if eval_noise_multiplier is None else 1,
    )
