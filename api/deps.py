"""Shared dependencies of the routes: the engine, settings, planner, viewer, page size, and
the artifact store."""

from __future__ import annotations

import logging
import threading
from typing import Annotated

from fastapi import Depends, Query, Request
from sqlalchemy import Engine

from api.auth import current_viewer
from api.errors import ApiError
from api.planning import Planner
from api.settings import ApiSettings
from dpsweep.errors import ConfigError
from sweeper.datasets.access import Viewer
from sweeper.store.artifact_files import ArtifactStore, open_store

log = logging.getLogger("dpsweep.api")
_store_lock = threading.Lock()


async def engine(request: Request) -> Engine:
    # The trivial dependencies are async: FastAPI runs a sync one in a worker thread, and a
    # thread hop per dependency is most of a cached read's cost under load.
    return request.app.state.engine


async def read_engine(request: Request) -> Engine:
    """The engine for routes that only read (no write lock on SQLite)."""
    return request.app.state.read_engine


async def settings(request: Request) -> ApiSettings:
    return request.app.state.settings


async def planner(request: Request) -> Planner:
    return request.app.state.planner


def artifact_store(request: Request) -> ArtifactStore:
    """The app's artifact store (``artifact_url``; default beside the SQLite file, as the
    driver's), opened on first use and then kept: one per app.

    Raises:
        ApiError: 500 when the configured store cannot be opened (the reason is logged, not
            sent: a store URL may name a bucket or carry credentials).
    """
    state = request.app.state
    store: ArtifactStore | None = getattr(state, "artifact_store", None)
    if store is not None:
        return store
    with _store_lock:
        store = getattr(state, "artifact_store", None)
        if store is None:
            try:
                store = open_store(state.settings.artifact_url, database_url=state.database_url)
            except ConfigError as exc:
                log.error("the artifact store cannot be opened: %s", exc)
                raise ApiError(
                    500,
                    "the artifact store is not available; the operator's log says why",
                    kind="artifact-store",
                ) from exc
            state.artifact_store = store
    return store


EngineDep = Annotated[Engine, Depends(engine)]
ReadEngineDep = Annotated[Engine, Depends(read_engine)]
SettingsDep = Annotated[ApiSettings, Depends(settings)]
PlannerDep = Annotated[Planner, Depends(planner)]
ViewerDep = Annotated[Viewer, Depends(current_viewer)]
ArtifactStoreDep = Annotated[ArtifactStore, Depends(artifact_store)]
Limit = Annotated[int | None, Query(ge=1, le=10000, description="page size")]
Cursor = Annotated[str | None, Query(max_length=2000, description="from a previous page")]


def page_size(limit: int | None, s: ApiSettings) -> int:
    """The page size asked for, capped by the server's maximum."""
    return min(limit or s.page_size, s.max_page_size)
