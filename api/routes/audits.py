"""``/api/v1/audits``: canary audits of a run's epsilon (start one, read one, list them).

``POST`` checks the request at the edge (:class:`dpsweep.audit.AuditRequest`, then its
cross-field check and the run's settings), refuses anyone but the dataset's owner (an
analyst with a grant: 403), charges a private dataset the claimed epsilon once the request
says ``confirm: true``, stores the audit and trains it in a background thread of this
process: 201 with state ``running`` and its ``Location``; ``GET`` it until ``succeeded``
(``result``) or ``failed`` (a fixed public ``error``). A refused request stores and charges
nothing; one that would be charged but is not confirmed is a 422 naming ``confirm`` whose
``cost`` says what it would charge. ``POST /audits/quote`` answers that cost (200) for the
same body, checked the same way, without starting anything.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api.deps import Cursor, EngineDep, Limit, ReadEngineDep, SettingsDep, ViewerDep, page_size
from api.errors import PROBLEM, exception_body, problem_responses
from dpsweep.audit import AuditRequest
from sweeper.audits import (
    AuditNotConfirmed,
    get_audit,
    page_audits,
    quote_audit,
    start_audit,
)

router = APIRouter(prefix="/audits", tags=["audits"])


@router.post(
    "",
    status_code=201,
    responses=problem_responses(400, 401, 403, 404, 409, 422),
    summary="Start a canary audit: an epsilon lower bound beside the claimed epsilon",
)
async def create_audit(engine: EngineDep, viewer: ViewerDep, body: AuditRequest) -> Response:
    try:
        audit = await run_in_threadpool(start_audit, engine, body, viewer, background=True)
    except AuditNotConfirmed as exc:
        # The problem's extension member: the cost, so that a client can show it and ask.
        status, problem = exception_body(exc)
        problem["cost"] = exc.cost.to_dict()
        return JSONResponse(problem, status_code=status, media_type=PROBLEM)
    return Response(
        json.dumps(audit),
        status_code=201,
        headers={"Location": f"/api/v1/audits/{audit['id']}"},
        media_type="application/json",
    )


@router.post(
    "/quote",
    responses=problem_responses(400, 401, 403, 404, 422),
    summary="What an audit would charge (nothing is started, reserved or stored)",
)
async def quote(engine: EngineDep, viewer: ViewerDep, body: AuditRequest) -> dict[str, Any]:
    cost = await run_in_threadpool(quote_audit, engine, body, viewer)
    return cost.to_dict()


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
