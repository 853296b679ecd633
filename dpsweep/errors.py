"""The client's errors: one class per situation, each with the server's problem details.

Every failure of a request surfaces as one of these, never as a bare HTTP error:

============================  ==============================================================
``AuthError``                 401 (no, unknown or revoked token) and 403 (not allowed)
``NotFound``                  404: no such sweep, trial or dataset, or not yours
``Conflict``                  409: e.g. the dataset's budget is exhausted, or the sweep ended
``ValidationError``           422 / 413 / 415, or a spec refused locally; ``.errors`` names
                              the failing fields
``RateLimited``               429 after the retries ran out; ``.retry_after`` in seconds
``ServerError``               5xx after the retries ran out
``ConnectionFailed``          the server could not be reached (after retries), or timed out
============================  ==============================================================
"""

from __future__ import annotations

from typing import Any


class DpsweepError(Exception):
    """Base class of the client's errors.

    Attributes:
        status: The HTTP status (None when no response came).
        detail: The server's explanation (its problem+json ``detail``).
        problem: The whole problem+json body ({} when there was none).
    """

    def __init__(
        self, detail: str, *, status: int | None = None, problem: dict[str, Any] | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.problem = problem or {}

    @property
    def kind(self) -> str | None:
        """The problem type's last segment, e.g. ``budget-exhausted``."""
        t = self.problem.get("type")
        return str(t).rsplit("/", 1)[-1] if t else None


class AuthError(DpsweepError):
    """401: no token, or an unknown or revoked one; 403: the token may not do this."""


class NotFound(DpsweepError):
    """404: no such object, or one that belongs to someone else."""


class Conflict(DpsweepError):
    """409: the request conflicts with the state (budget exhausted, sweep already finished)."""


class ValidationError(DpsweepError):
    """The input was refused. ``errors`` lists ``{"field": ..., "message": ...}``."""

    @property
    def errors(self) -> list[dict[str, str]]:
        errs = self.problem.get("errors")
        if isinstance(errs, list) and errs:
            return [dict(e) for e in errs]
        field = self.problem.get("field")
        return [{"field": str(field), "message": self.detail}] if field else []


class RateLimited(DpsweepError):
    """429 after the client's retries ran out."""

    def __init__(self, detail: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.retry_after = retry_after


class ServerError(DpsweepError):
    """5xx after the client's retries ran out."""


class ConnectionFailed(DpsweepError):
    """No response: the server could not be reached, or the request timed out."""


def error_for(status: int, problem: dict[str, Any], *, retry_after: float | None = None) -> Any:
    """The error for a response status and its problem+json body."""
    detail = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
    kw: dict[str, Any] = {"status": status, "problem": problem}
    if status in (401, 403):
        return AuthError(detail, **kw)
    if status == 404:
        return NotFound(detail, **kw)
    if status == 409:
        return Conflict(detail, **kw)
    if status in (400, 413, 415, 422):
        return ValidationError(detail, **kw)
    if status == 429:
        return RateLimited(detail, retry_after=retry_after, **kw)
    if status >= 500:
        return ServerError(detail, **kw)
    return DpsweepError(detail, **kw)
