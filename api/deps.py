"""Shared dependencies of the routes: the engine, settings, planner, viewer, page size."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request
from sqlalchemy import Engine

from api.auth import current_viewer
from api.planning import Planner
from api.settings import ApiSettings
from sweeper.datasets.access import Viewer


def engine(request: Request) -> Engine:
    return request.app.state.engine


def read_engine(request: Request) -> Engine:
    """The engine for routes that only read (no write lock on SQLite)."""
    return request.app.state.read_engine


def settings(request: Request) -> ApiSettings:
    return request.app.state.settings


def planner(request: Request) -> Planner:
    return request.app.state.planner


EngineDep = Annotated[Engine, Depends(engine)]
ReadEngineDep = Annotated[Engine, Depends(read_engine)]
SettingsDep = Annotated[ApiSettings, Depends(settings)]
PlannerDep = Annotated[Planner, Depends(planner)]
ViewerDep = Annotated[Viewer, Depends(current_viewer)]
Limit = Annotated[int | None, Query(ge=1, le=10000, description="page size")]
Cursor = Annotated[str | None, Query(max_length=2000, description="from a previous page")]


def page_size(limit: int | None, s: ApiSettings) -> int:
    """The page size asked for, capped by the server's maximum."""
    return min(limit or s.page_size, s.max_page_size)
