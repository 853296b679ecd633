"""The TPE adapter: Optuna's TPE sampler, run in the driver (ask/tell), for ``search: tpe``.

Each grid has its own study. A configuration is asked for when its first trial is about to be
submitted; its params reach the database and every queued sibling (other seeds of the same
configuration) at once, so a resumed driver reads them back and empty params mean "not asked".
A configuration is told once all its trials finished: the mean objective over its finished
seeds, or a failure. A resumed driver rebuilds each study's history from the database.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, selectinload

from sweeper.driver.held_sweep import HeldSweep, PendingTrial
from sweeper.store import Trial, TrialState
from sweeper.sweeps.search import optuna_distributions
from sweeper.sweeps.stored import grid_key


class TpeSearch:
    """Ask TPE for the params of ``search: tpe`` trials and tell it their results.

    Args:
        held: The sweep the driver holds (nothing happens unless its search is ``tpe``).
    """

    def __init__(self, held: HeldSweep) -> None:
        self.held = held
        self._studies: dict[str, Any] = {}
        self._asked: dict[tuple[str, int], int] = {}

    @property
    def active(self) -> bool:
        return self.held.spec.search.method == "tpe"

    def _study(self, grid: str, arm_label: str) -> Any:
        if grid not in self._studies:
            # deferred: optuna (0.1 s and more) serves search: tpe alone; a grid sweep's
            # driver never loads it
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            arm = self.held.arm(arm_label)
            dists = optuna_distributions(arm)
            seed = int(self.held.spec.search.seed)
            study = optuna.create_study(
                direction="maximize" if self.held.mode == "max" else "minimize",
                sampler=optuna.samplers.TPESampler(seed=seed + len(self._studies)),
            )
            # Rebuild the history from the database (a resumed sweep keeps what TPE learned).
            for value, params in self._finished_configs(grid):
                study.add_trial(
                    optuna.trial.create_trial(params=params, distributions=dists, value=value)
                )
            self._studies[grid] = (study, dists)
        return self._studies[grid]

    def _finished_configs(self, grid: str) -> list[tuple[float, dict[str, Any]]]:
        by_config: dict[int, list[Any]] = {}
        with Session(self.held.engine) as session:
            for t in session.scalars(
                select(Trial)
                .where(Trial.sweep_id == self.held.sweep_id)
                .options(selectinload(Trial.result))
            ):
                if grid_key(t.arm, t.epsilon_budget) == grid and t.params:
                    by_config.setdefault(t.config, []).append(t)
        out = []
        for rows in by_config.values():
            if all(r.state in (TrialState.done, TrialState.failed) for r in rows):
                value = self._config_value(rows)
                if value is not None:
                    out.append((value, dict(rows[0].params)))
        return out

    def _config_value(self, rows: list[Trial]) -> float | None:
        """A configuration's objective: the mean over its finished seeds (None if none)."""
        metric = self.held.metric
        vals = [
            r.result.metrics.get(metric)
            for r in rows
            if r.state == TrialState.done and r.result is not None
        ]
        good = [float(v) for v in vals if isinstance(v, int | float) and math.isfinite(v)]
        return sum(good) / len(good) if good else None

    def assign(self, chosen: list[PendingTrial]) -> None:
        """Ask TPE for the params of each of ``chosen`` whose configuration has none yet."""
        if not self.active:
            return
        held = self.held
        for t in chosen:
            # An asked configuration's params reach the database and every queued sibling at
            # once (and a resumed driver reads them back), so empty params mean "not asked".
            if t.params:
                continue
            study, dists = self._study(t.grid, t.arm)
            trial = study.ask(dists)
            self._asked[(t.grid, t.config)] = trial.number
            for p in held.pending + chosen:
                if p.grid == t.grid and p.config == t.config:
                    p.params = dict(trial.params)
            with Session(held.engine) as session, session.begin():
                session.execute(
                    update(Trial)
                    .where(
                        Trial.sweep_id == held.sweep_id,
                        Trial.arm == t.arm,
                        Trial.epsilon_budget == t.epsilon_budget,
                        Trial.config == t.config,
                    )
                    .values(params=trial.params)
                )

    def tell(self, t: PendingTrial) -> None:
        """Tell TPE the result of ``t``'s configuration once all its trials finished."""
        if not self.active:
            return
        key = (t.grid, t.config)
        if key not in self._asked:
            return
        held = self.held
        with Session(held.engine) as session:
            rows = list(
                session.scalars(
                    select(Trial)
                    .where(
                        Trial.sweep_id == held.sweep_id,
                        Trial.arm == t.arm,
                        Trial.epsilon_budget == t.epsilon_budget,
                        Trial.config == t.config,
                    )
                    .options(selectinload(Trial.result))
                )
            )
            if not all(r.state in (TrialState.done, TrialState.failed) for r in rows):
                return
            value = self._config_value(rows)
        import optuna  # deferred: as in _study

        study, _ = self._studies[t.grid]
        number = self._asked.pop(key)
        if value is not None:
            study.tell(number, value)
        else:
            study.tell(number, state=optuna.trial.TrialState.FAIL)
