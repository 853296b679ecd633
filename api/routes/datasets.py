"""``/api/v1/datasets``: built-in sets and uploads, and their lifetime budgets.

Uploads are multipart (``file`` plus form fields). The size limit is enforced while the body
streams in, so an oversized upload is refused (413) without being held in memory or stored.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from api.deps import (
    Cursor,
    EngineDep,
    Limit,
    ReadEngineDep,
    SettingsDep,
    ViewerDep,
    page_size,
)
from api.errors import ApiError, problem_responses
from api.grant_schemas import AuditPage, GrantIn, GrantList, GrantOut, PolicyIn, PolicyOut
from api.schemas import AnalystBudgetOut, BudgetOut, CapsIn, DatasetList, DatasetOut
from dpsweep.errors import ConfigError
from sweeper.datasets import grants
from sweeper.datasets.analyst_views import audit_page, dataset_policy, update_policy
from sweeper.datasets.names import upload_format_of
from sweeper.datasets.uploads import store_upload
from sweeper.datasets.views import budget, describe, set_caps
from sweeper.datasets.views import list_datasets as visible_datasets

router = APIRouter(prefix="/datasets", tags=["datasets"])

INT64_MAX = 2**63 - 1

UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        # The uploadable formats are the dataset registry's (plug-ins
                        # included, loaded when first used), so no enum is fixed here.
                        "format": {
                            "type": "string",
                            "description": "the file's format (csv, npz or a plug-in's "
                            "uploadable format); default: told from the file's suffix",
                        },
                        "label_column": {"type": "string"},
                        "privacy_unit": {
                            "type": "string",
                            "description": "the column (csv) or array (npz) saying whose "
                            "each row is, e.g. patient_id: every epsilon then protects a "
                            "whole unit; fixed for every sweep (default: none, each row its "
                            "own unit)",
                        },
                        "name": {"type": "string"},
                        "epsilon_cap": {"type": "number", "minimum": 0},
                        "delta_cap": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                        "declare_counted": {
                            "type": "boolean",
                            "description": "declare the counted number of records, class "
                            "list and feature shape (and number of privacy units) public "
                            "(needed before granting analysts; or later, with PUT .../policy)",
                        },
                    },
                }
            }
        },
    }
}


def _flag(form: Any, name: str) -> bool:
    raw = str(form.get(name) or "").strip().lower()
    if raw in ("", "false", "0"):
        return False
    if raw in ("true", "1"):
        return True
    raise ConfigError(f"{name} must be true or false; got {raw!r}", field=name)


def _float(form: Any, name: str) -> float | None:
    raw = form.get(name)
    if raw is None or raw == "":
        return None
    text = str(raw).strip()
    try:
        if "_" in text:  # float() accepts 1_0; a cap written so is a typo, not ten
            raise ValueError
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name} must be a number; got {raw!r}", field=name) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"{name} must be finite; got {raw!r}", field=name)
    return value


@router.get(
    "", response_model=DatasetList, responses=problem_responses(401), summary="Datasets you can use"
)
def list_datasets(engine: ReadEngineDep, viewer: ViewerDep) -> Any:
    return JSONResponse({"items": visible_datasets(engine, viewer)})


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    openapi_extra=UPLOAD_BODY,
    responses={
        200: {
            "model": DatasetOut,
            "description": "the same file and settings as an earlier upload of yours: that upload",
        },
        **problem_responses(401, 409, 413, 415, 422),
    },
    summary="Upload a CSV or NPZ dataset (multipart), optionally with lifetime caps; its "
    "answer's ledger says which of your datasets hold the same records (one ledger) and what "
    "they spent. The same file and settings again: 200 and the earlier upload",
)
async def upload(
    request: Request, engine: EngineDep, settings: SettingsDep, viewer: ViewerDep
) -> Any:
    limit = settings.max_upload_bytes
    declared = request.headers.get("content-length")
    too_big = ApiError(
        413,
        f"the upload is over the limit of {limit} bytes (DPSWEEP_MAX_UPLOAD_BYTES)",
        kind="too-large",
    )
    if declared and declared.isdigit() and int(declared) > limit + 64 * 1024:
        raise too_big
    ctype = request.headers.get("content-type", "")
    if not ctype.lower().startswith("multipart/form-data"):
        raise ApiError(
            415,
            "upload a dataset as multipart/form-data with a 'file' part (and 'format', "
            "'label_column' for CSV)",
            kind="unsupported-media-type",
        )
    received = 0
    receive = request.receive

    async def limited() -> Any:
        # Count bytes as they arrive: a body without Content-Length is cut off here too.
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit + 64 * 1024:
                raise too_big
        return message

    try:
        form = await Request(request.scope, limited).form(max_files=1, max_fields=16)
    except ApiError:
        raise
    except Exception as exc:  # malformed multipart, or a part over the limit
        if "size" in str(exc).lower() or "exceed" in str(exc).lower():
            raise too_big from None
        raise ConfigError(f"malformed multipart body: {exc}", field="file") from None
    try:
        file = form.get("file")
        if not isinstance(file, UploadFile):
            raise ConfigError("the upload needs a 'file' part with the data", field="file")
        content = await file.read(limit + 1)
        if len(content) > limit:
            raise too_big
        filename = (file.filename or "upload").rsplit("/", 1)[-1][:200]
        fmt = str(form.get("format") or upload_format_of(filename))
        label_column = form.get("label_column")
        unit = form.get("privacy_unit")
        name = form.get("name")
        eps_cap, delta_cap = _float(form, "epsilon_cap"), _float(form, "delta_cap")
        declare = _flag(form, "declare_counted")
    finally:
        await form.close()
    out = await run_in_threadpool(
        lambda: store_upload(
            engine,
            owner=viewer.owner,
            content=content,
            fmt=fmt,
            data_dir=settings.data_dir,
            filename=filename,
            label=str(name) if name else None,
            label_column=str(label_column) if label_column else None,
            epsilon_cap=eps_cap,
            delta_cap=delta_cap,
            declare_counted=declare,
            privacy_unit=str(unit) if unit else None,
            # Admins see every owner's datasets: their answer names other owners' of the
            # same records too (auth off: the local user is one).
            admin=viewer.admin,
        )
    )
    # The same file and settings uploaded again: the earlier upload, nothing new created.
    status = 200 if out["ledger"]["existing"] else 201
    location = {"Location": f"/api/v1/datasets/{out['id']}"}
    return JSONResponse(out, status_code=status, headers=location)


@router.get(
    "/{dataset_id}",
    response_model=DatasetOut,
    responses=problem_responses(401, 404),
    summary="One dataset (never its data); an analyst sees its public description only",
)
def get_dataset(engine: ReadEngineDep, viewer: ViewerDep, dataset_id: str) -> Any:
    return JSONResponse(describe(engine, dataset_id, viewer))


@router.get(
    "/{dataset_id}/budget",
    response_model=BudgetOut | AnalystBudgetOut,
    responses=problem_responses(401, 404),
    summary="Lifetime budget: caps, committed, reserved, remaining, and the sweeps that spent it "
    "(an analyst: their allowance, use and sweeps)",
)
def get_budget(engine: ReadEngineDep, viewer: ViewerDep, dataset_id: str) -> Any:
    return JSONResponse(budget(engine, dataset_id, viewer))


@router.put(
    "/{dataset_id}/budget",
    response_model=BudgetOut,
    responses=problem_responses(400, 401, 403, 404, 422),
    summary="Set lifetime caps (null: no cap); never below what is committed and reserved",
)
def put_budget(
    engine: EngineDep, viewer: ViewerDep, dataset_id: str, caps: Annotated[CapsIn, ...]
) -> Any:
    return JSONResponse(
        set_caps(
            engine,
            dataset_id,
            viewer,
            epsilon_cap=caps.epsilon_cap,
            delta_cap=caps.delta_cap,
        )
    )


# -- data owners and analysts -------------------------------------------------------------------


@router.post(
    "/{dataset_id}/grants",
    status_code=201,
    response_model=GrantOut,
    responses=problem_responses(400, 401, 403, 404, 422),
    summary="Grant an analyst (another tenant) access with an ε allowance (the owner); "
    "replaces their current grant",
)
def post_grant(
    engine: EngineDep, viewer: ViewerDep, dataset_id: str, body: Annotated[GrantIn, ...]
) -> Any:
    g = grants.grant(
        engine,
        dataset_id,
        body.analyst,
        # The decimal the client wrote (0.1, not the float's binary expansion).
        epsilon_allowance=Decimal(repr(body.epsilon_allowance)),
        viewer=viewer,
        note=body.note or "",
        confirm=body.confirm,
    )
    location = f"/api/v1/datasets/{dataset_id}/grants/{g['analyst']}"
    return JSONResponse(g, status_code=201, headers={"Location": location})


@router.get(
    "/{dataset_id}/grants",
    response_model=GrantList,
    responses=problem_responses(401, 404),
    summary="Grants with each analyst's use (the owner); an analyst: their own, newest first",
)
def get_grants(engine: ReadEngineDep, viewer: ViewerDep, dataset_id: str) -> Any:
    return JSONResponse({"items": grants.list_grants(engine, dataset_id, viewer)})


@router.delete(
    "/{dataset_id}/grants/{analyst}",
    response_model=GrantOut,
    responses=problem_responses(401, 403, 404),
    summary="Revoke an analyst's grant (the owner): nothing new starts; what ran stays charged",
)
def delete_grant(engine: EngineDep, viewer: ViewerDep, dataset_id: str, analyst: str) -> Any:
    return JSONResponse(grants.revoke(engine, dataset_id, analyst, viewer=viewer))


@router.get(
    "/{dataset_id}/audit",
    response_model=AuditPage,
    responses=problem_responses(401, 404, 422),
    summary="The audit log of releases, oldest first (the owner: every one; an analyst: "
    "their own); read-only",
)
def get_audit(
    engine: ReadEngineDep,
    settings: SettingsDep,
    viewer: ViewerDep,
    dataset_id: str,
    limit: Limit = None,
    cursor: Cursor = None,
    after: Annotated[
        int | None,
        Query(ge=0, le=INT64_MAX, description="only entries after the one with this id"),
    ] = None,
    analyst: Annotated[
        str | None, Query(max_length=200, description="only this analyst's entries")
    ] = None,
) -> Any:
    page = audit_page(
        engine,
        dataset_id,
        viewer,
        analyst=analyst,
        after=after,
        cursor=cursor,
        limit=page_size(limit, settings),
    )
    return JSONResponse({"items": page.items, "next_cursor": page.next_cursor})


@router.get(
    "/{dataset_id}/policy",
    response_model=PolicyOut,
    responses=problem_responses(401, 404),
    summary="What analysts may use and see: evaluation modes and the public description",
)
def get_policy(engine: ReadEngineDep, viewer: ViewerDep, dataset_id: str) -> Any:
    return JSONResponse(dataset_policy(engine, dataset_id, viewer))


@router.put(
    "/{dataset_id}/policy",
    response_model=PolicyOut,
    responses=problem_responses(400, 401, 403, 404, 409, 422),
    summary="Set what analysts may use and see (the owner), and the privacy unit while the "
    "records' ledger has spent nothing (409 once it has)",
)
def put_policy(
    engine: EngineDep, viewer: ViewerDep, dataset_id: str, body: Annotated[PolicyIn, ...]
) -> Any:
    info = body.public_info.model_dump(exclude_unset=True) if body.public_info else None
    return JSONResponse(
        update_policy(
            engine,
            dataset_id,
            viewer,
            analyst_eval_modes=None
            if body.analyst_eval_modes is None
            else list(body.analyst_eval_modes),
            public_info=info,
            view=body.view.model_dump(exclude_unset=True) if body.view else None,
            declare_counted=body.declare_counted,
            set_unit="privacy_unit" in body.model_fields_set,
            privacy_unit=body.privacy_unit,
        )
    )
