"""``/api/v1/sweeps``: submit (and dry-run), list, read, cancel, results, fronts, events."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api import idempotency
from api.deps import (
    ArtifactStoreDep,
    Cursor,
    EngineDep,
    Limit,
    PlannerDep,
    ReadEngineDep,
    SettingsDep,
    ViewerDep,
    page_size,
)
from api.errors import PROBLEM, exception_body, problem_responses
from api.live import event_stream
from api.schemas import (
    CancelOut,
    ParetoOut,
    PlanGrid,
    PlanOut,
    ResultsOut,
    SweepOut,
    SweepPage,
    TrialPage,
)
from api.settings import ApiSettings
from api.spec_body import check_limits, parse_spec, read_body
from api.views import pareto
from dpsweep.errors import ConfigError, DpsweepError
from dpsweep.spec import SweepSpec
from sweeper.privacy.charges import exact_sum
from sweeper.sweeps.admission import Admission, admit, public_data_error
from sweeper.sweeps.checkpoints import pin_checkpoint
from sweeper.sweeps.create import (
    check_before_reserving,
    create_sweep,
    dataset_key,
    planning_dataset,
)
from sweeper.sweeps.deletion import delete_sweep
from sweeper.sweeps.lifecycle import cancel_sweep
from sweeper.sweeps.stored import TERMINAL_SWEEPS
from sweeper.sweeps.sweep_pages import check_sweep, check_sweep_owner, page_sweeps, sweep_head
from sweeper.sweeps.trial_pages import page_trials

router = APIRouter(prefix="/sweeps", tags=["sweeps"])

SPEC_BODY = {
    "requestBody": {
        "required": True,
        "description": "a sweep spec, as JSON or YAML (its fields: docs/spec.md)",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/SweepSpec"}},
            "application/yaml": {"schema": {"$ref": "#/components/schemas/SweepSpec"}},
        },
    }
}
TERMINAL = {s.value for s in TERMINAL_SWEEPS}
NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "not modified: the client's If-None-Match is this version's ETag"}
}


def _prepare(
    engine: Any, planner: Any, viewer: Any, spec: SweepSpec, settings: ApiSettings
) -> tuple[Admission, Any]:
    """The one check and the plan, shared by the dry run and the submission (they answer
    the same): limits, access, the grant's terms and the owner's view, the checkpoint (a
    registered name, never a path: resolved and its digest pinned in the spec), then the plan
    of the effective spec. The admission returned carries the pinned spec."""
    check_limits(spec, settings.max_trials_per_sweep)
    admission = admit(engine, spec, viewer)
    where = settings.checkpoints_dir
    spec = pin_checkpoint(admission.spec, checkpoints_dir=where, allow_paths=False)
    admission = replace(admission, spec=spec)
    try:
        # Loader names pass through; uploads, registered names, a public evaluation dataset
        # and the public datasets arms tune on are looked up in the catalog.
        prepared = planner.prepare(
            spec, dataset=planning_dataset(engine, spec), checkpoints_dir=where
        )
    except DpsweepError as exc:
        public = public_data_error(exc, admission)
        if public is exc:
            raise
        raise public from None
    return admission, prepared


def _summary(request: Request, engine: Any, sweep_id: str, viewer: Any) -> dict[str, Any]:
    # After a create: the new sweep's summary (and its entry in the cache), as the viewer
    # receives it (an analyst's times are coarse).
    head = sweep_head(engine, sweep_id, viewer)
    entry = request.app.state.summaries.get_for(engine, sweep_id, head)
    summary: dict[str, Any] = entry.summary_for(analyst=head.analyst)[0]
    return summary


@router.post(
    "",
    status_code=201,
    response_model=SweepOut,
    openapi_extra=SPEC_BODY,
    responses=problem_responses(401, 409, 413, 415, 422),
    summary="Submit a sweep: validate, plan, reserve its budget and queue it",
)
async def create(
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    planner: PlannerDep,
    viewer: ViewerDep,
    idempotency_key: Annotated[
        str | None,
        Header(description="retrying with the same key replays the first response"),
    ] = None,
) -> Response:
    body = await read_body(request, settings.max_spec_bytes)
    ctype = request.headers.get("content-type", "")
    key = idempotency.check_key(idempotency_key) if idempotency_key is not None else None

    def work() -> Response:
        owner = viewer.owner or ""
        if key is not None:
            digest = hashlib.sha256(ctype.encode() + b"\0" + body).hexdigest()
            replay = idempotency.claim(
                engine,
                owner=owner,
                key=key,
                request_hash=digest,
                wait_seconds=settings.idempotency_wait_seconds,
            )
            if replay is not None:
                headers = {"Idempotent-Replayed": "true"}
                if replay.location:
                    headers["Location"] = replay.location
                media = "application/json" if replay.status < 400 else PROBLEM
                return Response(
                    replay.body, status_code=replay.status, headers=headers, media_type=media
                )
        try:
            spec = parse_spec(ctype, body)
            admission, prepared = _prepare(engine, planner, viewer, spec, settings)
            sweep_id = create_sweep(
                engine,
                admission.spec,
                owner=viewer.owner,
                prepared=prepared,
                artifact_quota_mb=settings.artifact_quota_mb,
                checkpoints_dir=settings.checkpoints_dir,
            )
            summary = _summary(request, engine, sweep_id, viewer)
        except DpsweepError as exc:
            if key is not None:
                status, problem_body = exception_body(exc)
                idempotency.complete(
                    engine,
                    owner=owner,
                    key=key,
                    status=status,
                    body=json.dumps(problem_body),
                    location=None,
                )
            raise
        except BaseException:
            if key is not None:
                idempotency.complete(
                    engine, owner=owner, key=key, status=500, body="", location=None
                )
            raise
        location = f"/api/v1/sweeps/{sweep_id}"
        text = json.dumps(summary)
        if key is not None:
            idempotency.complete(
                engine, owner=owner, key=key, status=201, body=text, location=location
            )
        return Response(
            text, status_code=201, headers={"Location": location}, media_type="application/json"
        )

    return await run_in_threadpool(work)


@router.post(
    ":plan",
    response_model=PlanOut,
    openapi_extra=SPEC_BODY,
    responses=problem_responses(401, 413, 415, 422),
    summary="Dry run: plan a spec (noise per grid, cost) and store nothing",
)
async def plan(
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    planner: PlannerDep,
    viewer: ViewerDep,
) -> dict[str, Any]:
    body = await read_body(request, settings.max_spec_bytes)
    ctype = request.headers.get("content-type", "")

    def work() -> dict[str, Any]:
        admission, prepared = _prepare(engine, planner, viewer, parse_spec(ctype, body), settings)
        spec = admission.spec
        # What a submission checks after planning, read-only: the tenant's quota of kept
        # models, and an analyst's allowance (their own use; never the lifetime cap's figures).
        check_before_reserving(
            engine,
            spec,
            prepared,
            admission,
            owner=viewer.owner,
            artifact_quota_mb=settings.artifact_quota_mb,
        )
        grids = [
            PlanGrid.of(
                g, epsilon_reserved=sched.reserved_epsilon, delta_reserved=sched.reserved_delta
            )
            for g, sched in zip(prepared.plan.grids, prepared.schedules, strict=True)
        ]
        e: Decimal = exact_sum([s.reserved_epsilon for s in prepared.schedules])
        d: Decimal = exact_sum([s.reserved_delta for s in prepared.schedules])
        return {
            "name": spec.name,
            "dataset": dataset_key(spec),
            "grids": grids,
            "trials": sum(g.trials for g in prepared.plan.grids),
            "epsilon_reserved": float(e),
            "delta_reserved": float(d),
        }

    return await run_in_threadpool(work)


@router.get(
    "",
    response_model=SweepPage,
    responses=problem_responses(401, 422),
    summary="Your sweeps, newest first",
)
def list_sweeps(
    engine: ReadEngineDep,
    settings: SettingsDep,
    viewer: ViewerDep,
    state: Annotated[str | None, Query(max_length=32)] = None,
    limit: Limit = None,
    cursor: Cursor = None,
) -> dict[str, Any]:
    page = page_sweeps(engine, viewer, state=state, limit=page_size(limit, settings), cursor=cursor)
    return {"items": page.items, "next_cursor": page.next_cursor}


def _cached(request: Request, entry: Any, body: bytes, viewer: Any) -> Response:
    """The body, or 304 when the client already has this version (ETag / If-None-Match).

    The ETag is opaque and the viewer's own (:meth:`api.views.Entry.etag_for`): the version
    it stands for is made of global counters, which would tell a tenant how much others did.
    """
    etag = entry.etag_for(viewer)
    headers = {"ETag": etag} if etag else {}
    if etag and etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


@router.get(
    "/{sweep_id}",
    response_model=SweepOut,
    responses={**NOT_MODIFIED, **problem_responses(401, 404)},
)
async def get_sweep(
    request: Request, engine: ReadEngineDep, viewer: ViewerDep, sweep_id: str
) -> Response:
    # The reads of a route go to one worker thread together (one hop per request).
    def work() -> Response:
        head = sweep_head(engine, sweep_id, viewer)
        entry = request.app.state.summaries.get_for(engine, sweep_id, head)
        return _cached(request, entry, entry.summary_for(analyst=head.analyst)[1], viewer)

    return await run_in_threadpool(work)


@router.post(
    "/{sweep_id}/cancel",
    response_model=CancelOut,
    responses=problem_responses(401, 403, 404, 409),
    summary="Cancel a pending or running sweep (409 once it has finished)",
)
def cancel(engine: EngineDep, viewer: ViewerDep, sweep_id: str) -> dict[str, Any]:
    """Unstarted trials release their reservation; running ones stop and stay charged.

    papernot-steinke grids are not counted (their number of runs is secret): those whose
    search had started stay charged in full and release nothing unless their search had
    already completed; ``papernot_steinke`` says so.
    """
    check_sweep_owner(engine, sweep_id, viewer)
    out = cancel_sweep(engine, sweep_id)
    return {"id": sweep_id, "state": "cancelled", **out}


@router.delete(
    "/{sweep_id}",
    status_code=204,
    response_class=Response,
    responses={
        204: {"description": "deleted: its trials, results and kept models are gone"},
        **problem_responses(401, 403, 404, 409, 500),
    },
    summary="Delete an ended sweep and its kept models (what it spent stays spent)",
)
def delete(
    engine: EngineDep, viewer: ViewerDep, store: ArtifactStoreDep, sweep_id: str
) -> Response:
    """Delete a done, failed or cancelled sweep: its trials, metrics, events and kept models.

    Its privacy spend is never given back: the dataset's ledger keeps every charge, so its
    lifetime spend and remaining budget do not change. 409 while it is pending or running
    (cancel it first).
    """
    delete_sweep(engine, sweep_id, viewer, store=store)
    return Response(status_code=204)


@router.get(
    "/{sweep_id}/results",
    response_model=ResultsOut,
    responses={**NOT_MODIFIED, **problem_responses(401, 404)},
    summary="The best configuration per arm and epsilon level",
)
async def results(request: Request, engine: ReadEngineDep, viewer: ViewerDep, sweep_id: str) -> Any:
    def work() -> Response:
        entry = request.app.state.summaries.get(engine, sweep_id, viewer)
        s = entry.summary
        body = entry.body(
            ("results", None),
            lambda: {
                "id": sweep_id,
                "state": s["state"],
                "objective": s["objective"],
                "results": s["results"],
            },
        )
        return _cached(request, entry, body, viewer)

    return await run_in_threadpool(work)


@router.get(
    "/{sweep_id}/pareto",
    response_model=ParetoOut,
    responses={
        304: {"description": "not modified (If-None-Match)"},
        **problem_responses(401, 404, 422),
    },
    summary="A Pareto front: epsilon vs a metric, or a metric vs another (accuracy vs ece)",
)
async def get_pareto(
    request: Request,
    engine: ReadEngineDep,
    viewer: ViewerDep,
    sweep_id: str,
    x: Annotated[str, Query(max_length=64, description="epsilon, or a metric")] = "epsilon",
    y: Annotated[str | None, Query(max_length=64, description="a metric")] = None,
) -> Any:
    def work() -> Response:
        entry = request.app.state.summaries.get(engine, sweep_id, viewer)
        body = entry.body(("pareto", f"{x}\0{y}"), lambda: pareto(entry, sweep_id, x=x, y=y))
        return _cached(request, entry, body, viewer)

    return await run_in_threadpool(work)


@router.get(
    "/{sweep_id}/trials",
    response_model=TrialPage,
    responses=problem_responses(401, 404, 422),
    summary="A sweep's trials: filter by arm, level and state; sort by grid order or objective",
)
async def list_trials(
    request: Request,
    engine: ReadEngineDep,
    settings: SettingsDep,
    viewer: ViewerDep,
    sweep_id: str,
    arm: Annotated[str | None, Query(max_length=200)] = None,
    level: Annotated[float | None, Query(description="epsilon level", allow_inf_nan=False)] = None,
    state: Annotated[str | None, Query(max_length=32)] = None,
    sort: Annotated[str, Query(description="number or objective")] = "number",
    limit: Limit = None,
    cursor: Cursor = None,
) -> Any:
    size = page_size(limit, settings)

    def make() -> dict[str, Any]:
        page = page_trials(
            engine,
            sweep_id,
            viewer,
            arm=arm,
            level=level,
            state=state,
            sort=sort,
            limit=size,
            cursor=cursor,
        )
        return {"items": page.items, "next_cursor": page.next_cursor}

    def work() -> bytes:
        # A finished sweep's pages are encoded once per version (api.page_cache).
        head = sweep_head(engine, sweep_id, viewer)
        query = (arm, level, state, sort, size, cursor)
        return request.app.state.trial_pages.get(sweep_id, head, query, make)

    return Response(await run_in_threadpool(work), media_type="application/json")


@router.get(
    "/{sweep_id}/events",
    responses={
        200: {
            "content": {
                "text/event-stream": {
                    "schema": {
                        "description": "one event; its data is a JSON object",
                        "type": "object",
                        "required": ["data"],
                        "properties": {
                            "id": {"type": "string"},
                            "event": {"type": "string", "enum": ["sweep", "trial", "metric"]},
                            "data": {"type": "string"},
                            "retry": {"type": "integer"},
                        },
                    }
                }
            },
            "description": "server-sent events: sweep, trial and metric",
        },
        **problem_responses(401, 404),
    },
    summary="Live events (SSE); resume with Last-Event-ID; ends when the sweep ends",
    response_class=StreamingResponse,
)
async def events(
    request: Request,
    engine: ReadEngineDep,
    settings: SettingsDep,
    viewer: ViewerDep,
    sweep_id: str,
    last_event_id: Annotated[str | None, Header(max_length=32)] = None,
    after: Annotated[
        int | None, Query(ge=0, le=2**63 - 1, description="like Last-Event-ID")
    ] = None,
) -> StreamingResponse:
    await run_in_threadpool(check_sweep, engine, sweep_id, viewer)
    start = after or 0
    if last_event_id:
        if not last_event_id.strip().isdigit() or int(last_event_id.strip()) > 2**63 - 1:
            raise ConfigError(
                "Last-Event-ID must be the id of an event of this stream",
                field="Last-Event-ID",
            )
        start = int(last_event_id.strip())

    return StreamingResponse(
        event_stream(request, engine, settings, viewer, sweep_id, start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
