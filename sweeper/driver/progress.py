"""What a driver tells about its sweep: trial counts, bests, the ETA and its last event.

Counts, bests and the ETA leave out papernot-steinke grids (:meth:`HeldSweep.shows`), whose
number of runs is secret; for a sweep with such grids the progress line only says which grids'
searches are under way (a search starts with its grid's charge and ends with its release, both
visible anyway) and for how long.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from dpsweep.errors import SweepNotFound
from sweeper.driver.held_sweep import HeldSweep, PendingTrial
from sweeper.store import Sweep, Trial
from sweeper.sweeps.stored import grid_key, hidden_grids


@dataclass
class Snapshot:
    """What a progress display shows.

    Counts, bests and the ETA leave out papernot-steinke grids, whose number of runs is
    secret: for a sweep with such grids ``eta`` is None and ``last_event`` only says which
    grids' searches are under way (a search starts with its grid's charge and ends with its
    release, both visible anyway) and the elapsed time, never a per-run event.
    """

    counts: dict[str, int]
    total: int
    best: dict[str, float]
    elapsed: float
    eta: float | None
    hidden_grids: int
    metric: str
    last_event: str = ""
    # papernot-steinke grids whose search has started and not yet ended.
    searching: tuple[str, ...] = ()


@dataclass
class RunOutcome:
    """How a driver left a sweep: its state and trials by state (papernot-steinke grids left
    out, as everywhere their count could be seen, logs included)."""

    sweep_id: str
    state: str
    counts: dict[str, int] = field(default_factory=dict)


def format_elapsed(seconds: float) -> str:
    """``80.4`` -> ``"1m20s"``, ``3725`` -> ``"1h02m05s"``, ``7`` -> ``"7s"``."""
    total = max(0, int(seconds))
    h, rest = divmod(total, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"


class Progress:
    """The driver's running tally of its sweep, and the snapshots it reports.

    Args:
        held: The sweep the driver holds.
        on_progress: Called with a :class:`Snapshot` after each poll (None: nothing reports).
        t0: When the driver started (``time.monotonic()``).
    """

    def __init__(
        self,
        held: HeldSweep,
        *,
        on_progress: Callable[[Snapshot], None] | None,
        t0: float,
    ) -> None:
        self.held = held
        self.on_progress = on_progress
        self.t0 = t0
        self.counts: dict[str, int] = {}
        self.best: dict[str, float] = {}
        # Finished trials of shown grids in this driver's lifetime (the ETA's rate).
        self.done_this_run = 0
        # When each papernot-steinke grid's search started (as this driver saw it).
        self.search_t0: dict[str, float] = {}
        self.last_event = ""

    def count(self, trial: PendingTrial, old: str | None, new: str) -> None:
        """Move ``trial`` from state ``old`` to ``new`` in the counts (shown grids only)."""
        if not self.held.shows(trial.grid):
            return
        if old is not None:
            self.counts[old] -= 1
        self.counts[new] += 1

    def note_best(self, arm: str, value: Any) -> None:
        """Keep ``value`` as ``arm``'s best objective if it is finite and better."""
        if not isinstance(value, int | float) or not math.isfinite(value):
            return
        cur = self.best.get(arm)
        better = cur is None or (value > cur if self.held.mode == "max" else value < cur)
        if better:
            self.best[arm] = float(value)

    def searching(self) -> tuple[str, ...]:
        """papernot-steinke grids whose search has started (charged) and not ended (some of
        its trials still queued or in flight): the two ends users see anyway, as the grid's
        charge and its release."""
        held = self.held
        live = {t.grid for t in held.pending} | {t.grid for f in held.inflight for t in f.trials}
        return tuple(sorted(g for g in held.hidden if g in live and held.runs_used.get(g, 0) > 0))

    def report(self) -> None:
        """Call ``on_progress`` with a snapshot of now."""
        if self.on_progress is None:
            return
        hidden = self.held.hidden
        now = time.monotonic()
        elapsed = now - self.t0
        searching = self.searching() if hidden else ()
        if hidden:
            # No counts, no per-run events, no ETA: each would be a function of the secret
            # number of runs. Only which searches are under way, and for how long.
            eta: float | None = None
            if searching:
                start = min(self.search_t0.get(g, self.t0) for g in searching)
                names = ", ".join(searching)
                grids = "grid" if len(searching) == 1 else "grids"
                message = (
                    f"papernot-steinke {grids} {names} running "
                    f"(elapsed {format_elapsed(now - start)})"
                )
            else:
                message = f"papernot-steinke: no search running (elapsed {format_elapsed(elapsed)})"
            if self.last_event:
                message += f"; {self.last_event}"
        else:
            remaining = self.counts.get("pending", 0) + self.counts.get("running", 0)
            eta = (
                elapsed / self.done_this_run * remaining
                if self.done_this_run and remaining
                else None
            )
            eta = eta if remaining else 0.0
            # Once nothing is left the last pack's event ("finished 1 trial(s) of fixed")
            # would read as the whole sweep's: say what ended instead.
            message = self.last_event if remaining else _ended(self.counts)
        self.on_progress(
            Snapshot(
                counts=dict(self.counts),
                total=sum(self.counts.values()),
                best=dict(self.best),
                elapsed=elapsed,
                eta=eta,
                hidden_grids=len(hidden),
                metric=self.held.metric,
                last_event=message,
                searching=searching,
            )
        )


def _ended(counts: dict[str, int]) -> str:
    """The line of a sweep with no trial left to run: how many ended in each state."""
    total = sum(counts.values())
    if not total:
        return ""
    parts = [f"{n} {state}" for state, n in sorted(counts.items()) if n]
    return f"all {total} trial(s) ended: " + ", ".join(parts)


def run_outcome(engine: Engine, sweep_id: str) -> RunOutcome:
    """The sweep's state and its trials by state, papernot-steinke grids left out.

    Raises:
        SweepNotFound: no such sweep.
    """
    with Session(engine) as session:
        sweep = session.get(Sweep, sweep_id)
        if sweep is None:
            raise SweepNotFound(f"no sweep {sweep_id!r}")
        hidden = hidden_grids(sweep)
        counts: dict[str, int] = {}
        for arm, level, s in session.execute(
            select(Trial.arm, Trial.epsilon_budget, Trial.state).where(Trial.sweep_id == sweep_id)
        ):
            if grid_key(arm, level) not in hidden:
                counts[s.value] = counts.get(s.value, 0) + 1
        return RunOutcome(sweep_id, sweep.state.value, counts)
