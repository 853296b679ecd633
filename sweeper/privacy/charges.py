"""What each run of a grid is charged: the ledger rules of the planner's accounting methods.

A grid of K trials (plus R reserved re-runs, ``privacy.retries``) is reserved as a whole when
the sweep is accepted. Each *run* (a trial starting to touch data; a re-run is a new run) is
then charged before it starts, by the method's rule. The schedule is cumulative: after the
j-th run of a grid has been charged, the grid has spent ``epsilon[j-1]`` in total.

* ``compose``: ``epsilon[j-1]`` is the composed epsilon of j runs of T steps at the planned
  sigma (dp_accounting PLD, pessimistic; or RDP when the plan used RDP), so the j-th run is
  charged its *marginal* cost ``eps(j) - eps(j-1)``. At every moment the spend equals what the
  runs so far actually cost: a linear split (total/K per run) would under-charge a cancelled
  sweep, because composed epsilon grows sub-linearly. delta is the grid's delta from the first
  run on (the composed guarantee of any prefix holds at that delta).
* ``basic``: each run costs epsilon/K' and delta/K' exactly (K' = runs planned).
* ``papernot-steinke``: the guarantee covers the whole random search, whatever the number of
  runs, so the first run is charged the grid's whole total and later runs nothing. The driver
  writes one ledger entry for such a grid (its first run, :func:`ps_charge_note`) and none
  for later runs: the number of entries would otherwise be the secret number of runs.

The last cumulative value is what the grid reserves; it is checked against the grid's budget
(fail closed). Amounts are exact decimals of the floats computed, kept as strings in the plan so
that a resumed sweep charges exactly what was reserved.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Context, Decimal, Inexact
from typing import Any

from dpsweep.errors import PrivacyError

# Exact arithmetic, like the ledger's: a float's exact binary value has up to ~770 digits, and
# any rounding would let increments and totals disagree with what was reserved.
EXACT = Context(prec=2000, traps=[Inexact])


# How far below the plan's epsilon_total a compose schedule's total may land: the same PLD
# computed in a different order of composition agrees to well within this.
SCHEDULE_AGREEMENT = 0.02


def exact_sum(values: list[Decimal] | tuple[Decimal, ...]) -> Decimal:
    """The exact sum of ``values`` (raises rather than rounds)."""
    total = Decimal(0)
    for v in values:
        total = EXACT.add(total, v)
    return total


@dataclass(frozen=True)
class ChargeSchedule:
    """Cumulative epsilon and delta after 1, 2, ... runs of one grid."""

    epsilon: tuple[Decimal, ...]
    delta: tuple[Decimal, ...]
    # papernot-steinke: the first run pays for the whole search, any number of runs follows.
    whole_grid: bool = False

    @property
    def runs(self) -> int:
        """How many runs the reservation covers."""
        return len(self.epsilon)

    @property
    def reserved_epsilon(self) -> Decimal:
        return self.epsilon[-1] if self.epsilon else Decimal(0)

    @property
    def reserved_delta(self) -> Decimal:
        return self.delta[-1] if self.delta else Decimal(0)

    def charge_for_run(self, run: int) -> tuple[Decimal, Decimal]:
        """The (epsilon, delta) charged for the ``run``-th run (1-based) of the grid.

        Raises:
            PrivacyError: ``run`` is beyond what the grid reserved: it must not start.
        """
        if self.whole_grid and run >= 1:
            return (self.epsilon[0], self.delta[0]) if run == 1 else (Decimal(0), Decimal(0))
        if not 1 <= run <= self.runs:
            raise PrivacyError(
                f"run {run} of a grid that reserved {self.runs} run(s): no budget is reserved "
                "for it, so it must not start"
            )
        prev_e = self.epsilon[run - 2] if run > 1 else Decimal(0)
        prev_d = self.delta[run - 2] if run > 1 else Decimal(0)
        return EXACT.subtract(self.epsilon[run - 1], prev_e), EXACT.subtract(
            self.delta[run - 1], prev_d
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "epsilon": [str(v) for v in self.epsilon],
            "delta": [str(v) for v in self.delta],
            "whole_grid": self.whole_grid,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChargeSchedule:
        return cls(
            epsilon=tuple(Decimal(v) for v in data["epsilon"]),
            delta=tuple(Decimal(v) for v in data["delta"]),
            whole_grid=bool(data.get("whole_grid", False)),
        )


def _cumulative_max(values: list[float]) -> list[Decimal]:
    # Composed epsilon is non-decreasing in the number of runs; numerical noise could make a
    # later value dip, which would make a marginal charge negative. The running maximum is
    # still an upper bound at every prefix.
    out: list[Decimal] = []
    for v in values:
        d = Decimal(v)
        out.append(d if not out or d > out[-1] else out[-1])
    return out


def _compose_epsilons(plan: Any) -> list[float]:
    runs, steps = int(plan.trials), int(plan.steps_per_trial)
    # DP evaluation: each run also releases E noisy counts (Gaussian, sensitivity 1), which
    # compose exactly as one Gaussian of multiplier sigma_e / sqrt(E) per run.
    releases = int(getattr(plan, "eval_releases", 0) or 0)
    sigma_e = getattr(plan, "eval_noise_multiplier", None)
    if releases and sigma_e is None:
        raise PrivacyError(
            f"arm {plan.arm!r}: the plan releases noisy evaluations without a noise multiplier"
        )
    from workers.accounting.registry import plan_accountant

    # The accountant the plan was calibrated with gives each prefix of j runs its epsilon
    # (its descriptor's run_epsilons: PLD by self-composition, others prefix by prefix).
    accountant = plan_accountant(plan.accountant)
    if not accountant.plannable:
        raise PrivacyError(
            f"arm {plan.arm!r}: no per-run charges for the plan's accountant {accountant.name!r}"
        )
    return accountant.run_epsilons(
        noise_multiplier=plan.noise_multiplier,
        sample_rate=plan.sample_rate,
        steps=steps,
        runs=runs,
        target_delta=plan.delta,
        eval_noise_multiplier=sigma_e,
        eval_releases=releases,
    )


def charge_schedule(plan: Any) -> ChargeSchedule:
    """The cumulative charges of a :class:`sweeper.privacy.grids.GridPlan`'s runs.

    Raises:
        PrivacyError: the schedule's total exceeds the grid's budget (the plan is refused).
    """
    runs = int(plan.trials)
    if plan.accounting == "compose":
        eps = _cumulative_max(_compose_epsilons(plan))
        delta = [Decimal(plan.delta)] * runs
        # The schedule and the plan are two computations of one composition; a schedule well
        # below the plan's figure leaves out part of what the runs release (fail closed).
        if eps and float(eps[-1]) < float(plan.epsilon_total) * (1 - SCHEDULE_AGREEMENT):
            raise PrivacyError(
                f"arm {plan.arm!r} at epsilon {plan.epsilon_budget}: the runs' charges add up "
                f"to {float(eps[-1]):.6f}, below the plan's {float(plan.epsilon_total):.6f}; "
                "plan refused"
            )
        if eps and eps[-1] < Decimal(plan.epsilon_total):
            # Within the accountants' agreement: the last run tops the grid up to its figure.
            eps[-1] = Decimal(plan.epsilon_total)
    elif plan.accounting == "basic":
        per_e, per_d = Decimal(plan.epsilon_per_trial), Decimal(plan.delta_per_trial)
        eps = [EXACT.multiply(per_e, j) for j in range(1, runs + 1)]
        delta = [EXACT.multiply(per_d, j) for j in range(1, runs + 1)]
    elif plan.accounting == "papernot-steinke":
        eps = [Decimal(plan.epsilon_total)]
        delta = [Decimal(plan.delta)]
    else:
        raise PrivacyError(f"no charging rule for accounting {plan.accounting!r}")
    budget = EXACT.multiply(Decimal(plan.epsilon_budget), EXACT.add(1, Decimal("1e-9")))
    if eps and eps[-1] > budget:
        raise PrivacyError(
            f"arm {plan.arm!r} at epsilon {plan.epsilon_budget}: the runs would be charged "
            f"{float(eps[-1]):.6f} in total, above the grid's budget; plan refused"
        )
    return ChargeSchedule(
        tuple(eps), tuple(delta), whole_grid=plan.accounting == "papernot-steinke"
    )


def ps_charge_note(grid: str) -> str:
    """The note of a papernot-steinke grid's one ledger charge.

    It names the grid and no run: the grid is charged once, at its first run, for the whole
    random search, and its later runs write nothing (an entry per run, or a run index in a
    note, would reveal the secret number of runs).
    """
    return f"papernot-steinke grid {grid}: whole search charged at its first run"
