"""``/api/v1/trials``: one trial's details and its metric history."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from api.deps import ReadEngineDep, ViewerDep
from api.errors import problem_responses
from api.schemas import MetricHistory, TrialDetail
from sweeper.sweeps.trial_detail import metric_history, trial_detail

router = APIRouter(prefix="/trials", tags=["trials"])


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
