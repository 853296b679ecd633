"""A grid's charge-schedule figures at chosen run counts: the composed epsilon of j runs.

:func:`sweeper.privacy.charges.charge_schedule` charges a compose grid's runs in buckets: it
asks for the epsilon of the first j runs only at a few run counts j (geometrically spaced up
to the grid's K, :func:`sweeper.privacy.charges.charge_points`), not at every j = 1..K. This
module answers those questions with the accountant the plan was calibrated with, in as many
accountant evaluations as there are points (issue 41: a 10,000-trial grid evaluated 10,000).

* The built-in PLD accountant: one run's PLD (its steps and its evaluation releases) is built
  once and self-composed j times for each point j (an FFT power, pessimistic like the plan's).
* An accountant without its own schedule: its ``epsilon`` of ``j * steps`` steps and ``j *
  eval_releases`` releases, prefix by prefix, at the points only.
* A plug-in with its own (dense) ``schedule``: that schedule up to the last point, read at
  the points (linear in K, as the plug-in computes it; its figures are its own).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.errors import PrivacyError
from workers.accounting.epsilon import PLD_DISCRETIZATION, pld_run_epsilons
from workers.accounting.gaussian_pld import SelfPowers, composed_pld
from workers.accounting.registry import AccountantDescriptor


def _checked_points(points: Sequence[int]) -> list[int]:
    out = [int(p) for p in points]
    # Strictly increasing positive run counts: anything else is a caller's bug that would
    # misalign charges and runs (fail closed rather than guess).
    if not out or out[0] < 1 or any(b <= a for a, b in itertools.pairwise(out)):
        raise PrivacyError(f"charge points must be increasing run counts >= 1; got {out[:8]}")
    return out


def _pld_epsilons_at(inputs: AccountingInputs, points: Sequence[int]) -> list[float]:
    # One run: T subsampled Gaussian steps, then its E evaluation releases, which compose
    # exactly as one Gaussian of multiplier sigma_e / sqrt(E) (composed_pld's q=None entry).
    mechanisms: list[tuple[float, float | None, int]] = [
        (inputs.sigma, inputs.sample_rate, inputs.steps)
    ]
    if inputs.evaluations and inputs.eval_noise_multiplier is not None:
        mechanisms.append((inputs.eval_noise_multiplier, None, inputs.evaluations))
    one = composed_pld(mechanisms, value_discretization_interval=PLD_DISCRETIZATION)
    if one is None:  # a multiplier of 0: no privacy at all
        return [float("inf")] * len(points)
    # j runs = the one-run PLD composed with itself j times; the pessimistic discretisation
    # of the one-run PLD makes every self-composition an upper bound on j runs' epsilon.
    # SelfPowers: the library's self_compose, its tail bounds' moments computed once.
    power = SelfPowers(one)
    return [float(power(p).get_epsilon_for_delta(inputs.delta)) for p in points]


def epsilons_at(
    accountant: AccountantDescriptor, inputs: AccountingInputs, points: Sequence[int]
) -> list[float]:
    """The epsilon of the first j runs of a grid, for each run count j in ``points``.

    Args:
        accountant: The plan's accountant (``inputs.accountant`` names it).
        inputs: One run of the grid: its sigma, q, steps T, delta, and DP evaluation's
            multiplier (per release) and releases E.
        points: Increasing run counts >= 1.

    Returns:
        One epsilon per point, as many accountant evaluations as points (see the module).

    Raises:
        PrivacyError: ``points`` is not increasing run counts, or a dense plug-in schedule
            answered a different number of runs.
    """
    pts = _checked_points(points)
    if accountant.schedule is pld_run_epsilons:
        # The built-in PLD (its dense schedule composes run by run: K evaluations).
        return _pld_epsilons_at(inputs, pts)
    if accountant.schedule is not None:
        dense = accountant.run_epsilons_for(inputs, pts[-1])
        if len(dense) != pts[-1]:
            raise PrivacyError(
                f"the {accountant.name} accountant's schedule gave {len(dense)} figures for "
                f"{pts[-1]} runs; no charges can be computed from it"
            )
        return [dense[p - 1] for p in pts]
    return [float(accountant.epsilon(**inputs.repeated(p).library_keywords())) for p in pts]
