"""``/api/v1/me``: who the bearer token is (the dashboard's sign-in checks a token with it)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import SettingsDep, ViewerDep
from api.errors import problem_responses
from api.schemas import Me

router = APIRouter(tags=["auth"])


@router.get("/me", response_model=Me, responses=problem_responses(401), summary="Who you are")
def me(viewer: ViewerDep, settings: SettingsDep) -> dict[str, Any]:
    return {"name": viewer.owner, "admin": viewer.admin, "auth": settings.auth}
