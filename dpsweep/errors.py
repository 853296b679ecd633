"""dpsweep's one exception hierarchy, shared by the SDK, the CLI, the API and the server.

It lives in the light ``dpsweep`` package (no torch, no Ray, no database) because that is the
bottom layer: ``workers``, ``sweeper`` and ``api`` import it and add their subclasses only
inside this tree; the API maps the whole tree to HTTP in one place
(``api/errors.py``), and the client maps a problem+json reply back with :func:`error_for`.

============================  ==============================================================
``DpsweepError``              the root; ``.detail``, ``.status``, ``.problem``, ``.kind``
``ConfigError``               a setting or input was refused (HTTP 422, or refused locally);
                              ``.field`` and ``.errors`` name the failing fields. Also a
                              ``ValueError``; ``ValidationError`` is the same class
``DatasetError``              a ``ConfigError``: a dataset file is missing or malformed
``PrivacyError``              a privacy guarantee could not be established (fail closed)
``TrainingError``             training itself failed (e.g. a non-finite loss)
``AuthError``                 401: no token, or an unknown or revoked one
``PermissionDenied``          an ``AuthError``: 403, the caller may not do this
``NotFound``                  404: no such sweep, trial or dataset, or not yours
``Conflict``                  409: e.g. the dataset's budget is exhausted, or the sweep ended
``RateLimited``               429 after the retries ran out; ``.retry_after`` in seconds
``ServerError``               5xx after the retries ran out
``ConnectionFailed``          the server could not be reached (after retries), or timed out
============================  ==============================================================

Errors raised locally (on the server, or a spec checked by the SDK before sending) have
``status`` None and an empty ``problem``; those built from a response carry both.
"""

from __future__ import annotations

from typing import Any


class DpsweepError(Exception):
    """Base class of every error dpsweep raises on purpose.

    Attributes:
        detail: The explanation (the server's problem+json ``detail``; ``str(exc)``).
        status: The HTTP status of the response it came from (None when raised locally, or
            when no response came).
        problem: The whole problem+json body ({} when there was none).
        kind: The problem type's last segment, e.g. ``budget-exhausted`` (None without one).
    """

    status: int | None = None
    kind: str | None = None

    def __init__(
        self, *args: Any, status: int | None = None, problem: dict[str, Any] | None = None
    ) -> None:
        # Only the message goes to ``args``: exceptions pickle (Ray ships them) as cls(*args).
        super().__init__(*args)
        self.detail = str(args[0]) if args else ""
        self.status = status
        self.problem = problem or {}
        t = self.problem.get("type")
        self.kind = str(t).rsplit("/", 1)[-1] if t else None


class ConfigError(DpsweepError, ValueError):
    """A user-supplied setting is invalid. The message says what is allowed.

    Raised locally (a spec checked before it is sent, a bad setting on the server) and for a
    refused request (HTTP 422, 413, 415, 400). The SDK also exports it as ``ValidationError``.

    Attributes:
        field: The failing field (dotted, e.g. ``privacy.delta``), or None.
        errors: Every failing field as ``{"field": ..., "message": ...}``.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        status: int | None = None,
        problem: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, status=status, problem=problem)
        if field is None:
            field = self.problem.get("field") or None
            errs = self.problem.get("errors")
            if field is None and isinstance(errs, list) and errs and isinstance(errs[0], dict):
                field = errs[0].get("field") or None
        self.field = str(field) if field is not None else None

    @property
    def errors(self) -> list[dict[str, str]]:
        """Every failing field: ``[{"field": ..., "message": ...}]`` ([] when none is known)."""
        errs = self.problem.get("errors")
        if isinstance(errs, list) and errs:
            return [dict(e) for e in errs]
        return [{"field": self.field, "message": self.detail}] if self.field else []


# The SDK's name for a refused input (HTTP 422, or a spec refused locally): the same class.
ValidationError = ConfigError


class DatasetError(ConfigError):
    """A dataset file is missing or malformed, or the dataset does not fit the model."""


class PrivacyError(DpsweepError):
    """A privacy guarantee could not be established; the run must not proceed (fail closed)."""


class TrainingError(DpsweepError):
    """Training itself failed (for example the loss became non-finite)."""


class AuthError(DpsweepError):
    """401: no token, or an unknown or revoked one (and, as ``PermissionDenied``, 403)."""


class PermissionDenied(AuthError):
    """The caller is known but may not do this (HTTP 403)."""


class NotFound(DpsweepError):
    """No such object, or one the caller may not see (HTTP 404: ids of others do not leak)."""


class Conflict(DpsweepError):
    """409: the request conflicts with the state (budget exhausted, sweep already finished)."""


class SweepNotFound(NotFound):
    """No sweep with that id (that the caller may see)."""


class TrialNotFound(NotFound):
    """No trial with that id that the caller may see."""


class DatasetNotFound(NotFound):
    """No dataset with that id that the caller may see."""


class ModelNotKept(NotFound):
    """The trial exists for the caller, but no trained model of it is kept (the message says
    why: the sweep's ``artifacts.keep``, another trial is its grid's best, the quota)."""


class QuotaExceeded(ConfigError):
    """The tenant's kept models would exceed its quota (HTTP 422, ``quota-exceeded``)."""


class ArtifactCorrupt(DpsweepError):
    """A kept file no longer matches the content hash recorded for it (HTTP 500)."""


class PlanCorrupt(ArtifactCorrupt):
    """A stored sweep plan lacks a figure or holds a malformed one (HTTP 500): nothing is
    planned, charged or run on it."""


class IllegalState(Conflict):
    """The sweep is not in a state that allows the operation (HTTP 409)."""


class RateLimited(DpsweepError):
    """429 after the client's retries ran out."""

    def __init__(self, *args: Any, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.retry_after = retry_after


class ServerError(DpsweepError):
    """5xx after the client's retries ran out."""


class ConnectionFailed(DpsweepError):
    """No response: the server could not be reached, or the request timed out."""


def error_for(
    status: int, problem: dict[str, Any], *, retry_after: float | None = None
) -> DpsweepError:
    """The error for a response status and its problem+json body."""
    detail = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
    kw: dict[str, Any] = {"status": status, "problem": problem}
    if status == 401:
        return AuthError(detail, **kw)
    if status == 403:
        return PermissionDenied(detail, **kw)
    if status == 404:
        return NotFound(detail, **kw)
    if status == 409:
        return Conflict(detail, **kw)
    if status in (400, 413, 415, 422):
        return ConfigError(detail, **kw)
    if status == 429:
        return RateLimited(detail, retry_after=retry_after, **kw)
    if status >= 500:
        return ServerError(detail, **kw)
    return DpsweepError(detail, **kw)


__all__ = [
    "ArtifactCorrupt",
    "AuthError",
    "ConfigError",
    "Conflict",
    "ConnectionFailed",
    "DatasetError",
    "DatasetNotFound",
    "DpsweepError",
    "IllegalState",
    "ModelNotKept",
    "NotFound",
    "PermissionDenied",
    "PrivacyError",
    "QuotaExceeded",
    "RateLimited",
    "ServerError",
    "SweepNotFound",
    "TrainingError",
    "TrialNotFound",
    "ValidationError",
    "error_for",
]
