"""The FastAPI application: ``create_app(settings)``.

Layers: the routes (``api.routes``) are thin; every rule lives in ``sweeper`` (planning,
budgets, release policy, visibility). The database is the single source of truth: this
process never runs trials; a scheduler (``sweeper.driver.scheduler``) picks up what it stores.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from api import dashboard, errors
from api.auth import current_viewer
from api.live import EventHub
from api.page_cache import PageCache
from api.planning import Planner
from api.routes import audits, checkpoints, datasets, health, me, registry, sweeps, trials
from api.settings import ApiSettings
from api.views import SummaryCache
from dpsweep.spec import SweepSpec
from sweeper.store.engine import database_url as resolved_url
from sweeper.store.engine import make_engine, make_read_engine
from sweeper.store.schema import require_head

API_PREFIX = "/api/v1"


def create_app(
    settings: ApiSettings | None = None,
    *,
    database_url: str | None = None,
    freeze_gc: bool = False,
) -> FastAPI:
    """The API app. The database must already be at schema head (``dpsweep db upgrade``).

    Args:
        settings: The API's settings (default: from ``DPSWEEP_*``).
        database_url: The database (default: the settings').
        freeze_gc: At start-up, move every object alive to the garbage collector's permanent
            generation (:func:`gc.freeze`): for a server process, not for a process that
            creates many apps (tests), whose cyclic garbage would never be collected.
    """
    settings = settings or ApiSettings()
    url = resolved_url(database_url or settings.database_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        _start(app, url, settings, freeze_gc=freeze_gc)
        try:
            yield
        finally:
            _stop(app)

    app = FastAPI(
        title="dpsweep",
        version="1",
        summary="Hyperparameter sweeps for differentially private deep learning",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.database_url = url
    app.state.summaries = SummaryCache()
    app.state.trial_pages = PageCache()
    errors.install(app)
    _include_routers(app)
    dashboard.install(app)
    _install_openapi(app)
    return app


def _start(app: FastAPI, url: str, settings: ApiSettings, *, freeze_gc: bool) -> None:
    """Start-up: the schema checked, the thread limit, engines, planner, live events, the
    summaries' warm-up, and (``freeze_gc``) the garbage collector's freeze."""
    require_head(url)
    anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads
    app.state.engine = _engine(url, settings)
    app.state.read_engine = _read_engine(app.state.engine, settings)
    app.state.planner = Planner(settings.planner_processes)
    app.state.live = EventHub(app.state.read_engine, watch_seconds=settings.sse_poll_seconds)
    app.state.live.start(asyncio.get_running_loop())
    if settings.warm_summaries:
        threading.Thread(
            target=_warm, args=(app, settings.warm_summaries), name="dpsweep-warm", daemon=True
        ).start()
    if freeze_gc:
        # What start-up made (modules, the app) lives as long as the server: keep it out
        # of the collector's full passes, which otherwise stall every request for ~0.1 s.
        gc.collect()
        gc.freeze()


def _stop(app: FastAPI) -> None:
    """Shut-down: live events, the planner and the engines, in that order."""
    app.state.live.stop()
    app.state.planner.close()
    app.state.engine.dispose()
    if app.state.read_engine.pool is not app.state.engine.pool:
        app.state.read_engine.dispose()


def _include_routers(app: FastAPI) -> None:
    """The health check open to all; every other route under :data:`API_PREFIX`, for a
    signed-in viewer only."""
    app.include_router(health.router)
    secured = [Depends(current_viewer)]
    routers = (
        sweeps.router,
        trials.router,
        datasets.router,
        me.router,
        registry.router,
        checkpoints.router,
        audits.router,
    )
    for r in routers:
        app.include_router(r, prefix=API_PREFIX, dependencies=secured)


def _install_openapi(app: FastAPI) -> None:
    """The app's OpenAPI schema, built once on first use: with the sweep spec's model and
    every error as problem+json."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            # The spec's model documents POST /sweeps (whose body is read as JSON or YAML).
            spec_schema = SweepSpec.model_json_schema(ref_template="#/components/schemas/{model}")
            comps = schema.setdefault("components", {}).setdefault("schemas", {})
            comps.update(spec_schema.pop("$defs", {}))
            comps["SweepSpec"] = spec_schema
            _problems_as_problem_json(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _problems_as_problem_json(schema: dict[str, Any]) -> None:
    """Every error response is application/problem+json with the Problem schema, including
    FastAPI's own 422 (which it documents as HTTPValidationError in application/json)."""
    problem = {errors.PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for item in schema.get("paths", {}).values():
        for op in item.values():
            for status, resp in op.get("responses", {}).items():
                if errors.PROBLEM in resp.get("content", {}) or status == "422":
                    resp["content"] = dict(problem)
                    if status == "422":
                        resp["description"] = errors.TITLES[422]
    comps = schema.get("components", {}).get("schemas", {})
    comps.pop("HTTPValidationError", None)
    comps.pop("ValidationError", None)


def app_from_env() -> FastAPI:
    """The app from ``DPSWEEP_*`` settings: uvicorn's factory for several worker processes."""
    return create_app(ApiSettings(), freeze_gc=True)


def _engine(url: str, settings: ApiSettings) -> Any:
    # Enough connections for every request thread (anyio's pool has 40).
    return make_engine(url, pool_size=settings.db_pool_size, max_overflow=settings.db_pool_size)


def _read_engine(engine: Any, settings: ApiSettings) -> Any:
    # The reads' own pool on PostgreSQL (autocommit: no BEGIN/ROLLBACK round trips per read).
    return make_read_engine(
        engine, pool_size=settings.db_pool_size, max_overflow=settings.db_pool_size
    )


def _warm(app: FastAPI, count: int) -> None:
    """Build the cached summaries of the most recently ended sweeps (best effort)."""
    try:
        app.state.summaries.warm(app.state.read_engine, count)
    except Exception:  # a warm-up failure only costs the first viewer the build
        logging.getLogger("dpsweep.api").exception("warming the sweep summaries failed")
