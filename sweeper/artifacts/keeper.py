"""Which trained models a sweep keeps, and how they reach the artifact store crash-safely.

The spec's ``artifacts.keep`` decides (:class:`dpsweep.spec.ArtifactsConfig`):

* ``best_per_grid`` (the default): each grid's best released trial by the objective. A trial
  that beats its grid's kept model replaces it (the old one is deleted once the new one is
  written); ties keep the earlier one.
* ``all``: every released trial with a selected checkpoint.
* ``none``: nothing (workers do not even hand weights back).

Papernot-Steinke grids release only their selected trial, and only once their search has
completed (:mod:`sweeper.sweeps.released`), so only that trial's model is ever stored: while
the search runs, the driver holds the best run's weights in memory alone, and stores them when
the grid releases that run. (A driver that dies mid-search loses them: a model of such a grid
is then not kept, which reveals nothing about the secret number of runs.)

Non-private trials (``nonprivate``) are never kept: their weights are not a DP release.

**Crash safety.** A kept trial's weights are *staged* (:class:`~sweeper.store.StagedModel`)
in the same transaction that records its result. :func:`flush_staged` then writes the
weights and the model card to the store (temporary name, then rename), and in one transaction
adds the :class:`~sweeper.store.ModelArtifact` row (with the content hashes) and deletes the
staged row. A driver killed in between leaves the staged weights and perhaps unreferenced
files; the next driver of the sweep deletes files no row names (:func:`collect_garbage`) and
writes the staged models again. So a row always names a complete file.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from sweeper.artifacts.cards import card_bytes, model_card
from sweeper.privacy import release_log
from sweeper.privacy.ledger.amounts import ZERO
from sweeper.store import ModelArtifact, StagedModel, Sweep, Trial, TrialResultRow, TrialState
from sweeper.store.artifact_files import (
    TMP_PREFIX,
    ArtifactStore,
    card_key,
    model_key,
    sha256_hex,
    sweep_prefix,
    trial_prefix,
    usage_bytes,
)
from sweeper.sweeps import events
from sweeper.sweeps.released import search_completed, selected_trial
from sweeper.sweeps.stored import grid_key

log = logging.getLogger(__name__)


def score(value: Any, *, mode: str) -> float | None:
    """An objective value as a number to maximise (None if it is not a finite number)."""
    if not isinstance(value, int | float) or not math.isfinite(float(value)):
        return None
    return float(value) if mode == "max" else -float(value)


@dataclass
class _Candidate:
    """A papernot-steinke grid's best finished run so far, held in memory only."""

    key: tuple[float, str]
    trial_id: str
    weights: bytes
    info: dict[str, Any]


class ModelKeeper:
    """The driver's side: stage kept models with their results, write them to the store.

    Args:
        engine: The store's engine.
        sweep_id: The sweep.
        keep: The spec's ``artifacts.keep``.
        metric: The objective's metric; ``mode``: ``max`` or ``min``.
        hidden: The sweep's papernot-steinke grids.
        store: The artifact store.
        quota_bytes: Most bytes of kept models per tenant (None: no limit).
    """

    def __init__(
        self,
        engine: Engine,
        sweep_id: str,
        *,
        keep: str,
        metric: str,
        mode: str,
        hidden: set[str],
        store: ArtifactStore,
        quota_bytes: int | None = None,
    ) -> None:
        self.engine = engine
        self.sweep_id = sweep_id
        self.keep = keep
        self.metric = metric
        self.mode = mode
        self.hidden = hidden
        self.store = store
        self.quota_bytes = quota_bytes
        self.candidates: dict[str, _Candidate] = {}
        self.last_skip: str | None = None

    @property
    def wants_weights(self) -> bool:
        """Whether workers should hand weights back at all."""
        return self.keep != "none"

    # -- with a trial's result (inside its transaction) ------------------------------------

    def stage(
        self,
        session: Session,
        *,
        trial_id: str,
        grid: str,
        private: bool,
        metrics: dict[str, Any],
        weights: bytes | None,
        info: dict[str, Any],
    ) -> None:
        """Keep ``trial_id``'s weights if the policy wants them (call in the transaction that
        marks it done). A papernot-steinke grid's run is held in memory only."""
        if self.keep == "none" or weights is None or not private:
            return
        s = score(metrics.get(self.metric), mode=self.mode)
        if grid in self.hidden:
            if s is None:
                return
            # The grid releases its best run, ties broken by trial id (released.selected_trial).
            cand = _Candidate((s, trial_id), trial_id, weights, info)
            current = self.candidates.get(grid)
            if current is None or cand.key > current.key:
                self.candidates[grid] = cand
            return
        if self.keep == "best_per_grid":
            if s is None:
                return
            best = self._grid_best(session, grid)
            if best is not None and s <= best:
                return
        session.add(
            StagedModel(
                trial_id=trial_id, sweep_id=self.sweep_id, grid=grid, weights=weights, info=info
            )
        )

    def _grid_best(self, session: Session, grid: str) -> float | None:
        """The best objective among the grid's kept and staged models (as a score)."""
        kept = select(ModelArtifact.trial_id).where(
            ModelArtifact.sweep_id == self.sweep_id, ModelArtifact.grid == grid
        )
        staged = select(StagedModel.trial_id).where(
            StagedModel.sweep_id == self.sweep_id, StagedModel.grid == grid
        )
        agg = func.max if self.mode == "max" else func.min
        value = session.scalar(
            select(agg(TrialResultRow.objective)).where(
                TrialResultRow.trial_id.in_(kept.union(staged).scalar_subquery())
            )
        )
        return score(value, mode=self.mode)

    # -- papernot-steinke grids: store the selected run once the grid releases it ----------

    def release_hidden(self) -> None:
        """Stage and write the model of each papernot-steinke grid whose search completed and
        released the run held in memory; drop those that released another run or nothing."""
        if not self.candidates:
            return

        staged = False
        with Session(self.engine) as session, session.begin():
            trials = list(session.scalars(select(Trial).where(Trial.sweep_id == self.sweep_id)))
            by_grid: dict[str, list[Trial]] = {}
            for t in trials:
                by_grid.setdefault(grid_key(t.arm, t.epsilon_budget), []).append(t)
            for grid, cand in list(self.candidates.items()):
                runs = by_grid.get(grid, [])
                if any(t.state not in _TERMINAL for t in runs):
                    continue  # the search goes on
                del self.candidates[grid]
                if not search_completed(runs):
                    continue  # cut short by a cancel: the grid releases nothing
                chosen = selected_trial(runs, metric=self.metric, mode=self.mode)
                if chosen is None or chosen.id != cand.trial_id:
                    continue
                session.add(
                    StagedModel(
                        trial_id=cand.trial_id,
                        sweep_id=self.sweep_id,
                        grid=grid,
                        weights=cand.weights,
                        info=cand.info,
                    )
                )
                staged = True
        if staged:
            self.flush()

    # -- writing to the store ----------------------------------------------------------------

    def flush(self) -> int:
        """Write the sweep's staged models to the store (see the module docstring).

        Returns:
            How many models were written.
        """
        return flush_staged(
            self.engine,
            self.sweep_id,
            store=self.store,
            quota_bytes=self.quota_bytes,
            keeper=self,
        )

    def recover(self) -> int:
        """At take-over: delete files no row names, then write what a dead driver staged."""
        collect_garbage(self.engine, self.sweep_id, store=self.store)
        return self.flush()


_TERMINAL = (TrialState.done, TrialState.failed, TrialState.cancelled)


def flush_staged(
    engine: Engine,
    sweep_id: str,
    *,
    store: ArtifactStore,
    quota_bytes: int | None = None,
    keeper: ModelKeeper | None = None,
) -> int:
    """Write each staged model of ``sweep_id`` to the store, then its artifact row.

    Under ``best_per_grid`` the grid's other kept models are deleted in the same transaction
    (their files after it). A model that would take its tenant over ``quota_bytes`` is not
    kept (its staged row is dropped and the reason logged). A store that fails to write leaves
    the model staged for the next flush; it never stops the sweep.
    """
    with Session(engine) as session:
        ids = list(
            session.scalars(
                select(StagedModel.trial_id)
                .where(StagedModel.sweep_id == sweep_id)
                .order_by(StagedModel.created_at)
            )
        )
    written = 0
    for trial_id in ids:
        staged = _read_staged(engine, trial_id)
        if staged is None:
            continue
        if quota_bytes is not None and _drop_over_quota(
            engine, trial_id, staged, quota_bytes=quota_bytes, keeper=keeper
        ):
            continue
        if not _put_files(store, sweep_id, trial_id, staged, keeper=keeper):
            continue
        replaced = _commit_artifact(
            engine,
            sweep_id,
            trial_id,
            grid=staged.grid,
            replace_grid=staged.keep == "best_per_grid",
            fields={
                "owner": staged.owner,
                "key": model_key(sweep_id, trial_id),
                "sha256": staged.sha,
                "size_bytes": len(staged.weights),
                "card": staged.card,
                "card_sha256": sha256_hex(staged.card_data),
                "card_size_bytes": len(staged.card_data),
                "reproducible": staged.reproducible,
            },
        )
        if replaced is None:  # the sweep (or trial) was deleted meanwhile: its files go too
            store.delete_folder(trial_prefix(sweep_id, trial_id))
            continue
        for old_id in replaced:
            store.delete_folder(trial_prefix(sweep_id, old_id))
        written += 1
    return written


@dataclass(frozen=True)
class _Staged:
    """A staged model as :func:`flush_staged` writes it: its weights and card, and what of its
    sweep decides how it is kept."""

    weights: bytes
    sha: str
    card: dict[str, Any]
    card_data: bytes
    owner: str | None
    keep: str
    reproducible: bool
    grid: str


def _read_staged(engine: Engine, trial_id: str) -> _Staged | None:
    """The staged model of ``trial_id`` with its card, or None if it is gone (written, or its
    sweep deleted) or its trial has no result."""
    with Session(engine) as session:
        staged = session.get(StagedModel, trial_id)
        trial = session.get(Trial, trial_id)
        if staged is None or trial is None or trial.result is None:
            return None
        sweep = trial.sweep
        weights = staged.weights
        sha = sha256_hex(weights)
        card = model_card(
            session,
            trial,
            model=staged.info,
            weights_sha256=sha,
            weights_size_bytes=len(weights),
        )
        return _Staged(
            weights=weights,
            sha=sha,
            card=card,
            card_data=card_bytes(card),
            owner=sweep.owner,
            keep=str((sweep.spec.get("artifacts") or {}).get("keep", "best_per_grid")),
            reproducible=bool((sweep.spec.get("privacy") or {}).get("reproducible", True)),
            grid=staged.grid,
        )


def _drop_over_quota(
    engine: Engine,
    trial_id: str,
    staged: _Staged,
    *,
    quota_bytes: int,
    keeper: ModelKeeper | None,
) -> bool:
    """Whether the model would take its tenant over ``quota_bytes``; if so its staged row is
    dropped (it is not kept) and the reason logged."""
    size = len(staged.weights) + len(staged.card_data)
    with Session(engine) as session:
        used = usage_bytes(session, staged.owner)
    if used + size <= quota_bytes:
        return False
    reason = (
        f"model of trial {trial_id} not kept: its {size} bytes would take the "
        f"tenant's kept models past the quota of {quota_bytes} bytes "
        "(DPSWEEP_ARTIFACT_QUOTA_MB); delete sweeps whose models are no longer "
        "needed"
    )
    log.warning(reason)
    if keeper is not None:
        keeper.last_skip = reason
    with Session(engine) as session, session.begin():
        row = session.get(StagedModel, trial_id)
        if row is not None:
            session.delete(row)
    return True


def _put_files(
    store: ArtifactStore,
    sweep_id: str,
    trial_id: str,
    staged: _Staged,
    *,
    keeper: ModelKeeper | None,
) -> bool:
    """Write the model's weights, then its card, to the store; False (the reason logged) if
    the store fails."""
    try:
        store.put(model_key(sweep_id, trial_id), staged.weights)
        store.put(card_key(sweep_id, trial_id), staged.card_data)
    except Exception as exc:  # the store is down or full: training goes on
        # The weights stay staged; the next flush (or the sweep's next driver) retries.
        reason = f"model of trial {trial_id} not written yet ({type(exc).__name__}: {exc})"
        log.warning(reason)
        if keeper is not None:
            keeper.last_skip = reason
        return False
    return True


def _commit_artifact(
    engine: Engine,
    sweep_id: str,
    trial_id: str,
    *,
    grid: str,
    replace_grid: bool,
    fields: dict[str, Any],
) -> list[str] | None:
    """In one transaction: the artifact row in, the staged row out, and (``replace_grid``)
    the grid's other kept models out. Returns the replaced trials' ids, or None if the staged
    row is gone (its sweep was deleted while the files were written)."""
    replaced: list[str] = []
    with Session(engine) as session, session.begin():
        events.lock_sweep(session, sweep_id)
        row = session.get(StagedModel, trial_id)
        if row is None:
            return None
        session.delete(row)
        if replace_grid:
            for other in session.scalars(
                select(ModelArtifact).where(
                    ModelArtifact.sweep_id == sweep_id,
                    ModelArtifact.grid == grid,
                    ModelArtifact.trial_id != trial_id,
                )
            ).all():
                replaced.append(other.trial_id)
                session.delete(other)
        session.merge(ModelArtifact(trial_id=trial_id, sweep_id=sweep_id, grid=grid, **fields))
        sweep = session.get(Sweep, sweep_id)
        if sweep is not None:
            # The audit log: the model is covered by its trial's release (ε 0 here).
            release_log.record(
                session,
                sweep,
                trial_id=trial_id,
                kind="model",
                grid=grid,
                epsilon=ZERO,
                delta=ZERO,
                detail={"released": ["model"], "sha256": fields["sha256"]},
            )
    return replaced


def collect_garbage(engine: Engine, sweep_id: str, *, store: ArtifactStore) -> int:
    """Delete the sweep's files that no artifact row names (and temporary files).

    Only the sweep's own driver (or whoever deletes the sweep) calls this: no other process
    writes under the sweep's folder meanwhile.

    Returns:
        How many trial folders were deleted.
    """
    with Session(engine) as session:
        kept = set(
            session.scalars(
                select(ModelArtifact.trial_id).where(ModelArtifact.sweep_id == sweep_id)
            )
        )
    deleted = 0
    prefix = sweep_prefix(sweep_id)
    for trial_id in store.folders(prefix):
        folder = f"{prefix}/{trial_id}"
        if trial_id not in kept:
            store.delete_folder(folder)
            deleted += 1
            continue
        for name in store.files(folder):
            if name.startswith(TMP_PREFIX):
                store.delete(f"{folder}/{name}")
    return deleted
