"""What a sweep may release: its trial records, and for papernot-steinke grids only the one
selected trial.

A papernot-steinke grid releases only its selected trial (the best by the objective), and
never its number of runs.

**Papernot-Steinke secrecy.** The guarantee of a papernot-steinke grid (Papernot & Steinke
2022) holds only while its number of runs K stays secret: nothing a user sees may depend on K
except through the one released trial. So, for such grids:

* every trial row has ``number == config == 0`` and a seed drawn independently of its position
  (the run index j would bound K from below; see :func:`sweeper.sweeps.create._arm_trials`);
* the released trial carries no timestamps and no durations (its start relative to the
  sweep's would tell how many runs went before it; its ``train_seconds`` and step time are its
  pack's, and packs grow with the number of runs);
* counts (summaries, cancel responses, progress) leave the grid's trials out;
* a grid releases its selected trial only if its search *completed*: every run reached a
  terminal state without a cancel. A cancel cuts K down to the K' runs that happened to finish
  first, a number chosen by the user's timing, which the analysis does not cover; such a grid
  stays charged in full (its first run paid for the whole search) and releases nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sweeper.privacy import release_log
from sweeper.store import Sweep, Trial, TrialState, iso
from sweeper.sweeps import events
from sweeper.sweeps.stored import grid_key, hidden_grids


def trial_record(t: Trial, *, selected_only: bool = False) -> dict[str, Any]:
    """A trial as users see it.

    Args:
        t: The trial (with its result loaded).
        selected_only: ``t`` is the released trial of a papernot-steinke grid. Its position,
            its start and end times and its duration are left out (``number`` 0, the rest
            None): when workers are few, when a run started says how many runs went before
            it; and a run trains packed with others of its grid (pack sizes follow the number
            of runs left), so its ``train_seconds``, the whole pack's wall time, grows with
            how many ran beside it, and a cold worker's first pack is slower still. Each
            would bound the secret number of runs.
    """
    r = t.result
    return {
        "id": t.id,
        "arm": t.arm,
        "strategy": t.strategy,
        "epsilon_budget": t.epsilon_budget,
        "params": t.params,
        "seed": t.seed,
        # Stored as 0 for papernot-steinke trials; masked here too, for sweeps stored before.
        "number": 0 if selected_only else t.number,
        "state": t.state.value,
        "attempts": t.attempts,
        "noise_multiplier": t.noise_multiplier,
        "error": t.error,
        "metrics": r.metrics if r is not None else {},
        # What this run alone would cost, were it the only release (labelled as such
        # everywhere): not what was spent. Its grid's budget (epsilon_budget) is.
        "single_run_epsilon": r.epsilon if r is not None else None,
        "delta": r.delta if r is not None else None,
        "steps": r.steps if r is not None else None,
        "best_step": r.best_step if r is not None else None,
        "started_at": None if selected_only else iso(t.started_at),
        "finished_at": None if selected_only else iso(t.finished_at),
        "train_seconds": None if selected_only else t.train_seconds,
    }


def search_completed(trials: list[Trial]) -> bool:
    """Whether a papernot-steinke grid's random search completed, so that it may release.

    Every run must have reached a terminal state *without a cancel*: ``done`` or ``failed``
    (a failed run is part of the search's random outcome, like a bad one). A ``cancelled``
    trial means the search was cut short at K' < K runs, a number the user's timing chose;
    the Papernot-Steinke analysis covers the best of the random K runs, not of K', so such a
    grid releases nothing (it stays charged in full). A grid with no runs (K = 0) has nothing
    to release either way.
    """
    return all(t.state in (TrialState.done, TrialState.failed) for t in trials)


def selected_trial(trials: list[Trial], *, metric: str, mode: str) -> Trial | None:
    """The trial a papernot-steinke grid releases, or None (see :func:`search_completed`).

    The best finished run by the objective. Ties are broken by the trial id (a random uuid4),
    not by the run's position: a position-based tie-break would make the choice depend on the
    order of the runs.
    """
    if not search_completed(trials):
        return None
    done = [
        t
        for t in trials
        if t.state == TrialState.done
        and t.result is not None
        and isinstance(t.result.metrics.get(metric), int | float)
    ]
    if not done:
        return None
    sign = 1.0 if mode == "max" else -1.0
    return max(done, key=lambda t: (sign * float(t.result.metrics[metric]), t.id))  # type: ignore[union-attr]


def released_records(sweep: Sweep, *, metric: str, mode: str) -> list[dict[str, Any]]:
    """Trial records that may be shown: all of them, except that a papernot-steinke grid
    shows only its selected trial (:func:`selected_trial`), only once its search completed
    without a cancel (:func:`search_completed`), and without its position or timestamps
    (:func:`trial_record`)."""
    hidden = hidden_grids(sweep)
    out: list[dict[str, Any]] = []
    by_grid: dict[str, list[Trial]] = {}
    for t in sweep.trials:
        by_grid.setdefault(grid_key(t.arm, t.epsilon_budget), []).append(t)
    for key, trials in sorted(by_grid.items()):
        if key not in hidden:
            out.extend(trial_record(t) for t in sorted(trials, key=lambda t: t.number))
            continue
        best = selected_trial(trials, metric=metric, mode=mode)
        if best is not None:
            out.append(trial_record(best, selected_only=True))
    return out


def record_hidden_releases(engine: Engine, sweep_id: str, *, metric: str, mode: str) -> int:
    """Log the release of every papernot-steinke grid of the sweep whose search completed
    (idempotent: call it after any trial of such a grid ends, and when a driver takes over).

    Returns:
        How many releases were logged now.
    """
    logged = 0
    with Session(engine) as session, session.begin():
        events.lock_sweep(session, sweep_id)
        sweep = session.get(Sweep, sweep_id)
        if sweep is None:
            return 0
        hidden = hidden_grids(sweep)
        if not hidden:
            return 0
        by_grid: dict[str, list[Any]] = {}
        for t in sweep.trials:
            key = grid_key(t.arm, t.epsilon_budget)
            if key in hidden:
                by_grid.setdefault(key, []).append(t)
        for key, runs in by_grid.items():
            chosen = selected_trial(runs, metric=metric, mode=mode)
            if chosen is not None and release_log.record_selected(
                session, sweep, trial_id=chosen.id, grid=key, run_ids=[t.id for t in runs]
            ):
                logged += 1
    return logged
