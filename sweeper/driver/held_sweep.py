"""The sweep a driver holds: its typed spec and plan, and the trials it queues and runs.

Every part of the driver (claims, crash policy, packs, TPE, progress) reads the same
:class:`HeldSweep`: the spec parsed once from the stored JSON (:class:`dpsweep.spec.SweepSpec`),
the stored grid plans (:class:`PlannedGrid`), each grid's charge schedule, which grids are
papernot-steinke (*hidden*: their number of runs is secret), the queue of pending trials, the
packs in flight and the runs charged per grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from dpsweep.errors import SweepNotFound
from dpsweep.plan import GridPlan
from dpsweep.spec import ArmConfig, SweepSpec
from sweeper.privacy.charges import ChargeSchedule
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.settings import SweeperSettings
from sweeper.store import Sweep
from sweeper.sweeps import events
from sweeper.sweeps.stored import grid_key


@dataclass
class PendingTrial:
    """A trial row as the driver queues it (what a worker needs to train it)."""

    id: str
    arm: str
    strategy: str
    epsilon_budget: float
    params: dict[str, Any]
    seed: int
    number: int
    config: int
    noise_multiplier: float | None
    target_delta: float | None

    @property
    def grid(self) -> str:
        return grid_key(self.arm, self.epsilon_budget)

    @classmethod
    def of(cls, trial: Any) -> PendingTrial:
        """The queue's copy of a stored trial row (:class:`sweeper.store.Trial`)."""
        return cls(
            id=trial.id,
            arm=trial.arm,
            strategy=trial.strategy,
            epsilon_budget=trial.epsilon_budget,
            params=dict(trial.params or {}),
            seed=trial.seed,
            number=trial.number,
            config=trial.config,
            noise_multiplier=trial.noise_multiplier,
            target_delta=trial.target_delta,
        )


@dataclass
class InFlight:
    """A pack submitted to Ray: its event generator and its (charged) trials."""

    gen: Any
    pack_id: str
    trials: list[PendingTrial]
    submitted: float


@dataclass(frozen=True)
class PlannedGrid:
    """One grid's stored plan (``Sweep.plan``), typed once when the sweep is taken over."""

    record: GridPlan

    @property
    def key(self) -> str:
        """The grid's key as stored (:class:`dpsweep.plan.GridKey`'s string form)."""
        return str(self.record.key)

    @property
    def accountant(self) -> str:
        """The calibration accountant's stored name (mapped to the worker's at training)."""
        return self.record.accountant

    @property
    def eval_noise_multiplier(self) -> float | None:
        """DP evaluation: each noisy count's multiplier as planned and charged, else None."""
        return self.record.eval_noise_multiplier

    def planned_run(self) -> Any:
        """The :class:`workers.plan_check.PlannedRun` a worker checks its run against."""
        from workers.plan_check import PlannedRun  # torch-free, but keeps workers off start-up

        return PlannedRun.of_grid(self.record)


@dataclass
class HeldSweep:
    """A stored sweep as the driver that took it over holds it (see :mod:`.liveness`)."""

    engine: Engine
    sweep_id: str
    ident: str
    settings: SweeperSettings
    ledger: BudgetLedger
    # The ledger key (the records' identity); the name for sweeps stored before ledgers were
    # keyed by content.
    dataset: str
    spec: SweepSpec
    plan: list[PlannedGrid]
    schedules: dict[str, ChargeSchedule]
    hidden: set[str]
    pending: list[PendingTrial] = field(default_factory=list)
    inflight: list[InFlight] = field(default_factory=list)
    runs_used: dict[str, int] = field(default_factory=dict)
    # Set once Ray is up: packs run at once, and whether the cluster has GPUs.
    workers: int = 1
    gpus: bool = False

    @property
    def metric(self) -> str:
        return self.spec.objective.metric

    @property
    def mode(self) -> str:
        return self.spec.objective.mode

    def shows(self, grid: str) -> bool:
        """Whether ``grid``'s per-run events, counts and errors may be shown: every grid but a
        papernot-steinke one, whose number of runs is secret."""
        return grid not in self.hidden

    def all_hidden(self, trials: Sequence[PendingTrial]) -> bool:
        """Whether every one of ``trials`` belongs to a papernot-steinke grid."""
        return not any(self.shows(t.grid) for t in trials)

    def grid_plan(self, grid: str) -> PlannedGrid:
        """The stored plan of ``grid``."""
        return next(g for g in self.plan if g.key == grid)

    def arm(self, label: str) -> ArmConfig:
        """The spec's arm named ``label``."""
        return arm_named(self.spec, label)

    def sweep_for_update(self, session: Session) -> Sweep:
        """The sweep's row, locked for the rest of the transaction.

        Raises:
            SweepNotFound: no such sweep.
        """
        return sweep_for_update(session, self.sweep_id)

    def trial_data(self, t: PendingTrial, state: str, **extra: Any) -> dict[str, Any]:
        """The data of a trial event for ``t``."""
        return events.trial_event(
            t.id, arm=t.arm, epsilon_budget=t.epsilon_budget, state=state, **extra
        )


def arm_named(spec: SweepSpec, label: str) -> ArmConfig:
    """The arm of ``spec`` whose label (name, else strategy) is ``label``."""
    return next(a for a in spec.arms if a.label == label)


def sweep_for_update(session: Session, sweep_id: str) -> Sweep:
    """The sweep's row, locked for the rest of the transaction.

    Raises:
        SweepNotFound: no such sweep.
    """
    sweep = session.scalars(select(Sweep).where(Sweep.id == sweep_id).with_for_update()).first()
    if sweep is None:
        raise SweepNotFound(f"no sweep {sweep_id!r}; `dpsweep sweeps` lists them")
    return sweep
