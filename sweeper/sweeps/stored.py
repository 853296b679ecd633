"""A stored sweep: its typed spec, its grids, its terminal states, and loading it.

The database is the single source of truth for a sweep's state. A sweep row keeps the spec as
submitted (JSON) and the plan as a list of grid dicts (one per arm and epsilon level, keyed by
:func:`grid_key`); the helpers here read both for the rest of :mod:`sweeper.sweeps`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, defer, selectinload

from dpsweep.errors import PlanCorrupt, SweepNotFound
from dpsweep.plan import GridKey, SweepPlan
from dpsweep.spec import SweepSpec, randomness_label
from sweeper.privacy.charges import ChargeSchedule
from sweeper.store import Sweep, SweepState, Trial, TrialResultRow, TrialState
from workers.randomness import REPRODUCIBLE_WARNING

TERMINAL_TRIALS = (
    TrialState.done,
    TrialState.failed,
    TrialState.cancelled,
)
TERMINAL_SWEEPS = (SweepState.done, SweepState.failed, SweepState.cancelled)


def grid_key(arm: str, epsilon_budget: float) -> str:
    """The key of one grid (an arm at one epsilon level), as stored in the plan.

    :class:`dpsweep.plan.GridKey` owns the format (and parses it back).
    """
    return str(GridKey(arm, epsilon_budget))


@lru_cache(maxsize=512)
def _parse_spec(text: str) -> SweepSpec:
    return SweepSpec.model_validate(json.loads(text))


def typed_spec(stored: Sweep | dict[str, Any]) -> SweepSpec:
    """A sweep's stored spec (or the stored JSON itself) as the typed :class:`SweepSpec`.

    Parsed once per distinct spec and cached (reads of the same sweep parse it again
    otherwise, and a page of sweeps reads many), so the model returned is shared: read it,
    never change it.

    Raises:
        pydantic.ValidationError: the stored JSON is not a spec of this version (a row written
            by hand); reads fail closed rather than guess, e.g., whether its grids are hidden.
    """
    spec = stored.spec if isinstance(stored, Sweep) else stored
    # Keys keep their stored order (no sort_keys): a grid's axes are ordered, and its points
    # and the summary's grids follow that order.
    return _parse_spec(json.dumps(spec))


def randomness_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """How a sweep's batches and noise were drawn, and the warning a reproducible one carries
    wherever its results are shown.

    Reads the stored JSON, not the typed spec: a spec stored before secret randomness existed
    has no ``privacy.reproducible`` key and is labelled reproducible (fail closed), while the
    typed model would fill in the default, ``False``.
    """
    label = randomness_label(spec)
    return {
        "randomness": label,
        "warning": REPRODUCIBLE_WARNING if label == "reproducible" else None,
    }


def get_sweep(session: Session, sweep_id: str) -> Sweep:
    """The sweep row, in ``session``.

    Raises:
        SweepNotFound: no such sweep.
    """
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise SweepNotFound(f"no sweep {sweep_id!r}; `dpsweep sweeps` lists them")
    return sweep


def load_sweep(engine: Engine, sweep_id: str) -> Sweep:
    """A sweep with its trials and results loaded (detached).

    Raises:
        SweepNotFound: no such sweep.
    """
    with Session(engine, expire_on_commit=False) as session:
        sweep = session.scalars(
            select(Sweep)
            .where(Sweep.id == sweep_id)
            .options(
                selectinload(Sweep.trials)
                .selectinload(Trial.result)
                # Summaries and fronts never read these, and they are most of a result's bytes.
                .options(
                    defer(TrialResultRow.trajectories, raiseload=True),
                    defer(TrialResultRow.reliability, raiseload=True),
                    defer(TrialResultRow.final_metrics, raiseload=True),
                )
            )
        ).first()
        if sweep is None:
            raise SweepNotFound(f"no sweep {sweep_id!r}; `dpsweep sweeps` lists them")
        session.expunge_all()
        return sweep


def schedules(sweep: Sweep) -> dict[str, ChargeSchedule]:
    """Each grid's charge schedule, as stored when the sweep was created."""
    out: dict[str, ChargeSchedule] = {}
    for g in SweepPlan.from_stored(sweep.plan):
        if g.grid is None or g.charges is None:
            # Fail closed: a grid without its schedule cannot be charged, so nothing may run.
            raise PlanCorrupt(f"grid {str(g.key)!r} of sweep {sweep.id!r} has no stored charges")
        out[g.grid] = ChargeSchedule.from_json(g.charges)
    return out


def hidden_grids(sweep: Sweep) -> set[str]:
    """Grids that release only their selected trial (papernot-steinke)."""
    return {str(g.key) for g in SweepPlan.from_stored(sweep.plan) if g.release == "selected-only"}
