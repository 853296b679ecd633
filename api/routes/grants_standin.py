"""A STAND-IN for the grant, policy and audit routes of issue 24, so that the dashboard's
panels can be tested in this branch. The lead deletes it at merge in favour of the real routes
(same paths and shapes); it calls the core functions directly and adds no rule of its own.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from api.deps import EngineDep, ReadEngineDep, ViewerDep
from api.errors import problem_responses
from dpsweep.errors import DatasetNotFound
from sweeper.datasets import grants
from sweeper.datasets.identity import view_key
from sweeper.privacy.release_log import read_log

router = APIRouter(prefix="/datasets", tags=["grants"])


class GrantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    analyst: str = Field(min_length=1, max_length=200)
    epsilon_allowance: float = Field(ge=0, allow_inf_nan=False)
    note: str = Field(default="", max_length=2000)


class PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    analyst_eval_modes: list[str] | None = None
    public_info: dict[str, Any] | None = None


def _role(engine: Any, dataset_id: str, viewer: Any) -> str:
    """``owner``, or ``analyst`` (who holds or held a grant); 404 for anyone else."""
    with Session(engine) as session:
        if grants.owns(viewer, grants.dataset_row(session, dataset_id)):
            return "owner"
    grants.list_grants(engine, dataset_id, viewer)  # DatasetNotFound without a grant
    return "analyst"


@router.post(
    "/{dataset_id}/grants",
    status_code=201,
    responses=problem_responses(400, 401, 403, 404, 422),
    summary="Grant an analyst access with an ε allowance (owner)",
)
def post_grant(engine: EngineDep, viewer: ViewerDep, dataset_id: str, body: GrantIn) -> Any:
    out = grants.grant(
        engine,
        dataset_id,
        body.analyst,
        epsilon_allowance=body.epsilon_allowance,
        viewer=viewer,
        note=body.note,
    )
    return JSONResponse(out, status_code=201)


@router.get(
    "/{dataset_id}/grants",
    responses=problem_responses(401, 404),
    summary="Grants with spending (the owner: all; an analyst: their own)",
)
def get_grants(engine: ReadEngineDep, viewer: ViewerDep, dataset_id: str) -> Any:
    return JSONResponse({"items": grants.list_grants(engine, dataset_id, viewer)})


@router.delete(
    "/{dataset_id}/grants/{analyst}",
    responses=problem_responses(401, 403, 404),
    summary="Revoke an analyst's grant (owner)",
)
def delete_grant(engine: EngineDep, viewer: ViewerDep, dataset_id: str, analyst: str) -> Any:
    return JSONResponse(grants.revoke(engine, dataset_id, analyst, viewer=viewer))


@router.get(
    "/{dataset_id}/audit",
    responses=problem_responses(401, 404, 422),
    summary="The release log, oldest first (the owner: everyone's; an analyst: their own)",
)
def get_audit(
    engine: ReadEngineDep,
    viewer: ViewerDep,
    dataset_id: str,
    after: Annotated[int | None, Query(ge=0, le=2**53)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> Any:
    everyone = _role(engine, dataset_id, viewer) == "owner"
    items = read_log(
        engine,
        view_key(engine, dataset_id),
        principal=viewer.owner,
        everyone=everyone,
        after=after,
        limit=limit,
    )
    nxt = str(items[-1]["id"]) if len(items) == limit else None
    return JSONResponse({"items": items, "next": nxt})


@router.get(
    "/{dataset_id}/policy",
    responses=problem_responses(401, 404),
    summary="The eval modes analysts may use and the owner's public description",
)
def get_policy(engine: ReadEngineDep, viewer: ViewerDep, dataset_id: str) -> Any:
    _role(engine, dataset_id, viewer)
    with Session(engine) as session:
        row = grants.dataset_row(session, dataset_id)
        if row is None:
            raise DatasetNotFound(f"no dataset {dataset_id!r}")
        return JSONResponse(grants.policy_view(row))


@router.put(
    "/{dataset_id}/policy",
    responses=problem_responses(400, 401, 403, 404, 422),
    summary="Set the eval modes analysts may use and the public description (owner)",
)
def put_policy(engine: EngineDep, viewer: ViewerDep, dataset_id: str, body: PolicyIn) -> Any:
    return JSONResponse(
        grants.set_policy(
            engine,
            dataset_id,
            viewer,
            analyst_eval_modes=body.analyst_eval_modes,
            public_info=body.public_info,
        )
    )
