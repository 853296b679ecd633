"""``/api/v1/trials``: one trial's details, its metric history, and its kept model and card."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from api.deps import ArtifactStoreDep, ReadEngineDep, ViewerDep
from api.errors import problem_responses
from api.schemas import MetricHistory, TrialDetail
from sweeper.artifacts.reads import MEDIA_TYPE, kept_model, read_card, read_model
from sweeper.sweeps.trial_detail import metric_history, trial_detail

router = APIRouter(prefix="/trials", tags=["trials"])

_HEADER = {"schema": {"type": "string"}, "required": True}
_DIGEST_HEADERS = {
    "ETag": {**_HEADER, "description": 'the file\'s SHA-256 in hex, quoted: "<hex>"'},
    "Repr-Digest": {**_HEADER, "description": "RFC 9530: sha-256=:<base64 of the SHA-256>:"},
    "Digest": {**_HEADER, "description": "RFC 3230 (older clients): sha-256=<base64>"},
}
NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "not modified: the client's If-None-Match is the file's ETag"}
}
MODEL_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the trained weights, as safetensors (tensors only; loading runs no code)",
        "content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        "headers": {
            **_DIGEST_HEADERS,
            "Content-Disposition": {
                **_HEADER,
                "description": "attachment; filename=dpsweep-<trial>.safetensors",
            },
        },
    },
    **NOT_MODIFIED,
    **problem_responses(401, 404, 500),
}
CARD_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the model card, exactly as stored beside the model",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "additionalProperties": True,
                    "description": "dataset, architecture, strategy and hyperparameters, the "
                    "privacy of the release (epsilon, delta, accountant, sigma, q, T), the "
                    "evaluation data, metrics and the dpsweep version",
                }
            }
        },
        "headers": _DIGEST_HEADERS,
    },
    **NOT_MODIFIED,
    **problem_responses(401, 404, 500),
}


def digest_headers(sha256_hex: str) -> dict[str, str]:
    """The ``ETag``, ``Repr-Digest`` and ``Digest`` headers of a file whose SHA-256 is given."""
    b64 = base64.b64encode(bytes.fromhex(sha256_hex)).decode("ascii")
    return {
        "ETag": f'"{sha256_hex}"',
        "Repr-Digest": f"sha-256=:{b64}:",
        "Digest": f"sha-256={b64}",
    }


def _not_modified(request: Request, etag: str) -> bool:
    """Whether the client's ``If-None-Match`` names ``etag`` (or is ``*``)."""
    raw = request.headers.get("if-none-match")
    if not raw:
        return False
    tags = {t.strip().removeprefix("W/") for t in raw.split(",")}
    return etag in tags or "*" in tags


@router.get(
    "/{trial_id}",
    response_model=TrialDetail,
    responses=problem_responses(401, 404),
    summary="A trial: parameters, planned noise, privacy charges, metrics, bins, trajectories",
)
def get_trial(engine: ReadEngineDep, viewer: ViewerDep, trial_id: str) -> Any:
    return JSONResponse(trial_detail(engine, trial_id, viewer))


@router.get(
    "/{trial_id}/metrics",
    response_model=MetricHistory,
    responses=problem_responses(401, 404),
    summary="A trial's evaluation history (one metric with ?name=, else all)",
)
def get_metrics(
    engine: ReadEngineDep,
    viewer: ViewerDep,
    trial_id: str,
    name: Annotated[str | None, Query(max_length=64)] = None,
) -> Any:
    return JSONResponse(metric_history(engine, trial_id, viewer, name=name))


@router.get(
    "/{trial_id}/model",
    response_class=Response,
    responses=MODEL_RESPONSES,
    summary="A trial's kept model: its best checkpoint's weights as safetensors",
)
def get_model(
    request: Request,
    engine: ReadEngineDep,
    viewer: ViewerDep,
    store: ArtifactStoreDep,
    trial_id: str,
) -> Response:
    """The weights of the checkpoint the trial's metrics describe, checked against the
    content hash recorded when they were written (a mismatch is a 500, never other bytes).

    404 for a trial the caller does not see (someone else's, or a papernot-steinke run that
    was not released), and for a visible trial whose model is not kept (the detail says why).
    Rebuild the module with the card's ``model`` section
    (``dpsweep.Client.trial(id).load_model()`` does both).
    """
    kept = kept_model(engine, trial_id, viewer)
    headers = digest_headers(kept.sha256) | {"Cache-Control": "private, no-cache"}
    if _not_modified(request, headers["ETag"]):
        return Response(status_code=304, headers=headers)
    data = read_model(store, kept)
    headers["Content-Disposition"] = f"attachment; filename={kept.filename}"
    return Response(data, media_type=MEDIA_TYPE, headers=headers)


@router.get(
    "/{trial_id}/model-card",
    response_class=Response,
    responses=CARD_RESPONSES,
    summary="A kept model's card: data, architecture, hyperparameters, privacy, metrics",
)
def get_model_card(
    request: Request,
    engine: ReadEngineDep,
    viewer: ViewerDep,
    store: ArtifactStoreDep,
    trial_id: str,
) -> Response:
    """The model card stored beside the model (JSON, byte for byte as written, checked
    against its recorded hash). 404 exactly as for the model."""
    kept = kept_model(engine, trial_id, viewer)
    headers = digest_headers(kept.card_sha256) | {"Cache-Control": "private, no-cache"}
    if _not_modified(request, headers["ETag"]):
        return Response(status_code=304, headers=headers)
    return Response(read_card(store, kept), media_type="application/json", headers=headers)
