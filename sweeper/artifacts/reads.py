"""Reading a kept model back: for its sweep's owner only, as every other read.

A trial's model exists for a viewer only if the trial does (:func:`sweeper.sweeps.
trial_detail.released_trial`: the viewer sees its sweep, and a papernot-steinke grid's trial
only if it is the grid's selected one); anyone else gets "not found", as for the trial. A
trial the viewer sees whose model is not kept gets :class:`~dpsweep.errors.ModelNotKept`
saying why. The bytes are checked against the content hash recorded when they were written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from dpsweep.errors import ArtifactCorrupt, ModelNotKept
from sweeper.datasets.access import Viewer
from sweeper.store import ModelArtifact, StagedModel
from sweeper.store.artifact_files import ArtifactStore, card_key, sha256_hex
from sweeper.sweeps.stored import grid_key, hidden_grids
from sweeper.sweeps.trial_detail import released_trial

MEDIA_TYPE = "application/octet-stream"


@dataclass(frozen=True)
class KeptModel:
    """A kept model as its reader sees it: where its bytes are, their hashes, its card."""

    trial_id: str
    sweep_id: str
    key: str
    card_key: str
    sha256: str
    size_bytes: int
    card: dict[str, Any]
    card_sha256: str
    reproducible: bool

    @property
    def filename(self) -> str:
        """The file name a download suggests: ``dpsweep-<trial>.safetensors``."""
        return f"dpsweep-{self.trial_id}.safetensors"


def kept_model(engine: Engine, trial_id: str, viewer: Viewer) -> KeptModel:
    """The kept model of ``trial_id``.

    Raises:
        TrialNotFound: no such trial for ``viewer`` (someone else's, or an unreleased
            papernot-steinke run).
        ModelNotKept: the trial's model is not kept (the message says why).
    """
    with Session(engine) as session:
        trial, _selected = released_trial(session, trial_id, viewer)
        row = session.get(ModelArtifact, trial_id)
        if row is None:
            raise ModelNotKept(_why_not(session, trial))
        return KeptModel(
            trial_id=row.trial_id,
            sweep_id=row.sweep_id,
            key=row.key,
            card_key=card_key(row.sweep_id, row.trial_id),
            sha256=row.sha256,
            size_bytes=int(row.size_bytes),
            card=dict(row.card),
            card_sha256=row.card_sha256,
            reproducible=bool(row.reproducible),
        )


def _why_not(session: Session, trial: Any) -> str:
    """Why a visible trial has no kept model (public facts only: the policy and the state)."""
    keep = str((trial.sweep.spec.get("artifacts") or {}).get("keep", "best_per_grid"))
    base = f"no model is kept for trial {trial.id}"
    if keep == "none":
        return f"{base}: its sweep keeps none (artifacts.keep: none)"
    if trial.state.value != "done":
        return f"{base}: it is {trial.state.value}; only finished trials have a model"
    if trial.strategy == "nonprivate":
        return f"{base}: it is not differentially private (strategy nonprivate): never kept"
    if session.get(StagedModel, trial.id) is not None:
        return f"{base} yet: it is being written; try again in a moment"
    if grid_key(trial.arm, trial.epsilon_budget) in hidden_grids(trial.sweep):
        # The selected run's weights are held in the driver's memory only until the search
        # completes (never stored before): a driver restarted mid-search lost them.
        return (
            f"{base}: its papernot-steinke grid holds the selected run's weights in memory "
            "only until its search completes, and the sweep's driver restarted during the "
            "search"
        )
    if keep == "best_per_grid":
        return (
            f"{base}: its sweep keeps each grid's best model only (artifacts.keep: "
            "best_per_grid), and this trial is not its grid's best; the sweep's trial list "
            "says which trials have a model"
        )
    return (
        f"{base}: it has no selected checkpoint, or the tenant's quota of kept models was "
        "reached when it finished"
    )


def read_model(store: ArtifactStore, kept: KeptModel) -> bytes:
    """The model's safetensors bytes, checked against their recorded hash.

    Raises:
        ArtifactCorrupt: the stored bytes are missing or differ from what was written.
    """
    return _checked(store, kept.key, kept.sha256, what="model")


def read_card(store: ArtifactStore, kept: KeptModel) -> bytes:
    """The model card's JSON bytes as stored beside the model, checked against their hash."""
    return _checked(store, kept.card_key, kept.card_sha256, what="model card")


def _checked(store: ArtifactStore, key: str, sha256: str, *, what: str) -> bytes:
    try:
        data = store.get(key)
    except FileNotFoundError as exc:
        raise ArtifactCorrupt(
            f"the {what} file {key!r} is missing from the artifact store; an operator must "
            "restore it (its content hash is recorded)"
        ) from exc
    if sha256_hex(data) != sha256:
        raise ArtifactCorrupt(
            f"the {what} file {key!r} does not match the content hash recorded when it was "
            "written; it was changed or damaged in the artifact store"
        )
    return data
