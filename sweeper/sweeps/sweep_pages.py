"""Reads of sweeps for the API: visibility, the sweep's head and version, pages of sweeps.

Visibility: a viewer sees its own objects (admins and local use see all); anything else is
"not found", so ids of other owners do not leak. A papernot-steinke sweep's list entry shows no
trial counts and no bests: how many trials ran is its secret number of runs. An analyst's sweep
shows its analyst its times rounded to 10 s (:mod:`sweeper.datasets.analyst_clock`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, bindparam, func, literal, or_, select, tuple_
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, PermissionDenied, SweepNotFound
from dpsweep.plan import SweepPlan
from dpsweep.spec import randomness_label
from sweeper.datasets.access import Viewer
from sweeper.datasets.analyst_clock import analyst_names, for_analyst, reads_as_analyst
from sweeper.datasets.grants import owned_dataset_names, sees_sweep
from sweeper.privacy.ledger.rows import LedgerEntry
from sweeper.store import (
    ModelArtifact,
    Sweep,
    SweepEvent,
    SweepState,
    Trial,
    TrialResultRow,
    TrialState,
    iso,
)
from sweeper.store.cursors import Page, decode_cursor, encode_cursor
from sweeper.sweeps.stored import typed_spec


@dataclass(frozen=True)
class SweepHead:
    """What a read needs to know first: the state, whether papernot-steinke grids hide
    trials, and a version that changes whenever the sweep's summary may change (its newest
    event and newest ledger entry: charges come without events)."""

    state: str
    hidden: bool
    version: tuple[int, int]
    metric: str = "accuracy"
    mode: str = "max"
    randomness: str = "secret"
    # (count, newest ``created_at``) of its kept models: changes whenever a model is added,
    # replaced (the new row is newer) or deleted, which happens without an event.
    models: tuple[int, str | None] = (0, None)
    # The viewer reads it as the analyst of its dataset: no worker, no per-step times, times
    # rounded to 10 s (sweeper.datasets.analyst_clock).
    analyst: bool = False


def _head_statement() -> Any:
    ev = (
        select(func.max(SweepEvent.id))
        .where(SweepEvent.sweep_id == Sweep.id)
        .correlate(Sweep)
        .scalar_subquery()
    )
    le = (
        select(func.max(LedgerEntry.id))
        .where(
            # The sweep's ledger key (its name for sweeps stored before identities).
            LedgerEntry.dataset == func.coalesce(Sweep.ledger_key, Sweep.dataset),
            LedgerEntry.sweep_id == Sweep.id,
        )
        .correlate(Sweep)
        .scalar_subquery()
    )
    # The kept models' stamp: their rows change without events (api.page_cache).
    models = (
        select(func.count(), func.max(ModelArtifact.created_at))
        .where(ModelArtifact.sweep_id == Sweep.id)
        .correlate(Sweep)
    )
    n_models = models.with_only_columns(func.count()).scalar_subquery()
    newest_model = models.with_only_columns(func.max(ModelArtifact.created_at)).scalar_subquery()
    return select(
        Sweep.owner, Sweep.state, Sweep.spec, ev, le, Sweep.dataset, n_models, newest_model
    ).where(Sweep.id == bindparam("sweep_id"))


# Built once: every API read of a sweep starts with it, and building the statement costs
# about as much as running it.
_HEAD = _head_statement()


def sweep_head(engine: Engine, sweep_id: str, viewer: Viewer) -> SweepHead:
    """One query: the :class:`SweepHead` of a visible sweep.

    Raises:
        SweepNotFound: no such sweep, or someone else's.
    """
    # A Core connection, not an ORM session: this runs before every cached read.
    with engine.connect() as conn:
        row = conn.execute(_HEAD, {"sweep_id": sweep_id}).first()
        visible = row is not None and viewer.sees(row[0])
        analyst = False
        if row is not None and not (viewer.admin or viewer.owner is None):
            with Session(bind=conn) as session:
                # The owner of its dataset sees every sweep on their data.
                visible = visible or sees_sweep(session, viewer, owner=row[0], dataset=row[5])
                analyst = visible and reads_as_analyst(session, viewer, row[5])
    if row is None or not visible:
        raise SweepNotFound(f"no sweep {sweep_id!r}; GET /api/v1/sweeps lists yours")
    spec = typed_spec(row[2])
    return SweepHead(
        row[1].value,
        # The planner releases selected trials only (hides the rest) exactly for this
        # accounting.
        spec.privacy.accounting == "papernot-steinke",
        (int(row[3] or 0), int(row[4] or 0)),
        spec.objective.metric,
        spec.objective.mode,
        # From the stored JSON: a spec stored before the field existed is reproducible.
        randomness_label(row[2]),
        (int(row[6] or 0), iso(row[7])),
        analyst,
    )


def check_sweep(engine: Engine, sweep_id: str, viewer: Viewer) -> tuple[str, bool]:
    """(state, has hidden grids) of a visible sweep; raises SweepNotFound otherwise."""
    head = sweep_head(engine, sweep_id, viewer)
    return head.state, head.hidden


def check_sweep_owner(engine: Engine, sweep_id: str, viewer: Viewer) -> None:
    """Refuse to act on a sweep that is not the viewer's own.

    Raises:
        SweepNotFound: the viewer does not see it.
        PermissionDenied: the viewer sees it (as its dataset's owner) but does not own it.
    """
    sweep_head(engine, sweep_id, viewer)
    with Session(engine) as session:
        owner = session.scalar(select(Sweep.owner).where(Sweep.id == sweep_id))
    if not viewer.sees(owner):
        raise PermissionDenied(
            f"sweep {sweep_id!r} is an analyst's sweep on your dataset: you may read it, and "
            "revoke their grant to stop new trials, but only its owner may cancel or delete it"
        )


def sweep_item(s: Sweep) -> dict[str, Any]:
    """A sweep as its list entry shows it (without the progress of :func:`page_sweeps`)."""
    return {
        "id": s.id,
        "name": s.name,
        "dataset": s.dataset,
        "state": s.state.value,
        "owner": s.owner,
        "created_at": iso(s.created_at),
        "started_at": iso(s.started_at),
        "finished_at": iso(s.finished_at),
        "error": s.error,
        "randomness": randomness_label(s.spec or {}),
    }


def page_sweeps(
    engine: Engine,
    viewer: Viewer,
    *,
    state: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Page:
    """The viewer's sweeps, newest first, ``limit`` at a time."""
    key = decode_cursor(cursor, length=2)
    stmt = select(Sweep)
    if not (viewer.admin or viewer.owner is None):
        # Their own sweeps, and every sweep on a dataset they own (analysts' included).
        stmt = stmt.where(
            or_(Sweep.owner == viewer.owner, Sweep.dataset.in_(owned_dataset_names(viewer)))
        )
    if state is not None:
        try:
            stmt = stmt.where(Sweep.state == SweepState(state))
        except ValueError:
            raise ConfigError(
                f"unknown state {state!r}; choose one of {', '.join(s.value for s in SweepState)}",
                field="state",
            ) from None
    if key is not None:
        try:
            at = datetime.fromisoformat(str(key[0]))
        except ValueError:
            raise ConfigError("invalid cursor", field="cursor") from None
        stmt = stmt.where(tuple_(Sweep.created_at, Sweep.id) < tuple_(literal(at), str(key[1])))
    stmt = stmt.order_by(Sweep.created_at.desc(), Sweep.id.desc()).limit(limit + 1)
    with Session(engine) as session:
        rows = list(session.scalars(stmt))
        more = len(rows) > limit
        rows = rows[:limit]
        progress = _progress(session, rows)
        # The viewer's own sweeps on others' data, read as their analyst: coarse times.
        mine = {r.dataset for r in rows if r.owner == viewer.owner}
        coarse = set() if viewer.admin else analyst_names(session, viewer.owner, mine)
    nxt = encode_cursor([rows[-1].created_at.isoformat(), rows[-1].id]) if more else None
    items = [sweep_item(r) | progress[r.id] for r in rows]
    return Page(
        [
            for_analyst(i) if i["owner"] == viewer.owner and i["dataset"] in coarse else i
            for i in items
        ],
        nxt,
    )


def _progress(session: Session, sweeps: list[Sweep]) -> dict[str, dict[str, Any]]:
    """For a page of sweeps: trials by state, ε levels and the best trial objective per arm,
    in two grouped queries.

    Papernot–Steinke sweeps get no counts and no bests: how many trials ran is K, which the
    release must not reveal (their selected trials are shown on the sweep itself).
    """
    ids = [s.id for s in sweeps]
    counts: dict[str, dict[str, int]] = {i: {st.value: 0 for st in TrialState} for i in ids}
    best: dict[str, dict[str, float]] = {i: {} for i in ids}
    modes: dict[str, tuple[str, str]] = {}
    hidden: set[str] = set()
    for s in sweeps:
        spec = typed_spec(s)
        modes[s.id] = (spec.objective.metric, spec.objective.mode)
        if spec.privacy.accounting == "papernot-steinke":
            hidden.add(s.id)
    if ids:
        for sid, state, n in session.execute(
            select(Trial.sweep_id, Trial.state, func.count())
            .where(Trial.sweep_id.in_(ids))
            .group_by(Trial.sweep_id, Trial.state)
        ):
            counts[sid][state.value] = int(n)
        for sid, arm, hi, lo in session.execute(
            select(
                Trial.sweep_id,
                Trial.arm,
                func.max(TrialResultRow.objective),
                func.min(TrialResultRow.objective),
            )
            .join(TrialResultRow, TrialResultRow.trial_id == Trial.id)
            .where(Trial.sweep_id.in_(ids), Trial.state == TrialState.done)
            .group_by(Trial.sweep_id, Trial.arm)
        ):
            value = hi if modes[sid][1] == "max" else lo
            if value is not None:
                best[sid][arm] = float(value)
    out: dict[str, dict[str, Any]] = {}
    for s in sweeps:
        metric, mode = modes[s.id]
        levels = sorted({g.epsilon_budget for g in SweepPlan.from_stored(s.plan)})
        shown = s.id not in hidden
        out[s.id] = {
            "objective": {"metric": metric, "mode": mode},
            "levels": levels,
            "trials": counts[s.id] if shown else None,
            "best": (
                [{"arm": arm, "objective": v} for arm, v in sorted(best[s.id].items())]
                if shown
                else None
            ),
        }
    return out
