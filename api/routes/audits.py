"""``/api/v1/audits``: canary audits of a run's epsilon (start one, read one, list them).

``POST`` checks the request at the edge (:class:`dpsweep.audit.AuditRequest`, then its
cross-field check and the run's settings), refuses anyone but the dataset's owner (an
analyst with a grant: 403), charges a private dataset the claimed epsilon, stores the audit
and trains it in a background thread of this process: 201 with state ``running`` and its
``Location``; ``GET`` it until ``succeeded`` (``result``) or ``failed`` (a fixed public
``error``). A refused request stores and charges nothing.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api.deps import Cursor, EngineDep, Limit, ReadEngineDep, SettingsDep, ViewerDep, page_size
from api.errors import problem_responses
from dpsweep.audit import AuditRequest
from sweeper.audits import get_audit, page_audits, start_audit

router = APIRouter(prefix="/audits", tags=["audits"])


@router.post(
    "",
    status_code=201,
    responses=problem_responses(401, 403, 404, 409, 422),
    summary="Start a canary audit: an epsilon lower bound beside the claimed epsilon",
)
async def create_audit(engine: EngineDep, viewer: ViewerDep, body: AuditRequest) -> Response:
    audit = await run_in_threadpool(start_audit, engine, body, viewer, background=True)
    return Response(
        json.dumps(audit),
        status_code=201,
        headers={"Location": f"/api/v1/audits/{audit['id']}"},
        media_type="application/json",
    )


@router.get("", responses=problem_responses(401, 422), summary="Your audits, newest first")
def list_audits(
    engine: ReadEngineDep,
    settings: SettingsDep,
    viewer: ViewerDep,
    trial: Annotated[str | None, Query(max_length=64)] = None,
    sweep: Annotated[str | None, Query(max_length=64)] = None,
    limit: Limit = None,
    cursor: Cursor = None,
) -> dict[str, Any]:
    page = page_audits(
        engine,
        viewer,
        trial=trial,
        sweep=sweep,
        limit=page_size(limit, settings),
        cursor=cursor,
    )
    return {"items": page.items, "next_cursor": page.next_cursor}


@router.get("/{audit_id}", responses=problem_responses(401, 404), summary="One audit")
def read_audit(engine: ReadEngineDep, viewer: ViewerDep, audit_id: str) -> Any:
    return JSONResponse(get_audit(engine, audit_id, viewer))
