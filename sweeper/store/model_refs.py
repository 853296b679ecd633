"""What a trial listing says about a trial's kept model: ``None``, or where to download it.

A listing shows public facts of the kept file only (its content hash, size and whether it was
trained in the labelled reproducible mode) and the two URLs that serve it; never when it was
written (for a papernot-steinke grid that time would say when its search ended).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sweeper.store import ModelArtifact

API = "/api/v1"

# The columns a listing reads (joined onto a page's query, or read for a set of trials).
REF_COLUMNS = (
    ModelArtifact.trial_id.label("model_trial_id"),
    ModelArtifact.sha256.label("model_sha256"),
    ModelArtifact.size_bytes.label("model_size_bytes"),
    ModelArtifact.reproducible.label("model_reproducible"),
)


def model_url(trial_id: str) -> str:
    """Where a trial's model (safetensors) is served."""
    return f"{API}/trials/{trial_id}/model"


def card_url(trial_id: str) -> str:
    """Where a trial's model card (JSON) is served."""
    return f"{API}/trials/{trial_id}/model-card"


def model_ref(
    trial_id: str, *, sha256: str | None, size_bytes: int | None, reproducible: bool | None
) -> dict[str, Any] | None:
    """A listing's ``model`` field (None when no model is kept: ``sha256`` is None)."""
    if sha256 is None:
        return None
    return {
        "sha256": sha256,
        "size_bytes": int(size_bytes or 0),
        "reproducible": bool(reproducible),
        "url": model_url(trial_id),
        "card_url": card_url(trial_id),
    }


def row_ref(trial_id: str, row: Any) -> dict[str, Any] | None:
    """The ``model`` field from a result row that carries :data:`REF_COLUMNS`."""
    return model_ref(
        trial_id,
        sha256=row.model_sha256,
        size_bytes=row.model_size_bytes,
        reproducible=row.model_reproducible,
    )


def model_refs(session: Session, trial_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The ``model`` field of each of ``trial_ids`` that has a kept model (one query)."""
    ids = list(trial_ids)
    if not ids:
        return {}
    rows = session.execute(select(*REF_COLUMNS).where(ModelArtifact.trial_id.in_(ids))).all()
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        ref = row_ref(r.model_trial_id, r)
        if ref is not None:
            out[r.model_trial_id] = ref
    return out
