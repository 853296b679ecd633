"""One problem+json error shape (RFC 9457) for every error, mapped from dpsweep's one
exception hierarchy (:mod:`dpsweep.errors`) in one place: :data:`STATUSES`.

Every error body has ``type``, ``title``, ``status`` and ``detail``; validation errors add
``errors``: a list of ``{"field": "a.b", "message": ...}``. Stack traces never reach a
response: an unexpected exception is logged and answered with a bare 500.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from dpsweep.errors import (
    ArtifactCorrupt,
    AuthError,
    ConfigError,
    Conflict,
    DpsweepError,
    IllegalState,
    NotFound,
    PermissionDenied,
    PlanCorrupt,
    PrivacyError,
    QuotaExceeded,
    RateLimited,
    TrainingError,
)
from sweeper.privacy.grids import InfeasiblePlan
from sweeper.privacy.ledger.errors import BudgetExhausted

log = logging.getLogger("dpsweep.api")

PROBLEM = "application/problem+json"
TYPE_BASE = "https://dpsweep.dev/problems/"


class FieldError(BaseModel):
    field: str
    message: str


class Problem(BaseModel):
    """An error (RFC 9457 problem details)."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldError] | None = None


class ApiError(DpsweepError):
    """An error raised by the API layer itself, with its HTTP status."""

    status: int

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        title: str | None = None,
        kind: str | None = None,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.kind = kind
        self.field = field
        self.headers = headers or {}


TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    406: "Not acceptable",
    409: "Conflict",
    413: "Content too large",
    415: "Unsupported media type",
    422: "Invalid input",
    500: "Internal server error",
}


def problem_body(
    status: int,
    detail: str,
    *,
    title: str | None = None,
    kind: str | None = None,
    errors: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": TYPE_BASE + (kind or str(status)),
        "title": title or TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    return body


def problem(
    status: int,
    detail: str,
    *,
    title: str | None = None,
    kind: str | None = None,
    errors: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = problem_body(status, detail, title=title, kind=kind, errors=errors)
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def exception_body(exc: DpsweepError) -> tuple[int, dict[str, Any]]:
    """The status and problem body of a dpsweep exception."""
    status, kind = status_of(exc)
    field = getattr(exc, "field", None)
    errors = [{"field": field, "message": str(exc)}] if field else None
    title = exc.title if isinstance(exc, ApiError) else None
    return status, problem_body(status, str(exc), title=title, kind=kind, errors=errors)


# The HTTP status and problem type of each class of dpsweep's one hierarchy, most specific
# first: an exception gets the first row whose class it is an instance of. ApiError carries
# its own status; the last row catches the rest.
STATUSES: tuple[tuple[type[DpsweepError], int, str], ...] = (
    (NotFound, 404, "not-found"),
    (PermissionDenied, 403, "forbidden"),
    (AuthError, 401, "unauthorized"),
    (IllegalState, 409, "illegal-state"),
    (Conflict, 409, "conflict"),
    (BudgetExhausted, 409, "budget-exhausted"),
    (InfeasiblePlan, 422, "infeasible-plan"),
    (QuotaExceeded, 422, "quota-exceeded"),
    (ConfigError, 422, "invalid-input"),
    (PrivacyError, 409, "privacy"),
    (RateLimited, 429, "rate-limited"),
    (TrainingError, 400, "bad-request"),
    (PlanCorrupt, 500, "plan-corrupt"),
    (ArtifactCorrupt, 500, "artifact-corrupt"),
    (DpsweepError, 400, "bad-request"),
)


def status_for(cls: type[DpsweepError]) -> tuple[int, str]:
    """The HTTP status and problem type of a class of dpsweep exception."""
    return next((status, kind) for c, status, kind in STATUSES if issubclass(cls, c))


def status_of(exc: DpsweepError) -> tuple[int, str]:
    """The HTTP status and problem type of a dpsweep exception."""
    if isinstance(exc, ApiError):
        return exc.status, exc.kind or str(exc.status)
    return status_for(type(exc))


def _loc(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    """Register the handlers that turn every exception into a problem+json response."""

    @app.exception_handler(DpsweepError)
    async def dpsweep_error(request: Request, exc: DpsweepError) -> JSONResponse:
        status, body = exception_body(exc)
        headers = exc.headers if isinstance(exc, ApiError) else None
        return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                # A body that is not JSON at all has no field; its loc holds a character offset.
                "field": "body"
                if e.get("type") == "json_invalid"
                else _loc(tuple(e.get("loc", ()))),
                "message": str(e.get("msg", "invalid")),
            }
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"field": "request", "message": "invalid"}
        return problem(
            422,
            f"{first['field']}: {first['message']}",
            kind="invalid-input",
            errors=errors,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(500, "an internal error occurred; it has been logged")


# OpenAPI: every route may answer with these problems.
def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {
        s: {"model": Problem, "content": {PROBLEM: {}}, "description": TITLES.get(s, "Error")}
        for s in statuses
    }


__all__ = ["PROBLEM", "ApiError", "Problem", "install", "problem", "problem_responses"]
