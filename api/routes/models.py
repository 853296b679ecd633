"""``/api/v1/trials/{id}/model`` and ``/model-card``: a trial's kept model and its card.

Owner only, as every read: someone else's trial (or an unreleased papernot-steinke run) is
"not found"; a visible trial whose model is not kept is a 404 whose detail says why
(:func:`sweeper.artifacts.reads.kept_model`). The bytes are checked against the content hash
recorded when they were written before they are served.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from api.deps import ReadEngineDep, ViewerDep
from api.errors import problem_responses
from sweeper.artifacts.reads import MEDIA_TYPE, kept_model, read_card, read_model
from sweeper.artifacts.store import ArtifactStore, open_store

router = APIRouter(prefix="/trials", tags=["trials"])


def _store(request: Request) -> ArtifactStore:
    """The app's artifact store (settings, else beside its SQLite file), opened once."""
    state = request.app.state
    store: ArtifactStore | None = getattr(state, "artifact_store", None)
    if store is None:
        store = open_store(state.settings.artifact_url, database_url=state.database_url)
        state.artifact_store = store
    return store


@router.get(
    "/{trial_id}/model",
    response_class=Response,
    responses={
        200: {"content": {MEDIA_TYPE: {}}, "description": "The model's weights (safetensors)"},
        **problem_responses(401, 404, 500),
    },
    summary="A trial's kept model: its best checkpoint's weights as safetensors",
)
def get_model(engine: ReadEngineDep, viewer: ViewerDep, request: Request, trial_id: str) -> Any:
    kept = kept_model(engine, trial_id, viewer)
    data = read_model(_store(request), kept)
    return Response(
        data,
        media_type=MEDIA_TYPE,
        headers={
            "Content-Disposition": f'attachment; filename="{kept.filename}"',
            "ETag": f'"{kept.sha256}"',
        },
    )


@router.get(
    "/{trial_id}/model-card",
    response_class=Response,
    responses={
        200: {"content": {"application/json": {}}, "description": "The model card (JSON)"},
        **problem_responses(401, 404, 500),
    },
    summary="A kept model's card: data, architecture, privacy guarantee, evaluation, metrics",
)
def get_model_card(
    engine: ReadEngineDep, viewer: ViewerDep, request: Request, trial_id: str
) -> Any:
    kept = kept_model(engine, trial_id, viewer)
    # The stored bytes, as kept beside the model (so a download matches the store's file).
    return Response(read_card(_store(request), kept), media_type="application/json")
