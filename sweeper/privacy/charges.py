"""What each run of a grid is charged: the ledger rules of the planner's accounting methods.

A grid of K trials (plus R reserved re-runs, ``privacy.retries``) is reserved as a whole when
the sweep is accepted. Each *run* (a trial starting to touch data; a re-run is a new run) is
then charged before it starts, by the method's rule. The schedule is cumulative: after the
j-th run of a grid has been charged, the grid has spent ``ChargeSchedule.cumulative(j)`` in
total, and the j-th run is charged the difference from ``cumulative(j - 1)``.

* ``compose``: the cumulative charge after j runs is the composed epsilon eps(p) of p runs of T
  steps at the planned sigma (the plan's accountant: dp_accounting PLD, pessimistic; or RDP),
  where p is the first *charge point* at or after j (:func:`charge_points`: every run up to
  :data:`EXACT_RUNS`, then geometrically spaced by :data:`POINT_GROWTH`, always ending at K).
  The runs between two points form a bucket: its first run is charged up to eps(p) at the
  bucket's end, the rest of the bucket nothing. The spend is thus never below what the runs so
  far cost (eps is non-decreasing in the runs), while the accountant is evaluated O(log K)
  times, not K times (issue 41); a cancelled sweep may be over-charged by at most the growth
  of eps over one bucket (about sqrt(1.5) for large j). A linear split (total/K per run)
  would under-charge a cancelled sweep, because composed epsilon grows sub-linearly. delta is
  the grid's delta from the first run on (the composed guarantee of any prefix holds at it).
* ``basic``: each run costs epsilon/K' and delta/K' exactly (K' = runs planned).
* ``papernot-steinke``: the guarantee covers the whole random search, whatever the number of
  runs, so the first run is charged the grid's whole total and later runs nothing. The driver
  writes one ledger entry for such a grid (its first run, :func:`ps_charge_note`) and none
  for later runs: the number of entries would otherwise be the secret number of runs.

A schedule stores cumulative values at its points (``points``; absent when the points are
every run 1..K, the form every schedule stored before buckets has): an old stored schedule is
read as before. A reader that predates ``points`` would take a bucketed schedule's values as
runs 1..len(points): each prefix charged no less than now (eps(p_j) with p_j >= j), and the
runs past len(points) refused: it fails closed.

The last cumulative value is what the grid reserves; it is checked against the grid's budget
(fail closed). Amounts are exact decimals of the floats computed, kept as strings in the plan so
that a resumed sweep charges exactly what was reserved.
"""

from __future__ import annotations

import bisect
import itertools
import math
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

#: Compose grids: runs up to this many are each a charge point (small grids charged exactly).
EXACT_RUNS = 8
#: Compose grids: beyond EXACT_RUNS, each charge point is about this factor past the last.
POINT_GROWTH = 1.5


def charge_points(
    runs: int, *, exact_runs: int = EXACT_RUNS, growth: float = POINT_GROWTH
) -> list[int]:
    """The run counts at which a compose grid's cumulative charge is evaluated.

    Every run up to ``exact_runs``, then ``ceil(previous * growth)``, and always ``runs``
    itself last (the reservation is eps(K)). At most ``exact_runs + log(runs) / log(growth) +
    1`` points.

    Raises:
        PrivacyError: ``runs`` < 1, ``exact_runs`` < 1 or ``growth`` <= 1.
    """
    if runs < 1 or exact_runs < 1 or not growth > 1:
        raise PrivacyError(
            f"no charge points for {runs} run(s) (exact_runs={exact_runs}, growth={growth})"
        )
    points = list(range(1, min(runs, exact_runs) + 1))
    while points[-1] < runs:
        points.append(min(runs, max(points[-1] + 1, math.ceil(points[-1] * growth))))
    return points


def exact_sum(values: list[Decimal] | tuple[Decimal, ...]) -> Decimal:
    """The exact sum of ``values`` (raises rather than rounds)."""
    total = Decimal(0)
    for v in values:
        total = EXACT.add(total, v)
    return total


@dataclass(frozen=True)
class ChargeSchedule:
    """Cumulative epsilon and delta of one grid after the runs its charge points count.

    ``epsilon[i]`` and ``delta[i]`` are the cumulative charges once run ``points[i]`` has been
    charged, and after every run of the bucket ``points[i-1] + 1 .. points[i]``; ``points``
    ``None`` means every run (1, 2, ..., len(epsilon)), the form of schedules stored before
    buckets.
    """

    epsilon: tuple[Decimal, ...]
    delta: tuple[Decimal, ...]
    # papernot-steinke: the first run pays for the whole search, any number of runs follows.
    whole_grid: bool = False
    points: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        # A malformed schedule (stored, or a bug) would misalign charges and runs: refuse it
        # (fail closed) rather than charge from it.
        n = len(self.epsilon)
        if self.points is not None and tuple(self.points) == tuple(range(1, n + 1)):
            object.__setattr__(self, "points", None)  # every run a point: the dense form
        if len(self.delta) != n or (self.points is not None and len(self.points) != n):
            raise PrivacyError("a charge schedule's epsilon, delta and points differ in length")
        if self.points is not None and (
            (n and self.points[0] < 1) or any(b <= a for a, b in itertools.pairwise(self.points))
        ):
            raise PrivacyError("a charge schedule's points must be increasing run counts >= 1")
        for values in (self.epsilon, self.delta):
            if any(not v.is_finite() or v < 0 for v in values) or any(
                b < a for a, b in itertools.pairwise(values)
            ):
                raise PrivacyError(
                    "a charge schedule must be cumulative: finite, >= 0 and non-decreasing"
                )

    @property
    def runs(self) -> int:
        """How many runs the reservation covers."""
        if self.points is not None:
            return self.points[-1] if self.points else 0
        return len(self.epsilon)

    def cumulative(self, run: int) -> tuple[Decimal, Decimal]:
        """The (epsilon, delta) charged in all once ``run`` runs (0..:attr:`runs`) are charged.

        Raises:
            PrivacyError: ``run`` is outside 0..:attr:`runs`.
        """
        if run == 0:
            return Decimal(0), Decimal(0)
        if not 1 <= run <= self.runs:
            raise PrivacyError(f"run {run} of a grid that reserved {self.runs} run(s)")
        i = run - 1 if self.points is None else bisect.bisect_left(self.points, run)
        return self.epsilon[i], self.delta[i]

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
        # The run's charge tops the grid up from what the runs before it were charged (zero
        # inside a bucket): the cumulative charges telescope exactly to the reservation.
        now_e, now_d = self.cumulative(run)
        prev_e, prev_d = self.cumulative(run - 1)
        return EXACT.subtract(now_e, prev_e), EXACT.subtract(now_d, prev_d)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "epsilon": [str(v) for v in self.epsilon],
            "delta": [str(v) for v in self.delta],
            "whole_grid": self.whole_grid,
        }
        if self.points is not None:  # None: every run a point, the form stored before buckets
            out["points"] = list(self.points)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChargeSchedule:
        points = data.get("points")
        return cls(
            epsilon=tuple(Decimal(v) for v in data["epsilon"]),
            delta=tuple(Decimal(v) for v in data["delta"]),
            whole_grid=bool(data.get("whole_grid", False)),
            points=None if points is None else tuple(int(p) for p in points),
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


def _compose_epsilons(plan: Any, points: list[int]) -> list[float]:
    # DP evaluation: each run also releases E noisy counts (Gaussian, sensitivity 1), which
    # compose exactly as one Gaussian of multiplier sigma_e / sqrt(E) per run.
    releases = int(getattr(plan, "eval_releases", 0) or 0)
    if releases and getattr(plan, "eval_noise_multiplier", None) is None:
        raise PrivacyError(
            f"arm {plan.arm!r}: the plan releases noisy evaluations without a noise multiplier"
        )
    # deferred: the accountants pull numpy and scipy; a stored schedule is read without them
    from workers.accounting.registry import plan_accountant
    from workers.accounting.schedule import epsilons_at  # deferred: as above (scipy)

    # The accountant the plan was calibrated with gives each charge point's prefix of j runs
    # its epsilon (PLD by self-composition, others prefix by prefix): one evaluation a point.
    accountant = plan_accountant(plan.accountant)
    if not accountant.plannable:
        raise PrivacyError(
            f"arm {plan.arm!r}: no per-run charges for the plan's accountant {accountant.name!r}"
        )
    return epsilons_at(accountant, plan.run_inputs(), points)


def charge_schedule(
    plan: Any, *, exact_runs: int = EXACT_RUNS, growth: float = POINT_GROWTH
) -> ChargeSchedule:
    """The cumulative charges of a :class:`sweeper.privacy.grids.GridPlan`'s runs.

    Args:
        plan: The grid's plan.
        exact_runs: Compose grids: runs up to this many are each a charge point.
        growth: Compose grids: the spacing of later charge points (:func:`charge_points`).

    Raises:
        PrivacyError: the schedule's total exceeds the grid's budget (the plan is refused).
    """
    runs = int(plan.trials)
    points: list[int] | None = None
    if plan.accounting == "compose":
        points = charge_points(runs, exact_runs=exact_runs, growth=growth)
        # Cumulative at each point; the run count K itself is the last point, so the last
        # value is eps(K), what the grid reserves.
        eps = _cumulative_max(_compose_epsilons(plan, points))
        delta = [Decimal(plan.delta)] * len(points)
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
        tuple(eps),
        tuple(delta),
        whole_grid=plan.accounting == "papernot-steinke",
        points=None if points is None else tuple(points),
    )


def ps_charge_note(grid: str) -> str:
    """The note of a papernot-steinke grid's one ledger charge.

    It names the grid and no run: the grid is charged once, at its first run, for the whole
    random search, and its later runs write nothing (an entry per run, or a run index in a
    note, would reveal the secret number of runs).
    """
    return f"papernot-steinke grid {grid}: whole search charged at its first run"
