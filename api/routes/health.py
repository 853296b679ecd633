"""``/health`` (the process is up) and ``/ready`` (it can serve: database reachable, schema at
head, a scheduler alive to run what is submitted). Neither needs a token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from api.schemas import Health, Ready
from sweeper.driver.scheduler import live_schedulers
from sweeper.store.schema import current_revision, head_revision

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", response_model=Ready, responses={503: {"model": Ready}})
def ready(request: Request) -> Any:
    state = request.app.state
    out: dict[str, Any] = {
        "status": "ready",
        "database": "ok",
        "schema_revision": None,
        "schedulers": 0,
    }
    try:
        with state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        out["schema_revision"] = current_revision(state.database_url)
        if out["schema_revision"] != head_revision():
            out["status"] = "schema behind head: run `dpsweep db upgrade`"
        out["schedulers"] = len(
            live_schedulers(state.engine, within_seconds=state.settings.scheduler_stale_seconds)
        )
        if out["status"] == "ready" and out["schedulers"] == 0:
            out["status"] = "no scheduler is running: submitted sweeps would not start"
    except Exception as exc:
        out["database"] = f"unreachable: {type(exc).__name__}"
        out["status"] = "database unreachable"
    return JSONResponse(out, status_code=200 if out["status"] == "ready" else 503)
